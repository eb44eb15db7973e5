"""The curves the PNG plots draw (metrics/plots.py) equal their definitions, computed
without the (time x worker) table or a point per gap."""

from __future__ import annotations

import numpy as np
import pandas as pd

from disaggsim.metrics import plots
from disaggsim.metrics.reconstruct import GapDistribution


def test_pool_total_is_the_forward_filled_table_summed():
    """Each worker's last value so far (0 before its first sample; the last row wins at
    a repeated time), summed over the workers at every sample time."""
    rng = np.random.default_rng(2)
    n = 3000
    at = np.sort(np.round(rng.uniform(0, 50, n), 1))  # many rows share a time
    grp = pd.DataFrame(
        {
            "at_s": at,
            "worker": rng.choice([3, 5, 8, 13], n),
            "queue_len": rng.integers(0, 30, n),
            "kv_util": rng.random(n),
        }
    ).sort_values(["at_s", "worker"], kind="stable", ignore_index=True)
    wide = grp.pivot_table(
        index="at_s", columns="worker", values=["queue_len", "kv_util"], aggfunc="last"
    )
    wide = wide.sort_index().ffill().fillna(0)
    at_q, queue = plots._pool_total(grp, "queue_len")
    at_k, kv = plots._pool_total(grp, "kv_util")
    assert np.array_equal(at_q, wide.index.to_numpy()) and np.array_equal(at_k, at_q)
    assert np.array_equal(queue, wide["queue_len"].sum(axis=1).to_numpy())
    np.testing.assert_allclose(kv, wide["kv_util"].sum(axis=1).to_numpy(), rtol=1e-12)
    for rows_per_block in (7, 1000, 5000):  # blocks split times and carry values over
        at_m, most = plots._pool_max(grp, "kv_util", rows_per_block)
        assert np.array_equal(at_m, at_q)
        assert np.array_equal(most, wide["kv_util"].max(axis=1).to_numpy())


def test_gap_cdf_is_the_weighted_cdf_at_every_gap_or_at_each_bin_edge(monkeypatch):
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.lognormal(-4, 0.5, 5000), [0.0, -1e-12]])
    weights = rng.integers(1, 9, len(values))
    dist = GapDistribution.from_pairs(values, weights)

    def exact_cdf(x: np.ndarray) -> np.ndarray:
        return np.array([weights[values <= v].sum() for v in x]) / weights.sum()

    x, cdf = plots._gap_cdf(dist)  # few gaps: one point per gap
    assert len(x) == len(values)
    assert np.array_equal(np.sort(values), np.sort(x)) and cdf[-1] == 1.0
    np.testing.assert_allclose(cdf, exact_cdf(x), rtol=1e-12)
    monkeypatch.setattr(plots, "MAX_CURVE_POINTS", 64)  # many gaps: 64 log bins
    x, cdf = plots._gap_cdf(dist)
    assert len(x) == 65 and x[0] == values[values > 0].min() and x[-1] == values.max()
    np.testing.assert_allclose(np.diff(np.log(x)), np.log(x[-1] / x[0]) / 64, rtol=1e-9)
    np.testing.assert_allclose(cdf, exact_cdf(x), rtol=1e-12)


def test_step_envelope_keeps_every_bins_range_and_levels(monkeypatch):
    rng = np.random.default_rng(6)
    x = np.sort(rng.uniform(0.0, 100.0, 50_000))
    y = np.cumsum(rng.normal(size=len(x)))
    kept_x, kept_y = plots._envelope(x, y)  # few points: drawn as they are
    assert kept_x is x and kept_y is y
    monkeypatch.setattr(plots, "MAX_STEP_POINTS", 1000)
    monkeypatch.setattr(plots, "STEP_BINS", 100)
    kept_x, kept_y = plots._envelope(x, y)
    rows = np.flatnonzero(np.isin(x, kept_x))
    assert len(rows) == len(kept_x) <= 400 and np.array_equal(y[rows], kept_y)
    assert rows[0] == 0 and rows[-1] == len(x) - 1
    bins = np.minimum((x - x[0]) * (100 / (x[-1] - x[0])), 99).astype(int)
    for b in range(100):  # each bin: its first and last points, its smallest and largest
        inside = np.flatnonzero(bins == b)
        mine = rows[bins[rows] == b]
        assert mine[0] == inside[0] and mine[-1] == inside[-1]
        assert y[mine].min() == y[inside].min() and y[mine].max() == y[inside].max()


def test_geometric_bin_is_the_binary_search():
    edges = np.geomspace(1e-4, 3.0, 20_001)
    near = np.concatenate([edges, np.nextafter(edges, 0.0), np.nextafter(edges, 10.0)])
    p = np.concatenate([near, np.random.default_rng(8).uniform(1e-4, 3.0, 100_000)])
    p = p[(p >= edges[0]) & (p <= edges[-1])]  # the gaps' range: smallest to largest
    assert np.array_equal(plots._geometric_bin(edges, p), np.searchsorted(edges, p, side="left"))
