"""Arrival times: a unit-rate renewal process mapped through a rate schedule.

Every synthetic arrival process is built in two steps, so a time-varying rate plugs in
without a second code path:

1. a unit-rate renewal process (mean inter-arrival 1): exponential gaps for Poisson,
   gamma gaps with shape ``1/cv**2`` and scale ``cv**2`` for bursty traffic, or gaps
   drawn from a measured gap distribution (``empirical``: a preset's table of gap
   quantiles in units of the mean gap, sampled by linear interpolation of its inverse
   distribution function and divided by that function's own mean, so the mean is 1);
2. the time change ``t = Lambda^-1(u)``, where ``Lambda(t)`` is the cumulative expected
   number of arrivals of a piecewise-constant rate (a constant rate is a one-piece
   schedule, so ``t = u / rate``).

For Poisson this is the textbook inversion method for a non-homogeneous Poisson process.
The process starts fresh at 0 (the first arrival is one gap after 0).

Three schedules implement ``cumulative``/``invert``: :class:`RateSchedule` (piecewise
constant; ``rate_schedule`` and the ``step`` shape), :class:`DiurnalSchedule` (a
sinusoid, inverted exactly by bisection on its closed-form integral, not approximated by
pieces) and :class:`CyclicSchedule` (a preset's measured per-minute rate profile,
repeated, from a random phase: ``arrival: modulated``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """Piecewise-constant rate: ``rate_per_s[i]`` from ``start_s[i]`` until
    ``start_s[i + 1]``; the last rate lasts forever. ``start_s[0] == 0``."""

    start_s: tuple[float, ...]
    rate_per_s: tuple[float, ...]

    @classmethod
    def constant(cls, rate_per_s: float) -> RateSchedule:
        return cls(start_s=(0.0,), rate_per_s=(float(rate_per_s),))

    @classmethod
    def from_points(cls, points: tuple[tuple[float, float], ...]) -> RateSchedule:
        return cls(
            start_s=tuple(float(t) for t, _ in points),
            rate_per_s=tuple(float(r) for _, r in points),
        )

    def _knots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start = np.asarray(self.start_s, dtype=np.float64)
        rate = np.asarray(self.rate_per_s, dtype=np.float64)
        cumulative = np.concatenate(([0.0], np.cumsum(rate[:-1] * np.diff(start))))
        return start, rate, cumulative

    def cumulative(self, t_s: float) -> float:
        """Expected number of arrivals in ``[0, t_s)`` (``inf`` for an endless positive
        last rate and ``t_s = inf``)."""
        start, rate, cumulative = self._knots()
        i = int(np.searchsorted(start, t_s, side="right")) - 1
        if math.isinf(t_s):
            return math.inf if rate[-1] > 0 else float(cumulative[-1])
        return float(cumulative[i] + rate[i] * (t_s - start[i]))

    def invert(self, u: np.ndarray) -> np.ndarray:
        """Times ``t`` with ``cumulative(t) == u`` (the earliest such time; ``inf``
        past the end of a schedule whose last rate is 0)."""
        start, rate, cumulative = self._knots()
        # side="right" skips zero-rate pieces, whose cumulative value equals the next's.
        i = np.searchsorted(cumulative, u, side="right") - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            t = start[i] + (u - cumulative[i]) / rate[i]
        return np.where(rate[i] > 0, t, np.inf)


@dataclass(frozen=True, slots=True)
class DiurnalSchedule:
    """``rate(t) = mean_per_s * (1 + amplitude * cos(2 pi (t - phase_s) / period_s))``
    for ``t >= 0``; ``0 <= amplitude <= 1`` keeps it >= 0.

    Its integral from 0 is, with ``w = 2 pi / period_s``,
    ``Lambda(t) = mean_per_s * (t + amplitude / w * (sin(w (t - phase_s)) + sin(w phase_s)))``.
    """

    mean_per_s: float
    amplitude: float
    period_s: float
    phase_s: float = 0.0

    def rate_at(self, t_s: np.ndarray | float) -> np.ndarray:
        w = 2.0 * math.pi / self.period_s
        return self.mean_per_s * (
            1.0 + self.amplitude * np.cos(w * (np.asarray(t_s) - self.phase_s))
        )

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        w = 2.0 * math.pi / self.period_s
        wiggle = np.sin(w * (t - self.phase_s)) + math.sin(w * self.phase_s)
        return self.mean_per_s * (t + self.amplitude / w * wiggle)

    def cumulative(self, t_s: float) -> float:
        """Expected number of arrivals in ``[0, t_s)`` (``inf`` for ``t_s = inf``)."""
        if math.isinf(t_s):
            return math.inf
        return float(self._cumulative(np.asarray(t_s, dtype=np.float64)))

    def invert(self, u: np.ndarray) -> np.ndarray:
        """Times ``t`` with ``cumulative(t) == u``, to the last bit of a float64.

        ``Lambda`` is strictly increasing (the rate is zero at isolated instants at
        most) and within ``mean_per_s * amplitude * period_s / pi`` of
        ``mean_per_s * t``, which brackets the root; 80 bisection halvings shrink the
        bracket below one ulp.
        """
        u = np.asarray(u, dtype=np.float64)
        slack_s = self.amplitude * self.period_s / math.pi
        lo = np.maximum(u / self.mean_per_s - slack_s, 0.0)
        hi = u / self.mean_per_s + slack_s
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            below = self._cumulative(mid) < u
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return hi


@dataclass(frozen=True, slots=True)
class CyclicSchedule:
    """A measured rate profile repeated: ``rate_per_s * profile[k] / mean(profile)``
    during piece ``k`` of ``piece_s`` seconds, the profile started ``phase_s`` seconds
    into its cycle and repeated after its last piece. A preset's ``arrival: modulated``
    (its trace's per-minute arrival counts over their mean, from a random point of the
    hour); the mean rate over a whole cycle is exactly ``rate_per_s``. Pieces may be 0."""

    rate_per_s: float
    profile: tuple[float, ...]
    piece_s: float
    phase_s: float = 0.0

    def _pieces(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Multipliers of mean 1, the unit-rate integral at each piece start within a
        cycle, and the cycle length in seconds."""
        m = np.asarray(self.profile, dtype=np.float64)
        m = m / m.mean()
        return m, np.concatenate(([0.0], np.cumsum(m))) * self.piece_s, len(m) * self.piece_s

    def _integral(self, x: np.ndarray) -> np.ndarray:
        """``M(x)``: the integral of the unit-mean profile from 0 to ``x`` seconds."""
        m, knots, cycle_s = self._pieces()
        cycles = np.floor(x / cycle_s)
        rest = x - cycles * cycle_s
        k = np.minimum((rest // self.piece_s).astype(np.int64), len(m) - 1)
        return cycles * knots[-1] + knots[k] + m[k] * (rest - k * self.piece_s)

    def cumulative(self, t_s: float) -> float:
        """Expected number of arrivals in ``[0, t_s)`` (``inf`` for ``t_s = inf``)."""
        if math.isinf(t_s):
            return math.inf
        ends = self._integral(np.array([t_s + self.phase_s, self.phase_s], dtype=np.float64))
        return float(self.rate_per_s * (ends[0] - ends[1]))

    def invert(self, u: np.ndarray) -> np.ndarray:
        """Times ``t`` with ``cumulative(t) == u`` (zero pieces skipped, as
        :meth:`RateSchedule.invert` skips them)."""
        m, knots, cycle_s = self._pieces()
        start = float(self._integral(np.array([self.phase_s], dtype=np.float64))[0])
        y = np.asarray(u, dtype=np.float64) / self.rate_per_s + start
        cycles = np.floor(y / knots[-1])
        # below the cycle's end, so a trailing zero piece is never chosen
        rest = np.minimum(y - cycles * knots[-1], np.nextafter(knots[-1], 0.0))
        k = np.minimum(np.searchsorted(knots, rest, side="right") - 1, len(m) - 1)
        return cycles * cycle_s + k * self.piece_s + (rest - knots[k]) / m[k] - self.phase_s


Schedule = RateSchedule | DiurnalSchedule | CyclicSchedule
"""Anything with ``cumulative(t_s)`` and ``invert(u)`` as above."""


GapQuantiles = tuple[tuple[float, float], ...]
"""``((q, gap), ...)`` from q = 0 to q = 1: a gap distribution's quantiles."""


def unit_gap_table(gap_quantiles: GapQuantiles) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and gaps of ``gap_quantiles`` scaled so that the mean of the gap
    drawn by linear interpolation of the table (its trapezoid integral) is exactly 1."""
    qs = np.array([q for q, _ in gap_quantiles], dtype=np.float64)
    gaps = np.array([g for _, g in gap_quantiles], dtype=np.float64)
    if qs[0] != 0.0 or qs[-1] != 1.0 or np.any(np.diff(qs) <= 0) or np.any(np.diff(gaps) < 0):
        raise ValueError("gap quantiles need q rising from 0 to 1 and gaps that do not fall")
    mean = float(np.sum(np.diff(qs) * (gaps[1:] + gaps[:-1])) / 2.0)
    if not mean > 0.0:
        raise ValueError("gap quantiles need a positive mean gap")
    return qs, gaps / mean


def unit_renewal_times(
    rng: np.random.Generator,
    *,
    process: str,
    cv: float,
    limit: float,
    max_count: float,
    gap_quantiles: GapQuantiles | None = None,
) -> np.ndarray:
    """Event times of a unit-rate renewal process, those ``< limit``, at most
    ``max_count`` of them. ``limit`` or ``max_count`` must be finite. ``empirical``
    draws its gaps from ``gap_quantiles`` (:func:`unit_gap_table`).

    Gaps are drawn in vectorised chunks; the chunk sizes depend only on the arguments,
    so the result is a deterministic function of the generator state and arguments.
    """
    if math.isinf(limit) and math.isinf(max_count):
        raise ValueError("unit_renewal_times needs a finite limit or max_count")
    shape = 1.0
    if process == "gamma":
        shape = 1.0 / (cv * cv)
    elif process == "empirical":
        if gap_quantiles is None:
            raise ValueError("arrival process empirical needs gap quantiles")
        table_qs, table_gaps = unit_gap_table(gap_quantiles)
    elif process != "poisson":
        raise ValueError(f"unknown arrival process {process!r}")

    def gaps(n: int) -> np.ndarray:
        if process == "poisson":
            return rng.exponential(1.0, size=n)
        if process == "empirical":
            return np.interp(rng.random(n), table_qs, table_gaps)
        return rng.gamma(shape, 1.0 / shape, size=n)

    if math.isinf(limit):
        chunk = int(max_count)
    else:
        # Mean count is `limit`; a renewal count has sd ~ cv * sqrt(limit).
        chunk = int(limit + 6.0 * max(cv, 1.0) * math.sqrt(limit) + 16)
        if not math.isinf(max_count):
            chunk = min(chunk, int(max_count) + 1)
    chunk = max(chunk, 16)

    pieces: list[np.ndarray] = []
    count = 0
    last = 0.0
    while True:
        times = last + np.cumsum(gaps(chunk))
        pieces.append(times)
        count += chunk
        last = float(times[-1])
        if last >= limit or count >= max_count:
            break
    out = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    out = out[out < limit]
    if not math.isinf(max_count):
        out = out[: int(max_count)]
    return out


def arrival_times(
    rng: np.random.Generator,
    *,
    schedule: Schedule,
    process: str,
    cv: float,
    duration_s: float,
    max_count: float = math.inf,
    gap_quantiles: GapQuantiles | None = None,
) -> np.ndarray:
    """Sorted arrival times in ``[0, duration_s)``, at most ``max_count`` of them.

    Parameters
    ----------
    schedule : the arrival rate over time (requests per second).
    process : ``"poisson"``, ``"gamma"`` or ``"empirical"``.
    cv : coefficient of variation of the unit-rate gaps (gamma; for empirical only
        the size of the chunks drawn at once).
    gap_quantiles : the gap distribution of ``"empirical"``.
    duration_s : end of the arrival window (may be ``inf`` when ``max_count`` is finite).
    """
    limit = schedule.cumulative(duration_s)
    if math.isinf(limit) and math.isinf(max_count):
        raise ValueError("an endless arrival process needs num_requests or a finite duration")
    u = unit_renewal_times(
        rng,
        process=process,
        cv=cv,
        limit=limit,
        max_count=max_count,
        gap_quantiles=gap_quantiles,
    )
    t = schedule.invert(u)
    return t[t < duration_s]  # rounding in the inversion may land on the boundary
