import sys

from disaggsim.cli import main

sys.exit(main())
