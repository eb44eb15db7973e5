"""``disaggsim calibrate``: the source checkout's calibration pipeline.

The ``calibration`` package is checkout-only and is not installed with disaggsim: it reads
the public data beside the checkout (``../shared/data``), writes into the checkout
(``disaggsim/hardware/profiles/``, ``calibration/priors/``, ``docs/validation.md``) and
needs torch. This command uses the ``calibration/`` folder next to the ``disaggsim``
package that is running (an editable install or ``PYTHONPATH`` of a clone); without one,
any ``disaggsim calibrate ...`` stops with a one-line error that says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

import disaggsim
from disaggsim.errors import UserError

OUTSIDE_CHECKOUT = (
    "calibrate: needs a source checkout of disaggsim (the calibration package is not "
    "installed): clone the repository and `pip install -e '.[calibrate]'` there"
)


def checkout_root() -> Path | None:
    """The checkout the running ``disaggsim`` package comes from, if it has calibration/."""
    root = Path(disaggsim.__file__).resolve().parents[1]
    return root if (root / "calibration" / "cli.py").is_file() else None


def calibration_cli() -> ModuleType | None:
    """``calibration.cli`` of that checkout (its root put first on ``sys.path``, so that
    processes the pipeline spawns import the same package), or None outside a checkout."""
    root = checkout_root()
    if root is None:
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from calibration import cli

    return cli


def add_parser(sub: argparse._SubParsersAction) -> None:
    cli = calibration_cli()
    if cli is not None:
        cli.add_parser(sub)
        return
    # every argument is accepted (no option prefix), so any calibrate command line gets
    # the one-line error rather than a usage message
    p = sub.add_parser(
        "calibrate",
        help="GPU microbenchmarks and profile fits (source checkout)",
        prefix_chars="\0",
        add_help=False,
    )
    p.add_argument("args", nargs="*")
    p.set_defaults(func=_outside_checkout)


def _outside_checkout(args: argparse.Namespace) -> int:
    raise UserError(OUTSIDE_CHECKOUT)
