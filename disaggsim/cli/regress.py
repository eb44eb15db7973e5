"""``disaggsim regress``: CI runs against the committed reference curves (docs/sweeps.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from disaggsim.cli.common import executor, executor_args, printing_after, progress
from disaggsim.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "regress", help="compare scenarios/ci runs with the committed reference curves"
    )
    p.add_argument(
        "--ci-dir", type=Path, default=Path("scenarios/ci"), help="folder of CI scenarios"
    )
    p.add_argument(
        "--reference-dir",
        type=Path,
        default=None,
        help="reference folder (default results/reference)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="only this CI scenario (file stem)",
    )
    p.add_argument("--update", action="store_true", help="rewrite the references from fresh runs")
    p.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="PATH=a:b:n|v1,v2",
        help="with --update: the grid to record (default: the reference's grid, else rates around the scenario's)",
    )
    executor_args(p)
    p.set_defaults(func=cmd_regress)


def cmd_regress(args: argparse.Namespace) -> int:
    from rich.console import Console

    from disaggsim import regress
    from disaggsim.sweep.grid import parse_params

    params = parse_params(args.params)
    if params and not args.update:
        raise UserError("regress: --param only applies with --update")
    given = args.reference_dir is not None
    ref_dir = args.reference_dir if given else Path("results/reference")
    if not args.update and not ref_dir.is_dir():
        # every scenario would run, then each be reported as drift (exit 1) for want of a
        # reference: a path that names no folder is bad input
        where = (
            f"--reference-dir {ref_dir}" if given else f"{ref_dir} (the default --reference-dir)"
        )
        what = "a file, not a folder" if ref_dir.exists() else "no such folder"
        raise UserError(
            f"{where}: {what} (the committed references are in results/reference of the "
            "project; --update writes new ones)"
        )
    console = Console()
    with executor(args) as ex, progress(args.quiet) as new_bar:
        if args.update:
            written = regress.update(
                args.ci_dir,
                ref_dir,
                executor=ex,
                only=args.only,
                params=params,
                progress=new_bar("running CI scenarios"),
            )
        else:
            report = regress.check(
                args.ci_dir,
                ref_dir,
                executor=ex,
                only=args.only,
                progress=new_bar("running CI scenarios"),
            )
    if args.update:
        with printing_after(f"written to {ref_dir}/ ({len(written)} references)"):
            for p in written:
                console.print(f"wrote {p}")
        return 0
    print(report.text())
    return 0 if report.ok else 1
