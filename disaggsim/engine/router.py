"""The router: admission, back-pressure, and the choice of prefill and decode workers.

A request (new, or back for a re-prefill) enters :meth:`Router.admit`. It goes to a
prefill (or colocated) worker chosen by the prefill policy, unless no worker takes work
or, with ``kv_aware`` back-pressure, no single decode worker can promise room for its
longest KV (prompt + ``max_tokens``) beyond what it already holds at full length and what
is promised to requests already in prefill: then it waits at the router, FIFO. Admission
promises the room on one decode worker, the one with the most room (a request is decoded
on one worker, so one worker's room is what matters, not the pool's sum). A finished
prefill is handed to a decode worker chosen by the decode policy among those with room
(:meth:`Router.handoff`), with ``kv_aware`` among those that keep its promise (its own
promised worker, or one with as much room left); with none, it waits holding its KV on the
prefill worker (orphaned KV) until a decode worker frees blocks.

Policies are small classes, one method each, selected with one ``match`` on the
validated literal of :class:`disaggsim.engine.config.EngineConfig` (an unknown policy
cannot get here). Ties are broken by worker index, never at random.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy as np
import simpy

from disaggsim.cache import cache_aware_costs, pick_lowest_cost, uncached_prompt_tokens
from disaggsim.engine.config import DecodePolicy, PrefillPolicy
from disaggsim.engine.records import RouterSamples
from disaggsim.engine.request_state import RequestState

if TYPE_CHECKING:
    from disaggsim.engine.handoff import Handoff
    from disaggsim.engine.prefix import PrefixCaches
    from disaggsim.engine.workers import ColocatedWorker, DecodeWorker, PrefillWorker, Worker

    FrontWorker = PrefillWorker | ColocatedWorker

W = TypeVar("W", bound="Worker")


# -- indexed workers -----------------------------------------------------------------------


class _Heap(Generic[W]):
    """Workers ordered by ``key`` (smallest first) in a binary heap with lazy
    invalidation: a worker whose key changed is pushed again under a new version, and
    entries whose version is not the worker's current one are dropped when they surface.
    Only accepting workers are in it. O(log W) per change and per look; a reported
    change that leaves the key as it was costs no heap operation."""

    def __init__(self, workers: Sequence[W], key: Callable[[W], tuple[float, ...]]) -> None:
        self._workers = workers
        self._key = key
        self._version = [0] * len(workers)
        # the key of each worker's valid entry (None: no valid entry, not accepting)
        self._keys: list[tuple[float, ...] | None] = [None] * len(workers)
        self._heap: list[tuple[tuple[float, ...], int, int]] = []
        self._max_entries = 4 * len(workers) + 64  # more: too many stale entries

    def update(self, pos: int, _accepting_changed: bool = False) -> None:
        """Worker ``pos`` changed: index it under its current key (if accepting)."""
        w = self._workers[pos]
        key = self._key(w) if w.accepting else None
        keys = self._keys
        if key == keys[pos]:
            return  # its valid entry (or its absence) stands
        keys[pos] = key
        version = self._version[pos] + 1
        self._version[pos] = version
        if key is not None:
            heappush(self._heap, (key, version, pos))
        if len(self._heap) > self._max_entries:  # too many stale entries
            self._heap = [e for e in self._heap if e[1] == self._version[e[2]]]
            heapify(self._heap)

    def _valid(self, entry: tuple[tuple[float, ...], int, int]) -> bool:
        return entry[1] == self._version[entry[2]]

    def top(self) -> W | None:
        heap = self._heap
        version = self._version
        while heap:
            entry = heap[0]
            if entry[1] == version[entry[2]]:  # _valid
                return self._workers[entry[2]]
            heappop(heap)
        return None

    def first(self, take: Callable[[W], bool | None]) -> W | None:
        """The first worker, in key order, for which ``take`` is True; ``take``
        returning None stops the search (no later worker can qualify)."""
        heap = self._heap
        version = self._version
        while heap and heap[0][1] != version[heap[0][2]]:
            heappop(heap)  # stale
        if not heap:
            return None
        w = self._workers[heap[0][2]]
        verdict = take(w)
        if verdict:  # the common case: the top, no heap operation
            return w
        if verdict is None:
            return None
        seen = [heappop(heap)]
        found: W | None = None
        while heap:
            entry = heappop(heap)
            if entry[1] != version[entry[2]]:
                continue
            seen.append(entry)
            w = self._workers[entry[2]]
            verdict = take(w)
            if verdict:
                found = w
                break
            if verdict is None:
                break
        for entry in seen:
            heappush(heap, entry)
        return found


class _Rising:
    """Workers ordered by one int key each (smallest first), ``key = value x n + pos``
    (``n`` workers, ``pos`` a worker's position: ties of value to the lower position), in
    a binary heap of plain ints that is told only of keys that fell.

    ``keys[pos]`` is worker ``pos``'s key (None: not indexed). The heap holds, for every
    indexed worker, an entry no larger than its key (its *floor*, ``floor[pos]``, is one
    such entry): a key that rises (a worker with more blocks in use, or less room to
    promise) costs no heap operation; the worker's old entry is replaced by its key
    where it surfaces at the top (one ``heapreplace``), so the top, once it equals its
    worker's key, is the smallest key: the same worker a heap of exact keys gives. A key
    that falls below its floor is pushed. Entries of workers no longer indexed, or above
    their key, are dropped where they surface."""

    __slots__ = ("floor", "heap", "keys", "max_entries", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys: list[int | None] = [None] * n
        self.floor: list[int | None] = [None] * n
        self.heap: list[int] = []
        self.max_entries = 4 * n + 64  # more: too many stale entries

    def set(self, pos: int, key: int | None) -> None:
        """Worker ``pos`` is indexed under ``key`` now (None: not indexed)."""
        self.keys[pos] = key
        if key is None:
            self.floor[pos] = None  # its entries are dropped where they surface
            return
        low = self.floor[pos]
        if low is None or key < low:
            self.floor[pos] = key
            heappush(self.heap, key)
            if len(self.heap) > self.max_entries:
                self.compact()

    def top(self) -> int | None:
        """The smallest key (its worker: ``key % n``), or None when none is indexed."""
        heap, keys, n = self.heap, self.keys, self.n
        while heap:
            entry = heap[0]
            key = keys[entry % n]
            if key == entry:
                return entry
            if key is None or key < entry:
                heappop(heap)  # not indexed, or a stale entry above its key
            else:  # the worker's key rose since: its entry, moved to where it is now
                heapreplace(heap, key)
                self.floor[entry % n] = key
        return None

    def first(self, workers: Sequence[W], take: Callable[[W], bool | None]) -> W | None:
        """The first of ``workers`` (by position), in key order, for which ``take`` is
        True; ``take`` returning None stops the search (no later worker can qualify)."""
        heap, keys, n = self.heap, self.keys, self.n
        seen: list[int] = []
        found: W | None = None
        while heap:
            entry = heappop(heap)
            pos = entry % n
            key = keys[pos]
            if key != entry:
                if key is not None and key > entry:  # risen: back where it is now
                    heappush(heap, key)
                    self.floor[pos] = key
                continue
            if seen and seen[-1] == entry:
                continue  # a copy (equal entries surface together): one is kept
            seen.append(entry)
            w = workers[pos]
            verdict = take(w)
            if verdict:
                found = w
                break
            if verdict is None:
                break
        for entry in seen:
            heappush(heap, entry)
        return found

    def compact(self) -> None:
        """Each indexed key once (a sorted list is a heap), in place."""
        self.heap[:] = sorted(k for k in self.keys if k is not None)
        self.floor[:] = self.keys


# -- prefill choice -------------------------------------------------------------------------


class PrefillChoice(Protocol):
    """Picks a prefill (or colocated) worker among those accepting work. ``update`` is
    told each worker whose routing quantities changed, before each choice."""

    def update(self, pos: int, accepting_changed: bool) -> None: ...

    def choose(self, rid: int) -> FrontWorker:
        """One accepting worker for request ``rid`` (the router checks there is one)."""
        ...


class RoundRobin:
    """Each accepting worker in turn (the turn counts admissions, not workers)."""

    def __init__(self, workers: Sequence[FrontWorker]) -> None:
        self._workers = workers
        self._next = 0
        self._accepting: list[int] = []  # positions of accepting workers, in order
        self._stale = True

    def update(self, pos: int, accepting_changed: bool) -> None:
        if accepting_changed:
            self._stale = True

    def choose(self, rid: int) -> FrontWorker:
        if self._stale:
            self._accepting = [i for i, w in enumerate(self._workers) if w.accepting]
            self._stale = False
        w = self._workers[self._accepting[self._next % len(self._accepting)]]
        self._next += 1
        return w


class _ByKey:
    """Accepting workers in a :class:`_Rising` heap by one int key, smallest first:
    ``(queued tokens x tokens_weight + outstanding requests) x W + position`` (the
    workers are in index order; the router refreshes it inline, as :meth:`update`)."""

    # the weight of a worker's queued prompt tokens in its key: above any number of
    # requests outstanding on one worker (they stay below 2**32), or 0
    tokens_weight: int

    def __init__(self, workers: Sequence[FrontWorker]) -> None:
        indices = [w.index for w in workers]
        assert indices == sorted(indices), "positions order the workers as their index"
        self._workers = workers
        self.index = _Rising(len(workers))

    def update(self, pos: int, accepting_changed: bool = False) -> None:
        w = self._workers[pos]
        idx = self.index
        key = (w._queued_tokens * self.tokens_weight + w._num_outstanding) * idx.n + pos
        idx.set(pos, key if w.accepting else None)

    def choose(self, rid: int) -> FrontWorker:
        key = self.index.top()
        assert key is not None
        return self._workers[key % self.index.n]


class LeastTokens(_ByKey):
    """Fewest prompt tokens queued, then fewest requests outstanding, then index."""

    tokens_weight = 1 << 32


class ShortestQueue(_ByKey):
    """Fewest requests outstanding, then index."""

    tokens_weight = 0


class CacheAware:
    """NVIDIA Dynamo's KV-router cost (``docs/prefix-caching.md``, "Cache-aware
    routing"): ``overlap_weight × (queued + L − overlap) + active + L`` in tokens, lowest
    wins, ties to the lowest index. ``overlap`` is the request's prefix cached in the
    worker's HBM (the pool's :class:`~disaggsim.cache.OverlapIndex`), ``queued`` the
    prompt tokens routed there and not yet prefilled, ``active`` the KV its requests
    hold. Only the workers holding the chain's first block are scored from the index;
    of all the others the best is the top of a heap keyed by ``overlap_weight × queued +
    active`` (their overlap is 0), so a decision does not scan the pool."""

    def __init__(self, workers: Sequence[FrontWorker], caches: PrefixCaches) -> None:
        self._workers = workers
        self._caches = caches
        self._weight = caches.cfg.routing.overlap_weight
        self._pos = {w.index: i for i, w in enumerate(workers)}
        self._heap = _Heap(workers, self.key)

    def key(self, w: FrontWorker) -> tuple[float, int]:
        return (self._weight * w.queued_tokens + w.kv_used_tokens, w.index)

    def update(self, pos: int, accepting_changed: bool) -> None:
        self._heap.update(pos)

    def choose(self, rid: int) -> FrontWorker:
        return self.choose_booked(rid)[0]

    def choose_booked(self, rid: int) -> tuple[FrontWorker, int]:
        """The chosen worker and the tokens to book in its queue: the prompt tokens its
        HBM does not hold (:func:`~disaggsim.cache.uncached_prompt_tokens` of its
        overlap) plus, for a re-prefill, the reply tokens it recomputes."""
        caches = self._caches
        prompt = caches.prompt_tokens(rid)
        overlaps = caches.index.overlaps(caches.chain(rid), prompt, caches.block_tokens)
        ids: list[int] = []
        overlap: list[int] = []
        queued: list[int] = []
        active: list[int] = []
        for wid, ov in overlaps.items():
            w = self._workers[self._pos[wid]]
            if w.accepting:
                ids.append(wid)
                overlap.append(ov)
                queued.append(w.queued_tokens)
                active.append(w.kv_used_tokens)
        other = self._heap.first(lambda w: w.index not in overlaps)
        if other is not None:
            ids.append(other.index)
            overlap.append(0)
            queued.append(other.queued_tokens)
            active.append(other.kv_used_tokens)
        costs = cache_aware_costs(
            np.array(overlap), np.array(queued), np.array(active), prompt, self._weight
        )
        wid = pick_lowest_cost(costs, ids)
        w = self._workers[self._pos[wid]]
        extra = w.requests.prefill_len(rid) - prompt  # a re-prefill's reply so far
        return w, uncached_prompt_tokens(prompt, overlap[ids.index(wid)]) + extra


def prefill_choice(
    policy: PrefillPolicy, workers: Sequence[FrontWorker], caches: PrefixCaches | None = None
) -> PrefillChoice:
    match policy:
        case "round_robin":
            return RoundRobin(workers)
        case "least_tokens":
            return LeastTokens(workers)
        case "shortest_queue":
            return ShortestQueue(workers)
        case "cache_aware":
            assert caches is not None  # EngineConfig checks a cache is configured
            return CacheAware(workers, caches)
    raise ValueError(f"prefill_policy: {policy!r}")  # unreachable: EngineConfig checks it


# -- decode choice ----------------------------------------------------------------------


# kv_aware: whether a decode worker may take a request without breaking a promise
Keeps = Callable[["DecodeWorker"], bool]


class DecodeChoice(Protocol):
    """Picks a decode worker with room for a handoff needing ``need`` blocks
    (:meth:`DecodeWorker.room_blocks`) for which ``keeps`` (when given) is True, or None
    when none has room."""

    def update(self, pos: int) -> None: ...

    def choose(
        self, need: int, src: PrefillWorker, keeps: Keeps | None = None
    ) -> DecodeWorker | None: ...


class MostFreeKv:
    """Most free KV blocks, then lowest index. Workers are kept in a :class:`_Rising`
    heap by free blocks (key ``(used - capacity) x W + position``: blocks in use rise
    with every step's growth and cost no heap operation; the decode workers are in
    index order); the search walks it from the top and stops at the first with room, or
    where even a worker's free blocks (less the smallest watermark and one block) fall
    short."""

    def __init__(self, workers: Sequence[DecodeWorker]) -> None:
        self._workers = workers
        self.index = _Rising(len(workers))
        self.min_watermark = min((w.watermark_blocks for w in workers), default=0)

    def update(self, pos: int) -> None:
        w = self._workers[pos]
        idx = self.index
        idx.set(
            pos, (w._kv_used_blocks - w.kv_capacity_blocks) * idx.n + pos if w.accepting else None
        )

    def choose(
        self, need: int, src: PrefillWorker, keeps: Keeps | None = None
    ) -> DecodeWorker | None:
        idx = self.index
        key = idx.top()
        if key is None:
            return None
        top = self._workers[key % idx.n]
        if top.room_blocks() >= need and (keeps is None or keeps(top)):
            return top  # the common case: the most free KV has room
        slack = 1 + self.min_watermark

        def take(w: DecodeWorker) -> bool | None:
            if w.room_blocks() >= need and (keeps is None or keeps(w)):
                return True
            return False if w.free_blocks - slack >= need else None

        return idx.first(self._workers, take)


def _seats_full(w: DecodeWorker) -> bool:
    """Every batch seat of ``w`` (``max_batch_seqs``) is taken or spoken for: by a
    sequence running, swapped out, waiting for a seat, or whose KV is arriving."""
    return w._num_outstanding >= w.max_batch_seqs


# the weight of "seats full" in least_committed_kv's key: above any committed KV
# (blocks stay far below it)
_SEATS_FULL = 1 << 48


class LeastCommittedKv:
    """The least committed worker (the least KV committed among the workers with a free
    batch seat, then lowest index) when it has room for the handoff (and, with
    ``kv_aware``, keeps its promise); else the most free KV with room, one with a free
    seat first. A worker's committed KV is what its sequences may hold at their longest
    (prompt + ``max_tokens``: running, swapped out, waiting for a seat, KV arriving), less
    its capacity; its seats are full (:func:`_seats_full`) when it holds
    ``max_batch_seqs`` sequences, and then it comes after every worker with a seat.

    A handoff counts in full on its worker the moment it is sent. Free KV
    (:class:`MostFreeKv`) does not: a young sequence holds only its prompt, so on fixed
    lengths a worker whose cohort just finished has the most free KV and takes every
    handoff for seconds, its batch swinging against the others' (and filling its seats
    while another worker has some). Committed KV evens out handoff by handoff on fixed
    lengths (the count of sequences) and on varied ones (their longest KV, which the
    attention step and the KV memory grow with).

    Workers are kept in a :class:`_Rising` heap by that key (a handoff raises a key at no
    heap cost; a finished sequence lowers it, one push) beside a :class:`MostFreeKv`. The
    top is taken when it fits (the common case: one worker looked at). Else the most free
    KV that fits, one with a free seat first: the walk of the free-KV heap stops where
    free blocks fall short, as :class:`MostFreeKv`'s does. (Walking on in committed order
    instead was tried: on the crowded pools of ``tests/test_router_index.py``, each of
    the 28 times the next least committed worker had room, it was this choice too.)"""

    def __init__(self, workers: Sequence[DecodeWorker]) -> None:
        self._workers = workers
        self.index = _Rising(len(workers))
        self.free = MostFreeKv(workers)

    @staticmethod
    def load(w: DecodeWorker) -> int:
        """``w``'s key less its position, divided by the number of workers."""
        full = w._num_outstanding >= w.max_batch_seqs  # _seats_full
        return full * _SEATS_FULL + w._eventual_blocks - w.kv_capacity_blocks

    def update(self, pos: int) -> None:
        w = self._workers[pos]
        idx = self.index
        idx.set(pos, self.load(w) * idx.n + pos if w.accepting else None)
        self.free.update(pos)

    def choose(
        self, need: int, src: PrefillWorker, keeps: Keeps | None = None
    ) -> DecodeWorker | None:
        idx = self.index
        key = idx.top()
        if key is None:
            return None
        top = self._workers[key % idx.n]
        if top.room_blocks() >= need and (keeps is None or keeps(top)):
            return top  # the common case: the least committed has room
        # one walk of the free-KV heap from the top: the first worker with room and a free
        # seat, else the first with room (a seat is no use preferring when the least
        # committed worker's seats are full: then every worker's are)
        prefer_seat = not _seats_full(top)
        slack = 1 + self.free.min_watermark
        unseated: DecodeWorker | None = None

        def take(w: DecodeWorker) -> bool | None:
            nonlocal unseated
            if w.room_blocks() >= need and (keeps is None or keeps(w)):
                if not prefer_seat or not _seats_full(w):
                    return True
                if unseated is None:
                    unseated = w
                return False
            return False if w.free_blocks - slack >= need else None

        found = self.free.index.first(self._workers, take)
        return found if found is not None else unseated


