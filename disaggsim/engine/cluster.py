"""The cluster: wiring of one run and its event loop.

:func:`run_cluster` is the engine's entry point. It takes already-built parts (the
request table, a :class:`WorkerCost` per pool, the fabric's transfer-time function, the
failure schedule) and returns the raw records; it does no file I/O and reads no
configuration files.

A request's path, by file (docs/design.md): arrival and admission here →
:mod:`~disaggsim.engine.router` (back-pressure, prefill choice) → a prefill or colocated
worker (:mod:`~disaggsim.engine.workers`) → :mod:`~disaggsim.engine.handoff` (the KV
over the fabric; decode choice in the router) → a decode worker → finished here. Token
counts and KV block arithmetic live in :mod:`~disaggsim.engine.request_state`; pool sizes
and the autoscaler in :mod:`~disaggsim.engine.scaling`; records in
:mod:`~disaggsim.engine.records`. Workers reach the cluster only through
:class:`~disaggsim.engine.host.WorkerHost`, which :class:`Cluster` implements.

Admission, routing and reservations plan on each request's ``max_tokens`` (what a real
router sees); its realised ``output_tokens`` only decides when generation stops. Every
request ends exactly once: completed, rejected (with a reason) or abandoned (client
timeout). Work lost to a failure sends the request back to the router (a retry); the
tokens already delivered stay delivered, the prompt plus those tokens is prefilled
again, and that prefill delivers the next token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from functools import partial
from heapq import heappush
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import NORMAL

from disaggsim.engine.config import (
    EngineConfig,
    LinkWindow,
    PoolSpec,
    Role,
    TransferTime,
    WorkerFailureEvent,
)
from disaggsim.engine.events import Call, Environment, call_in, call_urgent
from disaggsim.engine.handoff import Handoff
from disaggsim.engine.prefix import PrefixCaches
from disaggsim.engine.records import (
    STATUS_ABANDONED,
    STATUS_COMPLETED,
    STATUS_REJECTED,
    FailureRecord,
    RawResult,
    RequestLogColumns,
    RequestView,
    RouterSamples,
    Rows,
    Samples,
    Segments,
    WorkerInfo,
    minus_one,
    signed_columns,
    unsigned_columns,
)
from disaggsim.engine.request_state import RequestState
from disaggsim.engine.router import Router
from disaggsim.engine.scaling import Scaling
from disaggsim.engine.workers import (
    ColocatedWorker,
    DecodeWorker,
    PrefillWorker,
    Worker,
    WorkerState,
)
from disaggsim.workload.requests import Requests

if TYPE_CHECKING:
    from disaggsim.fabric.flows import FlowHandle

__all__ = [
    "Cluster",
    "EngineConfig",
    "LinkWindow",
    "PoolSpec",
    "RawResult",
    "RequestView",
    "RunStalled",
    "StopCheck",
    "WorkerFailureEvent",
    "WorkerInfo",
    "run_cluster",
]

ProgressFn = Callable[[float, int, int], None]
# (now, the request table) -> True to end the run now (Cluster.run's stop_check)
StopCheck = Callable[[float, RequestView], bool]


class RunStalled(RuntimeError):
    """No event is left to process but some requests have not ended (a run without a
    horizon; every request should end: an engine bug)."""


class Cluster:
    """One run: the workers, the router, the fabric, the records and the event loop."""

    def __init__(self, requests: Requests, cfg: EngineConfig, transfer_time: TransferTime) -> None:
        self.env: Environment = Environment()  # SimPy's, its run loop inline
        self.cfg = cfg
        self.table = requests
        self.requests = RequestState(
            requests,
            cfg.block_tokens,
            cfg.kv_admission == "reserve_full",
            cfg.reserved_decode_tokens,
        )
        self.log = RequestLogColumns(len(requests))
        self.segments = Segments()
        self.samples = Samples()
        # prefix caching: only when the scenario has a cache and the requests have chains
        self.prefix: PrefixCaches | None = None
        if cfg.prefix is not None:
            if not cfg.disaggregated and (
                cfg.kv_admission != "on_demand" or cfg.preemption != "recompute"
            ):
                raise ValueError(
                    "prefix caching on colocated workers needs kv_admission on_demand and "
                    "preemption recompute"
                )
            placed = (
                {p.index: p.node for p in cfg.topology.workers}
                if cfg.topology is not None
                else None
            )
            self.prefix = PrefixCaches(cfg.prefix, self.requests.prompt_tokens, placed)
            self.samples.with_cache_columns()
        self.router_samples = RouterSamples()
        # unsigned while the run appends to them, signed in the result (records.py)
        unsigned_columns(self.segments, self.samples, self.router_samples)
        # the workers write sample and segment rows packed (records.Rows), moved into
        # the columns at arrivals (every Rows.limit rows) and when the run returns
        smp, seg = self.samples, self.segments
        self.sample_rows = Rows(smp.at_s, smp.worker, smp.queue_len, smp.batch, smp.kv_used_tokens)
        self.segment_rows = Rows(seg.rid, seg.worker, seg.start_step, seg.tokens, seg.at_s)
        self._held_rows = self.sample_rows.rows  # the more numerous: checked at arrivals
        self._point = minus_one(seg.worker)  # a point segment's worker and step (-1)
        self.preemption = cfg.preemption
        self.counters = {"num_resent_transfers": 0, "num_worker_failures": 0}
        self.failure_log: list[FailureRecord] = []
        self.num_done = 0
        self.stopped_early_at_s = math.nan
        # the run's own periodic events in the queue (stop checks, progress ticks): when
        # nothing else is queued they are not scheduled again (Cluster.run)
        self._periodic = 0
        self._token_from_prefill = cfg.first_token_from == "prefill"
        self._num_requests = len(requests)
        self.zombies: set[int] = set()  # abandoned inside a running prefill: KV still held
        self.orphan_streams: set[int] = set()  # decode target lost while still prefilling
        self.all_done = self.env.event()
        self.arrived_prompt_tokens = 0
        # (first token at, ttft) in time order, for the autoscalers' TTFT signal
        self.ttft_log: list[tuple[float, float]] = []
        self._keep_ttft = bool(cfg.autoscalers)
        self.disaggregated = cfg.disaggregated
        self.prefill_workers: list[PrefillWorker] = []
        self.decode_workers: list[DecodeWorker] = []
        self.colocated_workers: list[ColocatedWorker] = []
        self.front_workers: list[PrefillWorker] | list[ColocatedWorker] = (
            self.prefill_workers if self.disaggregated else self.colocated_workers
        )
        self.handoff = Handoff(
            self.env, cfg, self.requests, self.log, transfer_time, self.counters, self._delivered
        )
        # overlap on a topology fabric: handoffs may start with the prefill
        self.early_handoffs = self.handoff.net is not None and cfg.overlap
        self.router = Router(
            self.env,
            self.requests,
            self.front_workers,
            self.decode_workers,
            self.handoff,
            self.router_samples,
            prefill_policy=cfg.prefill_policy,
            decode_policy=cfg.decode_policy,
            kv_aware=cfg.backpressure == "kv_aware" and self.disaggregated,
            caches=self.prefix,
            count_queued=cfg.max_queue is not None,
        )
        self.workers: list[Worker] = []
        self._pool_of: list[tuple[Role, int]] = []
        for pool in cfg.pools:
            self._build_pool(pool)
        if self.disaggregated and not self.decode_workers:
            raise ValueError("a disaggregated cluster needs decode workers")
        if cfg.topology is not None:
            self._check_placed(cfg.topology)
            for w in self.workers:  # EP units across nodes: all-to-all flows on the NICs
                if cfg.topology.host_path(w.index, "a2a") is not None and hasattr(
                    w.cost, "all_to_all_traffic"
                ):
                    w.use_all_to_all(cfg.topology.a2a_share(w.index))
        self.router.attach()
        self.scaling = Scaling(self)

    def _build_pool(self, pool: PoolSpec) -> None:
        prefill_times: dict[tuple[int, int, float, int], float] = {}
        for i in range(pool.num_built):
            idx = len(self.workers)
            args = (self, idx, pool.cost, pool.max_batch_seqs, pool.max_batch_tokens)
            kw: dict[str, Any] = {
                "kv_watermark": self.cfg.kv_watermark,
                "prefill_times": prefill_times,
            }
            w: Worker
            match pool.role:
                case "prefill":
                    w = PrefillWorker(*args, **kw)
                    if self.prefix is not None:
                        w.use_cache(self.prefix)
                    self.prefill_workers.append(w)
                case "decode":
                    w = DecodeWorker(*args, **kw)
                    self.decode_workers.append(w)
                case "colocated":
                    w = ColocatedWorker(*args, **kw, scheduler=pool.scheduler or "vllm")
                    if self.prefix is not None:
                        w.use_cache(self.prefix)
                    self.colocated_workers.append(w)
            self.workers.append(w)
            self._pool_of.append((pool.role, i))
            if i >= pool.num_workers:
                w.state = WorkerState.RELEASED  # autoscaling may start it later

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

    def role_of(self, w: Worker) -> Role:
        return self._pool_of[w.index][0]

    # -- arrival and admission ----------------------------------------------------------

    def _largest_servable(self) -> tuple[int, int]:
        """(prefill blocks, decode/colocated blocks): the most a request may need."""
        if self.disaggregated:
            pre = min(w.kv_capacity_blocks for w in self.prefill_workers)
            dec = max(w.kv_capacity_blocks - w.watermark_blocks - 1 for w in self.decode_workers)
            return pre, dec
        col = max(w.kv_capacity_blocks - w.watermark_blocks - 1 for w in self.colocated_workers)
        return col, col

    def _start_arrivals(self) -> None:
        """Arrivals in time order, as callbacks on the events of the SimPy process they
        replace: started by an URGENT event where the process's start was, then at each
        arrival instant one event queued as the process's timeout would be
        (:func:`~disaggsim.engine.events.call_in`), no process resumed per request."""
        rs, cfg = self.requests, self.cfg
        max_pre, max_seq = self._largest_servable()
        # what each arrival reads, unpacked once per call
        self._arrival = (
            self.table.arrival_s.tolist(),
            max_pre,
            max_seq,
            cfg.client_timeout_s,
            cfg.max_queue,
            cfg.context_tokens,
            rs.prompt_tokens,
            rs.max_tokens,
            rs.block_tokens,
        )
        self._next_arrival = 0
        # the arrival event, queued again for each arrival instant (Call() and its list
        # made once: about 1,000 machine instructions an arrival)
        self._arrival_ev = Call()
        self._arrival_cbs: list[Callable[[Any], None]] = [self._arrive]
        call_urgent(self.env, self._arrive)

    def _arrive(self, _ev: simpy.Event) -> None:
        """Admit every request due now, then wait for the next arrival."""
        env = self.env
        if len(self._held_rows) >= Rows.limit:
            self.sample_rows.flush()
            self.segment_rows.flush()
        arrival, max_pre, max_seq, timeout, max_queue, context, prompt, max_tokens, bt = (
            self._arrival
        )
        for rid in range(self._next_arrival, len(arrival)):
            at = arrival[rid]
            now = env._now
            if at > now:
                self._next_arrival = rid
                # call_in(env, at - now, self._arrive), inline, on the one arrival event
                # (at most one is queued: the next is queued when it is processed)
                ev = self._arrival_ev
                ev.callbacks = self._arrival_cbs
                heappush(env._queue, (now + (at - now), NORMAL, next(env._eid), ev))
                return
            p = prompt[rid]  # one read of each column (an array read makes an int)
            longest = p + max_tokens[rid]  # rs.longest_tokens
            if context is not None and longest > context:
                self.reject(rid, "exceeds_context")  # a server answers 400
                continue
            blocks = -(-longest // bt)  # rs.blocks
            if blocks > max_seq or (self.disaggregated and blocks > max_pre):
                self.reject(rid, "exceeds_kv_capacity")
                continue
            if max_queue is not None and self.router.waiting_for_prefill() >= max_queue:
                self.reject(rid, "queue_full")
                continue
            self.arrived_prompt_tokens += p
            if timeout is not None:
                call_in(env, timeout, partial(self.abandon, rid))
            self.router.admit(rid, p)  # a new request's prefill length: its prompt
        self._next_arrival = len(arrival)

    def reject(self, rid: int, reason: str) -> None:
        self.log.status[rid] = STATUS_REJECTED
        self.log.reason[rid] = reason
        self._end(rid)

    def abandon(self, rid: int, _ev: simpy.Event | None = None) -> None:
        """The client gave up before its first token: drop the request wherever it is
        (also the callback of the client's timeout: ``_ev`` is ignored)."""
        rs = self.requests
        if rs.ended[rid] or rs.generated[rid] > 0:
            return
        self.log.status[rid] = STATUS_ABANDONED
        self.log.reason[rid] = "client_timeout"
        rs.ended[rid] = True
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
        tr = self.handoff.cancel_transfer(rid)
        if tr is not None:
            src, dst = tr
            dst.unreserve(rid)
            if rid in src.in_batch:  # streaming while its prefill runs
                return False
            src.release_kv(rid)
            return True
        return False

    # -- prefill, handoff, tokens (WorkerHost) ------------------------------------------

    def prefill_started(self, rid: int, worker: int, tokens: int = -1) -> None:
        """``rid``'s prefill of ``tokens`` (its prefill_len; -1: read here) starts on
        ``worker``."""
        log = self.log
        start = log.prefill_start_at_s
        t = start[rid]  # one read (an array read makes a float)
        if t != t:  # NaN: first prefill
            start[rid] = self.env._now
        log.prefill_worker[rid] = worker
        log.num_prefills[rid] += 1
        rs = self.requests
        if tokens < 0:  # not given: prefill_len
            tokens = rs.prompt_tokens[rid] + rs.generated[rid]
        rs.prefilled_tokens[rid] = tokens

    def prefill_token(self, rid: int, now: float) -> int:
        """The token a finished prefill produces reaches the client at ``now``: the first
        one, or after a re-prefill (recompute preemption, failure) the next one, as vLLM
        emits it at the end of the recomputation. Returns the tokens delivered so far (this
        one included)."""
        generated = self.requests.generated
        g = generated[rid]
        generated[rid] = g + 1
        if g == 0:
            self.log.first_token_at_s[rid] = now
            if self._keep_ttft:
                self.ttft_log.append((now, now - self.table.arrival_s[rid]))
        else:  # Segments.add_point, one row
            point = self._point
            pack, put = self.segment_rows.write
            put(pack(rid, point, point, 1, now))
        return g + 1

    def prefill_batch_started(self, batch: list[int], src: PrefillWorker, prefill_s: float) -> None:
        """Overlap on a topology fabric: hand off at prefill start where a slot exists."""
        if not self.early_handoffs:
            return
        for rid in batch:
            self.router.try_early_handoff(rid, src, prefill_s)

    def prefill_done(self, rid: int, src: PrefillWorker) -> None:
        now = self.env._now
        rs = self.requests
        self.log.prefill_end_at_s[rid] = now
        if rs.ended[rid]:  # abandoned while its prefill ran
            src.release_kv(rid)
            self.bury(rid)
            self.router.drain_queue()
            return
        if self._token_from_prefill:
            # done_generating: a one-token reply
            if self.prefill_token(rid, now) >= rs.output_tokens[rid]:
                tr = self.handoff.cancel_transfer(rid)
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
        elif rid in self.handoff.transfers:  # in_flight: streaming to its decode worker already
            return
        self.router.handoff(rid, src)

    def _delivered(self, rid: int, src: PrefillWorker, dst: DecodeWorker) -> None:
        """``rid``'s KV has reached ``dst`` (:class:`Handoff` calls this)."""
        now = self.env._now
        if not self._token_from_prefill:
            self.prefill_token(rid, now)
        soon = self.env._soon
        queued = len(soon)
        src.release_kv(rid)  # an idle src is woken: its wake, the FIFO's last event
        rs = self.requests
        if rs.generated[rid] >= rs.output_tokens[rid]:  # done_generating
            dst.finish_without_decode(rid)
            self.finish(rid, now)
        else:
            # nothing was scheduled since src's wake: dst's wake joins it (a prefill
            # pass neither reads the queue nor schedules an URGENT event; call_soon_after)
            dst.kv_arrived(rid, soon[-1][1] if len(soon) > queued else None)
        if self.router.queue:  # drain_queue has nothing to do otherwise
            self.router.drain_queue()

    def decode_freed(self) -> None:
        r = self.router
        if r.pending or r.kv_aware and r.queue:  # Router.decode_freed does nothing otherwise
            r.decode_freed()

    def swap_copy(self, w: Worker, nbytes: float, direction: str, num_seqs: int = 0) -> simpy.Event:
        return self.handoff.swap_copy(w, nbytes, direction, num_seqs)

    def cancel_swap(self, w: Worker) -> None:
        self.handoff.cancel_swap(w)

    def cache_copy(
        self, w: Worker, nbytes: float, kind: str, done: Callable[[], None] | None = None
    ) -> FlowHandle | None:
        return self.handoff.cache_copy(w, nbytes, kind, done)

    def cancel_copy(self, handle: FlowHandle) -> float:
        return self.handoff.cancel_copy(handle)

    # -- the end of a request -------------------------------------------------------------

    def bury(self, rid: int) -> None:
        """An abandoned request's in-flight prefill is over: nothing of it remains."""
        if rid in self.zombies:
            self.zombies.discard(rid)
            self._check_done()

    def reprefill(self, rid: int, why: str) -> None:
        """``rid`` lost its KV: prefill the prompt and the tokens so far again."""
        rs = self.requests
        if rs.ended[rid]:
            self.bury(rid)
            return
        if rs.done_generating(rid):
            self.finish(rid, self.env._now)
            return
        if why == "retry":
            self.log.num_retries[rid] += 1
        self.router.admit(rid)

    def finish(self, rid: int, now: float) -> None:
        ended = self.requests.ended
        if ended[rid]:
            return
        log = self.log
        log.finish_at_s[rid] = now
        log.status[rid] = STATUS_COMPLETED
        ended[rid] = True  # _end, inline
        self.num_done += 1
        if self.num_done == self._num_requests:
            self._check_done()

    def _end(self, rid: int) -> None:
        self.requests.ended[rid] = True
        self.num_done += 1
        self._check_done()

    def _check_done(self) -> None:
        if self.num_done == self._num_requests and not self.zombies and not self.all_done.triggered:
            self.all_done.succeed()

    # -- pool sizes (Scaling calls these) ---------------------------------------------------

    def drain_worker(self, w: Worker) -> None:
        """Scale-down: ``w`` takes no new work; its unstarted requests go back to the
        router; its GPUs are released once it holds nothing."""
        w.state = WorkerState.DRAINING
        if isinstance(w, PrefillWorker | ColocatedWorker):
            for rid in list(w.queue):
                w.remove_queued(rid)
                self.router.uncommit(rid)
                if not self.requests.ended[rid]:
                    self.router.admit(rid)
        self.scaling.record(self.role_of(w))
        w.notify()

    def worker_drained(self, w: Worker) -> None:
        if isinstance(w, PrefillWorker | ColocatedWorker) and w.prefix is not None:
            w.prefix.clear()  # its GPUs go back: a worker started later begins empty
        self.scaling.release(w)

    # -- failures -----------------------------------------------------------------------

    def _fail_worker(self, ev: WorkerFailureEvent) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(ev.at_s)
        w = self.workers[ev.worker]
        if w.state is WorkerState.RELEASED:  # holds no GPUs (not started, or scaled down)
            return
        if w.fail(ev.down_s):
            self.counters["num_worker_failures"] += 1
            self.failure_log.append(FailureRecord(self.env.now, ev.worker))

    def worker_recovered(self, w: Worker) -> None:
        w.sample(0, 0)
        self.router.drain_queue()
        if isinstance(w, DecodeWorker):
            self.router.decode_freed()

    def prefill_worker_lost(
        self, w: PrefillWorker, queued: list[int], in_batch: list[int], held: list[int]
    ) -> None:
        r = self.router
        ended = self.requests.ended
        for rid in queued:  # never started here: simply routed again
            r.uncommit(rid)
            if not ended[rid]:
                r.admit(rid)
        for rid in in_batch:
            # its prefill is lost: a stream orphaned by an earlier decode loss is moot
            self.orphan_streams.discard(rid)
            if ended[rid]:
                self.bury(rid)
        for rid in held + in_batch:
            r.remove_pending(rid)
            tr = self.handoff.cancel_transfer(rid)
            if tr is not None:
                tr[1].unreserve(rid)
        for rid in in_batch + held:
            if not ended[rid]:
                r.uncommit(rid)
                self.reprefill(rid, "retry")
        r.drain_queue()

    def decode_worker_lost(self, w: DecodeWorker, lost: list[int]) -> None:
        for rid in lost:
            tr = self.handoff.cancel_transfer(rid)
            if tr is not None:
                tr[0].release_kv(rid)
                if rid in tr[0].in_batch:  # streaming during its prefill: wait for its end
                    self.orphan_streams.add(rid)
                    continue
            self.reprefill(rid, "retry")
        self.router.decode_freed()

    def colocated_worker_lost(self, w: ColocatedWorker, queued: list[int], lost: list[int]) -> None:
        for rid in queued:
            if not self.requests.ended[rid]:
                self.router.admit(rid)
        for rid in lost:
            self.reprefill(rid, "retry")

    # -- run ------------------------------------------------------------------------------

    def run(
        self,
        progress: ProgressFn | None = None,
        progress_every_s: float = 0.0,
        stop_check: StopCheck | None = None,
        check_every_s: float = 0.0,
    ) -> RawResult:
        """Run until every request has ended or the horizon. ``progress(now, done, total)``
        is called every ``progress_every_s`` simulated seconds when given.

        ``stop_check(now, view)`` (optional) is called every ``check_every_s`` simulated
        seconds from ``check_every_s`` on, with a :class:`RequestView` of the request
        table; when it returns True the run ends at that instant, as at the horizon
        (the result's ``stopped_early_at_s``: that instant; NaN if the run ended
        otherwise). Each check is one event that only reads: the run's records up to its
        end are those of the run without the check. Without a check no event is added.
        Without a horizon (``horizon_s`` infinite) a check or a progress tick is not
        scheduled again when nothing else is left to happen: a run whose requests cannot
        all end then stops as the run without them does, with :class:`RunStalled`,
        instead of checking forever. With a horizon they go on until it."""
        env = self.env
        self._start_arrivals()
        for ev in self.cfg.worker_failures:
            env.process(self._fail_worker(ev))
        for role, scaler, cold_start_s in self.cfg.autoscalers:
            env.process(self.scaling.control(role, scaler, cold_start_s, scaler.cfg.interval_s))
        for proc in self.handoff.processes():
            env.process(proc)
        self.router.sample()
        if len(self.requests) == 0:
            self.all_done.succeed()
        horizon = self.cfg.horizon_s
        # the events that end the run (one flat condition each time: SimPy disarms a
        # nested condition when the condition holding it is processed)
        ends: list[simpy.Event] = [self.all_done]
        forever = not math.isfinite(horizon)
        if stop_check is not None:
            ends.append(self._stop_checks(stop_check, check_every_s))
        try:
            if progress is None or progress_every_s <= 0:
                if math.isfinite(horizon):
                    ends.append(env.timeout(horizon))
                env.run(until=ends[0] if len(ends) == 1 else env.any_of(ends))
            else:
                until: simpy.Event | None = None
                while not any(ev.triggered for ev in ends) and env.now < horizon:
                    # SimPy puts the event a run stopped at back in the queue, first
                    queue = env._queue
                    left = 1 if until is not None and queue and queue[0][3] is until else 0
                    if forever and len(queue) + len(env._soon) <= self._periodic + left:
                        # nothing but a stop check is left: no more ticks (the check
                        # stops too, and the run stalls as the run without them)
                        env.run(until=env.any_of(ends))
                        break
                    tick = env.timeout(min(progress_every_s, horizon - env.now))
                    self._periodic += 1
                    until = env.any_of([*ends, tick])
                    env.run(until=until)
                    if tick.processed:
                        self._periodic -= 1
                    progress(env.now, self.num_done, len(self.requests))
        except RuntimeError as e:
            if "No scheduled events left" not in str(e):
                raise
            raise RunStalled(
                f"the run stalled at {env.now:g} s: no event left to process and "
                f"{self._num_requests - self.num_done} of {self._num_requests} requests not "
                f"ended ({len(self.zombies)} abandoned inside a prefill); every request "
                "should end (an engine bug)"
            ) from e
        if self.all_done.triggered:  # every request ended: a complete run after all
            self.stopped_early_at_s = math.nan
        self.router.sample()
        return self._result()

    def _stop_checks(self, stop_check: StopCheck, every_s: float) -> simpy.Event:
        """The event a stop check succeeds: ``stop_check`` called every ``every_s``
        simulated seconds (one :func:`call_in` event each) until it returns True."""
        if not (every_s > 0 and math.isfinite(every_s)):
            raise ValueError(f"check_every_s must be a positive number of seconds, got {every_s}")
        env = self.env
        stopped = env.event()
        view = RequestView.of(self.table, self.log.log)
        forever = not math.isfinite(self.cfg.horizon_s)

        def check(_ev: simpy.Event) -> None:
            now = env._now
            self._periodic -= 1
            if stop_check(now, view):
                self.stopped_early_at_s = now
                stopped.succeed()
            elif not forever or len(env._queue) + len(env._soon) > self._periodic:
                # a horizon, or something besides the checks and ticks still to happen
                call_in(env, every_s, check)
                self._periodic += 1

        call_in(env, every_s, check)
        self._periodic += 1
        return stopped

    def _result(self) -> RawResult:
        net = self.handoff.net
        self.sample_rows.flush()
        self.segment_rows.flush()
        for w in self.workers:
            w.flush_steps()
        signed_columns(self.segments, self.samples, self.router_samples)
        counters = dict(self.counters)
        chunked = [
            w.chunk_budget_counts() for w in self.colocated_workers if w.scheduler == "chunked"
        ]
        if chunked:  # a chunked pool: its iterations and those the token budget bound
            counters["num_chunked_steps"] = sum(n for n, _ in chunked)
            counters["num_chunk_budget_full_steps"] = sum(f for _, f in chunked)
        return RawResult(
            requests=self.table,
            log=self.log.log,
            segments=self.segments,
            workers=tuple(
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
            ),
            samples=self.samples,
            router_samples=self.router_samples,
            end_at_s=self.env.now,
            kv_bytes_per_token={p.role: p.cost.kv_bytes_per_token for p in self.cfg.pools},
            counters=counters,
            failures=tuple(self.failure_log),
            prefix_log=self.prefix.log if self.prefix is not None else None,
            transfers=tuple(net.records) if net is not None else (),
            link_util=net.link_utilisation() if net is not None else None,
            allocations=tuple(self.scaling.close()),
            pool_sizes=tuple(self.scaling.sizes),
            scale_events=self.scaling.scale_events,
            stopped_early_at_s=self.stopped_early_at_s,
        )


def run_cluster(
    requests: Requests,
    cfg: EngineConfig,
    transfer_time: TransferTime | None = None,
    progress: ProgressFn | None = None,
    progress_every_s: float = 0.0,
    stop_check: StopCheck | None = None,
    check_every_s: float = 0.0,
) -> RawResult:
    """Simulate ``requests`` on the cluster described by ``cfg``.

    ``transfer_time(nbytes, src_worker, dst_worker)`` gives the KV handoff seconds
    (disaggregated only; default: instantaneous). ``stop_check`` and ``check_every_s``:
    see :meth:`Cluster.run`."""
    cluster = Cluster(requests, cfg, transfer_time or (lambda nbytes, s, d: 0.0))
    return cluster.run(progress, progress_every_s, stop_check, check_every_s)
