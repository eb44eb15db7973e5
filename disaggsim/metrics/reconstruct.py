"""Per-request frames and inter-token gaps derived after the run from the step logs.

No per-token event ever exists in the engine: a request's tokens after its first are
emitted at the ends of its decode (or colocated) worker's token steps, one per step of
each of its segments (several after a preemption or a failure), except the token a
re-prefill produces, delivered at the re-prefill's end (a point segment); gaps are
differences of those times. Everything here is
vectorised numpy over steps and requests (docs/metrics.md has the definitions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from disaggsim.engine.cluster import RawResult
from disaggsim.engine.records import STATUS_COMPLETED, STATUS_NAMES


@dataclass(frozen=True, slots=True)
class GapDistribution:
    """All inter-token gaps of the measured requests as (value, weight) pairs: each
    distinct step gap carries the number of measured requests whose token it delays.

    Stored by weight: for each weight ``w`` (a few hundred at most: the batch sizes), the
    gaps that carry it, in no particular order. A percentile is found exactly without
    sorting or copying the gaps (:meth:`percentiles`), so the distribution of a fleet-hour
    (tens of millions of step gaps) costs one float per gap and a few passes over them."""

    by_weight: tuple[tuple[int, np.ndarray], ...]  # (weight, its gaps)

    @classmethod
    def from_pairs(cls, values_s: np.ndarray, weights: np.ndarray) -> GapDistribution:
        w = np.asarray(weights)
        return _GapBuilder().count(w).add(np.asarray(values_s, float), w).build()

    @property
    def count(self) -> int:
        return int(sum(w * len(v) for w, v in self.by_weight))

    @property
    def values_s(self) -> np.ndarray:
        """Every gap (grouped by weight; aligned with :attr:`weights`)."""
        if not self.by_weight:
            return np.empty(0)
        return np.concatenate([v for _, v in self.by_weight])

    @property
    def weights(self) -> np.ndarray:
        if not self.by_weight:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([np.full(len(v), w, dtype=np.int64) for w, v in self.by_weight])

    def max_s(self) -> float:
        """The largest gap (NaN when none)."""
        return max((float(v.max()) for _, v in self.by_weight), default=float("nan"))

    def percentile(self, q: float) -> float:
        """Inverted-CDF percentile: the smallest gap ``v`` whose cumulative weight
        ``W(<= v)`` reaches ``q/100`` of the total (as :func:`weighted_percentile`); NaN
        when empty."""
        return self.percentiles((q,))[0]

    def percentiles(self, qs: tuple[float, ...] | list[float]) -> list[float]:
        """:meth:`percentile` of each of ``qs``, sharing the passes over the gaps.

        A radix selection over order-preserving integer keys of the gaps
        (:func:`_float_keys`; the float bits themselves when no gap is negative): one
        pass counts the weight in each of 2**16 key ranges, the range where ``W``
        crosses the target holds the answer, and only the gaps inside it are looked at
        again (counted the same way on their narrower range, or sorted once few)."""
        if not self.by_weight:
            return [float("nan")] * len(qs)
        groups = [(w, _gap_keys(v)) for w, v in self.by_weight]
        total = float(sum(w * len(k) for w, k in groups))
        targets = [q / 100.0 * total - 1e-9 * total for q in qs]
        return [_key_float(k) for k in _select(groups, targets)]


_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)
_RANGE_BITS = 16  # key ranges counted per pass: 2**16 (a 512 KiB histogram)
_SORT_AT_MOST = 1 << 16  # candidates sorted directly once at most this many
_CHUNK = 1 << 20  # gaps per vectorised step of a pass (8 MB temporaries)


def _float_keys(v: np.ndarray) -> np.ndarray:
    """int64 keys that sort as the floats ``v`` do (negative floats have their magnitude
    bits flipped); an involution (:func:`_key_float`)."""
    bits = v.view(np.int64)
    return bits ^ ((bits >> 63) & _LOW63)


def _gap_keys(v: np.ndarray) -> np.ndarray:
    """:func:`_float_keys` of ``v``: a view of the bits (no copy) when no value is
    negative (the builder stores -0.0 as +0.0), as for every gap of a valid run."""
    if len(v) == 0 or float(v.min()) >= 0.0:
        return v.view(np.int64)
    return _float_keys(v)


def _key_float(key: int) -> float:
    k = np.int64(key)
    return float(np.int64(k ^ ((k >> 63) & _LOW63)).view(np.float64))


def _select(groups: list[tuple[int, np.ndarray]], targets: list[float]) -> list[int]:
    """For each target, the smallest key ``x`` of ``groups`` (weight, int64 keys) whose
    weight ``W(<= x)`` reaches it (the smallest key for a target <= its weight)."""
    lo = min(int(k.min()) for _, k in groups if len(k))
    hi = max(int(k.max()) for _, k in groups if len(k))
    count = sum(len(k) for _, k in groups)
    if count <= _SORT_AT_MOST:
        return [_sorted_select(groups, lo, hi, 0, t, restrict=False) for t in targets]
    # the first pass counts every key once for all the targets
    first = _ranges(groups, lo, hi, restrict=False)
    return [_select_in(groups, lo, hi, t, first) for t in targets]


def _select_in(
    groups: list[tuple[int, np.ndarray]],
    lo: int,
    hi: int,
    target: float,
    counted: tuple[int, np.ndarray, np.ndarray],
) -> int:
    """The answer for ``target`` among the keys of ``groups`` in ``[lo, hi]``, which
    holds it; ``counted`` is that range's (shift, weight per key range, keys per range)
    from :func:`_ranges`."""
    below = 0  # weight of the keys below lo
    while True:
        shift, weight, count = counted
        cum = np.cumsum(weight) + below
        j = min(int(np.searchsorted(cum, target, side="left")), len(cum) - 1)
        if j > 0:
            below = int(cum[j - 1])
        lo, hi = lo + (j << shift), min(hi, lo + ((j + 1) << shift) - 1)
        if lo == hi:
            return lo
        if int(count[j]) <= _SORT_AT_MOST:
            return _sorted_select(groups, lo, hi, below, target, restrict=True)
        counted = _ranges(groups, lo, hi, restrict=True)


def _ranges(
    groups: list[tuple[int, np.ndarray]], lo: int, hi: int, restrict: bool
) -> tuple[int, np.ndarray, np.ndarray]:
    """``[lo, hi]`` cut into at most 2**_RANGE_BITS equal key ranges of 2**shift keys:
    (shift, the weight in each range, the keys in each range) over the keys of
    ``groups`` (only those inside ``[lo, hi]`` when ``restrict``)."""
    shift = max((hi - lo).bit_length() - _RANGE_BITS, 0)
    num = ((hi - lo) >> shift) + 1
    weight = np.zeros(num, dtype=np.int64)
    count = np.zeros(num, dtype=np.int64)
    for w, k in groups:
        for part in _parts(k, lo, hi, restrict):
            # offsets from lo as unsigned (the span of int64 keys may pass 2**63)
            ranges = (part - np.int64(lo)).view(np.uint64) >> np.uint64(shift)
            n = np.bincount(ranges.view(np.int64), minlength=num)
            count += n
            weight += w * n
    return shift, weight, count


def _parts(k: np.ndarray, lo: int, hi: int, restrict: bool):
    """``k`` in chunks (views), each cut to the keys in ``[lo, hi]`` when ``restrict``."""
    for start in range(0, len(k), _CHUNK):
        part = k[start : start + _CHUNK]
        yield part[(part >= lo) & (part <= hi)] if restrict else part


def _sorted_select(
    groups: list[tuple[int, np.ndarray]],
    lo: int,
    hi: int,
    below: int,
    target: float,
    restrict: bool,
) -> int:
    """:func:`_select_in` for few keys: sort them with their weights."""
    keys, weights = [], []
    for w, k in groups:
        for part in _parts(k, lo, hi, restrict):
            keys.append(part)
            weights.append(np.full(len(part), w, dtype=np.int64))
    key = np.concatenate(keys)
    order = np.argsort(key, kind="stable")
    cum = np.cumsum(np.concatenate(weights)[order]) + below
    i = min(int(np.searchsorted(cum, target, side="left")), len(key) - 1)
    return int(key[order[i]])


class _GapBuilder:
    """Gaps grouped by weight into arrays sized in advance, so no chunk is kept and no
    group is joined from copies: :meth:`count` the weights of every chunk of gaps to
    come, then :meth:`add` the chunks (any order), then :meth:`build`."""

    def __init__(self) -> None:
        self._counts = np.zeros(1, dtype=np.int64)  # gaps to come, by weight
        self._groups: dict[int, np.ndarray] = {}
        self._filled: dict[int, int] = {}

    def count(self, weights: np.ndarray) -> _GapBuilder:
        w = weights[weights > 0]
        if len(w):
            c = np.bincount(w)
            if len(c) > len(self._counts):
                c[: len(self._counts)] += self._counts
                self._counts = c
            else:
                self._counts[: len(c)] += c
        return self

    def add(self, values: np.ndarray, weights: np.ndarray) -> _GapBuilder:
        """Values of a counted chunk (non-finite ones and weight 0 left out)."""
        if not self._groups:
            for weight in np.flatnonzero(self._counts).tolist():
                self._groups[weight] = np.empty(int(self._counts[weight]))
                self._filled[weight] = 0
        keep = (weights > 0) & np.isfinite(values)
        values, weights = values[keep], weights[keep]
        if len(values) == 0:
            return self
        # stable order by weight; weights are batch sizes, so 16-bit keys (a radix sort)
        small = weights.astype(np.uint16) if int(weights.max()) < 1 << 16 else weights
        order = np.argsort(small, kind="stable")
        w_sorted = weights[order]
        cuts = np.flatnonzero(np.diff(w_sorted)) + 1
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
            w = int(w_sorted[a])
            at = self._filled[w]
            self._groups[w][at : at + b - a] = values[order[a:b]]
            self._filled[w] = at + b - a
        return self

    def build(self) -> GapDistribution:
        groups = []
        for w in sorted(self._groups):
            v = self._groups.pop(w)
            if self._filled[w] < len(v):  # non-finite gaps were left out
                v = v[: self._filled[w]].copy()
            if len(v):
                v += 0.0  # -0.0 -> +0.0: equal gaps, one bit pattern
                groups.append((w, v))
        return GapDistribution(by_weight=tuple(groups))


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Inverted-CDF percentile: the smallest value whose cumulative weight share >= q/100
    (numpy's ``method="inverted_cdf"`` for unit weights). NaN when empty."""
    mask = weights > 0
    if not mask.any():
        return float("nan")
    v = values[mask]
    w = weights[mask].astype(float)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    idx = int(np.searchsorted(cum, q / 100.0 * cum[-1] - 1e-9 * cum[-1], side="left"))
    return float(v[order][min(idx, len(v) - 1)])