class RoundRobinDecode:
    """The next decode worker (by index, cyclically) with room, after the last one
    chosen."""

    def __init__(self, workers: Sequence[DecodeWorker]) -> None:
        self._workers = workers
        self._next = 0

    def update(self, pos: int) -> None:
        pass

    def choose(
        self, need: int, src: PrefillWorker, keeps: Keeps | None = None
    ) -> DecodeWorker | None:
        workers = self._workers
        n = len(workers)
        if n == 0:
            return None
        # cyclic order of (index - next) mod n, indices being global worker indices
        start = (self._next - workers[0].index) % n
        for k in range(n):
            w = workers[(start + k) % n]
            if w.room_blocks() >= need and (keeps is None or keeps(w)):
                self._next = (w.index + 1) % n
                return w
        return None


class FastestPath:
    """Topology fabric: the fastest path kind (NVLink, PCIe peer, RDMA, staged), then the
    least loaded path, then most free KV, then index. Path loads change with every flow,
    so this policy scans the decode workers (O(W) per handoff)."""

    def __init__(self, workers: Sequence[DecodeWorker], handoff: Handoff) -> None:
        self._workers = workers
        self._handoff = handoff

    def update(self, pos: int) -> None:
        pass

    def choose(
        self, need: int, src: PrefillWorker, keeps: Keeps | None = None
    ) -> DecodeWorker | None:
        rank = self._handoff.path_rank_and_load
        fits = [w for w in self._workers if w.room_blocks() >= need and (keeps is None or keeps(w))]
        if not fits:
            return None
        return min(fits, key=lambda x: (*rank(src.index, x.index), -x.free_blocks, x.index))


