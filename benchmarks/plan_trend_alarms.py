"""How often the goodput search's trend test calls a lightly loaded run unstable.

Runs one planner candidate at fixed rates well below its analytic capacity over many
seeds, each run as long as the planner's goodput run at that rate (its run-length rule
raised to the family's loaded residence, docs/planning.md "Run lengths"), and prints
every run's attainment and trend p-value (Bonferroni over the two signals) and the share
of runs the test rejects at each alpha. Below capacity every rejection is a false alarm.

    python benchmarks/plan_trend_alarms.py [--scenario scenarios/advisor/pcie-only.yaml]
        [--candidate chunked:8:1:512] [--fractions 0.25,0.5] [--seeds 40]
        [--rule quick-explore|explore|final] [--workers 2]

Candidates: ``chunked:N:TP:CHUNK``, ``vllm:N:TP``, ``disagg:NP:TPP:ND:TPD``, each with an
optional ``:SEQS`` (the decode batch cap per rank; default the scenario's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from disaggsim.config.loader import load_scenario
from disaggsim.metrics.steady import horizon
from disaggsim.plan.analytic import sample_lengths, sample_requests
from disaggsim.plan.search import Candidate, PlanOptions, _Evaluator, plan_families
from disaggsim.sweep.core import RATE_PATH, _task, run_point
from disaggsim.sweep.executors import ProcessExecutor, SerialExecutor
from disaggsim.sweep.goodput import steady_profile
from disaggsim.sweep.grid import override_text


def candidate(text: str) -> Candidate:
    kind, *n = text.split(":")
    v = [int(x) for x in n]
    if kind == "chunked":
        seqs = v[3] if len(v) > 3 else None
        return Candidate("colocate_chunked", v[0], v[1], chunk_tokens=v[2], max_batch_seqs=seqs)
    if kind == "vllm":
        return Candidate("colocate_vllm", v[0], v[1], max_batch_seqs=v[2] if len(v) > 2 else None)
    seqs = v[4] if len(v) > 4 else None
    return Candidate("disaggregate", v[0], v[1], v[2], v[3], max_batch_seqs=seqs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scenarios/advisor/pcie-only.yaml")
    ap.add_argument("--candidate", default="chunked:8:1:512")
    ap.add_argument("--fractions", default="0.25,0.5")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--rule", default="quick-explore", choices=["quick-explore", "explore", "final"]
    )
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    loaded = load_scenario(Path(a.scenario))
    quick = a.rule == "quick-explore"
    opts = PlanOptions.quick() if quick else PlanOptions()
    base = opts.rule if a.rule == "final" else opts.explore_rule
    reqs = sample_requests(loaded)
    lengths = sample_lengths(loaded, reqs)
    budget = loaded.scenario.num_gpus
    _, guesses = plan_families(loaded, budget, opts, lengths, reqs)
    ev = _Evaluator(loaded, guesses, opts, None, None, "explore")
    c = candidate(a.candidate)
    rule = ev.rule_for(c, base)
    src = ev.source(c)
    prof = steady_profile(load_scenario(src.raw, base_dir=src.base_dir))
    cap = ev._guess(c).capacity_per_gpu_per_s * c.num_gpus
    print(f"{c.label}: analytic capacity {cap:.3f} req/s; rule {rule}")
    tasks, keys = [], []
    for f in (float(x) for x in a.fractions.split(",")):
        rate = f * cap
        h = horizon(rule, rate, prof.service_s, prof.drain_s)
        for k in range(a.first_seed, a.first_seed + a.seeds):
            ov = [
                override_text(RATE_PATH, rate),
                override_text("seed", src.seed + k),
                *h.overrides(),
            ]
            tasks.append(_task(src, ov))
            keys.append((f, rate, k, h.duration_s))
    with ProcessExecutor(a.workers) if a.workers > 1 else SerialExecutor() as ex:
        out = ex.map(run_point, tasks)
    by_f: dict[float, list[float]] = {}
    for (f, rate, k, dur), s in zip(keys, out, strict=True):
        by_f.setdefault(f, []).append(s.stability_p_value)
        flag = " *" if s.stability_p_value < 0.01 else ""
        print(
            f"f={f:.2f} rate={rate:.3f} seed+{k:<3d} dur={dur:7.1f}s att={s.slo_attainment:.3f} "
            f"p={s.stability_p_value:.4f} waiting_trend={s.waiting_trend_per_s:+.4f} "
            f"ttft_trend={s.ttft_trend_s_per_s:+.5f}{flag}"
        )
    for f, ps in by_f.items():
        n = len(ps)
        shares = ", ".join(f"p<{al:g}: {sum(p < al for p in ps)}/{n}" for al in (0.01, 0.001))
        print(f"fraction {f:.2f}: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
