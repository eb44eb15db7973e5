"""``disaggsim compare``: several scenarios on one grid, with goodput per GPU (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from disaggsim.cli.common import (
    executor,
    executor_args,
    grid_args,
    keeping_runs,
    kept_line,
    printing_after,
    progress,
    resume_arg,
)

if TYPE_CHECKING:
    from disaggsim.config.loader import LoadedScenario


def add_parser(sub: argparse._SubParsersAction) -> None:
    import textwrap

    from disaggsim.config.bounds import MAX_REQUESTS, MAX_SERVICE_MULTIPLE
    from disaggsim.metrics.slo_model import slo_model_help

    text = (
        "Several scenarios on the same grid, with each one's steady-state goodput per GPU "
        "(docs/sweeps.md). SLO model: " + slo_model_help(flags=False)
    )
    p = sub.add_parser(
        "compare",
        help="several scenarios on the same grid, with goodput per GPU",
        description=textwrap.fill(text, 80, break_on_hyphens=False),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenarios", type=Path, nargs="+", help="scenario YAML files")
    grid_args(p, required=False)
    p.add_argument("--same-gpus", action="store_true", help="require the same total GPU count")
    p.add_argument(
        "--rate-lo", type=float, default=None, help="goodput search: starting low end (req/s)"
    )
    p.add_argument(
        "--rate-hi", type=float, default=None, help="goodput search: starting high end (req/s)"
    )
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="bisection tolerance, req/s (default 1%% of the bracket's high end)",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=None,
        metavar="N",
        help=(
            f"goodput runs measure at least N requests, 1-{MAX_REQUESTS:,} (default 1000; "
            "docs/metrics.md)"
        ),
    )
    p.add_argument(
        "--service-multiple",
        type=float,
        default=None,
        metavar="M",
        help=(
            "goodput runs measure at least M longest service times, > 0 and <= "
            f"{MAX_SERVICE_MULTIPLE:g} (default 10)"
        ),
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default results/compare)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    resume_arg(p)
    executor_args(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from disaggsim.html_report import REPORT_FILE, compare_report
    from disaggsim.output import hold_folder, out_flag, write_folder
    from disaggsim.sweep.compare import SCENARIO_FILE, compare, near_best_note
    from disaggsim.sweep.core import RATE_PATH
    from disaggsim.sweep.grid import parse_params
    from disaggsim.sweep.journal import KeptRuns
    from disaggsim.sweep.output import write_table
    from disaggsim.sweep.plots import write_sweep_plots

    params = parse_params(args.params)
    out = args.out if args.out is not None else Path("results/compare")
    flag = out_flag(args.out is not None)
    # held until written: another command writing there meanwhile is refused
    with hold_folder(out, flag):
        rule = run_length_rule(args.min_requests, args.service_multiple)

        def render(tmp: Path) -> list[Path]:
            files = write_table(res.table, tmp, "compare")
            g = tmp / "goodput.csv"
            res.goodput.to_csv(g, index=False)
            files.append(g)
            plots: list[Path] = []
            if not args.no_plots and params:
                plots = write_sweep_plots(
                    res.table, [p.path for p in params], tmp, series=[SCENARIO_FILE]
                )
                files += plots
            report = tmp / REPORT_FILE
            report.write_text(
                compare_report(
                    res,
                    [(_PLOT_CAPTIONS.get(p.name, p.stem), p.read_bytes()) for p in plots],
                )
            )
            files.append(report)
            return files

        with keeping_runs() as runs:
            with executor(args) as ex, progress(args.quiet) as new_bar:
                journal = runs.open(out, flag, None, args.resume, command="compare")
                res = compare(
                    args.scenarios,
                    params,
                    seeds=args.seeds,
                    executor=KeptRuns(ex, journal),
                    same_gpus=args.same_gpus,
                    rate_lo=args.rate_lo,
                    rate_hi=args.rate_hi,
                    tol_per_s=args.tol,
                    rule=rule,
                    overrides=args.overrides,
                    progress=new_bar("sweeping"),
                    goodput_progress=new_bar("steady-state goodput"),
                )
            written = write_folder(out, render, command="compare", flag=flag)
        with printing_after(written.note()):
            print_goodput(
                res.goodput,
                written.note() + kept_line(journal),
                [p.path for p in params if p.path != RATE_PATH],
            )
            for r in res.results:  # a coarse tolerance, runs a bound shortened
                for note in r.notes:
                    print(f"note: {r.scenario}: {note}")
            near = near_best_note(res.goodput, args.seeds)
            if near is not None:
                print(f"note: {near}")
            _print_scenario_notes(args.scenarios, args.overrides)
        return 0


def _print_scenario_notes(paths: list[Path], overrides: list[str] | None) -> None:
    """The SLO models in words, then the cap notes, of the scenarios (each loaded once)."""
    from disaggsim.config.loader import load_scenario

    loaded = [(path.name, load_scenario(path, overrides)) for path in paths]
    _print_slo_models(loaded)
    _print_cap_notes(loaded)


def _print_slo_models(loaded: list[tuple[str, LoadedScenario]]) -> None:
    """The SLO model in words (docs/metrics.md), once per distinct SLO of the scenarios."""
    from disaggsim.metrics.slo_model import slo_model_lines

    seen: dict = {}
    for name, scenario in loaded:
        seen.setdefault(scenario.scenario.slo, []).append(name)
    for slo, names in seen.items():
        head = "" if len(seen) == 1 else f"{', '.join(names)}: "
        lines = slo_model_lines(slo)
        print(head + lines[0])
        print("\n".join(lines[1:]))


def _print_cap_notes(loaded: list[tuple[str, LoadedScenario]]) -> None:
    """A note per scenario whose requests have no ``max_tokens`` (:mod:`disaggsim.cap_notes`):
    the default cap, the model's context less the prompt, moves the comparison."""
    from disaggsim.cap_notes import default_caps, scenario_cap_note
    from disaggsim.run import make_requests

    for name, scenario in loaded:
        if default_caps(scenario.scenario, make_requests(scenario)):
            print(f"note: {name}: {scenario_cap_note(scenario.scenario)}")


