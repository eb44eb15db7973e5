"""Hypothesis invariants of the prefix cache under random admissions, prefill commits,
releases, evictions and worker losses: never above its limit, never evicting a block a
running request uses, reference counts equal to the running users, counters equal to
the blocks held, a lost worker keeps nothing, and a refused admission changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.cache import BlockStore, OverlapIndex, WorkerKvCache
from disaggsim.workload.chains import canonical_chains

BLOCK = 4

# A small pool of prompts whose raw hashes come from a tiny alphabet, so prefixes are
# shared often; canonical_chains turns them into prefix ids as the workload does.
prompts_strategy = st.lists(
    st.tuples(st.integers(1, 5 * BLOCK), st.lists(st.integers(0, 2), min_size=5, max_size=5)),
    min_size=1,
    max_size=8,
)
op_strategy = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "admit", "commit", "release", "evict", "lose"]),
        st.integers(0, 7),  # which prompt / which running request
        st.integers(0, 40),  # a limit in tokens, or how many blocks a chunk commits
    ),
    max_size=60,
)


def snapshot(c: WorkerKvCache) -> tuple:
    return (c.tokens_total, c.cached_tokens, c.unpinned_tokens, c.pending_tokens, c.num_blocks)


@settings(max_examples=300, deadline=None)
@given(
    prompts=prompts_strategy,
    ops=op_strategy,
    policy=st.sampled_from(["lru", "radix"]),
    capacity=st.integers(0, 40),
    tiers=st.booleans(),
)
def test_cache_invariants(prompts, ops, policy, capacity, tiers) -> None:
    lengths = np.array([n for n, _ in prompts], dtype=np.int64)
    chains = canonical_chains([h for _, h in prompts], lengths, BLOCK)
    index = OverlapIndex()
    dram = BlockStore("dram", 12) if tiers else None
    remote = BlockStore("remote", 20) if tiers else None
    c = WorkerKvCache(7, capacity, BLOCK, 2, policy, dram=dram, remote=remote, listener=index)
    running: dict[int, int] = {}  # request id -> prompt index
    committed_upto: dict[int, int] = {}
    next_id = 0
    for op, which, amount in ops:
        if op == "admit":
            p = which % len(prompts)
            before = snapshot(c)
            limit = min(amount, capacity)
            adm = c.admit(next_id, chains.chain(p), int(lengths[p]), amount)
            if adm is None:
                assert snapshot(c) == before and not c.holds(next_id)
            else:
                assert c.tokens_total <= limit
                look = adm.lookup
                assert 0 <= look.hit_tokens < look.prompt_tokens
                assert sum(look.tier_hit_tokens()) == look.hit_tokens
                running[next_id] = p
                committed_upto[next_id] = look.hit_blocks
            next_id += 1
        elif op == "commit" and running:
            rid = sorted(running)[which % len(running)]
            upto = committed_upto[rid] + 1 + amount % 3
            c.commit(rid, upto)
            committed_upto[rid] = max(committed_upto[rid], upto)
        elif op == "release" and running:
            rid = sorted(running)[which % len(running)]
            c.release(rid)
            del running[rid], committed_upto[rid]
        elif op == "evict":
            ev = c.evict_to(amount)
            assert ev.reached == (c.tokens_total <= amount)
        elif op == "lose":
            c.clear()
            running.clear()
            committed_upto.clear()
            assert snapshot(c) == (0, 0, 0, 0, 0)
            assert all(7 not in index.holders(b) for b in range(chains.num_ids))

        # never above capacity
        assert 0 <= c.tokens_total <= capacity
        # blocks a running request computed or hit are cached and counted as its users
        users: dict[int, int] = {}
        for rid, p in running.items():
            chain = chains.chain(p)
            n = min(committed_upto[rid], len(chain))
            for k in range(n):
                tail_not_cached = (
                    policy == "lru" and k == len(chain) - 1 and int(lengths[p]) - k * BLOCK < BLOCK
                )
                if not tail_not_cached:
                    assert c.is_cached(chain[k]), "a block in use was evicted"
                    users[chain[k]] = users.get(chain[k], 0) + 1
        for b in range(chains.num_ids):
            assert c.refs(b) == users.get(b, 0)
        # counters equal the blocks held; the router's index equals the HBM contents
        held = [b for b in range(chains.num_ids) if c.is_cached(b)]
        assert len(held) == c.num_blocks
        tokens = {b: t for b, t in _block_tokens(chains, lengths).items()}
        assert c.cached_tokens == sum(tokens[b] for b in held)
        assert c.pinned_tokens == sum(tokens[b] for b in held if users.get(b))
        assert {b for b in range(chains.num_ids) if 7 in index.holders(b)} == set(held)
        if dram is not None and remote is not None:
            assert dram.tokens <= 12 and remote.tokens <= 20


def _block_tokens(chains, lengths) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in range(len(chains)):
        for k, b in enumerate(chains.chain(i)):
            out[b] = min(BLOCK, int(lengths[i]) - k * BLOCK)
    return out


@settings(max_examples=100, deadline=None)
@given(prompts=prompts_strategy, order=st.lists(st.integers(0, 7), min_size=1, max_size=30))
def test_unbounded_cache_hits_every_block_seen_before(prompts, order) -> None:
    """With room for everything and requests one at a time, a request hits exactly the
    longest prefix of its chain that some earlier request's chain contained."""
    lengths = np.array([n for n, _ in prompts], dtype=np.int64)
    chains = canonical_chains([h for _, h in prompts], lengths, BLOCK)
    c = WorkerKvCache(0, 10**9, BLOCK, 1, "radix")
    seen: set[int] = set()
    for rid, which in enumerate(order):
        p = which % len(prompts)
        chain, n = chains.chain(p), int(lengths[p])
        expect = 0
        for k, b in enumerate(chain):
            if b not in seen:
                break
            expect += min(BLOCK, n - k * BLOCK)
        adm = c.admit(rid, chain, n)
        assert adm is not None and adm.lookup.hit_tokens == min(expect, n - 1)
        c.commit(rid)
        c.release(rid)
        seen.update(chain)
