"""A worker's prefix cache on hand-built hash chains (disaggsim/cache/worker.py).

Blocks of 4 tokens, so a chain's blocks and tokens can be followed by hand; ids are
canonical prefix ids (an id names its whole prefix), as the workload produces them.
"""

from __future__ import annotations

import pytest

from disaggsim.cache import BlockStore, OverlapIndex, WorkerKvCache

BOTH = ["lru", "radix"]


def run(cache: WorkerKvCache, rid: int, chain: list[int], prompt: int):
    """Admit, compute and finish one request; return its admission."""
    adm = cache.admit(rid, chain, prompt)
    assert adm is not None
    cache.commit(rid)
    cache.release(rid)
    return adm


@pytest.mark.parametrize("policy", BOTH)
def test_hits_and_the_partial_last_block(policy: str) -> None:
    c = WorkerKvCache(0, capacity_tokens=100, block_tokens=4, kv_bytes_per_token=1, policy=policy)
    a = run(c, 1, [1, 2], 8)
    assert (a.lookup.hit_blocks, a.lookup.hit_tokens, a.lookup.new_tokens) == (0, 0, 8)
    assert (c.cached_tokens, c.pinned_tokens, c.pending_tokens) == (8, 0, 0)
    # [1, 3]: 7 tokens, block 3 covers 3 of them
    b = c.admit(2, [1, 3], 7)
    assert b is not None and (b.lookup.hit_blocks, b.lookup.hit_tokens) == (1, 4)
    assert c.pinned_tokens == 4 and c.pending_tokens == 3 and c.tokens_total == 11
    c.commit(2)
    c.release(2)
    again = run(c, 3, [1, 3], 7)
    if policy == "radix":  # SGLang caches the partial block: all hit but the last token
        assert c.cached_tokens == 11
        assert (again.lookup.hit_blocks, again.lookup.hit_tokens) == (2, 6)
        assert again.lookup.tier_hit_tokens() == (6, 0, 0)
    else:  # vLLM hashes full blocks only
        assert c.cached_tokens == 8
        assert (again.lookup.hit_blocks, again.lookup.hit_tokens) == (1, 4)
    assert c.tokens_total == c.cached_tokens and c.pinned_tokens == 0


@pytest.mark.parametrize("policy", BOTH)
def test_eviction_order(policy: str) -> None:
    """Capacity 12 tokens = three full blocks."""
    c = WorkerKvCache(0, capacity_tokens=12, block_tokens=4, kv_bytes_per_token=1, policy=policy)
    run(c, 1, [1, 2], 8)
    run(c, 2, [3], 4)
    assert c.tokens_total == 12
    # [1, 4] hits 1 and needs 4 tokens: unpinned are 2 (released first) and 3 -> 2 goes
    adm = run(c, 3, [1, 4], 8)
    assert adm.evicted_tokens == 4 and adm.lookup.hit_tokens == 4
    assert [c.is_cached(b) for b in (1, 2, 3, 4)] == [True, False, True, True]
    # [5, 6] needs 8 tokens: 3 (oldest), then 4 (leaf of 1, released with it, tail
    # first); 1 stays
    adm = run(c, 4, [5, 6], 8)
    assert adm.evicted_tokens == 8
    assert [c.is_cached(b) for b in (1, 3, 4, 5, 6)] == [True, False, False, True, True]
    assert run(c, 5, [1], 4).lookup.hit_blocks == 1


@pytest.mark.parametrize("policy", BOTH)
def test_pinned_blocks_are_never_evicted_and_refusal_changes_nothing(policy: str) -> None:
    c = WorkerKvCache(0, capacity_tokens=8, block_tokens=4, kv_bytes_per_token=1, policy=policy)
    assert c.admit(1, [1, 2], 8) is not None  # running, pending 8
    assert c.admit(2, [3], 4) is None
    assert (c.tokens_total, c.num_blocks, c.holds(2)) == (8, 0, False)
    c.commit(1)
    assert c.admit(2, [3], 4) is None  # 1 and 2 are pinned by request 1
    assert c.evict_to(0).reached is False and c.num_blocks == 2
    # a second user of the same prefix shares the pinned blocks: no new memory
    shared = c.admit(3, [1, 2], 8)
    assert shared is not None and shared.lookup.hit_tokens == 7 and c.tokens_total == 8
    assert c.refs(1) == c.refs(2) == 2
    c.release(1)
    assert c.admit(2, [3], 4) is None  # still pinned by request 3
    c.release(3)
    adm = c.admit(2, [3], 4)
    assert adm is not None and adm.evicted_tokens == 4
    assert c.is_cached(1) and not c.is_cached(2)
    # the engine's own limit: evict_to frees unpinned blocks only
    c.commit(2)
    ev = c.evict_to(4)
    assert ev.reached and ev.freed_tokens == 4 and c.is_cached(3) and not c.is_cached(1)


