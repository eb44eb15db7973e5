"""What the engine records while it runs: flat per-request arrays and per-worker step logs,
and the :class:`RawResult` it returns.

The hot loop only writes numbers into preallocated numpy arrays and appends to typed
``array.array`` columns (8 bytes a value, no Python object per entry); DataFrames and per-token timestamps are derived after the run
(:mod:`disaggsim.metrics.reconstruct`).

Status codes of a request: see :data:`STATUS_NAMES`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from functools import cache
from struct import Struct, calcsize
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import numpy as np

if TYPE_CHECKING:
    from disaggsim.engine.prefix import PrefixLog
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


def _counts(n: int, fill: int) -> np.ndarray:
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
            prefill_worker=_counts(n, -1),
            decode_worker=_counts(n, -1),
            first_token_step=_counts(n, -1),
            num_preemptions=_counts(n, 0),
            num_retries=_counts(n, 0),
            num_prefills=_counts(n, 0),
            status=_counts(n, STATUS_UNFINISHED),
        )

    @property
    def n(self) -> int:
        return len(self.status)

    def columns(self) -> dict[str, np.ndarray]:
        """Every array column by name (the declared field order)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "reason"}


class RequestLogColumns:
    """The :class:`RequestLog` as the engine writes it during a run: each column shares
    its memory with the numpy column of :attr:`log` (reading and writing one element of
    an ``array.array`` or a memoryview with Python numbers costs less than of a numpy
    array, and the hot loop does it about twenty times per request). Same column names,
    fills and units as :class:`RequestLog`.

    The times are memoryviews of float64 (a store converts the float directly; an
    ``array.array("d")`` parses it through ``PyArg_Parse``, half as much again), the
    integer columns unsigned ``array.array("Q")`` over the int64 bytes (the same reason:
    :func:`unsigned_columns`): the engine writes only non-negative values there, and
    reads only the counters (:attr:`log` reads every column as int64, the ``-1`` fills
    included)."""

    __slots__ = (
        "decode_admit_at_s",
        "decode_worker",
        "finish_at_s",
        "first_token_at_s",
        "first_token_step",
        "log",
        "num_preemptions",
        "num_prefills",
        "num_retries",
        "prefill_end_at_s",
        "prefill_start_at_s",
        "prefill_worker",
        "reason",
        "status",
        "transfer_end_at_s",
        "transfer_start_at_s",
    )

    prefill_start_at_s: memoryview[float]
    prefill_end_at_s: memoryview[float]
    transfer_start_at_s: memoryview[float]
    transfer_end_at_s: memoryview[float]
    decode_admit_at_s: memoryview[float]
    first_token_at_s: memoryview[float]
    finish_at_s: memoryview[float]
    prefill_worker: array[int]
    decode_worker: array[int]
    first_token_step: array[int]
    num_preemptions: array[int]
    num_retries: array[int]
    num_prefills: array[int]
    status: array[int]

    def __init__(self, n: int) -> None:
        views: dict[str, Any] = {}
        # each column's dtype and fill as RequestLog.empty makes them
        for name, first in RequestLog.empty(1).columns().items():
            if first.dtype == np.float64:
                column = array("d", first.tolist()) * n
                setattr(self, name, memoryview(column))
                views[name] = np.frombuffer(column, dtype=np.float64)
            else:  # the int64 fill's bytes, unsigned (-1: all ones)
                column = array("Q")
                column.frombytes((array("q", first.tolist()) * n).tobytes())
                setattr(self, name, column)
                views[name] = np.frombuffer(column, dtype=np.int64)
        self.log = RequestLog(**views)  # the same memory, as numpy arrays
        self.reason = self.log.reason


def _floats() -> array[float]:
    return array("d")


# Integer columns are unsigned while the engine appends to them, signed when the run
# returns them. Appending a Python int to a signed ``array.array`` parses it through
# ``PyArg_Parse`` (about 570 machine instructions an append on CPython 3.11, callgrind);
# an unsigned column converts it directly (about 250), and the engine appends about
# thirty ints per request. Every value the engine appends is non-negative (a -1 goes in
# as its two's complement: :func:`minus_one`), so the bytes are those of the signed
# column, which :func:`signed_columns` gives back, same typecodes and values.
_UNSIGNED = {"i": "I", "q": "Q"}
_SIGNED = {"I": "i", "Q": "q"}


