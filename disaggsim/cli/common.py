"""Options and helpers shared by several commands: ``--set`` overrides, sweep grids,
executors and progress bars."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from disaggsim.errors import UserError, note_kept


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
    wait_workers_arg(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def wait_workers_arg(p: argparse.ArgumentParser) -> None:
    """``--wait-workers-s``: how long a Dask scheduler may have no worker."""
    from disaggsim.sweep.executors import WAIT_WORKERS_ENV, WAIT_WORKERS_S

    p.add_argument(
        "--wait-workers-s",
        type=float,
        default=None,
        metavar="S",
        help=f"with a Dask scheduler: fail (exit 4) once it has had no worker for S seconds "
        f"while runs wait (default ${WAIT_WORKERS_ENV}, else {WAIT_WORKERS_S:g})",
    )


def resume_arg(p: argparse.ArgumentParser) -> None:
    """``--resume`` of the commands that keep their finished runs in ``OUT.partial``."""
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse the finished runs an unfinished command into the same --out kept in "
        "OUT.partial/, run only the others",
    )


class _KeptRuns:
    """The journal of :func:`keeping_runs`, once opened."""

    journal: Any = None

    def open(self, *args: Any, **kwargs: Any) -> Any:
        """``open_journal(*args, **kwargs)`` with stops held: made and known to the
        ``with``'s error path as one step (a Ctrl-C arriving meanwhile is raised after
        the journal is known, so its runs are noted)."""
        from disaggsim.stops import stops_held
        from disaggsim.sweep.journal import open_journal

        with stops_held():
            self.journal = open_journal(*args, **kwargs)
        return self.journal


@contextmanager
def keeping_runs() -> Iterator[_KeptRuns]:
    """The journal a command keeps its finished runs in (``OUT.partial/``), opened inside
    the ``with`` by ``.open(...)`` after the executor is made (a bad ``--scheduler`` or
    ``--workers`` then leaves nothing). Any error or stop inside closes it unfinished and
    ends the error's one line with where the finished runs are kept (a second Ctrl-C
    raised while the workers stop, too); a body that ends closes it finished."""
    kept = _KeptRuns()
    try:
        yield kept
    except BaseException as e:
        if kept.journal is not None:
            kept.journal.close(finished=False)
            note_kept(e, kept.journal.kept_note())
        raise
    if kept.journal is not None:
        kept.journal.close(finished=True)


def kept_line(journal) -> str:
    """The end of a command's last line: how many kept runs it reused, and what the
    partial folder still keeps (runs of another command; it stays then)."""
    text = ""
    if journal.reused_runs:
        text += f"; {journal.reused_runs} runs reused from {journal.shown}/"
    if journal.others:
        text += f"; {journal.others_note()}"
    return text


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


def progress_bar(*columns: Any):
    """A rich progress display of ``columns`` on the standard error, drawn only on a
    terminal. It was drawn to the standard output, where a stop that ends the display
    prints a line break when the output is no terminal: with the output refused (``>
    /dev/full``, a full disk) that write failed as the simulation ended, before its
    results were written (a run's result lost, a sweep's runs left in its partial
    folder), and a progress bar is no part of what a command prints."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)


@contextmanager
def printing_after(written: str | None) -> Iterator[None]:
    """Around what a command prints once its files are in place (``written``: the
    result's :meth:`~disaggsim.output.Written.note`, None when it wrote none): a
    standard output that refuses it (``> /dev/full``, a full disk) is an error whose one
    line also says where the results were written."""
    try:
        yield
        sys.stdout.flush()
    except OSError as e:
        if written is not None:
            note_kept(e, f"the results were {written}")
        raise


@contextmanager
def progress(quiet: bool):
    """Yields ``new(description) -> callback(done, total)``; a no-op when quiet."""
    if quiet:
        yield lambda description: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    with progress_bar(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        TimeElapsedColumn(),
    ) as bar:

        def new(description: str):
            task = bar.add_task(description, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            return update

        yield new


def executor(args: argparse.Namespace):
    from disaggsim.sweep.executors import DaskExecutor, make_executor

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be >= 1")
    if args.scheduler is not None and not args.scheduler.strip():
        # an unset variable (--scheduler "$ADDR") ran the sweep on this machine, silently
        raise UserError(
            f"--scheduler {args.scheduler!r}: empty; give a Dask scheduler address like "
            "tcp://host:8786, or leave the flag out to run in local worker processes"
        )
    ex = make_executor(args.workers, args.scheduler, wait_workers_s=args.wait_workers_s)
    if args.wait_workers_s is not None and not isinstance(ex, DaskExecutor):
        raise UserError(
            f"--wait-workers-s {args.wait_workers_s:g}: bounds the wait for a Dask "
            "scheduler's workers; give --scheduler too, or leave it out"
        )
    if isinstance(ex, DaskExecutor):
        # dask logs a lost scheduler as ERROR lines and tracebacks on stderr; the command
        # says what happened in its own one line (WorkersLost)
        # (levels set after dask's import, which sets its own)
        import logging

        try:
            import distributed  # noqa: F401
        except ImportError:
            pass  # the executor says so, one line, when first used
        for name in ("distributed", "distributed.client"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    return ex
