"""Where the time and memory of ``disaggsim bench --scale``, and of writing its result
folder as ``disaggsim run`` does, go, phase by phase (docs/performance.md, "After the
simulation").

    python benchmarks/fleet_phases.py [--gpus 1000] [--num-requests 1000000] [--json]
        [--save-raw FILE | --load-raw FILE] [--repeat N]

Runs the ``--scale`` fleet scenario (``disaggsim.cli.bench.fleet_scenario``) through the
same functions :func:`disaggsim.run.simulate` calls, one phase at a time, and prints per
phase the CPU seconds of this process, the wall seconds, the resident memory after the
phase and its peak during the phase (Linux: ``VmHWM`` reset before each phase through
``/proc/self/clear_refs``). Phases: ``setup`` (cost models, fabric), ``workload``
(generating the requests), ``engine`` (the simulation), ``step_end_times`` (every
worker's step end times, expanded once as ``simulate`` does), ``invariants``,
``request_frame`` (the per-request frame and the inter-token gap distribution),
``summary``, ``timeseries``, then what ``disaggsim run`` does with the result:
``write_files`` (the result folder without plots: Parquet frames, summary, scenario)
and ``plots`` (its PNG plots), both into a temporary folder removed afterwards.

``--save-raw FILE`` pickles the engine's records after the simulation; ``--load-raw FILE``
reads them instead of simulating, so the phases after the engine can be measured again
(``--repeat N`` times, printing each run and the medians) without the simulation. Their
resident-memory figures then start from the unpickled records, not from an engine's
heap. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")


def _kib(field: str) -> int:
    m = re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text())
    return int(m.group(1)) if m else 0


def _sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class Phases:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, fn, *args):
        _reset_peak()
        c0, t0, s0 = time.process_time(), time.perf_counter(), _sys_s()
        out = fn(*args)
        self.rows.append(
            {
                "phase": name,
                "cpu_s": time.process_time() - c0,
                "sys_s": _sys_s() - s0,
                "wall_s": time.perf_counter() - t0,
                "rss_after_mib": _kib("VmRSS") / 1024,
                "rss_peak_mib": _kib("VmHWM") / 1024,
            }
        )
        return out


def _step_ends(raw: Any) -> list:
    """Every worker's step end times, as :func:`disaggsim.run.simulate` expands them once."""
    return [w.steps.step_end_times() for w in raw.workers]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--num-requests", type=int, default=1_000_000)
    p.add_argument("--save-raw", type=Path)
    p.add_argument("--load-raw", type=Path)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from disaggsim.cli.bench import fleet_scenario
    from disaggsim.config.loader import load_scenario
    from disaggsim.metrics.invariants import check_run
    from disaggsim.metrics.plots import write_plots
    from disaggsim.metrics.reconstruct import request_frame
    from disaggsim.metrics.summary import summarize
    from disaggsim.run import (
        SimulationResult,
        build_costs,
        build_topology,
        build_transfer,
        make_requests,
        run_engine,
        timeseries_frame,
        write_results_folder,
    )
    from disaggsim.validity import check_prefill_budget

    loaded = load_scenario(fleet_scenario(args.gpus, args.num_requests))
    s = loaded.scenario
    runs = []
    raw = None
    for _ in range(args.repeat):
        ph = Phases()
        if args.load_raw is not None:
            if raw is None:
                raw = ph.run("load_raw", lambda: pickle.loads(args.load_raw.read_bytes()))
        else:
            costs = ph.run("setup", build_costs, s)
            transfer = build_transfer(s)
            topology = build_topology(s)

            def workload():
                reqs = make_requests(loaded)
                check_prefill_budget(s, reqs, "<fleet>")
                return reqs

            reqs = ph.run("workload", workload)

            del raw
            raw = ph.run("engine", run_engine, s, costs, reqs, transfer, topology, 0, "<fleet>")
            del reqs
            if args.save_raw is not None:
                args.save_raw.write_bytes(pickle.dumps(raw, protocol=5))
        # as simulate does: every worker's step end times expanded once, for the checks and
        # the request frame (which takes each out of its list as it goes)
        step_ends = ph.run("step_end_times", _step_ends, raw)
        ph.run("invariants", check_run, raw, step_ends)
        taken: list = list(step_ends)
        del step_ends
        frame, gaps = ph.run("request_frame", request_frame, raw, s.sim.warmup_s, taken)
        summary = ph.run("summary", summarize, frame, gaps, raw, s)
        ts = ph.run("timeseries", timeseries_frame, raw)
        result = SimulationResult(
            scenario=s,
            raw_scenario=loaded.raw,
            requests=frame,
            timeseries=ts,
            summary=summary,
            gaps=gaps,
            raw=raw,
            wall_s=0.0,
        )
        with tempfile.TemporaryDirectory(prefix="fleet-phases-") as tmp:
            ph.run("write_files", write_results_folder, result, Path(tmp) / "out", False)
            ph.run("plots", write_plots, result, Path(tmp) / "out")
        post = [r for r in ph.rows if r["phase"] in POST]
        ph.rows.append(
            {
                "phase": "post (sum)",
                "cpu_s": sum(r["cpu_s"] for r in post),
                "sys_s": sum(r["sys_s"] for r in post),
                "wall_s": sum(r["wall_s"] for r in post),
                "rss_after_mib": ph.rows[-1]["rss_after_mib"],
                "rss_peak_mib": max(r["rss_peak_mib"] for r in post),
            }
        )
        runs.append(ph.rows)
        if not args.json:
            _print(ph.rows, f"run {len(runs)}: {summary.num_requests} requests, {len(ts)} rows")
        del frame, gaps, summary, ts, result
    if args.json:
        print(json.dumps({"gpus": args.gpus, "num_requests": args.num_requests, "runs": runs}))
    elif len(runs) > 1:
        names = [r["phase"] for r in runs[-1]]
        med = [
            {
                "phase": n,
                **{
                    k: statistics.median(r[k] for run in runs for r in run if r["phase"] == n)
                    for k in ("cpu_s", "sys_s", "wall_s", "rss_after_mib", "rss_peak_mib")
                },
            }
            for n in names
        ]
        _print(med, f"medians of {len(runs)} runs (load average {os.getloadavg()[0]:.1f})")
    return 0


POST = (
    "step_end_times",
    "invariants",
    "request_frame",
    "summary",
    "timeseries",
    "write_files",
    "plots",
)


def _print(rows: list[dict[str, Any]], title: str) -> None:
    print(title)
    print(
        f"  {'phase':<14} {'CPU s':>8} {'of it sys':>9} {'wall s':>8} {'RSS after MiB':>14} "
        f"{'peak MiB':>9}"
    )
    for r in rows:
        print(
            f"  {r['phase']:<14} {r['cpu_s']:8.2f} {r['sys_s']:9.2f} {r['wall_s']:8.2f} "
            f"{r['rss_after_mib']:14.0f} {r['rss_peak_mib']:9.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
