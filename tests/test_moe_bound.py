"""The planner's bound on an MoE family's goodput (disaggsim/plan/moe_bound.py): every
iteration of the cost model takes at least its floor, the per-request arithmetic by hand,
and a simulated deployment driven past its capacity completes fewer requests per second
than the bound allows."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.moe import IterationFloor, build_cost
from disaggsim.plan.moe_bound import (
    colocated_bound_per_gpu,
    decode_batch_limit,
    disaggregated_bound_per_gpu,
    request_work,
)

LAYOUTS = [
    ("qwen3-30b-a3b", "h100-sxm", dict(tp=1, dp=4, weight_dtype="fp8-block")),
    ("qwen3-30b-a3b", "h100-sxm", dict(tp=1, weight_dtype="bf16")),
    ("qwen3-30b-a3b", "h100-sxm", dict(tp=2, ep=2, weight_dtype="bf16")),
    ("qwen3-235b-a22b", "h100-sxm", dict(tp=2, dp=4, weight_dtype="fp8-block")),
    (
        "qwen3-235b-a22b",
        "h100-sxm",
        dict(tp=1, dp=16, weight_dtype="fp8-block", moe={"two_batch_overlap": True}),
    ),
    ("deepseek-v3", "h200-sxm", dict(tp=1, dp=16, weight_dtype="fp8-block")),
    ("deepseek-v3", "h200-sxm", dict(tp=8, weight_dtype="fp8-block")),
    ("gpt-oss-120b", "h100-sxm", dict(tp=1, dp=2, weight_dtype="released")),
    ("llama-4-maverick", "h100-sxm", dict(tp=8, weight_dtype="fp8")),
]


@pytest.fixture(scope="module")
def costs():
    return [build_cost(m, g, **kw) for m, g, kw in LAYOUTS]


def test_no_iteration_is_faster_than_its_floor(costs):
    rng = random.Random(7)
    for cost in costs:
        floor = cost.iteration_floor()
        worst = 0.0
        for _ in range(400):
            b = rng.choice([0, rng.randint(1, 8), rng.randint(1, 600)])
            n = rng.choice([0, rng.randint(1, 64), rng.randint(1, 20000)])
            if b + n == 0:
                continue
            s = max(1, n // rng.randint(50, 4000)) if n else 0
            ctx = b * rng.randint(1, 20000)
            pairs = n * rng.randint(1, max(1, n)) / 2 if n else 0.0
            t = cost.mixed_time_s(b, ctx, s, n, pairs)
            f = floor.time_s(b + n, ctx, pairs)
            assert f <= t, (cost, b, ctx, s, n, pairs)
            if n == 0:
                assert f <= cost.decode_time_s(b, ctx)
            worst = max(worst, f / t)
        # a floor, not zero: the roofline terms carry most of the time
        assert worst > 0.5, (cost, worst)


def test_the_floor_by_hand():
    f = IterationFloor(
        fixed_s=1e-3, compute_s_per_token=1e-6, weight_s=2e-3, weight_s_per_token=1e-8,
        expert_s=1e-4, local_experts=10.0, copies_per_token=0.5, serial_s_per_token=2e-8,
        kv_s_per_context_token=1e-9, attn_s_per_pair=1e-10,
    )  # fmt: skip
    # 8 tokens: 4 experts touched, reads 2.40008 ms beat 8 us of FLOPs; 0.16 us element-wise
    assert f.time_s(8) == pytest.approx(1e-3 + 2e-3 + 8e-8 + 4e-4 + 1.6e-7)
    # 10,000 tokens: every expert touched (3.1 ms of reads), FLOPs 10 ms, 0.2 ms serial
    assert f.time_s(10_000, 1_000_000, 2e6) == pytest.approx(1e-3 + 1e-2 + 2e-4 + 1e-3 + 2e-4)
    assert f.token_floor_s(8) == pytest.approx((3.4e-3 + 2.4e-7) / 8)
    assert f.time_s(0) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 100_000), st.integers(1, 100_000))
def test_the_floor_per_token_never_rises_with_the_batch(a, b):
    f = IterationFloor(2e-4, 3e-7, 5e-3, 1e-9, 2e-5, 32.0, 8 / 16, 4e-9, 0.0, 0.0)
    lo, hi = sorted((a, b))
    assert f.token_floor_s(hi) <= f.token_floor_s(lo) * (1 + 1e-12)


def test_request_work_by_hand():
    w = request_work(np.array([10, 20]), np.array([3, 1]))
    # decode steps 2 and 0; contexts of the first request at least 10 and 11
    assert w.new_prompt_tokens == 15 and w.decode_tokens == 1
    assert w.prefill_pairs == (55 + 210) / 2
    assert w.decode_context_tokens == (21 + 0) / 2
    assert w.min_prompt_tokens == 10
    cached = request_work(np.array([10, 20]), np.array([3, 1]), max_hit_share=0.4)
    assert cached.new_prompt_tokens == pytest.approx(9.0) and cached.prefill_pairs == 0.0


def test_bounds_by_hand():
    w = request_work(np.array([1000, 3000]), np.array([101, 301]))
    # prefill 2000 tokens, pairs (500,500 + 4,501,500)/2 = 2,501,000; decode 200 steps,
    # contexts (100*1000 + 4950 + 300*3000 + 44850)/2 = 524,900
    assert (w.new_prompt_tokens, w.prefill_pairs, w.decode_tokens) == (2000, 2_501_000, 200)
    assert w.decode_context_tokens == 524_900
    pre = IterationFloor(1e-3, 1e-6, 4e-3, 0.0, 0.0, 0.0, 0.0, 0.0, 1e-9, 1e-10)
    dec = IterationFloor(1e-3, 1e-6, 4e-3, 0.0, 0.0, 0.0, 0.0, 0.0, 1e-8, 1e-10)
    # prefill iterations of 8192 tokens: (1 + 8.192) ms / 8192 a token
    t_p = 2000 * (1e-3 + 8.192e-3) / 8192 + 1e-10 * 2_501_000
    # decode: 100 sequences at most ((1 + 4) ms a step), 1e-8 s a context token
    t_d = 200 * 5e-3 / 100 + 1e-8 * 524_900
    got = disaggregated_bound_per_gpu(pre, 1, 8192, dec, 4, 100, w)
    assert got == pytest.approx(1 / (1 * t_p + 4 * t_d))
    # colocated, iterations of 8292 tokens: 2200 tokens a request
    t_c = 2200 * (1e-3 + 8.292e-3) / 8292 + 1e-10 * 2_501_000 + 1e-9 * 524_900
    assert colocated_bound_per_gpu(pre, 2, 8292, w) == pytest.approx(1 / (2 * t_c))
    # KV of 50,000 tokens holds 49 sequences of the shortest prompt (1000) and a token
    assert decode_batch_limit(256, 50_000, w) == 49
    assert decode_batch_limit(16, 50_000, w) == 16


def test_a_deployment_past_its_capacity_completes_fewer_requests_than_the_bound():
    """Simulated to exhaustion at twice the bound's rate, every request of fixed length
    (2000 prompt, 200 output tokens) done by the last finish: requests / last finish is
    the throughput the deployment reached, never above the family's bound x its GPUs."""
    import importlib

    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.analytic import Layout, sample_lengths, sample_requests
    from disaggsim.plan.question import Question, build_question
    from disaggsim.run import simulate

    search = importlib.import_module("disaggsim.plan.search")
    q = Question(
        model="qwen3-30b-a3b", gpu="h100-sxm", gpus=4, isl="2000", osl="200", ttft_ms=2000,
        itl_ms=50,
    )  # fmt: skip
    loaded = load_scenario(build_question(q))
    reqs = sample_requests(loaded)
    fams, _ = search.plan_families(loaded, 4, search.PlanOptions(), sample_lengths(loaded, reqs))
    by_name = {f.name: f for f in fams}
    cands = [
        (by_name["vllm tp1xdp4"], by_name["vllm tp1xdp4"].starts[0]),
        (by_name["chunked tp1xdp4"], by_name["chunked tp1xdp4"].starts[0]),
    ]
    disagg = next(f for f in fams if f.kind == "disaggregate")
    c = disagg.starts[0]
    cands.append((disagg, c))
    ratios = []
    for fam, cand in cands:
        raw = search.candidate_scenario(loaded, cand)
        gpus = cand.num_gpus
        raw["workload"]["rate_per_s"] = 2.0 * fam.bound_per_gpu * gpus
        raw["sim"] = {"duration_s": 15.0, "warmup_s": 0.0}
        req = simulate(raw).requests
        assert req.finish_at_s.notna().all()
        reached = len(req) / req.finish_at_s.max() / gpus
        assert reached <= fam.bound_per_gpu, (cand.label, reached, fam.bound_per_gpu)
        ratios.append(reached / fam.bound_per_gpu)
    assert Layout(1, 4) == cands[0][1].prefill_layout
    print("reached / bound", [round(r, 3) for r in ratios])
    assert max(ratios) > 0.3, ratios  # a bound, but not an idle one


