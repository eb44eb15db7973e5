"""``disaggsim run SCENARIO.yaml``: simulate, print a summary table, write the results."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from disaggsim.cli.common import add_set_option, printing_after, progress_bar
from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.errors import UserError, note_kept
from disaggsim.metrics.summary_table import Summary, cli_rows
from disaggsim.output import hold_folder, out_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate one scenario and write its results")
    p.add_argument("scenario", type=Path, help="scenario YAML file")
    p.add_argument("--out", type=Path, default=None, help="result folder (default results/<name>)")
    add_set_option(p, "override a scenario field, e.g. --set workload.rate_per_s=4 (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace",
        type=str,  # as given: a trailing '/' (a folder) is refused, not dropped
        default=None,
        metavar="PATH",
        help="also write a Chrome/Perfetto trace-event JSON of the run (ui.perfetto.dev)",
    )
    p.set_defaults(func=cmd_run)


def print_summary(summary: Summary, title: str, written: str | None) -> None:
    """The summary table (rows from :func:`disaggsim.metrics.summary_table.cli_rows`)
    and the SLO verdict."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, value in cli_rows(summary):
        table.add_row(label, value)
    console = Console()
    console.print(table)
    slo = (
        f"SLO: TTFT <= {summary.slo_ttft_s * 1e3:g} ms and {summary.slo_itl_statistic} <= "
        f"{summary.slo_itl_s * 1e3:g} ms for {summary.slo_attainment_target:.0%} of requests: "
        + _verdict(summary)
    )
    console.print(slo)
    if written is not None:
        console.print(f"results {written}", markup=False, soft_wrap=True)


def _verdict(summary: Summary) -> str:
    """Met only with the attainment and no upward trend (docs/metrics.md)."""
    steady = (
        "no upward trend in queues or TTFT"
        if summary.stable
        else f"queues or TTFT trending up, p = {summary.stability_p_value:.2g}"
    )
    if summary.meets_slo:
        return f"[green]met[/green] ({steady})"
    if summary.slo_attained:
        return f"[red]missed[/red]: attainment reached but {steady}: not a steady state"
    return f"[red]missed[/red] ({steady})"


def cmd_run(args: argparse.Namespace) -> int:
    loaded = load_scenario(args.scenario, args.overrides)
    out = args.out if args.out is not None else Path("results") / loaded.scenario.name
    flag = out_flag(args.out is not None)
    with ExitStack() as held:
        # held until written: another command writing there meanwhile is refused (two runs
        # into one --out both said "written", the later one over the other's result)
        held.enter_context(hold_folder(out, flag))
        if args.trace is not None:
            from disaggsim.output import hold_file, prefix_owned
            from disaggsim.trace_export import TRACE_HEAD, check_trace_path

            check_trace_path(args.trace)
            check_trace_beside(out, Path(args.trace), given=args.out is not None)
            held.enter_context(hold_file(args.trace, "--trace", prefix_owned(TRACE_HEAD), "trace"))
        return _simulate_and_write(args, loaded, out, flag)


def _simulate_and_write(
    args: argparse.Namespace, loaded: LoadedScenario, out: Path, flag: str
) -> int:
    from disaggsim.cap_notes import default_caps
    from disaggsim.run import simulate, write_results_folder

    s = loaded.scenario
    if args.quiet:
        result = simulate(loaded)
    else:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

        with progress_bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[done]} requests done"),
            TimeElapsedColumn(),
        ) as bar:
            task = bar.add_task(f"simulating {s.name}", total=s.sim.duration_s, done=0)

            def progress(now: float, done: int, total: int) -> None:
                bar.update(task, completed=min(now, s.sim.duration_s), done=f"{done}/{total}")

            result = simulate(loaded, progress=progress)
    written = write_results_folder(result, out, plots=not args.no_plots, flag=flag)
    trace = None
    if args.trace is not None:
        from disaggsim.trace_export import write_trace_file

        try:
            trace = write_trace_file(result, args.trace)
        except (UserError, OSError) as e:  # the results are in place: the line says so
            note_kept(e, f"the run's results were {written.note()}")
            raise
    done = written.note() + (f"; the trace was {trace.note()}" if trace is not None else "")
    with printing_after(done):
        print_summary(result.summary, f"{s.name} ({result.summary.architecture})", written.note())
        if trace is not None:
            print(f"trace {trace.note()}")
        for line in run_notes(
            loaded,
            result.summary,
            len(result.requests),
            capped=not default_caps(s, result.requests),
            kv_capacity_tokens={w.role: w.kv_capacity_tokens for w in result.raw.workers},
        ):
            print(line)
    return 0


