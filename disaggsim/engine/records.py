"""What the engine records while it runs: flat per-request arrays and per-worker step logs,
and the :class:`RawResult` it returns.

The hot loop only writes numbers into preallocated numpy arrays and appends small tuples
to lists; DataFrames and per-token timestamps are derived after the run
(:mod:`disaggsim.metrics.reconstruct`).

Status codes of a request: see :data:`STATUS_NAMES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from disaggsim.fabric.flows import LinkUtilisation, TransferRecord
    from disaggsim.workload.requests import Requests

STATUS_UNFINISHED = 0
STATUS_COMPLETED = 1
STATUS_REJECTED = 2
STATUS_ABANDONED = 3
STATUS_NAMES = {
    STATUS_UNFINISHED: "unfinished",
    STATUS_COMPLETED: "completed",
    STATUS_REJECTED: "rejected",
    STATUS_ABANDONED: "abandoned",
}


def _times(n: int) -> np.ndarray:
    return np.full(n, np.nan)


def _ints(n: int, fill: int) -> np.ndarray:
    return np.full(n, fill, dtype=np.int64)


@dataclass(slots=True)
class RequestLog:
    """Per-request timestamps (seconds, NaN = did not happen) and integer fields (-1 =
    none), one array per column, preallocated for every request
    (:meth:`empty`).

    ``first_token_step`` is the decode worker's token-step index at which the request
    emits its second token (its first decode step). Where a request decodes in several
    *segments* (after a preemption or a failure), :class:`Segments` holds them all and
    the columns here describe the last one.
    """

    prefill_start_at_s: np.ndarray  # first prefill
    prefill_end_at_s: np.ndarray  # last prefill
    transfer_start_at_s: np.ndarray  # first KV handoff
    transfer_end_at_s: np.ndarray  # last KV handoff
    decode_admit_at_s: np.ndarray  # first join of a decode batch
    first_token_at_s: np.ndarray
    finish_at_s: np.ndarray
    prefill_worker: np.ndarray  # last prefill's worker
    decode_worker: np.ndarray  # last decode segment's worker
    first_token_step: np.ndarray
    num_preemptions: np.ndarray
    num_retries: np.ndarray
    num_prefills: np.ndarray
    status: np.ndarray  # STATUS_* codes
    reason: dict[int, str] = field(default_factory=dict)  # rejected/abandoned: why

    @classmethod
    def empty(cls, n: int) -> RequestLog:
        """The log of ``n`` requests before anything happened to them."""
        return cls(
            prefill_start_at_s=_times(n),
            prefill_end_at_s=_times(n),
            transfer_start_at_s=_times(n),
            transfer_end_at_s=_times(n),
            decode_admit_at_s=_times(n),
            first_token_at_s=_times(n),
            finish_at_s=_times(n),
            prefill_worker=_ints(n, -1),
            decode_worker=_ints(n, -1),
            first_token_step=_ints(n, -1),
            num_preemptions=_ints(n, 0),
            num_retries=_ints(n, 0),
            num_prefills=_ints(n, 0),
            status=_ints(n, STATUS_UNFINISHED),
        )

    @property
    def n(self) -> int:
        return len(self.status)

    def columns(self) -> dict[str, np.ndarray]:
        """Every array column by name (the declared field order)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reason"}


