"""Summary metrics: pure functions over the per-request frame and the gap distribution.

Definitions (docs/metrics.md): percentiles are inverted-CDF (an observed value); only
*measured* requests (arrival >= warm-up) count; a request attains the SLO when it
completed, its TTFT <= ``slo.ttft_ms`` and its ITL statistic (TPOT or largest gap)
<= ``slo.itl_ms``. Rejected and unfinished requests count as misses.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from disaggsim.cache.summary import prefix_summary
from disaggsim.config.scenario import Scenario
from disaggsim.engine.cluster import RawResult
from disaggsim.errors import InvariantError
from disaggsim.metrics.early_stop import attainment_bound, provable_misses
from disaggsim.metrics.reconstruct import GapDistribution, percentile
from disaggsim.metrics.steady import Stability, meets_slo, stability, stationary_arrivals
from disaggsim.metrics.summary_table import Summary


def _prefix_keys(raw: RawResult, measured: pd.DataFrame) -> dict[str, Any]:
    """The prefix-cache keys over the measured requests (none without a cache)."""
    if raw.prefix_log is None:
        return {}
    rid = measured["request_id"].to_numpy()
    hbm, dram, remote = (col[rid] for col in raw.prefix_log.columns())
    return prefix_summary(measured["prompt_tokens"].to_numpy(), hbm, dram, remote)


def slo_met(frame: pd.DataFrame, scenario: Scenario) -> np.ndarray:
    slo = scenario.slo
    itl = frame["tpot_s"] if slo.itl_statistic == "tpot" else frame["max_itl_s"]
    itl = itl.fillna(0.0)  # one-token replies have no gaps
    ok = (frame["status"] == "completed") & (frame["ttft_s"] <= slo.ttft_s) & (itl <= slo.itl_s)
    return ok.to_numpy()


def summarize(
    frame: pd.DataFrame, gaps: GapDistribution, raw: RawResult, scenario: Scenario
) -> Summary:
    m = _rows(frame, frame["measured"].to_numpy(bool))
    done = _rows(m, (m["status"] == "completed").to_numpy(bool))
    slo = scenario.slo
    met = slo_met(m, scenario)
    attainment = float(met.mean()) if len(m) else float("nan")
    span = (done["finish_at_s"].max() - m["arrival_at_s"].min()) if len(done) else float("nan")
    reasons = m.loc[m["reason"] != "", "reason"].value_counts().sort_index()
    retried = done[done["num_retries"] > 0]
    retried_stats: dict[str, float] = {}
    if len(retried):
        retried_stats = {
            "retried_ttft_p99_s": percentile(retried["ttft_s"].to_numpy(float), 99),
            "retried_max_itl_p50_s": percentile(retried["max_itl_s"].to_numpy(float), 50),
            "retried_e2e_p50_s": percentile(retried["e2e_s"].to_numpy(float), 50),
        }
    near_failures = None
    if raw.failures:
        # requests arriving from 5 s before a failure to 30 s after it
        near = np.zeros(len(done), dtype=bool)
        arr = done["arrival_at_s"].to_numpy()
        for at, _ in raw.failures:
            near |= (arr >= at - 5.0) & (arr < at + 30.0)
        near_failures = percentile(done["ttft_s"].to_numpy(float)[near], 99)
    unknown = sorted(set(raw.counters) - set(COUNTERS))
    if unknown:
        raise RuntimeError(f"engine counters {unknown} have no row in the summary table")
    rs = raw.router_samples
    lat = {
        f"{key}_{stat}_s": value
        for col, key in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e"))
        for stat, value in _stats(done[col].to_numpy(float)).items()
    }
    q = slo.percentile
    itl_p50, itl_p90, itl_p99, itl_at_q = gaps.percentiles((50, 90, 99, q))
    rate_ok = bool(span and span > 0)
    end = raw.end_at_s
    roles = sorted({w.role for w in raw.workers})
    handoff = _handoff(done, raw, scenario)
    steps = {role: _step_seconds(raw, role) for role in roles}
    busy_share = {role: _busy_share(raw, role, steps[role][0]) for role in roles}
    kv_token_s = _kv_token_s(raw)
    stopped_at = float(raw.stopped_early_at_s)
    stopped = stopped_at == stopped_at  # not NaN: a stop check ended the run
    bound: float | None = None
    if stopped:
        # not judged: the run certainly misses (its attainment bound is below target)
        bound = _attainment_bound_at_stop(frame, raw, scenario, stopped_at)
        attainment = float("nan")
        steady = Stability(False, float("nan"), float("nan"), ())
    else:
        steady = stability(
            frame,
            scenario.sim.warmup_s,
            scenario.sim.duration_s,
            stationary=stationary_arrivals(scenario.workload),
            client_timeout_s=scenario.router.client_timeout_s,
            ttft_target_s=slo.ttft_s,
        )
    return Summary(
        scenario=scenario.name,
        architecture=scenario.architecture
        + (f"-{scenario.pool.scheduler}" if scenario.pool is not None else ""),
        seed=scenario.seed,
        num_gpus=scenario.num_gpus,
        num_requests=int(len(m)),
        num_completed=int(len(done)),
        num_rejected=int((m["status"] == "rejected").sum()),
        num_abandoned=int((m["status"] == "abandoned").sum()),
        num_unfinished=int((m["status"] == "unfinished").sum()),
        num_retried=int((m["num_retries"] > 0).sum()),
        num_retries=int(m["num_retries"].sum()),
        num_preempted=int((m["num_preemptions"] > 0).sum()),
        num_preemptions=int(m["num_preemptions"].sum()),
        num_reason={str(r): int(c) for r, c in reasons.items()},
        retried_ttft_p99_s=retried_stats.get("retried_ttft_p99_s"),
        retried_max_itl_p50_s=retried_stats.get("retried_max_itl_p50_s"),
        retried_e2e_p50_s=retried_stats.get("retried_e2e_p50_s"),
        ttft_p99_near_failures_s=near_failures,
        router_queue_max=int(max(rs.queue_len, default=0)),
        orphaned_kv_bytes_max=int(max(rs.orphaned_kv_bytes, default=0)),
        num_resent_transfers=int(raw.counters["num_resent_transfers"]),
        num_worker_failures=int(raw.counters["num_worker_failures"]),
        num_chunked_steps=raw.counters.get("num_chunked_steps"),
        num_chunk_budget_full_steps=raw.counters.get("num_chunk_budget_full_steps"),
        ttft_p50_s=lat["ttft_p50_s"],
        ttft_p90_s=lat["ttft_p90_s"],
        ttft_p99_s=lat["ttft_p99_s"],
        ttft_mean_s=lat["ttft_mean_s"],
        tpot_p50_s=lat["tpot_p50_s"],
        tpot_p90_s=lat["tpot_p90_s"],
        tpot_p99_s=lat["tpot_p99_s"],
        tpot_mean_s=lat["tpot_mean_s"],
        e2e_p50_s=lat["e2e_p50_s"],
        e2e_p90_s=lat["e2e_p90_s"],
        e2e_p99_s=lat["e2e_p99_s"],
        e2e_mean_s=lat["e2e_mean_s"],
        itl_p50_s=itl_p50,
        itl_p90_s=itl_p90,
        itl_p99_s=itl_p99,
        itl_max_s=gaps.max_s(),
        slo_ttft_s=slo.ttft_s,
        slo_itl_s=slo.itl_s,
        slo_itl_statistic=slo.itl_statistic,
        slo_percentile=q,
        ttft_at_slo_percentile_s=percentile(done["ttft_s"].to_numpy(float), q),
        itl_at_slo_percentile_s=itl_at_q,
        slo_attainment=attainment,
        slo_attainment_target=slo.attainment_target,
        slo_attained=bool(attainment >= slo.attainment_target),
        stable=steady.stable,
        stability_p_value=steady.p_value,
        waiting_trend_per_s=steady.slope("waiting"),
        ttft_trend_s_per_s=steady.slope("ttft"),
        meets_slo=meets_slo(attainment, slo.attainment_target, steady.stable),
        stopped_early_at_s=stopped_at if stopped else None,
        slo_attainment_upper_bound=bound,
        num_arrived=int((m["arrival_at_s"] < stopped_at).sum()) if stopped else None,
        output_tokens_per_s=float(done["output_tokens"].sum() / span) if rate_ok else float("nan"),
        requests_per_s=float(len(done) / span) if rate_ok else float("nan"),
        offered_requests_per_s=_offered_rate(m),
        kv_transfer_p50_s=handoff.get("kv_transfer_p50_s"),
        kv_transfer_p99_s=handoff.get("kv_transfer_p99_s"),
        kv_exposed_p50_s=handoff.get("kv_exposed_p50_s"),
        kv_exposed_p99_s=handoff.get("kv_exposed_p99_s"),
        kv_transfer_bytes_mean=handoff.get("kv_transfer_bytes_mean"),
        link_util_max=handoff.get("link_util_max"),
        gpu_hours=float(
            sum((min(rel, end) - at) * gpus for _, _, gpus, at, rel in raw.allocations) / 3600.0
        ),
        scale_events=int(raw.scale_events),
        **_prefix_keys(raw, m),
        mean_workers={role: _mean_workers(raw, role) for role in roles},
        busy_share=busy_share,
        mean_batch={role: _mean_batch(raw, role, steps[role]) for role in roles},
        mean_kv_util={role: _mean_kv_util(raw, role, kv_token_s) for role in roles},
        util=dict(busy_share),
        sim_end_s=float(end),
    )


def _attainment_bound_at_stop(
    frame: pd.DataFrame, raw: RawResult, scenario: Scenario, stopped_at_s: float
) -> float:
    """A stopped run's attainment bound: its measured requests that had provably missed
    at the stop (:func:`~disaggsim.metrics.early_stop.provable_misses`, completed ones
    judged on their own ITL statistic). Below the target, or the stop was a bug."""
    slo = scenario.slo
    keep = frame["measured"].to_numpy(bool)
    log, req = raw.log, raw.requests
    max_itl = frame["max_itl_s"].to_numpy(float)[keep] if slo.itl_statistic == "max_gap" else None
    missed = provable_misses(
        np.asarray(req.arrival_s)[keep],
        np.asarray(req.output_tokens)[keep],
        log.status[keep],
        log.first_token_at_s[keep],
        log.finish_at_s[keep],
        stopped_at_s,
        slo.ttft_s,
        slo.itl_s,
        max_itl,
    )
    bound = attainment_bound(int(keep.sum()), int(missed.sum()))
    if not bound < slo.attainment_target:
        raise InvariantError(
            f"the run stopped early at {stopped_at_s} s as a certain miss, but its "
            f"attainment could still reach {bound} >= target {slo.attainment_target}"
        )
    return bound


# the request frame's columns the summary reads from its measured and completed rows
_READ_COLUMNS = [
    "request_id",
    "arrival_at_s",
    "prompt_tokens",
    "output_tokens",
    "status",
    "reason",
    "num_retries",
    "num_preemptions",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "max_itl_s",
    "finish_at_s",
    "prefill_end_at_s",
    "transfer_start_at_s",
    "transfer_end_at_s",
    "transfer_s",
]


def _rows(frame: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The rows where ``keep`` holds: ``frame`` itself when that is every row, else a
    copy of those rows of the columns the summary reads (a fleet-hour's frame is
    hundreds of MB; a boolean selection copies every column)."""
    if bool(keep.all()):
        return frame
    return frame.loc[keep, [c for c in _READ_COLUMNS if c in frame.columns]]


