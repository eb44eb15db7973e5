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
        at = router["at_s"].to_numpy(float)
        axes[0].step(
            *_envelope(at, router["queue_len"].to_numpy(float)),
            where="post",
            label="router",
            color="k",
        )
        axes[2].step(
            *_envelope(at, router["orphaned_kv_bytes"].to_numpy(float) / 1e9),
            where="post",
            color="tab:red",
        )
    axes[2].set_ylabel("orphaned KV (GB)")
    at_all, worker_all = ts["at_s"].to_numpy(float), ts["worker"].to_numpy()
    for role in sorted(set(role_of.unique()) - {"router"}):
        rows = (role_of == role).to_numpy(bool)
        worker = worker_all[rows]
        num_workers = int(np.count_nonzero(np.bincount(worker)))
        # pool-level totals: last known value per worker, summed at each sample time
        pool = _PoolTotals(at_all[rows], worker)
        del worker
        at = pool.times()
        queue = pool.sum(ts["queue_len"].to_numpy()[rows])
        axes[0].step(*_envelope(at, queue), where="post", label=str(role))
        kv = pool.sum(ts["kv_util"].to_numpy()[rows])
        kv /= num_workers
        axes[1].step(*_envelope(at, kv), where="post", label=str(role))
        del pool, queue, kv
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
MAX_STEP_POINTS = 200_000  # points of a drawn step curve before it is cut to its envelope
STEP_BINS = 5_000  # bins of such an envelope: at most 4 points each


def _gap_cdf(g: GapDistribution) -> tuple[np.ndarray, np.ndarray]:
    """The weighted CDF of the gaps: at every gap when there are at most
    MAX_CURVE_POINTS, else at the right edges of MAX_CURVE_POINTS bins equal on the log
    axis between the smallest positive gap and the largest (each bin narrower than a
    pixel; gaps <= 0, which a log axis cannot show, count from the first point on)."""
    total = float(g.count)
    if sum(len(v) for _, v in g.by_weight) <= MAX_CURVE_POINTS:
        order = np.argsort(g.values_s, kind="stable")
        return g.values_s[order], np.cumsum(g.weights[order]) / total
    # one weight group at a time, each cut in chunks (a fleet's gaps are hundreds of MB)
    lows = [_smallest_positive(v) for _, v in g.by_weight]
    if all(np.isnan(lows)):  # nothing a log axis can show
        return np.array([g.max_s()]), np.array([1.0])
    edges = np.geomspace(np.nanmin(lows), g.max_s(), MAX_CURVE_POINTS + 1)
    weight = np.zeros(MAX_CURVE_POINTS + 1)
    for w, v in g.by_weight:
        counts = np.zeros(len(edges), dtype=np.int64)
        for start in range(0, len(v), _CHUNK):
            part = v[start : start + _CHUNK]
            p = part[part > 0]
            counts[0] += len(part) - len(p)  # gaps <= 0
            # bin i holds (edges[i - 1], edges[i]]; the smallest positive gap is edge 0
            counts += np.bincount(_geometric_bin(edges, p), minlength=len(edges))
        weight += w * counts
    return edges, np.cumsum(weight) / total


_CHUNK = 1 << 20  # gaps per vectorised step (8 MB temporaries)


def _smallest_positive(v: np.ndarray) -> float:
    """The smallest value > 0 (NaN when none), without a copy when every value is."""
    if len(v) and float(v.min()) > 0:
        return float(v.min())
    p = v[v > 0]
    return float(p.min()) if len(p) else float("nan")