_PLOT_CAPTIONS = {
    "ttft.png": "TTFT p50 (solid) and p99 (dashed) over the sweep, per scenario.",
    "itl.png": "ITL p50 (solid) and p99 (dashed) over the sweep, per scenario.",
    "slo_attainment.png": "SLO attainment over the sweep, per scenario (the target dotted).",
}


def run_length_rule(min_requests: int | None, service_multiple: float | None):
    """The goodput run-length rule with the CLI's overrides (one-line errors)."""
    import dataclasses

    from disaggsim.metrics.steady import RunLengthRule, check_run_length_flags

    check_run_length_flags(min_requests, service_multiple)
    rule = RunLengthRule()
    if min_requests is not None:
        rule = dataclasses.replace(rule, min_measured_requests=min_requests)
    if service_multiple is not None:
        rule = rule.with_service_multiple(service_multiple)  # the warm-up too, as plan's
    return rule


def _fmt(v: float, fmt: str) -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def _confirmation(r: dict) -> str:
    """How the long run backed the goodput: its attainment and length."""
    if r["status"] not in ("found", "refined"):
        return "-"
    text = (
        _fmt(r["confirm_attainment"], "{:.1%}")
        + " over "
        + _fmt(r["confirm_duration_s"], "{:.0f} s")
    )
    return text + (" (lowered)" if r["status"] == "refined" else "")


def print_goodput(g, written: str | None, param_cols: list[str] | None = None) -> None:
    """The goodput frame as a rich table: one row per scenario × other swept values."""
    from rich.console import Console
    from rich.table import Table

    param_cols = param_cols or []
    table = Table(
        title="steady-state goodput (highest rate meeting the SLO attainment target with "
        "stable queues, confirmed at twice the horizon)",
        header_style="bold",
    )
    for col in ("scenario", "architecture", *param_cols):
        table.add_column(col, overflow="fold")
    for col in ("GPUs", "goodput req/s", "req/s per GPU", "vs best", "confirmed"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in g.to_dict("records"):
        rate = _fmt(r["goodput_per_s"], "{:.3g}")
        if r["status"] == "unattainable":
            rate = "0 (misses at " + _fmt(r["unattainable_below_per_s"], "{:.3g}") + ")"
        elif r["status"] == "unbounded":
            rate = "unbounded"
        table.add_row(
            str(r["scenario"]),
            str(r["architecture"]),
            *(str(r[c]) for c in param_cols),
            str(r["num_gpus"]),
            rate,
            _fmt(r["goodput_per_gpu_per_s"], "{:.3g}"),
            _fmt(r["ratio_to_best"], "{:.2f}×"),
            _confirmation(r),
        )
    console = Console()
    console.print(table)
    if written is not None:
        console.print(f"results {written}", markup=False, soft_wrap=True)
