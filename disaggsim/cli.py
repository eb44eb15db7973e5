"""Command-line entry point: ``disaggsim <command> ...``.

Each command lives in its own module and registers itself through ``add_parser``; this
module only dispatches and turns :class:`UserError` (and profile errors) into one line on
stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from disaggsim.errors import UserError
from disaggsim.hardware.profile import ProfileError


def build_parser() -> argparse.ArgumentParser:
    from calibration import cli as cli_calibrate
    from disaggsim import cli_bench, cli_cost, cli_plan, cli_run, cli_sweep

    parser = argparse.ArgumentParser(
        prog="disaggsim",
        description="Simulate disaggregated vs colocated LLM serving clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cli_run.add_parser(sub)
    cli_cost.add_parser(sub)
    cli_calibrate.add_parser(sub)
    cli_bench.add_parser(sub)
    cli_sweep.add_parser(sub)
    cli_plan.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (UserError, ProfileError) as e:
        print(f"disaggsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("disaggsim: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