# the engine's counters (RawResult.counters), each a summary key
COUNTERS = (
    "num_resent_transfers",
    "num_worker_failures",
    "num_chunked_steps",
    "num_chunk_budget_full_steps",
)


def _stats(vals: np.ndarray) -> dict[str, float]:
    out = {f"p{q}": percentile(vals, q) for q in (50, 90, 99)}
    out["mean"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    return out


def _handoff(done: pd.DataFrame, raw: RawResult, scenario: Scenario) -> dict[str, float]:
    """The KV handoff keys of a disaggregated run (none for colocated)."""
    if scenario.architecture != "disaggregated":
        return {}
    tr = done["transfer_s"].to_numpy(float)
    # exposed: the part of the handoff after the KV was complete (prefill end)
    exposed = done["transfer_end_at_s"] - np.maximum(
        done["prefill_end_at_s"], done["transfer_start_at_s"]
    )
    kv_bpt = raw.kv_bytes_per_token.get("prefill", 0)
    moved = done["prompt_tokens"].to_numpy(float) * kv_bpt
    from disaggsim.catalog import get_model

    model = get_model(scenario.model)
    win = model.attention_window
    if win is not None:  # windowed layers hold at most their window (the bytes handed off)
        from disaggsim.catalog import dtype_bytes

        per_layer = model.kv_elems_per_token_per_layer() * dtype_bytes(scenario.kv_dtype)
        tokens = done["prompt_tokens"].to_numpy(float)
        moved = per_layer * (
            model.num_full_attention_layers * tokens
            + win.num_layers * np.minimum(tokens, win.tokens)
        )
    link_util_max = float("nan")
    if raw.link_util is not None:
        from disaggsim.fabric.flows import fabric_summary

        link_util_max = fabric_summary(raw.transfers, raw.link_util, raw.end_at_s)["link_util_max"]
    return {
        "kv_transfer_p50_s": percentile(tr, 50),
        "kv_transfer_p99_s": percentile(tr, 99),
        "kv_exposed_p50_s": percentile(exposed.to_numpy(float), 50),
        "kv_exposed_p99_s": percentile(exposed.to_numpy(float), 99),
        "kv_transfer_bytes_mean": float(moved.mean()) if len(done) else float("nan"),
        "link_util_max": link_util_max,
    }


def _mean_workers(raw: RawResult, role: str) -> float:
    """Time-averaged workers of a pool holding GPUs (starting, serving, draining)."""
    end = raw.end_at_s
    spans = [(at, min(rel, end)) for _, r, _, at, rel in raw.allocations if r == role]
    held = sum(b - a for a, b in spans if b > a)
    return float(held / end) if end > 0 else 0.0


def _held_s(raw: RawResult, role: str) -> float:
    """Worker-seconds the pool's workers held GPUs (allocations cut at the end)."""
    end = raw.end_at_s
    return float(
        sum(max(min(rel, end) - at, 0.0) for _, r, _, at, rel in raw.allocations if r == role)
    )


def _step_seconds(raw: RawResult, role: str) -> tuple[float, float]:
    """(busy s, sequence-seconds) of the pool's workers: :meth:`StepLog.busy_s` and
    :meth:`StepLog.batch_s` summed in worker order."""
    ws = [w for w in raw.workers if w.role == role]
    return sum(w.steps.busy_s() for w in ws), sum(w.steps.batch_s() for w in ws)


def _busy_share(raw: RawResult, role: str, busy: float | None = None) -> float:
    """Busy seconds over held seconds (``busy``: the pool's, if already summed)."""
    held = _held_s(raw, role)
    if busy is None:
        busy = _step_seconds(raw, role)[0]
    return float(busy / held) if held > 0 else 0.0


def _mean_batch(
    raw: RawResult, role: str, step_seconds: tuple[float, float] | None = None
) -> float:
    busy, batch = _step_seconds(raw, role) if step_seconds is None else step_seconds
    return float(batch / busy) if busy > 0 else 0.0


def _mean_kv_util(raw: RawResult, role: str, kv_token_s: dict[str, float] | None = None) -> float:
    """Time-averaged KV use of the pool from the per-worker state-change samples
    (``kv_token_s``: :func:`_kv_token_s`, if already computed)."""
    used = (_kv_token_s(raw) if kv_token_s is None else kv_token_s).get(role, 0.0)
    held = _held_kv_token_s(raw, role)
    return used / held if held > 0 else 0.0


def _kv_token_s(raw: RawResult) -> dict[str, float]:
    """Token-seconds of KV each pool used, from the per-worker state-change samples
    (each sample's use holds until the worker's next sample, the last until the end).

    Summed per pool as one ``np.sum`` over its samples in worker, then time order
    (stable): one stable sort by worker (16-bit keys: a radix sort), then worker by
    worker (the samples are recorded in time order; a worker's are sorted by time
    where they are not), so no full-length copy of the samples is made."""
    end = raw.end_at_s
    s = raw.samples
    at = np.asarray(s.at_s, float)
    kv = np.asarray(s.kv_used_tokens)
    worker = np.asarray(s.worker)
    key = worker.astype(np.uint16) if len(raw.workers) <= 1 << 16 else worker.astype(np.int64)
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    out: dict[str, float] = {}
    for role in sorted({w.role for w in raw.workers}):
        idx = [w.index for w in raw.workers if w.role == role]
        lo = np.searchsorted(sorted_key, idx, side="left")
        hi = np.searchsorted(sorted_key, idx, side="right")
        used = np.empty(int((hi - lo).sum()))
        pos = 0
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            rows = order[a:b]
            t = at[rows]
            if bool(np.any(t[1:] < t[:-1])):  # not in time order: sort it (stable)
                rows = rows[np.argsort(t, kind="stable")]
                t = at[rows]
            held = np.empty(len(t))
            held[:-1] = t[1:]
            held[-1:] = end
            held -= t
            np.clip(held, 0.0, None, out=held)
            used[pos : pos + len(t)] = kv[rows].astype(float) * held
            pos += len(t)
        out[role] = float(np.sum(used))
    return out


def _held_kv_token_s(raw: RawResult, role: str) -> float:
    """KV token-seconds the pool's workers held (capacity x allocation, cut at the end)."""
    end = raw.end_at_s
    cap = {w.index: w.kv_capacity_tokens for w in raw.workers if w.role == role}
    return sum(
        max(min(rel, end) - a, 0.0) * cap[i] for i, r, _, a, rel in raw.allocations if r == role
    )


def _offered_rate(m: pd.DataFrame) -> float:
    if len(m) < 2:
        return float("nan")
    a = m["arrival_at_s"].to_numpy()
    span_s = float(a[-1] - a[0])
    # Arrivals within a nanosecond (bursty gamma gaps can be ~1e-300 s) give no rate;
    # dividing by such a span would overflow.
    return (len(a) - 1) / span_s if span_s > 1e-9 else float("nan")
