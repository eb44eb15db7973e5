"""With attention data parallelism (dp > 1) every sequence lives whole on one DP rank, so
the busiest rank's decode context is at least the batch's longest sequence
(``MoeWorkerCost._rank_context``). Until 2026-12-04 it was the mean sequence on each of the
rank's ``ceil(b / dp)`` slots, ``C × ceil(b / dp) / b``: one 10,000-token sequence on 2
ranks read 10,000 tokens a step, and with a 100-token sequence beside it 5,050, so the
step got faster as a sequence joined. These check that a step never gets faster as a
sequence joins or a context grows (decode steps on the engine's lines, chunked steps on
the layer model), and that a long sequence decoding among short ones on a DP worker takes
at least its own step alone, in a simulation."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.moe import MoeWorkerCost, build_moe_worker_cost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.metrics.reconstruct import token_times
from disaggsim.workload.requests import Requests

WORKERS = {
    # GQA, 4 KV heads on one GPU, FlashAttention's split-KV lines (decode_min_coeffs)
    "qwen3-235b-dp8": {"model": "qwen3-235b-a22b", "gpu": "h100-sxm", "tp": 1, "dp": 8},
    # MLA, the absorbed decode kernel, 2 ranks of TP 8
    "deepseek-v3-dp2": {
        "model": "deepseek-v3",
        "gpu": "h200-sxm",
        "tp": 8,
        "dp": 2,
        "weight_dtype": "fp8-block",
    },
    # an eager engine: the launches' constant line (decode_item_coeffs)
    "qwen3-30b-dp2-eager": {
        "model": "qwen3-30b-a3b",
        "gpu": "h100-sxm",
        "tp": 1,
        "dp": 2,
        "engine": "vllm-eager-2023",
    },
    # 3 ranks (9 expert slots: one redundant): ceil(b / 3) is seldom b / 3
    "mixtral-dp3": {
        "model": "mixtral-8x7b",
        "gpu": "h100-sxm",
        "tp": 1,
        "dp": 3,
        "redundant_experts": 1,
    },
}


@cache
def _worker(name: str) -> MoeWorkerCost:
    return build_moe_worker_cost(**WORKERS[name])


def _decode_s(w: MoeWorkerCost, ctxs: list[int]) -> float:
    """A decode step on the engine's lines (each context counts the token the step adds;
    the longest's cached tokens are one less)."""
    return w.decode_time_s(len(ctxs), sum(ctxs), max(ctxs) - 1)


def _mixed_s(w: MoeWorkerCost, ctxs: list[int], chunk: int) -> float:
    """A chunked step: the decodes beside one 512-token chunk after ``chunk`` cached."""
    pairs = 512 * chunk + 512 * 513 / 2
    return w.mixed_time_s(len(ctxs), sum(ctxs), 1, 512, pairs, chunk, max(ctxs) - 1)


contexts = st.lists(st.integers(1, 200_000), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(WORKERS)),
    ctxs=contexts,
    joiner=st.integers(1, 200_000),
    grow=st.integers(1, 50_000),
    which=st.integers(0, 39),
    chunk=st.integers(0, 30_000),
)
def test_a_step_never_gets_faster_as_a_sequence_joins_or_grows(
    name: str, ctxs: list[int], joiner: int, grow: int, which: int, chunk: int
) -> None:
    w = _worker(name)
    joined = [*ctxs, joiner]
    grown = list(ctxs)
    grown[which % len(ctxs)] += grow
    for step in (_decode_s, lambda w, c: _mixed_s(w, c, chunk)):
        t = step(w, ctxs)
        assert step(w, joined) >= t * (1.0 - 1e-12), (ctxs, joiner)
        assert step(w, grown) >= t * (1.0 - 1e-12), (ctxs, which, grow)


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_a_short_sequence_beside_a_long_one_never_speeds_it_up(name: str) -> None:
    """The brief's case: 10,000 tokens alone, then a 100-token sequence joins (the old rule
    read 5,050 tokens on 2 ranks), and then up to 63 more."""
    w = _worker(name)
    alone = _decode_s(w, [10_000])
    last = alone
    for n in range(1, 64):
        t = _decode_s(w, [10_000] + [100] * n)
        assert t >= last * (1.0 - 1e-12)
        last = t
    assert _mixed_s(w, [10_000, 100], 2_000) >= _mixed_s(w, [10_000], 2_000)


