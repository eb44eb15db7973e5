"""PNG plots of one run: TTFT and ITL CDFs, queue-depth and KV-occupancy timelines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from disaggsim.metrics.reconstruct import GapDistribution

if TYPE_CHECKING:
    from disaggsim.run import SimulationResult


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: SimulationResult, out_dir: Path) -> list[Path]:
    plt = _pyplot()
    paths = []
    slo = result.scenario.slo
    # the rows and columns each plot reads, no more: a fleet's frames are hundreds of MB
    req = result.requests
    done = (req["measured"] & (req["status"] == "completed")).to_numpy(bool)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ttft = np.sort(req["ttft_s"].to_numpy(float)[done])
    ax = axes[0]
    if len(ttft):
        # every point up to MAX_CURVE_POINTS, else every k-th and the last: the CDF rises
        # at most 1/MAX_CURVE_POINTS between two drawn points (far below a pixel)
        n = len(ttft)
        keep = (
            np.arange(n)
            if n <= MAX_CURVE_POINTS
            else np.unique(np.linspace(0, n - 1, MAX_CURVE_POINTS).astype(np.int64))
        )
        ax.step(ttft[keep], (keep + 1) / n, where="post")
    ax.axvline(slo.ttft_s, color="r", ls="--", lw=1, label=f"SLO {slo.ttft_ms:g} ms")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("Time to first token")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    ax = axes[1]
    g = result.gaps
    if g.count:
        v, cum = _gap_cdf(g)
        ax.step(v * 1e3, cum, where="post")
        ax.set_xscale("log")
    ax.axvline(slo.itl_ms, color="r", ls="--", lw=1, label=f"SLO {slo.itl_ms:g} ms")
    ax.set_xlabel("inter-token gap (ms)")
    ax.set_title("Inter-token latency (all gaps)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.suptitle(result.scenario.name)
    fig.tight_layout()
    p = out_dir / "latency_cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    ts = result.timeseries
    role_of = ts["role"]
    router = ts.loc[
        (role_of == "router").to_numpy(bool), ["at_s", "queue_len", "orphaned_kv_bytes"]
    ]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    if len(router):
        axes[0].step(router["at_s"], router["queue_len"], where="post", label="router", color="k")
        axes[2].step(
            router["at_s"], router["orphaned_kv_bytes"] / 1e9, where="post", color="tab:red"
        )
    axes[2].set_ylabel("orphaned KV (GB)")
    for role in sorted(set(role_of.unique()) - {"router"}):
        grp = ts.loc[(role_of == role).to_numpy(bool), ["at_s", "worker", "queue_len", "kv_util"]]
        # pool-level totals: last known value per worker, summed at each sample time
        at, queue = _pool_total(grp, "queue_len")
        _, kv = _pool_total(grp, "kv_util")
        num_workers = grp["worker"].nunique()
        axes[0].step(at, queue, where="post", label=str(role))
        axes[1].step(at, kv / num_workers, where="post", label=str(role))
    axes[0].set_ylabel("queued requests (pool)")
    axes[1].set_ylabel("KV occupancy (pool mean)")
    axes[2].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right")
    axes[1].legend(loc="upper right")
    fig.tight_layout()
    p = out_dir / "timeline.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    if "cache_hbm_tokens" in ts.columns:
        cols = ["at_s", "worker", *(c for c in ts.columns if c.startswith("cache_"))]
        prefill = ts.loc[(role_of == "prefill").to_numpy(bool), cols]
        paths.append(_cache_plot(plt, prefill, out_dir, result.scenario.name))
    return paths


MAX_CURVE_POINTS = 20_000  # points of a drawn CDF (a figure is about 1,200 pixels wide)


def _gap_cdf(g: GapDistribution) -> tuple[np.ndarray, np.ndarray]:
    """The weighted CDF of the gaps: at every gap when there are at most
    MAX_CURVE_POINTS, else at the right edges of MAX_CURVE_POINTS bins equal on the log
    axis between the smallest positive gap and the largest (each bin narrower than a
    pixel; gaps <= 0, which a log axis cannot show, count from the first point on)."""
    total = float(g.count)
    if sum(len(v) for _, v in g.by_weight) <= MAX_CURVE_POINTS:
        order = np.argsort(g.values_s, kind="stable")
        return g.values_s[order], np.cumsum(g.weights[order]) / total
    positive = [v[v > 0] for _, v in g.by_weight]
    if not any(len(p) for p in positive):  # nothing a log axis can show
        return np.array([g.max_s()]), np.array([1.0])
    lo = min(float(p.min()) for p in positive if len(p))
    edges = np.geomspace(lo, g.max_s(), MAX_CURVE_POINTS + 1)
    weight = np.zeros(MAX_CURVE_POINTS + 1)
    for (w, v), p in zip(g.by_weight, positive, strict=True):
        weight[0] += w * (len(v) - len(p))  # gaps <= 0
        # bin i holds (edges[i - 1], edges[i]]; the smallest positive gap is edge 0
        weight += w * np.bincount(np.searchsorted(edges, p, side="left"), minlength=len(edges))
    return edges, np.cumsum(weight) / total


def _pool_total(grp: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A pool's ``column`` summed over its workers at each of its sample times (rows in
    time order), each worker counting its last value so far (0 before its first): the
    row sums of the (time x worker) table forward-filled, without building that table
    (a fleet has millions of sample times and hundreds of workers). Each row changes
    the sum by its value minus its worker's previous one."""
    at = grp["at_s"].to_numpy(float)
    worker = grp["worker"].to_numpy()
    value = grp[column].to_numpy(float)
    if len(at) == 0:
        return at, value
    by_worker = np.argsort(worker, kind="stable")  # each worker's rows in time order
    v = value[by_worker]
    previous = np.zeros(len(v))
    previous[1:] = v[:-1]
    w = worker[by_worker]
    previous[np.flatnonzero(w[1:] != w[:-1]) + 1] = 0.0  # a worker's first row
    change = np.empty(len(v))
    change[by_worker] = v - previous
    total = np.cumsum(change)
    last = np.append(at[1:] != at[:-1], True)  # the last row of each sample time
    return at[last], total[last]


