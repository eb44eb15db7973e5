"""Workers: batch requests and advance them in forward-pass steps, as SimPy callbacks.

A worker reaches the cluster only through :class:`~disaggsim.engine.host.WorkerHost`
(request state, records, and the calls that move a request on); its life (in service,
starting, draining, released) is a :class:`WorkerState`, and what it is doing now (for a
failure to cut) an :data:`Activity`.

A worker is a TP group holding one copy of the weights. Three kinds:

- :class:`PrefillWorker` (disaggregated): FCFS prefill batches under a token budget; the
  KV of a finished prefill stays resident (counted against its memory) until the handoff
  to a decode worker completes, and no prefill starts that its memory cannot hold.
- :class:`DecodeWorker` (disaggregated): continuous batching; KV arrives from the fabric
  and is admitted at an iteration boundary.
- :class:`ColocatedWorker`: one pool doing both, with the ``vllm`` scheduler (a prefill
  runs as its own iteration and stalls every running decode) or ``chunked`` (each
  iteration mixes one token per running sequence with prompt chunks under a token budget).

Speed rule: between state changes (an admission, a completion, running out of KV blocks)
a batch of decoding sequences does not change, so its steps are advanced as one *run* in
closed form, cut at the next step boundary when new work arrives. A step's time is the
larger of at most two lines affine in the batch's context (``WorkerCost.decode_coeffs``,
the KV-stream bound, and the optional ``decode_item_coeffs``, the per-item bound); the
context grows by the batch size each step, so the larger line changes at most once in a
run and a run is at most two affine segments (:class:`Run`). A run costs one or two SimPy
events whatever its length and batch size.

Paged KV memory (blocks of ``block_tokens``): with ``reserve_full`` admission reserves the
blocks of the longest sequence the client allows (prompt + ``max_tokens``); with ``on_demand`` (vLLM's policy) it
takes the blocks of the current context, keeps a watermark of free blocks, and sequences
grow a block at a time. The step at which the batch would run out of blocks is computed
exactly from a histogram of the sequences' block phases, and the most recently admitted
sequences are preempted there: by ``recompute`` (KV dropped, the prompt and the tokens so
far prefilled again; that prefill emits the next token, as vLLM's does) or ``swap`` (KV copied to host memory and back, the worker stalled
for the copy).

Failures: :meth:`Worker.fail` interrupts the worker (as SimPy interrupts a process); steps
completed before the failure count, everything the worker holds goes back to the router,
and the worker serves again after its restart delay.

A worker runs as callbacks on the events it waits for rather than as a SimPy process
(the driver in :class:`Worker`): the same events in the same order as the processes it
replaced, without a generator resumed per state change.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Generator
from enum import Enum
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any, NamedTuple

import simpy
from simpy.events import NORMAL

from disaggsim.costmodel.interface import WorkerCost, context_kv_bytes
from disaggsim.engine.events import (
    Call,
    Environment,
    call_in,
    call_soon,
    call_soon_after,
    call_urgent,
)
from disaggsim.engine.records import StepLog, flush_held, held_rows
from disaggsim.engine.request_state import RequestState

if TYPE_CHECKING:
    from disaggsim.cache import WorkerKvCache
    from disaggsim.engine.host import WorkerHost
    from disaggsim.engine.prefix import PrefixCaches
    from disaggsim.fabric.flows import FlowHandle

_EPS = 1e-12
_NAN = math.nan
_MAX_CACHED_PREFILLS = 1 << 16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class WorkerState(Enum):
    """Where a worker is in its life (autoscaling: docs/autoscaling.md)."""

    IN_SERVICE = "in_service"  # takes new work (when alive)
    STARTING = "starting"  # GPUs allocated, cold start (weights loading)
    DRAINING = "draining"  # finishes what it holds, takes nothing new
    RELEASED = "released"  # holds no GPUs


_DRAINING = WorkerState.DRAINING


def _affine_s(j: int, base: float, per: float, b: int, c: int) -> float:
    """Seconds of ``j`` steps of ``base + per × C`` from context ``c``, ``b`` more each."""
    return j * base + per * (j * c + b * j * (j - 1) / 2)


def _affine_covering(tau: float, k: int, base: float, per: float, b: int, c: int) -> int:
    """Smallest j in [1, k] whose time :func:`_affine_s` reaches ``tau`` (within _EPS)."""
    a2 = per * b / 2
    b1 = base + per * c - a2
    if a2 > 0:
        j = math.ceil((-b1 + math.sqrt(b1 * b1 + 4 * a2 * tau)) / (2 * a2))
    else:
        j = math.ceil(tau / b1) if b1 > 0 else 1
    if j < 1:  # min(max(j, 1), k), without the two calls
        j = 1
    if j > k:
        j = k
    reach = tau - _EPS
    while j > 1:  # _affine_s(j - 1, ...) >= reach, inline
        i = j - 1
        if i * base + per * (i * c + b * i * (i - 1) / 2) < reach:
            break
        j = i
    while j < k and j * base + per * (j * c + b * j * (j - 1) / 2) < reach:  # _affine_s
        j += 1
    return j


class Run(NamedTuple):
    """A run of ``steps`` token steps over ``batch`` sequences whose total context is
    ``context0`` at its first step (``+ batch`` each step). Its first ``lead_steps``
    steps last ``lead_base_s + lead_per_token_s × C``, the rest ``base_s + per_token_s ×
    C``: a step takes the larger of the cost model's two decode lines, and the larger one
    changes at most once as the context grows (``lead_steps`` 0: one line throughout)."""

    start_s: float
    steps: int
    batch: int
    context0: int
    base_s: float
    per_token_s: float
    lead_steps: int = 0
    lead_base_s: float = 0.0
    lead_per_token_s: float = 0.0

    def with_steps(self, k: int) -> Run:
        """The same run cut to its first ``k`` steps."""
        return Run(self[0], k, *self[2:])

    def time_s(self, j: int) -> float:
        """Seconds of the run's first ``j`` steps."""
        m = self.lead_steps
        if m == 0:  # _affine_s, inline
            return j * self.base_s + self.per_token_s * (
                j * self.context0 + self.batch * j * (j - 1) / 2
            )
        b, c = self.batch, self.context0
        t = _affine_s(min(j, m), self.lead_base_s, self.lead_per_token_s, b, c)
        if j > m:
            t += _affine_s(j - m, self.base_s, self.per_token_s, b, c + m * b)
        return t

    def steps_covering(self, tau: float) -> int:
        """Smallest j in [1, steps] whose time reaches ``tau`` (within _EPS)."""
        m, k, b, c = self.lead_steps, self.steps, self.batch, self.context0
        if m == 0:
            return _affine_covering(tau, k, self.base_s, self.per_token_s, b, c)
        lead_s = self.time_s(m)
        if m >= k or lead_s >= tau - _EPS:
            return _affine_covering(tau, min(m, k), self.lead_base_s, self.lead_per_token_s, b, c)
        return m + _affine_covering(
            tau - lead_s, k - m, self.base_s, self.per_token_s, b, c + m * b
        )

    def steps_done_by(self, tau: float) -> int:
        """Steps fully completed ``tau`` seconds after the run's start."""
        j = self.steps_covering(max(tau, 0.0))
        if self.time_s(j) > tau + _EPS:
            j -= 1
        return max(j, 0)

    def log_to(self, log: StepLog) -> None:
        """Record the run's steps: one affine run per segment."""
        for row in self.rows():
            log.add_run(*row)

    def rows(self) -> list[tuple[float, int, int, int, float, float]]:
        """The run's step-log rows (:meth:`StepLog.add_run`'s values): one affine run per
        segment."""
        m = min(self.lead_steps, self.steps)
        b, c = self.batch, self.context0
        out = []
        if m:
            out.append((self.start_s, m, b, c, self.lead_base_s, self.lead_per_token_s))
        if self.steps > m:
            start = self.start_s + self.time_s(m) if m else self.start_s
            out.append((start, self.steps - m, b, c + m * b, self.base_s, self.per_token_s))
        return out


class DecodeLines(NamedTuple):
    """A batch size's decode lines: ``(base_s, per_token_s)`` of the KV-stream bound and,
    where the cost model has one, of the per-item bound (``has_item`` False: one line)."""

    base_s: float
    per_token_s: float
    has_item: bool
    item_base_s: float
    item_per_token_s: float

    def split(self, start_s: float, k: int, b: int, c: int) -> Run:
        """The run of ``k`` steps from context ``c``: which line is larger at its first
        step, and for how many steps (the difference of the lines is affine in the
        context, so its sign changes at most once; found from the crossing, then checked
        step by step where the floats decide)."""
        base, per = self.base_s, self.per_token_s
        if not self.has_item:
            return Run(start_s, k, b, c, base, per)
        ib, ip = self.item_base_s, self.item_per_token_s
        first = ib + ip * c > base + per * c  # the item line above at the first step
        slope = (ip - per) * b  # change of (item - stream) per step
        if not first and slope <= 0:  # the common case: the stream line throughout
            return Run(start_s, k, b, c, base, per)

        def item_above(i: int) -> bool:
            ctx = c + i * b
            return ib + ip * ctx > base + per * ctx

        if slope == 0 or (slope < 0) != first:  # the first line stays the larger one
            m = k
        else:
            cross = (base - ib - (ip - per) * c) / slope  # steps to the crossing
            m = k if cross >= k else 0 if cross <= 0 else math.ceil(cross)
            while m > 0 and item_above(m - 1) != first:
                m -= 1
            while m < k and item_above(m) == first:
                m += 1
        if first:
            if m == 0:
                return Run(start_s, k, b, c, base, per)
            return (
                Run(start_s, k, b, c, base, per, m, ib, ip)
                if m < k
                else Run(start_s, k, b, c, ib, ip)
            )
        if m >= k:
            return Run(start_s, k, b, c, base, per)
        if m == 0:
            return Run(start_s, k, b, c, ib, ip)
        return Run(start_s, k, b, c, ib, ip, m, base, per)


# A run's fields in Run's order, as a plain tuple: the hot path makes each run's record
# as one (a tuple display, where Run(...) or tuple.__new__(Run, ...) is a type call: about
# 1,400 machine instructions a run more, callgrind); a Run (DecodeLines.split's) is one too
RunFields = tuple[float, int, int, int, float, float, int, float, float]


class Mixed:
    """A chunked iteration (decode tokens + prompt chunks) in progress (logged when it
    ends)."""

    __slots__ = ()


class Stall:
    """A KV swap copy in progress (no token step runs)."""

    __slots__ = ()


# What a worker is doing now: a run of steps (its fields: a tuple), a prefill-only
# iteration (its batch: a list of request ids, logged with its full length when it
# starts; a failure cuts it), a chunked iteration, or a swap copy.
Activity = RunFields | list[int] | Mixed | Stall
Proc = Generator[simpy.Event, Any, None]  # a rare path written as a generator (Worker._sub)
Then = Callable[[Any], None]  # what a worker does when the event it waits for is processed
_MIXED = Mixed()
_STALL = Stall()


