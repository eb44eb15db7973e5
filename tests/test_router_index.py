"""The router's indexed decisions are the decisions of a full scan, and the decode batch's
block growth in integer arithmetic is the per-sequence growth.

Every routing decision of random stressed clusters (failures, preemption, back-pressure,
autoscaling-free) is checked against the definition of its policy evaluated over every
worker, as the router did before it kept indexes: the worker chosen must be the same
one (issue 15: decisions in O(log W) with exactness kept)."""

from __future__ import annotations

import dataclasses
import random
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import Cluster, run_cluster
from disaggsim.engine.config import EngineConfig, PoolSpec
from disaggsim.engine.router import LeastCommittedKv, Router, _Rising
from disaggsim.workload.requests import Requests
from tests.test_engine_failures import _check, stressed


def _grow_by_sequence(contexts: list[int], t: int, block: int) -> int:
    """Blocks a batch of sequences with these contexts allocates over ``t`` more steps."""
    return sum(-(-(c + t) // block) - -(-c // block) for c in contexts)


def test_block_growth_in_integer_arithmetic_is_the_per_sequence_growth():
    rng = random.Random(5)
    for block in (1, 2, 16, 64):
        cfg = EngineConfig(
            pools=(PoolSpec("colocated", 1, ConstantCost(), 64, 10_000, "vllm"),),
            kv_admission="on_demand",
            block_tokens=block,
        )
        cl = Cluster(Requests(np.zeros(0), np.zeros(0, int), np.zeros(0, int)), cfg, lambda *a: 0)
        w = cl.colocated_workers[0]
        for _ in range(300):
            w.step_idx = rng.randint(0, 10_000)
            contexts = [rng.randint(1, 5 * block + 7) for _ in range(rng.randint(1, 12))]
            w._phase_hist = [0] * block
            for c in contexts:  # as _join files them: (context - step) mod block
                w._phase_hist[(c - w.step_idx) % block] += 1
            w.batch = len(contexts)
            for t in (1, 2, block - 1, block, block + 1, 3 * block + 5):
                if t >= 1:
                    assert w._new_blocks(t) == _grow_by_sequence(contexts, t, block)


def _front_expected(router: Router):
    workers = [w for w in router.front_workers if w.accepting]
    match router._prefill_policy:
        case "least_tokens":
            return min(workers, key=lambda x: (x.queued_tokens, x.num_outstanding, x.index))
        case "shortest_queue":
            return min(workers, key=lambda x: (x.num_outstanding, x.index))
    return None  # round robin: its turn counter is its definition


def _promise_room(router: Router, w) -> int:
    """kv_aware: the blocks ``w`` can still promise, by its definition over every
    request promised on it (capacity - watermark - 1 - eventual - promised)."""
    pos = router.decode_workers.index(w)
    promised = sum(b for p, b in router.committed.values() if p == pos)
    return w.kv_capacity_blocks - w.watermark_blocks - 1 - w.eventual_blocks - promised


def _admit_expected(router: Router, rid: int):
    """kv_aware: (admitted, the position of the decode worker promising the room): the
    accepting decode worker with the most room to promise, ties to the lowest index."""
    rooms = [(_promise_room(router, w), -w.index) for w in router.decode_workers if w.accepting]
    if not rooms:
        return False, None
    room, neg_index = max(rooms)
    if router.requests.full_blocks(rid) > room:
        return False, None
    return True, [w.index for w in router.decode_workers].index(-neg_index)


def _check_decode_indexes(router: Router) -> None:
    """After a refresh, every decode worker is indexed under the key its state gives now
    (a refresh that skipped a worker whose key moved fails here), and the heap holds an
    entry no larger than each key (a key that rose is found where it surfaces)."""
    n = len(router.decode_workers)
    indexes = []
    free = lambda w: (w.kv_used_blocks - w.kv_capacity_blocks) * n  # noqa: E731
    if router._most_free is not None:
        indexes.append((router._most_free, free))
    if isinstance(router.decode, LeastCommittedKv):
        indexes.append((router.decode.free.index, free))
        indexes.append((router.decode.index, lambda w: _committed_key(w) * n))
    if router.kv_aware:
        indexes.append((router._rooms, lambda w: -_promise_room(router, w) * n))
    for index, value in indexes:
        _check_index(index, router.decode_workers, value)


def _check_front_index(router: Router) -> None:
    """The same for least_tokens' and shortest_queue's heap of the front workers."""
    by_key = router._by_key
    if by_key is not None:
        n, weight = len(router.front_workers), by_key.tokens_weight
        value = lambda w: (w.queued_tokens * weight + w.num_outstanding) * n  # noqa: E731
        _check_index(by_key.index, router.front_workers, value)


def _check_index(index: _Rising, workers, value) -> None:
    n = len(workers)
    for pos, w in enumerate(workers):
        expected = value(w) + pos if w.accepting else None
        assert index.keys[pos] == expected, (pos, index.keys[pos], expected)
        if expected is not None:
            assert min(e for e in index.heap if e % n == pos) <= expected


def _committed_key(w) -> tuple[bool, int] | int:
    """least_committed_kv's order of a decode worker, from its definition: seats full
    (as many sequences held as ``max_batch_seqs``: running, swapped, waiting, arriving)
    last, then the KV its sequences may hold at their longest, less its capacity."""
    held = w.batch + len(w.swapped) + len(w.waiting) + len(w.incoming)
    assert held == w.num_outstanding, (held, w.num_outstanding)
    full = held >= w.max_batch_seqs
    longest = sum(w.requests.full_blocks(r) for r in w._eventual)
    assert longest == w.eventual_blocks
    return full * (1 << 48) + longest - w.kv_capacity_blocks


def _seated(w) -> bool:
    return w.num_outstanding < w.max_batch_seqs


def _decode_expected(router: Router, rid: int):
    fits = [w for w in router.decode_workers if w.can_accept(rid)]
    if router.kv_aware:  # among the workers keeping the promise, unless it was lost
        entry = router.committed.get(rid)
        full = router.requests.full_blocks(rid)
        at = None if entry is None else router.decode_workers[entry[0]]
        keep = [w for w in fits if w is at or _promise_room(router, w) >= full]
        lost = at is None or not at.accepting
        fits = keep if keep or not lost else fits
    if not fits:
        return None
    match router._decode_policy:
        case "most_free_kv":
            return max(fits, key=lambda x: (x.free_blocks, -x.index))
        case "round_robin":
            n = len(router.decode_workers)
            nxt = router.decode._next
            return min(fits, key=lambda x: (x.index - nxt) % n)
        case "least_committed_kv":
            # the least committed accepting worker if it fits; else the most free KV that
            # fits, one with a free seat first (unless the least committed worker's seats
            # are full: then every worker's are)
            top = min(
                (w for w in router.decode_workers if w.accepting),
                key=lambda x: (_committed_key(x), x.index),
            )
            if top in fits:
                return top
            seated = [w for w in fits if _seated(w)] if _seated(top) else []
            return max(seated or fits, key=lambda x: (x.free_blocks, -x.index))
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stressed(),
    st.sampled_from(["least_tokens", "shortest_queue", "round_robin"]),
    st.sampled_from(["least_committed_kv", "most_free_kv", "round_robin"]),
    st.integers(1, 6),
)
def test_indexed_choices_are_the_full_scan_choices(case, prefill, decode, scale):
    _check_choices(case, prefill, decode, scale)


@st.composite
def crowded(draw):
    """Many decode workers with little KV and few seats, varied lengths, arrivals faster
    than they drain: handoffs that the least committed worker cannot take, and workers
    whose seats are full beside workers with room."""
    n = draw(st.integers(20, 80))
    gaps = draw(st.lists(st.floats(0.0, 0.02), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 150), min_size=n, max_size=n))
    # a cap above the reply: a worker's committed KV and its free KV order it apart
    extra = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    reqs = Requests(
        np.cumsum(gaps),
        np.array(prompts),
        np.array(outs),
        max_tokens=np.array(outs) + np.array(extra),
    )

    def cost():
        return ConstantCost(
            prefill_base_s=0.002,
            prefill_per_token_s=draw(st.floats(0.0, 2e-5)),
            decode_base_s=draw(st.floats(0.001, 0.01)),
            decode_per_context_token_s=0.0,
            kv_capacity_tokens=draw(st.integers(200, 1200)),
        )

    seqs = draw(st.integers(1, 4))
    pools = (
        PoolSpec("prefill", draw(st.integers(1, 3)), cost(), 8, 400),
        PoolSpec("decode", draw(st.integers(2, 12)), cost(), seqs, 400),
    )
    cfg = EngineConfig(
        pools=pools,
        block_tokens=draw(st.sampled_from([1, 16])),
        kv_admission=draw(st.sampled_from(["on_demand", "reserve_full"])),
        kv_watermark=draw(st.sampled_from([0.0, 0.05])),
        backpressure=draw(st.sampled_from(["none", "kv_aware"])),
        horizon_s=60.0,
    )
    return reqs, cfg, draw(st.floats(0.0, 0.01))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_least_committed_kv_in_crowded_pools_is_the_full_scan_choice(case):
    """The same, where the least committed worker often lacks room or seats: handoffs go
    to the most-free-KV search (seated first) often."""
    _check_choices(case, "least_tokens", "least_committed_kv", 1)


