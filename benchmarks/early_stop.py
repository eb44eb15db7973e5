"""What stopping runs that certainly miss saves: one scenario at multiples of its
capacity, each rate simulated with and without ``stop_on_certain_miss``, at the run
length a goodput search gives it (:func:`disaggsim.metrics.steady.horizon`).

    python benchmarks/early_stop.py [--scenario scenarios/seed-70b-4k/disaggregated.yaml] \
        [--set PATH=VALUE ...] [--factors 1.5 3] [--capacity REQ_PER_S] [--quick] \
        [--repeats 3] [--json]

Capacity (req/s): ``--capacity``, or for a disaggregated scenario its prefill pool's
(workers × full-batch prefill tokens per second / mean prompt tokens). Per rate and mode
it prints the median wall and CPU seconds of ``simulate`` (alternating the two modes,
``--repeats`` times), the simulated seconds, the requests that arrived before the run
ended (the load-independent cost) and the verdicts; with the stop, the number of checks
and their CPU (timed separately, through the engine alone). Not a test: nothing is
asserted. docs/performance.md ("Stopping runs that certainly miss") quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def prefill_capacity_per_s(loaded: Any) -> float:
    from disaggsim.autoscale import prefill_tokens_per_s
    from disaggsim.run import build_costs, make_requests

    s = loaded.scenario
    if s.architecture != "disaggregated":
        raise SystemExit("--capacity is needed for a colocated scenario")
    pool = s.prefill_pool
    prompt = int(make_requests(loaded).prompt_tokens.mean())
    per_worker = prefill_tokens_per_s(
        build_costs(s)["prefill"], max_batch_tokens=pool.max_batch_tokens, prompt_tokens=prompt
    )
    return pool.num_workers * per_worker / prompt


def check_cost(loaded: Any) -> tuple[int, float]:
    """(checks, CPU seconds inside them) of one stopped run, engine only."""
    from disaggsim.metrics.early_stop import CHECK_EVERY_S
    from disaggsim.run import (
        build_costs,
        build_topology,
        build_transfer,
        certain_miss_check,
        make_requests,
        run_engine,
    )

    s = loaded.scenario
    reqs = make_requests(loaded)
    inner = certain_miss_check(s, reqs)
    spent = [0.0]

    def timed(now_s: float, view: Any) -> bool:
        c0 = time.process_time()
        stop = inner(now_s, view)
        spent[0] += time.process_time() - c0
        return stop

    run_engine(
        s,
        build_costs(s),
        reqs,
        build_transfer(s),
        build_topology(s),
        stop_check=timed,
        check_every_s=CHECK_EVERY_S,
    )
    return inner.num_checks, spent[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="scenarios/seed-70b-4k/disaggregated.yaml")
    p.add_argument("--set", nargs="*", default=[], help="scenario overrides (PATH=VALUE)")
    p.add_argument("--factors", type=float, nargs="+", default=[1.5, 3.0])
    p.add_argument("--capacity", type=float, help="req/s (default: the prefill pool's)")
    p.add_argument("--quick", action="store_true", help="plan --quick's run length")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import disaggsim
    from disaggsim.config.loader import load_scenario
    from disaggsim.metrics.steady import RunLengthRule, horizon
    from disaggsim.run import simulate
    from disaggsim.sweep.goodput import steady_profile

    print(f"disaggsim from {Path(disaggsim.__file__).parent}", file=sys.stderr)
    path = REPO / args.scenario if not Path(args.scenario).is_absolute() else args.scenario
    base = load_scenario(path, list(args.set))
    capacity = args.capacity or prefill_capacity_per_s(base)
    rule = (
        RunLengthRule(min_measured_requests=400, service_multiple=5.0)
        if args.quick
        else RunLengthRule()
    )
    rows = []
    for factor in args.factors:
        rate = factor * capacity
        over = [*args.set, f"workload.rate_per_s={rate:.6g}"]
        prof = steady_profile(load_scenario(path, over))
        h = horizon(rule, rate, prof.service_s, prof.drain_s)
        loaded = load_scenario(path, [*over, *h.overrides()])
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        result: dict[bool, Any] = {}
        for _ in range(args.repeats):
            for stop in (False, True):
                t0, c0 = time.perf_counter(), time.process_time()
                res = simulate(loaded, stop_on_certain_miss=stop)
                times[stop].append((time.perf_counter() - t0, time.process_time() - c0))
                result[stop] = res
        checks, check_cpu = check_cost(loaded)
        for stop in (False, True):
            res = result[stop]
            s = res.summary
            arrived = int((res.requests["arrival_at_s"] <= s.sim_end_s).sum())
            rows.append(
                {
                    "factor": factor,
                    "rate_per_s": round(rate, 4),
                    "stop_on_certain_miss": stop,
                    "wall_s": round(statistics.median(w for w, _ in times[stop]), 3),
                    "cpu_s": round(statistics.median(c for _, c in times[stop]), 3),
                    "sim_end_s": round(s.sim_end_s, 2),
                    "horizon_s": round(h.duration_s + h.drain_s, 2),
                    "requests_simulated": arrived,
                    "requests_total": len(res.requests),
                    "stopped_early_at_s": s.stopped_early_at_s,
                    "slo_attainment": s.slo_attainment,
                    "slo_attainment_upper_bound": s.slo_attainment_upper_bound,
                    "meets_slo": s.meets_slo,
                    "num_checks": checks if stop else 0,
                    "check_cpu_s": round(check_cpu, 4) if stop else 0.0,
                }
            )
    if args.json:
        print(json.dumps({"capacity_per_s": capacity, "rows": rows}, indent=2))
        return 0
    print(f"{args.scenario} {' '.join(args.set)}: capacity {capacity:.3f} req/s, run length {rule}")
    head = (
        f"{'x cap':>5} {'rate':>7} {'stop':>5} {'wall s':>7} {'CPU s':>6} {'end s':>7} "
        f"{'requests':>9} {'att':>6} {'bound':>6} {'checks':>6} {'chk CPU s':>9}"
    )
    print(head)
    for r in rows:
        att = r["slo_attainment"]
        bound = r["slo_attainment_upper_bound"]
        print(
            f"{r['factor']:>5g} {r['rate_per_s']:>7.3f} {str(r['stop_on_certain_miss']):>5} "
            f"{r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} {r['sim_end_s']:>7.1f} "
            f"{r['requests_simulated']:>5}/{r['requests_total']:<4}"
            f"{att:>6.3f} {'-' if bound is None else f'{bound:.3f}':>6} "
            f"{r['num_checks']:>6} {r['check_cpu_s']:>9.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