def _geometric_bin(edges: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``np.searchsorted(edges, p, side="left")`` for geometric ``edges`` (``np.geomspace``)
    and ``edges[0] <= p <= edges[-1]``: from the logarithm, then moved to the smallest ``i``
    with ``p <= edges[i]`` where rounding put it one off (a binary search over 20,000
    edges costs seconds for a fleet's tens of millions of gaps)."""
    m = len(edges) - 1
    if not edges[-1] > edges[0]:  # every positive gap the same
        return np.zeros(len(p), dtype=np.int64)
    i = np.log(p / edges[0])
    i *= m / np.log(edges[-1] / edges[0])
    i = np.ceil(i, out=i).astype(np.int64)
    np.clip(i, 0, m, out=i)
    while (low := np.flatnonzero(p > edges[i])).size:
        i[low] += 1
    while (high := np.flatnonzero((i > 0) & (p <= edges[np.maximum(i - 1, 0)]))).size:
        i[high] -= 1
    return i


def _envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A step curve's points (``x`` in time order): all of them up to MAX_STEP_POINTS
    (every run short of a fleet's: its figure as drawn before), else its envelope in
    STEP_BINS equal bins of ``x`` (several to a pixel column): in each bin its first
    and last point and the first points holding its smallest and largest value, in
    order, so each bin keeps its range and the level it enters and leaves with. A fleet
    hour's timeline has millions of points; drawn, they cost the figure a GB."""
    n = len(x)
    if n <= MAX_STEP_POINTS or not x[-1] > x[0]:
        return x, y
    num_bins = STEP_BINS
    b = ((x - x[0]) * (num_bins / (x[-1] - x[0]))).astype(np.int64)
    np.clip(b, 0, num_bins - 1, out=b)
    starts = np.flatnonzero(np.diff(b)) + 1
    first = np.r_[0, starts]
    last = np.r_[starts - 1, n - 1]
    keep = [first, last]
    for extreme in (np.minimum, np.maximum):
        at = np.repeat(extreme.reduceat(y, first), np.diff(np.r_[first, n]))
        hit = np.flatnonzero(y == at)  # points holding their bin's extreme
        hit_bin = b[hit]
        keep.append(hit[np.r_[True, hit_bin[1:] != hit_bin[:-1]]])  # the first of each bin
    rows = np.unique(np.concatenate(keep))
    return x[rows], y[rows]


def _pool_total(grp: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A pool's ``column`` summed over its workers at each of its sample times
    (:class:`_PoolTotals`; rows in time order): the times and the sums."""
    pool = _PoolTotals(grp["at_s"].to_numpy(float), grp["worker"].to_numpy())
    return pool.times(), pool.sum(grp[column].to_numpy())


class _PoolTotals:
    """A pool's samples (rows in time order): a column summed over its workers at each
    sample time, each worker counting its last value so far (0 before its first). The
    row sums of the (time x worker) table forward-filled, without building that table
    (a fleet has millions of sample times and hundreds of workers): each row changes
    the sum by its value minus its worker's previous one. The rows' order by worker is
    found once for every column summed."""

    def __init__(self, at: np.ndarray, worker: np.ndarray) -> None:
        self._at = at
        n = len(at)
        small = n == 0 or int(worker.max()) < 1 << 15
        # each worker's rows in time order (16-bit keys: a radix sort)
        self._by_worker = np.argsort(worker.astype(np.int16) if small else worker, kind="stable")
        w = worker[self._by_worker]
        self._firsts = np.flatnonzero(np.r_[n > 0, w[1:] != w[:-1]])  # a worker's first row
        self._last = np.append(at[1:] != at[:-1], True) if n else np.zeros(0, dtype=bool)

    def times(self) -> np.ndarray:
        """The sample times (the last row of each)."""
        return self._at[self._last]

    def sum(self, value: np.ndarray) -> np.ndarray:
        """``value`` (one per row) summed over the workers at each sample time."""
        v = np.asarray(value, dtype=float)[self._by_worker]
        if len(v) == 0:
            return v
        step = np.empty(len(v))  # each row's change, rows by worker
        np.subtract(v[1:], v[:-1], out=step[1:])
        step[self._firsts] = v[self._firsts]
        del v
        change = np.empty(len(step))
        change[self._by_worker] = step
        del step
        np.cumsum(change, out=change)
        return change[self._last]


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
        axes[0].step(*_envelope(at, total / 1e6), where="post", label=label)
    axes[0].set_ylabel("prefill pool HBM cache (M tokens)")
    # a node's DRAM is seen by each of its workers: its largest view per instant
    at, dram = _pool_max(ts, "cache_dram_tokens")
    axes[1].step(*_envelope(at, dram / 1e6), where="post", label="DRAM (busiest node)")
    at = ts["at_s"].to_numpy(float)
    by_time = np.argsort(at, kind="stable")
    remote = ts["cache_remote_tokens"].to_numpy(float)[by_time] / 1e6
    axes[1].step(*_envelope(at[by_time], remote), where="post", label="remote")
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