def _check_choices(case, prefill: str, decode: str, scale: int):
    reqs, cfg, transfer = case
    pools = tuple(dataclasses.replace(p, num_workers=p.num_workers * scale) for p in cfg.pools)
    cfg = dataclasses.replace(cfg, pools=pools, prefill_policy=prefill, decode_policy=decode)
    if scale > 1:  # a topology places the drawn pools only: keep the link-class fabric
        windows = tuple(w for w in cfg.link_windows if w.links is None)
        cfg = dataclasses.replace(cfg, topology=None, overlap=False, link_windows=windows)
    checked = {"route": 0, "handoff": 0}
    route, handoff = Router._try_route, Router._try_handoff

    def checked_route(self: Router, rid: int, tokens: int | None = None) -> bool:
        self._refresh()
        _check_decode_indexes(self)
        _check_front_index(self)
        checked["indexes"] = checked.get("indexes", 0) + 1
        expected = _front_expected(self) if self._num_front_accepting else None
        admit = _admit_expected(self, rid) if self.kv_aware else (True, None)
        ok = route(self, rid, tokens)
        if self._num_front_accepting:
            assert ok == admit[0], (rid, ok, admit)
            if self.kv_aware and ok:
                assert self.committed[rid] == (admit[1], self.requests.full_blocks(rid))
                checked["promise"] = checked.get("promise", 0) + 1
        if ok and expected is not None:
            chosen = [w for w in self.front_workers if rid in w.queue]
            assert chosen == [expected], (rid, chosen, expected)
            checked["route"] += 1
        return ok

    def checked_handoff(self: Router, rid: int, src, prefill_s=None) -> bool:
        self._refresh_decode()
        _check_decode_indexes(self)
        expected = _decode_expected(self, rid)
        ok = handoff(self, rid, src, prefill_s)
        if self._decode_policy in ("least_committed_kv", "most_free_kv", "round_robin"):
            assert ok == (expected is not None)
        if ok and expected is not None:
            chosen = [w for w in self.decode_workers if rid in w.incoming]
            assert chosen == [expected], (rid, chosen, expected)
            checked["handoff"] += 1
        return ok

    waiting = Router.waiting_for_prefill

    def checked_waiting(self: Router) -> int:
        n = waiting(self)
        assert n == len(self.queue) + sum(len(w.queue) for w in self.front_workers)
        checked["waiting"] = checked.get("waiting", 0) + 1
        return n

    try:
        Router._try_route = checked_route  # type: ignore[method-assign]
        Router._try_handoff = checked_handoff  # type: ignore[method-assign]
        Router.waiting_for_prefill = checked_waiting  # type: ignore[method-assign]
        raw = run_cluster(reqs, cfg, lambda nbytes, s, d: transfer)
    finally:
        Router._try_route = route  # type: ignore[method-assign]
        Router._try_handoff = handoff  # type: ignore[method-assign]
        Router.waiting_for_prefill = waiting  # type: ignore[method-assign]
    _check(reqs, cfg, raw)
    return raw


