"""``python -m calibration ...``: the same command line as ``disaggsim calibrate``."""

import sys

from calibration.cli import main

sys.exit(main())
