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
    sorted gaps that carry it. A percentile is found exactly without sorting or copying
    all gaps again (:meth:`percentile`), so the distribution of a fleet-hour (tens of
    millions of step gaps) costs one float per gap."""

    by_weight: tuple[tuple[int, np.ndarray], ...]  # (weight, its gaps sorted ascending)

    @classmethod
    def from_pairs(cls, values_s: np.ndarray, weights: np.ndarray) -> GapDistribution:
        return _GapBuilder().add(np.asarray(values_s, float), np.asarray(weights)).build()

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
        return max((float(v[-1]) for _, v in self.by_weight), default=float("nan"))

    def percentile(self, q: float) -> float:
        """Inverted-CDF percentile: the smallest gap ``v`` whose cumulative weight
        ``W(<= v)`` reaches ``q/100`` of the total (as :func:`weighted_percentile`); NaN
        when empty. Bisection over order-preserving integer keys of the gaps
        (:func:`_float_keys`): ``W(<= v)`` is a sum over weights of one binary search
        each, and it changes only at gaps, so the bisection ends on a gap."""
        if not self.by_weight:
            return float("nan")
        bits = [(w, _float_keys(v)) for w, v in self.by_weight]
        total = float(sum(w * len(b) for w, b in bits))
        target = q / 100.0 * total - 1e-9 * total
        lo = min(int(b[0]) for _, b in bits)
        hi = max(int(b[-1]) for _, b in bits)

        def weight_upto(x: int) -> float:
            return float(sum(w * int(np.searchsorted(b, x, side="right")) for w, b in bits))

        if weight_upto(lo) >= target:
            return _key_float(lo)
        while hi - lo > 1:  # weight_upto(lo) < target <= weight_upto(hi)
            mid = (lo + hi) // 2
            if weight_upto(mid) >= target:
                hi = mid
            else:
                lo = mid
        return _key_float(hi)


_LOW63 = np.int64(0x7FFFFFFFFFFFFFFF)


def _float_keys(v: np.ndarray) -> np.ndarray:
    """int64 keys that sort as the floats ``v`` do (negative floats have their magnitude
    bits flipped); ascending when ``v`` is, and an involution (:func:`_key_float`)."""
    bits = v.view(np.int64)
    return bits ^ ((bits >> 63) & _LOW63)


def _key_float(key: int) -> float:
    k = np.int64(key)
    return float(np.int64(k ^ ((k >> 63) & _LOW63)).view(np.float64))


class _GapBuilder:
    """Collects (gap, weight) chunks, grouped by weight; :meth:`build` sorts each group
    in place."""

    def __init__(self) -> None:
        self._chunks: dict[int, list[np.ndarray]] = {}

    def add(self, values: np.ndarray, weights: np.ndarray) -> _GapBuilder:
        keep = (weights > 0) & np.isfinite(values)
        values, weights = values[keep], weights[keep]
        if len(values) == 0:
            return self
        order = np.argsort(weights, kind="stable")
        w_sorted = weights[order]
        cuts = np.flatnonzero(np.diff(w_sorted)) + 1
        for idx in np.split(order, cuts):
            self._chunks.setdefault(int(weights[idx[0]]), []).append(values[idx])
        return self

    def build(self) -> GapDistribution:
        groups = []
        for w in sorted(self._chunks):
            v = np.concatenate(self._chunks[w]) if len(self._chunks[w]) > 1 else self._chunks[w][0]
            v = v + 0.0  # -0.0 -> +0.0: equal gaps, one bit pattern
            v.sort()
            groups.append((w, v))
        self._chunks = {}
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


def _segment_times(raw: RawResult, counted: np.ndarray, gaps: _GapBuilder) -> _Segments:
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
    by_worker = np.argsort(worker, kind="stable")  # segments of each worker, in order
    bounds = np.searchsorted(worker[by_worker], [w.index for w in raw.workers] + [len(raw.workers)])
    for j, w in enumerate(raw.workers):
        sel = by_worker[bounds[j] : bounds[j + 1]]
        if len(sel) == 0:
            continue
        ends = w.steps.step_end_times()
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
        # weights: counted requests alive across step gap i of this worker
        mine = sel[counted_seg[sel]]
        if len(mine):
            diff = np.zeros(len(ends) + 1, dtype=np.int64)
            np.add.at(diff, start[mine] + 1, 1)
            np.add.at(diff, start[mine] + tokens[mine], -1)
            gaps.add(step_gaps, np.cumsum(diff)[: len(ends)])
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


def request_frame(raw: RawResult, warmup_s: float) -> tuple[pd.DataFrame, GapDistribution]:
    """The per-request table and the fleet-wide gap distribution (measured requests)."""
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
    seg = _segment_times(raw, counted, builder)
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
    reasons = (
        np.array([log.reason.get(i, "") for i in range(n)], dtype=object) if log.reason else ""
    )
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_at_s": arrival,
            "prompt_tokens": req.prompt_tokens,
            "output_tokens": out,
            "max_tokens": req.max_tokens if req.max_tokens is not None else out,
            "measured": measured,
            "status": pd.Categorical.from_codes(
                status, categories=pd.Index([STATUS_NAMES[i] for i in range(len(STATUS_NAMES))])
            ),
            "reason": reasons,
            "prefill_worker": log.prefill_worker,
            "decode_worker": log.decode_worker,
            "prefill_start_at_s": log.prefill_start_at_s,
            "prefill_end_at_s": log.prefill_end_at_s,
            "transfer_start_at_s": log.transfer_start_at_s,
            "transfer_end_at_s": log.transfer_end_at_s,
            "decode_admit_at_s": log.decode_admit_at_s,
            "first_token_at_s": log.first_token_at_s,
            "finish_at_s": log.finish_at_s,
            "first_token_step": log.first_token_step,
            "num_preemptions": log.num_preemptions,
            "num_retries": log.num_retries,
            "num_prefills": log.num_prefills,
            "ttft_s": ttft,
            "e2e_s": e2e,
            "tpot_s": tpot,
            "max_itl_s": max_gap,
            "queue_s": log.prefill_start_at_s - arrival,
            "transfer_s": log.transfer_end_at_s - log.transfer_start_at_s,
        }
    )
    frame["reason"] = frame["reason"].astype(str)
    return frame, gaps


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
