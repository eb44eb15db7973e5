"""PNG plots of one run: TTFT and ITL CDFs, queue-depth and KV-occupancy timelines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

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
    return paths