def test_a_worker_preempting_for_growth_is_whole_when_the_router_reads_it():
    """Two victims of one preemption for growth: the blocks the first frees let a waiting
    handoff go, and the router then reads the worker's seats and committed KV (the
    indexes are checked at every route and handoff). Every victim must have left the
    worker's counts by then (the second was still counted: 3 outstanding, 2 held).

    One decode worker of 8 blocks of 16 tokens and 4 seats; decode steps of 10 ms from
    0.002 s (the 2 ms prefill). r0-r2 (16-token prompts) join holding 17 tokens (2 blocks
    each), r3 (1 token) 2 tokens (1 block): 7 blocks; r4 waits at the prefill worker (its
    block, its own next step's and the batch's next growth do not fit). The 15th step
    takes the last block (r3's 17th token); the 16th needs 3 (r0-r2's 33rd), none free:
    at 0.152 s r3 (most recent, 2 blocks) and then r2 (2 blocks) are preempted, 4 blocks
    free, and r4 (1 block + 1 + the 2 that r0 and r1 grow by next) goes at once."""
    reqs = Requests(np.zeros(5), np.array([16, 16, 16, 1, 1]), np.array([30, 20, 20, 50, 50]))
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, ConstantCost(prefill_base_s=0.002), 8, 400),
            PoolSpec("decode", 1, ConstantCost(kv_capacity_tokens=128), 4, 400),
        ),
        block_tokens=16,
        kv_admission="on_demand",
    )
    raw = _check_choices((reqs, cfg, 0.0), "least_tokens", "least_committed_kv", 1)
    assert raw.log.num_preemptions.tolist() == [0, 0, 1, 1, 0]
    assert raw.log.transfer_start_at_s[4] == pytest.approx(0.002 + 15 * 0.010, abs=1e-12)


