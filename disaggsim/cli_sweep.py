"""``disaggsim sweep`` / ``compare`` / ``regress``: many runs, one table (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import math
from contextlib import contextmanager
from pathlib import Path

from disaggsim.cli_run import add_set_option
from disaggsim.errors import UserError


def _executor_args(p: argparse.ArgumentParser) -> None:
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


def _grid_args(p: argparse.ArgumentParser, required: bool) -> None:
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a scenario over a parameter grid → one tidy table + plots"
    )
    p.add_argument("scenario", type=Path, help="scenario YAML file")
    _grid_args(p, required=False)
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default results/<name>-sweep)"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _executor_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("compare", help="several scenarios on the same grid, with goodput per GPU")
    p.add_argument("scenarios", type=Path, nargs="+", help="scenario YAML files")
    _grid_args(p, required=False)
    p.add_argument("--same-gpus", action="store_true", help="require the same total GPU count")
    p.add_argument("--rate-lo", type=float, default=None, help="goodput bisection low end (req/s)")
    p.add_argument("--rate-hi", type=float, default=None, help="goodput bisection high end (req/s)")
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="bisection tolerance, req/s (default 1%% of rate-hi)",
    )
    p.add_argument("--out", type=Path, default=Path("results/compare"), help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _executor_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "regress", help="compare scenarios/ci runs with the committed reference curves"
    )
    p.add_argument(
        "--ci-dir", type=Path, default=Path("scenarios/ci"), help="folder of CI scenarios"
    )
    p.add_argument(
        "--reference-dir", type=Path, default=Path("results/reference"), help="reference folder"
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
    _executor_args(p)
    p.set_defaults(func=cmd_regress)


@contextmanager
def _progress(quiet: bool):
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


def _executor(args: argparse.Namespace):
    from disaggsim.sweep.executors import make_executor

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be >= 1")
    return make_executor(args.workers, args.scheduler)


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from disaggsim.sweep.core import as_source, run_tasks, sweep_tasks, table
    from disaggsim.sweep.grid import parse_params
    from disaggsim.sweep.output import check_out_dir, write_folder, write_table
    from disaggsim.sweep.plots import write_sweep_plots

    params = parse_params(args.params)
    src = as_source(args.scenario, args.overrides)
    out = args.out if args.out is not None else Path("results") / f"{src.name}-sweep"
    check_out_dir(out)
    keys, tasks = sweep_tasks(src, params, args.seeds)
    with _executor(args) as ex, _progress(args.quiet) as new_bar:
        df = table(keys, run_tasks(tasks, ex, new_bar(f"sweeping {src.name}")))
    paths = [p.path for p in params]

    def render(tmp: Path) -> list[Path]:
        files = write_table(df, tmp, "sweep")
        if not args.no_plots:
            files += write_sweep_plots(df, paths, tmp)
        return files

    write_folder(out, render)
    Console().print(
        f"{len(df)} runs ({len(tasks) // args.seeds} points × {args.seeds} seeds) written to {out}/"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from disaggsim.sweep.compare import SCENARIO_FILE, compare
    from disaggsim.sweep.core import RATE_PATH
    from disaggsim.sweep.grid import parse_params
    from disaggsim.sweep.output import check_out_dir, write_folder, write_table
    from disaggsim.sweep.plots import write_sweep_plots

    params = parse_params(args.params)
    check_out_dir(args.out)
    with _executor(args) as ex, _progress(args.quiet) as new_bar:
        res = compare(
            args.scenarios,
            params,
            seeds=args.seeds,
            executor=ex,
            same_gpus=args.same_gpus,
            rate_lo=args.rate_lo,
            rate_hi=args.rate_hi,
            tol_per_s=args.tol,
            overrides=args.overrides,
            progress=new_bar("sweeping"),
            goodput_progress=new_bar("goodput bisection"),
        )

    def render(tmp: Path) -> list[Path]:
        files = write_table(res.table, tmp, "compare")
        g = tmp / "goodput.csv"
        res.goodput.to_csv(g, index=False)
        files.append(g)
        if not args.no_plots and params:
            files += write_sweep_plots(
                res.table, [p.path for p in params], tmp, series=[SCENARIO_FILE]
            )
        return files

    write_folder(args.out, render)
    print_goodput(res.goodput, args.out, [p.path for p in params if p.path != RATE_PATH])
    return 0


def _fmt(v: float, fmt: str) -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def print_goodput(g, out_dir: Path | None, param_cols: list[str] | None = None) -> None:
    """The goodput frame as a rich table: one row per scenario × other swept values."""
    from rich.console import Console
    from rich.table import Table

    param_cols = param_cols or []
    table = Table(
        title="goodput (highest rate meeting the SLO attainment target)", header_style="bold"
    )
    for col in ("scenario", "architecture", *param_cols):
        table.add_column(col, overflow="fold")
    for col in ("GPUs", "goodput req/s", "req/s per GPU", "vs best"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in g.to_dict("records"):
        rate = _fmt(r["goodput_per_s"], "{:.3g}")
        if r["status"] == "above_range":
            rate = ">= " + rate
        elif r["status"] == "below_range":
            rate = "< rate-lo"
        table.add_row(
            str(r["scenario"]),
            str(r["architecture"]),
            *(str(r[c]) for c in param_cols),
            str(r["num_gpus"]),
            rate,
            _fmt(r["goodput_per_gpu_per_s"], "{:.3g}"),
            _fmt(r["ratio_to_best"], "{:.2f}×"),
        )
    console = Console()
    console.print(table)
    if out_dir is not None:
        console.print(f"results written to {out_dir}/")


def cmd_regress(args: argparse.Namespace) -> int:
    from rich.console import Console

    from disaggsim import regress
    from disaggsim.sweep.grid import parse_params

    params = parse_params(args.params)
    if params and not args.update:
        raise UserError("regress: --param only applies with --update")
    console = Console()
    with _executor(args) as ex, _progress(args.quiet) as new_bar:
        if args.update:
            written = regress.update(
                args.ci_dir,
                args.reference_dir,
                executor=ex,
                only=args.only,
                params=params,
                progress=new_bar("running CI scenarios"),
            )
        else:
            report = regress.check(
                args.ci_dir,
                args.reference_dir,
                executor=ex,
                only=args.only,
                progress=new_bar("running CI scenarios"),
            )
    if args.update:
        for p in written:
            console.print(f"wrote {p}")
        return 0
    print(report.text())
    return 0 if report.ok else 1
