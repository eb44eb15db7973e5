"""Steady state: the one definition of "this rate meets the SLO" (docs/metrics.md).

A finite run of a rate above capacity can still meet the attainment target: the queue
has not yet grown long enough to push TTFTs past the SLO. So a rate **meets the SLO**
only when both hold over the measurement window ``[warmup_s, duration_s)``:

1. **attainment**: the share of measured requests meeting both SLOs is at least
   ``slo.attainment_target`` (``slo_attainment``, :mod:`disaggsim.metrics.summary`);
2. **stability**: neither the number of requests waiting for their first token nor
   the TTFT trends upward. The window is cut into :data:`NUM_BATCHES` equal batches; each signal's batch
   means are regressed on time by least squares, and the slope's one-sided t-test
   (``k − 2`` degrees of freedom) rejects "no upward trend" at ``alpha / m`` for each of
   the ``m`` signals tested (Bonferroni). If the batch means of a stationary system are
   independent and normal, each test rejects with probability exactly ``alpha / m``, so
   the chance of calling a stable run unstable is at most :data:`ALPHA`. A trend counts
   only where its slope shows an overload of at least :data:`MIN_OVERLOAD_SHARE` (near
   capacity a queue still filling after the warm-up rises more slowly).

The run length is chosen from the workload (:func:`horizon`): at least
``min_measured_requests`` measured requests and ``service_multiple`` times the longest
service time (:func:`service_time_s`), after a warm-up. :mod:`disaggsim.sweep.core`
bisects the rate with this rule and confirms the result with a run at least
``confirm_factor`` times as long.

This module is pure: numpy and scipy over the per-request frame, no simulation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from disaggsim.config.bounds import MAX_DURATION_S, MAX_REQUESTS, MAX_SERVICE_MULTIPLE
from disaggsim.costmodel.interface import WorkerCost, decode_step_time_s
from disaggsim.errors import UserError

__all__ = [
    "ALPHA",
    "NUM_BATCHES",
    "REQUESTS_HEADROOM",
    "Horizon",
    "RunLengthRule",
    "Stability",
    "TrendTest",
    "horizon",
    "count_batch_means",
    "meets_slo",
    "service_time_s",
    "slo_drain_s",
    "stability",
    "stationary_arrivals",
    "trend_test",
]

ALPHA = 0.01  # probability of calling a stationary run unstable (all signals together)
NUM_BATCHES = 10  # batch means per signal over the measurement window
# A significant trend must also matter: its fitted rise over the window is at least
# one more request waiting, or this share of the TTFT target.
MIN_WAITING_RISE = 1.0
MIN_TTFT_RISE_SHARE = 0.02
# ... and show an overload: a pool offered (1 + e) times the rate it serves grows its
# queue by e / (1 + e) of the arrival rate and each arrival's TTFT by e seconds per
# second. A trend counts only for an overload of at least this share; slower rises are
# a queue still filling after the warm-up near capacity (docs/metrics.md).
MIN_OVERLOAD_SHARE = 0.01
# A run shortened for MAX_REQUESTS expects at most this share of it: the requests
# generated scatter around the expectation (Poisson: 0.1 % at 2M; bursty gamma gaps and
# sessions' turns more), and generation refuses a run whose count passes the bound.
REQUESTS_HEADROOM = 0.9


# ------------------------------------------------------------------ the trend test


@dataclass(frozen=True, slots=True)
class TrendTest:
    """One signal's least-squares slope over the window's batch means.

    ``slope_per_s``: the signal's change per second of simulated time (requests per
    second for ``waiting``; seconds of TTFT per second of arrival time for ``ttft``).
    ``p_value``: one-sided, for "the slope is > 0", from Student's t with ``k − 2``
    degrees of freedom (``k`` batch means that have data)."""

    signal: str  # "waiting" | "ttft"
    slope_per_s: float
    t_stat: float
    p_value: float
    num_batches: int
    rise: float = float("nan")  # slope × the span of the batch centres


def trend_test(signal: str, centers_s: np.ndarray, means: np.ndarray) -> TrendTest:
    """The slope test for one signal (NaN means are dropped; fewer than 3 left: p = 1)."""
    ok = np.isfinite(means)
    x, y = np.asarray(centers_s, float)[ok], np.asarray(means, float)[ok]
    k = len(y)
    if k < 3:
        return TrendTest(signal, float("nan"), float("nan"), 1.0, k)
    from scipy.special import stdtr  # Student's t CDF (scipy.stats costs seconds to import)

    xc = x - x.mean()
    sxx = float((xc * xc).sum())
    slope = float((xc * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * xc
    s2 = float((resid * resid).sum()) / (k - 2)
    if s2 == 0.0:  # every mean on the line: an upward line is a trend, a flat one not
        t = math.inf if slope > 0 else 0.0
    else:
        t = slope / math.sqrt(s2 / sxx)
    p = float(stdtr(k - 2, -t)) if math.isfinite(t) else (0.0 if t > 0 else 1.0)
    return TrendTest(signal, slope, float(t), p, k, slope * float(x.max() - x.min()))


def count_batch_means(
    start_at_s: np.ndarray, end_at_s: np.ndarray, edges_s: np.ndarray
) -> np.ndarray:
    """Time-average number of intervals ``[start, end)`` open over each ``[edges[j],
    edges[j+1])`` (``end = inf``: never closed).

    One batch at a time in two reused buffers (memory linear in the intervals, not
    intervals × batches). Each batch's overlaps are added in interval order, one after
    another (``np.add.accumulate``), as numpy's ``sum(axis=0)`` of the intervals ×
    batches table added them: the same sums bit for bit."""
    a = np.asarray(start_at_s, float)
    e = np.asarray(end_at_s, float)
    edges_s = np.asarray(edges_s, float)
    total = np.zeros(len(edges_s) - 1)
    if len(a):
        overlap, lower = np.empty(len(a)), np.empty(len(a))
        for j in range(len(total)):
            np.minimum(e, edges_s[j + 1], out=overlap)
            np.maximum(a, edges_s[j], out=lower)
            np.subtract(overlap, lower, out=overlap)
            np.clip(overlap, 0.0, None, out=overlap)
            total[j] = np.add.accumulate(overlap, out=overlap)[-1]
    return total / np.diff(edges_s)


@dataclass(frozen=True, slots=True)
class Stability:
    """Whether the measurement window shows an upward trend (docs/metrics.md).

    ``p_value`` is the smallest p-value times the number of signals tested (Bonferroni,
    at most 1), over the signals whose fitted rise is material; the run is ``stable``
    when it is at least ``alpha``."""

    stable: bool
    p_value: float
    alpha: float
    tests: tuple[TrendTest, ...]

    def slope(self, signal: str) -> float:
        return next((t.slope_per_s for t in self.tests if t.signal == signal), float("nan"))


def stability(
    frame: pd.DataFrame,
    window_start_s: float,
    window_end_s: float,
    *,
    stationary: bool = True,
    client_timeout_s: float | None = None,
    ttft_target_s: float = 0.0,
    alpha: float = ALPHA,
    num_batches: int = NUM_BATCHES,
) -> Stability:
    """Trend tests over ``[window_start_s, window_end_s)`` of a run's request frame.

    Signals: ``waiting`` (time-average number of requests waiting for service, every
    request counted, measured or not: those that have arrived and not yet received a
    first token — the queues at the router and in front of prefill — and those whose
    first token came but that no decode batch has taken yet — the queue in front of the
    decode pool, where a disaggregated request waits after its prefill's first token),
    and ``ttft`` (mean TTFT of the requests arriving in each batch; a request that never
    got a first token counts with the time it waited until it was abandoned or the run
    ended, a lower bound; rejected requests are left out). Where the arrival rate varies
    by design (``stationary`` false: a rate schedule, a rate shape, a mix shift or a
    trace), the number waiting follows the offered load, so only the TTFT is tested. A
    trend counts when it is significant, its fitted rise over the window is at least
    :data:`MIN_WAITING_RISE` requests, or :data:`MIN_TTFT_RISE_SHARE` of
    ``ttft_target_s`` (so float noise on a deterministic run is no trend), and its slope
    shows an overload of at least :data:`MIN_OVERLOAD_SHARE` ``e``: the number waiting
    rising by ``e / (1 + e)`` of the rate that joins it (every request arriving in the
    window but those rejected at once, which never wait), the TTFT by ``e`` seconds per
    second (a slower rise is the queue still filling after the warm-up, measured near
    capacity: docs/metrics.md).

    Not a signal: the ITL statistic (TPOT or largest gap) by arrival batch. A request's
    is set by the decode batches over its whole reply, seconds long, so neighbouring
    batch means are correlated and the t-test's false-alarm rate is far above ``alpha``
    (a disaggregated 16-GPU long-prompt candidate at 0.3 and 0.6 of its analytic
    capacity, 12 seeds each: 2 of 24 runs at p < 1e-4 from that signal alone, every
    request meeting the SLO). A decode pool that falls behind shows in ``waiting``."""
    if not window_end_s > window_start_s:
        return Stability(True, 1.0, alpha, ())
    edges = np.linspace(window_start_s, window_end_s, num_batches + 1)
    centers = 0.5 * (edges[:-1] + edges[1:])
    arrival = frame["arrival_at_s"].to_numpy(float)
    status = frame["status"]  # masks compared on the column (no string per request)
    rejected = (status == "rejected").to_numpy(bool)
    abandoned = (status == "abandoned").to_numpy(bool)
    first = frame["first_token_at_s"].to_numpy(float)
    finish = frame["finish_at_s"].to_numpy(float)
    # waiting for a first token: until it came, or the request was rejected or gave up
    gave_up = arrival + (client_timeout_s if client_timeout_s is not None else 0.0)
    end = np.where(np.isfinite(first), first, np.inf)
    end = np.where(rejected, arrival, end)
    end = np.where(abandoned, gave_up, end)
    tests = []
    if stationary:
        waiting = count_batch_means(arrival, end, edges)
        if "decode_admit_at_s" in frame:
            # first token came, no decode batch yet: waiting in front of the decode pool
            # (a reply that needed no decode step, finished, waited for none)
            admit = frame["decode_admit_at_s"].to_numpy(float)
            since = np.isfinite(first)
            until = np.where(
                np.isfinite(admit), admit, np.where(np.isfinite(finish), first, np.inf)
            )
            if bool((since & (until > first)).any()):
                waiting = waiting + count_batch_means(first[since], until[since], edges)
        tests.append(trend_test("waiting", centers, waiting))
    # TTFT by arrival batch; no first token: waited until it gave up or the run ended
    last_event = float(np.nanmax(np.concatenate([finish, first, arrival]))) if len(frame) else 0.0
    waited = np.where(abandoned, gave_up, last_event) - arrival
    ttft = np.where(np.isfinite(first), first - arrival, waited)
    keep = ~rejected & (arrival >= window_start_s) & (arrival < window_end_s)
    batch = np.clip(np.searchsorted(edges, arrival[keep], side="right") - 1, 0, num_batches - 1)
    sums = np.bincount(batch, weights=ttft[keep], minlength=num_batches)
    counts = np.bincount(batch, minlength=num_batches)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    tests.append(trend_test("ttft", centers, means))
    floor = {"waiting": MIN_WAITING_RISE, "ttft": MIN_TTFT_RISE_SHARE * ttft_target_s}
    # the rate that joins the queue: arrivals in the window less those rejected at once
    rate_per_s = float(keep.sum()) / (window_end_s - window_start_s)
    e = MIN_OVERLOAD_SHARE
    min_slope = {"waiting": e / (1.0 + e) * rate_per_s, "ttft": e}
    material = [
        t.p_value
        for t in tests
        if t.rise >= floor[t.signal] and t.slope_per_s >= min_slope[t.signal]
    ]
    p = min(1.0, min(material, default=1.0) * len(tests))
    return Stability(bool(p >= alpha), p, alpha, tuple(tests))


def meets_slo(attainment: float, target: float, stable: bool) -> bool:
    """The one rule: attainment (NaN: no measured request, a miss) and stability."""
    return bool(attainment >= target) and bool(stable)


def stationary_arrivals(workload) -> bool:
    """True when the offered load is constant by design: a synthetic or preset workload
    at one ``rate_per_s`` with no rate schedule, rate shape or mix shift, a preset's
    arrivals other than ``modulated`` (which follow the trace's per-minute rate; a
    trace's rate varies with the trace)."""
    kind = getattr(workload, "kind", None)
    if kind == "preset":
        return workload.arrival != "modulated"
    if kind != "synthetic":
        return False
    return (
        workload.rate_schedule is None
        and workload.rate_shape is None
        and workload.mix_shift is None
    )


# ------------------------------------------------------------------ run length


@dataclass(frozen=True, slots=True)
class RunLengthRule:
    """How long a goodput run lasts, from the workload (docs/metrics.md).

    The measurement window holds at least ``min_measured_requests`` arrivals and lasts
    at least ``service_multiple`` longest service times; the warm-up before it is the
    larger of ``warmup_service_multiple`` service times and ``warmup_share`` of the
    window. A confirmation run's warm-up and window are ``confirm_factor`` times as long."""

    min_measured_requests: int = 1000
    service_multiple: float = 10.0
    warmup_service_multiple: float = 3.0
    warmup_share: float = 0.1
    confirm_factor: float = 2.0
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        """Each field checked alone: one line naming it, its allowed values and what was
        given (a notebook's bad rule, never a NaN that every comparison lets through)."""
        n = self.min_measured_requests
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            _refuse("min_measured_requests", "a whole number >= 1", n)
        for field, what, ok in (
            ("service_multiple", "a finite number > 0", lambda x: x > 0),
            ("warmup_service_multiple", "a finite number >= 0", lambda x: x >= 0),
            ("warmup_share", "a finite number >= 0", lambda x: x >= 0),
            ("confirm_factor", "a finite number >= 2 (twice the horizon)", lambda x: x >= 2),
            ("alpha", "a number strictly between 0 and 1", lambda x: 0 < x < 1),
        ):
            x = getattr(self, field)
            if not _finite_number(x) or not ok(float(x)):
                _refuse(field, what, x)

    def with_service_multiple(self, service_multiple: float) -> RunLengthRule:
        """This rule with its window lasting ``service_multiple`` longest service times and
        its warm-up no longer than that (a window shortened below the default warm-up's 3
        service times keeps a warm-up of its own length, not a longer one)."""
        return dataclasses.replace(
            self,
            service_multiple=service_multiple,
            warmup_service_multiple=min(self.warmup_service_multiple, service_multiple),
        )


def check_run_length_flags(min_requests: int | None, service_multiple: float | None) -> None:
    """``--min-requests`` / ``--service-multiple`` of compare and plan, before any run:
    1 <= N <= MAX_REQUESTS (the requests one run may hold) and 0 < M <=
    MAX_SERVICE_MULTIPLE, the ranges ``PlanOptions.with_run_length`` holds too (both from
    ``config/bounds.py``). An infinite multiple made every run's length NaN, reported as
    the scenario's sim.duration_s; a floor beyond the bound, or a multiple like 1e300,
    was shrunk to it: runs of 2,000,000 requests."""
    if min_requests is not None and not 1 <= min_requests <= MAX_REQUESTS:
        raise UserError(
            f"--min-requests {min_requests}: must be an integer >= 1 and at most "
            f"{MAX_REQUESTS:,} (the requests one run may hold, docs/safety.md)"
        )
    if service_multiple is not None and not 0 < service_multiple <= MAX_SERVICE_MULTIPLE:
        raise UserError(
            f"--service-multiple {service_multiple:g}: must be a number > 0 and at most "
            f"{MAX_SERVICE_MULTIPLE:g} (longest service times a run's window lasts, "
            "docs/safety.md)"
        )


def _finite_number(x: object) -> bool:
    return (
        isinstance(x, (int, float, np.integer, np.floating))
        and not isinstance(x, bool)
        and math.isfinite(float(x))
    )


def _refuse(field: str, allowed: str, given: object) -> None:
    raise UserError(f"RunLengthRule: {field} must be {allowed}, got {given!r}")


@dataclass(frozen=True, slots=True)
class Horizon:
    """One run's simulated times (seconds): arrivals in ``[0, warmup_s + measure_s)``,
    measured from ``warmup_s``, the run stopped at most ``drain_s`` after arrivals end.
    ``shrink`` < 1: a scenario bound (``bound``: ``MAX_DURATION_S`` or ``MAX_REQUESTS``)
    cut the rule's warm-up and window by that factor."""

    warmup_s: float
    measure_s: float
    drain_s: float
    shrink: float = 1.0
    bound: str | None = None

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.measure_s

    def overrides(self) -> list[str]:
        """The ``--set`` overrides that give a scenario this horizon."""
        return [
            f"sim.duration_s={_num(self.duration_s)}",
            f"sim.warmup_s={_num(self.warmup_s)}",
            f"sim.max_drain_s={_num(self.drain_s)}",
        ]


def _num(x: float) -> str:
    return repr(float(f"{x:.9g}"))


def horizon(
    rule: RunLengthRule,
    rate_per_s: float,
    service_s: float,
    drain_s: float,
    *,
    confirm: bool = False,
    expected_requests: Callable[[float], float] | None = None,
) -> Horizon:
    """The run length at ``rate_per_s`` for a workload whose longest service time is
    ``service_s``: window ``max(min_measured_requests / rate, service_multiple ×
    service_s)`` (× ``confirm_factor`` for a confirmation), warm-up ``max(
    warmup_service_multiple × service_s, warmup_share × window)``.

    Both shrink in proportion to fit the scenario bounds: at most MAX_DURATION_S of
    arrivals and, given ``expected_requests`` (the requests a run of that many seconds
    is expected to generate at this rate: :func:`disaggsim.config.bounds.
    expected_requests` of the workload, which counts a session's turns and tool calls),
    at most :data:`REQUESTS_HEADROOM` × MAX_REQUESTS of them. A run so shortened measures
    less than the rule asks (``Horizon.shrink``, ``Horizon.bound``): callers say so."""
    if not rate_per_s > 0:
        raise ValueError(f"horizon: rate must be > 0, got {rate_per_s}")
    measure = max(rule.min_measured_requests / rate_per_s, rule.service_multiple * service_s)
    warm = max(rule.warmup_service_multiple * service_s, rule.warmup_share * measure)
    scale = rule.confirm_factor if confirm else 1.0
    warm, measure = scale * warm, scale * measure
    shrink, bound = 1.0, None
    if warm + measure > MAX_DURATION_S:  # the scenario bound (30 days of arrivals)
        shrink, bound = MAX_DURATION_S / (warm + measure), "MAX_DURATION_S"
    if expected_requests is not None:
        cap = REQUESTS_HEADROOM * MAX_REQUESTS
        for _ in range(64):  # one step for a constant rate; a few where it varies
            n = expected_requests(shrink * (warm + measure))
            if not n > cap:
                break
            shrink, bound = shrink * cap / n if math.isfinite(n) else 0.5 * shrink, "MAX_REQUESTS"
    return Horizon(
        warmup_s=warm * shrink,
        measure_s=measure * shrink,
        drain_s=min(drain_s, MAX_DURATION_S),
        shrink=shrink,
        bound=bound,
    )


def service_time_s(
    costs: Mapping[str, WorkerCost], prompt_tokens: int, output_tokens: int
) -> float:
    """Longest service time: a ``prompt_tokens`` / ``output_tokens`` request served alone
    (its prefill, then ``output_tokens − 1`` decode steps at batch 1), on the pools of
    ``costs`` (``prefill``/``decode``, or ``colocated``). Callers pass the p99 lengths."""
    pre = costs.get("prefill") or costs["colocated"]
    dec = costs.get("decode") or costs["colocated"]
    p, o = int(prompt_tokens), int(output_tokens)
    prefill = pre.prefill_time_s(1, p, p * (p + 1) / 2.0)
    decode = max(o - 1, 0) * decode_step_time_s(dec, 1, p + o // 2)
    return float(prefill + decode)


def slo_drain_s(ttft_s: float, itl_s: float, max_output_tokens: int) -> float:
    """How long after arrivals end a run must go on so that no request that could still
    meet the SLO is cut: such a request ends within ``ttft + (output − 1) × itl`` of its
    arrival (every gap, and so the mean gap, is at most the ITL target)."""
    return float(ttft_s + max(int(max_output_tokens) - 1, 0) * itl_s)