def _pool_max(
    grp: pd.DataFrame, column: str, rows_per_block: int = 20_000
) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_pool_total`, the largest instead of the sum (0 before a worker's
    first sample): the forward-filled (row x worker) table built a block of rows at a
    time, each block starting from the workers' values at the end of the one before."""
    at = grp["at_s"].to_numpy(float)
    value = grp[column].to_numpy(float)
    if len(at) == 0:
        return at, value
    workers, col = np.unique(grp["worker"].to_numpy(), return_inverse=True)
    out = np.empty(len(at))
    carried = np.zeros(len(workers))  # each worker's value before the block
    for a in range(0, len(at), rows_per_block):
        b = min(a + rows_per_block, len(at))
        rows = np.arange(b - a)
        # latest[i, w]: the block row of worker w's last sample up to row i (-1: none)
        latest = np.full((b - a, len(workers)), -1, dtype=np.int64)
        latest[rows, col[a:b]] = rows
        np.maximum.accumulate(latest, axis=0, out=latest)
        table = np.where(latest >= 0, value[a:b][np.maximum(latest, 0)], carried)
        out[a:b] = table.max(axis=1)
        carried = table[-1]
    last = np.append(at[1:] != at[:-1], True)  # the last row of each sample time
    return at[last], out[last]


def _cache_plot(plt: Any, ts: pd.DataFrame, out_dir: Path, name: str) -> Path:
    """Prefix cache occupancy beside the KV one: the pool's HBM cache (cached + pending,
    and the pinned part), DRAM over its nodes and the remote store, in tokens."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for col, label in (("cache_hbm_tokens", "HBM (cached + pending)"),
                       ("cache_hbm_pinned_tokens", "HBM pinned (in use)")):  # fmt: skip
        at, total = _pool_total(ts, col)
        axes[0].step(at, total / 1e6, where="post", label=label)
    axes[0].set_ylabel("prefill pool HBM cache (M tokens)")
    # a node's DRAM is seen by each of its workers: its largest view per instant
    at, dram = _pool_max(ts, "cache_dram_tokens")
    axes[1].step(at, dram / 1e6, where="post", label="DRAM (busiest node)")
    remote = ts.sort_values("at_s", kind="stable")
    axes[1].step(remote["at_s"], remote["cache_remote_tokens"] / 1e6, where="post", label="remote")
    axes[1].set_ylabel("lower tiers (M tokens)")
    axes[1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(f"{name}: prefix cache occupancy")
    fig.tight_layout()
    p = out_dir / "cache.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