def test_a_value_above_a_true_bound_prunes_no_more_than_the_bound():
    """A family whose bound is a true one (MoE) and whose member is measured above it (a
    short exploration run ending before its queues grow) prunes the others as if it had
    reached its bound, no more."""
    from disaggsim.plan.optimise import Family, optimise

    values = {"f1": 20.0, "f2": 8.0, "f2+": 8.5, "f3": 6.0}

    def fams(true_bound: bool) -> list[Family[str]]:
        return [
            Family("F1", "x", 10.0, ("f1",), lambda c: [], true_bound=true_bound),
            Family("F2", "y", 9.0, ("f2",), lambda c: [["f2+"]] if c == "f2" else []),
            Family("F3", "y", 7.0, ("f3",), lambda c: []),
        ]

    def evaluate(cands: list[str]) -> list[float]:
        return [values[c] for c in cands]

    # counted at its bound 10: F2 (9 x 1.25 = 11.25) climbs on, F3 (8.75) is pruned
    capped = optimise(fams(True), evaluate, bound_slack=1.25)
    assert capped.states == {"F1": "settled", "F2": "settled", "F3": "pruned"}
    assert "f2+" in capped.values and "f3" not in capped.values
    # an analytic (dense) bound is optimistic: the measured 20 counts at its bound x the
    # slack (12.5), which prunes the others but not its own family
    plain = optimise(fams(False), evaluate, bound_slack=1.25)
    assert plain.states == {"F1": "settled", "F2": "pruned", "F3": "pruned"}
    assert "f2+" not in plain.values
