"""Command-line entry point: ``disaggsim <command> ...``.

Each command lives in its own module of this package and registers itself through ``add_parser``; this
module only dispatches and turns :class:`UserError` (and profile errors) into one line on
stderr with exit code 2, and a broken run invariant (:class:`InvariantError`) into
one line with exit code 3.
"""

from __future__ import annotations

import argparse
import sys

from disaggsim import __version__
from disaggsim.errors import InvariantError, UserError
from disaggsim.hardware.profile import ProfileError


def build_parser() -> argparse.ArgumentParser:
    from disaggsim.cli import bench, calibrate, compare, cost, plan, regress, run, sweep

    parser = argparse.ArgumentParser(
        prog="disaggsim",
        description="Simulate disaggregated vs colocated LLM serving clusters.",
    )
    parser.add_argument("--version", action="version", version=f"disaggsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, cost, calibrate, bench, sweep, compare, regress, plan):
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (UserError, ProfileError) as e:
        print(f"disaggsim: error: {e}", file=sys.stderr)
        return 2
    except InvariantError as e:
        print(f"disaggsim: internal error: {e}; nothing written (please report)", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("disaggsim: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