def test_dedup_when_another_request_computed_the_block_first() -> None:
    c = WorkerKvCache(0, capacity_tokens=100, block_tokens=4, kv_bytes_per_token=1)
    assert c.admit(1, [1, 2], 8) is not None
    assert c.admit(2, [1, 2], 8) is not None  # nothing committed yet: no hit
    assert c.tokens_total == 16
    c.commit(1)
    commit = c.commit(2)
    assert commit.deduplicated_tokens == 8 and c.tokens_total == 8
    assert c.refs(1) == c.refs(2) == 2
    c.release(2)
    c.release(1)
    assert c.pinned_tokens == 0 and c.cached_tokens == 8


def test_chunked_commit_and_release_before_commit() -> None:
    c = WorkerKvCache(0, capacity_tokens=100, block_tokens=4, kv_bytes_per_token=1)
    assert c.admit(1, [1, 2, 3], 12) is not None
    c.commit(1, upto_blocks=1)  # first chunk done: block 1 is hit-able
    assert c.lookup([1, 2, 3], 12).hit_blocks == 1
    assert c.pending_tokens == 8
    c.release(1)  # preempted mid-prefill: the uncomputed blocks are dropped
    assert (c.cached_tokens, c.pending_tokens, c.pinned_tokens) == (4, 0, 0)


@pytest.mark.parametrize("policy", BOTH)
def test_tiers_demotion_promotion_and_worker_loss(policy: str) -> None:
    kvb = 10
    dram = BlockStore("dram", 100)
    remote = BlockStore("remote", None)
    index = OverlapIndex()
    w1 = WorkerKvCache(1, 8, 4, kvb, policy, dram=dram, remote=remote, listener=index)
    a = w1.admit(1, [1, 2], 8)
    assert a is not None
    assert w1.commit(1).remote_put_bytes == 8 * kvb  # written through
    w1.release(1)
    assert index.holders(1) == {1}
    b = run(w1, 2, [3, 4], 8)  # evicts 1 and 2: demoted to DRAM over PCIe
    assert (b.evicted_tokens, b.demote_pcie_bytes) == (8, 8 * kvb)
    assert 1 in dram and 2 in dram and index.holders(1) == frozenset()
    look = w1.lookup([1, 2], 8)
    assert (look.hbm_blocks, look.dram_blocks, look.remote_blocks) == (0, 2, 0)
    assert look.tier_hit_tokens() == (0, 7, 0)  # the last token is computed
    c = run(w1, 3, [1, 2], 8)
    assert (c.promote_pcie_bytes, c.promote_nic_bytes) == (8 * kvb, 0)
    assert c.demote_pcie_bytes == 8 * kvb  # 3 and 4 went down to make room
    assert w1.lookup([1, 2], 8).hbm_blocks == 2
    # a worker on another node reads the remote store over its NIC
    w2 = WorkerKvCache(2, 8, 4, kvb, policy, dram=BlockStore("dram", 100), remote=remote)
    d = run(w2, 4, [3, 4], 8)
    assert d.lookup.tier_hit_tokens() == (0, 0, 7) and d.promote_nic_bytes == 8 * kvb
    # worker 1 is lost: its HBM and the router's view of it go, its node's DRAM stays
    w1.clear()
    assert (w1.tokens_total, w1.num_blocks) == (0, 0) and index.holders(1) == frozenset()
    look = w1.lookup([1, 2], 8)
    assert look.hbm_blocks == 0 and look.hit_blocks == 2
    lone = WorkerKvCache(3, 8, 4, kvb, policy)
    run(lone, 5, [1, 2], 8)
    lone.clear()
    assert lone.lookup([1, 2], 8).hit_blocks == 0


def test_lower_tiers_stay_within_capacity() -> None:
    store = BlockStore("dram", 10)
    assert store.put(1, 4) and store.put(2, 4)
    store.touch(1)
    assert store.put(3, 4)  # 2 is least recently used
    assert 1 in store and 2 not in store and store.tokens == 8
    assert not store.put(9, 11)  # larger than the whole tier
    with pytest.raises(ValueError, match="capacity_tokens"):
        BlockStore("dram", -1)
    with pytest.raises(ValueError, match="unknown cache policy 'fifo'"):
        WorkerKvCache(0, 1, 1, 1, "fifo")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["lru", "radix"])
def test_promotion_survives_demotions_that_fill_dram(policy: str) -> None:
    """A request hitting blocks in a full DRAM tier: the room its admission makes in HBM
    demotes blocks into that DRAM, which pushes out its least recently used blocks; the
    blocks being promoted are copied up first, so they are not lost (an admission once
    crashed here)."""
    dram = BlockStore("dram", 8)
    c = WorkerKvCache(
        0, capacity_tokens=8, block_tokens=4, kv_bytes_per_token=1, policy=policy, dram=dram
    )
    for rid, chain in enumerate(([1, 2], [3, 4])):
        assert c.admit(rid, chain, 8) is not None
        c.commit(rid)
        c.release(rid)
    assert 1 in dram and 2 in dram  # evicted from HBM to make room for 3, 4
    adm = c.admit(2, [1, 2], 8)
    assert adm is not None
    assert (adm.lookup.dram_blocks, adm.promote_pcie_bytes) == (2, 8)
    assert c.is_cached(1) and c.is_cached(2) and c.refs(1) == c.refs(2) == 1
    assert c.tokens_total <= 8
