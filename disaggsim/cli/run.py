"""``disaggsim run SCENARIO.yaml``: simulate, print a summary table, write the results."""

from __future__ import annotations

import argparse
from pathlib import Path

from disaggsim.cli.common import add_set_option
from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError

SUMMARY_ROWS = (
    ("num_requests", "requests (measured)", "{:d}"),
    ("num_completed", "completed", "{:d}"),
    ("num_rejected", "rejected", "{:d}"),
    ("num_unfinished", "unfinished at horizon", "{:d}"),
    ("num_gpus", "GPUs", "{:d}"),
    ("ttft_p50_s", "TTFT p50", "{:.3f} s"),
    ("ttft_p90_s", "TTFT p90", "{:.3f} s"),
    ("ttft_p99_s", "TTFT p99", "{:.3f} s"),
    ("itl_p50_s", "ITL p50", "{:.1f} ms"),
    ("itl_p90_s", "ITL p90", "{:.1f} ms"),
    ("itl_p99_s", "ITL p99", "{:.1f} ms"),
    ("tpot_p50_s", "TPOT p50", "{:.1f} ms"),
    ("tpot_p99_s", "TPOT p99", "{:.1f} ms"),
    ("e2e_p50_s", "end-to-end p50", "{:.2f} s"),
    ("e2e_p99_s", "end-to-end p99", "{:.2f} s"),
    ("kv_transfer_p99_s", "KV handoff p99", "{:.1f} ms"),
    ("kv_exposed_p99_s", "KV handoff exposed p99", "{:.1f} ms"),
    ("num_retried", "retried (failures)", "{:d}"),
    ("num_preempted", "preempted", "{:d}"),
    ("num_abandoned", "abandoned", "{:d}"),
    ("slo_attainment", "SLO attainment", "{:.1%}"),
    ("requests_per_s", "throughput", "{:.2f} req/s"),
    ("output_tokens_per_s", "output tokens", "{:.0f} tok/s"),
    ("util_prefill", "prefill pool busy", "{:.1%}"),
    ("util_decode", "decode pool busy", "{:.1%}"),
    ("util_colocated", "pool busy", "{:.1%}"),
    ("wall_s", "wall time", "{:.2f} s"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate one scenario and write its results")
    p.add_argument("scenario", type=Path, help="scenario YAML file")
    p.add_argument("--out", type=Path, default=None, help="result folder (default results/<name>)")
    add_set_option(p, "override a scenario field, e.g. --set workload.rate_per_s=4 (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write a Chrome/Perfetto trace-event JSON of the run (ui.perfetto.dev)",
    )
    p.set_defaults(func=cmd_run)


def format_value(key: str, fmt: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if "ms" in fmt and key.endswith("_s"):
        value = value * 1e3
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def print_summary(summary: dict, title: str, out_dir: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label, fmt in SUMMARY_ROWS:
        if key in summary:
            table.add_row(label, format_value(key, fmt, summary[key]))
    console = Console()
    console.print(table)
    slo = (
        f"SLO: TTFT <= {summary['slo_ttft_s'] * 1e3:g} ms and {summary['slo_itl_statistic']} <= "
        f"{summary['slo_itl_s'] * 1e3:g} ms for {summary['slo_attainment_target']:.0%} of requests: "
        + ("[green]met[/green]" if summary["slo_attained"] else "[red]missed[/red]")
    )
    console.print(slo)
    if out_dir is not None:
        console.print(f"results written to {out_dir}/")


def cmd_run(args: argparse.Namespace) -> int:
    from disaggsim.run import simulate, write_results

    loaded = load_scenario(args.scenario, args.overrides)
    s = loaded.scenario
    out = args.out if args.out is not None else Path("results") / s.name
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    if args.trace is not None:
        from disaggsim.trace_export import check_trace_path

        check_trace_path(args.trace)
    if args.quiet:
        result = simulate(loaded)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[done]} requests done"),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            task = bar.add_task(f"simulating {s.name}", total=s.sim.duration_s, done=0)

            def progress(now: float, done: int, total: int) -> None:
                bar.update(task, completed=min(now, s.sim.duration_s), done=f"{done}/{total}")

            result = simulate(loaded, progress=progress)
    write_results(result, out, plots=not args.no_plots)
    if args.trace is not None:
        from disaggsim.trace_export import write_trace

        write_trace(result, args.trace)
    print_summary(result.summary, f"{s.name} ({result.summary['architecture']})", out)
    return 0