class Worker:
    """State and bookkeeping shared by all worker kinds.

    Every worker class declares its attributes in ``__slots__``: the hot loop reads them
    on every state change, and slot access stays fast however many a worker has."""

    __slots__ = (
        "_a2a",
        "_a2a_bytes",
        "_a2a_share",
        "_activity",
        "_alive",
        "_cache_to",
        "_changes",
        "_copies",
        "_down_s",
        "_kv_used_blocks",
        "_num_outstanding",
        "_pass_cb",
        "_prefill_times",
        "_queued_tokens",
        "_sample_row",
        "_state",
        "_gen",
        "_gen_then",
        "_held_steps",
        "_iter_row",
        "_target",
        "_then",
        "_idle",
        "accepting",
        "block_tokens",
        "cost",
        "env",
        "host",
        "index",
        "kv_capacity_blocks",
        "max_batch_seqs",
        "max_batch_tokens",
        "num_failures",
        "requests",
        "steps",
        "watermark_blocks",
    )

    role = "worker"

    def __init__(
        self,
        host: WorkerHost,
        index: int,
        cost: WorkerCost,
        max_batch_seqs: int,
        max_batch_tokens: int,
        *,
        kv_watermark: float = 0.0,
        prefill_times: dict[tuple[int, int, float, int], float] | None = None,
    ) -> None:
        self.host = host
        self.env: Environment = host.env
        self.requests: RequestState = host.requests
        self.index = index  # global worker index (unique across pools)
        self.cost = cost
        self.max_batch_seqs = max_batch_seqs
        self.max_batch_tokens = max_batch_tokens
        self.block_tokens = host.requests.block_tokens
        self.kv_capacity_blocks = cost.kv_capacity_tokens // self.block_tokens
        # blocks kept free when admitting (a share of the capacity, fixed per worker)
        self.watermark_blocks = math.ceil(kv_watermark * self.kv_capacity_blocks)
        # the router indexes workers by these quantities: every change is reported
        # through the properties below into the set given to watch()
        self._changes: set[int] = set()
        self._kv_used_blocks = 0
        self._alive = True
        self._state = WorkerState.IN_SERVICE
        # takes new work: alive and in service (not starting, draining or released); kept
        # by the two setters below (read on every routing decision)
        self.accepting = True
        self._queued_tokens = 0  # prompt tokens assigned here and not yet prefilled
        self._num_outstanding = 0  # requests assigned here and not yet finished/handed off
        # prefill batch times already asked of the cost model (a pure function; shared by
        # the workers of one pool)
        self._prefill_times = prefill_times if prefill_times is not None else {}
        # signed columns throughout: the engine writes them through held rows (no
        # appends, so none of unsigned_columns' cost), flushed by flush_steps
        self.steps = StepLog()
        it = self.steps.prefill_iters
        # a prefill iteration's row (start_at_s, duration_s, num_seqs, num_tokens),
        # PrefillIters.append's: put(pack(...)), held until flush_steps
        columns = (it.start_at_s, it.duration_s, it.num_seqs, it.num_tokens)
        held, self._iter_row = held_rows(*columns)
        self._held_steps: tuple[tuple[bytearray, tuple[array[Any], ...]], ...] = ((held, columns),)
        self.num_failures = 0
        self._idle = False  # waiting for work: new work schedules the wake (notify)
        self._activity: Activity | None = None  # what the worker is doing now (for failures)
        self._down_s = 0.0
        self._copies: set[FlowHandle] = set()  # flows of this worker in flight (topology)
        # an EP unit across nodes on a topology: its all-to-all bytes per step, by batch
        self._a2a = False
        self._a2a_share = 0.0
        self._a2a_bytes: dict[tuple[int, int], float] = {}
        smp = host.samples
        # a sample row (at_s, worker, queue_len, batch, kv_used_tokens): put(pack(...))
        self._sample_row = host.sample_rows.write
        # prefix caching on: five more columns per sample (docs/prefix-caching.md)
        self._cache_to = None
        if smp.cache_hbm_tokens is not None:
            assert smp.cache_hbm_pinned_tokens is not None
            assert smp.cache_hbm_pending_tokens is not None
            assert smp.cache_dram_tokens is not None and smp.cache_remote_tokens is not None
            self._cache_to = (
                smp.cache_hbm_tokens.append,
                smp.cache_hbm_pinned_tokens.append,
                smp.cache_hbm_pending_tokens.append,
                smp.cache_dram_tokens.append,
                smp.cache_remote_tokens.append,
            )
        # the driver (below): the event the worker waits for and what it does then
        self._target: simpy.Event | None = None
        self._then: Then | None = None
        self._gen: Proc | None = None  # a rare path written as a generator, under way
        self._gen_then: Then | None = None
        # the callbacks the hot loop registers, bound once (not a new bound method per
        # wait); _pass takes the event it is called with and ignores it
        self._pass_cb: Then = self._pass
        self._target = call_urgent(self.env, self._start)  # as a SimPy process starts
        self._then = self._start

    def _prefill_time_s(self, num_seqs: int, tokens: int, pairs: float, cached: int = 0) -> float:
        key = (num_seqs, tokens, pairs, cached)
        t = self._prefill_times.get(key)
        if t is None:
            if len(self._prefill_times) >= _MAX_CACHED_PREFILLS:
                self._prefill_times.clear()
            t = (
                self.cost.prefill_time_s(num_seqs, tokens, pairs, cached)
                if cached
                else (self.cost.prefill_time_s(num_seqs, tokens, pairs))
            )
            self._prefill_times[key] = t
        return t

    def _copy(self, nbytes: float, kind: str, done: simpy.Event | None) -> FlowHandle | None:
        """One copy (prefix cache tier, all-to-all) as a flow on a topology fabric, on
        the worker's path of that kind (None: no such path on this fabric)."""
        box: list[FlowHandle] = []

        def finished() -> None:
            if box:
                self._copies.discard(box[0])
            if done is not None:
                done.succeed()

        handle = self.host.cache_copy(self, nbytes, kind, finished)
        if handle is None:
            return None
        box.append(handle)
        self._copies.add(handle)
        return handle

    def _cancel_copies(self) -> None:
        """The worker failed: its flows stop using the links."""
        for handle in list(self._copies):
            self.host.cancel_copy(handle)
        self._copies.clear()

    def use_all_to_all(self, share: float) -> None:
        """An EP unit across nodes on a topology fabric: each iteration's expert
        all-to-all moves as a flow on the NIC its KV handoffs use, carrying the
        ``share`` of its bytes that crosses it (the cost model already prices its time;
        the flow makes it load the links that KV handoffs and cache copies share)."""
        self._a2a = True
        self._a2a_share = share

    def _a2a_iteration_bytes(self, decode_batch: int, prefill_tokens: int) -> float:
        """Bytes of one iteration's all-to-all on the unit's ``a2a`` path: its share of
        dispatch and combine over RDMA (every MoE layer, every GPU)."""
        key = (decode_batch, prefill_tokens)
        out = self._a2a_bytes.get(key)
        if out is None:
            t = self.cost.all_to_all_traffic(decode_batch, prefill_tokens)  # type: ignore[attr-defined]
            per_gpu = t.num_layers * (t.dispatch_rdma_bytes + t.combine_rdma_bytes)
            out = per_gpu * self.cost.num_gpus * self._a2a_share
            self._a2a_bytes[key] = out
        return out

    def watch(self, changes: set[int]) -> None:
        """Report this worker's index into ``changes`` whenever a quantity the router
        indexes changes (KV blocks in use, queued tokens, outstanding requests, life)."""
        self._changes = changes
        changes.add(self.index)

    @property
    def kv_used_blocks(self) -> int:
        return self._kv_used_blocks

    @kv_used_blocks.setter
    def kv_used_blocks(self, blocks: int) -> None:
        self._kv_used_blocks = blocks
        self._changes.add(self.index)

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens assigned here and not yet prefilled."""
        return self._queued_tokens

    @queued_tokens.setter
    def queued_tokens(self, tokens: int) -> None:
        self._queued_tokens = tokens
        self._changes.add(self.index)

    def _assigned(self, tokens: int, requests: int) -> None:
        """``tokens`` more prompt tokens queued, ``requests`` more outstanding (one
        report of the change for both)."""
        self._queued_tokens += tokens
        self._num_outstanding += requests
        self._changes.add(self.index)

    @property
    def num_outstanding(self) -> int:
        """Requests assigned here and not yet finished or handed off."""
        return self._num_outstanding

    @num_outstanding.setter
    def num_outstanding(self, n: int) -> None:
        self._num_outstanding = n
        self._changes.add(self.index)

    @property
    def alive(self) -> bool:
        return self._alive

    @alive.setter
    def alive(self, alive: bool) -> None:
        self._alive = alive
        self.accepting = alive and self._state is WorkerState.IN_SERVICE
        self._changes.add(self.index)

    @property
    def state(self) -> WorkerState:
        return self._state

    @state.setter
    def state(self, state: WorkerState) -> None:
        self._state = state
        self.accepting = self._alive and state is WorkerState.IN_SERVICE
        self._changes.add(self.index)

    @property
    def free_blocks(self) -> int:
        return self.kv_capacity_blocks - self._kv_used_blocks

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used_blocks * self.block_tokens

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_capacity_blocks * self.block_tokens

    def notify(self) -> None:
        """Wake the worker if it is idle: one hop later, once, as an event succeeded now
        (the first new work schedules it, the rest finds it scheduled)."""
        if self._idle:
            self._idle = False
            env = self.env  # call_soon(env, self._pass_cb), inline
            ev = self._target = Call()
            ev.callbacks = [self._pass_cb]
            env._soon.append((next(env._eid), ev))
            self._then = self._pass_cb

    def sample(self, queue_len: int, batch: int) -> None:
        # written out where a worker samples once per run or request: the prefill idle
        # pass, the decode and vllm passes' runs (grep "sample(", inline)
        pack, put = self._sample_row  # a row of the host's samples
        put(
            pack(
                self.env._now,
                self.index,
                queue_len,
                batch,
                self._kv_used_blocks * self.block_tokens,
            )
        )
        if self._cache_to is not None:
            self._sample_cache(self._cache_to)

    def _sample_cache(self, columns: tuple[Any, ...]) -> None:
        """Prefix cache occupancy beside a sample: none on a worker without a cache."""
        for append in columns:
            append(0)

    def flush_steps(self) -> None:
        """The step-log rows written since the last flush, into :attr:`steps`' columns:
        before anyone reads them (the autoscaler, a failure, a swap stall, the run's
        result)."""
        for held, columns in self._held_steps:
            flush_held(held, columns)

    # -- failures ---------------------------------------------------------------------

    def fail(self, down_s: float) -> bool:
        """Kill the worker now; it serves again ``down_s`` later. False if already down."""
        if not self.alive:
            return False
        self.alive = False
        self.num_failures += 1
        self._down_s = down_s
        call_urgent(self.env, self._interrupted)  # as SimPy interrupts a process
        return True

    # -- the driver: callbacks in place of a SimPy process -------------------------------
    #
    # A worker is not a SimPy process: it registers a method as the callback of
    # the event it waits for (:meth:`_wait`), at the point where a process would yield
    # it, so SimPy schedules the same events in the same order and every record is the
    # same, without a generator resumed per state change. :meth:`_pass` is the loop's
    # head: it works until it registers the next wait and returns. It starts and fails
    # through URGENT events, as a process starts and is interrupted; a failure takes the
    # callback off the event waited for, as an interrupt takes off the process's.

    def _wait(self, ev: simpy.Event, then: Then) -> None:
        """Call ``then(ev)`` when ``ev`` is processed (now if it already was)."""
        callbacks = ev.callbacks
        if callbacks is None:
            then(ev)
            return
        callbacks.append(then)
        self._target = ev
        self._then = then

    def _sub(self, gen: Proc, then: Then) -> bool:
        """Run ``gen`` (a rare path written as a generator: a swap copy) as a SimPy process
        would run it: True when it waits (``then(None)`` follows its return), False when
        it returned without waiting."""
        try:
            ev = next(gen)
        except StopIteration:
            return False
        self._gen = gen
        self._gen_then = then
        self._wait(ev, self._gen_step)
        return True

    def _gen_step(self, ev: simpy.Event) -> None:
        gen = self._gen
        assert gen is not None
        try:
            nxt = gen.send(ev._value)
        except StopIteration:
            then = self._gen_then
            self._gen = self._gen_then = None
            assert then is not None
            then(None)
            return
        self._wait(nxt, self._gen_step)

    def _start(self, _ev: simpy.Event) -> None:
        self._pass()

    def _pass(self, _ev: simpy.Event | None = None) -> None:  # pragma: no cover - overridden
        """The loop's head (also the callback of a wake: ``_ev`` is ignored)."""
        raise NotImplementedError

    def _wait_for_work(self) -> None:
        """Wait for work (a drained worker first gives its GPUs back)."""
        if self._state is WorkerState.DRAINING and self._num_outstanding == 0:
            self.host.worker_drained(self)
        self._idle = True

    def _interrupted(self, _ev: simpy.Event) -> None:
        """The failure: what the worker waited for no longer concerns it (a swap copy
        under way ends as an interrupt ends it); it is down ``_down_s``, then serves."""
        target, then = self._target, self._then
        if target is not None and target.callbacks is not None and then is not None:
            target.callbacks.remove(then)
        self._target = self._then = None
        gen = self._gen
        if gen is not None:
            self._gen = self._gen_then = None
            try:
                gen.throw(simpy.Interrupt("failure"))
            except simpy.Interrupt:
                pass
        self._idle = False
        self._on_failure()
        self._cancel_copies()
        self._activity = None
        self.sample(0, 0)
        self._wait(self.env.timeout(self._down_s), self._recovered)

    def _recovered(self, _ev: simpy.Event) -> None:
        self.alive = True
        self.host.worker_recovered(self)
        self._pass()

    def _on_failure(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _TokenBatch(Worker):
    """A continuous batch of decoding sequences advanced in closed-form runs of steps."""

    __slots__ = (
        "_after_advance",
        "_finishing",
        "_leave_hooks",
        "_lines",
        "_longest",
        "_min_lines",
        "_intervals",
        "_by_longest",
        "_widen",
        "_phase_hist",
        "_rest_fn",
        "_run_end",
        "_run_cut_cb",
        "_run_done_cb",
        "_run_plan",
        "_run_timed_out_cb",
        "_run_timeout",
        "_run_wake",
        "_run_waited_cb",
        "_run_woken_cb",
        "_run_row",
        "_running",
        "_segment_row",
        "_spare",
        "batch",
        "context_tokens",
        "promised_growth",
        "step_idx",
        "swapped",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.batch = 0  # running sequences
        self.context_tokens = 0  # their total context (KV tokens read per step)
        self.step_idx = 0  # token steps completed so far
        self._finishing: list[tuple[int, int]] = []  # heap of (finish step, rid), lazy
        # rid -> (join step, ctx, finish step, tokens of ctx held in a prefix cache)
        self._running: dict[int, tuple[int, int, int, int]] = {}
        self._lines: dict[int, DecodeLines] = {}
        self.swapped: deque[int] = deque()  # preempted by swap: KV on the host
        self.promised_growth = 0  # blocks the run in progress will still allocate
        # the run in progress: (its seconds, its planned block growth, its planned steps,
        # its all-to-all flow, interruptible)
        self._run_plan: tuple[float, int, int, FlowHandle | None, bool] = (0.0, 0, 0, None, False)
        # an interruptible run: new work may cut it (notify), its own timeout until its
        # wait ends, the event of the wake by new work
        self._run_end = False
        self._run_timeout: simpy.Event | None = None
        self._run_wake: simpy.Event | None = None
        # A Call of this worker's own that was processed and that nothing refers to but
        # the worker: the next run, its cut's remainder or a vllm prefill iteration is
        # queued on it instead of a new one (about 500 machine instructions less each).
        # Only events with this worker's one callback become spare (a run's timeout or
        # hop, a cut's remainder, a prefill iteration's end), never a wake, which
        # call_soon_after may share with another worker.
        self._spare: Call | None = None
        super().__init__(*args, **kwargs)
        # a cost model whose kernel-bound decode part is the smallest of a few lines
        # (WorkerCost.decode_min_coeffs: TensorRT-LLM's XQA): batch -> its other lines
        self._min_lines: dict[int, tuple[tuple[float, float], ...]] | None = (
            {} if getattr(self.cost, "decode_min_lines", False) else None
        )
        # a cost model whose stream line changes with the tokens per sequence
        # (WorkerCost.decode_interval_coeffs: TensorRT-LLM's masked MHA): batch -> its
        # context intervals' lines
        self._intervals: dict[int, tuple[tuple[float, tuple[float, float]], ...]] | None = (
            {} if getattr(self.cost, "decode_interval_lines", False) else None
        )
        # a cost model whose busiest part holds the longest sequence whole (attention data
        # parallelism: WorkerCost.decode_longest_context_coeffs) takes its lines at
        # max(C, u C + v L): batch -> (u, v). Its runs take the kernel lines
        # (decode_coeffs, decode_min_coeffs, decode_item_coeffs), not interval lines (no
        # model has both)
        self._widen: dict[int, tuple[float, float]] | None = (
            {} if hasattr(self.cost, "decode_longest_context_coeffs") else None
        )
        # such a model, and a kernel that sizes its shared memory by the batch's longest
        # sequence (WorkerCost.decode_longest_coeffs: TensorRT-LLM's masked MHA takes the
        # longest past KV length; its intervals are then keyed by the longest sequence's
        # history), keep the longest sequence as a lazy max-heap of the running sequences'
        # (join step - context at join, rid) (a sequence's context now is step_idx minus
        # its key), pushed at each join; entries of sequences that left are dropped when
        # they reach the top
        self._by_longest = self._intervals is not None and hasattr(
            self.cost, "decode_longest_coeffs"
        )
        self._longest: list[tuple[int, int]] | None = (
            [] if self._by_longest or self._widen is not None else None
        )
        self._run_timed_out_cb: Then = self._run_timed_out  # bound once (Worker._pass_cb)
        self._run_woken_cb: Then = self._run_woken
        self._run_waited_cb: Then = self._run_waited
        self._run_done_cb: Then = self._run_done
        self._run_cut_cb: Then = self._run_cut
        # the rest of a pass (a colocated worker binds its scheduler's), and what follows
        # each advance of the batch (a colocated worker's prefix cache: its sync)
        self._rest_fn: Callable[[], bool] = self._rest
        self._after_advance: Callable[[], None] | None = None
        # whether _gone and _freed do anything (a colocated worker without a cache: no)
        self._leave_hooks = True
        # on_demand: running sequences by block phase, bin (context - step_idx) mod block
        self._phase_hist: list[int] = [0] * self.block_tokens
        # a segment row (rid, worker, start_step, tokens, at_s), Segments.add's:
        # put(pack(...))
        self._segment_row = self.host.segment_rows.write
        st = self.steps
        # a run's row (StepLog.add_run's values, in its order): put(pack(...)), held
        # until flush_steps
        columns = (
            st.run_start_at_s,
            st.run_steps,
            st.run_batch,
            st.run_context0,
            st.run_base_s,
            st.run_per_token_s,
            st.run_prefill_tokens,
        )
        held, self._run_row = held_rows(*columns)
        self._held_steps += ((held, columns),)

    def _lines_for(self, batch: int) -> DecodeLines:
        lines = self._lines.get(batch)
        if lines is None:
            base, per = self.cost.decode_coeffs(batch)
            item = getattr(self.cost, "decode_item_coeffs", None)
            ib, ip = item(batch) if item is not None else (0.0, 0.0)
            lines = self._lines[batch] = DecodeLines(base, per, item is not None, ib, ip)
        return lines

    def _interval_run(self, b: int, c: int, k: int) -> tuple[int, DecodeLines]:
        """A run of at most ``k`` steps from context ``c`` on the stream line of the regime
        holding the batch's longest sequence (``decode_longest_coeffs``: its history, the
        cached tokens before its step) or, for a cost model without that form, of the
        context interval holding ``c`` (``decode_interval_coeffs``); cut at the last step
        before the longest history (or the context) enters the next one (the next run
        takes its line). Returns the steps and the run's lines (the item line as before)."""
        lines = self._lines.get(b)
        if lines is None:
            lines = self._lines_for(b)
        cache = self._intervals
        assert cache is not None
        spans = cache.get(b)
        base, per = lines.base_s, lines.per_token_s
        if self._by_longest:
            if spans is None:
                spans = cache[b] = tuple(self.cost.decode_longest_coeffs(b))  # type: ignore[attr-defined]
            h = self._longest_history()  # at the run's first step; + 1 each step
            for start, line in spans:
                if h < start:  # the next regime: steps j with h + j < start run on this line
                    k = min(k, max(math.ceil(start - h), 1))
                    break
                base, per = line
        else:
            if spans is None:
                spans = cache[b] = tuple(self.cost.decode_interval_coeffs(b))  # type: ignore[attr-defined]
            for start, line in spans:
                if c < start:  # the next interval: steps j with c + j b < start run on this line
                    k = min(k, max(math.ceil((start - c) / b), 1))
                    break
                base, per = line
        if (base, per) == (lines.base_s, lines.per_token_s):
            return k, lines
        return k, DecodeLines(base, per, lines.has_item, lines.item_base_s, lines.item_per_token_s)

    def _longest_history(self) -> int:
        """Cached tokens of the running batch's longest sequence before the next step
        (its context minus the token the step adds: ops' ``ceil(C / B - 1)`` for equal
        lengths). Pops the heap's entries of sequences no longer running as it goes."""
        heap = self._longest
        assert heap is not None
        running = self._running
        while True:
            key, rid = heap[0]
            entry = running.get(rid)
            if entry is not None and entry[0] - entry[1] == key:
                return self.step_idx - key - 1
            heappop(heap)

    def _push_longest(self, heap: list[tuple[int, int]], key: int, rid: int) -> None:
        """A sequence joined (``key``: join step - context at join). The heap is rebuilt
        from the running batch when stale entries outnumber the running ones, so it stays
        within twice the batch (amortised O(1) a join besides the push)."""
        heappush(heap, (key, rid))
        if len(heap) > 2 * self.batch + 64:
            heap[:] = [(e[0] - e[1], r) for r, e in self._running.items()]
            heapify(heap)

    def _widened_run(self, b: int, c: int, k: int) -> tuple[int, DecodeLines]:
        """A run of at most ``k`` steps from context ``c`` for a cost model whose lines are
        taken at ``X = max(C, u C + v L)`` (``decode_longest_context_coeffs``; ``L`` the
        longest sequence's context, + 1 a step, while C grows by ``b``). The second term
        grows no faster than C (``u b + v <= b``), so it is the larger at most over the
        run's first steps: the run is cut where C catches up, and meanwhile runs on the
        lines at ``X = x0 + s j`` (step ``j``), rewritten as lines in ``c + b j`` (the
        form a run and its records take). Returns the steps and the run's lines."""
        cache = self._widen
        assert cache is not None
        uv = cache.get(b)
        if uv is None:
            uv = cache[b] = self.cost.decode_longest_context_coeffs(b)  # type: ignore[attr-defined]
        u, v = uv
        x0 = u * c + v * (self._longest_history() + 1) if b > 0 else 0.0
        if not x0 > c:  # C is the larger throughout: the lines as they are
            if self._min_lines is not None:
                return self._min_line_run(b, c, k)
            hit = self._lines.get(b)
            return k, hit if hit is not None else self._lines_for(b)
        s = u * b + v
        if s < b:  # C catches up at step ceil((x0 - c) / (b - s)): the next run is on C
            k = min(k, max(math.ceil((x0 - c) / (b - s)), 1))
        if self._min_lines is not None:
            k, lines = self._min_line_run(b, x0, k, s)
        else:
            hit = self._lines.get(b)
            lines = hit if hit is not None else self._lines_for(b)

        def on_c(base: float, per: float) -> tuple[float, float]:
            # base + per (x0 + s j) = base' + per' (c + b j)
            per_c = per * s / b
            return base + per * x0 - per_c * c, per_c

        base, per = on_c(lines.base_s, lines.per_token_s)
        ib, ip = on_c(lines.item_base_s, lines.item_per_token_s)
        return k, DecodeLines(base, per, lines.has_item, ib, ip)

    def _min_line_run(
        self, b: int, c: float, k: int, growth: float | None = None
    ) -> tuple[int, DecodeLines]:
        """A run of at most ``k`` steps from context ``c`` on the smallest of the cost
        model's kernel lines (``decode_coeffs`` and ``decode_min_coeffs``): that line at
        the first step, until the step before another becomes smaller (the run is cut
        there, as at any state change; the next run takes the next line). Returns the
        steps and the run's lines (the item line as before). ``growth``: the context's
        growth a step where the lines are taken at another context than the batch's
        (:meth:`_widened_run`; None: ``b``)."""
        g = b if growth is None else growth
        lines = self._lines.get(b)
        if lines is None:
            lines = self._lines_for(b)
        cache = self._min_lines
        assert cache is not None
        alts = cache.get(b)
        if alts is None:
            alts = cache[b] = tuple(self.cost.decode_min_coeffs(b))  # type: ignore[attr-defined]
        cands = ((lines.base_s, lines.per_token_s), *alts)
        ab, ap = cands[0]
        at = ab + ap * c
        for ob, op in cands[1:]:
            ot = ob + op * c
            if ot < at:
                ab, ap, at = ob, op, ot
        for ob, op in cands:
            if op >= ap:  # never drops below the active line as the context grows
                continue
            # first step j at which this line is below the active one
            j = math.floor((ob - ab + (op - ap) * c) / ((ap - op) * g)) + 1
            j = min(max(j, 1), k)
            while j > 1 and ob + op * (c + (j - 1) * g) < ab + ap * (c + (j - 1) * g):
                j -= 1
            while j < k and not ob + op * (c + j * g) < ab + ap * (c + j * g):
                j += 1
            if ob + op * (c + j * g) < ab + ap * (c + j * g) and j < k:
                k = j
        if (ab, ap) == (lines.base_s, lines.per_token_s):
            return k, lines
        return k, DecodeLines(ab, ap, lines.has_item, lines.item_base_s, lines.item_per_token_s)

    # -- KV blocks ----------------------------------------------------------------------

    def _blocks_now(self, rid: int) -> int:
        """Blocks the running sequence ``rid`` holds now."""
        if self.requests.reserve_full:
            return self.requests.full_blocks(rid)
        join, ctx, _, in_cache = self._running[rid]
        return _ceil_div(ctx - in_cache + self.step_idx - join, self.block_tokens)

    def _new_blocks(self, t: int) -> int:
        """Blocks the running batch allocates over its next ``t`` steps (on_demand).

        A sequence whose context is ``r`` (mod block ``B``) allocates ``ceil((r + t)/B) -
        ceil(r/B)`` blocks in ``t`` steps: ``q`` (``t = qB + m``) plus one more exactly
        when ``r`` is one of the ``m`` values ``0, -1, ..., -(m-1)`` (mod ``B``). Its
        phase bin is ``(context - step_idx) mod B``, so those sequences are the bins
        ``a, a-1, ..., a-m+1`` with ``a = -step_idx mod B``: a cyclic slice of the
        histogram. Integer arithmetic, at most two slices (one lookup for ``t = 1``)."""
        if t <= 0 or self.batch == 0:
            return 0
        bs = self.block_tokens
        q, m = divmod(t, bs)
        total = q * self.batch
        if m:
            hist = self._phase_hist
            a = -self.step_idx % bs
            lo = a - m + 1
            if lo >= 0:
                total += hist[a] if m == 1 else sum(hist[lo : a + 1])
            else:
                total += sum(hist[: a + 1]) + sum(hist[bs + lo :])
        return total

    def growth_headroom(self) -> int:
        """Blocks to keep free for the running batch before admitting anything new: the
        rest of the run in progress, or its next step. Without it a preempted sequence
        would be re-admitted at once and preempted again (a livelock)."""
        if self.requests.reserve_full or self.batch == 0:
            return 0
        # _new_blocks(1): the sequences whose context ends a block now (with one-token
        # blocks, bin 0 holds every sequence)
        nxt = self._phase_hist[-self.step_idx % self.block_tokens]
        grown = self.promised_growth
        return grown if grown > nxt else nxt

    def _steps_fitting(self, k: int) -> int:
        """Most steps (<= k) the batch can run before it needs more blocks than exist."""
        if self.requests.reserve_full:
            return k
        free = self.free_blocks
        if self.batch * (k // self.block_tokens + 1) <= free:
            return k
        lo, hi = 0, k  # _new_blocks(lo) fits; find the largest fitting t
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._new_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -- joining and leaving ---------------------------------------------------------

    def _join(self, rid: int, in_cache: int = 0) -> None:
        """Add a request (its KV blocks already held here) to the running batch at a step
        boundary. It emits its remaining tokens at the next steps. ``in_cache``: tokens of
        its context held by the worker's prefix cache (its blocks count from there)."""
        rs = self.requests
        log = self.host.log
        step = self.step_idx
        generated = rs.generated[rid]
        ctx = rs.prompt_tokens[rid] + generated
        log.first_token_step[rid] = step
        log.decode_worker[rid] = self.index
        fin = step + rs.output_tokens[rid] - generated
        self._running[rid] = (step, ctx, fin, in_cache)
        self.batch += 1
        self.context_tokens += ctx
        heappush(self._finishing, (fin, rid))
        if self._longest is not None:
            self._push_longest(self._longest, step - ctx, rid)
        if not rs.reserve_full:
            self._phase_hist[(ctx - in_cache - step) % self.block_tokens] += 1

    def _leave(self, rid: int) -> int:
        """Remove a running request; record its segment; return the blocks it held."""
        rs = self.requests
        join, ctx, _, in_cache = self._running.pop(rid)
        emitted = self.step_idx - join
        self.batch -= 1
        self.context_tokens -= ctx + emitted
        if rs.reserve_full:
            blocks = rs.full_blocks(rid)
        else:  # _blocks_now
            bt = self.block_tokens
            blocks = -(-(ctx - in_cache + emitted) // bt)
            self._phase_hist[(ctx - in_cache - join) % bt] -= 1
        if emitted:  # Segments.add, one row
            pack, put = self._segment_row
            put(pack(rid, self.index, join, emitted, _NAN))
            rs.generated[rid] += emitted
        return blocks

    def _pop_finished(self) -> None:
        finishing = self._finishing
        step = self.step_idx
        if not finishing or finishing[0][0] > step:
            return
        host = self.host
        now = self.env._now
        running = self._running
        while finishing and finishing[0][0] <= step:
            fin, rid = heappop(finishing)
            entry = running.get(rid)
            if entry is None or entry[2] != fin:
                continue  # stale: preempted or failed earlier
            blocks = self._leave(rid)
            self._kv_used_blocks -= blocks
            self._num_outstanding -= 1
            self._changes.add(self.index)
            if self._leave_hooks:
                self._gone(rid)
                host.finish(rid, now)
                self._freed()
            else:  # both hooks do nothing here
                host.finish(rid, now)

    def _gone(self, rid: int) -> None:
        """``rid`` no longer belongs to this worker (finished or sent back)."""

    def _freed(self) -> None:
        """Blocks were released here (subclasses tell whoever waits for them)."""

    def _next_finish_step(self) -> int:
        while self._finishing:
            fin, rid = self._finishing[0]
            entry = self._running.get(rid)
            if entry is not None and entry[2] == fin:
                return fin
            heappop(self._finishing)
        raise RuntimeError("running batch without a finishing sequence")

    # -- preemption ------------------------------------------------------------------

    def _preempt_for_growth(self) -> Proc:
        """Preempt the most recently admitted sequences until the next step fits."""
        host = self.host
        swap_bytes = 0
        victims: list[int] = []
        while self.batch and self._new_blocks(1) > self.free_blocks:
            rid = next(reversed(self._running))
            self.kv_used_blocks -= self._leave(rid)
            host.log.num_preemptions[rid] += 1
            victims.append(rid)
            swap_bytes += context_kv_bytes(
                self.cost, int(self.requests.prompt_tokens[rid] + self.requests.generated[rid])
            )
        if host.preemption == "swap":
            # swapped from the copy's start: a failure during it loses them with the rest
            self.swapped.extend(victims)
            if swap_bytes:
                yield from self._swap_stall(swap_bytes, "out", len(victims))
        else:
            # every victim leaves this worker's counts before any is sent back: one sent
            # back re-enters the router (and frees blocks for waiting handoffs), which
            # reads this worker's seats and committed KV and must find them whole
            for rid in victims:
                self._let_go(rid)
            for rid in victims:
                self._recompute(rid)

    def _let_go(self, rid: int) -> None:
        """A victim of recompute preemption, out of the batch, leaves this worker's
        counts (no call out of the worker)."""
        raise NotImplementedError

    def _recompute(self, rid: int) -> None:
        """Send a victim this worker let go of back for its re-prefill."""
        raise NotImplementedError

    def _swap_in(self) -> Proc:
        """Bring swapped sequences back (oldest first) while their blocks fit."""
        back: list[int] = []
        nbytes = 0
        for rid in self.swapped:
            if self.batch + len(back) >= self.max_batch_seqs:
                break
            need = self.requests.context_blocks(rid)
            # + 1: the returning sequence's own next step may open a block
            if need + 1 + self.watermark_blocks + self.growth_headroom() > self.free_blocks:
                break
            self.kv_used_blocks += need
            back.append(rid)
            nbytes += context_kv_bytes(
                self.cost, int(self.requests.prompt_tokens[rid] + self.requests.generated[rid])
            )
        if back:
            # they stay swapped until the copy ends: a failure during it loses them
            yield from self._swap_stall(nbytes, "in", len(back))
            for rid in back:
                self.swapped.popleft()
                self._join(rid)

    def _swap_stall(self, nbytes: float, direction: str, num_seqs: int) -> Proc:
        """The worker does no token step while it copies ``nbytes`` of KV to host memory
        (``out``) or back; logged as a stall from its start to its end (or the failure
        that cuts it, which also stops the copy)."""
        host = self.host
        start = self.env._now
        self._activity = _STALL
        self.flush_steps()  # the stall's row is written in place below
        log = self.steps.prefill_iters
        log.append((start, 0.0, 0, 0))
        i = len(log) - 1
        try:
            yield host.swap_copy(self, nbytes, direction, num_seqs)
        finally:
            log[i] = (start, self.env._now - start, 0, 0)
            host.cancel_swap(self)
        self._activity = None

    # -- runs of steps ---------------------------------------------------------------

    # A run in three plain calls around its waits (:meth:`_start_run` and its callbacks):
    # begin (the event to wait on), cut (new work arrived: the wait up to the step
    # boundary where it stops), end.

    def _pass(self, _ev: simpy.Event | None = None) -> None:
        """The loop's head: swapped sequences back first, then the rest of a pass
        (:meth:`_rest`), again until a pass waits."""
        while True:
            if self.swapped and self._sub(self._swap_in(), self._after_swap):
                return
            if self._rest_fn():
                return

    def _after_swap(self, _ev: None) -> None:
        if not self._rest_fn():
            self._pass()

    def _rest(self) -> bool:  # pragma: no cover - overridden
        """A pass after the swap-in: True when it waits, False to pass again at once."""
        raise NotImplementedError

    def _start_run(self, interruptible: bool) -> bool:
        """Advance the running batch to its next completion or block shortage (or to the
        step boundary after new work arrives, when ``interruptible``): True when it
        waits; False after a preemption for growth that did not wait (the loop passes
        again)."""
        if not self._begin_run(interruptible):
            return self._sub(self._preempt_for_growth(), self._pass_cb)
        return True

    # An interruptible run's wait ends at its timeout or when new work arrives, whichever
    # first, one hop later (the hops of the SimPy condition over the two that this
    # replaced): notify schedules the wake (_run_woken) only when work arrives. The
    # timeout first: the hop to _run_done (the run ran to its end); the wake first: the
    # hop to _run_waited (cut the run at the step boundary covering now), and the
    # timeout's callback is taken off (it would do nothing).

    def notify(self) -> None:
        """Wake the worker if it is idle, or cut its interruptible run."""
        if self._idle:
            self._idle = False
            self._target = call_soon(self.env, self._pass_cb)
            self._then = self._pass_cb
        elif self._run_end:
            self._run_end = False
            env = self.env  # call_soon(env, self._run_woken_cb), inline
            ev = self._run_wake = Call()
            ev.callbacks = [self._run_woken_cb]
            env._soon.append((next(env._eid), ev))

    # A hop is an event due now, queued after every event already due now: where none is
    # (the queue's next event is later), it would be the very next event processed, so
    # it is not queued and its callback runs at once (the same order, one event less).

    def _run_timed_out(self, ev: Call) -> None:
        if ev is self._run_timeout:
            self._run_timeout = None
            env = self.env
            queue = env._queue
            if env._soon or queue and queue[0][0] <= env._now:  # another due now: hop after it
                self._target = call_soon(env, self._run_done_cb)
                self._then = self._run_done_cb
            else:
                self._run_done(ev)

    def _run_woken(self, ev: simpy.Event) -> None:
        if ev is self._run_wake:
            self._run_wake = None
            timeout = self._run_timeout
            if timeout is not None:  # not processed yet: it will find nothing to call
                timeout.callbacks.clear()
                self._run_timeout = None
                env = self.env
                queue = env._queue
                if env._soon or queue and queue[0][0] <= env._now:  # another due now: hop after
                    self._target = call_soon(env, self._run_waited_cb)
                    self._then = self._run_waited_cb
                else:
                    # what the worker waits for is this event, being processed (as the
                    # hop would be), not the timeout whose callbacks were just cleared: a
                    # failure after a cut that leaves the worker idle finds nothing to take off
                    self._target = ev
                    self._then = self._run_waited_cb
                    self._run_waited(ev)

    def _run_done(self, ev: Call) -> None:
        """The run's wait is over at its end (its timeout, or a run new work cannot
        cut): every planned step is done (:meth:`_end_run` of an uncut run)."""
        self._spare = ev  # the run's timeout or its hop: processed, this worker's alone
        self._run_end = False
        self._run_wake = None  # a wake made after the hop does nothing
        run: RunFields = self._activity  # type: ignore[assignment]  # a run waits here
        self._activity = None
        # the histogram and step index do not change during a run: the growth planned
        # at its start is the growth of its steps
        self._advance(run, self._run_plan[1])
        self._pop_finished()
        if self.swapped or not self._rest_fn():  # _pass, its first turn inline
            self._pass()

    def _run_waited(self, _ev: simpy.Event) -> None:
        rest_s = self._cut_run()
        if rest_s > 0:
            env = self.env  # call_in(env, rest_s, self._run_cut_cb), inline
            ev = self._spare
            if ev is None:
                ev = Call()
            else:
                self._spare = None
            self._target = ev
            ev.callbacks = [self._run_cut_cb]
            heappush(env._queue, (env._now + rest_s, NORMAL, next(env._eid), ev))
            self._then = self._run_cut_cb
            return
        self._end_run()
        if self.swapped or not self._rest_fn():  # _pass, its first turn inline
            self._pass()

    def _run_cut(self, ev: Call) -> None:
        self._spare = ev  # the remainder: processed, this worker's alone
        # _end_run, inline: a cut run's steps are done
        run: RunFields = self._activity  # type: ignore[assignment]  # a run waits here
        self._activity = None
        _, growth, planned, _, _ = self._run_plan
        self._advance(run, growth if run[1] == planned else None)  # run[1]: its steps
        finishing = self._finishing  # a cut run's end is seldom a finish: _pop_finished's test
        if finishing and finishing[0][0] <= self.step_idx:
            self._pop_finished()
        if self.swapped or not self._rest_fn():  # _pass, its first turn inline
            self._pass()

    def _begin_run(self, interruptible: bool) -> bool:
        """Start the run to the next completion or block shortage and wait for its end
        (or, ``interruptible``, new work). False: no step fits, preempt first."""
        env = self.env
        b, c = self.batch, self.context_tokens
        on_demand = not self.requests.reserve_full
        finishing = self._finishing
        if finishing:  # _next_finish_step, its common case (the heap's top is valid)
            fin, rid = finishing[0]
            entry = self._running.get(rid)
            if entry is None or entry[2] != fin:
                fin = self._next_finish_step()
        else:
            fin = self._next_finish_step()
        k = fin - self.step_idx
        # _steps_fitting, its common case first: a block for every sequence per block of
        # steps, and one more, fit
        if on_demand and b * (k // self.block_tokens + 1) > (
            self.kv_capacity_blocks - self._kv_used_blocks
        ):
            k = self._steps_fitting(k)
        if k == 0:
            return False
        start = env._now
        if self._widen is not None:  # lines at max(C, u C + v L): cut where C catches up
            k, lines = self._widened_run(b, c, k)
        elif self._min_lines is not None:  # the smallest of a few kernel lines: cut at a switch
            k, lines = self._min_line_run(b, c, k)
        elif self._intervals is not None:  # a line per context interval: cut entering the next
            k, lines = self._interval_run(b, c, k)
        else:
            hit = self._lines.get(b)
            lines = hit if hit is not None else self._lines_for(b)
        base, per, has_item, item_base, item_per = lines  # no NamedTuple attribute calls
        run: RunFields
        if has_item and (
            item_per - per > 0 or item_base + item_per * c > base + per * c
        ):  # the item line may be the larger one in this run: DecodeLines.split
            two = lines.split(start, k, b, c)
            total = two.time_s(k)
            run = two
        else:  # the stream line throughout (split's common case), its time inline
            run = (start, k, b, c, base, per, 0, 0.0, 0.0)  # Run(start, k, b, c, base, per)
            total = k * base + per * (k * c + b * k * (k - 1) / 2)
        self._activity = run
        growth = 0
        if on_demand:  # _new_blocks(k), inline (k >= 1; an empty batch's histogram is 0)
            bs = self.block_tokens
            growth = k // bs * b
            m = k % bs
            if m:
                hist = self._phase_hist
                a = -self.step_idx % bs
                lo = a - m + 1
                if lo >= 0:
                    growth += hist[a] if m == 1 else sum(hist[lo : a + 1])
                else:
                    growth += sum(hist[: a + 1]) + sum(hist[bs + lo :])
        self.promised_growth = growth
        a2a = None
        if self._a2a:  # the run's all-to-all on the unit's NICs, while it runs
            a2a = self._copy(self._a2a_iteration_bytes(b, 0) * k, "a2a", None)
        self._run_plan = (total, growth, k, a2a, interruptible)
        # call_in(env, total, then), inline, on the spare Call if any
        ev = self._spare
        if ev is None:
            ev = Call()
        else:
            self._spare = None
        self._target = ev
        if interruptible:  # its end or new work, whichever first (_run_timed_out, notify)
            then = self._then = self._run_timed_out_cb
            self._run_timeout = ev
            self._run_end = True
        else:
            then = self._then = self._run_done_cb
        ev.callbacks = [then]
        heappush(env._queue, (env._now + total, NORMAL, next(env._eid), ev))
        return True

    def _cut_run(self) -> float:
        """The run's wait is over. Woken by new work before its end: cut it at the step
        boundary covering now, and return the seconds until that boundary (0: there)."""
        total, _, _, a2a, interruptible = self._run_plan
        if not interruptible:
            return 0.0
        self._run_end = False
        self._run_wake = None  # a wake made after the hop does nothing
        run: RunFields = self._activity  # type: ignore[assignment]  # a run waits here
        start_s, steps, b, c, base, per, lead, lead_base, lead_per = run
        tau = self.env._now - start_s
        if tau < total - _EPS:  # the run's own timeout, due later, does nothing
            if lead:  # two lines (DecodeLines.split's run)
                two = Run._make(run)
                k = two.steps_covering(tau)
                run = two.with_steps(k)
                rest_s = two.time_s(k) - tau
            else:  # Run.steps_covering and time_s of a one-line run, inline
                k = _affine_covering(tau, steps, base, per, b, c)
                run = (start_s, k, b, c, base, per, 0, 0.0, 0.0)  # run.with_steps(k)
                rest_s = k * base + per * (k * c + b * k * (k - 1) / 2) - tau
            if a2a is not None and a2a in self._copies:  # carry only the steps run
                self._copies.discard(a2a)
                rest = self._a2a_iteration_bytes(b, 0) * k - self.host.cancel_copy(a2a)
                if rest > 0:
                    self._copy(rest, "a2a", None)
            self._activity = run
            if rest_s > 0:
                return rest_s
        return 0.0

    def _end_run(self) -> None:
        """The run's steps are done: advance the batch, let finished sequences go."""
        run = self._activity
        assert isinstance(run, tuple)
        _, growth, planned, _, _ = self._run_plan
        self._activity = None
        # the histogram and step index do not change during a run: the growth planned
        # at its start is the growth of its steps, unless it was cut short
        self._advance(run, growth if run[1] == planned else None)  # run[1]: its steps
        self._pop_finished()

    def _advance(self, run: RunFields, growth: int | None = None, prefill_tokens: int = 0) -> None:
        """The batch has completed ``run``'s steps (``growth``: the blocks they allocate,
        when already known; ``prefill_tokens``: a mixed iteration's prompt chunks)."""
        start_s, k, b, c, base_s, per_s, lead, _, _ = run
        self.promised_growth = 0
        pack, put = self._run_row  # Run.log_to, its rows held (flush_steps)
        if lead:
            for row in Run._make(run).rows():
                put(pack(*row, prefill_tokens))
        elif k:  # a one-segment run: one row (none for no steps)
            put(pack(start_s, k, b, c, base_s, per_s, prefill_tokens))
        if not self.requests.reserve_full:
            grown = self._new_blocks(k) if growth is None else growth
            if grown:
                self._kv_used_blocks += grown
                self._changes.add(self.index)
        self.step_idx += k
        self.context_tokens += k * b
        if self._after_advance is not None:
            self._after_advance()

    def _settle_interrupted_run(self) -> None:
        """On failure mid-run: count the steps that completed before now (its timeout
        and a wake under way then do nothing)."""
        self._run_end = False
        self._run_timeout = self._run_wake = None
        act = self._activity
        if not isinstance(act, tuple):  # not a run
            return
        run = Run._make(act)
        j = run.steps_done_by(self.env._now - run.start_s)
        if j:
            self._advance(run.with_steps(j))

    def _drop_running(self) -> list[int]:
        """Failure: every running and swapped sequence loses its KV."""
        lost = []
        for rid in list(self._running):
            self._leave(rid)
            lost.append(rid)
        lost.extend(self.swapped)
        self.swapped.clear()
        self._finishing.clear()
        if self._longest is not None:
            self._longest.clear()
        self._phase_hist = [0] * self.block_tokens
        self.promised_growth = 0
        return lost


class _PrefillQueue:
    """The FCFS queue of requests routed to a worker that has not started their prefill
    (prefill and colocated workers)."""

    __slots__ = ()

    queue: deque[int]
    requests: RequestState
    prefix: WorkerKvCache | None  # the worker's prefix cache (None: no caching)
    _caches: PrefixCaches | None  # the run's caches (tiers, overlap index)
    # with a cache: each queued request's tokens in queued_tokens, as booked by submit
    _booked: dict[int, int] | None

    if TYPE_CHECKING:  # provided by Worker, which every user of this mixin also is

        @property
        def queued_tokens(self) -> int: ...
        @queued_tokens.setter
        def queued_tokens(self, tokens: int) -> None: ...
        @property
        def num_outstanding(self) -> int: ...
        @num_outstanding.setter
        def num_outstanding(self, n: int) -> None: ...
        def notify(self) -> None: ...
        def _assigned(self, tokens: int, requests: int) -> None: ...

        @property
        def _queued_tokens(self) -> int: ...
        @_queued_tokens.setter
        def _queued_tokens(self, tokens: int) -> None: ...
        @property
        def _num_outstanding(self) -> int: ...
        @_num_outstanding.setter
        def _num_outstanding(self, n: int) -> None: ...

        index: int
        _changes: set[int]

    def _sample_cache(self, columns: tuple[Any, ...]) -> None:
        """Prefix cache occupancy beside a sample: HBM tokens (pinned and pending among
        them), the worker's node's DRAM tier and the remote store."""
        c, caches = self.prefix, self._caches
        if c is None or caches is None:
            for append in columns:
                append(0)
            return
        hbm, pinned, pending, dram, remote = columns
        hbm(c.tokens_total)
        pinned(c.pinned_tokens)
        pending(c.pending_tokens)
        dram(caches.dram_tokens_of(self.index))
        remote(caches.remote_tokens())

    def submit(self, rid: int, front: bool = False, tokens: int | None = None) -> None:
        """Queue ``rid`` for its prefill, booking ``tokens`` in :attr:`queued_tokens`
        (None: its whole :meth:`~RequestState.prefill_len`; the cache-aware router books
        the tokens this worker's HBM does not hold). A worker with a prefix cache keeps
        each booking, and takes exactly that back when the request leaves the queue
        (:meth:`_unbook`): its prefill starts, it is taken back, or the worker fails."""
        if front:
            self.queue.appendleft(rid)
        else:
            self.queue.append(rid)
        if tokens is None:
            rs = self.requests
            tokens = rs.prompt_tokens[rid] + rs.generated[rid]  # prefill_len
        if self._booked is not None:
            self._booked[rid] = tokens
        # _assigned(tokens, 1), inline
        self._queued_tokens += tokens
        self._num_outstanding += 1
        self._changes.add(self.index)
        self.notify()

    def _unbook(self, rid: int) -> int:
        """The tokens ``rid`` booked when it was queued here (leaving the queue now)."""
        if self._booked is not None:
            return self._booked.pop(rid)
        return self.requests.prefill_len(rid)

    def remove_queued(self, rid: int) -> bool:
        """Take back a request whose prefill has not started (False if not queued)."""
        try:
            self.queue.remove(rid)
        except ValueError:
            return False
        self.queued_tokens -= self._unbook(rid)
        self.num_outstanding -= 1
        return True


class PrefillWorker(_PrefillQueue, Worker):
    __slots__ = (
        "_booked",
        "_caches",
        "_computed_cb",
        "_extra",
        "_outside_tokens",
        "_promoting",
        "_spare",
        "batch_end_at_s",
        "held",
        "in_batch",
        "prefix",
        "queue",
    )
    role = "prefill"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.queue: deque[int] = deque()
        self.held: dict[int, int] = {}  # prefilled, KV here awaiting handoff -> blocks
        # in the running prefill -> blocks (read by the handoff and the cluster)
        self.in_batch: dict[int, int] = {}
        self.batch_end_at_s = 0.0  # when the running (or last) prefill batch ends
        # prefix caching (the cluster sets these): the worker's cache, the run's caches
        self.prefix: WorkerKvCache | None = None
        self._caches: PrefixCaches | None = None
        self._booked: dict[int, int] | None = None  # with a cache: queued -> tokens booked
        self._extra: dict[int, int] = {}  # cache-admitted -> tokens past its prompt
        self._outside_tokens = 0  # KV held outside the cache (re-prefilled replies)
        # a batch waiting for its cache promotions: its tokens, pairs, cached tokens and
        # promotion seconds without a flow
        self._promoting: tuple[int, float, int, float] = (0, 0.0, 0, 0.0)
        # the Call of the last prefill's end, processed (only this worker's callback was
        # on it): the next prefill's end is queued on it (_TokenBatch._spare's reuse)
        self._spare: Call | None = None
        super().__init__(*args, **kwargs)
        self._computed_cb: Then = self._computed  # bound once (Worker._pass_cb)

    def use_cache(self, caches: PrefixCaches) -> None:
        """Prefill through a prefix cache: only a request's uncached suffix is computed."""
        self._caches = caches
        self.prefix = caches.attach(self)
        self._booked = {}

    def release_kv(self, rid: int) -> None:
        """The handoff of ``rid`` completed (or was abandoned): its KV leaves this worker."""
        blocks = self.held.pop(rid, None)
        if blocks is not None:
            if self.prefix is not None:
                self.prefix.release(rid)  # its blocks stay cached, unpinned
                self._outside_tokens -= self._extra.pop(rid, 0)
                self._sync_kv()
            else:
                self._kv_used_blocks -= blocks
            self._num_outstanding -= 1
            self._changes.add(self.index)
            if self._idle:  # notify, inline
                self._idle = False
                env = self.env  # call_soon(env, self._pass_cb), inline
                ev = self._target = Call()
                ev.callbacks = [self._pass_cb]
                env._soon.append((next(env._eid), ev))
                self._then = self._pass_cb

    def _sync_kv(self) -> None:
        """With a cache: the KV in use is the cache's pinned and pending tokens plus what
        is held outside it (cached blocks no request uses are evictable, not in use)."""
        c = self.prefix
        assert c is not None
        used = c.pinned_tokens + c.pending_tokens + self._outside_tokens
        self.kv_used_blocks = -(-used // self.block_tokens)

    def _form_cached_batch(self) -> tuple[list[int], int, float, int, int, int, int, int]:
        """FCFS through the prefix cache: each request's lookup and admission (its hit
        prefix pinned, lower-tier hits promoted, its suffix allocated, unpinned blocks
        evicted to fit); the token budget counts uncached tokens. Returns the batch, its
        new tokens, attention pairs, cached tokens, prompt tokens dequeued, and the bytes
        to promote over PCIe and the NIC and to demote over PCIe."""
        cache, caches = self.prefix, self._caches
        assert cache is not None and caches is not None
        rs = self.requests
        limit = self.kv_capacity_blocks * self.block_tokens
        batch: list[int] = []
        tokens = cached = dequeued = pcie = nic = demote = 0
        pairs = 0.0
        while self.queue and len(batch) < self.max_batch_seqs:
            rid = self.queue[0]
            prompt = rs.prompt_tokens[rid]
            extra = rs.prefill_len(rid) - prompt  # a re-prefill also recomputes its reply
            chain = caches.chain(rid)
            new = cache.lookup(chain, prompt).new_tokens + extra
            if batch and tokens + new > self.max_batch_tokens:
                break
            adm = cache.admit(rid, chain, prompt, limit - self._outside_tokens - extra)
            if adm is None:
                break  # no room even after evicting every unpinned block: wait
            self.queue.popleft()
            batch.append(rid)
            hit = adm.lookup.hit_tokens
            tokens += new
            cached += hit
            pairs += new * hit + new * (new + 1) / 2
            dequeued += self._unbook(rid)  # what submit booked
            pcie += adm.promote_pcie_bytes
            nic += adm.promote_nic_bytes
            demote += adm.demote_pcie_bytes
            self._extra[rid] = extra
            self._outside_tokens += extra
            caches.log.record(rid, adm.lookup.tier_hit_tokens())
        return batch, tokens, pairs, cached, dequeued, pcie, nic, demote

    def _cache_copies(self, pcie: int, nic: int, demote: int) -> tuple[simpy.Event | None, float]:
        """Start a batch's cache copies. On a topology fabric built with cache paths they
        are flows sharing the links with KV handoffs: the returned event fires when the
        promotions (host DRAM over PCIe, the remote store over the NIC) are done, and
        demotions run on without anyone waiting. Copies without a path take the link
        time of the worker's PCIe or NIC (the returned seconds)."""
        caches = self._caches
        assert caches is not None
        env = self.env
        waits: list[simpy.Event] = []
        timed_pcie = timed_nic = 0
        for nbytes, kind in ((pcie, "h2d"), (nic, "nic.in")):
            if not nbytes:
                continue
            ev = env.event()
            if self._copy(nbytes, kind, ev) is not None:
                waits.append(ev)
            elif kind == "h2d":
                timed_pcie = nbytes
            else:
                timed_nic = nbytes
        if demote:
            self._copy(demote, "d2h", None)
        timed_s = 0.0
        if timed_pcie or timed_nic:
            timed_s = caches.setup.promote_time(self.cost, timed_pcie, timed_nic)
        return (env.all_of(waits) if waits else None), timed_s

    def _form_batch(self) -> tuple[list[int], float, dict[int, int], int, int]:
        """FCFS under the token budget and the free blocks. Returns the batch, its
        attention pairs (Σ n(n+1)/2 over its prompts' lengths n,
        :meth:`RequestState.prefill_len`, in batch order), the blocks each takes
        (:meth:`RequestState.prefill_blocks`), their tokens and their blocks."""
        queue = self.queue
        batch: list[int] = []
        pairs = 0.0  # each term a half-integer far below 2**53: the sum is exact
        blocks: dict[int, int] = {}
        tokens = need_blocks = 0
        if not queue:
            return batch, pairs, blocks, tokens, need_blocks
        rs = self.requests
        prompt, generated = rs.prompt_tokens, rs.generated
        bt = self.block_tokens
        free = self.kv_capacity_blocks - self._kv_used_blocks
        max_seqs, max_tokens = self.max_batch_seqs, self.max_batch_tokens
        while queue and len(batch) < max_seqs:
            rid = queue[0]
            p = prompt[rid] + generated[rid]
            if batch and tokens + p > max_tokens:
                break
            nb = -(-p // bt)
            if need_blocks + nb > free:
                break  # KV memory full of prompts awaiting handoff: wait for releases
            queue.popleft()
            batch.append(rid)
            pairs += p * (p + 1) / 2
            blocks[rid] = nb
            tokens += p
            need_blocks += nb
        return batch, pairs, blocks, tokens, need_blocks

    def _pass(self, _ev: simpy.Event | None = None) -> None:
        """Form the next FCFS batch and start its prefill (or wait for work)."""
        promote_s = 0.0
        cached = 0
        copies: simpy.Event | None = None
        if self.prefix is None:
            if not self.queue:  # nothing to form (the idle pass after a release)
                # sample(0, 0), inline (no cache columns: no cache here)
                pack, put = self._sample_row
                put(pack(self.env._now, self.index, 0, 0, self._kv_used_blocks * self.block_tokens))
                # _wait_for_work, inline
                if self._state is _DRAINING and self._num_outstanding == 0:
                    self.host.worker_drained(self)
                self._idle = True
                return
            batch, pairs, blocks, tokens, need_blocks = self._form_batch()
            if batch:
                dequeued = tokens
                self.in_batch = blocks
                self._kv_used_blocks += need_blocks
                self._changes.add(self.index)
        else:
            batch, tokens, pairs, cached, dequeued, pcie, nic, demote = self._form_cached_batch()
            if batch:
                self.in_batch = dict.fromkeys(batch, 0)
                self._sync_kv()
                copies, promote_s = self._cache_copies(pcie, nic, demote)
        if not batch:
            self.sample(len(self.queue), 0)
            self._wait_for_work()
            return
        self._queued_tokens -= dequeued
        self._changes.add(self.index)
        # sample(len(self.queue), len(batch)), inline
        pack, put = self._sample_row
        put(
            pack(
                self.env._now,
                self.index,
                len(self.queue),
                len(batch),
                self._kv_used_blocks * self.block_tokens,
            )
        )
        if self._cache_to is not None:
            self._sample_cache(self._cache_to)
        host = self.host
        for r in batch:
            host.prefill_started(r, self.index)
        self._activity = batch  # a prefill-only iteration over batch
        if copies is not None:
            # promotion flows finish before the prefill computes (a failure meanwhile
            # cuts this record at the failure)
            pack, put = self._iter_row  # PrefillIters.append, its row held (flush_steps)
            put(pack(self.env._now, 0.0, len(batch), tokens))
            self._promoting = (tokens, pairs, cached, promote_s)
            self._wait(copies, self._promoted)
            return
        self._compute(batch, tokens, pairs, cached, promote_s, False)

    def _promoted(self, _ev: simpy.Event) -> None:
        batch = self._activity
        assert type(batch) is list
        tokens, pairs, cached, promote_s = self._promoting
        self._compute(batch, tokens, pairs, cached, promote_s, True)

    def _compute(
        self,
        batch: list[int],
        tokens: int,
        pairs: float,
        cached: int,
        promote_s: float,
        logged: bool,
    ) -> None:
        """The batch's prefill computes (``logged``: its row was written when its cache
        promotions started)."""
        env = self.env
        now = env._now
        # promotions from lower cache tiers finish before the prefill computes
        dur = self._prefill_times.get((len(batch), tokens, pairs, cached))
        if dur is None:
            dur = self._prefill_time_s(len(batch), tokens, pairs, cached)
        dur += promote_s
        if logged:
            self.flush_steps()
            self.steps.prefill_iters[-1] = (now, dur, len(batch), tokens)
        else:  # PrefillIters.append, its row held (flush_steps)
            pack, put = self._iter_row
            put(pack(now, dur, len(batch), tokens))
        if self._a2a:  # the iteration's all-to-all on the unit's NICs
            self._copy(self._a2a_iteration_bytes(0, tokens), "a2a", None)
        self.batch_end_at_s = now + dur
        if self.host.early_handoffs:  # prefill_batch_started does nothing otherwise
            self.host.prefill_batch_started(batch, self, dur)
        # call_in(env, dur, self._computed_cb), inline, on the spare Call if any
        ev = self._spare
        if ev is None:
            ev = Call()
        else:
            self._spare = None
        self._target = ev
        then = self._then = self._computed_cb
        ev.callbacks = [then]
        heappush(env._queue, (now + dur, NORMAL, next(env._eid), ev))

    def _computed(self, ev: Call) -> None:
        """The batch's prefill is done: its KV is held here until its handoff."""
        self._spare = ev  # processed, this worker's alone
        batch: list[int] = self._activity  # type: ignore[assignment]  # its prefill waits here
        self._activity = None
        self.held.update(self.in_batch)  # in batch order
        self.in_batch = {}
        if self.prefix is not None:
            put = 0
            for r in batch:
                put += self.prefix.commit(r).remote_put_bytes  # computed: hit-able now
            if put:
                self._copy(put, "nic.out", None)  # write-through, nobody waits
            self._sync_kv()
        host = self.host
        for r in batch:
            host.prefill_done(r, self)
        self._pass()

    def _on_failure(self) -> None:
        host = self.host
        act = self._activity
        in_batch = list(act) if type(act) is list else []
        if in_batch:  # the iteration was logged with its full length: cut it at the failure
            self.flush_steps()
            start, _, n, tok = self.steps.prefill_iters[-1]
            self.steps.prefill_iters[-1] = (start, self.env._now - start, n, tok)
        queued = list(self.queue)
        held = list(self.held)
        self.queue.clear()
        self.held.clear()
        self.in_batch = {}
        self.queued_tokens = 0
        if self._booked is not None:
            self._booked.clear()
        self.num_outstanding = 0
        self.kv_used_blocks = 0
        if self.prefix is not None:  # the lost worker's HBM cache is gone
            self.prefix.clear()
            self._extra.clear()
            self._outside_tokens = 0
            self._cancel_copies()
        host.prefill_worker_lost(self, queued, in_batch, held)


class DecodeWorker(_TokenBatch):
    __slots__ = (
        "_eventual",
        "_eventual_blocks",
        "incoming",
        "waiting",
    )
    role = "decode"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.waiting: deque[int] = deque()  # KV here, waiting for a seat
        self.incoming: dict[int, int] = {}  # blocks reserved, KV in flight -> blocks
        # blocks the sequences assigned here may hold at their longest (prompt +
        # max_tokens; for a default cap, the reserve: RequestState.promise_blocks; the
        # router never sees the realised reply length): back-pressure promises decode
        # room against this, not against today's free blocks
        self._eventual_blocks = 0
        self._eventual: dict[int, int] = {}
        super().__init__(*args, **kwargs)

    @property
    def eventual_blocks(self) -> int:
        return self._eventual_blocks

    @eventual_blocks.setter
    def eventual_blocks(self, blocks: int) -> None:
        self._eventual_blocks = blocks
        self._changes.add(self.index)

    def room_blocks(self) -> int:
        """The most blocks a handoff may take here now: free blocks less the watermark,
        the running batch's growth and one block for the sequence's own next step;
        negative when taking nothing (not accepting, or swapped sequences come first)."""
        if not self.accepting or self.swapped:
            return -1
        free = self.kv_capacity_blocks - self._kv_used_blocks - 1 - self.watermark_blocks
        if self.requests.reserve_full or self.batch == 0:  # growth_headroom, inline
            return free
        nxt = self._phase_hist[-self.step_idx % self.block_tokens]
        grown = self.promised_growth
        return free - (grown if grown > nxt else nxt)

    def can_accept(self, rid: int) -> bool:
        """Room for ``rid``'s KV (keeping the watermark), and no swapped-out sequence
        waiting to come back first."""
        return (
            self.accepting
            and not self.swapped
            and self.requests.join_blocks(rid) + 1 + self.watermark_blocks + self.growth_headroom()
            <= self.free_blocks
        )

    def reserve(self, rid: int) -> None:
        """Claim KV blocks for an incoming handoff (called by the router)."""
        rs = self.requests
        bt = rs.block_tokens
        full = rs.longest_blocks[rid]  # rs.full_blocks(rid)
        # rs.join_blocks
        blocks = full if rs.reserve_full else -(-(rs.prefilled_tokens[rid] + 1) // bt)
        self._kv_used_blocks += blocks
        self.incoming[rid] = blocks
        self._num_outstanding += 1
        # what it is committed to hold here: rs.promise_blocks(rid), its common case inline
        if rs.reserve_tokens is not None:
            full = rs.promise_blocks(rid)
        self._eventual[rid] = full
        self._eventual_blocks += full
        self._changes.add(self.index)

    def unreserve(self, rid: int) -> None:
        """An incoming handoff will not arrive (its source failed, or it was abandoned)."""
        blocks = self.incoming.pop(rid, None)
        if blocks is not None:
            self.kv_used_blocks -= blocks
            self.num_outstanding -= 1
            self._gone(rid)
            self._freed()
            if self.swapped:  # an idle worker may now have room to swap them back in
                self.notify()

    def kv_arrived(self, rid: int, after: Call | None = None) -> None:
        """``rid``'s KV is here: it waits for a seat at the next step boundary (an idle
        worker is woken, an interruptible run cut). ``after``: the event due now queued
        last, with nothing scheduled since (the source prefill worker's wake): the wake
        joins it (:func:`~disaggsim.engine.events.call_soon_after`)."""
        blocks = self.incoming.pop(rid)
        # the reservation becomes the running sequence's blocks (see _join)
        rs = self.requests
        if rs.reserve_full:  # rs.join_blocks
            grown = rs.full_blocks(rid) - blocks
        else:
            grown = -(-(rs.prefilled_tokens[rid] + 1) // rs.block_tokens) - blocks
        if grown:
            self._kv_used_blocks += grown
            self._changes.add(self.index)
        self.waiting.append(rid)
        if self._idle:  # notify, inline
            self._idle = False
            self._target = (
                call_soon(self.env, self._pass_cb)
                if after is None
                else call_soon_after(after, self._pass_cb)
            )
            self._then = self._pass_cb
        elif self._run_end:
            self._run_end = False
            if after is not None:  # call_soon_after(after, self._run_woken_cb), inline
                after.callbacks.append(self._run_woken_cb)
                self._run_wake = after
            else:  # call_soon(env, self._run_woken_cb), inline
                env = self.env
                ev = self._run_wake = Call()
                ev.callbacks = [self._run_woken_cb]
                env._soon.append((next(env._eid), ev))

    def finish_without_decode(self, rid: int) -> None:
        """A one-token reply: the KV arrived, nothing to decode."""
        self.unreserve(rid)

    def _freed(self) -> None:
        self.host.decode_freed()

    def _let_go(self, rid: int) -> None:
        self.num_outstanding -= 1
        self._gone(rid)

    def _recompute(self, rid: int) -> None:
        self._freed()
        self.host.reprefill(rid, "preempted")

    def _gone(self, rid: int) -> None:
        self._eventual_blocks -= self._eventual.pop(rid, 0)
        self._changes.add(self.index)

    def _rest(self) -> bool:
        """Waiting sequences join at this step boundary, then the batch runs (or the
        worker waits for work)."""
        waiting = self.waiting
        if waiting and self.batch < self.max_batch_seqs:
            admit = self.host.log.decode_admit_at_s
            now = self.env._now
            while waiting and self.batch < self.max_batch_seqs:
                rid = waiting.popleft()
                admit[rid] = now
                self._join(rid)
        if self.batch == 0:
            self.sample(len(waiting) + len(self.swapped), 0)
            # _wait_for_work, inline
            if self._state is _DRAINING and self._num_outstanding == 0:
                self.host.worker_drained(self)
            self._idle = True
            return True
        # sample(len(waiting) + len(self.swapped), self.batch), inline
        pack, put = self._sample_row
        put(
            pack(
                self.env._now,
                self.index,
                len(waiting) + len(self.swapped),
                self.batch,
                self._kv_used_blocks * self.block_tokens,
            )
        )
        if self._cache_to is not None:
            self._sample_cache(self._cache_to)
        # _start_run, inline
        if not self._begin_run(self.batch < self.max_batch_seqs):
            return self._sub(self._preempt_for_growth(), self._pass_cb)
        return True

    def _on_failure(self) -> None:
        self._settle_interrupted_run()
        lost = self._drop_running() + list(self.waiting) + list(self.incoming)
        self.waiting.clear()
        self.incoming.clear()
        self.kv_used_blocks = 0
        self.num_outstanding = 0
        self.eventual_blocks = 0
        self._eventual.clear()
        self.host.decode_worker_lost(self, lost)


class ColocatedWorker(_PrefillQueue, _TokenBatch):
    __slots__ = (
        "_booked",
        "_cache_blocks",
        "_caches",
        "_hit",
        "_mixed_cb",
        "_mixing",
        "_prefilled_cb",
        "_promote",
        "_vllm",
        "_reserved",
        "_starved_at_step",
        "num_chunk_budget_full_steps",
        "num_chunked_steps",
        "prefilling",
        "prefix",
        "queue",
        "scheduler",
    )
    role = "colocated"

    def __init__(self, *args: Any, scheduler: str, **kwargs: Any) -> None:
        self.scheduler = scheduler
        self._vllm = scheduler == "vllm"
        # the chunked iteration in progress: its start, seconds, batch, context, prompt
        # chunks, their tokens, the prompts it completes, and whether it filled the token
        # budget with prompt tokens left
        self._mixing: tuple[float, float, int, int, int, int, list[int], bool] = (
            0.0,
            0.0,
            0,
            0,
            0,
            0,
            [],
            False,
        )
        # chunked: iterations that carried prompt chunks or ran while a prompt waited on
        # the token budget, and those of them whose decode tokens and chunks reached the
        # budget with prompt tokens left (a larger budget would have run them otherwise);
        # _starved_at_step: the step from which the decode batch alone fills the budget
        # while prompts wait (-1: not so)
        self.num_chunked_steps = 0
        self.num_chunk_budget_full_steps = 0
        self._starved_at_step = -1
        self.queue: deque[int] = deque()  # waiting for prefill (no KV yet)
        self.prefilling: list[list[int]] = []  # chunked: [rid, tokens done]
        # prefix caching (the cluster sets it, on_demand admission and recompute only):
        # a request's prompt KV lives in the cache (pinned, pending); the tokens past it
        # (its reply so far) in blocks outside it, counted by the growth arithmetic
        self.prefix: WorkerKvCache | None = None
        self._caches: PrefixCaches | None = None
        self._booked: dict[int, int] | None = None  # with a cache: queued -> tokens booked
        self._cache_blocks = 0  # blocks of the cache's pinned + pending tokens, counted
        self._reserved: dict[int, int] = {}  # prefilling -> blocks reserved outside
        self._hit: dict[int, int] = {}  # prefilling -> its cached prefix tokens
        self._promote = [0, 0]  # bytes to promote (PCIe, NIC) before the next iteration
        super().__init__(*args, **kwargs)
        self._prefilled_cb: Then = self._prefilled  # bound once (Worker._pass_cb)
        self._mixed_cb: Then = self._mixed
        self._rest_fn = self._vllm_rest if self._vllm else self._chunked_rest
        self._leave_hooks = False  # _freed does nothing, _gone only with a cache (use_cache)

    def use_cache(self, caches: PrefixCaches) -> None:
        """Prefill through a prefix cache: only a request's uncached suffix is computed."""
        self._caches = caches
        self.prefix = caches.attach(self)
        self._booked = {}
        self._leave_hooks = True  # _gone releases a leaving sequence's cached prefix
        if not self.requests.reserve_full:
            # decode growth may need unpinned cached blocks' memory: sync after advances
            self._after_advance = self._sync_cache

    def _rest(self) -> bool:
        return self._vllm_rest() if self._vllm else self._chunked_rest()

    def _let_go(self, rid: int) -> None:
        self.num_outstanding -= 1
        self._release_cached(rid)  # its computed prompt blocks stay cached, unpinned

    def _recompute(self, rid: int) -> None:
        self.submit(rid, front=True)

    # -- prefix cache ------------------------------------------------------------------

    def _sync_cache(self) -> None:
        """Count the cache's in-use tokens (pinned + pending) in the worker's blocks, and
        keep the cache within what the blocks outside it leave (unpinned cached blocks
        are evicted when decode growth needs their memory)."""
        c = self.prefix
        assert c is not None
        bt = self.block_tokens
        blocks = -(-(c.pinned_tokens + c.pending_tokens) // bt)
        self.kv_used_blocks += blocks - self._cache_blocks
        self._cache_blocks = blocks
        outside = self._kv_used_blocks - blocks
        c.evict_to((self.kv_capacity_blocks - outside) * bt)

    def _promotion_s(self) -> float:
        """Link time of the promotions admitted since the last iteration (host DRAM over
        PCIe, the remote store over the NIC): the iteration that prefills them waits."""
        pcie, nic = self._promote
        if not (pcie or nic) or self._caches is None:
            return 0.0
        self._promote = [0, 0]
        return self._caches.setup.promote_time(self.cost, pcie, nic)

    def _release_cached(self, rid: int) -> None:
        if self.prefix is not None and self.prefix.holds(rid):
            self.prefix.release(rid)
            self._sync_cache()

    def _gone(self, rid: int) -> None:
        if self.prefix is not None:  # _release_cached
            self._release_cached(rid)

    def _admit_cached(self, seats_used: int, budget_left: int | None) -> bool:
        """Cached mode's admission of the head of the queue: a seat, the token budget
        (its uncached tokens), and the cache's admission within the memory the blocks
        outside it leave (its reply slot, the watermark and the batch's growth kept
        free). Admits it (pins, promotes, allocates) and starts its prefill."""
        cache, caches = self.prefix, self._caches
        assert cache is not None and caches is not None
        if not self.queue or seats_used >= self.max_batch_seqs or self.swapped:
            return False
        rid = self.queue[0]
        rs = self.requests
        prompt = rs.prompt_tokens[rid]
        extra = rs.prefill_len(rid) - prompt  # a re-prefilled reply: outside the cache
        chain = caches.chain(rid)
        look = cache.lookup(chain, prompt)
        if budget_left is not None and look.new_tokens + extra > budget_left:
            return False
        reserve = -(-(extra + 1) // self.block_tokens)  # and the first token's slot
        outside = self._kv_used_blocks - self._cache_blocks
        keep = reserve + self.watermark_blocks + self.growth_headroom()
        limit = (self.kv_capacity_blocks - outside - keep) * self.block_tokens
        adm = cache.admit(rid, chain, prompt, limit)
        if adm is None:
            return False
        caches.log.record(rid, adm.lookup.tier_hit_tokens())
        self._promote[0] += adm.promote_pcie_bytes
        self._promote[1] += adm.promote_nic_bytes
        self._hit[rid] = adm.lookup.hit_tokens
        self._reserved[rid] = reserve
        self.queue.popleft()
        self.kv_used_blocks += reserve
        self._sync_cache()
        self.queued_tokens -= self._unbook(rid)
        self.host.prefill_started(rid, self.index)
        return True

    def _decode_or_idle(self) -> bool:
        """No prefill to run: advance the running batch, or wait for work (True: waits;
        False: a preemption for growth did not wait)."""
        waiting = len(self.queue) + len(self.swapped)
        if self.batch == 0:
            self.sample(waiting, 0)
            self._wait_for_work()
            return True
        self.sample(waiting, self.batch)
        # A new arrival can only start at a boundary if a seat is free; memory may still
        # block it, in which case the next completion ends the run anyway.
        return self._start_run(self.batch < self.max_batch_seqs)

    def _admissible(self, seats_used: int) -> bool:
        """Can the head of the queue start its prefill (a seat and its KV blocks free)?"""
        if not self.queue or seats_used >= self.max_batch_seqs or self.swapped:
            return False
        need = self.requests.colocated_blocks(self.queue[0])
        return need + self.watermark_blocks + self.growth_headroom() <= self.free_blocks

    def _start_prefill(self, rid: int) -> None:
        host = self.host
        self.queue.popleft()
        self.kv_used_blocks += self.requests.colocated_blocks(rid)
        self.queued_tokens -= self.requests.prefill_len(rid)
        host.prefill_started(rid, self.index)

    def _prefill_finished(self, rid: int) -> None:
        host = self.host
        now = self.env._now
        host.log.prefill_end_at_s[rid] = now
        rs = self.requests
        prompt = rs.prompt_tokens[rid]  # one read (an array read makes an int)
        in_cache = 0
        if self.prefix is not None:
            self.prefix.commit(rid)  # its computed blocks become hit-able
            self._hit.pop(rid, None)
            held = self._reserved.pop(rid)
            in_cache = prompt
        elif rs.reserve_full:  # rs.colocated_blocks
            held = rs.full_blocks(rid)
        else:
            held = -(-(prompt + rs.generated[rid] + 1) // self.block_tokens)
        if rs.ended[rid]:  # abandoned while its prefill ran
            self.kv_used_blocks -= held
            self._release_cached(rid)
            self.num_outstanding -= 1
            host.bury(rid)
            return
        generated = host.prefill_token(rid, now)
        out = rs.output_tokens[rid]
        if generated >= out:  # done generating
            self.kv_used_blocks -= held
            self._release_cached(rid)
            self.num_outstanding -= 1
            host.finish(rid, now)
            return
        log = host.log
        admit = log.decode_admit_at_s
        t = admit[rid]  # one read (an array read makes a float)
        if t != t:  # NaN: first join
            admit[rid] = now
        # _join(rid, in_cache), inline, with the tokens delivered and the reply's length
        # known here (each array read makes an int)
        step = self.step_idx
        ctx = prompt + generated
        log.first_token_step[rid] = step
        log.decode_worker[rid] = self.index
        fin = step + out - generated
        self._running[rid] = (step, ctx, fin, in_cache)
        self.batch += 1
        self.context_tokens += ctx
        heappush(self._finishing, (fin, rid))
        if self._longest is not None:
            self._push_longest(self._longest, step - ctx, rid)
        # <= 0: prefill reserved one more
        if rs.reserve_full:
            grown = rs.full_blocks(rid) - held
        else:  # _blocks_now of the sequence just joined: its context past the cache
            bt = self.block_tokens
            self._phase_hist[(ctx - in_cache - step) % bt] += 1
            grown = -(-(ctx - in_cache) // bt) - held
        if grown:
            self._kv_used_blocks += grown
            self._changes.add(self.index)

    def _vllm_rest(self) -> bool:
        """Prefill-prioritising continuous batching: waiting prompts run first, as a
        prefill-only iteration that stalls every running decode."""
        env = self.env
        batch: list[int] = []
        pairs = 0.0  # Σ n(n+1)/2 over the prompts, in order: exact (half-integers)
        tokens = 0
        queue = self.queue
        if self.prefix is None:
            if queue and not self.swapped:
                # _admissible and _start_prefill, inline: the growth headroom does
                # not change while prefills start, the free blocks do
                rs = self.requests
                full, bt = rs.reserve_full, self.block_tokens
                keep = self.watermark_blocks
                if not full and self.batch:  # + growth_headroom(), inline
                    nxt = self._phase_hist[-self.step_idx % bt]
                    grown = self.promised_growth
                    keep += grown if grown > nxt else nxt
                while queue and self.batch + len(batch) < self.max_batch_seqs:
                    rid = queue[0]
                    p = rs.prompt_tokens[rid] + rs.generated[rid]  # prefill_len
                    if full:  # rs.colocated_blocks
                        need = rs.full_blocks(rid)
                    else:
                        need = -(-(p + 1) // bt)
                    if need + keep > self.kv_capacity_blocks - self._kv_used_blocks:
                        break
                    if batch and tokens + p > self.max_batch_tokens:
                        break
                    batch.append(rid)
                    pairs += p * (p + 1) / 2
                    queue.popleft()
                    self._kv_used_blocks += need
                    self._queued_tokens -= p
                    self._changes.add(self.index)
                    self.host.prefill_started(rid, self.index, p)
                    tokens += p
        else:
            while self.queue:
                rid = self.queue[0]
                left = self.max_batch_tokens - tokens if batch else None
                if not self._admit_cached(self.batch + len(batch), left):
                    break
                batch.append(rid)
                tokens += self.requests.prefill_len(rid) - self._hit[rid]
        if batch:
            # sample(len(queue), self.batch + len(batch)), inline
            pack, put = self._sample_row
            put(
                pack(
                    env._now,
                    self.index,
                    len(queue),
                    self.batch + len(batch),
                    self._kv_used_blocks * self.block_tokens,
                )
            )
            if self._cache_to is not None:
                self._sample_cache(self._cache_to)
            if self.prefix is None:
                dur = self._prefill_times.get((len(batch), tokens, pairs, 0))
                if dur is None:
                    dur = self._prefill_time_s(len(batch), tokens, pairs)
            else:  # each prompt's uncached suffix after its cached prefix
                hits = [self._hit[r] for r in batch]
                news = [self.requests.prefill_len(r) - h for r, h in zip(batch, hits, strict=True)]
                pairs = sum(n * h + n * (n + 1) / 2 for n, h in zip(news, hits, strict=True))
                dur = self._prefill_time_s(len(batch), tokens, pairs, sum(hits))
                dur += self._promotion_s()
            pack, put = self._iter_row  # PrefillIters.append, its row held (flush_steps)
            put(pack(env._now, dur, len(batch), tokens))
            self._activity = batch  # a prefill-only iteration over batch
            # call_in(env, dur, self._prefilled_cb), inline, on the spare Call if any
            ev = self._spare
            if ev is None:
                ev = Call()
            else:
                self._spare = None
            self._target = ev
            then = self._then = self._prefilled_cb
            ev.callbacks = [then]
            heappush(env._queue, (env._now + dur, NORMAL, next(env._eid), ev))
            return True
        # _decode_or_idle, inline
        waiting = len(queue) + len(self.swapped)
        if self.batch == 0:
            self.sample(waiting, 0)
            self._wait_for_work()
            return True
        # sample(waiting, self.batch), inline
        pack, put = self._sample_row
        put(
            pack(
                env._now, self.index, waiting, self.batch, self._kv_used_blocks * self.block_tokens
            )
        )
        if self._cache_to is not None:
            self._sample_cache(self._cache_to)
        # _start_run, inline
        if not self._begin_run(self.batch < self.max_batch_seqs):
            return self._sub(self._preempt_for_growth(), self._pass_cb)
        return True

    def _prefilled(self, ev: Call) -> None:
        """A prefill-only iteration ended: its sequences join the batch (or finish)."""
        self._spare = ev  # processed, this worker's alone
        batch = self._activity
        assert type(batch) is list
        self._activity = None
        for r in batch:
            self._prefill_finished(r)
        self._pass()

    def _chunked_rest(self) -> bool:
        """Sarathi-style: each iteration carries one token per running sequence plus
        prompt chunks filling the rest of the token budget."""
        env = self.env
        if self._starved_at_step >= 0:
            self._count_starved_steps()
        if self.prefix is None:
            while self._admissible(self.batch + len(self.prefilling)):
                rid = self.queue[0]
                self._start_prefill(rid)
                self.prefilling.append([rid, 0])
        else:
            while self.queue:
                rid = self.queue[0]
                if not self._admit_cached(self.batch + len(self.prefilling), None):
                    break
                self.prefilling.append([rid, self._hit[rid]])  # from its cached prefix
        if self.prefilling:
            self._drop_abandoned_chunks()
        budget = self.max_batch_tokens - self.batch
        if not (self.prefilling and budget > 0):
            if self.prefilling:  # the decode batch alone fills the budget: prompts wait
                self._starved_at_step = self.step_idx
            return self._decode_or_idle()
        if self.batch and self._steps_fitting(1) == 0:
            return self._sub(self._preempt_for_growth(), self._pass_cb)
        budget = self.max_batch_tokens - self.batch
        chunk_tokens = 0
        pairs = 0.0
        cached = 0
        chunk_seqs = 0
        done_now: list[int] = []
        for entry in self.prefilling:
            if chunk_tokens >= budget:
                break
            rid, done = entry
            c = min(self.requests.prefill_len(rid) - done, budget - chunk_tokens)
            pairs += c * done + c * (c + 1) / 2
            cached += done
            chunk_tokens += c
            chunk_seqs += 1
            entry[1] = done + c
            if entry[1] >= self.requests.prefill_len(rid):
                done_now.append(rid)
        b, ctx = self.batch, self.context_tokens
        self.sample(len(self.queue), b + len(self.prefilling))
        # masked MHA sizes its shared memory by the longest sequence (None: no such lines)
        longest = self._longest_history() if b and self._longest is not None else None
        dur = self.cost.mixed_time_s(
            b, ctx, chunk_seqs, chunk_tokens, pairs, cached, decode_longest_history_tokens=longest
        )
        if self.prefix is not None:
            dur += self._promotion_s()
        self._activity = _MIXED
        # chunks stop at the budget only: below it, every prompt in prefill ended here
        full = chunk_tokens >= budget and len(done_now) < len(self.prefilling)
        self._mixing = (env._now, dur, b, ctx, chunk_seqs, chunk_tokens, done_now, full)
        self._target = call_in(env, dur, self._mixed_cb)
        self._then = self._mixed_cb
        return True

    def _count_starved_steps(self) -> None:
        """Count the decode-only steps run since the decode batch alone filled the token
        budget while prompts waited (each a budget-full chunked step)."""
        n = self.step_idx - self._starved_at_step
        self.num_chunked_steps += n
        self.num_chunk_budget_full_steps += n
        self._starved_at_step = -1

    def chunk_budget_counts(self) -> tuple[int, int]:
        """(chunked steps, budget-full chunked steps) so far: see ``num_chunked_steps``."""
        if self._starved_at_step >= 0:
            self._count_starved_steps()
            self._starved_at_step = self.step_idx  # still starved: count on from here
        return self.num_chunked_steps, self.num_chunk_budget_full_steps

    def _drop_abandoned_chunks(self) -> None:
        """Requests whose clients left between two chunks of their prompt stop here, as
        vLLM aborts them at its next step: their KV is freed before the next iteration
        (they used to be prefilled to the end, holding the worker for nobody). With a
        prefix cache, the blocks its finished chunks computed stay cached (committed as
        each chunk ended), its other blocks are dropped (never computed)."""
        rs = self.requests
        ended = rs.ended
        if not any(ended[e[0]] for e in self.prefilling):
            return
        keep = []
        for entry in self.prefilling:
            rid = entry[0]
            if not ended[rid]:
                keep.append(entry)
                continue
            if self.prefix is None:
                self.kv_used_blocks -= rs.colocated_blocks(rid)  # what _start_prefill took
            else:  # as _prefill_finished, less the commit of blocks never computed
                self._hit.pop(rid, None)
                self.kv_used_blocks -= self._reserved.pop(rid)
                self._release_cached(rid)
            self.num_outstanding -= 1
            self.host.bury(rid)
        self.prefilling = keep

    def _mixed(self, _ev: simpy.Event) -> None:
        """A chunked iteration ended: its token step and its chunks are done."""
        start, dur, b, ctx, chunk_seqs, chunk_tokens, done_now, full = self._mixing
        self._activity = None
        self.num_chunked_steps += 1
        if full:
            self.num_chunk_budget_full_steps += 1
        if b:
            # Run(start, 1, b, ctx, dur, 0.0): its fields, and its prompt chunks' tokens
            self._advance((start, 1, b, ctx, dur, 0.0, 0, 0.0, 0.0), None, chunk_tokens)
        else:  # PrefillIters.append, its row held (flush_steps)
            pack, put = self._iter_row
            put(pack(start, dur, chunk_seqs, chunk_tokens))
        self._pop_finished()
        if self.prefix is not None:  # blocks computed so far are hit-able
            bt = self.prefix.block_tokens
            for rid, done in self.prefilling:
                if rid not in done_now:
                    self.prefix.commit(rid, upto_blocks=done // bt)
            self._sync_cache()
        if done_now:
            finished = set(done_now)
            self.prefilling = [e for e in self.prefilling if e[0] not in finished]
            for rid in done_now:
                self._prefill_finished(rid)
        self._pass()

    def _on_failure(self) -> None:
        host = self.host
        act = self._activity
        self._settle_interrupted_run()
        in_prefill: list[int] = []
        if type(act) is list:  # a prefill-only iteration
            in_prefill = list(act)
            self.flush_steps()
            start, _, n, tok = self.steps.prefill_iters[-1]
            self.steps.prefill_iters[-1] = (start, self.env._now - start, n, tok)
        # a mixed iteration is logged only when it ends: nothing to cut
        in_prefill += [e[0] for e in self.prefilling if e[0] not in in_prefill]
        self.prefilling = []
        lost = self._drop_running() + in_prefill
        queued = list(self.queue)
        self.queue.clear()
        self.queued_tokens = 0
        if self._booked is not None:
            self._booked.clear()
        self.kv_used_blocks = 0
        self.num_outstanding = 0
        if self.prefix is not None:  # the lost worker's HBM cache is gone
            self.prefix.clear()
            self._cache_blocks = 0
            self._reserved.clear()
            self._hit.clear()
            self._promote = [0, 0]
        host.colocated_worker_lost(self, queued, lost)
