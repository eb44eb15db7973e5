"""``disaggsim sweep``: run a scenario over a parameter grid, one tidy table (docs/sweeps.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from disaggsim.cli.common import (
    executor,
    executor_args,
    grid_args,
    keeping_runs,
    printing_after,
    progress,
    resume_arg,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a scenario over a parameter grid → one tidy table + plots"
    )
    p.add_argument("scenario", type=Path, help="scenario YAML file")
    grid_args(p, required=False)
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default results/<name>-sweep)"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    resume_arg(p)
    executor_args(p)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from disaggsim.output import hold_folder, out_flag, write_folder
    from disaggsim.sweep.core import as_source, run_tasks, sweep_tasks, table
    from disaggsim.sweep.grid import parse_params
    from disaggsim.sweep.output import write_table
    from disaggsim.sweep.plots import write_sweep_plots

    params = parse_params(args.params)
    src = as_source(args.scenario, args.overrides)
    out = args.out if args.out is not None else Path("results") / f"{src.name}-sweep"
    flag = out_flag(args.out is not None)
    # held until written: another command writing there meanwhile is refused
    with hold_folder(out, flag):
        keys, tasks = sweep_tasks(src, params, args.seeds)
        paths = [p.path for p in params]

        def render(tmp: Path) -> list[Path]:
            files = write_table(df, tmp, "sweep")
            if not args.no_plots:
                files += write_sweep_plots(df, paths, tmp)
            return files

        with keeping_runs() as runs:
            with executor(args) as ex:
                journal = runs.open(out, flag, tasks, args.resume)
                with progress(args.quiet) as new_bar:
                    summaries = run_tasks(
                        tasks,
                        ex,
                        new_bar(f"sweeping {src.name}"),
                        done=journal.reused,
                        on_result=journal.record,
                    )
            df = table(keys, summaries)
            written = write_folder(out, render, command="sweep", flag=flag)
        reused = f"; {len(journal.reused)} reused from {journal.shown}/" if journal.reused else ""
        others = f"; {journal.others_note()}" if journal.others else ""
        with printing_after(written.note()):
            Console().print(
                f"{_count(len(df), 'run')} ({_count(len(tasks) // args.seeds, 'point')} × "
                f"{_count(args.seeds, 'seed')}{reused}) {written.note()}{others}",
                markup=False,
                soft_wrap=True,
            )
        return 0


def _count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