def check_trace_beside(out: Path, trace: Path, given: bool = True) -> None:
    """Refuse a ``--trace`` the result folder would collide with, before simulating: the
    folder itself, a path holding it, a folder inside it, or a file name it writes (the
    results were written, then the trace refused: exit 2 with files written). A trace
    directly in the folder under another name is fine (it joins the folder's marker)."""
    from disaggsim.output import MARKER
    from disaggsim.run import RESULT_FILE_NAMES

    o = out.parent.resolve() / out.name
    t = trace.parent.resolve() / trace.name
    where = f"--trace {trace}"
    folder = f"--out {out}" if given else f"the result folder {out} (the default --out)"
    if t == o:
        raise UserError(
            f"{where}: is {folder}; give the trace a file name (e.g. {out / 'trace.json'})"
        )
    if t in o.parents:
        raise UserError(f"{where}: {folder} lies inside it; give the trace another path")
    if o in t.parents:
        if t.parent != o:
            raise UserError(
                f"{where}: in a folder inside {folder} (a result folder holds files only); "
                f"put it in {out} itself or elsewhere"
            )
        if t.name in (*RESULT_FILE_NAMES, MARKER):
            raise UserError(
                f"{where}: {folder} writes a file of that name (it writes "
                f"{', '.join(RESULT_FILE_NAMES)}); give the trace another name"
            )


def run_notes(
    loaded: LoadedScenario,
    summary: Summary,
    num_generated: int,
    *,
    capped: bool = True,
    kv_capacity_tokens: Mapping[str, int] | None = None,
) -> list[str]:
    """Lines about parts of the scenario that did not act as written: a bucketed trace
    replayed with its buckets kept, scheduled worker or link failures at or after the
    run's end (arrivals end at ``sim.duration_s`` and the run when the last request is
    done, so a failure timed after that never happens), workload changes timed at or
    after ``sim.duration_s``, a ``workload.num_requests`` cap above the
    ``num_generated`` requests that arrived before it, why requests were refused, and,
    when the requests had no ``max_tokens`` (``capped`` false), what the default cap
    did (:mod:`disaggsim.cap_notes`), and, given one worker's KV capacity by pool role,
    the ``batch_occupancy`` targets that can never add a worker
    (:mod:`disaggsim.autoscale.notes`)."""
    from disaggsim.cap_notes import rejections_note, run_cap_note
    from disaggsim.workload.config import TraceWorkload
    from disaggsim.workload.generate import kept_buckets_note

    s = loaded.scenario
    notes = []
    if isinstance(s.workload, TraceWorkload):
        kept = kept_buckets_note(s.workload, loaded.base_dir)
        if kept is not None:
            notes.append(kept)
    end_s = summary.sim_end_s
    late = [
        f"failures.workers.{i} ({f.worker} at {f.at_s:g} s)"
        for i, f in enumerate(s.failures.workers)
        if f.at_s >= end_s
    ] + [
        f"failures.links.{i} (from {w.start_s:g} s)"
        for i, w in enumerate(s.failures.links)
        if w.start_s >= end_s
    ]
    if late:
        notes.append(
            f"note: {', '.join(late)} did not happen: the run ended at {end_s:.1f} s "
            f"(arrivals end at sim.duration_s = {s.sim.duration_s:g} s, the run once the "
            "last request is done)"
        )
    unused = _workload_changes_after(s.workload, s.sim.duration_s)
    if unused:
        notes.append(
            f"note: {', '.join(unused)} did not apply: arrivals end at sim.duration_s = "
            f"{s.sim.duration_s:g} s"
        )
    cap = getattr(s.workload, "num_requests", None)
    if cap is not None and num_generated < cap:
        notes.append(
            f"note: workload.num_requests = {cap:,} was not reached: {num_generated:,} "
            f"requests arrived before sim.duration_s = {s.sim.duration_s:g} s"
        )
    refused = rejections_note(summary)
    if refused is not None:
        notes.append(refused)
    if not capped:
        cap = run_cap_note(s, summary)
        if cap is not None:
            notes.append(cap)
    if kv_capacity_tokens is not None:
        from disaggsim.autoscale.notes import occupancy_notes

        notes += occupancy_notes(loaded, kv_capacity_tokens)
    return notes


def _workload_changes_after(workload: object, duration_s: float) -> list[str]:
    """The workload's timed changes (a mix shift, rate schedule points, a step rate's
    burst) at or after ``duration_s``, when no request arrives any more."""
    out = []
    shift = getattr(workload, "mix_shift", None)
    if shift is not None and shift.at_s >= duration_s:
        out.append(f"workload.mix_shift (at {shift.at_s:g} s)")
    schedule = getattr(workload, "rate_schedule", None) or ()
    out += [
        f"workload.rate_schedule.{i} (from {t:g} s)"
        for i, (t, _) in enumerate(schedule)
        if t >= duration_s
    ]
    shape = getattr(workload, "rate_shape", None)
    if shape is not None and shape.kind == "step" and shape.start_s >= duration_s:
        out.append(f"workload.rate_shape (its burst from {shape.start_s:g} s)")
    return out
