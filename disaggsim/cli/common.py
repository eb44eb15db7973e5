"""Options and helpers shared by several commands: ``--set`` overrides, sweep grids,
executors and progress bars."""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from disaggsim.errors import UserError


def add_set_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY.PATH=VALUE`` (repeatable) into ``overrides``: the scenario override flag
    shared by run, sweep, compare, regress and plan."""
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help=help
    )


def executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local worker processes (default min(2, CPU count))",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="tcp://HOST:PORT",
        help="run on this Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, else local processes)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def grid_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        required=required,
        metavar="PATH=a:b:n|v1,v2",
        help="swept scenario field: n evenly spaced values a..b, or a list (repeatable)",
    )
    p.add_argument("--seeds", type=int, default=1, help="seeds per point: scenario seed + 0..N-1")
    add_set_option(p, "fixed override applied before the sweep (repeatable)")


@contextmanager
def progress(quiet: bool):
    """Yields ``new(description) -> callback(done, total)``; a no-op when quiet."""
    if quiet:
        yield lambda description: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:

        def new(description: str):
            task = bar.add_task(description, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            return update

        yield new


def executor(args: argparse.Namespace):
    from disaggsim.sweep.executors import make_executor

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be >= 1")
    return make_executor(args.workers, args.scheduler)
