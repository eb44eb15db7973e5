"""The engine passes the batch's longest sequence to a decode kernel that sizes its shared
memory by it (TensorRT-LLM's masked MHA: ``WorkerCost.decode_longest_coeffs``), in decode
runs and in chunked iterations. Checked against step-by-step sums computed here (never
the engine's run arithmetic), a hand-derived chunked timeline, and the real cost model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from disaggsim.costmodel.interface import decode_step_time_s
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import Cluster, EngineConfig, PoolSpec, run_cluster
from disaggsim.metrics.reconstruct import token_times
from disaggsim.workload.requests import Requests
from tests.test_moe_dp_longest import WORKERS


@dataclass(frozen=True, slots=True)
class LongestCost(ConstantCost):
    """ConstantCost whose decode stream line steepens when the batch's longest sequence
    holds 150 and then 400 cached tokens (and, for equal lengths, at the matching
    contexts)."""

    decode_interval_lines: bool = True

    def decode_coeffs(self, batch):
        return 0.005 + 0.001 * batch, 1e-5

    def decode_longest_coeffs(self, batch):
        base = 0.005 + 0.001 * batch
        return ((150.0, (base, 3e-5)), (400.0, (base, 8e-5)))

    def decode_interval_coeffs(self, batch):
        return tuple((batch * h + 1.0, line) for h, line in self.decode_longest_coeffs(batch))

    def decode_item_coeffs(self, batch):
        return 0.006 + 0.001 * batch, 0.0


def _reference(kv_at, prompt, out, cost) -> dict[int, list[float]]:
    """Token times of one decode worker, one step at a time: a sequence joins at the first
    step boundary at or after its KV arrives; each step takes decode_step_time_s at the
    batch's context with the longest sequence's history (its context less the one token
    the step adds)."""
    times = {r: [kv_at[r]] for r in range(len(kv_at))}
    pending = sorted(range(len(kv_at)), key=lambda r: kv_at[r])
    running: list[int] = []
    t = kv_at[pending[0]]
    while pending or running:
        while pending and kv_at[pending[0]] <= t:
            running.append(pending.pop(0))
        if not running:
            t = kv_at[pending[0]]
            continue
        ctxs = [prompt[r] + len(times[r]) for r in running]
        t += decode_step_time_s(cost, len(running), sum(ctxs), max(ctxs) - 1)
        for r in running:
            times[r].append(t)
        running = [r for r in running if len(times[r]) < out[r]]
    return times


def _disaggregated(cost, reqs: Requests, seqs: int = 8):
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, cost, seqs, 10**6),
            PoolSpec("decode", 1, cost, seqs, 10**6),
        )
    )
    return run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)


def test_token_times_follow_the_longest_sequence_step_by_step() -> None:
    """Short and long sequences joining and leaving mid-run: the long ones set the line
    (r1 holds 300 cached tokens among sequences of a few dozen: the second regime while
    the mean is in the first), and the runs are cut where the longest history crosses
    150 and 400, including after the longest one leaves (the line falls back)."""
    cost = LongestCost(prefill_base_s=0.1)
    reqs = Requests(
        arrival_s=np.array([0.0, 0.6, 0.6, 2.0, 2.5]),
        prompt_tokens=np.array([10, 300, 5, 20, 390]),
        output_tokens=np.array([250, 60, 200, 40, 30]),
    )
    raw = _disaggregated(cost, reqs)
    kv_at = raw.log.first_token_at_s.tolist()
    ref = _reference(kv_at, reqs.prompt_tokens.tolist(), reqs.output_tokens.tolist(), cost)
    for rid in range(len(reqs)):
        np.testing.assert_allclose(token_times(raw, rid), ref[rid], rtol=0, atol=1e-9)
    # steps ran on the second and third stream lines (set by r1 and r4, the mean below
    # them) and on the item line (per token 0) of short sequences alone
    steps = [w for w in raw.workers if w.role == "decode"][0].steps
    assert {0.0, 3e-5, 8e-5} <= set(np.asarray(steps.run_per_token_s).tolist())


def test_the_mean_would_say_less() -> None:
    """The same run costed by the mean (the reference without the longest) ends earlier:
    the check above can tell the two forms apart."""
    cost = LongestCost(prefill_base_s=0.1)
    reqs = Requests(
        arrival_s=np.array([0.0, 0.0]),
        prompt_tokens=np.array([10, 250]),
        output_tokens=np.array([100, 100]),
    )
    raw = _disaggregated(cost, reqs)
    kv_at = raw.log.first_token_at_s.tolist()
    t = kv_at[0]
    ctxs = [11, 251]  # the mean history 130 (first line), the longest 250 (second)
    mean_end = longest_end = t
    for _ in range(99):
        mean_end += decode_step_time_s(cost, 2, sum(ctxs))
        longest_end += decode_step_time_s(cost, 2, sum(ctxs), max(ctxs) - 1)
        ctxs = [c + 1 for c in ctxs]
    assert raw.log.finish_at_s[1] == pytest.approx(longest_end, abs=1e-9)
    assert longest_end > mean_end + 0.05


def test_chunked_iteration_takes_the_longest_sequence() -> None:
    """Colocated chunked, by hand: r0 (500-token prompt) and r1 (10) prefill together in
    [0, 0.1) (no decode: the prefill base); r2 (20 tokens) arrives at 0.05 and its chunk
    runs at 0.1 beside the two decodes (C = 501 + 11 = 512): the decode part on the
    longest sequence's line (500 cached tokens: the third, 8e-5 s a token), not the
    mean's (255: the second)."""
    cost = LongestCost(prefill_base_s=0.1)
    reqs = Requests(
        arrival_s=np.array([0.0, 0.0, 0.05]),
        prompt_tokens=np.array([500, 10, 20]),
        output_tokens=np.array([5, 5, 1]),
    )
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, cost, 8, 10_000, "chunked"),))
    raw = run_cluster(reqs, cfg)
    base = 0.005 + 0.001 * 2
    step = base + 8e-5 * 512  # 0.04796 s; the mean's would be base + 3e-5 × 512
    assert raw.log.prefill_end_at_s[2] == pytest.approx(0.1 + step, abs=1e-12)


