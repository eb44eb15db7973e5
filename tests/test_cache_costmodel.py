"""Costing a prefill after a prefix hit through the WorkerCost interface.

The engine costs a request whose first ``h`` prompt tokens hit the cache as a prefill of
``n = L - h`` new tokens after ``h`` cached ones: ``prefill_time_s(1, n,
causal_pairs(n, h), cached_tokens=h)`` (or the same prefill part of ``mixed_time_s``).
Attention still reads the cached part: the ``n * h`` query-key pairs of the new tokens
against the cached ones are in ``attn_pairs``. Checked here on the roofline model and
the constant-cost double: zero hit is the full prefill; a longer hit of the same prompt
never costs more; more cached tokens under the same new tokens never cost less.
"""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.ops import causal_pairs
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.costmodel.testing import ConstantCost

WORKERS = [
    ("llama-3-8b", "h100-sxm", 1),
    ("llama-3-70b", "h100-sxm", 4),
    ("llama-3-70b", "a100-80gb", 8),
    ("opt-13b", "a100-80gb", 2),
    ("mistral-7b", "l40s", 1),
]


@cache
def worker(i: int):
    if i == len(WORKERS):
        return ConstantCost(prefill_base_s=0.01, prefill_per_token_s=1e-5)
    return build_worker_cost(*WORKERS[i])


def suffix_s(cost, seqs: int, prompt: int, hit: int) -> float:
    """``seqs`` equal prompts of ``prompt`` tokens, each hitting ``hit`` of them."""
    n = prompt - hit
    return cost.prefill_time_s(seqs, seqs * n, seqs * float(causal_pairs(n, hit)), seqs * hit)


def test_zero_hit_is_the_full_prefill() -> None:
    for i in range(len(WORKERS) + 1):
        cost = worker(i)
        for prompt in (1, 777, 8192):
            whole = cost.prefill_time_s(1, prompt, prompt * (prompt + 1) / 2)
            assert suffix_s(cost, 1, prompt, 0) == whole
            assert cost.mixed_time_s(0, 0, 1, prompt, prompt * (prompt + 1) / 2, 0) == whole


@settings(max_examples=300, deadline=None)
@given(
    i=st.integers(0, len(WORKERS)),
    prompt=st.integers(2, 65536),
    a=st.floats(0, 1),
    b=st.floats(0, 1),
    seqs=st.sampled_from([1, 4]),
)
def test_more_hit_never_costs_more(i, prompt, a, b, seqs) -> None:
    cost = worker(i)
    lo, hi = sorted((int(a * (prompt - 1)), int(b * (prompt - 1))))
    assert suffix_s(cost, seqs, prompt, hi) <= suffix_s(cost, seqs, prompt, lo) * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(
    i=st.integers(0, len(WORKERS)),
    new=st.integers(1, 16384),
    cached=st.integers(0, 65536),
    more=st.integers(1, 65536),
    decode_batch=st.sampled_from([0, 32]),
)
def test_reading_more_cached_tokens_never_costs_less(i, new, cached, more, decode_batch) -> None:
    cost = worker(i)

    def chunk_s(p: int) -> float:
        pairs = float(causal_pairs(new, p))
        if decode_batch:
            return cost.mixed_time_s(decode_batch, decode_batch * 2048, 1, new, pairs, p)
        return cost.prefill_time_s(1, new, pairs, p)

    assert chunk_s(cached + more) >= chunk_s(cached)