def percentile(values: np.ndarray, q: float) -> float:
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(values, q, method="inverted_cdf"))


@dataclass(frozen=True, slots=True)
class _Segments:
    """Per decode segment, in recorded order (arrays of one entry per segment)."""

    rid: np.ndarray
    worker: np.ndarray
    start: np.ndarray  # first token step on the worker
    tokens: np.ndarray
    first_t: np.ndarray  # first and last token times
    last_t: np.ndarray
    first_gap: np.ndarray  # from the previous token of the request to the first here
    inner_max: np.ndarray  # the largest gap inside the segment


def _segment_times(
    raw: RawResult,
    counted: np.ndarray,
    gaps: _GapBuilder,
    step_ends: list[np.ndarray | None] | None = None,
) -> _Segments:
    """Per decode segment (in the order they were recorded): request, worker, first and
    last token times, first gap, and the largest gap inside the segment. Each worker's
    step gaps go into ``gaps`` weighted by the segments of ``counted`` requests they
    delay (worker by worker: one worker's steps are expanded at a time)."""
    seg = raw.segments
    rid = np.asarray(seg.rid, dtype=np.int64)
    worker = np.asarray(seg.worker, dtype=np.int64)
    start = np.asarray(seg.start_step, dtype=np.int64)
    tokens = np.asarray(seg.tokens, dtype=np.int64)
    n = len(rid)
    # point segments (worker -1): one token a re-prefill delivered at at_s
    first_t = np.asarray(seg.at_s, dtype=float).copy() if n else np.full(0, np.nan)
    last_t = first_t.copy()
    inner_max = np.full(n, -np.inf)
    counted_seg = counted[rid] if n else np.zeros(0, dtype=bool)
    # each worker's segments in recorded order (16-bit keys: a radix sort)
    key = worker.astype(np.int16) if len(raw.workers) < 1 << 15 else worker
    by_worker = np.argsort(key, kind="stable")
    bounds = np.searchsorted(worker[by_worker], [w.index for w in raw.workers] + [len(raw.workers)])
    sels = [by_worker[bounds[j] : bounds[j + 1]] for j in range(len(raw.workers))]

    def step_weights(j: int, num_steps: int) -> np.ndarray | None:
        """Counted requests alive across each step gap of worker ``j`` (gap i: from the
        end of step i - 1 to the end of step i)."""
        mine = sels[j][counted_seg[sels[j]]]
        if not len(mine):
            return None
        up = np.bincount(start[mine] + 1, minlength=num_steps + 1)
        down = np.bincount(start[mine] + tokens[mine], minlength=num_steps + 1)
        return np.cumsum(up - down)[:num_steps]

    # first pass: how many gaps of each weight (the weights need no step times)
    num_steps = [int(np.sum(np.asarray(w.steps.run_steps, dtype=np.int64))) for w in raw.workers]
    for j in range(len(raw.workers)):
        weights = step_weights(j, num_steps[j])
        if weights is not None:
            gaps.count(weights)
    gaps.count(np.ones(int(counted_seg.sum()), dtype=np.int64))  # each request's first gap
    for j, w in enumerate(raw.workers):
        sel = sels[j]
        if len(sel) == 0:
            continue
        given = None
        if step_ends is not None:  # taken from the caller's list: freed as the gaps fill
            given, step_ends[j] = step_ends[j], None
        ends = w.steps.step_end_times() if given is None else given
        s0, k = start[sel], tokens[sel]
        first_t[sel] = ends[s0]
        last_t[sel] = ends[s0 + k - 1]
        step_gaps = np.diff(ends, prepend=np.nan)
        multi = k > 1
        if multi.any():
            padded = np.append(step_gaps, np.nan)
            idx = np.empty(2 * int(multi.sum()), dtype=np.int64)
            idx[0::2] = s0[multi] + 1
            idx[1::2] = s0[multi] + k[multi]
            inner_max[sel[multi]] = np.maximum.reduceat(padded, idx)[0::2]
        weights = step_weights(j, len(ends))
        if weights is not None:
            gaps.add(step_gaps, weights)
    # previous token time: the request's first token, or the end of its previous segment
    order = np.argsort(rid, kind="stable")
    prev = raw.log.first_token_at_s[rid].copy()
    r_sorted = rid[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = r_sorted[1:] == r_sorted[:-1]
    prev_sorted = prev[order]
    prev_sorted[same] = last_t[order][np.flatnonzero(same) - 1]
    prev[order] = prev_sorted
    return _Segments(
        rid=rid,
        worker=worker,
        start=start,
        tokens=tokens,
        first_t=first_t,
        last_t=last_t,
        first_gap=first_t - prev,
        inner_max=inner_max,
    )


def request_frame(
    raw: RawResult, warmup_s: float, step_ends: list[np.ndarray | None] | None = None
) -> tuple[pd.DataFrame, GapDistribution]:
    """The per-request table and the fleet-wide gap distribution (measured requests).
    ``step_ends``: each worker's :meth:`StepLog.step_end_times`, when the caller has them
    already; each is taken out of the list (set to None) as it is used, so they do not
    all stay in memory beside the gaps (otherwise expanded here, one worker at a
    time)."""
    req = raw.requests
    log = raw.log
    n = len(req)
    out = req.output_tokens.astype(np.int64)
    arrival = req.arrival_s
    status = log.status
    completed = status == STATUS_COMPLETED
    measured = arrival >= warmup_s
    counted = completed & measured
    builder = _GapBuilder()
    seg = _segment_times(raw, counted, builder, step_ends)
    max_gap = np.full(n, -np.inf)
    seg_max = np.maximum(seg.first_gap, seg.inner_max)
    np.maximum.at(max_gap, seg.rid, seg_max)
    max_gap[~np.isfinite(max_gap)] = np.nan
    max_gap[~completed] = np.nan

    # each counted request's first gap (first token to its first decode token), weight 1
    first_counted = counted[seg.rid] if len(seg.rid) else np.zeros(0, dtype=bool)
    builder.add(seg.first_gap[first_counted], np.ones(int(first_counted.sum()), dtype=np.int64))
    gaps = builder.build()
    ttft = log.first_token_at_s - arrival
    e2e = log.finish_at_s - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out >= 2, (log.finish_at_s - log.first_token_at_s) / (out - 1), np.nan)
    # Columns computed here go in as they are; the engine's arrays are copied, so the
    # frame never shares memory with the records (editing one leaves the other alone).
    # No block consolidation: a fleet-hour's frame is built without a second copy.
    own = np.copy
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_at_s": own(arrival),
            "prompt_tokens": own(req.prompt_tokens),
            "output_tokens": out,
            "max_tokens": own(req.max_tokens) if req.max_tokens is not None else out.copy(),
            "measured": measured,
            "status": pd.Categorical.from_codes(
                status, categories=pd.Index([STATUS_NAMES[i] for i in range(len(STATUS_NAMES))])
            ),
            "reason": _reason_column(log.reason, n),
            "prefill_worker": own(log.prefill_worker),
            "decode_worker": own(log.decode_worker),
            "prefill_start_at_s": own(log.prefill_start_at_s),
            "prefill_end_at_s": own(log.prefill_end_at_s),
            "transfer_start_at_s": own(log.transfer_start_at_s),
            "transfer_end_at_s": own(log.transfer_end_at_s),
            "decode_admit_at_s": own(log.decode_admit_at_s),
            "first_token_at_s": own(log.first_token_at_s),
            "finish_at_s": own(log.finish_at_s),
            "first_token_step": own(log.first_token_step),
            "num_preemptions": own(log.num_preemptions),
            "num_retries": own(log.num_retries),
            "num_prefills": own(log.num_prefills),
            "ttft_s": ttft,
            "e2e_s": e2e,
            "tpot_s": tpot,
            "max_itl_s": max_gap,
            "queue_s": log.prefill_start_at_s - arrival,
            "transfer_s": log.transfer_end_at_s - log.transfer_start_at_s,
        },
        copy=False,
    )
    return frame, gaps


