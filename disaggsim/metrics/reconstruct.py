"""Per-request frames and inter-token gaps derived after the run from the step logs.

No per-token event ever exists in the engine: token i (i >= 2) of a request is emitted at
the end of token step ``first_token_step + i - 2`` of its decode (or colocated) worker,
so its gaps are differences of that worker's step end times. Everything here is
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
    max_gap = np.full(n, np.nan)
    gap_values: list[np.ndarray] = []
    gap_weights: list[np.ndarray] = []

    has_steps = completed & (out >= 2) & (log.first_token_step >= 0)
    for w in raw.workers:
        sel = np.flatnonzero(has_steps & (log.decode_worker == w.index))
        if len(sel) == 0:
            continue
        ends = w.steps.step_end_times()
        first = log.first_token_step[sel]
        last = first + out[sel] - 2
        first_gap = ends[first] - log.first_token_at_s[sel]
        step_gaps = np.diff(ends, prepend=np.nan)  # gap before step i (i >= 1)
        # largest gap per request: its first gap vs the step gaps in (first, last]
        mg = first_gap.copy()
        multi = last > first
        if multi.any():
            idx = np.empty(2 * int(multi.sum()), dtype=np.int64)
            idx[0::2] = first[multi] + 1
            idx[1::2] = last[multi] + 1
            tail = np.append(step_gaps, np.nan)  # room for the end index
            mx = np.maximum.reduceat(tail, idx)[0::2]
            mg[multi] = np.maximum(mg[multi], mx)
        max_gap[sel] = mg
        # weights: measured requests alive across step gap i (first < i <= last)
        msel = measured[sel]
        diff = np.zeros(len(ends) + 1, dtype=np.int64)
        np.add.at(diff, first[msel] + 1, 1)
        np.add.at(diff, last[msel] + 1, -1)
        weight = np.cumsum(diff)[: len(ends)]
        gap_values.append(step_gaps[weight > 0])
        gap_weights.append(weight[weight > 0])
        gap_values.append(first_gap[msel])
        gap_weights.append(np.ones(int(msel.sum()), dtype=np.int64))

    gaps = GapDistribution(
        values_s=np.concatenate(gap_values) if gap_values else np.empty(0),
        weights=np.concatenate(gap_weights) if gap_weights else np.empty(0, dtype=np.int64),
    )
    ttft = log.first_token_at_s - arrival
    e2e = log.finish_at_s - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out >= 2, (log.finish_at_s - log.first_token_at_s) / (out - 1), np.nan)
    reasons = np.array([log.reason.get(i, "") for i in range(n)], dtype=object) if log.reason else ""
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_at_s": arrival,
            "prompt_tokens": req.prompt_tokens,
            "output_tokens": out,
            "measured": measured,
            "status": pd.Categorical.from_codes(status, categories=[STATUS_NAMES[i] for i in range(3)]),
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
    """Emission times of every token of one completed request (for tests and plots)."""
    log = raw.log
    out = int(raw.requests.output_tokens[request_id])
    first = log.first_token_at_s[request_id]
    if out == 1:
        return np.array([first])
    w = raw.workers[int(log.decode_worker[request_id])]
    s = int(log.first_token_step[request_id])
    ends = w.steps.step_end_times()
    return np.concatenate([[first], ends[s : s + out - 1]])
