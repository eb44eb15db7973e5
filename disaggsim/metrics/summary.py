"""Summary metrics: pure functions over the per-request frame and the gap distribution.

Definitions (docs/metrics.md): percentiles are inverted-CDF (an observed value); only
*measured* requests (arrival >= warm-up) count; a request attains the SLO when it
completed, its TTFT <= ``slo.ttft_ms`` and its ITL statistic (TPOT or largest gap)
<= ``slo.itl_ms``. Rejected and unfinished requests count as misses.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from disaggsim.config.scenario import Scenario
from disaggsim.engine.cluster import RawResult
from disaggsim.metrics.reconstruct import GapDistribution, percentile


def slo_met(frame: pd.DataFrame, scenario: Scenario) -> np.ndarray:
    slo = scenario.slo
    itl = frame["tpot_s"] if slo.itl_statistic == "tpot" else frame["max_itl_s"]
    itl = itl.fillna(0.0)  # one-token replies have no gaps
    ok = (frame["status"] == "completed") & (frame["ttft_s"] <= slo.ttft_s) & (itl <= slo.itl_s)
    return ok.to_numpy()


def summarize(
    frame: pd.DataFrame, gaps: GapDistribution, raw: RawResult, scenario: Scenario
) -> dict[str, float | int | str | bool]:
    m = frame[frame["measured"]]
    done = m[m["status"] == "completed"]
    slo = scenario.slo
    met = slo_met(m, scenario)
    attainment = float(met.mean()) if len(m) else float("nan")
    span = (done["finish_at_s"].max() - m["arrival_at_s"].min()) if len(done) else float("nan")
    out: dict[str, float | int | str | bool] = {
        "scenario": scenario.name,
        "architecture": scenario.architecture
        + (f"-{scenario.pool.scheduler}" if scenario.pool is not None else ""),
        "seed": scenario.seed,
        "num_gpus": scenario.num_gpus,
        "num_requests": int(len(m)),
        "num_completed": int(len(done)),
        "num_rejected": int((m["status"] == "rejected").sum()),
        "num_abandoned": int((m["status"] == "abandoned").sum()),
        "num_unfinished": int((m["status"] == "unfinished").sum()),
        "num_retried": int((m["num_retries"] > 0).sum()),
        "num_retries": int(m["num_retries"].sum()),
        "num_preempted": int((m["num_preemptions"] > 0).sum()),
        "num_preemptions": int(m["num_preemptions"].sum()),
    }
    for reason, count in m.loc[m["reason"] != "", "reason"].value_counts().sort_index().items():
        out[f"num_reason_{reason}"] = int(count)
    retried = done[done["num_retries"] > 0]
    if len(retried):
        out["retried_ttft_p99_s"] = percentile(retried["ttft_s"].to_numpy(float), 99)
        out["retried_max_itl_p50_s"] = percentile(retried["max_itl_s"].to_numpy(float), 50)
        out["retried_e2e_p50_s"] = percentile(retried["e2e_s"].to_numpy(float), 50)
    if raw.failures:
        # requests arriving from 5 s before a failure to 30 s after it
        near = np.zeros(len(done), dtype=bool)
        arr = done["arrival_at_s"].to_numpy()
        for at, _ in raw.failures:
            near |= (arr >= at - 5.0) & (arr < at + 30.0)
        out["ttft_p99_near_failures_s"] = percentile(done["ttft_s"].to_numpy(float)[near], 99)
    rs = raw.router_samples
    out["router_queue_max"] = int(max(rs.queue_len, default=0))
    out["orphaned_kv_bytes_max"] = int(max(rs.orphaned_kv_bytes, default=0))
    for key, value in raw.counters.items():
        out[key] = int(value)
    for col, key in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e")):
        vals = done[col].to_numpy(float)
        for q in (50, 90, 99):
            out[f"{key}_p{q}_s"] = percentile(vals, q)
        out[f"{key}_mean_s"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    for q in (50, 90, 99):
        out[f"itl_p{q}_s"] = gaps.percentile(q)
    out["itl_max_s"] = float(gaps.values_s.max()) if gaps.count else float("nan")
    q = slo.percentile
    ttft_q = percentile(done["ttft_s"].to_numpy(float), q)
    itl_q = gaps.percentile(q)
    out.update(
        {
            "slo_ttft_s": slo.ttft_s,
            "slo_itl_s": slo.itl_s,
            "slo_itl_statistic": slo.itl_statistic,
            "slo_percentile": q,
            "ttft_at_slo_percentile_s": ttft_q,
            "itl_at_slo_percentile_s": itl_q,
            "slo_attainment": attainment,
            "slo_attainment_target": slo.attainment_target,
            "slo_attained": bool(attainment >= slo.attainment_target),
            "output_tokens_per_s": float(done["output_tokens"].sum() / span)
            if span and span > 0
            else float("nan"),
            "requests_per_s": float(len(done) / span) if span and span > 0 else float("nan"),
            "offered_requests_per_s": _offered_rate(m),
        }
    )
    if scenario.architecture == "disaggregated":
        tr = done["transfer_s"].to_numpy(float)
        out["kv_transfer_p50_s"] = percentile(tr, 50)
        out["kv_transfer_p99_s"] = percentile(tr, 99)
        # exposed: the part of the handoff after the KV was complete (prefill end)
        exposed = done["transfer_end_at_s"] - np.maximum(
            done["prefill_end_at_s"], done["transfer_start_at_s"]
        )
        out["kv_exposed_p50_s"] = percentile(exposed.to_numpy(float), 50)
        out["kv_exposed_p99_s"] = percentile(exposed.to_numpy(float), 99)
        kv_bpt = raw.kv_bytes_per_token.get("prefill", 0)
        out["kv_transfer_bytes_mean"] = (
            float((done["prompt_tokens"] * kv_bpt).mean()) if len(done) else float("nan")
        )
        out["link_util_max"] = float("nan")
        if raw.link_util is not None:
            from disaggsim.fabric.flows import fabric_summary

            fab = fabric_summary(raw.transfers, raw.link_util, raw.end_at_s)
            out["link_util_max"] = fab["link_util_max"]
    end = raw.end_at_s
    # GPU-hours and mean pool sizes (workers holding GPUs: starting, serving, draining)
    out["gpu_hours"] = float(
        sum((min(rel, end) - at) * gpus for _, _, gpus, at, rel in raw.allocations) / 3600.0
    )
    out["scale_events"] = int(raw.scale_events)
    for role in sorted({w.role for w in raw.workers}):
        spans = [(at, min(rel, end)) for _, r, _, at, rel in raw.allocations if r == role]
        held = sum(b - a for a, b in spans if b > a)
        out[f"mean_workers_{role}"] = float(held / end) if end > 0 else 0.0
    for role in sorted({w.role for w in raw.workers}):
        ws = [w for w in raw.workers if w.role == role]
        busy = sum(w.steps.busy_s() for w in ws)
        out[f"util_{role}"] = float(busy / (len(ws) * end)) if end > 0 else 0.0
    out["sim_end_s"] = float(end)
    return out


def _offered_rate(m: pd.DataFrame) -> float:
    if len(m) < 2:
        return float("nan")
    a = m["arrival_at_s"].to_numpy()
    return float((len(a) - 1) / (a[-1] - a[0])) if a[-1] > a[0] else float("nan")
