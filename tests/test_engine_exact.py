"""Exact timelines with the constant-cost test double, derived by hand.

Costs: prefill batch = 0.1 s (whatever its size), decode step = 0.01 s, handoff 1 ms.
Requests (arrival s, prompt, output tokens): r0 (0, 100, 3), r1 (0, 200, 5),
r2 (0.05, 300, 1), r3 (1.0, 400, 4), r4 (1.0, 10, 2).
"""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.metrics.reconstruct import request_frame, token_times
from disaggsim.workload.requests import Requests

COST = ConstantCost(prefill_base_s=0.1, decode_base_s=0.01)


def _requests() -> Requests:
    return Requests(
        arrival_s=np.array([0.0, 0.0, 0.05, 1.0, 1.0]),
        prompt_tokens=np.array([100, 200, 300, 400, 10]),
        output_tokens=np.array([3, 5, 1, 4, 2]),
    )


def test_disaggregated_timeline():
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, COST, 8, 10_000), PoolSpec("decode", 1, COST, 8, 10_000))
    )
    raw = run_cluster(_requests(), cfg, lambda nbytes, s, d: 0.001)
    log = raw.log
    # r0, r1 prefill together 0-0.1; r2 (arrived 0.05) runs alone 0.1-0.2; r3, r4 at 1.0-1.1.
    np.testing.assert_allclose(log.prefill_start_at_s, [0, 0, 0.1, 1.0, 1.0])
    np.testing.assert_allclose(log.prefill_end_at_s, [0.1, 0.1, 0.2, 1.1, 1.1])
    # first token = handoff end (KV on the decode side)
    np.testing.assert_allclose(log.first_token_at_s, [0.101, 0.101, 0.201, 1.101, 1.101])
    # r0 needs 2 decode steps (0.111, 0.121), r1 4 (… 0.141); r2 has one token only;
    # r4 one step (1.111), r3 three (1.131).
    np.testing.assert_allclose(log.finish_at_s, [0.121, 0.141, 0.201, 1.131, 1.111])
    np.testing.assert_allclose(token_times(raw, 1), [0.101, 0.111, 0.121, 0.131, 0.141])
    frame, gaps = request_frame(raw, warmup_s=0.0)
    np.testing.assert_allclose(frame["ttft_s"], [0.101, 0.101, 0.151, 0.101, 0.101])
    np.testing.assert_allclose(frame["tpot_s"].iloc[[0, 1, 3, 4]], [0.01, 0.01, 0.01, 0.01])
    # every gap is one 10 ms step: (3-1) + (5-1) + (4-1) + (2-1) = 10 gaps
    assert gaps.count == 10
    np.testing.assert_allclose(gaps.values_s[gaps.weights > 0], 0.01)


def test_colocated_vllm_prefill_stalls_decodes():
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, COST, 8, 10_000, "vllm"),))
    raw = run_cluster(_requests(), cfg)
    log = raw.log
    # r2 arrives mid-prefill; its own prefill iteration (0.1-0.2) runs before any decode
    # step, so r0 and r1 wait 0.1 s for their second token.
    np.testing.assert_allclose(log.first_token_at_s, [0.1, 0.1, 0.2, 1.1, 1.1])
    np.testing.assert_allclose(log.finish_at_s, [0.22, 0.24, 0.2, 1.13, 1.11])
    np.testing.assert_allclose(token_times(raw, 0), [0.1, 0.21, 0.22])
    frame, gaps = request_frame(raw, warmup_s=0.0)
    # r0's and r1's first gaps include the stall: 0.11 s each
    np.testing.assert_allclose(frame["max_itl_s"].iloc[[0, 1]], [0.11, 0.11])
    assert gaps.percentile(100) == pytest.approx(0.11)


def test_chunked_token_budget():
    # budget 250 tokens per iteration; a mixed iteration costs one decode step (0.01 s)
    # when any decode runs, else the prefill base (0.1 s).
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, COST, 8, 250, "chunked"),))
    raw = run_cluster(_requests(), cfg)
    log = raw.log
    # it1 [0, 0.1): r0 100 + r1 150 tokens, no decode → 0.1 s; r0 done.
    # it2 [0.1, 0.11): r0 decodes; r1 last 50 + r2 first 199 → r1 done.
    # it3 [0.11, 0.12): r0, r1 decode; r2 last 101 → r2 done (one token: finished); r0 finished.
    np.testing.assert_allclose(log.prefill_end_at_s[:3], [0.1, 0.11, 0.12])
    np.testing.assert_allclose(log.finish_at_s[:3], [0.12, 0.15, 0.12])
    np.testing.assert_allclose(token_times(raw, 1), [0.11, 0.12, 0.13, 0.14, 0.15])