def _reason_column(reason: dict[int, str], n: int) -> pd.api.extensions.ExtensionArray:
    """Why each request was rejected or abandoned ("" otherwise) as pandas' ``str``
    column, taken from the few distinct reasons by index (no Python string per
    request)."""
    import pyarrow as pa

    names = sorted(set(reason.values()))
    index = np.zeros(n, dtype=np.int64)  # 0: ""
    if reason:
        code = {r: i + 1 for i, r in enumerate(names)}
        rids = np.fromiter(reason.keys(), dtype=np.int64, count=len(reason))
        index[rids] = np.fromiter((code[r] for r in reason.values()), np.int64, len(reason))
    taken = pa.array(["", *names], type=pa.large_string()).take(pa.array(index))
    return pd.array(taken, dtype=pd.StringDtype("pyarrow", na_value=np.nan))


def token_times(raw: RawResult, request_id: int) -> np.ndarray:
    """Emission times of every token a request received so far (tests and plots)."""
    first = raw.log.first_token_at_s[request_id]
    if first != first:  # NaN: no token yet
        return np.empty(0)
    parts = [np.array([first])]
    seg = raw.segments
    for rid, w, s0, k, at in zip(
        seg.rid, seg.worker, seg.start_step, seg.tokens, seg.at_s, strict=True
    ):
        if rid == request_id:
            if w < 0:  # the token of a re-prefill
                parts.append(np.array([at]))
            else:
                parts.append(raw.workers[w].steps.step_end_times()[s0 : s0 + k])
    return np.concatenate(parts)