def test_real_masked_mha_mixed_batch() -> None:
    """Llama-2-7B on TensorRT-LLM, H100 (masked MHA; 32 × 32 heads over 4 × 132 items): 31
    sequences of 1,000 prompt tokens and one of 20,000 join together. The one long
    sequence holds 20,000 cached tokens at the first step, where one block resides per SM
    (the mean, 1,594, leaves four): every token time is the step-by-step sum with the
    longest, and the first step costs more than the mean would say."""
    w = build_worker_cost("llama-2-7b", "h100-sxm", 1, engine="trtllm")
    assert w.decode_backend == "trtllm-mmha" and w.decode_interval_lines

    class Roomy:  # room for every request's KV; the step times are w's
        def __init__(self, cost) -> None:
            self._cost = cost
            self.kv_capacity_tokens = 10**8

        def __getattr__(self, name: str):
            return getattr(self._cost, name)

    cost = Roomy(w)
    n = 32
    prompt = np.full(n, 1000)
    prompt[5] = 20000
    reqs = Requests(arrival_s=np.zeros(n), prompt_tokens=prompt, output_tokens=np.full(n, 40))
    raw = _disaggregated(cost, reqs, seqs=n)
    kv_at = raw.log.first_token_at_s.tolist()
    assert len(set(kv_at)) == 1  # one prefill batch, every KV at once
    ref = _reference(kv_at, prompt.tolist(), reqs.output_tokens.tolist(), cost)
    for rid in range(n):
        np.testing.assert_allclose(token_times(raw, rid), ref[rid], rtol=1e-12, atol=1e-9)
    first = token_times(raw, 0)[1] - kv_at[0]
    ctx = 31 * 1001 + 20001
    assert first == pytest.approx(decode_step_time_s(w, n, ctx, 20000), rel=1e-9)
    assert first > 1.05 * decode_step_time_s(w, n, ctx)