def test_the_busiest_rank_context_rule() -> None:
    """max(C / dp, L + (C - L)(r - 1) / (dp r)), r = ceil(b / dp)."""
    w = _worker("qwen3-235b-dp8")  # dp 8
    assert w._rank_context(1, 10_000.0, 10_000.0) == 10_000.0
    # one long among 7 short: each on its own rank, the long one's rank is the busiest
    assert w._rank_context(8, 10_700.0, 10_000.0) == 10_000.0
    # 63 short beside it: 8 a rank, the long one's holds 7 others at (C - L) / 64 each
    assert w._rank_context(64, 16_300.0, 10_000.0) == pytest.approx(10_000 + 6_300 * 7 / 64)
    # equal lengths where dp divides b: the old rule's C × ceil(b / dp) / b = C / dp
    assert w._rank_context(64, 64_000.0, None) == pytest.approx(8_000.0)
    assert w._rank_context(64, 64_000.0, 1_000.0) == pytest.approx(8_000.0)
    # dp = 1: the whole context, as before
    one = build_moe_worker_cost("qwen3-30b-a3b", "h100-sxm", 1)
    assert one._rank_context(3, 999.0, 900.0) == 999.0
    assert not hasattr(one, "decode_longest_context_coeffs")


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_decode_lines_match_the_layer_model(name: str) -> None:
    """The engine's lines at max(C, u C + v L) give the layer model's decode step with the
    longest sequence (mixed_time_s with no prefill part), long among short and equal."""
    w = _worker(name)
    for ctxs in ([10_000], [10_000, 100], [50_000] + [300] * 20, [2_000] * 16, [7, 9, 4000]):
        want = w.mixed_time_s(len(ctxs), sum(ctxs), 0, 0, 0.0, 0, max(ctxs) - 1)
        assert _decode_s(w, ctxs) == pytest.approx(want, rel=1e-9)


class _Roomy:
    """``cost``'s step times with room for every request's KV."""

    def __init__(self, cost) -> None:
        self._cost = cost
        self.kv_capacity_tokens = 10**9

    def __getattr__(self, name: str):
        return getattr(self._cost, name)


def _decode_gaps(cost, prompt: list[int], out: list[int]) -> np.ndarray:
    """Inter-token times of request 0 on one decode worker, every request's KV there at
    once (one prefill batch)."""
    reqs = Requests(
        arrival_s=np.zeros(len(prompt)),
        prompt_tokens=np.array(prompt),
        output_tokens=np.array(out),
    )
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, cost, 64, 10**6),
            PoolSpec("decode", 1, cost, 64, 10**6),
        )
    )
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    return np.diff(token_times(raw, 0)[1:])


@pytest.mark.parametrize("name", ["qwen3-235b-dp8", "deepseek-v3-dp2"])
def test_a_long_sequence_among_short_ones_takes_at_least_its_own_step(name: str) -> None:
    """One 120,000-token sequence decodes 30 tokens alone, then beside 3 sequences of 200
    tokens (20 tokens each): every one of its steps takes at least its step alone. The old
    rule spread its context over the ranks (Qwen3-235B on 8 ranks: one sequence a rank at
    the mean, 30,150 tokens a step instead of 120,000; 21.98 ms a step against 24.25 ms
    alone; DeepSeek-V3 on 2 ranks 15.52 against 15.69)."""
    cost = _Roomy(_worker(name))
    alone = _decode_gaps(cost, [120_000], [30])
    among = _decode_gaps(cost, [120_000] + [200] * 3, [30] + [20] * 3)
    assert len(alone) == len(among) == 28
    assert (among >= alone * (1.0 - 1e-12)).all(), (among, alone)
