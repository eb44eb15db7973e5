"""Where a plan's simulation CPU goes: the plan run on a serial executor that times each
simulation's CPU (``time.process_time``: load-independent but for cache contention).

    python benchmarks/plan_cost.py [--gpus 64] [--quick] [--workers 2] \
        [--scenario scenarios/advisor/long-prompt-infiniband.yaml] [--json] [--rows FILE] \
        [--cpu-from ROWS]

Prints the number of simulations, their requests and CPU seconds in all and per
candidate kind, the retests, the convergence, the verdict and the best candidate of each
kind. ``measured_requests`` sums the runs' ``num_requests`` (arrivals after the warm-up,
arrived or not: a run stopped early counts all of them); ``simulated_requests`` counts,
of those, the ones a run stopped early had let arrive by its stop (its summary's
``num_arrived``). The executor also keeps a virtual clock of ``--workers`` workers: each
run takes its measured CPU seconds on the first free one, in the order the plan sends
them (and, where the plan waits for one of several runs, the one that finishes first on
that clock comes back first).
``makespan_s`` is then the wall time of the simulations on an idle machine with that
many cores (worker start-up and the parent's own CPU, ``cpu_s_parent``, left out): the
figure that shows how well the plan keeps its workers busy, whatever else runs on this
machine. ``--cpu-from`` replays every run with the CPU seconds the same run took in an
earlier ``--rows`` file, so that two versions of the planner are compared on identical
per-run costs (the per-run CPU of two measurements on a shared machine differs by 5-10
%). Not a test: nothing is asserted. docs/planning.md ("Speed") quotes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class TimedSerial:
    """A serial executor that records (scenario name, seed, duration, CPU s, requests)
    and replays the runs on ``workers`` virtual workers (module docstring)."""

    def __init__(self, workers: int = 2, cpu_from: dict[tuple, float] | None = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.cpu_from = cpu_from or {}  # run key -> CPU s of an earlier measurement
        self.cpu_substituted = 0
        self.workers = workers
        self.now = 0.0  # the virtual clock
        self._free = [0.0] * workers  # when each virtual worker is next free
        self._queue: list[tuple[Future, Any, Any]] = []  # submitted, not started
        self._ends: dict[Future, tuple[float, int]] = {}  # started: (end, worker)

    def _run(self, fn, t) -> tuple[Any, float]:
        c0 = time.process_time()
        s = fn(t)
        cpu = time.process_time() - c0
        sim = t.raw.get("sim", {})
        row = {
            "name": t.raw.get("name", ""),
            "arch": t.raw.get("architecture", ""),
            "seed": t.raw.get("seed"),
            "rate": t.raw["workload"]["rate_per_s"],
            "duration_s": sim.get("duration_s"),
            "cpu_s": cpu,
            "requests": s.num_requests,
            "requests_simulated": simulated_requests(s),
            "stopped_early_at_s": s.get("stopped_early_at_s"),
        }
        earlier = self.cpu_from.get(run_key(row))
        if earlier is not None:
            row["cpu_s_measured"], row["cpu_s"] = cpu, earlier
            cpu = earlier
            self.cpu_substituted += 1
        self.rows.append(row)
        return s, cpu

    def map(self, fn, tasks, on_done=None):
        """One round: each run on the first free worker; the round ends with its last."""
        free = [self.now] * self.workers
        out = []
        for t in tasks:
            s, cpu = self._run(fn, t)
            i = free.index(min(free))
            free[i] += cpu
            out.append(s)
            if on_done is not None:
                on_done()
        self.now = max(free)
        return out

    def submit(self, fn, task) -> Future:
        f: Future = Future()
        self._queue.append((f, fn, task))
        self._start()
        return f

    def _start(self) -> None:
        while self._queue:
            idle = [i for i in range(self.workers) if i not in {w for _, w in self._ends.values()}]
            if not idle:
                return
            f, fn, t = self._queue.pop(0)
            s, cpu = self._run(fn, t)
            f.set_result(s)  # the run is done; the clock says when it comes back
            self._ends[f] = (max(self.now, self._free[idle[0]]) + cpu, idle[0])
            self._free[idle[0]] = self._ends[f][0]

    def wait_first(self, futures: list[Future]) -> set[Future]:
        f = min((g for g in futures if g in self._ends), key=lambda g: self._ends[g][0])
        self.now = self._ends.pop(f)[0]
        self._start()
        return {f}

    def close(self) -> None:
        pass


def run_key(row: dict[str, Any]) -> tuple:
    """A run in a --rows file: its scenario (the candidate), seed, rate and length."""
    return (
        row["name"],
        int(row["seed"]),
        float(f"{float(row['rate']):.9g}"),
        float(f"{float(row['duration_s']):.9g}"),
    )


def simulated_requests(summary: Any) -> int:
    """The measured requests (arrival >= ``sim.warmup_s``: the summary's
    ``num_requests``) the run simulated: all of them, or, for a run stopped early, those
    that had arrived by ``stopped_early_at_s`` (its ``num_arrived``; ``num_requests``
    counts every measured request, arrived or not)."""
    if summary.get("stopped_early_at_s") is None:
        return int(summary.num_requests)
    return int(summary["num_arrived"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario", type=Path, default=REPO / "scenarios/advisor/long-prompt-infiniband.yaml"
    )
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=2, help="virtual workers for makespan_s")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rows", type=Path, help="write every simulation as a CSV row here")
    p.add_argument(
        "--cpu-from",
        type=Path,
        help="a --rows file of an earlier measurement: replay each run with the CPU seconds "
        "it took there (the same run: scenario, seed, rate, length), so that two versions "
        "of the planner are compared on the same per-run costs; runs not in it keep their own",
    )
    args = p.parse_args(argv)

    from disaggsim.plan import PlanOptions, plan

    opts = PlanOptions.quick() if args.quick else PlanOptions()
    cpu_from = None
    if args.cpu_from is not None:
        import csv

        with args.cpu_from.open() as f:
            cpu_from = {run_key(r): float(r["cpu_s"]) for r in csv.DictReader(f)}
    ex = TimedSerial(args.workers, cpu_from)
    c0, t0 = time.process_time(), time.perf_counter()
    res, advice = plan(args.scenario, gpus=args.gpus, options=opts, executor=ex)
    cpu_all, wall = time.process_time() - c0, time.perf_counter() - t0
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in ex.rows:
        k = "colocated-" + ("chunked" if "chunked" in r["name"] else "vllm")
        k = "disaggregated" if r["arch"] == "disaggregated" else k
        by_kind[k][0] += 1
        by_kind[k][1] += r["requests_simulated"]
        by_kind[k][2] += r["cpu_s"]
    best: dict[str, Any] = {}
    for row in res.ranked:
        if row.status != "explored" and row.candidate.kind not in best:
            best[row.candidate.kind] = (row.candidate.label, round(row.goodput_per_gpu_per_s, 4))
    retests = sum(
        getattr(e, "retest", None) is not None
        for row in res.ranked
        if row.goodput is not None
        for e in row.goodput.evaluations
    )
    out = {
        "scenario": str(args.scenario),
        "gpus": res.gpu_budget,
        "quick": args.quick,
        "simulations": len(ex.rows),
        "num_simulations_reported": res.num_simulations,
        "measured_requests": int(sum(r["requests"] for r in ex.rows)),
        "simulated_requests": int(sum(r["requests_simulated"] for r in ex.rows)),
        "cpu_s_simulations": round(sum(r["cpu_s"] for r in ex.rows), 1),
        "cpu_s_all": round(cpu_all, 1),
        "cpu_s_parent": round(
            cpu_all - sum(r.get("cpu_s_measured", r["cpu_s"]) for r in ex.rows),
            1,
        ),
        "cpu_s_from_earlier_runs": ex.cpu_substituted,
        "workers": args.workers,
        "makespan_s": round(ex.now, 1),
        "stopped_early": sum(r["stopped_early_at_s"] is not None for r in ex.rows),
        "wall_s": round(wall, 1),
        "by_kind": {k: [v[0], int(v[1]), round(v[2], 1)] for k, v in sorted(by_kind.items())},
        "retested_evaluations": retests,
        "screened_out": res.num_screened_out,  # quick mode's screened moves that missed
        "converged": res.converged,
        "families": {
            s: sum(1 for v in res.families.values() if v == s) for s in set(res.families.values())
        },
        "verdict": advice.verdict,
        "gain": advice.disaggregation_gain,
        "best_confirmed": best,
    }
    if args.rows is not None:
        import pandas as pd

        pd.DataFrame(ex.rows).to_csv(args.rows, index=False)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
