"""The fleet's inter-token gap distribution (metrics/reconstruct.py): percentiles by radix
selection over the gaps' float keys, checked against the plain definition (sort every
gap, accumulate the weights) on distributions that force every path of the selection."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.metrics import reconstruct
from disaggsim.metrics.reconstruct import GapDistribution, weighted_percentile

QS = (0, 0.1, 1, 25, 50, 90, 99, 99.9, 100)


def _cases(rng: np.random.Generator):
    for _ in range(25):
        n = int(rng.integers(1, 3000))
        kind = rng.integers(0, 5)
        if kind == 0:  # decode-like: a few step times, many repeats
            values = rng.choice(rng.uniform(0.01, 0.05, 7), n)
        elif kind == 1:  # continuous, ties from rounding
            values = np.round(rng.exponential(0.03, n), int(rng.integers(3, 9)))
        elif kind == 2:  # negative and zero gaps (float noise), -0.0 among them
            values = rng.normal(0.0, 1e-9, n)
            values[rng.random(n) < 0.2] = -0.0
            values[rng.random(n) < 0.2] = 0.0
        elif kind == 3:  # a huge span of magnitudes
            values = 10.0 ** rng.uniform(-300, 300, n) * rng.choice([-1.0, 1.0], n)
        else:  # all equal
            values = np.full(n, 0.02)
        weights = rng.integers(0, 40, n)
        if not (weights > 0).any():
            weights[0] = 1
        yield values, weights


@pytest.mark.parametrize("range_bits, sort_at_most", [(20, 1 << 16), (2, 3), (5, 0)])
def test_percentiles_equal_the_sorted_weighted_definition(monkeypatch, range_bits, sort_at_most):
    """With the module's sizes, and with tiny ones that make the selection count key
    ranges level after level (every level a few ranges; candidates sorted only once
    three or fewer, or never)."""
    monkeypatch.setattr(reconstruct, "_RANGE_BITS", range_bits)
    monkeypatch.setattr(reconstruct, "_SORT_AT_MOST", sort_at_most)
    monkeypatch.setattr(reconstruct, "_CHUNK", 97)  # passes in several chunks
    rng = np.random.default_rng(11)
    for values, weights in _cases(rng):
        dist = GapDistribution.from_pairs(values, weights)
        expected = [weighted_percentile(values + 0.0, weights, q) for q in QS]
        got = dist.percentiles(QS)
        assert np.array_equal(np.array(got), np.array(expected))
        assert [dist.percentile(q) for q in QS] == got
        assert dist.count == int(weights.sum())
        assert dist.max_s() == values[weights > 0].max()


def test_non_finite_and_weightless_gaps_are_left_out():
    values = np.array([0.03, np.nan, np.inf, 0.01, 0.02, 5.0])
    weights = np.array([1, 4, 4, 2, 1, 0])
    dist = GapDistribution.from_pairs(values, weights)
    assert dist.count == 4
    assert dist.max_s() == 0.03
    # sorted: 0.01 (w 2), 0.02 (w 1), 0.03 (w 1); cumulative 2, 3, 4 of 4
    assert dist.percentiles((0, 50, 51, 75, 76, 100)) == [0.01, 0.01, 0.02, 0.02, 0.03, 0.03]
    empty = GapDistribution.from_pairs(np.array([np.nan]), np.array([3]))
    assert np.isnan(empty.percentile(50)) and np.isnan(empty.max_s()) and empty.count == 0
