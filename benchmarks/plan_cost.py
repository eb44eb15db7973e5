"""Where a plan's simulation CPU goes: the plan run on a serial executor that times each
simulation's CPU (``time.process_time``: load-independent but for cache contention).

    python benchmarks/plan_cost.py [--gpus 64] [--quick] \
        [--scenario scenarios/advisor/long-prompt-infiniband.yaml] [--json] [--rows FILE]

Prints the number of simulations, their simulated requests and CPU seconds in all and
per candidate kind and per phase (exploration, retests, confirmation-length runs), the
convergence, the verdict and the best candidate of each kind. Not a test: nothing is
asserted. docs/planning.md ("Speed") quotes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class TimedSerial:
    """A serial executor that records (scenario name, seed, duration, CPU s, requests)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def map(self, fn, tasks, on_done=None):
        out = []
        for t in tasks:
            c0 = time.process_time()
            s = fn(t)
            cpu = time.process_time() - c0
            sim = t.raw.get("sim", {})
            self.rows.append(
                {
                    "name": t.raw.get("name", ""),
                    "arch": t.raw.get("architecture", ""),
                    "seed": t.raw.get("seed"),
                    "rate": t.raw["workload"]["rate_per_s"],
                    "duration_s": sim.get("duration_s"),
                    "cpu_s": cpu,
                    "requests": s.num_requests,
                }
            )
            out.append(s)
            if on_done is not None:
                on_done()
        return out

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario", type=Path, default=REPO / "scenarios/advisor/long-prompt-infiniband.yaml"
    )
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rows", type=Path, help="write every simulation as a CSV row here")
    args = p.parse_args(argv)

    from disaggsim.plan import PlanOptions, plan

    opts = PlanOptions.quick() if args.quick else PlanOptions()
    ex = TimedSerial()
    c0, t0 = time.process_time(), time.perf_counter()
    res, advice = plan(args.scenario, gpus=args.gpus, options=opts, executor=ex)
    cpu_all, wall = time.process_time() - c0, time.perf_counter() - t0
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in ex.rows:
        k = "colocated-" + ("chunked" if "chunked" in r["name"] else "vllm")
        k = "disaggregated" if r["arch"] == "disaggregated" else k
        by_kind[k][0] += 1
        by_kind[k][1] += r["requests"]
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
        "simulated_requests": int(sum(r["requests"] for r in ex.rows)),
        "cpu_s_simulations": round(sum(r["cpu_s"] for r in ex.rows), 1),
        "cpu_s_all": round(cpu_all, 1),
        "wall_s": round(wall, 1),
        "by_kind": {k: [v[0], int(v[1]), round(v[2], 1)] for k, v in sorted(by_kind.items())},
        "retested_evaluations": retests,
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
