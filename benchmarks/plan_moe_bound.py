"""The MoE family bound against exhaustive search (docs/planning.md, §2 "MoE families").

    python benchmarks/plan_moe_bound.py MODEL GPUS ISL OSL ITL_MS {quick,full} [on]

Plans the one-command question (H100, TTFT 2 s) on a serial executor. Without ``on``,
every MoE family is evaluated (bounds off: the search over families is exhaustive), then
the walk is replayed with the bounds on over the same simulated values; with ``on`` the
plan runs with them. Prints JSON: simulations, explored candidates, wall and CPU seconds,
verdict and best, each family's bound, best explored and best confirmed goodput per GPU,
and the replay (families pruned, candidates not explored, best of each kind). Not a
test: nothing is asserted.
"""

from __future__ import annotations

import importlib
import json
import math
import resource
import sys
import time


def cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def main(argv: list[str]) -> int:
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan import plan
    from disaggsim.plan.analytic import sample_lengths, sample_requests
    from disaggsim.plan.optimise import optimise
    from disaggsim.plan.question import Question, build_question
    from disaggsim.sweep import SerialExecutor

    search = importlib.import_module("disaggsim.plan.search")
    model, gpus, isl, osl, itl, mode = argv[:6]
    bounds_on = len(argv) > 6 and argv[6] == "on"
    q = Question(
        model=model, gpu="h100-sxm", gpus=int(gpus), isl=isl, osl=osl, ttft_ms=2000,
        itl_ms=float(itl),
    )  # fmt: skip
    loaded = load_scenario(build_question(q))
    opts = search.PlanOptions.quick() if mode == "quick" else search.PlanOptions()
    values: dict = {}
    walks: list = []

    def recording(families, evaluate, **kw):
        def ev(cands):
            got = evaluate(cands)
            values.update(zip(cands, got, strict=True))
            return got

        r = optimise(families, ev, **kw)
        walks.append((r, kw, evaluate.counter[0]))
        return r

    search.optimise = recording
    bounds = (search._MoeBounds.disaggregated, search._MoeBounds.colocated)
    if not bounds_on:
        search._MoeBounds.disaggregated = lambda self, pl, dl: math.inf
        search._MoeBounds.colocated = lambda self, lay: math.inf
    t0, c0 = time.perf_counter(), cpu_s()
    with SerialExecutor() as ex:
        res, advice = plan(loaded, options=opts, executor=ex)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    search._MoeBounds.disaggregated, search._MoeBounds.colocated = bounds
    walk, kw, explore_sims = walks[0]
    confirmed = {
        r.candidate: r.goodput_per_gpu_per_s
        for r in res.ranked
        if r.goodput is not None and r.goodput.confirmed
    }
    reqs = sample_requests(loaded)
    lengths = sample_lengths(loaded, reqs)
    fams, _ = search.plan_families(loaded, int(gpus), opts, lengths, reqs)
    families = {f.name: {"bound": f.bound_per_gpu, "explored": 0.0, "confirmed": 0.0} for f in fams}
    for c, name in walk.family_of.items():
        f = families[name]
        f["explored"] = max(f["explored"], values[c])
        f["confirmed"] = max(f["confirmed"], confirmed.get(c, 0.0))
    fresh, _ = search.plan_families(loaded, int(gpus), opts, lengths, reqs)
    replay = optimise(fresh, lambda cands: [values.get(c, 0.0) for c in cands], **kw)

    def best_of_kind(vals: dict) -> dict:
        out: dict = {}
        for c, v in vals.items():
            if c.kind not in out or v > vals[out[c.kind]]:
                out[c.kind] = c
        return {k: c.label for k, c in out.items()}

    print(json.dumps({
        "question": argv[:6], "bounds": bounds_on, "num_simulations": res.num_simulations,
        "explore_simulations": explore_sims, "explored": len(values), "wall_s": wall,
        "cpu_s": cpu, "verdict": advice.verdict,
        "best": res.ranked[0].candidate.label, "best_per_gpu": res.ranked[0].goodput_per_gpu_per_s,
        "families": families,
        "replay": {
            "explored": len(replay.values),
            "pruned": sorted(n for n, s in replay.states.items() if s == "pruned"),
            "not_explored": sorted(c.label for c in values if c not in replay.values),
            "best_of_kind": best_of_kind(replay.values),
            "best_of_kind_without": best_of_kind(values),
        },
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