def _retype(table: Any, codes: dict[str, str]) -> None:
    """Each integer column of ``table`` (a slotted record dataclass or
    :class:`PrefillIters`) with the typecode ``codes`` maps it to, the same bytes; the
    old column emptied (the engine's bound appends may still refer to it). A cost per
    worker, not per request: kept to plain slot reads (no ``dataclasses.fields``) and no
    copy of an empty column."""
    for name in table.__slots__:
        col = getattr(table, name)
        if type(col) is array:
            code = codes.get(col.typecode)
            if code is not None:
                out = array(code)
                if col:
                    out.frombytes(memoryview(col).cast("B"))
                    del col[:]
                setattr(table, name, out)
        elif type(col) is PrefillIters:
            _retype(col, codes)


def unsigned_columns(*tables: Any) -> None:
    """Make the integer columns of ``tables`` unsigned, for the engine to append to
    (before it binds their appends)."""
    for table in tables:
        _retype(table, _UNSIGNED)


def signed_columns(*tables: Any) -> None:
    """The run is over: the integer columns of ``tables`` signed again (a copy of each
    column's bytes, one column at a time)."""
    for table in tables:
        _retype(table, _SIGNED)


def minus_one(col: array[int]) -> int:
    """What stands for -1 in ``col``: -1, or its two's complement in an unsigned column."""
    return -1 if col.typecode in _UNSIGNED else (1 << (8 * col.itemsize)) - 1


def _ints() -> array[int]:
    return array("q")


class PrefillIters:
    """Prefill-only iterations (and swap stalls) of one worker as columns, read and
    written as ``(start_at_s, duration_s, num_seqs, num_tokens)`` rows."""

    __slots__ = ("duration_s", "num_seqs", "num_tokens", "start_at_s")

    def __init__(self) -> None:
        self.start_at_s = _floats()
        self.duration_s = _floats()
        self.num_seqs = _ints()
        self.num_tokens = _ints()

    def append(self, row: tuple[float, float, int, int]) -> None:
        self.start_at_s.append(row[0])
        self.duration_s.append(row[1])
        self.num_seqs.append(row[2])
        self.num_tokens.append(row[3])

    def __len__(self) -> int:
        return len(self.start_at_s)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float, int, int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[float, float, int, int]]: ...

    def __getitem__(
        self, i: int | slice
    ) -> tuple[float, float, int, int] | list[tuple[float, float, int, int]]:
        if isinstance(i, slice):
            return list(
                zip(
                    self.start_at_s[i],
                    self.duration_s[i],
                    self.num_seqs[i],
                    self.num_tokens[i],
                    strict=True,
                )
            )
        return (self.start_at_s[i], self.duration_s[i], self.num_seqs[i], self.num_tokens[i])

    def __setitem__(self, i: int, row: tuple[float, float, int, int]) -> None:
        self.start_at_s[i], self.duration_s[i], self.num_seqs[i], self.num_tokens[i] = row

    def __iter__(self) -> Iterator[tuple[float, float, int, int]]:
        return zip(self.start_at_s, self.duration_s, self.num_seqs, self.num_tokens, strict=True)


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

    run_start_at_s: array[float] = field(default_factory=_floats)
    run_steps: array[int] = field(default_factory=_ints)
    run_batch: array[int] = field(default_factory=_ints)
    run_context0: array[int] = field(default_factory=_ints)
    run_base_s: array[float] = field(default_factory=_floats)
    run_per_token_s: array[float] = field(default_factory=_floats)
    run_prefill_tokens: array[int] = field(default_factory=_ints)
    prefill_iters: PrefillIters = field(default_factory=lambda: PrefillIters())

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
        # each run's values repeated once per step (np.repeat: cheaper than gathering
        # through a step -> run index)
        first_of_run = np.cumsum(steps) - steps
        i_in_run = np.arange(total) - np.repeat(first_of_run, steps)
        base = np.repeat(np.asarray(self.run_base_s), steps)
        per = np.repeat(np.asarray(self.run_per_token_s), steps)
        ctx = np.repeat(np.asarray(self.run_context0, dtype=float), steps)
        batch = np.repeat(np.asarray(self.run_batch, dtype=float), steps)
        dur = base + per * (ctx + i_in_run * batch)
        cum = np.cumsum(dur)
        # restart the cumulative sum at each run's start time
        offset = np.repeat(np.asarray(self.run_start_at_s) - (cum - dur)[first_of_run], steps)
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
        it = self.prefill_iters
        prefill = np.dot(np.asarray(it.duration_s), np.asarray(it.num_seqs, dtype=float))
        return float(runs.sum() + prefill)

    def busy_s(self) -> float:
        """Seconds this worker spent computing (token steps plus prefill-only iterations)."""
        steps = np.asarray(self.run_steps, dtype=float)
        batch = np.asarray(self.run_batch, dtype=float)
        base = np.asarray(self.run_base_s)
        per = np.asarray(self.run_per_token_s)
        ctx = np.asarray(self.run_context0, dtype=float)
        runs = steps * base + per * (steps * ctx + batch * steps * (steps - 1) / 2)
        return float(runs.sum() + sum(self.prefill_iters.duration_s))