def test_decode_run_is_cut_at_the_next_step_boundary_on_arrival():
    # One long decode (100 steps of 10 ms) and a second request whose KV lands at 0.2555:
    # it must join at the next step boundary, not at the end of the run.
    cost = ConstantCost(prefill_base_s=0.1, decode_base_s=0.01)
    reqs = Requests(np.array([0.0, 0.1545]), np.array([10, 10]), np.array([101, 3]))
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, cost, 8, 10_000), PoolSpec("decode", 1, cost, 8, 10_000))
    )
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    # r1: prefill 0.1545-0.2545, handoff until 0.2555, admitted at 0.261 (r0's steps end at
    # 0.111, 0.121, …, 0.251, 0.261: boundaries are 0.101 + 0.01 k).
    assert raw.log.decode_admit_at_s[1] == pytest.approx(0.261)
    np.testing.assert_allclose(token_times(raw, 1), [0.2555, 0.271, 0.281])
    np.testing.assert_allclose(raw.log.finish_at_s[0], 0.101 + 100 * 0.01)


def test_affine_decode_cost_integrated_exactly():
    # step time = 1 ms + 1 µs per context token; one request of prompt 1000, 5 tokens:
    # contexts 1001..1004 → steps 2.001, 2.002, 2.003, 2.004 ms.
    cost = ConstantCost(prefill_base_s=0.0, decode_base_s=0.001, decode_per_context_token_s=1e-6)
    reqs = Requests(np.array([0.0]), np.array([1000]), np.array([5]))
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, cost, 8, 10_000, "vllm"),))
    raw = run_cluster(reqs, cfg)
    np.testing.assert_allclose(
        np.diff(token_times(raw, 0)), [0.002001, 0.002002, 0.002003, 0.002004]
    )
    assert raw.log.finish_at_s[0] == pytest.approx(0.00801, rel=1e-12)


def test_request_too_large_for_kv_is_rejected_with_reason():
    cost = ConstantCost(kv_capacity_tokens=1000)
    reqs = Requests(np.array([0.0, 0.0]), np.array([100, 990]), np.array([10, 20]))
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, cost, 8, 10_000, "vllm"),))
    raw = run_cluster(reqs, cfg)
    frame, _ = request_frame(raw, 0.0)
    assert list(frame["status"]) == ["completed", "rejected"]
    assert frame["reason"].iloc[1] == "exceeds_kv_capacity"


def test_kv_landing_as_a_run_ends_joins_at_that_boundary():
    # Dyadic times, so every instant below is exact in floats. Prefill 0.125 s, decode
    # step 0.0625 s, handoff 0.0625 s. r0 (output 4) and r1 (output 10) prefill together
    # and land at 0.1875; their run ends when r0 finishes, 3 steps later at 0.375. r2
    # arrives at 0.1875, prefills until 0.3125 and lands at 0.375: the instant the run
    # ends, after the run's own timeout is processed and before its wait ends (one hop
    # later). r2 joins r1 at that boundary, not one step later, and the wake its landing
    # made does not cut the run it joins.
    cost = ConstantCost(prefill_base_s=0.125, decode_base_s=0.0625)
    reqs = Requests(np.array([0.0, 0.0, 0.1875]), np.array([10, 10, 10]), np.array([4, 10, 3]))
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, cost, 8, 10_000), PoolSpec("decode", 1, cost, 8, 10_000))
    )
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.0625)
    assert raw.log.decode_admit_at_s.tolist() == [0.1875, 0.1875, 0.375]
    assert raw.log.finish_at_s.tolist() == [0.375, 0.75, 0.5]
    steps = raw.workers[1].steps
    assert list(steps.run_start_at_s) == [0.1875, 0.375, 0.5]
    assert list(steps.run_steps) == [3, 2, 4]
    assert list(steps.run_batch) == [2, 2, 1]
    assert token_times(raw, 2).tolist() == [0.375, 0.4375, 0.5]
