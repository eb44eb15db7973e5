"""How long ``disaggsim plan`` takes for a GPU budget (docs/planning.md, "Speed").

    python benchmarks/plan_speed.py [--gpus 64] [--quick] [--workers 2] \
        [--scenario scenarios/advisor/long-prompt-infiniband.yaml] [--json]

Prints the wall time, the CPU seconds of this process and its simulation workers, the
number of simulations, the load average before and after (the machine may be shared:
wall time then overstates the cost; CPU seconds / workers is what an idle machine with
that many cores would take, to within cache contention and workers left idle at the end
of a lock-step wave), and the verdict. It also times a fixed reference simulation
(``scenarios/ci/disaggregated.yaml`` at 4 req/s for 1000 s, after one warm-up run) before and after, wall and
CPU, in this process: ``core_share`` = its CPU / wall is the share of a core the
benchmark got, and ``wall_s_normalised`` = wall × core_share estimates the wall time on
an unshared machine. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reference() -> tuple[float, float]:
    """(wall s, CPU s) of one fixed simulation in this process."""
    from disaggsim.run import simulate

    path = REPO / "scenarios/ci/disaggregated.yaml"
    sets = ["workload.rate_per_s=4", "sim.duration_s=1000", "sim.warmup_s=5"]
    simulate(path, sets)  # imports and caches warm
    cpu0, t0 = cpu_s(), time.perf_counter()
    simulate(path, sets)
    return time.perf_counter() - t0, cpu_s() - cpu0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario", type=Path, default=REPO / "scenarios/advisor/long-prompt-infiniband.yaml"
    )
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from disaggsim.plan import PlanOptions, plan
    from disaggsim.sweep import ProcessExecutor

    opts = PlanOptions.quick() if args.quick else PlanOptions()
    load_before = os.getloadavg()
    ref_before = reference()
    cpu0, t0 = cpu_s(), time.perf_counter()
    with ProcessExecutor(args.workers) as ex:
        res, advice = plan(args.scenario, gpus=args.gpus, options=opts, executor=ex)
        # the workers are the forkserver's children, not ours: read their CPU before
        # the pool shuts down
        pool = ex._pool
        workers_cpu = sum(proc_cpu_s(pid) for pid in (pool._processes if pool else {}))
    wall = time.perf_counter() - t0
    cpu = cpu_s() - cpu0 + workers_cpu
    ref_after = reference()
    share = (ref_before[1] + ref_after[1]) / (ref_before[0] + ref_after[0])
    out = {
        "scenario": str(args.scenario),
        "gpus": args.gpus,
        "mode": "quick" if args.quick else "full",
        "workers": args.workers,
        "wall_s": round(wall, 1),
        "core_share": round(min(share, 1.0), 2),
        "wall_s_normalised": round(wall * min(share, 1.0), 1),
        "reference_wall_s": [round(ref_before[0], 2), round(ref_after[0], 2)],
        "reference_cpu_s": [round(ref_before[1], 2), round(ref_after[1], 2)],
        "cpu_s": round(cpu, 1),
        "cpu_s_per_worker": round(cpu / args.workers, 1),
        "num_simulations": res.num_simulations,
        "num_candidates": len(res.ranked),
        "families": len(res.families),
        "pruned": sum(1 for v in res.families.values() if v == "pruned"),
        "converged": res.converged,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "verdict": advice.verdict,
        "best": res.ranked[0].candidate.label if res.ranked else None,
        "best_goodput_per_gpu": res.ranked[0].goodput_per_gpu_per_s if res.ranked else None,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['mode']} plan, {args.gpus} GPUs, {args.workers} workers: "
            f"{res.num_simulations} simulations, wall {out['wall_s']} s "
            f"(normalised {out['wall_s_normalised']} s), CPU {out['cpu_s']} s "
            f"({out['cpu_s_per_worker']} per worker)"
        )
        for k, v in out.items():
            print(f"{k:>22}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
