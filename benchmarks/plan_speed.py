"""How long ``disaggsim plan`` takes for a GPU budget (docs/planning.md, "Speed").

    python benchmarks/plan_speed.py [--gpus 64] [--quick] [--workers 2] \
        [--scenario scenarios/advisor/long-prompt-infiniband.yaml] [--json]

Runs the plan on ``--workers`` worker processes, as ``disaggsim plan`` does, and prints
figures that each say what they measure (on a shared machine the wall time overstates
what the plan costs, and a core share read from a reference run overstated it too: the
reference ran while the plan's workers were idle):

- ``wall_s``: the plan's wall time here, whatever else this machine runs;
- ``cpu_s``: the CPU seconds of this process (``cpu_s_parent``) and of its workers
  (``cpu_s_workers``, read from /proc before the pool shuts down: the workers are the
  forkserver's children, so ``RUSAGE_CHILDREN`` never sees them), of which
  ``cpu_s_runs`` inside the simulations (each run timed in its worker) and the rest
  worker start-up, imports and transfers (``cpu_s_worker_overhead``);
- ``idle_lower_bound_s`` = ``cpu_s`` / workers: no idle machine with that many cores
  is faster;
- ``makespan_s``: the runs, each with the CPU seconds it took in its worker, replayed on
  ``--workers`` virtual workers in the order the plan sends them (benchmarks/plan_cost.py's
  clock; the plan is run a second time for it, on the runs' summaries kept from the first:
  no simulation, the same answer);
- ``idle_estimate_s`` = ``makespan_s`` + ``cpu_s_parent`` + ``cpu_s_worker_overhead`` /
  workers: the wall time on an idle machine with that many cores, the parent's CPU
  counted as if it never ran beside a busy worker (so an upper estimate);
- the bare SimPy rate before and after (``simpy_timeouts_per_s_wall``: timeouts per wall
  second, what this process got; ``..._cpu``: per CPU second, how fast a core is) and the
  load average. Per-run CPU seconds still carry the machine's contention (caches).

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_cost import TimedSerial  # noqa: E402


def cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def simpy_rates(num_events: int = 200_000) -> tuple[float, float]:
    """Bare SimPy here now: one process waiting on ``num_events`` timeouts, events per
    wall second and per CPU second of this process."""
    import simpy

    env = simpy.Environment()

    def waiter(env: simpy.Environment) -> Any:
        for _ in range(num_events):
            yield env.timeout(1.0)

    env.process(waiter(env))
    c0, t0 = time.process_time(), time.perf_counter()
    env.run()
    return num_events / (time.perf_counter() - t0), num_events / (time.process_time() - c0)


def key(task: Any) -> str:
    return json.dumps(task.raw, sort_keys=True, default=str) + repr(
        (task.stop_on_certain_miss, task.stop_below_attainment)
    )


def timed_call(fn: Any, task: Any) -> tuple[Any, float]:
    """Worker side: ``fn(task)`` and the CPU seconds it took in this worker."""
    c0 = time.process_time()
    out = fn(task)
    return out, time.process_time() - c0


def _timed_executor(workers: int, runs: dict[str, tuple[Any, float]]):
    from disaggsim.sweep import ProcessExecutor

    class TimedProcessExecutor(ProcessExecutor):
        """A process pool whose runs time themselves; ``runs``: key -> (summary, CPU s)."""

        def submit(self, fn: Any, task: Any) -> Future:
            inner = self._get_pool().submit(timed_call, fn, task)
            outer: Future = Future()

            def done(f: Future) -> None:
                if f.cancelled():
                    outer.cancel()
                elif f.exception() is not None:
                    outer.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    s, cpu = f.result()
                    runs[key(task)] = (s, cpu)
                    outer.set_result(s)

            inner.add_done_callback(done)
            return outer

    return TimedProcessExecutor(workers)


class Replay(TimedSerial):
    """benchmarks/plan_cost.py's virtual clock on the runs of the real plan: each run's
    summary and CPU seconds from ``runs`` (a run not there is simulated and counted)."""

    def __init__(self, workers: int, runs: dict[str, tuple[Any, float]]) -> None:
        super().__init__(workers)
        self.runs = runs
        self.missing = 0

    def _run(self, fn, t):
        got = self.runs.get(key(t))
        if got is None:
            self.missing += 1
            c0 = time.process_time()
            got = (fn(t), time.process_time() - c0)
        self.rows.append({"cpu_s": got[1]})
        return got


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

    opts = PlanOptions.quick() if args.quick else PlanOptions()
    load_before = os.getloadavg()
    simpy_before = simpy_rates()
    runs: dict[str, tuple[Any, float]] = {}
    cpu0, t0 = cpu_s(), time.perf_counter()
    with _timed_executor(args.workers, runs) as ex:
        res, advice = plan(args.scenario, gpus=args.gpus, options=opts, executor=ex)
        # the workers are the forkserver's children, not ours: read their CPU before
        # the pool shuts down
        pool = ex._pool
        workers_cpu = sum(proc_cpu_s(pid) for pid in (pool._processes if pool else {}))
    wall = time.perf_counter() - t0
    parent_cpu = cpu_s() - cpu0
    simpy_after = simpy_rates()
    load_after = os.getloadavg()
    replay = Replay(args.workers, runs)
    again, _ = plan(args.scenario, gpus=args.gpus, options=opts, executor=replay)
    runs_cpu = sum(cpu for _, cpu in runs.values())
    overhead = workers_cpu - runs_cpu
    total = parent_cpu + workers_cpu
    # the answer: the recommendation (checked as written, plan/holds.py), else the top row
    best = advice.recommended or (res.ranked[0] if res.ranked else None)
    out = {
        "scenario": str(args.scenario),
        "gpus": args.gpus,
        "mode": "quick" if args.quick else "full",
        "workers": args.workers,
        "num_simulations": res.num_simulations,
        "num_as_written_runs": res.num_as_written_runs,
        "wall_s": round(wall, 1),
        "cpu_s": round(total, 1),
        "cpu_s_parent": round(parent_cpu, 1),
        "cpu_s_workers": round(workers_cpu, 1),
        "cpu_s_runs": round(runs_cpu, 1),
        "cpu_s_worker_overhead": round(overhead, 1),
        "idle_lower_bound_s": round(total / args.workers, 1),
        "makespan_s": round(replay.now, 1),
        "idle_estimate_s": round(replay.now + parent_cpu + overhead / args.workers, 1),
        "replay_same_answer": (
            [r.as_dict() for r in again.ranked] == [r.as_dict() for r in res.ranked]
            and replay.missing == 0
        ),
        "simpy_timeouts_per_s_wall": [round(simpy_before[0]), round(simpy_after[0])],
        "simpy_timeouts_per_s_cpu": [round(simpy_before[1]), round(simpy_after[1])],
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
        "cpu_count": os.cpu_count(),
        "num_candidates": len(res.ranked),
        "families": len(res.families),
        "pruned": sum(1 for v in res.families.values() if v == "pruned"),
        "converged": res.converged,
        "verdict": advice.verdict,
        "best": best.candidate.label if best else None,
        "best_goodput_per_gpu": best.goodput_per_gpu_per_s if best else None,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        w = args.workers
        print(
            f"{out['mode']} plan, {args.gpus} GPUs, {w} workers, {res.num_simulations} "
            f"simulations: wall here {out['wall_s']} s (load average "
            f"{load_before[0]:.1f} -> {load_after[0]:.1f}, bare SimPy "
            f"{simpy_before[0] / 1e6:.2f}/{simpy_after[0] / 1e6:.2f} M timeouts/s)"
        )
        print(
            f"  CPU {out['cpu_s']} s (parent {out['cpu_s_parent']}, workers "
            f"{out['cpu_s_workers']}: runs {out['cpu_s_runs']} + start-up etc. "
            f"{out['cpu_s_worker_overhead']})"
        )
        print(
            f"  idle {w}-core machine: at least {out['idle_lower_bound_s']} s (CPU / {w}); "
            f"runs replayed on {w} workers {out['makespan_s']} s; with the parent and "
            f"start-up at most about {out['idle_estimate_s']} s"
        )
        for k, v in out.items():
            print(f"{k:>26}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