def _small_ints() -> array[int]:
    return array("i")  # 4 bytes a value: worker indexes, queue lengths, batch sizes


@dataclass(slots=True)
class Samples:
    """Time series sampled at state changes: one row per (time, worker). The most
    numerous record (about five rows per request), so counts that stay far below 2**31
    take 4 bytes."""

    at_s: array[float] = field(default_factory=_floats)
    worker: array[int] = field(default_factory=_small_ints)
    queue_len: array[int] = field(default_factory=_small_ints)
    batch: array[int] = field(default_factory=_small_ints)
    kv_used_tokens: array[int] = field(default_factory=_ints)
    # prefix caching on (else None): the worker's HBM cache (cached + pending, pinned,
    # pending), its node's DRAM tier and the remote store, in tokens
    cache_hbm_tokens: array[int] | None = None
    cache_hbm_pinned_tokens: array[int] | None = None
    cache_hbm_pending_tokens: array[int] | None = None
    cache_dram_tokens: array[int] | None = None
    cache_remote_tokens: array[int] | None = None

    def with_cache_columns(self) -> Samples:
        self.cache_hbm_tokens = _ints()
        self.cache_hbm_pinned_tokens = _ints()
        self.cache_hbm_pending_tokens = _ints()
        self.cache_dram_tokens = _ints()
        self.cache_remote_tokens = _ints()
        return self


@dataclass(slots=True)
class Segments:
    """The tokens of each request after its first, in the order they were emitted.

    A step segment is a stretch of consecutive token steps a request spent on one worker:
    it emitted ``tokens`` tokens at the ends of steps ``start_step … start_step + tokens -
    1`` (``at_s`` NaN). A point segment (``worker`` −1, ``start_step`` −1, one token) is
    the token a re-prefill produced, delivered at ``at_s``."""

    rid: array[int] = field(default_factory=_ints)
    worker: array[int] = field(default_factory=_ints)
    start_step: array[int] = field(default_factory=_ints)
    tokens: array[int] = field(default_factory=_ints)
    at_s: array[float] = field(default_factory=_floats)

    def add(self, rid: int, worker: int, start_step: int, tokens: int) -> None:
        self.rid.append(rid)
        self.worker.append(worker)
        self.start_step.append(start_step)
        self.tokens.append(tokens)
        self.at_s.append(math.nan)

    def add_point(self, rid: int, at_s: float) -> None:
        self.rid.append(rid)
        self.worker.append(minus_one(self.worker))
        self.start_step.append(minus_one(self.start_step))
        self.tokens.append(1)
        self.at_s.append(at_s)


@cache
def _row_struct(typecodes: str) -> Struct:
    """The packed row of columns of these ``array`` typecodes (native order, no
    padding), made once per layout: every worker has two step-log tables, and a
    ``Struct`` and its checks cost about 21,000 machine instructions to make (callgrind)."""
    for code in typecodes:
        if calcsize("=" + code) != array(code).itemsize:  # not on CPython's platforms
            raise ValueError(f"no packed row for a column of typecode {code!r}")
    return Struct("=" + typecodes)


class Rows:
    """Rows of record columns (:class:`Samples`' first five, :class:`Segments`'), as the
    engine writes them: each row packed into bytes (:attr:`write`: ``put(pack(*row))``,
    the columns' own typecodes, no padding), the bytes moved into the columns in bulk
    (:meth:`flush`), byte for byte.

    Appending a row's values one by one costs a call a value and, for a float,
    ``PyArg_Parse`` (:func:`unsigned_columns`): about 1,740 machine instructions for a
    sample row of five values against about 1,100 for the row packed and appended
    (callgrind of each form, 100,000 rows, CPython 3.11). A row of bytes is no object the
    garbage collector tracks (a tuple would be; held by the thousand, they run it more
    often). The engine reads none of these columns while it runs, so the rows wait until
    :attr:`limit` of them are there (the cluster flushes at arrivals) or the run ends."""

    __slots__ = ("_fields", "columns", "row_bytes", "rows", "write")

    limit = 1 << 12  # rows held before a flush (checked at each arrival event)

    def __init__(self, *columns: array[Any]) -> None:
        self.columns = columns  # in the order of a row's values
        row = _row_struct("".join(col.typecode for col in columns))
        self._fields: list[tuple[array[Any], int, int]] = []  # column, offset, size
        offset = 0
        for col in columns:
            self._fields.append((col, offset, col.itemsize))
            offset += col.itemsize
        self.row_bytes = offset
        self.rows: list[bytes] = []
        # what the engine calls: put(pack(*row))
        self.write: tuple[Callable[..., bytes], Callable[[bytes], None]] = (
            row.pack,
            self.rows.append,
        )

    def flush(self) -> None:
        """Every row held, into the columns (the bytes of each column's values, copied)."""
        rows = self.rows
        if rows:
            self._move(b"".join(rows), len(rows))
            rows.clear()

    def _move(self, data: bytes, n: int) -> None:
        """``n`` packed rows, ``data``, into the columns."""
        table = np.frombuffer(data, dtype=np.uint8).reshape(n, self.row_bytes)
        for col, offset, size in self._fields:
            col.frombytes(np.ascontiguousarray(table[:, offset : offset + size]).tobytes())


