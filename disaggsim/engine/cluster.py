"""The cluster: a SimPy environment with a router, worker pools and the KV fabric.

:func:`run_cluster` is the engine's entry point. It takes already-built parts (the
request table, a :class:`WorkerCost` per pool, the fabric's transfer-time function, the
failure schedule) and returns the raw records; it does no file I/O and reads no
configuration files.

Flow (DESIGN.md §2): arrival → router → prefill worker (or colocated worker) → KV handoff
over the fabric → decode worker → finish. The router picks the decode worker when a
prefill finishes, by free KV. Back-pressure (``kv_aware``): the router admits a request to
the prefill pool only when the decode pool has room for its longest KV (prompt +
``max_tokens``) beyond what is already
promised to requests in flight; otherwise it waits at the router. Without it (``none``),
finished prefills whose KV no decode worker can take wait on their prefill worker
(orphaned KV) and fill its memory.

Admission, routing and reservations plan on each request's ``max_tokens`` (what a real
router sees); its realised ``output_tokens`` only decides when generation stops. Every
request ends exactly once: completed, rejected (with a reason) or abandoned (client
timeout). Work lost to a failure sends the request back to the router (a retry); the
tokens already delivered stay delivered and the prompt plus those tokens is prefilled
again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from disaggsim.costmodel.interface import WorkerCost
from disaggsim.engine.records import (
    STATUS_ABANDONED,
    STATUS_COMPLETED,
    STATUS_REJECTED,
    RequestLog,
    RouterSamples,
    Samples,
    Segments,
    StepLog,
)
from disaggsim.engine.workers import ColocatedWorker, DecodeWorker, PrefillWorker, _Worker
from disaggsim.workload.requests import Requests


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the engine needs to know about one pool."""

    role: str  # "prefill", "decode" or "colocated"
    num_workers: int
    cost: WorkerCost
    max_batch_seqs: int
    max_batch_tokens: int
    scheduler: str | None = None  # colocated: "vllm" or "chunked"
    max_workers: int | None = None  # autoscaled: workers beyond num_workers start released


@dataclass(frozen=True, slots=True)
class WorkerFailureEvent:
    at_s: float
    worker: int  # global worker index (pools in order, workers in order)
    down_s: float  # until it serves again (repair + weights reload)


@dataclass(frozen=True, slots=True)
class LinkWindow:
    """The prefill→decode fabric runs at ``factor`` × its bandwidth (0: outage); on a
    topology fabric only ``links`` (indices into its links) when given."""

    start_s: float
    duration_s: float
    factor: float
    links: tuple[int, ...] | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


SwapTime = Callable[[WorkerCost, float, str], float]  # (cost, bytes, "in"|"out") -> s


def _default_swap_time(cost: WorkerCost, nbytes: float, direction: str) -> float:
    return 20e-6 + nbytes / cost.num_gpus / 25e9


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pools: tuple[PoolSpec, ...]
    prefill_policy: str = "least_tokens"  # round_robin | least_tokens | shortest_queue
    decode_policy: str = "most_free_kv"  # most_free_kv | round_robin
    first_token_from: str = "decode"  # disaggregated: "decode" or "prefill"
    block_tokens: int = 16
    kv_admission: str = "reserve_full"  # reserve_full | on_demand
    kv_watermark: float = 0.0  # share of a worker's blocks kept free when admitting
    preemption: str = "recompute"  # recompute | swap
    backpressure: str = "none"  # none | kv_aware
    max_queue: int | None = None  # most requests waiting for prefill; more are rejected
    client_timeout_s: float | None = None  # abandon if no first token by then
    worker_failures: tuple[WorkerFailureEvent, ...] = ()
    link_windows: tuple[LinkWindow, ...] = ()
    swap_time: SwapTime = _default_swap_time
    topology: Any = None  # disaggsim.fabric.Topology: shared links (else transfer_time)
    overlap: bool = False  # topology: stream KV layer by layer during the prefill
    num_layers: int = 1  # for the overlap's one-layer delay
    context_tokens: int | None = None  # prompt + max_tokens beyond it: exceeds_context
    autoscalers: tuple = ()  # (role, disaggsim.autoscale.Autoscaler, cold start s) per pool
    horizon_s: float = float("inf")  # stop here even if requests are still running


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    index: int
    role: str
    pool_index: int  # index within its pool
    num_gpus: int
    kv_capacity_tokens: int
    kv_used_end_tokens: int  # KV still held when the run stopped (0 once drained)
    num_failures: int
    steps: StepLog