def test_heap_stays_within_twice_the_batch() -> None:
    """One long sequence decodes throughout while 1,500 short ones come and go beneath it:
    their entries never reach the heap's top (the long one holds it), so only the rebuild
    from the running batch drops them; the heap never holds more than 2 × batch + 64."""
    cost = LongestCost(prefill_base_s=0.001)
    rng = np.random.default_rng(7)
    n = 1500
    reqs = Requests(
        arrival_s=np.concatenate([[0.0], np.sort(rng.uniform(0.1, 60, n))]),
        prompt_tokens=np.concatenate([[2000], rng.integers(1, 600, n)]),
        output_tokens=np.concatenate([[2000], rng.integers(2, 6, n)]),
    )
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, cost, 64, 10**6), PoolSpec("decode", 1, cost, 16, 10**6))
    )
    cluster = Cluster(reqs, cfg, lambda nbytes, s, d: 0.0)
    raw = cluster.run()
    assert raw.log.finish_at_s[0] > raw.log.finish_at_s[1:].max()  # it outlived them all
    dec = cluster.decode_workers[0]
    assert dec._longest is not None and len(dec._longest) <= 2 * dec.max_batch_seqs + 64


class _Roomy:
    """``cost``'s step times with room for every request's KV."""

    def __init__(self, cost) -> None:
        self._cost = cost
        self.kv_capacity_tokens = 10**9

    def __getattr__(self, name: str):
        return getattr(self._cost, name)


# the MoE DP workers of tests/test_moe_dp_longest.py with one line each, the split-KV lines
# (qwen3-235b, 8 ranks), MLA's one line (deepseek-v3) and an eager engine's launch line
MOE_DP = {k: WORKERS[k] for k in ("qwen3-235b-dp8", "deepseek-v3-dp2", "qwen3-30b-dp2-eager")}


@pytest.mark.parametrize("name", sorted(MOE_DP))
def test_moe_data_parallel_runs_follow_the_longest_sequence_step_by_step(name: str) -> None:
    """An MoE worker with attention DP takes its decode lines at max(C, u C + v L)
    (``decode_longest_context_coeffs``: the busiest rank holds the longest sequence
    whole). Long and short sequences join and leave mid-run; on 2 ranks 4 sequences of
    1,000 and 3 × 663 tokens start with the longest term 5 tokens above C and C catching up
    10 steps later (u = 0.5, v = 1.5): the closed-form runs, cut there, give every token
    time of the step-by-step sum."""
    from disaggsim.costmodel.moe import build_moe_worker_cost

    w = build_moe_worker_cost(**MOE_DP[name])
    u, v = w.decode_longest_context_coeffs(4)
    if w.dp == 2:
        assert (u, v) == pytest.approx((0.5, 1.5))
    cost = _Roomy(w)
    reqs = Requests(
        arrival_s=np.array([0.0, 0.0, 0.0, 0.0, 0.3, 0.5, 0.9, 1.2]),
        prompt_tokens=np.array([999, 662, 662, 662, 30_000, 40, 5, 12_000]),
        output_tokens=np.array([60, 40, 45, 50, 30, 80, 70, 25]),
    )
    raw = _disaggregated(cost, reqs, seqs=16)
    kv_at = raw.log.first_token_at_s.tolist()
    ref = _reference(kv_at, reqs.prompt_tokens.tolist(), reqs.output_tokens.tolist(), cost)
    for rid in range(len(reqs)):
        np.testing.assert_allclose(token_times(raw, rid), ref[rid], rtol=1e-12, atol=1e-9)
    # the mean would say less where the kernels outlast the launches: the rule is at work
    ctxs = [200_000, 663, 663, 663]
    assert decode_step_time_s(w, 4, sum(ctxs), 199_999) > decode_step_time_s(w, 4, sum(ctxs))
