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
    distinct step gap carries the number of measured requests whose token it delays."""

    values_s: np.ndarray
    weights: np.ndarray

    @property
    def count(self) -> int:
        return int(self.weights.sum())

    def percentile(self, q: float) -> float:
        return weighted_percentile(self.values_s, self.weights, q)


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
    ends_of: dict[int, np.ndarray]  # step end times of each worker with segments


def _segment_times(raw: RawResult) -> _Segments:
    """Per decode segment (in the order they were recorded): request, worker, first and
    last token times, first gap, and the largest gap inside the segment."""
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
    ends_of: dict[int, np.ndarray] = {}
    for w in raw.workers:
        sel = np.flatnonzero(worker == w.index)
        if len(sel) == 0:
            continue
        ends = w.steps.step_end_times()
        ends_of[w.index] = ends
        s0, k = start[sel], tokens[sel]
        first_t[sel] = ends[s0]
        last_t[sel] = ends[s0 + k - 1]
        multi = k > 1
        if multi.any():
            gaps = np.append(np.diff(ends, prepend=np.nan), np.nan)
            idx = np.empty(2 * int(multi.sum()), dtype=np.int64)
            idx[0::2] = s0[multi] + 1
            idx[1::2] = s0[multi] + k[multi]
            inner_max[sel[multi]] = np.maximum.reduceat(gaps, idx)[0::2]
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
        ends_of=ends_of,
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
    seg = _segment_times(raw)
    max_gap = np.full(n, -np.inf)
    seg_max = np.maximum(seg.first_gap, seg.inner_max)
    np.maximum.at(max_gap, seg.rid, seg_max)
    max_gap[~np.isfinite(max_gap)] = np.nan
    max_gap[~completed] = np.nan

    # weights: measured completed requests alive across step gap i of a worker
    gap_values: list[np.ndarray] = []
    gap_weights: list[np.ndarray] = []
    counted = (completed & measured)[seg.rid]
    for w_index, ends in seg.ends_of.items():
        sel = counted & (seg.worker == w_index)
        if not sel.any():
            continue
        diff = np.zeros(len(ends) + 1, dtype=np.int64)
        np.add.at(diff, seg.start[sel] + 1, 1)
        np.add.at(diff, seg.start[sel] + seg.tokens[sel], -1)
        weight = np.cumsum(diff)[: len(ends)]
        step_gaps = np.diff(ends, prepend=np.nan)
        gap_values.append(step_gaps[weight > 0])
        gap_weights.append(weight[weight > 0])
    gap_values.append(seg.first_gap[counted])
    gap_weights.append(np.ones(int(counted.sum()), dtype=np.int64))
    gaps = GapDistribution(values_s=np.concatenate(gap_values), weights=np.concatenate(gap_weights))
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
