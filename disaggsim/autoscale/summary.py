"""Pure helpers for the engine's scaling records and summary keys.

The engine keeps, per pool, the instants at which its number of allocated workers
(starting + in service + draining: every worker holding GPUs) changed; these turn them
into ``mean_workers_<role>`` and ``gpu_hours`` (formulas in ``docs/autoscaling.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def time_average(at_s: Sequence[float], values: Sequence[float], end_s: float) -> float:
    """Time average over ``[at_s[0], end_s)`` of the step function that is ``values[i]``
    on ``[at_s[i], at_s[i + 1])`` (the last value until ``end_s``). ``at_s`` sorted."""
    t = np.asarray(at_s, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.size == 0 or t.size != v.size:
        raise ValueError("time_average needs equally long, non-empty at_s and values")
    if not end_s > t[0]:
        raise ValueError(f"end_s ({end_s}) must be after the first instant ({t[0]})")
    if np.any(np.diff(t) < 0):
        raise ValueError("at_s must be sorted")
    edges = np.minimum(np.append(t, end_s), end_s)
    return float(np.sum(v * np.diff(edges)) / (end_s - t[0]))


def gpu_hours(
    allocated_at_s: Sequence[float],
    released_at_s: Sequence[float],
    num_gpus: Sequence[int],
    end_s: float,
) -> float:
    """Σ num_gpus × (min(released, end_s) − allocated) / 3600 over workers; a worker not
    yet released (``inf``) counts until ``end_s``."""
    a = np.asarray(allocated_at_s, dtype=np.float64)
    r = np.minimum(np.asarray(released_at_s, dtype=np.float64), end_s)
    g = np.asarray(num_gpus, dtype=np.float64)
    return float(np.sum(g * np.maximum(r - a, 0.0)) / 3600.0)


def choose_to_drain(candidates: Sequence[tuple[int, float]], count: int) -> tuple[int, ...]:
    """Which ``count`` workers to drain from ``(worker_id, outstanding_tokens)``
    candidates (in service): least outstanding work first, ties to the highest id (the
    newest). Deterministic; no random draw."""
    order = sorted(candidates, key=lambda c: (c[1], -c[0]))
    return tuple(wid for wid, _ in order[: max(count, 0)])
