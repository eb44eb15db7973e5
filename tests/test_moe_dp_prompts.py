"""With attention data parallelism (dp > 1) a prompt is prefilled whole on one DP rank, so
the busiest rank's prefill is at least the batch's longest prompt
(``MoeWorkerCost._rank_prompts``). Until 2026-12-04 it was the mean share of the prompts'
tokens and pairs (``ceil(s / dp) / s`` of them): one 30,000-token prompt on Qwen3-235B
tp4 x dp2 prefilled in 1,599 ms alone and in 1,074 ms once a 100-token prompt joined it.
The cost model sees a batch's totals only; the longest prompt is read from them: uncached,
as the token-weighted mean prompt, ``Σ n² / Σ n``; where prompts continue cached prefixes
(prefix cache hits, chunks after the first) as ``(2 × pairs − tokens) / (2 × cached +
tokens)``, a length the longest prompt's new tokens reach (until the evening of 2026-12-04
such a batch took the mean share)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.moe import _weighted_prompt, build_moe_worker_cost
from tests.test_moe_dp_longest import WORKERS, _worker

QWEN_TP4_DP2 = {"model": "qwen3-235b-a22b", "gpu": "h100-sxm", "tp": 4, "dp": 2}


def _prefill_s(w, prompts: list[int], cached: list[int] | None = None) -> float:
    """Prefill of prompts of ``prompts`` new tokens, each after ``cached`` cached ones."""
    c = cached or [0] * len(prompts)
    n = sum(prompts)
    pairs = sum(p * h + p * (p + 1) / 2 for p, h in zip(prompts, c, strict=True))
    return w.prefill_time_s(len(prompts), n, pairs, sum(c))


def test_the_token_weighted_prompt_never_exceeds_the_longest():
    assert _weighted_prompt(3000, 3 * 1000 * 1001 / 2, 0) == pytest.approx(1000)  # one length
    one_long = _weighted_prompt(30_100, 30_000 * 30_001 / 2 + 100 * 101 / 2, 0)
    assert 29_900 < one_long <= 30_000
    # one prompt holding every cached token and every new one: exact
    assert _weighted_prompt(512, 512 * 20_000 + 512 * 513 / 2, 20_000) == 512
    assert _weighted_prompt(0, 0.0, 0) is None


@settings(max_examples=200, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.integers(1, 40_000), st.integers(0, 100_000)), min_size=1, max_size=16
    )
)
def test_the_estimate_with_cached_prefixes_never_exceeds_the_longest_new_tokens(prompts):
    """Prompts of ``n`` new tokens after ``c`` cached ones (pairs ``n c + n (n + 1) / 2``):
    the estimate is at most the most new tokens of one prompt, counted here."""
    n = sum(p for p, _ in prompts)
    pairs = sum(p * c + p * (p + 1) / 2 for p, c in prompts)
    got = _weighted_prompt(n, pairs, sum(c for _, c in prompts))
    assert got is not None
    assert got <= max(p for p, _ in prompts) * (1 + 1e-12)


def test_a_long_prompt_after_a_cached_prefix_is_prefilled_on_one_rank():
    """20,000 new tokens after a 10,000-token cached prefix beside a 100-token prompt, on
    tp4 x dp2: at least a 19,900-token prompt alone (was the mean share, about half the
    new tokens on each rank: under it)."""
    w = build_moe_worker_cost(**QWEN_TP4_DP2)
    both = _prefill_s(w, [20_000, 100], [10_000, 0])
    assert both >= _prefill_s(w, [19_900])
    # the estimate: (2 x pairs - tokens) / (2 x cached + tokens) = 800,010,000 / 40,100
    pairs = 20_000 * 10_000 + 20_000 * 20_001 / 2 + 100 * 101 / 2
    assert _weighted_prompt(20_100, pairs, 10_000) == pytest.approx(19_950.4, abs=0.05)


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
    cached=st.sampled_from([0, 0, 512, 4_096, 30_000]),
)
def test_a_batch_with_a_long_prompt_takes_at_least_that_prompt_alone(name, long, shorts, cached):
    """On every DP worker of the decode tests: a batch holding a prompt of ``long`` new
    tokens (after ``cached`` cached ones) beside short uncached ones of ``S`` tokens in all
    takes at least a prompt of ``long - S`` tokens alone. Uncached, the estimate of the
    longest prompt, the token-weighted mean ``Σ n² / n``, is under the longest ``M`` by
    ``Σ n_i (M - n_i) / n <= (n - M) M / n <= S``; with the cached prefix ``c`` it is at
    least ``long (2c + long) / (2c + long + S) >= long - S``. The mean share it replaces
    was under it by about half the prompt on 2 ranks."""
    w = _worker(name)
    got = _prefill_s(w, [long, *shorts], [cached] + [0] * len(shorts))
    assert got >= _prefill_s(w, [long - sum(shorts)]) * (1 - 1e-9)


def test_the_breakdown_sums_to_the_step_it_breaks_down():
    """``breakdown`` takes the same prompts as ``mixed_time_s``, cached ones included."""
    w = build_moe_worker_cost(**QWEN_TP4_DP2)
    pairs = 30_000 * 30_001 / 2 + 100 * 101 / 2
    for cached in (0, 4_096):
        step = w.mixed_time_s(8, 8_000, 2, 30_100, pairs, cached)
        bd = w.breakdown(
            decode_batch=8, decode_context_tokens=8_000, prefill_seqs=2,
            prefill_tokens=30_100, prefill_attn_pairs=pairs, prefill_cached_tokens=cached,
        )  # fmt: skip
        assert sum(bd.as_dict().values()) == pytest.approx(step, rel=1e-12)