def _visit(order: list[int], pos: int) -> bool:
    order.append(pos)
    return False  # go on: every key is walked


def test_a_rising_heap_gives_the_smallest_key():
    """_Rising, told only of keys that fell, gives the smallest key and walks the keys in
    order, whatever the keys did: rose, fell, left the index, came back."""
    rng = random.Random(11)
    for n in (1, 2, 3, 7, 40):
        heap = _Rising(n)
        keys: list[int | None] = [None] * n
        for _ in range(3_000):
            pos = rng.randrange(n)
            old = keys[pos]
            match rng.random():
                case r if r < 0.1:
                    key = None
                case r if r < 0.5 and old is not None:  # rises, as a booking or growth
                    key = old + rng.randint(0, 5) * n
                case r if r < 0.8 and old is not None:  # falls back
                    key = old - rng.randint(0, 5) * n
                case _:
                    key = rng.randint(-50, 50) * n + pos
            keys[pos] = key
            if key is not None and old is not None and key > old and rng.random() < 0.5:
                heap.keys[pos] = key  # as the router books: a key that rises, inline
            else:
                heap.set(pos, key)
            indexed = sorted(k for k in keys if k is not None)
            assert heap.top() == (indexed[0] if indexed else None)
            if rng.random() < 0.2:  # the walk: each key in order, the heap kept
                order: list[int] = []
                heap.first(list(range(n)), partial(_visit, order))
                assert order == [k % n for k in indexed]
                assert heap.top() == (indexed[0] if indexed else None)


def test_gap_percentiles_by_weight_are_the_sorted_weighted_percentiles():
    """The fleet's gap distribution is kept grouped by weight and searched by bisection;
    every percentile equals the inverted-CDF percentile of the whole sorted multiset."""
    from disaggsim.metrics.reconstruct import GapDistribution, weighted_percentile

    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 400))
        values = np.round(rng.exponential(0.02, n), int(rng.integers(2, 7)))  # with ties
        if rng.random() < 0.3:
            values -= 0.01  # negative values order too (not expected from the engine)
        weights = rng.integers(0, 9, n)
        if not (weights > 0).any():
            weights[0] = 1
        dist = GapDistribution.from_pairs(values, weights)
        assert dist.count == int(weights.sum())
        assert dist.max_s() == values[weights > 0].max()
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
            assert dist.percentile(q) == weighted_percentile(values, weights, q), q