def held_rows(
    *columns: array[Any],
) -> tuple[bytearray, tuple[Callable[..., bytes], Callable[[bytes], None]]]:
    """Rows of ``columns`` held in one ``bytearray`` until :func:`flush_held` (8-byte
    columns only: a worker's step-log tables), and what the engine calls to add one:
    ``put(pack(*row))``. No object per row, so a worker's step-log rows (a run's seven
    values, a prefill iteration's four) can wait for the whole run in the bytes their
    columns would take, and move once when the run returns or before whoever reads
    those columns during the run (the autoscaler, a failure, a swap stall:
    :meth:`Worker.flush_steps`).

    Seven values appended one by one cost about 2,800 machine instructions, a float each
    through ``PyArg_Parse``; packed and put, about 1,450 (callgrind of each form, 100,000
    rows, CPython 3.11)."""
    if any(col.itemsize != 8 for col in columns):
        raise ValueError("held rows take 8-byte columns")
    held = bytearray()
    return held, (_row_struct("".join([col.typecode for col in columns])).pack, held.extend)


def flush_held(held: bytearray, columns: tuple[array[Any], ...]) -> None:
    """The rows in ``held`` (:func:`held_rows`), into ``columns``: the rows' 8-byte words
    transposed, each column's values one after another. A flush per worker and table:
    numpy's few calls cost tens of thousands of machine instructions, about a hundred rows'
    worth of a strided copy's (about 40 a value), so a short table is copied without it."""
    if not held:
        return
    ncols = len(columns)
    if len(held) >= 8 * ncols * _NUMPY_ROWS:
        data = np.frombuffer(held, dtype=np.uint64).reshape(-1, ncols).T.tobytes()
        size = len(data) // ncols
        for j, col in enumerate(columns):
            col.frombytes(data[j * size : (j + 1) * size])
    else:
        with memoryview(held).cast("Q") as words:
            for j, col in enumerate(columns):
                col.frombytes(words[j::ncols].tobytes())
    del held[:]


_NUMPY_ROWS = 1024  # rows from which flush_held transposes them with numpy


@dataclass(slots=True)
class RouterSamples:
    """Router state at each change: requests held at the router, and prefilled KV bytes
    waiting for a decode worker (orphaned KV)."""

    at_s: array[float] = field(default_factory=_floats)
    queue_len: array[int] = field(default_factory=_ints)
    orphaned_kv_bytes: array[int] = field(default_factory=_ints)


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
    prefix_log: PrefixLog | None = None  # prefix caching: hit tokens by tier per request
    # the instant a stop check ended the run before every request ended (NaN: it did not)
    stopped_early_at_s: float = math.nan


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a stop check (:meth:`~disaggsim.engine.cluster.Cluster.run`) reads of the
    request table during a run: read-only numpy views of the engine's own columns (no
    copy; each check sees the values as they are at its instant).

    ``arrival_s`` is non-decreasing (the table is sorted by arrival). A request that has
    not arrived yet, or is still in service, is ``STATUS_UNFINISHED`` with NaN times.
    Times once written never change: ``first_token_at_s`` is written once, at the first
    token; ``finish_at_s`` and a status other than unfinished when the request ends."""

    arrival_s: np.ndarray  # float64, seconds
    output_tokens: np.ndarray  # int64: the realised reply, the first token included
    first_token_at_s: np.ndarray  # float64, NaN: no token yet
    finish_at_s: np.ndarray  # float64, NaN: not completed
    status: np.ndarray  # int64 STATUS_* codes

    @classmethod
    def of(cls, requests: Requests, log: RequestLog) -> RequestView:
        def frozen(a: np.ndarray) -> np.ndarray:
            v = a.view()
            v.flags.writeable = False
            return v

        return cls(
            arrival_s=frozen(np.asarray(requests.arrival_s, dtype=np.float64)),
            output_tokens=frozen(np.asarray(requests.output_tokens, dtype=np.int64)),
            first_token_at_s=frozen(log.first_token_at_s),
            finish_at_s=frozen(log.finish_at_s),
            status=frozen(log.status),
        )
