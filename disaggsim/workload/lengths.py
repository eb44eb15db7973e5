"""Token-length sampling from the distributions in ``config.py`` (vectorised numpy).

Every sampler returns int64 values >= 1. Continuous draws are rounded to the nearest
integer (``np.rint``, halves to even) before clipping.
"""

from __future__ import annotations

import numpy as np

from disaggsim.config.bounds import MAX_TOKENS
from disaggsim.workload.config import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    LognormalLengths,
    UniformLengths,
)


def sample_lengths(dist: LengthDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` token counts from ``dist`` with ``rng``.

    Returns
    -------
    int64 array of length ``n``, every value >= 1.
    """
    match dist:
        case FixedLengths(value=value):
            return np.full(n, value, dtype=np.int64)
        case UniformLengths(low=low, high=high):
            return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
        case LognormalLengths(median=median, sigma=sigma, min=lo, max=hi):
            x = np.rint(median * np.exp(sigma * rng.standard_normal(n)))
            # Without max the config keeps the tail below MAX_TOKENS; the clip there only
            # guards the cast (an inf draw would become -2**63).
            return np.clip(x, lo, hi if hi is not None else MAX_TOKENS).astype(np.int64)
        case EmpiricalLengths(quantiles=points):
            return sample_empirical(points, n, rng)
    raise TypeError(f"unknown length distribution {dist!r}")


def sample_empirical(
    points: tuple[tuple[float, float], ...], n: int, rng: np.random.Generator
) -> np.ndarray:
    """Inverse-CDF sampling through ``[q, value]`` points (piecewise linear)."""
    q = np.array([p[0] for p in points], dtype=np.float64)
    v = np.array([p[1] for p in points], dtype=np.float64)
    x = np.rint(np.interp(rng.random(n), q, v))
    return np.maximum(x, 1).astype(np.int64)