@dataclass(slots=True)
class StepLog:
    """One worker's iterations.

    Token steps (iterations in which every running sequence emits one token) are logged
    as *runs*: ``k`` consecutive steps starting at ``start_at_s`` over a constant batch of
    ``batch`` sequences whose total context is ``context0`` tokens at the first step;
    step i of the run lasts ``base_s + per_token_s × (context0 + i × batch)``. A single
    mixed (chunked) iteration is a run with k = 1, per_token_s = 0.

    Prefill-only iterations (which stall running decodes) are logged separately as
    ``(start_at_s, duration_s, num_seqs, num_tokens)``.
    """

    run_start_at_s: list[float] = field(default_factory=list)
    run_steps: list[int] = field(default_factory=list)
    run_batch: list[int] = field(default_factory=list)
    run_context0: list[int] = field(default_factory=list)
    run_base_s: list[float] = field(default_factory=list)
    run_per_token_s: list[float] = field(default_factory=list)
    run_prefill_tokens: list[int] = field(default_factory=list)
    prefill_iters: list[tuple[float, float, int, int]] = field(default_factory=list)

    def add_run(
        self,
        start_at_s: float,
        steps: int,
        batch: int,
        context0: int,
        base_s: float,
        per_token_s: float,
        prefill_tokens: int = 0,
    ) -> None:
        self.run_start_at_s.append(start_at_s)
        self.run_steps.append(steps)
        self.run_batch.append(batch)
        self.run_context0.append(context0)
        self.run_base_s.append(base_s)
        self.run_per_token_s.append(per_token_s)
        self.run_prefill_tokens.append(prefill_tokens)

    def step_end_times(self) -> np.ndarray:
        """End time of every token step, in order (vectorised expansion of the runs)."""
        steps = np.asarray(self.run_steps, dtype=np.int64)
        total = int(steps.sum())
        if total == 0:
            return np.empty(0)
        run_of_step = np.repeat(np.arange(len(steps)), steps)
        first_of_run = np.cumsum(steps) - steps
        i_in_run = np.arange(total) - first_of_run[run_of_step]
        base = np.asarray(self.run_base_s)[run_of_step]
        per = np.asarray(self.run_per_token_s)[run_of_step]
        ctx = np.asarray(self.run_context0, dtype=float)[run_of_step]
        batch = np.asarray(self.run_batch, dtype=float)[run_of_step]
        dur = base + per * (ctx + i_in_run * batch)
        cum = np.cumsum(dur)
        # restart the cumulative sum at each run's start time
        offset = (
            np.asarray(self.run_start_at_s)[run_of_step] - (cum - dur)[first_of_run][run_of_step]
        )
        out: np.ndarray = cum + offset
        return out

    def _run_durations_s(self) -> np.ndarray:
        steps = np.asarray(self.run_steps, dtype=float)
        batch = np.asarray(self.run_batch, dtype=float)
        base = np.asarray(self.run_base_s)
        per = np.asarray(self.run_per_token_s)
        ctx = np.asarray(self.run_context0, dtype=float)
        out: np.ndarray = steps * base + per * (steps * ctx + batch * steps * (steps - 1) / 2)
        return out

    def batch_s(self) -> float:
        """Σ sequences × seconds over the iterations (token-step runs: their batch;
        prefill-only iterations: their prompts; swap stalls: none)."""
        runs = self._run_durations_s() * np.asarray(self.run_batch, dtype=float)
        return float(runs.sum() + sum(p[1] * p[2] for p in self.prefill_iters))

    def busy_s(self) -> float:
        """Seconds this worker spent computing (token steps plus prefill-only iterations)."""
        steps = np.asarray(self.run_steps, dtype=float)
        batch = np.asarray(self.run_batch, dtype=float)
        base = np.asarray(self.run_base_s)
        per = np.asarray(self.run_per_token_s)
        ctx = np.asarray(self.run_context0, dtype=float)
        runs = steps * base + per * (steps * ctx + batch * steps * (steps - 1) / 2)
        return float(runs.sum() + sum(p[1] for p in self.prefill_iters))


@dataclass(slots=True)
class Samples:
    """Time series sampled at state changes: one row per (time, worker)."""

    at_s: list[float] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)
    queue_len: list[int] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    kv_used_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Segments:
    """The tokens of each request after its first, in the order they were emitted.

    A step segment is a stretch of consecutive token steps a request spent on one worker:
    it emitted ``tokens`` tokens at the ends of steps ``start_step … start_step + tokens -
    1`` (``at_s`` NaN). A point segment (``worker`` −1, ``start_step`` −1, one token) is
    the token a re-prefill produced, delivered at ``at_s``."""

    rid: list[int] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)
    start_step: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    at_s: list[float] = field(default_factory=list)

    def add(self, rid: int, worker: int, start_step: int, tokens: int) -> None:
        self.rid.append(rid)
        self.worker.append(worker)
        self.start_step.append(start_step)
        self.tokens.append(tokens)
        self.at_s.append(math.nan)

    def add_point(self, rid: int, at_s: float) -> None:
        self.rid.append(rid)
        self.worker.append(-1)
        self.start_step.append(-1)
        self.tokens.append(1)
        self.at_s.append(at_s)


@dataclass(slots=True)
class RouterSamples:
    """Router state at each change: requests held at the router, and prefilled KV bytes
    waiting for a decode worker (orphaned KV)."""

    at_s: list[float] = field(default_factory=list)
    queue_len: list[int] = field(default_factory=list)
    orphaned_kv_bytes: list[int] = field(default_factory=list)


class Allocation(NamedTuple):
    """One worker holding its GPUs from ``allocated_at_s`` to ``released_at_s`` (inf:
    still held when the run stopped)."""

    worker: int
    role: str
    num_gpus: int
    allocated_at_s: float
    released_at_s: float


class PoolSize(NamedTuple):
    """A pool's workers from ``at_s`` on; control instants also carry the TTFT and ITL
    p99 the autoscaler saw over its last interval (NaN elsewhere)."""

    at_s: float
    role: str
    num_in_service: int
    num_starting: int
    num_draining: int
    desired: int
    window_ttft_p99_s: float
    window_itl_p99_s: float


class FailureRecord(NamedTuple):
    at_s: float
    worker: int


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
    failures: tuple[FailureRecord, ...] = ()  # each worker failure that happened
    transfers: tuple[TransferRecord, ...] = ()  # per KV transfer (topology fabric)
    allocations: tuple[Allocation, ...] = ()  # per GPU allocation
    pool_sizes: tuple[PoolSize, ...] = ()
    scale_events: int = 0
    link_util: LinkUtilisation | None = None  # topology fabric
