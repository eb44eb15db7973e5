"""The planner's search finds the best deployment: against an exhaustive search of every
deployment a user could write by hand in the same budget, on oracle landscapes
(hypothesis) and on a small budget simulated end to end."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.metrics.steady import RunLengthRule
from disaggsim.plan.optimise import Family, optimise
from disaggsim.plan.search import (
    Candidate,
    PlanOptions,
    all_candidates,
    chunk_neighbours,
    chunk_starts,
    disagg_neighbours,
)

TPS = (1, 2, 4)
CHUNKS = (256, 512, 1024, 2048)


@dataclasses.dataclass(frozen=True)
class Landscape:
    """Goodput of a deployment in a two-resource model: a disaggregated one serves
    ``min(prefill capacity, decode capacity)``, each pool's capacity growing with its
    worker count as ``n ** pooling`` (statistical multiplexing: >= 1); a colocated pool
    ``per_worker x n ** pooling``. Per-worker capacities depend on TP (and chunk)."""

    prefill: dict  # tp -> req/s of one worker
    decode: dict
    chunked: dict  # (tp, chunk) -> req/s of one worker
    vllm: dict
    pooling: float

    def goodput(self, c: Candidate) -> float:
        if c.kind == "disaggregate":
            p = self.prefill[c.prefill_tp] * c.num_prefill_workers**self.pooling
            d = self.decode[c.decode_tp] * c.num_decode_workers**self.pooling
            return min(p, d)
        per = (
            self.chunked[(c.prefill_tp, c.chunk_tokens)]
            if c.kind == "colocate_chunked"
            else self.vllm[c.prefill_tp]
        )
        return per * c.num_prefill_workers**self.pooling

    def per_gpu(self, c: Candidate) -> float:
        return self.goodput(c) / c.num_gpus


capacity = st.floats(0.2, 10.0)


@st.composite
def landscapes(draw) -> Landscape:
    return Landscape(
        prefill={tp: draw(capacity) for tp in TPS},
        decode={tp: draw(capacity) for tp in TPS},
        chunked={(tp, ch): draw(capacity) for tp in TPS for ch in CHUNKS},
        vllm={tp: draw(capacity) for tp in TPS},
        pooling=draw(st.floats(1.0, 1.08)),
    )


FULL = dataclasses.replace(PlanOptions(), chunk_ladder=CHUNKS)


def _families(
    land: Landscape,
    budget: int,
    slack_draw: float,
    start_error: float,
    options: PlanOptions = FULL,
):
    """The planner's families on this landscape: the same neighbourhoods, starts from
    the capacity ratio perturbed by ``start_error`` (the analytic guess is not exact),
    and bounds that hold (the family's best per GPU, raised by ``slack_draw``)."""
    fams = []
    space = all_candidates(budget, list(TPS), CHUNKS)
    for tp_p in TPS:
        for tp_d in TPS:
            if tp_p + tp_d > budget:
                continue
            members = [
                c
                for c in space
                if c.kind == "disaggregate" and (c.prefill_tp, c.decode_tp) == (tp_p, tp_d)
            ]
            # analytic share: decode per-worker capacity over the sum, perturbed
            share = (
                land.decode[tp_d] * tp_p / (land.decode[tp_d] * tp_p + land.prefill[tp_p] * tp_d)
            )
            share = min(max(share * (1 + start_error), 0.01), 0.99)
            n_p = max(1, min(round(share * budget / tp_p), (budget - tp_d) // tp_p))
            start = Candidate("disaggregate", n_p, tp_p, (budget - n_p * tp_p) // tp_d, tp_d)
            fams.append(
                Family(
                    name=f"d{tp_p}/{tp_d}",
                    kind="disaggregate",
                    bound_per_gpu=max(land.per_gpu(c) for c in members) * slack_draw,
                    starts=(start,),
                    neighbours=lambda c: disagg_neighbours(c, budget),
                )
            )
        n = budget // tp_p
        if n < 1:
            continue
        ch = [Candidate("colocate_chunked", n, tp_p, chunk_tokens=x) for x in CHUNKS]
        starts = chunk_starts(512, options)
        fams.append(
            Family(
                name=f"c{tp_p}",
                kind="colocate_chunked",
                bound_per_gpu=max(land.per_gpu(c) for c in ch) * slack_draw,
                starts=tuple(c for c in ch if c.chunk_tokens in starts),
                neighbours=lambda c: chunk_neighbours(c, CHUNKS),
            )
        )
        v = Candidate("colocate_vllm", n, tp_p)
        fams.append(
            Family(
                name=f"v{tp_p}",
                kind="colocate_vllm",
                bound_per_gpu=land.per_gpu(v) * slack_draw,
                starts=(v,),
                neighbours=lambda c: [],
            )
        )
    return fams, space


@settings(max_examples=150, deadline=None)
@given(
    land=landscapes(),
    budget=st.integers(2, 24),
    slack=st.floats(1.0, 1.5),
    start_error=st.floats(-0.6, 0.6),
    min_gain=st.sampled_from([0.0, 0.03]),
)
def test_search_matches_exhaustive_on_oracle_landscapes(land, budget, slack, start_error, min_gain):
    fams, space = _families(land, budget, slack, start_error)
    calls = []

    def evaluate(cands):
        calls.append(len(cands))
        return [land.per_gpu(c) for c in cands]

    res = optimise(fams, evaluate, bound_slack=1.0, min_gain=min_gain)
    exhaustive = max(land.per_gpu(c) for c in space)
    assert res.converged
    # exact without a noise threshold; with one, to within it (3000 examples at 3 %
    # came out exact)
    assert max(res.values.values()) >= exhaustive * (1 - 1e-12) / (1 + min_gain)
    # and it searched less than everything once the space is not tiny
    if len(space) > 200:
        assert sum(calls) < len(space) / 2


def test_search_prunes_families_their_bound_rules_out():
    land = Landscape(
        prefill={1: 4.0, 2: 1.0, 4: 1.0},
        decode={1: 4.0, 2: 1.0, 4: 1.0},
        chunked={(tp, ch): (1.0 if tp == 1 else 0.1) for tp in TPS for ch in CHUNKS},
        vllm={tp: 0.5 for tp in TPS},
        pooling=1.0,
    )
    fams, _ = _families(land, 8, 1.0, 0.0)
    res = optimise(fams, lambda cs: [land.per_gpu(c) for c in cs])
    assert res.states["d2/2"] == "pruned" and res.states["v4"] == "pruned"
    assert res.states["d1/1"] == "settled"
    best = res.best
    assert best is not None and best.kind == "disaggregate"
    assert (best.num_prefill_workers, best.num_decode_workers) == (4, 4)


def test_quick_floor_and_wave_limit_report_not_converged():
    land = Landscape(
        prefill={tp: 1.0 for tp in TPS},
        decode={tp: 1.0 for tp in TPS},
        chunked={(tp, ch): 0.1 for tp in TPS for ch in CHUNKS},
        vllm={tp: 0.1 for tp in TPS},
        pooling=1.0,
    )
    fams, _ = _families(land, 16, 1.0, 0.6)  # a start far off the balanced split
    res = optimise(fams, lambda cs: [land.per_gpu(c) for c in cs], max_waves=2)
    assert not res.converged and "open" in res.states.values()


# ------------------------------------------------------------------ end to end


def test_chunk_and_disagg_neighbours_by_hand():
    c = Candidate("disaggregate", 3, 1, 2, 2)  # 7 of 8 GPUs
    tiers = [
        [(x.num_prefill_workers, x.num_decode_workers) for x in t] for t in disagg_neighbours(c, 8)
    ]
    # along the budget (5P + 1D would leave no decode worker); one pool +-1; ratio and both
    assert tiers == [[(2, 3), (4, 2)], [(2, 2), (3, 1)], [(2, 1), (1, 1), (4, 1)]]
    ch = Candidate("colocate_chunked", 4, 1, chunk_tokens=300)
    assert [x.chunk_tokens for x in chunk_neighbours(ch, CHUNKS)[0]] == [256, 512]


def test_planner_matches_exhaustive_simulation_on_a_small_budget():
    """Every deployment of 3 H100s (TP 1 and 2) for a small 8B workload, each one's
    steady-state goodput simulated; the planner's recommendation must be at least as
    good per GPU as the best of them (to twice the bisection tolerance: a deployment the
    planner did not evaluate is searched from a different bracket)."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan import search
    from disaggsim.plan.analytic import sample_lengths
    from disaggsim.plan.search import _Evaluator, plan_families, tp_options
    from disaggsim.sweep import SerialExecutor

    scenario = {
        "name": "small", "seed": 5, "model": "llama-3-8b", "architecture": "colocated",
        "pool": {"gpu": "h100-sxm", "num_workers": 3, "tp": 1, "scheduler": "chunked",
                 "max_batch_tokens": 512},
        "fabric": {"link": "nvlink"},
        "slo": {"ttft_ms": 1500, "itl_ms": 40, "itl_statistic": "max_gap",
                "attainment_target": 0.9},
        "workload": {"kind": "synthetic", "rate_per_s": 5.0,
                     "prompt_tokens": {"dist": "uniform", "low": 3000, "high": 6000},
                     "output_tokens": {"dist": "uniform", "low": 20, "high": 60}},
        "sim": {"duration_s": 60, "warmup_s": 10},
    }  # fmt: skip
    loaded = load_scenario(scenario)
    rule = RunLengthRule(min_measured_requests=100, service_multiple=1.0)
    opts = dataclasses.replace(
        PlanOptions(),
        rule=rule,
        explore_rule=rule,
        tol_fraction=0.04,
        explore_tol_fraction=0.04,
        chunk_ladder=(256, 1024),
        max_tp=2,
    )
    with SerialExecutor() as ex:
        res = search(loaded, options=opts, executor=ex)
        lengths = sample_lengths(loaded)
        tps = tp_options(loaded, 3, lengths, opts.max_tp)
        assert tps == [1, 2]
        done = {r.candidate for r in res.ranked if r.status != "explored"}
        space = all_candidates(3, tps, chunk_starts(512, opts))
        rest = [c for c in space if c not in done]
        _, guesses = plan_families(loaded, 3, opts, lengths)
        values = _Evaluator(loaded, guesses, opts, ex, None)(rest)
    # every deployment's goodput by the same search the planner confirms with
    by_hand = max(
        [*values, *(r.goodput_per_gpu_per_s for r in res.ranked if r.status != "explored")]
    )
    best = res.ranked[0]
    assert by_hand > 0 and res.converged
    assert best.goodput_per_gpu_per_s >= by_hand * (1 - 2 * opts.tol_fraction)
    assert len(rest) > 0 and len(done) < len(space)


def test_finalists_confirm_the_best_of_each_kind_even_after_a_confirmation_lowers_it():
    """The advisor compares the best confirmed candidate of each kind: when confirming
    the explored leader of a kind lowers it below another explored candidate of that
    kind, that one is confirmed next (long-prompt-infiniband: chunked 16 x tp1 c512
    explored first, confirmed at 1.471, below chunked 8 x tp2 c1024's explored 1.550)."""
    from disaggsim.plan.search import finalists
    from disaggsim.sweep.goodput import GoodputResult

    def res(per_gpu: float) -> GoodputResult:
        return GoodputResult("s", 1, per_gpu, per_gpu, "found", 0.9, 0.01, ())

    a = Candidate("colocate_chunked", 16, 1, chunk_tokens=512)
    b = Candidate("colocate_chunked", 8, 2, chunk_tokens=1024)
    d = Candidate("disaggregate", 9, 1, 1, 4)
    v = Candidate("colocate_vllm", 16, 1)
    explored = {a: res(1.60), b: res(1.55), d: res(2.10), v: res(0.39)}
    first = finalists(explored, {}, 0.05)
    assert set(first) == {a, d, v}  # the leader of each kind (nothing near the top)
    confirmed = {a: res(1.47), d: res(2.09), v: res(0.39)}
    assert finalists(explored, confirmed, 0.05) == [b]  # b's 1.55 now beats a's 1.47
    assert finalists(explored, {**confirmed, b: res(1.50)}, 0.05) == []


@pytest.mark.xfail(
    strict=True,
    reason="known planner miss (found by the property test above): the disaggregated "
    "neighbourhood cannot hop from a full-budget local optimum to a smaller deployment "
    "whose P:D counts balance better (here 9P+2D on 11 GPUs beats every 20-GPU split)",
)
def test_search_finds_a_smaller_better_balanced_split():
    """prefill 1.75 req/s a worker, decode 8.0 (ratio 4.57), budget 20 GPUs, TP1 only
    useful: 16P+4D = min(28, 32)/20 = 1.400 per GPU is a local optimum of the moves, but
    9P+2D = min(15.75, 16)/11 = 1.432 (and 13P+3D = 22.75/16 = 1.422) is better."""
    other = 0.2
    land = Landscape(
        prefill={1: 1.75, 2: other, 4: other},
        decode={1: 8.0, 2: other, 4: other},
        chunked={(tp, ch): other for tp in TPS for ch in CHUNKS},
        vllm={tp: other for tp in TPS},
        pooling=1.0,
    )
    fams, _ = _families(land, 20, 1.0, 0.0)
    res = optimise(fams, lambda cs: [land.per_gpu(c) for c in cs], bound_slack=1.0)
    assert max(res.values.values()) >= 15.75 / 11 * (1 - 1e-12)