def decode_choice(
    policy: DecodePolicy, workers: Sequence[DecodeWorker], handoff: Handoff
) -> DecodeChoice:
    match policy:
        case "most_free_kv":
            return MostFreeKv(workers)
        case "least_committed_kv":
            return LeastCommittedKv(workers)
        case "round_robin":
            return RoundRobinDecode(workers)
        case "fastest_path":
            # without a topology every path is alike: most free KV
            return FastestPath(workers, handoff) if handoff.net is not None else MostFreeKv(workers)
    raise ValueError(f"decode_policy: {policy!r}")  # unreachable: EngineConfig checks it


# -- the router --------------------------------------------------------------------------


class Router:
    """Routes arrivals to prefill (or colocated) workers, and finished prefills to
    decode workers."""

    def __init__(
        self,
        env: simpy.Environment,
        requests: RequestState,
        front_workers: Sequence[FrontWorker],
        decode_workers: Sequence[DecodeWorker],
        handoff: Handoff,
        samples: RouterSamples,
        *,
        prefill_policy: PrefillPolicy,
        decode_policy: DecodePolicy,
        kv_aware: bool,
        caches: PrefixCaches | None = None,
        count_queued: bool = True,
    ) -> None:
        self.env = env
        self.requests = requests
        self.front_workers = front_workers
        self.decode_workers = decode_workers
        self.handoff_fabric = handoff
        self.samples = samples
        self.kv_aware = kv_aware
        self.caches = caches
        # whether the refresh keeps the total queued at the front workers
        # (waiting_for_prefill: a bounded router queue; two lines per change otherwise)
        self.count_queued = count_queued
        self._prefill_policy = prefill_policy
        self._decode_policy = decode_policy
        self.queue: deque[int] = deque()  # held at the router (back-pressure / no worker)
        # kv_aware: admitted to prefill -> (position of the decode worker promising its
        # room, the blocks promised: its full length)
        self.committed: dict[int, tuple[int, int]] = {}
        self.pending: deque[int] = deque()  # prefilled, waiting for decode KV room
        self._pending_src: dict[int, PrefillWorker] = {}
        self.orphaned_bytes = 0

    def attach(self) -> None:
        """Index the workers (once every pool is built): each reports its changes here."""
        self.prefill = prefill_choice(self._prefill_policy, self.front_workers, self.caches)
        self._cache_aware = self.prefill if isinstance(self.prefill, CacheAware) else None
        # least_tokens' or shortest_queue's heap, refreshed and read inline here
        self._by_key = self.prefill if isinstance(self.prefill, _ByKey) else None
        self.decode = decode_choice(self._decode_policy, self.decode_workers, self.handoff_fabric)
        self._front_changes: set[int] = set()
        self._decode_changes: set[int] = set()
        # each worker's position in its pool's list, by global worker index (-1: another
        # pool's; a list index costs less than a dict lookup, twice per change)
        indices = [w.index for w in self.front_workers] + [w.index for w in self.decode_workers]
        num_workers = 1 + max(indices, default=-1)
        self._front_pos = [-1] * num_workers
        for i, fw in enumerate(self.front_workers):
            self._front_pos[fw.index] = i
        self._decode_pos = [-1] * num_workers
        for i, dw in enumerate(self.decode_workers):
            self._decode_pos[dw.index] = i
        self._front_accepting = [False] * len(self.front_workers)
        self._num_front_accepting = 0
        # requests queued at the front workers, kept per worker and in total (a queue
        # changes only with its worker's queued tokens, which report the change)
        self._front_queued = [0] * len(self.front_workers)
        self._front_queued_total = 0
        # kv_aware: the blocks promised on each decode worker to requests in prefill,
        # and the accepting decode workers in a _Rising heap by the room they can still
        # promise, most first. A worker's key is shortfall x W + position (by shortfall,
        # then index: the decode workers are in index order), its shortfall
        # -promise_room_blocks = promised + eventual blocks + watermark + 1 - capacity
        # (the 1 is the block room_blocks keeps for a joining sequence's next step, so a
        # promised worker has room for the handoff itself). A booking raises the key
        # (no heap operation); a promise released or moved away lowers it, pushed only
        # below the worker's floor (a handoff that moves a promise off the worker it was
        # booked on, before any other look at the heap, puts that key back at its floor).
        self._promised = [0] * len(self.decode_workers)
        self._rooms = _Rising(len(self.decode_workers))
        # most_free_kv's heap, refreshed inline here (its update, without the call)
        self._most_free = self.decode.index if isinstance(self.decode, MostFreeKv) else None
        # least_committed_kv's two heaps (committed KV, free KV), refreshed inline too
        committed = self.decode if isinstance(self.decode, LeastCommittedKv) else None
        self._committed = committed.index if committed is not None else None
        self._free_heap = committed.free.index if committed is not None else self._most_free
        for w in self.front_workers:
            w.watch(self._front_changes)
        for dw in self.decode_workers:
            dw.watch(self._decode_changes)

    def _refresh(self) -> None:
        """Bring the indexes up to date with the workers that changed since the last
        decision (work per change, not per worker)."""
        self._refresh_front()
        self._refresh_decode()

    def _refresh_front(self) -> None:
        if self._front_changes:
            pos_of = self._front_pos
            workers = self.front_workers
            queued_of = self._front_queued
            accepting_of = self._front_accepting
            by_key = self._by_key  # _ByKey.update and _Rising.set, inline
            if by_key is not None:
                index = by_key.index
                keys, floor, heap, n = index.keys, index.floor, index.heap, index.n
                weight = by_key.tokens_weight
            else:
                update = self.prefill.update
            count_queued = self.count_queued
            for w_index in self._front_changes:
                pos = pos_of[w_index]
                w = workers[pos]
                if count_queued:
                    queued = len(w.queue)
                    self._front_queued_total += queued - queued_of[pos]
                    queued_of[pos] = queued
                now = w.accepting
                changed = now != accepting_of[pos]
                if changed:
                    accepting_of[pos] = now
                    self._num_front_accepting += 1 if now else -1
                if by_key is None:
                    update(pos, changed)
                elif now:
                    key = (w._queued_tokens * weight + w._num_outstanding) * n + pos
                    if key != keys[pos]:
                        keys[pos] = key
                        low = floor[pos]
                        if low is None or key < low:
                            floor[pos] = key
                            heappush(heap, key)
                            if len(heap) > index.max_entries:
                                index.compact()
                elif keys[pos] is not None:
                    index.set(pos, None)
            self._front_changes.clear()

    def _refresh_decode(self) -> None:
        if self._decode_changes:
            pos_of = self._decode_pos
            workers = self.decode_workers
            n = len(workers)
            free = self._free_heap  # MostFreeKv.update and _Rising.set, inline
            if free is not None:
                free_keys, free_floor, free_heap = free.keys, free.floor, free.heap
            else:
                update = self.decode.update
            held = self._committed  # LeastCommittedKv.update's own heap, inline
            if held is not None:
                held_keys, held_floor, held_heap = held.keys, held.floor, held.heap
            rooms = self._rooms if self.kv_aware else None
            if rooms is not None:
                promised = self._promised
                room_keys, room_floor, room_heap = rooms.keys, rooms.floor, rooms.heap
            for index in self._decode_changes:
                pos = pos_of[index]
                w = workers[pos]
                if not w.accepting:
                    if free is None:
                        update(pos)
                    elif free_keys[pos] is not None:
                        free.set(pos, None)
                    if held is not None and held_keys[pos] is not None:
                        held.set(pos, None)
                    if rooms is not None and room_keys[pos] is not None:
                        rooms.set(pos, None)
                    continue
                if free is None:
                    update(pos)
                else:
                    key = (w._kv_used_blocks - w.kv_capacity_blocks) * n + pos
                    if key != free_keys[pos]:
                        free_keys[pos] = key
                        low = free_floor[pos]
                        if low is None or key < low:
                            free_floor[pos] = key
                            heappush(free_heap, key)
                            if len(free_heap) > free.max_entries:
                                free.compact()
                if held is not None:  # LeastCommittedKv.load x W + pos
                    key = (
                        (w._num_outstanding >= w.max_batch_seqs) * _SEATS_FULL
                        + w._eventual_blocks
                        - w.kv_capacity_blocks
                    ) * n + pos
                    if key != held_keys[pos]:
                        held_keys[pos] = key
                        low = held_floor[pos]
                        if low is None or key < low:
                            held_floor[pos] = key
                            heappush(held_heap, key)
                            if len(held_heap) > held.max_entries:
                                held.compact()
                if rooms is not None:  # -promise_room_blocks(w) x W + pos
                    key = (
                        promised[pos]
                        + w._eventual_blocks
                        + w.watermark_blocks
                        + 1
                        - w.kv_capacity_blocks
                    ) * n + pos
                    if key != room_keys[pos]:
                        room_keys[pos] = key
                        low = room_floor[pos]
                        if low is None or key < low:
                            room_floor[pos] = key
                            heappush(room_heap, key)
                            if len(room_heap) > rooms.max_entries:
                                rooms.compact()
            self._decode_changes.clear()

    # -- front: arrivals and re-prefills ------------------------------------------------

    def admit(self, rid: int, tokens: int | None = None) -> None:
        """A request (new, or back for a re-prefill) enters the router (``tokens``: its
        prefill length when the caller has it, as an arrival does)."""
        if self.queue or not self._try_route(rid, tokens):
            self.queue.append(rid)
            self.sample()

    def promise_room_blocks(self, w: DecodeWorker) -> int:
        """Blocks decode worker ``w`` can still promise (kv_aware): its capacity less the
        watermark and one block, less what its assigned sequences may hold at their
        longest, less what is promised on it to requests still in prefill."""
        return (
            w.kv_capacity_blocks
            - w.watermark_blocks
            - 1
            - w._eventual_blocks
            - self._promised[self._decode_pos[w.index]]
        )

    def _try_route(self, rid: int, tokens: int | None = None) -> bool:
        if self._front_changes:
            self._refresh_front()
        if not self._num_front_accepting:
            return False
        if self.kv_aware:
            if self._decode_changes:
                self._refresh_decode()
            rs = self.requests
            # rs.promise_blocks(rid), its common case inline
            need = rs.longest_blocks[rid] if rs.reserve_tokens is None else rs.promise_blocks(rid)
            # the decode worker with the most room to promise: the smallest key
            rooms = self._rooms
            n = rooms.n
            heap = rooms.heap
            key = heap[0] if heap else None
            if key is None or rooms.keys[key % n] != key:  # else the top, as rooms.top() finds it
                key = rooms.top()
                if key is None:
                    return False
            pos = key % n
            if need > -((key - pos) // n):  # promise_room_blocks(that worker)
                return False
            self.committed[rid] = (pos, need)
            self._promised[pos] += need
            rooms.keys[pos] = key + need * n  # rooms.set: a key that rises, inline
        if self._cache_aware is not None:  # books the tokens the worker's HBM lacks
            w, tokens = self._cache_aware.choose_booked(rid)
            w.submit(rid, False, tokens)
        else:
            by_key = self._by_key
            if by_key is not None:  # by_key.choose, inline
                index = by_key.index
                heap = index.heap
                key = heap[0] if heap else None
                if key is None or index.keys[key % index.n] != key:  # else index.top()'s
                    key = index.top()
                    assert key is not None
                self.front_workers[key % index.n].submit(rid, False, tokens)
            else:
                self.prefill.choose(rid).submit(rid, False, tokens)
        return True

    def drain_queue(self) -> None:
        """Route the requests held here, in order, while the head can go."""
        changed = False
        while self.queue:
            rid = self.queue[0]
            if not self._try_route(rid):
                break
            self.queue.popleft()
            changed = True
        if changed:
            self.sample()

    def remove_queued(self, rid: int) -> bool:
        try:
            self.queue.remove(rid)
        except ValueError:
            return False
        self.sample()
        return True

    def uncommit(self, rid: int) -> None:
        """``rid`` no longer holds a promise of decode room (handed off, ended, or back
        to the router)."""
        entry = self.committed.pop(rid, None)
        if entry is not None:
            pos, blocks = entry
            self._promised[pos] -= blocks
            rooms = self._rooms
            key = rooms.keys[pos]
            if key is not None:  # indexed (accepting): its room grows
                rooms.set(pos, key - blocks * rooms.n)

    def held_for_decode(self) -> bool:
        """Whether the requests held here wait for decode room (kv_aware: a front worker
        takes work, but no decode worker can promise the head its full length), not for
        a prefill worker."""
        if not (self.kv_aware and self.queue):
            return False
        if self._front_changes:
            self._refresh_front()
        return self._num_front_accepting > 0

    def waiting_for_prefill(self) -> int:
        """Requests waiting for a prefill: held here, or queued at a front worker (from
        the running total: work per change, not per worker; only with ``count_queued``)."""
        assert self.count_queued, "the router was built without count_queued"
        self._refresh_front()
        return len(self.queue) + self._front_queued_total

    # -- back: handoffs to decode -----------------------------------------------------

    def handoff(self, rid: int, src: PrefillWorker) -> None:
        """``rid``'s prefill on ``src`` is done: send its KV to a decode worker, or hold
        it there until one has room."""
        if self.pending or not self._try_handoff(rid, src):
            self.pending.append(rid)
            self._pending_src[rid] = src
            self.orphaned_bytes += self.handoff_fabric.kv_bytes(rid, src)
            self.sample()

    def try_early_handoff(self, rid: int, src: PrefillWorker, prefill_s: float) -> bool:
        """Overlap: pick the decode worker as the prefill starts, so the KV can stream
        layer by layer. Only when no earlier prefill is waiting for a decode slot."""
        if self.pending:
            return False
        return self._try_handoff(rid, src, prefill_s)

    def _try_handoff(self, rid: int, src: PrefillWorker, prefill_s: float | None = None) -> bool:
        if self._decode_changes:
            self._refresh_decode()
        rs = self.requests
        if rs.reserve_full:  # rs.join_blocks
            need = rs.longest_blocks[rid]  # rs.full_blocks(rid)
        else:
            need = -(-(rs.prefilled_tokens[rid] + 1) // rs.block_tokens)
        if self.kv_aware:
            w = self._choose_promised(rid, need, src)
        else:
            w = self.decode.choose(need, src)
        if w is None:
            return False
        entry = self.committed.pop(rid, None)
        if entry is not None:
            pos, blocks = entry
            self._promised[pos] -= blocks
            if self.decode_workers[pos] is not w:  # the promise moves: uncommit's
                rooms = self._rooms
                key = rooms.keys[pos]
                if key is not None:
                    rooms.set(pos, key - blocks * rooms.n)
            # else its room is unchanged: the reservation's eventual blocks replace the
            # promise (the refresh after the reservation finds the same shortfall, or
            # one block more where a default cap's promise grew by the prefill's token)
        w.reserve(rid)
        self.handoff_fabric.start_transfer(rid, src, w, prefill_s)
        return True

    def _choose_promised(self, rid: int, need: int, src: PrefillWorker) -> DecodeWorker | None:
        """kv_aware: the decode policy's choice among the workers that keep ``rid``'s
        promise: the worker its room is promised on, or any other with as much room left
        to promise (the promise then moves there). Every promise stays one worker's: no
        worker ends up promising more than its capacity less the watermark. A request
        whose promised worker stopped taking work (failed, draining) before its handoff
        goes where its full length can still be promised, else where it fits today (the
        promise was lost with that worker: that worker may then be promised more than it
        holds, and preempt)."""
        entry = self.committed.get(rid)
        rs = self.requests
        # rs.promise_blocks(rid), its common case inline
        full = rs.longest_blocks[rid] if rs.reserve_tokens is None else rs.promise_blocks(rid)
        pos_of = self._decode_pos
        at = -1 if entry is None else entry[0]
        free = self._most_free
        if free is not None:  # most_free_kv's common case, as its choose, inline
            heap = free.heap
            key = heap[0] if heap else None
            if key is None or free.keys[key % free.n] != key:  # else free.top()'s
                key = free.top()
            if key is not None:
                pos = key % free.n
                top = self.decode_workers[pos]
                if top.room_blocks() >= need and (
                    pos == at  # keeps: its own promise, or room for it (promise_room_blocks)
                    or top.kv_capacity_blocks
                    - top.watermark_blocks
                    - 1
                    - top._eventual_blocks
                    - self._promised[pos]
                    >= full
                ):
                    return top
        room = self.promise_room_blocks

        def keeps(w: DecodeWorker) -> bool:
            return pos_of[w.index] == at or room(w) >= full

        w = self.decode.choose(need, src, keeps)
        if w is None and (entry is None or not self.decode_workers[at].accepting):
            w = self.decode.choose(need, src)  # the promise is lost: as without kv_aware
        return w

    def remove_pending(self, rid: int) -> PrefillWorker | None:
        src = self._pending_src.pop(rid, None)
        if src is not None:
            self.pending.remove(rid)
            self.orphaned_bytes -= self.handoff_fabric.kv_bytes(rid, src)
            self.sample()
        return src

    def decode_freed(self) -> None:
        """A decode worker has more room: send waiting handoffs, in order; with
        back-pressure, admit held requests the freed room can now promise."""
        changed = False
        while self.pending:
            rid = self.pending[0]
            src = self._pending_src[rid]
            if not self._try_handoff(rid, src):
                break
            self.pending.popleft()
            del self._pending_src[rid]
            self.orphaned_bytes -= self.handoff_fabric.kv_bytes(rid, src)
            changed = True
        if changed:
            self.sample()
        if self.kv_aware and self.queue:
            self.drain_queue()

    def sample(self) -> None:
        s = self.samples
        s.at_s.append(self.env._now)
        s.queue_len.append(len(self.queue))
        s.orphaned_kv_bytes.append(self.orphaned_bytes)
