"""With attention data parallelism (dp > 1) a prompt is prefilled whole on one DP rank, so
the busiest rank's prefill is at least the batch's longest prompt
(``MoeWorkerCost._rank_prompts``). Until 2026-12-04 it was the mean share of the prompts'
tokens and pairs (``ceil(s / dp) / s`` of them): one 30,000-token prompt on Qwen3-235B
tp4 x dp2 prefilled in 1,599 ms alone and in 1,074 ms once a 100-token prompt joined it.
The cost model sees a batch's totals only; the longest prompt is read from them as the
token-weighted mean prompt, ``Σ n² / Σ n`` (uncached prompts)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.moe import _weighted_prompt, build_moe_worker_cost
from tests.test_moe_dp_longest import WORKERS, _worker

QWEN_TP4_DP2 = {"model": "qwen3-235b-a22b", "gpu": "h100-sxm", "tp": 4, "dp": 2}


def _prefill_s(w, prompts: list[int]) -> float:
    n = sum(prompts)
    return w.prefill_time_s(len(prompts), n, sum(p * (p + 1) / 2 for p in prompts))


def test_the_token_weighted_prompt_never_exceeds_the_longest():
    assert _weighted_prompt(3000, 3 * 1000 * 1001 / 2, 0) == pytest.approx(1000)  # one length
    one_long = _weighted_prompt(30_100, 30_000 * 30_001 / 2 + 100 * 101 / 2, 0)
    assert 29_900 < one_long <= 30_000
    assert _weighted_prompt(512, 512 * 20_000 + 512 * 513 / 2, 20_000) is None  # cached
    assert _weighted_prompt(0, 0.0, 0) is None


def test_a_short_prompt_beside_a_long_one_does_not_speed_its_prefill():
    w = build_moe_worker_cost(**QWEN_TP4_DP2)
    alone = _prefill_s(w, [30_000])
    assert alone == pytest.approx(1.599, rel=0.01)  # the figure quoted above
    # was 1.074 s (the mean share); the estimate of the longest prompt is at most the
    # short prompt's 100 tokens under it (docstring of the property test below)
    assert _prefill_s(w, [30_000, 100]) >= _prefill_s(w, [29_900])
    # the long prompt's rank also runs its share of the others: 4 short prompts on 2 ranks
    assert _prefill_s(w, [30_000, 100, 100, 100, 100]) >= _prefill_s(w, [29_600])
    # prompts of one length keep the mean share (exact for them): 3 and 4 on 2 ranks
    for k in (3, 4):
        mean_share = sum(w._parts(0, 0.0, k, k * 8_000, k * 8_000 * 8_001 / 2))
        assert _prefill_s(w, [8_000] * k) == pytest.approx(mean_share, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(WORKERS)),
    long=st.integers(2_000, 60_000),
    shorts=st.lists(st.integers(1, 400), min_size=1, max_size=12),
)
def test_a_batch_with_a_long_prompt_takes_at_least_that_prompt_alone(name, long, shorts):
    """On every DP worker of the decode tests: a batch holding a prompt of ``long`` tokens
    beside short ones of ``S`` tokens in all takes at least a prompt of ``long - S``
    tokens alone. The estimate of the longest prompt, the token-weighted mean ``Σ n² /
    n``, is under the longest ``M`` by ``Σ n_i (M - n_i) / n <= (n - M) M / n <= S``;
    the mean share it replaces was under it by about half the prompt on 2 ranks."""
    w = _worker(name)
    assert _prefill_s(w, [long, *shorts]) >= _prefill_s(w, [long - sum(shorts)]) * (1 - 1e-9)


def test_the_breakdown_sums_to_the_step_it_breaks_down():
    """``breakdown`` takes the same prompts as ``mixed_time_s``, cached ones included (the
    estimate of the longest prompt applies only without them)."""
    w = build_moe_worker_cost(**QWEN_TP4_DP2)
    pairs = 30_000 * 30_001 / 2 + 100 * 101 / 2
    for cached in (0, 4_096):
        step = w.mixed_time_s(8, 8_000, 2, 30_100, pairs, cached)
        bd = w.breakdown(
            decode_batch=8, decode_context_tokens=8_000, prefill_seqs=2,
            prefill_tokens=30_100, prefill_attn_pairs=pairs, prefill_cached_tokens=cached,
        )  # fmt: skip
        assert sum(bd.as_dict().values()) == pytest.approx(step, rel=1e-12)