@dataclass(frozen=True, slots=True)
class RawResult:
    """Everything the engine recorded; metrics are derived from it afterwards."""

    requests: Requests
    log: RequestLog
    segments: Segments
    workers: tuple[WorkerInfo, ...]
    samples: Samples
    router_samples: RouterSamples
    end_at_s: float
    kv_bytes_per_token: dict[str, int]  # per role
    counters: dict[str, int] = field(default_factory=dict)
    failures: tuple[tuple[float, int], ...] = ()  # (at_s, worker) of each worker failure
    transfers: tuple = ()  # disaggsim.fabric.TransferRecord per transfer (topology fabric)
    # (worker, role, gpus, allocated_at_s, released_at_s or inf) per GPU allocation
    allocations: tuple[tuple[int, str, int, float, float], ...] = ()
    # at, role, serving, starting, draining, desired, window TTFT p99, window ITL p99
    pool_sizes: tuple[tuple[float, str, int, int, int, int, float, float], ...] = ()
    scale_events: int = 0
    link_util: Any = None  # disaggsim.fabric.LinkUtilisation (topology fabric)


TransferTime = Callable[[int, int, int], float]  # (nbytes, prefill worker, decode worker) -> s


class Router:
    """Routes arrivals to prefill (or colocated) workers, and finished prefills to
    decode workers by free KV. Ties are broken by worker index."""

    def __init__(self, cluster: Cluster, cfg: EngineConfig) -> None:
        self.cluster = cluster
        self.prefill_policy = cfg.prefill_policy
        self.decode_policy = cfg.decode_policy
        self.kv_aware = cfg.backpressure == "kv_aware" and cluster.disaggregated
        self._rr_prefill = 0
        self._rr_decode = 0
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
        what its assigned sequences will hold at full length, less what is promised to
        requests still in prefill."""
        cl = self.cluster
        room = sum(
            max(0, w.kv_capacity_blocks - cl.watermark_blocks(w) - w.eventual_blocks)
            for w in cl.decode_workers
            if w.accepting
        )
        return room - self.committed_blocks

    def _try_route(self, rid: int) -> bool:
        cl = self.cluster
        workers = [w for w in cl.front_workers if w.accepting]
        if not workers:
            return False
        if self.kv_aware:
            need = cl.full_blocks(rid)
            if need > self._decode_room_blocks():
                return False
            self.committed[rid] = need
            self.committed_blocks += need
        if self.prefill_policy == "round_robin":
            w = workers[self._rr_prefill % len(workers)]
            self._rr_prefill += 1
        elif self.prefill_policy == "least_tokens":
            w = min(workers, key=lambda x: (x.queued_tokens, x.num_outstanding, x.index))
        else:  # shortest_queue
            w = min(workers, key=lambda x: (x.num_outstanding, x.index))
        w.submit(rid)
        return True

    def drain_queue(self) -> None:
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

    # -- back: handoffs to decode -----------------------------------------------------

    def handoff(self, rid: int, src: PrefillWorker) -> None:
        if self.pending or not self._try_handoff(rid, src):
            self.pending.append(rid)
            self._pending_src[rid] = src
            self.orphaned_bytes += self.cluster.kv_bytes(rid, src)
            self.sample()

    def try_early_handoff(self, rid: int, src: PrefillWorker, prefill_s: float) -> bool:
        """Overlap: pick the decode worker as the prefill starts, so the KV can stream
        layer by layer. Only when no earlier prefill is waiting for a decode slot."""
        if self.pending:
            return False
        return self._try_handoff(rid, src, prefill_s)

    def _try_handoff(self, rid: int, src: PrefillWorker, prefill_s: float | None = None) -> bool:
        cl = self.cluster
        workers = [w for w in cl.decode_workers if w.can_accept(rid)]
        if not workers:
            return False
        if self.decode_policy == "fastest_path" and cl.net is not None:
            topo, net = cl.topology, cl.net
            w = min(
                workers,
                key=lambda x: (
                    topo.path_rank(src.index, x.index),
                    net.path_load(topo.path(src.index, x.index)),
                    -x.free_blocks,
                    x.index,
                ),
            )
        elif self.decode_policy == "round_robin":
            n = len(cl.decode_workers)
            order = sorted(workers, key=lambda x: (x.index - self._rr_decode) % n)
            w = order[0]
            self._rr_decode = (w.index + 1) % n
        else:
            w = max(workers, key=lambda x: (x.free_blocks, -x.index))
        self.uncommit(rid)
        w.reserve(rid)
        cl.start_transfer(rid, src, w, prefill_s)
        return True

    def remove_pending(self, rid: int) -> PrefillWorker | None:
        src = self._pending_src.pop(rid, None)
        if src is not None:
            self.pending.remove(rid)
            self.orphaned_bytes -= self.cluster.kv_bytes(rid, src)
            self.sample()
        return src

    def decode_freed(self) -> None:
        changed = False
        while self.pending:
            rid = self.pending[0]
            src = self._pending_src[rid]
            if not self._try_handoff(rid, src):
                break
            self.pending.popleft()
            del self._pending_src[rid]
            self.orphaned_bytes -= self.cluster.kv_bytes(rid, src)
            changed = True
        if changed:
            self.sample()
        if self.kv_aware and self.queue:
            self.drain_queue()

    def waiting_for_prefill(self) -> int:
        cl = self.cluster
        return len(self.queue) + sum(len(w.queue) for w in cl.front_workers)

    def sample(self) -> None:
        s = self.cluster.router_samples
        s.at_s.append(self.cluster.env.now)
        s.queue_len.append(len(self.queue))
        s.orphaned_kv_bytes.append(self.orphaned_bytes)


class Cluster:
    def __init__(self, requests: Requests, cfg: EngineConfig, transfer_time: TransferTime) -> None:
        self.env = simpy.Environment()
        self.cfg = cfg
        self.requests = requests
        n = len(requests)
        self.prompt_tokens: list[int] = requests.prompt_tokens.tolist()
        self.output_tokens: list[int] = requests.output_tokens.tolist()
        # what the router and KV admission plan on: the client's max_tokens (none given:
        # a client asking for exactly the reply it gets); the realised output_tokens only
        # decides when generation stops
        max_tokens = (
            requests.max_tokens if requests.max_tokens is not None else requests.output_tokens
        )
        self.max_tokens: list[int] = max_tokens.tolist()
        self.generated: list[int] = [0] * n  # tokens delivered so far
        self.ended: list[bool] = [False] * n
        self.log = RequestLog(n)
        self.segments = Segments()
        self.samples = Samples()
        self.router_samples = RouterSamples()
        self.transfer_time = transfer_time
        self.block_tokens = cfg.block_tokens
        self.reserve_full = cfg.kv_admission == "reserve_full"
        self.preemption = cfg.preemption
        self.counters = {"num_resent_transfers": 0, "num_worker_failures": 0}
        self.failure_log: list[tuple[float, int]] = []
        self.num_done = 0
        self.zombies: set[int] = set()  # abandoned inside a running prefill: KV still held
        self.orphan_streams: set[int] = set()  # decode target lost while still prefilling
        self.all_done = self.env.event()
        self.prefill_workers: list[PrefillWorker] = []
        self.decode_workers: list[DecodeWorker] = []
        self.colocated_workers: list[ColocatedWorker] = []
        self.disaggregated = any(p.role == "prefill" for p in cfg.pools)
        self.router = Router(self, cfg)
        self.workers: list[_Worker] = []
        self._pool_of: list[tuple[str, int]] = []
        for pool in cfg.pools:
            for i in range(max(pool.num_workers, pool.max_workers or 0)):
                idx = len(self.workers)
                args = (self, idx, pool.cost, pool.max_batch_seqs, pool.max_batch_tokens)
                if pool.role == "prefill":
                    w: _Worker = PrefillWorker(*args)
                    self.prefill_workers.append(w)  # type: ignore[arg-type]
                elif pool.role == "decode":
                    w = DecodeWorker(*args)
                    self.decode_workers.append(w)  # type: ignore[arg-type]
                elif pool.role == "colocated":
                    w = ColocatedWorker(*args, scheduler=pool.scheduler or "vllm")
                    self.colocated_workers.append(w)  # type: ignore[arg-type]
                else:
                    raise ValueError(f"unknown pool role {pool.role!r}")
                self.workers.append(w)
                self._pool_of.append((pool.role, i))
                if i >= pool.num_workers:
                    w.state = "released"
        if self.disaggregated and not self.decode_workers:
            raise ValueError("a disaggregated cluster needs decode workers")
        self.front_workers: list = (
            self.prefill_workers if self.disaggregated else self.colocated_workers
        )
        self.arrived_prompt_tokens = 0
        self.ttft_log: list[tuple[float, float]] = []  # (first token at, ttft) in time order
        self._transfers: dict[int, tuple[PrefillWorker, DecodeWorker, float]] = {}
        self.topology = cfg.topology
        self.net = None
        self._flows: dict[int, Any] = {}  # rid -> FlowHandle (topology fabric)
        if cfg.topology is not None:
            from disaggsim.fabric.flows import FlowNetwork

            self._check_placed(cfg.topology)
            self.net = FlowNetwork(self.env, cfg.topology)

    def _check_placed(self, topology: Any) -> None:
        """Every worker, those an autoscaler may start included, sits on the topology
        (checked once at construction: a transfer never meets an unplaced worker)."""
        placed = {p.index: p.role for p in topology.workers}
        for w in self.workers:
            role = self._pool_of[w.index][0]
            if placed.get(w.index) != role:
                raise ValueError(
                    f"topology places {len(placed)} workers but the cluster has "
                    f"{len(self.workers)}: {role} worker {w.index} has no placement "
                    "(build the topology with each pool's max_workers)"
                )

    # -- KV sizes -----------------------------------------------------------------------

    def prefill_len(self, rid: int) -> int:
        """Tokens the next prefill of ``rid`` computes: its prompt, plus the tokens
        already delivered when the KV is rebuilt after a preemption or a failure."""
        return self.prompt_tokens[rid] + self.generated[rid]

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def full_blocks(self, rid: int) -> int:
        """Blocks of ``rid``'s longest possible sequence: prompt + max_tokens."""
        return self._blocks(self.prompt_tokens[rid] + self.max_tokens[rid])

    def prefill_blocks(self, rid: int) -> int:
        """Blocks a prefill worker holds for ``rid``'s KV until the handoff."""
        return self._blocks(self.prefill_len(rid))

    def join_blocks(self, rid: int) -> int:
        """Blocks a decode worker needs to take ``rid`` (its whole sequence when reserving
        in full; else its context once the first token exists)."""
        if self.reserve_full:
            return self.full_blocks(rid)
        return self._blocks(self.prompt_tokens[rid] + max(self.generated[rid], 1))

    def colocated_blocks(self, rid: int) -> int:
        """Blocks a colocated worker takes when ``rid``'s prefill starts."""
        if self.reserve_full:
            return self.full_blocks(rid)
        return self._blocks(self.prefill_len(rid) + 1)

    def watermark_blocks(self, w: _Worker) -> int:
        return math.ceil(self.cfg.kv_watermark * w.kv_capacity_blocks)

    def kv_bytes(self, rid: int, w: _Worker) -> int:
        return self.prefill_len(rid) * w.cost.kv_bytes_per_token

    def swap_time(self, w: _Worker, nbytes: float, direction: str) -> float:
        return self.cfg.swap_time(w.cost, nbytes, direction)

    def swap_copy(self, w: _Worker, nbytes: float, direction: str):
        """An event that fires when ``w`` has copied ``nbytes`` of KV out to host memory
        (``direction`` ``out``) or back in. On a topology fabric built with host paths
        every GPU copies its shard over its own PCIe link as a flow sharing the link with
        KV handoffs (``w.swap_flow`` holds it until done); otherwise it takes
        :meth:`swap_time` (the profile's pinned-copy fit, uncontended)."""
        path = None
        if self.topology is not None:
            path = self.topology.host_path(w.index, "d2h" if direction == "out" else "h2d")
        if path is None:
            return self.env.timeout(self.swap_time(w, nbytes, direction))
        done = self.env.event()

        def finished(_rec, w=w, done=done) -> None:
            w.swap_flow = None
            done.succeed()

        w.swap_flow = self.net.start(nbytes, path, on_done=finished, record=False)
        return done

    def cancel_swap(self, w: _Worker) -> None:
        """``w`` failed during a swap copy: its flow stops using the links."""
        if w.swap_flow is not None:
            self.net.cancel(w.swap_flow)
            w.swap_flow = None

    # -- request lifecycle ------------------------------------------------------------

    def _largest_servable(self) -> tuple[int, int]:
        """(prefill blocks, decode/colocated blocks): the most a request may need."""
        if self.disaggregated:
            pre = min(w.kv_capacity_blocks for w in self.prefill_workers)
            dec = max(
                w.kv_capacity_blocks - self.watermark_blocks(w) - 1 for w in self.decode_workers
            )
            return pre, dec
        col = max(
            w.kv_capacity_blocks - self.watermark_blocks(w) - 1 for w in self.colocated_workers
        )
        return col, col

    def _arrivals(self):
        env = self.env
        arrival = self.requests.arrival_s.tolist()
        max_pre, max_seq = self._largest_servable()
        timeout = self.cfg.client_timeout_s
        max_queue = self.cfg.max_queue
        context = self.cfg.context_tokens
        for rid, at in enumerate(arrival):
            if at > env.now:
                yield env.timeout(at - env.now)
            longest = self.prompt_tokens[rid] + self.max_tokens[rid]
            if context is not None and longest > context:
                self.reject(rid, "exceeds_context")  # a server answers 400
                continue
            blocks = self._blocks(longest)
            if blocks > max_seq or (self.disaggregated and blocks > max_pre):
                self.reject(rid, "exceeds_kv_capacity")
                continue
            if max_queue is not None and self.router.waiting_for_prefill() >= max_queue:
                self.reject(rid, "queue_full")
                continue
            self.arrived_prompt_tokens += self.prompt_tokens[rid]
            if timeout is not None:
                ev = env.timeout(timeout)
                ev.callbacks.append(lambda _e, rid=rid: self.abandon(rid))
            self.router.admit(rid)

    def reject(self, rid: int, reason: str) -> None:
        self.log.status[rid] = STATUS_REJECTED
        self.log.reason[rid] = reason
        self._end(rid)

    def abandon(self, rid: int) -> None:
        """The client gave up before its first token: drop the request wherever it is."""
        if self.ended[rid] or self.generated[rid] > 0:
            return
        self.log.status[rid] = STATUS_ABANDONED
        self.log.reason[rid] = "client_timeout"
        self.ended[rid] = True
        if not self._drop_waiting(rid):
            self.zombies.add(rid)  # inside a running prefill: KV freed when it ends
        self.num_done += 1
        self._check_done()

    def _drop_waiting(self, rid: int) -> bool:
        """Remove an abandoned request from the queue, handoff or transfer holding it;
        False if it is inside a running prefill instead."""
        r = self.router
        if r.remove_queued(rid):
            return True
        r.uncommit(rid)
        for w in self.front_workers:
            if w.remove_queued(rid):
                r.drain_queue()
                return True
        src = r.remove_pending(rid)
        if src is not None:
            src.release_kv(rid)
            r.drain_queue()
            return True
        tr = self.cancel_transfer(rid)
        if tr is not None:
            src, dst = tr
            dst.unreserve(rid)
            if rid in src.in_batch:  # streaming while its prefill runs
                return False
            src.release_kv(rid)
            return True
        return False

    def prefill_started(self, rid: int, worker: int) -> None:
        log = self.log
        if log.prefill_start_at_s[rid] != log.prefill_start_at_s[rid]:  # NaN: first prefill
            log.prefill_start_at_s[rid] = self.env.now
        log.prefill_worker[rid] = worker
        log.num_prefills[rid] += 1

    def prefill_token(self, rid: int, now: float) -> None:
        """The token a finished prefill produces reaches the client at ``now``: the first
        one, or after a re-prefill (recompute preemption, failure) the next one, as vLLM
        emits it at the end of the recomputation."""
        g = self.generated[rid]
        self.generated[rid] = g + 1
        if g == 0:
            self.log.first_token_at_s[rid] = now
            self.ttft_log.append((now, now - self.requests.arrival_s[rid]))
        else:
            self.segments.add_point(rid, now)

    def prefill_done(self, rid: int, src: PrefillWorker) -> None:
        now = self.env.now
        self.log.prefill_end_at_s[rid] = now
        if self.ended[rid]:  # abandoned while its prefill ran
            src.release_kv(rid)
            self.bury(rid)
            self.router.drain_queue()
            return
        if self.cfg.first_token_from == "prefill":
            self.prefill_token(rid, now)
            if self.generated[rid] >= self.output_tokens[rid]:  # one-token reply: done
                tr = self.cancel_transfer(rid)
                if tr is not None:
                    tr[1].unreserve(rid)
                self.orphan_streams.discard(rid)
                self.router.uncommit(rid)
                src.release_kv(rid)
                self.finish(rid, now)
                self.router.drain_queue()
                return
        if rid in self.orphan_streams:  # its decode worker died during the prefill
            self.orphan_streams.discard(rid)
        elif rid in self._transfers:  # already streaming to its decode worker (overlap)
            return
        self.router.handoff(rid, src)

    def start_transfer(
        self, rid: int, src: PrefillWorker, dst: DecodeWorker, prefill_s: float | None = None
    ) -> None:
        """Move ``rid``'s KV from ``src`` to ``dst``; ``prefill_s`` given: the prefill is
        starting now and lasts that long (overlap: the KV streams while it runs)."""
        env = self.env
        if self.log.transfer_start_at_s[rid] != self.log.transfer_start_at_s[rid]:
            self.log.transfer_start_at_s[rid] = env.now
        nbytes = self.kv_bytes(rid, src)
        token = env.now
        self._transfers[rid] = (src, dst, token)
        if self.net is not None:
            from disaggsim.fabric.overlap import send_plan

            path = self.topology.path(src.index, dst.index)
            early = prefill_s is not None
            end = env.now + prefill_s if early else env.now
            plan = send_plan(nbytes, env.now, end, prefill_s or 0.0, self.cfg.num_layers, early)
            extra = self.topology.transfer_latency_s(path, self.prefill_len(rid)) - path.latency_s
            self._flows[rid] = self.net.start(
                nbytes,
                path,
                tag=rid,
                extra_latency_s=max(extra, 0.0),
                start_delay_s=plan.start_delay_s,
                source_rate_cap_bytes_per_s=plan.source_rate_cap_bytes_per_s,
                cap_until_s=plan.cap_until_s,
                ready_at_s=plan.ready_at_s,
                on_done=lambda _rec, rid=rid, token=token: self._transfer_done(rid, token),
            )
            return
        delay, factor = self._link_state(env.now)
        dur = delay + self.transfer_time(nbytes, src.index, dst.index) / factor
        ev = env.timeout(dur)
        ev.callbacks.append(lambda _e, rid=rid, token=token: self._transfer_done(rid, token))

    def cancel_transfer(self, rid: int) -> tuple[PrefillWorker, DecodeWorker] | None:
        tr = self._transfers.pop(rid, None)
        if tr is None:
            return None
        handle = self._flows.pop(rid, None)
        if handle is not None:
            self.net.cancel(handle)
        return tr[0], tr[1]

    def prefill_batch_started(self, batch: list[int], src: PrefillWorker, prefill_s: float) -> None:
        """Overlap on a topology fabric: hand off at prefill start where a slot exists."""
        if self.net is None or not self.cfg.overlap:
            return
        for rid in batch:
            self.router.try_early_handoff(rid, src, prefill_s)

    def _link_state(self, now: float) -> tuple[float, float]:
        """(seconds until the link is up, bandwidth factor then) for a transfer at ``now``."""
        t = now
        for _ in range(len(self.cfg.link_windows) + 1):
            for w in self.cfg.link_windows:
                if w.factor == 0 and w.start_s <= t < w.end_s:
                    t = w.end_s
                    break
            else:
                break
        factor = 1.0
        for w in self.cfg.link_windows:
            if w.factor > 0 and w.start_s <= t < w.end_s:
                factor = min(factor, w.factor)
        return t - now, factor

    def _link_outage(self, window: LinkWindow):
        """At an outage's start, every transfer in flight is lost and sent again (it
        waits for the link, then starts over)."""
        yield self.env.timeout(window.start_s)
        for rid in list(self._transfers):
            src, dst, _ = self._transfers[rid]
            if self.net is not None:
                self.net.cancel(self._flows.pop(rid))
            self.counters["num_resent_transfers"] += 1
            self.start_transfer(rid, src, dst)

    def _link_window(self, window: LinkWindow):
        """Topology fabric: the window's links (default every link) run at ``factor``; an
        outage cancels the transfers in flight across them and sends them again."""
        yield self.env.timeout(window.start_s)
        links = window.links if window.links is not None else range(len(self.topology.links))
        for i in links:
            self.net.set_link_capacity(i, window.factor)
        if window.factor == 0:
            hit = set(links)
            for rid in list(self._transfers):
                src, dst, _ = self._transfers[rid]
                path = self.topology.path(src.index, dst.index)
                if window.links is not None and not any(
                    i in hit for r in path.routes for i in r.links
                ):
                    continue
                self.net.cancel(self._flows.pop(rid))
                self.counters["num_resent_transfers"] += 1
                self.start_transfer(rid, src, dst)
        yield self.env.timeout(window.duration_s)
        for i in links:
            self.net.set_link_capacity(i, 1.0)

    def _transfer_done(self, rid: int, token: float) -> None:
        tr = self._transfers.get(rid)
        if tr is None or tr[2] != token:
            return  # cancelled, or superseded by a re-send
        src, dst, _ = tr
        if rid in src.in_batch:
            # streamed KV landed before its prefill ended (as it ends, or earlier after a
            # re-send lifted the overlap cap): take it once the prefill batch is over
            ev = self.env.timeout(max(src.batch_end_at_s - self.env.now, 0.0))
            ev.callbacks.append(lambda _e, rid=rid, token=token: self._transfer_done(rid, token))
            return
        del self._transfers[rid]
        self._flows.pop(rid, None)
        now = self.env.now
        self.log.transfer_end_at_s[rid] = now
        if self.cfg.first_token_from == "decode":
            self.prefill_token(rid, now)
        src.release_kv(rid)
        if self.generated[rid] >= self.output_tokens[rid]:
            dst.finish_without_decode(rid)
            self.finish(rid, now)
        else:
            dst.kv_arrived(rid)
        self.router.drain_queue()

    def bury(self, rid: int) -> None:
        """An abandoned request's in-flight prefill is over: nothing of it remains."""
        if rid in self.zombies:
            self.zombies.discard(rid)
            self._check_done()

    def reprefill(self, rid: int, why: str) -> None:
        """``rid`` lost its KV: prefill the prompt and the tokens so far again."""
        if self.ended[rid]:
            self.bury(rid)
            return
        if self.generated[rid] >= self.output_tokens[rid]:
            self.finish(rid, self.env.now)
            return
        if why == "retry":
            self.log.num_retries[rid] += 1
        self.router.admit(rid)

    def finish(self, rid: int, now: float) -> None:
        if self.ended[rid]:
            return
        self.log.finish_at_s[rid] = now
        self.log.status[rid] = STATUS_COMPLETED
        self._end(rid)

    def _end(self, rid: int) -> None:
        self.ended[rid] = True
        self.num_done += 1
        self._check_done()

    def _check_done(self) -> None:
        if self.num_done == len(self.requests) and not self.zombies and not self.all_done.triggered:
            self.all_done.succeed()

    # -- pool sizes -------------------------------------------------------------------

    def role_of(self, w: _Worker) -> str:
        return self._pool_of[w.index][0]

    def drain_worker(self, w: _Worker) -> None:
        """Scale-down: ``w`` takes no new work; its unstarted requests go back to the
        router; its GPUs are released once it holds nothing."""
        w.state = "draining"
        for rid in list(getattr(w, "queue", ())):
            w.remove_queued(rid)
            self.router.uncommit(rid)
            if not self.ended[rid]:
                self.router.admit(rid)
        self.scaling.record(self.role_of(w))
        w.notify()

    def worker_drained(self, w: _Worker) -> None:
        self.scaling.release(w)

    # -- failures -----------------------------------------------------------------------

    def _fail_worker(self, ev: WorkerFailureEvent):
        yield self.env.timeout(ev.at_s)
        w = self.workers[ev.worker]
        if w.state == "released":  # holds no GPUs (not started yet, or scaled down)
            return
        if w.fail(ev.down_s):
            self.counters["num_worker_failures"] += 1
            self.failure_log.append((self.env.now, ev.worker))

    def worker_recovered(self, w: _Worker) -> None:
        w._sample(0, 0)
        self.router.drain_queue()
        if w.role == "decode":
            self.router.decode_freed()

    def prefill_worker_lost(
        self, w: PrefillWorker, queued: list[int], in_batch: list[int], held: list[int]
    ) -> None:
        r = self.router
        for rid in queued:  # never started here: simply routed again
            r.uncommit(rid)
            if not self.ended[rid]:
                r.admit(rid)
        for rid in in_batch:
            # its prefill is lost: a stream orphaned by an earlier decode loss is moot
            self.orphan_streams.discard(rid)
            if self.ended[rid]:
                self.bury(rid)
        for rid in held + in_batch:
            r.remove_pending(rid)
            tr = self.cancel_transfer(rid)
            if tr is not None:
                tr[1].unreserve(rid)
        for rid in in_batch + held:
            if not self.ended[rid]:
                r.uncommit(rid)
                self.reprefill(rid, "retry")
        r.drain_queue()

    def decode_worker_lost(self, w: DecodeWorker, lost: list[int]) -> None:
        for rid in lost:
            tr = self.cancel_transfer(rid)
            if tr is not None:
                tr[0].release_kv(rid)
                if rid in tr[0].in_batch:  # streaming during its prefill: wait for its end
                    self.orphan_streams.add(rid)
                    continue
            self.reprefill(rid, "retry")
        self.router.decode_freed()

    def colocated_worker_lost(self, w: ColocatedWorker, queued: list[int], lost: list[int]) -> None:
        for rid in queued:
            if not self.ended[rid]:
                self.router.admit(rid)
        for rid in lost:
            self.reprefill(rid, "retry")

    # -- run ------------------------------------------------------------------------------

    def run(
        self,
        progress: Callable[[float, int, int], None] | None = None,
        progress_every_s: float = 0.0,
    ) -> RawResult:
        """Run until every request has ended or the horizon. ``progress(now, done, total)``
        is called every ``progress_every_s`` simulated seconds when given."""
        env = self.env
        env.process(self._arrivals())
        for ev in self.cfg.worker_failures:
            env.process(self._fail_worker(ev))
        from disaggsim.engine.scaling import Scaling

        self.scaling = Scaling(self)
        for role, scaler, cold_start_s in self.cfg.autoscalers:
            env.process(self.scaling.control(role, scaler, cold_start_s, scaler.cfg.interval_s))
        for win in self.cfg.link_windows:
            if self.net is not None:
                env.process(self._link_window(win))
            elif win.factor == 0:
                env.process(self._link_outage(win))
        self.router.sample()
        if len(self.requests) == 0:
            self.all_done.succeed()
        horizon = self.cfg.horizon_s
        if progress is None or progress_every_s <= 0:
            stop = self.all_done
            if np.isfinite(horizon):
                stop = self.all_done | env.timeout(horizon)
            env.run(until=stop)
        else:
            while not self.all_done.triggered and env.now < horizon:
                tick = env.timeout(min(progress_every_s, horizon - env.now))
                env.run(until=self.all_done | tick)
                progress(env.now, self.num_done, len(self.requests))
        self.router.sample()
        kv_bpt = {p.role: p.cost.kv_bytes_per_token for p in self.cfg.pools}
        workers = tuple(
            WorkerInfo(
                index=w.index,
                role=self._pool_of[w.index][0],
                pool_index=self._pool_of[w.index][1],
                num_gpus=w.cost.num_gpus,
                kv_capacity_tokens=w.kv_capacity_tokens,
                kv_used_end_tokens=w.kv_used_tokens,
                num_failures=w.num_failures,
                steps=w.steps,
            )
            for w in self.workers
        )
        return RawResult(
            requests=self.requests,
            log=self.log,
            segments=self.segments,
            workers=workers,
            samples=self.samples,
            router_samples=self.router_samples,
            end_at_s=env.now,
            kv_bytes_per_token=kv_bpt,
            counters=dict(self.counters),
            failures=tuple(self.failure_log),
            transfers=tuple(self.net.records) if self.net is not None else (),
            link_util=self.net.link_utilisation() if self.net is not None else None,
            allocations=tuple(self.scaling.close()),
            pool_sizes=tuple(self.scaling.sizes),
            scale_events=self.scaling.scale_events,
        )


def run_cluster(
    requests: Requests,
    cfg: EngineConfig,
    transfer_time: TransferTime | None = None,
    progress: Callable[[float, int, int], None] | None = None,
    progress_every_s: float = 0.0,
) -> RawResult:
    """Simulate ``requests`` on the cluster described by ``cfg``.

    ``transfer_time(nbytes, src_worker, dst_worker)`` gives the KV handoff seconds
    (disaggregated only; default: instantaneous)."""
    cluster = Cluster(requests, cfg, transfer_time or (lambda nbytes, s, d: 0.0))
    return cluster.run(progress, progress_every_s)
