"""The cache_aware router's cost (Dynamo's) and the overlap index (disaggsim/cache/routing.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.cache import (
    OverlapIndex,
    WorkerKvCache,
    cache_aware_costs,
    pick_lowest_cost,
    uncached_prompt_tokens,
)


def test_cost_by_hand() -> None:
    # prompt 1000; worker 0 caches 800 and has 2000 queued, 5000 active;
    # worker 1 caches nothing, 0 queued, 3000 active.
    costs = cache_aware_costs([800, 0], [2000, 0], [5000, 3000], 1000, overlap_weight=1.0)
    # w0: 1 * (2000 + 1000 - 800) + (5000 + 1000) = 8200; w1: (0 + 1000) + 4000 = 5000
    assert costs.tolist() == [8200.0, 5000.0]
    assert pick_lowest_cost(costs, [0, 1]) == 1
    # weight 4 favours the cached worker: w0 4 * 2200 + 6000 = 14800, w1 4000 + 4000 = 8000
    costs = cache_aware_costs([800, 0], [0, 0], [5000, 3000], 1000, overlap_weight=4.0)
    assert costs.tolist() == [4 * 200 + 6000, 4 * 1000 + 4000]
    assert pick_lowest_cost(costs, [0, 1]) == 0
    # overlap is capped at prompt - 1, like a hit
    assert cache_aware_costs([5000], [0], [0], 1000).tolist() == [1.0 + 1000]
    # ties go to the lowest worker id, whatever the order given
    assert pick_lowest_cost([3.0, 3.0, 4.0], [9, 4, 1]) == 4
    with pytest.raises(ValueError):
        pick_lowest_cost([], [])


def test_queued_work_counts_the_uncached_tokens() -> None:
    """Dynamo books a routed request at its uncached tokens on the chosen worker. Worker
    0 has two queued 4,000-token prompts with 3,584 of each cached there (7 blocks of
    512): 416 + 416 = 832 tokens to compute; worker 1 one uncached 1,500-token prompt.
    A new 2,000-token prompt cached nowhere: w0 832 + 2,000 + 2,000 = 4,832, w1 1,500 +
    2,000 + 2,000 = 5,500 -> worker 0. Counting whole prompts (8,000 queued on w0:
    12,000) would send it to worker 1, the one with more work queued."""
    assert uncached_prompt_tokens(4000, 3584) == 416
    assert uncached_prompt_tokens(1500, 0) == 1500
    assert uncached_prompt_tokens(1000, 1000) == 1  # the last prompt token is computed
    assert uncached_prompt_tokens(1000, 5000) == 1
    queued = [uncached_prompt_tokens(4000, 3584) * 2, uncached_prompt_tokens(1500, 0)]
    costs = cache_aware_costs([0, 0], queued, [0, 0], 2000)
    assert costs.tolist() == [4832.0, 5500.0]
    assert pick_lowest_cost(costs, [0, 1]) == 0
    whole = cache_aware_costs([0, 0], [8000, 1500], [0, 0], 2000)
    assert pick_lowest_cost(whole, [0, 1]) == 1
    with pytest.raises(ValueError, match="prompt_tokens must be >= 1"):
        uncached_prompt_tokens(0, 0)
    with pytest.raises(ValueError, match="overlap_tokens must be >= 0"):
        uncached_prompt_tokens(10, -1)


@settings(max_examples=200, deadline=None)
@given(
    overlap=st.integers(0, 5000),
    extra=st.integers(1, 5000),
    queued=st.integers(0, 10**5),
    active=st.integers(0, 10**5),
    prompt=st.integers(1, 8000),
    weight=st.floats(0.01, 10),
)
def test_cost_monotone(overlap, extra, queued, active, prompt, weight) -> None:
    """More cached prefix never costs more; more queued or active tokens never cost less."""
    base = cache_aware_costs([overlap], [queued], [active], prompt, weight)[0]
    assert cache_aware_costs([overlap + extra], [queued], [active], prompt, weight)[0] <= base
    assert cache_aware_costs([overlap], [queued + extra], [active], prompt, weight)[0] > base
    assert cache_aware_costs([overlap], [queued], [active + extra], prompt, weight)[0] > base


def test_overlap_index_follows_the_caches() -> None:
    index = OverlapIndex()
    caches = [WorkerKvCache(w, 100, 4, 1, "radix", listener=index) for w in range(3)]
    for w, chain in enumerate([[1, 2, 3], [1, 2], [4]]):
        assert caches[w].admit(w, chain, 4 * len(chain)) is not None
        caches[w].commit(w)
        caches[w].release(w)
    # request [1, 2, 3, 5] of 15 tokens: worker 0 holds 3 blocks, worker 1 two
    assert index.overlaps([1, 2, 3, 5], 15, 4) == {0: 12, 1: 8}
    assert index.overlaps([4], 4, 4) == {2: 3}  # capped at prompt - 1
    assert index.overlaps([7], 4, 4) == {} and index.overlaps([], 0, 4) == {}
    # the index agrees with each worker's own lookup
    for chain, n in (([1, 2, 3, 5], 15), ([1, 2], 8), ([4, 1], 8)):
        got = index.overlaps(chain, n, 4)
        for w, c in enumerate(caches):
            assert got.get(w, 0) == min(c.lookup(chain, n).hbm_block_tokens, n - 1)
    caches[0].clear()
    assert index.overlaps([1, 2, 3], 12, 4) == {1: 8}
    assert index.holders(3) == frozenset()


def test_argmin_over_holders_and_best_non_holder_equals_full_scan() -> None:
    """The contract's shortcut (score the holders, take the best non-holder from a
    load-ordered heap) picks what a scan of every worker picks."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = 6
        overlap = np.where(rng.random(n) < 0.4, rng.integers(1, 3000, n), 0)
        queued = rng.integers(0, 5000, n)
        active = rng.integers(0, 5000, n)
        prompt, weight = 3000, float(rng.choice([0.5, 1.0, 2.0]))
        full = pick_lowest_cost(
            cache_aware_costs(overlap, queued, active, prompt, weight), range(n)
        )
        holders = [w for w in range(n) if overlap[w] > 0]
        others = [w for w in range(n) if overlap[w] == 0]
        cands = list(holders)
        if others:  # the heap's top: least weight * queued + active, ties by id
            cands.append(min(others, key=lambda w: (weight * queued[w] + active[w], w)))
        costs = cache_aware_costs(overlap[cands], queued[cands], active[cands], prompt, weight)
        assert pick_lowest_cost(costs, cands) == full
