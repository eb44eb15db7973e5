"""Decode routing policies measured side by side (``router.decode_policy``).

Each case is run once per policy (seed 0 unless ``--seeds``); one line per run:
SLO attainment, goodput (measured requests that met the SLO per second of the measured
window), fleet TPOT p50/p99, the spread over decode workers of their TPOT p50 and of
the requests they decoded, seat waits (KV arrived, no batch seat: admission − KV
arrival over 1 s), handoff waits (prefill end → transfer start over 1 s), preemptions,
and the run's wall time.

Cases: ``fixed70:P:D:RATE`` — llama-3.1-70b on H200 over InfiniBand, fixed 512-token
prompts and 1000-token replies, TPOT SLO 30 ms (the planner question 1004-4), P prefill
workers × tp2 and D decode workers × tp4 at RATE req/s per GPU; ``fixed8:P:D:RATE`` — the
same with llama-3.1-8b on H100, tp1 both sides, fixed 1000/500, TPOT 20 ms; or a
scenario YAML path (its own workload); ``@key=value`` after a case sets a field for it
(as ``disaggsim run --set``). ``--duration`` shortens every run.

    python benchmarks/decode_routing.py fixed70:2:4:1.28 scenarios/chat/disaggregated.yaml
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from disaggsim.plan.question import Question, build_question
from disaggsim.run import simulate

POLICIES = ("least_committed_kv", "most_free_kv", "round_robin")


def fixed_case(spec: str) -> dict:
    kind, p, d, rate = spec.split(":")
    num_p, num_d, per_gpu = int(p), int(d), float(rate)
    if kind == "fixed70":
        q = Question(model="llama-3.1-70b", gpu="h200-sxm", target_rate_per_s=20, isl="512",
                     osl="1000", ttft_ms=1000, itl_ms=30, fabric="infiniband")  # fmt: skip
        tp_p, tp_d = 2, 4
    elif kind == "fixed8":
        q = Question(model="llama-3.1-8b", gpu="h100-sxm", target_rate_per_s=20, isl="1000",
                     osl="500", ttft_ms=1000, itl_ms=20, fabric="infiniband")  # fmt: skip
        tp_p, tp_d = 1, 1
    else:
        raise SystemExit(f"{spec}: a case is fixed70:P:D:RATE, fixed8:P:D:RATE or a YAML path")
    raw = build_question(q)
    gpu = raw.pop("pool")["gpu"]
    raw["architecture"] = "disaggregated"
    raw["prefill_pool"] = {"gpu": gpu, "num_workers": num_p, "tp": tp_p, "max_batch_tokens": 8192}
    raw["decode_pool"] = {"gpu": gpu, "num_workers": num_d, "tp": tp_d}
    raw["workload"]["rate_per_s"] = per_gpu * (num_p * tp_p + num_d * tp_d)
    return raw


def measure(case: str, policy: str, seed: int, duration_s: float | None) -> str:
    sets = [f"router.decode_policy={policy}", f"seed={seed}"]
    if duration_s is not None:
        sets += [f"sim.duration_s={duration_s:g}", f"sim.warmup_s={duration_s / 10:g}"]
    case_name, *case_sets = case.split("@")  # a case's own --set overrides, after @
    sets += case_sets
    scenario = case_name if case_name.endswith((".yaml", ".yml")) else fixed_case(case_name)
    t0 = time.perf_counter()
    r = simulate(scenario, sets)
    wall = time.perf_counter() - t0
    s, f = r.summary, r.requests
    m = f[f["measured"]]
    window = r.scenario.sim.duration_s - r.scenario.sim.warmup_s
    ok = m["ttft_s"] <= s.slo_ttft_s
    stat = m["tpot_s"] if s.slo_itl_statistic == "tpot" else m["max_itl_s"]
    ok &= ~(stat > s.slo_itl_s)
    ok &= m["status"].astype(str) == "completed"
    goodput = ok.sum() / window
    dec = m[m["decode_worker"] >= 0]
    per = dec.groupby("decode_worker")["tpot_s"].median() * 1e3
    counts = dec.groupby("decode_worker").size()
    seat = (dec["decode_admit_at_s"] - dec["transfer_end_at_s"]).to_numpy()
    hand = (dec["transfer_start_at_s"] - dec["prefill_end_at_s"]).to_numpy()
    tpot = m["tpot_s"].to_numpy() * 1e3
    return (
        f"{case} {policy:13s} seed {seed} att {s.slo_attainment:.3f} goodput {goodput:.2f}/s "
        f"tpot p50 {np.nanpercentile(tpot, 50):.1f} p99 {np.nanpercentile(tpot, 99):.1f} ms "
        f"per-worker p50 {per.min():.1f}..{per.max():.1f} ms reqs {counts.min()}..{counts.max()} "
        f"seatwait>1s {int(np.nansum(seat > 1))} max {np.nanmax(seat, initial=0):.1f}s "
        f"handoffwait>1s {int(np.nansum(hand > 1))} max {np.nanmax(hand, initial=0):.1f}s "
        f"preempt {int(f['num_preemptions'].sum())} wall {wall:.0f}s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--duration", type=float, default=None, help="sim.duration_s of every run")
    a = ap.parse_args(argv)
    for case in a.cases:
        for seed in (int(x) for x in a.seeds.split(",")):
            for policy in a.policies.split(","):
                print(measure(case, policy, seed, a.duration), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
