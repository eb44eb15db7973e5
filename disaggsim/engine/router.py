"""The router: admission, back-pressure, and the choice of prefill and decode workers.

A request (new, or back for a re-prefill) enters :meth:`Router.admit`. It goes to a
prefill (or colocated) worker chosen by the prefill policy, unless no worker takes work
or, with ``kv_aware`` back-pressure, the decode pool cannot promise room for its longest
KV (prompt + ``max_tokens``) beyond what is promised to requests already in prefill:
then it waits at the router, FIFO. A finished prefill is handed to a decode worker chosen
by the decode policy among those with room (:meth:`Router.handoff`); with none, it waits
holding its KV on the prefill worker (orphaned KV) until a decode worker frees blocks.

Policies are small classes, one method each, selected with one ``match`` on the
validated literal of :class:`disaggsim.engine.config.EngineConfig` (an unknown policy
cannot get here). Ties are broken by worker index, never at random.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import simpy

from disaggsim.engine.config import DecodePolicy, PrefillPolicy
from disaggsim.engine.records import RouterSamples
from disaggsim.engine.request_state import RequestState

if TYPE_CHECKING:
    from disaggsim.engine.handoff import Handoff
    from disaggsim.engine.workers import ColocatedWorker, DecodeWorker, PrefillWorker

    FrontWorker = PrefillWorker | ColocatedWorker


# -- prefill choice -------------------------------------------------------------------------


class PrefillChoice(Protocol):
    def choose(self, workers: Sequence[FrontWorker]) -> FrontWorker:
        """One of ``workers`` (all accepting work, at least one)."""
        ...


class RoundRobin:
    """Each accepting worker in turn (the turn counts admissions, not workers)."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, workers: Sequence[FrontWorker]) -> FrontWorker:
        w = workers[self._next % len(workers)]
        self._next += 1
        return w


class LeastTokens:
    """Fewest prompt tokens queued, then fewest requests outstanding, then index."""

    def choose(self, workers: Sequence[FrontWorker]) -> FrontWorker:
        return min(workers, key=lambda x: (x.queued_tokens, x.num_outstanding, x.index))


class ShortestQueue:
    """Fewest requests outstanding, then index."""

    def choose(self, workers: Sequence[FrontWorker]) -> FrontWorker:
        return min(workers, key=lambda x: (x.num_outstanding, x.index))


def prefill_choice(policy: PrefillPolicy) -> PrefillChoice:
    match policy:
        case "round_robin":
            return RoundRobin()
        case "least_tokens":
            return LeastTokens()
        case "shortest_queue":
            return ShortestQueue()
    raise ValueError(f"prefill_policy: {policy!r}")  # unreachable: EngineConfig checks it


# -- decode choice ----------------------------------------------------------------------


class DecodeChoice(Protocol):
    def choose(self, workers: Sequence[DecodeWorker], src: PrefillWorker) -> DecodeWorker:
        """One of ``workers`` (all with room for the request, at least one) for a
        handoff from ``src``."""
        ...


class MostFreeKv:
    """Most free KV blocks, then lowest index."""

    def choose(self, workers: Sequence[DecodeWorker], src: PrefillWorker) -> DecodeWorker:
        return max(workers, key=lambda x: (x.free_blocks, -x.index))


class RoundRobinDecode:
    """The next decode worker (by index, cyclically) after the last one chosen."""

    def __init__(self, num_workers: int) -> None:
        self._n = num_workers
        self._next = 0

    def choose(self, workers: Sequence[DecodeWorker], src: PrefillWorker) -> DecodeWorker:
        n = self._n
        w = min(workers, key=lambda x: (x.index - self._next) % n)
        self._next = (w.index + 1) % n
        return w


class FastestPath:
    """Topology fabric: the fastest path kind (NVLink, PCIe peer, RDMA, staged), then the
    least loaded path, then most free KV, then index."""

    def __init__(self, handoff: Handoff) -> None:
        self._handoff = handoff

    def choose(self, workers: Sequence[DecodeWorker], src: PrefillWorker) -> DecodeWorker:
        rank = self._handoff.path_rank_and_load
        return min(workers, key=lambda x: (*rank(src.index, x.index), -x.free_blocks, x.index))


def decode_choice(policy: DecodePolicy, num_workers: int, handoff: Handoff) -> DecodeChoice:
    match policy:
        case "most_free_kv":
            return MostFreeKv()
        case "round_robin":
            return RoundRobinDecode(num_workers)
        case "fastest_path":
            # without a topology every path is alike: most free KV
            return FastestPath(handoff) if handoff.net is not None else MostFreeKv()
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
    ) -> None:
        self.env = env
        self.requests = requests
        self.front_workers = front_workers
        self.decode_workers = decode_workers
        self.handoff_fabric = handoff
        self.samples = samples
        self.kv_aware = kv_aware
        self.prefill = prefill_choice(prefill_policy)
        self.decode = decode_choice(decode_policy, len(decode_workers), handoff)
        self.queue: deque[int] = deque()  # held at the router (back-pressure / no worker)
        self.committed: dict[int, int] = {}  # admitted to prefill, decode blocks promised
        self.committed_blocks = 0
        self.pending: deque[int] = deque()  # prefilled, waiting for decode KV room
        self._pending_src: dict[int, PrefillWorker] = {}
        self.orphaned_bytes = 0

    # -- front: arrivals and re-prefills ------------------------------------------------

    def admit(self, rid: int) -> None:
        """A request (new, or back for a re-prefill) enters the router."""
        if self.queue or not self._try_route(rid):
            self.queue.append(rid)
            self.sample()

    def _decode_room_blocks(self) -> int:
        """Blocks the decode pool can still promise: capacity less the watermark, less
        what its assigned sequences may hold at their longest, less what is promised to
        requests still in prefill."""
        room = sum(
            max(0, w.kv_capacity_blocks - w.watermark_blocks - w.eventual_blocks)
            for w in self.decode_workers
            if w.accepting
        )
        return room - self.committed_blocks

    def _try_route(self, rid: int) -> bool:
        workers = [w for w in self.front_workers if w.accepting]
        if not workers:
            return False
        if self.kv_aware:
            need = self.requests.full_blocks(rid)
            if need > self._decode_room_blocks():
                return False
            self.committed[rid] = need
            self.committed_blocks += need
        self.prefill.choose(workers).submit(rid)
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
        blocks = self.committed.pop(rid, None)
        if blocks is not None:
            self.committed_blocks -= blocks

    def waiting_for_prefill(self) -> int:
        return len(self.queue) + sum(len(w.queue) for w in self.front_workers)

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
        workers = [w for w in self.decode_workers if w.can_accept(rid)]
        if not workers:
            return False
        w = self.decode.choose(workers, src)
        self.uncommit(rid)
        w.reserve(rid)
        self.handoff_fabric.start_transfer(rid, src, w, prefill_s)
        return True

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
        s.at_s.append(self.env.now)
        s.queue_len.append(len(self.queue))
        s.orphaned_kv_bytes.append(self.orphaned_bytes)
