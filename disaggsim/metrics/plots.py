"""PNG plots of one run: TTFT and ITL CDFs, queue-depth and KV-occupancy timelines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

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
    done = result.requests[
        (result.requests["measured"]) & (result.requests["status"] == "completed")
    ]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ttft = np.sort(done["ttft_s"].to_numpy(float))
    ax = axes[0]
    if len(ttft):
        ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post")
    ax.axvline(slo.ttft_s, color="r", ls="--", lw=1, label=f"SLO {slo.ttft_ms:g} ms")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("Time to first token")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    ax = axes[1]
    g = result.gaps
    if g.count:
        order = np.argsort(g.values_s, kind="stable")
        v = g.values_s[order]
        cum = np.cumsum(g.weights[order]) / g.weights.sum()
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
    router = ts[ts["role"] == "router"]
    ts = ts[ts["role"] != "router"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    if len(router):
        axes[0].step(router["at_s"], router["queue_len"], where="post", label="router", color="k")
        axes[2].step(
            router["at_s"], router["orphaned_kv_bytes"] / 1e9, where="post", color="tab:red"
        )
    axes[2].set_ylabel("orphaned KV (GB)")
    for role, grp in ts.groupby("role", sort=True):
        # pool-level totals: last known value per worker, summed at each sample time
        wide = grp.pivot_table(
            index="at_s", columns="worker", values=["queue_len", "kv_util"], aggfunc="last"
        )
        wide = wide.sort_index().ffill().fillna(0)
        # the columns are (value, worker): each value selects a frame, one column per worker
        queue = cast(pd.DataFrame, wide["queue_len"])
        kv = cast(pd.DataFrame, wide["kv_util"])
        axes[0].step(wide.index, queue.sum(axis=1), where="post", label=str(role))
        axes[1].step(wide.index, kv.mean(axis=1), where="post", label=str(role))
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
        paths.append(_cache_plot(plt, ts[ts["role"] == "prefill"], out_dir, result.scenario.name))
    return paths


def _cache_plot(plt: Any, ts: pd.DataFrame, out_dir: Path, name: str) -> Path:
    """Prefix cache occupancy beside the KV one: the pool's HBM cache (cached + pending,
    and the pinned part), DRAM over its nodes and the remote store, in tokens."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    cols = ["cache_hbm_tokens", "cache_hbm_pinned_tokens", "cache_dram_tokens"]
    wide = ts.pivot_table(index="at_s", columns="worker", values=cols, aggfunc="last")
    wide = wide.sort_index().ffill().fillna(0)
    for col, label in (("cache_hbm_tokens", "HBM (cached + pending)"),
                       ("cache_hbm_pinned_tokens", "HBM pinned (in use)")):  # fmt: skip
        total = cast(pd.DataFrame, wide[col]).sum(axis=1)
        axes[0].step(wide.index, total / 1e6, where="post", label=label)
    axes[0].set_ylabel("prefill pool HBM cache (M tokens)")
    # a node's DRAM is seen by each of its workers: its largest view per instant
    dram = cast(pd.DataFrame, wide["cache_dram_tokens"]).max(axis=1)
    axes[1].step(wide.index, dram / 1e6, where="post", label="DRAM (busiest node)")
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
