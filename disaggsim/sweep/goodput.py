"""Steady-state goodput: the highest rate that meets the SLO, found by simulation.

"Meets the SLO" is :func:`disaggsim.metrics.steady.meets_slo` (attainment over the
measurement window after warm-up **and** no upward trend in the number of requests in
the system or in TTFT); each run's length comes from the workload
(:func:`disaggsim.metrics.steady.horizon`), never from the scenario's ``sim`` section.

The search (:class:`RateSearch`, a small state machine so many scenarios advance side
by side, each sending its next runs as soon as its last are back, those of the search
with the most work left first, and a pure function of rate can drive it in tests):

1. **bracket**: evaluate ``rate_lo`` and ``rate_hi``; while ``rate_hi`` meets, double it;
   while ``rate_lo`` misses, divide it by 4 (at most :data:`MAX_WIDEN_DOWN` times, and not
   below :data:`IDLE_CONCURRENCY` / the longest service time, where the system is all but
   idle: then the SLO is *unattainable*, goodput 0, at every rate down to the last one
   tried). A goodput is never reported from a range that did not bracket it;
2. **bisect** until the meeting and the missing rate are at most ``tol`` apart;
3. **confirm**: run the found rate with a measurement window ``confirm_factor`` (>= 2)
   times as long. If it misses, step down at that length (by 2 × tol, at least 1 % of the
   rate, doubling; never below a quarter of the last rate that missed) until a rate meets,
   then bisect between the two at that length; the result is that rate (status
   ``refined``). After :data:`MAX_REFINE_STEPS` misses, or where the next step is below
   ``min_rate_per_s``, the SLO is *unattainable* down to the last rate run.

**Retest** (every phase): a rate whose runs met the attainment target but failed the
trend test with ``alpha² <= p < alpha`` is simulated once more, at the confirmation
length (``confirm_factor`` times the warm-up and window; a confirmation run's retest has
its own length) with fresh seeds (``seed + seeds + k``), and that run decides. The trend
test rejects a stationary run with probability ``alpha``, and a search makes tens of runs
(a plan hundreds): a lone false alarm at a bracket's ``rate_lo`` divided it by 4 and
capped the goodput there. Now a stationary run misses on the trend test with probability
about ``2 alpha²`` (``p < alpha²``, or two independent rejections); a run above capacity,
whose queue grows, is rejected again by the longer run (or misses the attainment target
in it), and far above capacity its ``p`` is below ``alpha²`` at once (no retest).

**Early stop** (every phase, with ``stop_early``, the default): each run ends as soon as
it certainly misses (:mod:`disaggsim.metrics.early_stop`: so many measured requests have
provably missed that the attainment is below the target whatever the rest do; over
``seeds`` runs, below :func:`~disaggsim.metrics.early_stop.seeds_stop_below`, so that one
seed's stop puts the mean below the target). A stopped run's verdict is the full run's,
a miss, so the search takes the same steps and finds the same goodput with fewer
simulated requests; its evaluation says so (``Evaluation.num_stopped_early``, attainment
NaN: not measured) and is never retested (its attainment is not met).

**Bounds**: every run stays within the scenario bounds (docs/safety.md): its warm-up and
window shrink in proportion where the rule's length would pass MAX_DURATION_S of arrivals
or expect more than 90 % of MAX_REQUESTS requests (the bound's own count,
:func:`~disaggsim.config.bounds.expected_requests`: a sessions workload's rate is of
session starts, each several requests), as at the top of a huge fleet's bracket; the
run then measures fewer service times than the rule asks, and the result says so
(``Evaluation.window_shrink``, :attr:`GoodputResult.notes`).

Definitions and the math: docs/metrics.md ("Steady-state goodput"); CLI: docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from disaggsim.config.bounds import (
    MAX_DURATION_S,
    MAX_NUMBER,
    MAX_REQUESTS,
    expected_requests,
    fmt,
)
from disaggsim.config.loader import LoadedScenario, load_scenario, plain_number
from disaggsim.config.scenario import Scenario
from disaggsim.errors import (
    InvariantError,
    UserError,
    check_callable,
    check_switch,
    command_line_running,
)
from disaggsim.metrics.early_stop import seeds_stop_below
from disaggsim.metrics.steady import (
    REQUESTS_HEADROOM,
    Horizon,
    RunLengthRule,
    horizon,
    service_time_s,
    slo_drain_s,
)
from disaggsim.metrics.summary_table import Summary
from disaggsim.sweep.core import (
    RATE_PATH,
    PointTask,
    ProgressFn,
    Source,
    _task,
    as_source,
    check_seeds,
    refuse_fixed_time_events,
    run_point,
)
from disaggsim.sweep.executors import Executor, check_executor, drive, given_or_default
from disaggsim.sweep.grid import Param, check_params, override_text

__all__ = [
    "MAX_WIDEN_DOWN",
    "MAX_WIDEN_UP",
    "SEED_SPREAD",
    "Evaluation",
    "GoodputResult",
    "RateSearch",
    "SteadyProfile",
    "goodput",
    "goodput_many",
    "search_rate",
    "steady_profile",
]

MAX_WIDEN_UP = 16  # rate_hi doublings before giving up (status "unbounded")
MAX_WIDEN_DOWN = 5  # rate_lo quarterings before the SLO is called unattainable
DOWN_FACTOR = 4.0  # the bracket widens down by it; a step-down goes no lower than 1 / it
MAX_REFINE_STEPS = 8  # step-downs after a failed confirmation
# the first step down after a failed confirmation is at least this share of the rate
# (1 % doubling 8 times sums to 255 %: the step-down reaches 0 within its steps)
STEP_FLOOR_FRACTION = 0.01
# Below this many requests in service on average (rate x longest service time) a run is
# all but idle: requests meet no queue, so missing the SLO there means missing it at any
# rate, and the bracket stops widening down.
IDLE_CONCURRENCY = 0.05
DEFAULT_TOL_FRACTION = 0.01
# one sd of the seed spread of a ratio of two one-seed full-accuracy goodputs, the widest
# measured (ci/colocated-vllm's 6.2 % x sqrt 2; docs/sweeps.md "How much a goodput
# moves"); a mean over N seeds: this over sqrt(N). The planner quotes a margin nearer its
# line than that as a close call (plan/advisor.py), compare a ratio that near the best
SEED_SPREAD = 0.09
# a goodput whose search stopped at a tolerance above this share of it is coarse, and its
# notes say so (GoodputResult.coarse_note): the default tolerance is a share of the
# range's top, so a range far above the goodput (goodput(s, 1, 1e12)) stops at once
COARSE_TOL_SHARE = 0.1
MAX_SAMPLE_REQUESTS = 4000


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One rate, simulated (``seeds`` runs): mean attainment, stability, the verdict."""

    rate_per_s: float
    attainment: float  # mean over seeds (NaN: no measured request)
    stable: bool  # every seed stable at alpha / seeds (Bonferroni)
    meets: bool  # attainment >= target and stable; else, when retested, the retest's
    duration_s: float  # arrivals window of the run (warm-up + measurement)
    confirm: bool = False  # a confirmation-length run
    # the first seed's run summary (None when evaluated without simulating)
    summary: Summary | None = field(default=None, compare=False, repr=False)
    # attainment met but trend test failed: the run at the confirmation length with
    # fresh seeds that decided ``meets`` (module docstring, "Retest")
    retest: Evaluation | None = None
    # the trend test's p-value, Bonferroni over the seeds (NaN: evaluated without one,
    # or a run stopped early)
    p_value: float = float("nan")
    # runs of the seeds that ended early as certain misses (module docstring, "Early
    # stop"): then ``meets`` is false, ``attainment`` NaN and the trend untested
    num_stopped_early: int = 0
    num_runs: int = 1  # the seeds' runs behind it
    # < 1: a scenario bound (``window_bound``: MAX_REQUESTS, MAX_DURATION_S) cut the
    # run-length rule's warm-up and window by this factor (module docstring, "Bounds")
    window_shrink: float = 1.0
    window_bound: str | None = None


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """Steady-state goodput of one scenario.

    ``status``: ``found`` (bisected and confirmed by the long run), ``refined`` (the
    first confirmation missed; ``rate_per_s`` is the highest rate that met at the
    confirmation length), ``unattainable`` (missed at every rate down to
    ``unattainable_below_per_s``: goodput 0), ``unbounded`` (still met at the largest
    rate tried: NaN) or ``below`` (a screened search whose first rate,
    ``below_per_s``, missed: the goodput is below it, not measured; NaN).
    ``confirmation`` is the long run that backs the result."""

    scenario: str
    num_gpus: int
    rate_per_s: float
    per_gpu_per_s: float
    status: str
    attainment_target: float
    tol_per_s: float
    evaluations: tuple[Evaluation, ...]
    confirmation: Evaluation | None = None
    unattainable_below_per_s: float | None = None
    service_s: float = float("nan")  # the longest service time the horizon used
    below_per_s: float | None = None  # status "below": the screen's rate, missed
    # runs that measured no request at their length and were run again, longer
    num_lengthened: int = 0

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None and self.confirmation.meets

    @property
    def num_retests(self) -> int:
        """Evaluations decided by a retest (a trend-only miss run again)."""
        return sum(e.retest is not None for e in self.evaluations)

    @property
    def num_runs(self) -> int:
        """Simulations of the search, retests included (each evaluation's seeds)."""
        return sum(
            (e.num_runs) + (e.retest.num_runs if e.retest is not None else 0)
            for e in self.evaluations
        )

    @property
    def num_stopped_early(self) -> int:
        """Runs of the search (retests included) that ended early as certain misses."""
        return sum(
            e.num_stopped_early + (e.retest.num_stopped_early if e.retest is not None else 0)
            for e in self.evaluations
        )

    @property
    def shortened(self) -> tuple[Evaluation, ...]:
        """Runs of the search (retests included) that a scenario bound cut short of the
        run-length rule (module docstring, "Bounds")."""
        out = []
        for e in self.evaluations:
            out += [x for x in (e, e.retest) if x is not None and x.window_shrink < 1.0]
        return tuple(out)

    @property
    def coarse_note(self) -> str | None:
        """What a goodput known only to within more than :data:`COARSE_TOL_SHARE` of itself
        is: the tolerance is a share of the search range's top (1 %, docs/sweeps.md), so
        a range far above the goodput stops at once (``goodput(s, 1, 1e12)`` reported
        "found 1 req/s" with a tolerance of 1e10 req/s and said nothing). None otherwise."""
        rate = self.rate_per_s
        if self.status not in ("found", "refined") or not self.tol_per_s > COARSE_TOL_SHARE * rate:
            return None
        missed = min(
            (e.rate_per_s for e in self.evaluations if not e.meets and e.rate_per_s > rate),
            default=math.nan,
        )
        tol = "--tol" if command_line_running() else "tol_per_s"
        return (
            f"goodput {rate:.4g} req/s is known only to within {self.tol_per_s:.3g} req/s, the "
            f"search's tolerance ({tol}, by default 1 % of its range's top): it met at "
            f"{rate:.4g} req/s and missed at {missed:.4g} req/s; give a smaller {tol} or a range "
            "whose top is nearer the goodput for a finer answer"
        )

    @property
    def notes(self) -> tuple[str, ...]:
        """What a reader of the goodput should know that its number does not say: runs
        shortened to fit a scenario bound (module docstring, "Bounds"), a coarse
        tolerance (:attr:`coarse_note`)."""
        out = []
        short = self.shortened
        if short:
            bounds = sorted({str(e.window_bound) for e in short})
            what = {
                "MAX_REQUESTS": f"MAX_REQUESTS, {fmt(MAX_REQUESTS)} requests per run",
                "MAX_DURATION_S": "MAX_DURATION_S, 30 days of arrivals",
            }
            lo = min(e.window_shrink for e in short)
            hi = max(e.window_shrink for e in short)
            share = f"{lo:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g}"
            runs = sum(e.num_runs for e in short)
            out.append(
                f"{runs} of {self.num_runs} runs shortened to fit "
                + " and ".join(what.get(b, b) for b in bounds)
                + f" (docs/safety.md): warm-up and window {share} of the run-length rule's, "
                "so those runs measured fewer service times than the rule asks"
            )
        if self.num_lengthened:
            out.append(
                f"{self.num_lengthened} runs measured no request at their length (arrivals "
                "in bursts, or a rate so low that none arrived in the window) and were run "
                "again with their warm-up and window doubled until they did"
            )
        coarse = self.coarse_note
        if coarse is not None:
            out.append(coarse)
        return tuple(out)

    @property
    def search_duration_s(self) -> float:
        """Arrivals window of the bisection's run at the goodput rate (NaN if none)."""
        for e in self.evaluations:
            if not e.confirm and e.rate_per_s == self.rate_per_s:
                return e.duration_s
        return float("nan")


def check_search_args(
    bracket: tuple[float, float] | None,
    tol_per_s: float | None,
    tol_fraction: float,
    *,
    bisected: bool = False,
    confirm: bool = True,
    error: type[Exception] = UserError,
) -> None:
    """Raise ``error`` (one line) unless the starting ``bracket`` ``(rate_lo, rate_hi)``
    has ``0 < rate_lo < rate_hi`` (finite; None: not checked), the tolerances are
    positive and a bisected bracket is confirmed. :func:`goodput`,
    :func:`goodput_many` and :func:`search_rate` check their callers' values as bad input
    (:class:`UserError`, exit code 2); :class:`RateSearch` checks again as an internal
    error (:class:`InvariantError`, exit code 3): what reaches it unchecked was built
    inside disaggsim (a planner's bracket; docs/safety.md, "Exit codes")."""
    for name, value in (("rate_lo", None if bracket is None else bracket[0]),
                        ("rate_hi", None if bracket is None else bracket[1]),
                        ("tolerance", tol_per_s)):  # fmt: skip
        # a string compared with a number was a TypeError traceback
        if value is not None and (not isinstance(value, numbers.Real) or isinstance(value, bool)):
            raise error(f"goodput: {name} must be a number (req/s), got {value!r}")
    if bracket is not None:
        rate_lo, rate_hi = bracket
        if not (0 < rate_lo < rate_hi) or not math.isfinite(rate_hi):
            raise error(f"goodput: need 0 < rate_lo < rate_hi, got {rate_lo} and {rate_hi}")
        if rate_hi > MAX_NUMBER:  # written into a scenario: refused after the first runs
            raise error(
                f"goodput: rate_hi must be at most {MAX_NUMBER:g} req/s, the largest number a "
                f"scenario may hold (docs/safety.md), got {rate_hi:g}"
            )
    if tol_per_s is not None and not (tol_per_s > 0 and math.isfinite(tol_per_s)):
        raise error(f"goodput: tolerance must be a finite number > 0 req/s, got {tol_per_s}")
    if not 0 < tol_fraction < 1:
        raise error(f"goodput: tolerance fraction must be in (0, 1), got {tol_fraction}")
    if bisected and not confirm:
        raise error("goodput: a bisected bracket needs the confirmation run")


class RateSearch:
    """Bracket, bisect and confirm the rate at which a scenario stops meeting the SLO.

    Drive it with :meth:`next_points` (``(rate, confirm_length)`` pairs to evaluate) and
    :meth:`record` (their :class:`Evaluation`, in the same order) until ``status`` is set.
    ``tol_per_s`` defaults to ``tol_fraction`` of the bracket's upper end once it is
    bracketed. Assumes meeting is monotone in rate; where noise breaks that near the
    threshold the result is still a rate that met next to one, at most ``tol`` above,
    that did not. The bracket does not widen below ``min_rate_per_s`` (a rate at which the
    system is all but idle: missing there, the SLO is unattainable at any rate).
    ``bisected``: ``rate_lo`` met and ``rate_hi`` missed already (e.g. in a search with
    shorter runs): go straight to the confirmation of ``rate_lo``. ``screen``: the
    question is first whether the goodput reaches ``rate_lo`` (a planner's "can this
    neighbour beat its family's best?"): ``rate_lo`` is evaluated alone, and if it misses
    the search ends there, status ``below`` (the goodput is below ``rate_lo``, not
    measured further); if it meets, the search goes on as without the screen.
    ``rate_digits``: with ``bisected``, every rate the confirmation and the step-down
    give is rounded to that many significant digits (a planner's check of a scenario
    as written: the rate it writes, so rounded, is the rate that was run)."""

    def __init__(
        self,
        rate_lo: float,
        rate_hi: float,
        *,
        tol_per_s: float | None = None,
        tol_fraction: float = DEFAULT_TOL_FRACTION,
        confirm: bool = True,
        min_rate_per_s: float = 0.0,
        bisected: bool = False,
        screen: bool = False,
        rate_digits: int | None = None,
    ) -> None:
        # the public entry points check their callers' values as bad input; a value
        # that breaks these here was built inside disaggsim (a planner's bracket)
        check_search_args(
            (rate_lo, rate_hi),
            tol_per_s,
            tol_fraction,
            bisected=bisected,
            confirm=confirm,
            error=InvariantError,
        )
        self.lo, self.hi = float(rate_lo), float(rate_hi)
        self.tol = float(tol_per_s) if tol_per_s is not None else None
        self.tol_fraction = tol_fraction
        self.confirm = confirm
        self.min_rate = float(min_rate_per_s)
        self.evaluations: list[Evaluation] = []
        self.status: str | None = None
        self.phase = "bracket"
        self._lo_ok: bool | None = None
        self._hi_ok: bool | None = None
        self._up = self._down = 0
        self.confirmation: Evaluation | None = None
        self.unattainable_below: float | None = None
        self.screen = screen and not bisected
        self.below: float | None = None  # status "below": the screen's rate, missed
        # at the confirmation length: highest rate that met, lowest that missed
        self._long_lo: float | None = None
        self._long_hi = math.nan
        self._step = math.nan
        self._steps = 0
        self.rate_digits = rate_digits if bisected else None
        if bisected:  # [lo, hi] met and missed already (a shorter search): confirm lo
            self.lo = self._rounded(self.lo)
            self._lo_ok, self._hi_ok = True, False
            if self.tol is None:
                self.tol = self.tol_fraction * self.hi
            self.phase = "confirm"

    # -------------------------------------------------------------- driving

    def next_points(self) -> list[tuple[float, bool]]:
        if self.status is not None:
            return []
        if self.phase == "bracket":
            pts = []
            if self._lo_ok is None:
                pts.append((self.lo, False))
                if self.screen:  # the screen alone: it may end the search
                    return pts
            if self._hi_ok is None:
                pts.append((self.hi, False))
            return pts
        if self.phase == "bisect":
            return [(0.5 * (self.lo + self.hi), False)]
        if self.phase == "confirm":
            return [(self.lo, True)]
        if self.phase == "step_down":
            return [(self._probe(), True)]
        assert self.phase == "long_bisect" and self._long_lo is not None
        return [(self._rounded(0.5 * (self._long_lo + self._long_hi)), True)]

    def record(self, results: Sequence[Evaluation]) -> None:
        """Results for exactly the points :meth:`next_points` returned, in that order."""
        self.evaluations.extend(results)
        if self.phase == "bracket":
            for e in results:
                if e.rate_per_s == self.lo:
                    self._lo_ok = e.meets
                elif e.rate_per_s == self.hi:
                    self._hi_ok = e.meets
            self._after_bracket()
        elif self.phase == "bisect":
            (e,) = results
            if e.meets:
                self.lo = e.rate_per_s
            else:
                self.hi = e.rate_per_s
            self._after_bisect()
        elif self.phase == "confirm":
            (e,) = results
            self.confirmation = e
            if e.meets:
                self.status = "found"
            else:
                self._long_hi = e.rate_per_s
                # at least STEP_FLOOR_FRACTION of the rate: MAX_REFINE_STEPS doublings from
                # it reach 0, so "unattainable" means missed down to zero; from 2 x a tiny
                # tolerance they covered 510 x tol (tol 1e-12 req/s: goodput 0 reported
                # where 6.6 req/s met at the confirmation length)
                self._step = max(2.0 * self._tol(), STEP_FLOOR_FRACTION * e.rate_per_s)
                self.phase = "step_down"
                if self._probe() < self.min_rate:  # all but idle below it (as the bracket)
                    self.status = "unattainable"
                    self.unattainable_below = e.rate_per_s
        elif self.phase == "step_down":
            (e,) = results
            if e.meets:
                self._long_lo = e.rate_per_s
                self.confirmation = e
                self.phase = "long_bisect"
                self._after_long_bisect()
            else:
                self._long_hi = e.rate_per_s
                self._steps += 1
                self._step *= 2.0
                if self._steps >= MAX_REFINE_STEPS or self._probe() < self.min_rate:
                    self.status = "unattainable"
                    self.unattainable_below = e.rate_per_s
        else:
            (e,) = results
            if e.meets:
                self._long_lo = e.rate_per_s
                self.confirmation = e
            else:
                self._long_hi = e.rate_per_s
            self._after_long_bisect()

    def _tol(self) -> float:
        return self.tol if self.tol is not None else self.tol_fraction * self.hi

    def steps_left(self) -> tuple[int, int]:
        """The steps expected after the points :meth:`next_points` gives now, as
        ``(short, long)`` (long: at the confirmation length), if the bracket holds and
        the confirmation meets: the bisection's halvings to the tolerance, then the
        confirmation (an estimate to rank searches by the work they have left)."""
        if self.status is not None or self.phase not in ("bracket", "bisect"):
            return 0, 0
        halvings = math.ceil(math.log2(max((self.hi - self.lo) / self._tol(), 1.0)))
        if self.phase == "bisect":  # the midpoint given now is the first of them
            halvings = max(halvings - 1, 0)
        return halvings, int(self.confirm)

    def _probe(self) -> float:
        """The next rate of the step-down: ``step`` below the last miss, but never below a
        quarter of it (as the bracket widens down): a step as wide as the rate (a tolerance
        wider than the goodput) would otherwise run a rate of zero or less."""
        return self._rounded(max(self._long_hi - self._step, self._long_hi / DOWN_FACTOR))

    def _rounded(self, rate: float) -> float:
        if self.rate_digits is None or not rate > 0:
            return rate
        return float(f"{rate:.{self.rate_digits}g}")

    def _after_bracket(self) -> None:
        if self.screen and self._lo_ok is not None:
            self.screen = False
            if not self._lo_ok:
                self.status = "below"
                self.below = self.lo
                return
        if self._lo_ok is False:
            if self._down >= MAX_WIDEN_DOWN or self.lo / DOWN_FACTOR < self.min_rate:
                self.status = "unattainable"
                self.unattainable_below = self.lo
                return
            self.hi, self._hi_ok = self.lo, False
            self.lo, self._lo_ok = self.lo / DOWN_FACTOR, None
            self._down += 1
            return
        if self._hi_ok is True:
            if self._up >= MAX_WIDEN_UP:
                self.status = "unbounded"
                return
            self.lo, self._lo_ok = self.hi, True
            self.hi, self._hi_ok = 2.0 * self.hi, None
            self._up += 1
            return
        if self._lo_ok and self._hi_ok is False:
            if self.tol is None:
                self.tol = self.tol_fraction * self.hi
            self.phase = "bisect"
            self._after_bisect()

    def _after_bisect(self) -> None:
        # or no rate lies between the two (a tolerance below the floats' resolution there)
        if self.hi - self.lo <= self._tol() or 0.5 * (self.lo + self.hi) in (self.lo, self.hi):
            if self.confirm:
                self.phase = "confirm"
            else:
                self.status = "found"

    def _after_long_bisect(self) -> None:
        assert self._long_lo is not None
        mid = self._rounded(0.5 * (self._long_lo + self._long_hi))
        if self._long_hi - self._long_lo <= self._tol() or mid in (self._long_lo, self._long_hi):
            self.status = "refined"

    # -------------------------------------------------------------- result

    @property
    def rate_per_s(self) -> float:
        if self.status == "found":
            return self.lo
        if self.status == "refined":
            assert self._long_lo is not None
            return self._long_lo
        if self.status == "unattainable":
            return 0.0
        return float("nan")


def search_rate(
    evaluate: Callable[[float, bool], tuple[float, bool]],
    rate_lo: float,
    rate_hi: float,
    target: float,
    *,
    tol_per_s: float | None = None,
    tol_fraction: float = DEFAULT_TOL_FRACTION,
    confirm: bool = True,
    min_rate_per_s: float = 0.0,
    retest: bool = False,
    bisected: bool = False,
    screen: bool = False,
    rate_digits: int | None = None,
) -> RateSearch:
    """Run :class:`RateSearch` against ``evaluate(rate, confirm_length) -> (attainment,
    stable)`` (tests, analytic models). ``retest``: a trend-only miss is decided by
    ``evaluate(rate, True)``, called once more (as :func:`goodput_many` does; off by
    default: a function without noise answers the same)."""
    check_search_args(
        (rate_lo, rate_hi), tol_per_s, tol_fraction, bisected=bisected, confirm=confirm
    )
    s = RateSearch(
        rate_lo,
        rate_hi,
        tol_per_s=tol_per_s,
        tol_fraction=tol_fraction,
        confirm=confirm,
        min_rate_per_s=min_rate_per_s,
        bisected=bisected,
        screen=screen,
        rate_digits=rate_digits,
    )
    while pts := s.next_points():
        out = []
        for rate, long in pts:
            att, stable = evaluate(rate, long)
            e = Evaluation(rate, att, stable, bool(att >= target) and stable, 0.0, long)
            if retest and not stable and att >= target:
                att2, stable2 = evaluate(rate, True)
                again = Evaluation(rate, att2, stable2, bool(att2 >= target) and stable2, 0.0, True)
                e = dataclasses.replace(e, meets=again.meets, retest=again)
            out.append(e)
        s.record(out)
    return s


# ------------------------------------------------------------------ run lengths


@dataclass(frozen=True, slots=True)
class SteadyProfile:
    """What the run-length rule needs from a scenario: its longest service time (a p99
    prompt and a p99 output served alone) and the drain that no SLO-meeting request
    outlasts (the largest output at the ITL target after the TTFT target)."""

    service_s: float
    drain_s: float
    prompt_tokens_p99: int
    output_tokens_p99: int
    output_tokens_max: int
    prompt_tokens_mean: float = math.nan


def steady_profile(loaded: LoadedScenario, label: str = "<scenario>") -> SteadyProfile:
    from disaggsim import run  # module attribute: tests patch run.build_costs

    s = loaded.scenario
    reqs = run.make_requests(loaded)
    if len(reqs) == 0:
        raise UserError(f"{label}: the workload produces no requests (raise the rate or duration)")
    n = min(len(reqs), MAX_SAMPLE_REQUESTS)
    prompts = np.asarray(reqs.prompt_tokens[:n], dtype=np.int64)
    outputs = np.asarray(reqs.output_tokens[:n], dtype=np.int64)
    p99 = int(np.percentile(prompts, 99, method="inverted_cdf"))
    o99 = int(np.percentile(outputs, 99, method="inverted_cdf"))
    o_max = int(outputs.max())
    costs = run.build_costs(s, label)
    return SteadyProfile(
        service_s=service_time_s(costs, p99, o99),
        drain_s=slo_drain_s(s.slo.ttft_s, s.slo.itl_s, o_max),
        prompt_tokens_p99=p99,
        output_tokens_p99=o99,
        output_tokens_max=o_max,
        prompt_tokens_mean=float(prompts.mean()),
    )


# ------------------------------------------------------------------ driver

# CPU of a simulated request, relative: one, plus this much per scheduler iteration a
# mean prompt takes (mean prompt / the prefill pool's token budget). Fitted on the quick
# 64-GPU plan of the long-prompt advisor question (benchmarks/plan_cost.py --rows): its
# chunked pools (12k-token prompts, 512-token chunks: 24 iterations, each shared with
# the decode batch) took 1.16-1.19 ms of CPU per simulated request, its whole-prompt
# prefills (a 16k budget: 0.75 iteration) 0.20-0.38 ms: 1 + 0.18 x 24 = 4.7 x (1 + 0.18
# x 0.75). Only the order of the runs depends on it, never a result.
ITERATION_COST = 0.18


def request_cost(scenario: Scenario, profile: SteadyProfile) -> float:
    """Relative CPU of one simulated request of ``scenario`` (:data:`ITERATION_COST`):
    ranks searches by the work they have left, nothing else."""
    pool = scenario.prefill_pool or scenario.pool
    if pool is None or not math.isfinite(profile.prompt_tokens_mean):
        return 1.0
    return 1.0 + ITERATION_COST * profile.prompt_tokens_mean / max(pool.max_batch_tokens, 1)


class _Job:
    """One scenario's search as steps for :func:`~disaggsim.sweep.executors.drive`: its
    next rates × seeds, then (when a run is a trend-only miss) the retests, then the
    rates after those."""

    def __init__(
        self,
        src: Source,
        search: RateSearch,
        profile: SteadyProfile,
        rule: RunLengthRule,
        seeds: int,
        retest: bool,
        stop_early: bool,
        request_cost: float = 1.0,
        workload: object | None = None,
        long_horizon: Callable[[float], Horizon] | None = None,
    ) -> None:
        self.src, self.search, self.profile, self.rule = src, search, profile, rule
        # the confirmation-length runs' horizon by rate, instead of the rule's (a
        # scenario checked as written: its own sim section)
        self.long_horizon = long_horizon
        self.workload = workload  # the scenario's workload section: requests per second
        self.request_cost = request_cost
        self.sent_requests = 0.0  # expected arrivals of the tasks ``advance`` gave last
        self.sent_runs = 0
        self.checked = False  # the scenario's cost models, link and topology build
        self.seeds, self.retest = seeds, retest
        # stop a run once it certainly misses: below the target for one seed, lower for
        # several (one stopped seed must sink their mean); never where none can
        below = seeds_stop_below(src.attainment_target, seeds)
        self.stop_below = below if stop_early and below > 0 else None
        self.points: list[tuple[float, bool]] = []
        self.horizons: list[Horizon] = []
        self.results: list[Evaluation] = []
        self.todo: list[tuple[int, Horizon]] = []  # retests: (evaluation, its horizon)
        self.waiting: list[int] = []  # the points whose runs were sent last
        self.got: list[list[Summary]] = []  # each point's runs, as they come back
        self.num_longer = 0  # runs sent again longer: they measured no request

    def _expected(self, rate: float) -> Callable[[float], float] | None:
        """Requests a run of so many seconds at ``rate`` is expected to generate (the
        bound's own count: a sessions workload's rate is of session starts, each of
        several requests), for :func:`~disaggsim.metrics.steady.horizon`."""
        wl = self.workload
        if wl is None or "rate_per_s" not in type(wl).model_fields:  # type: ignore[attr-defined]
            return None
        at_rate = wl.model_copy(update={"rate_per_s": rate})  # type: ignore[attr-defined]
        return lambda duration_s: expected_requests(at_rate, duration_s)

    def _tasks(
        self, rate: float, confirm: bool, first_seed: int, h: Horizon | None = None
    ) -> tuple[Horizon, list[PointTask]]:
        if h is not None:
            pass  # a run measured nothing at its length: run it again longer (_longer)
        elif confirm and self.long_horizon is not None:
            h = self.long_horizon(rate)
        else:
            h = horizon(
                self.rule,
                rate,
                self.profile.service_s,
                self.profile.drain_s,
                confirm=confirm,
                expected_requests=self._expected(rate),
            )
        tasks = [
            _task(
                self.src,
                [
                    override_text(RATE_PATH, rate),
                    override_text("seed", first_seed + k),
                    *h.overrides(),
                ],
                stop_on_certain_miss=self.stop_below is not None,
                stop_below_attainment=self.stop_below,
                # the cost models, link and topology do not depend on the rate, seed
                # or run length: built once per search
                check_runnable=not self.checked and k == 0,
            )
            for k in range(self.seeds)
        ]
        self.checked = True
        return h, tasks

    def advance(self, runs: Sequence[Summary] | None) -> list[PointTask]:
        target = self.src.attainment_target
        if runs is not None and self.todo:  # the retests came back
            it = iter(runs)
            for i, h in self.todo:
                e = self.results[i]
                got = [next(it) for _ in range(self.seeds)]
                again = _evaluation(e.rate_per_s, True, h, got, target, self.rule)
                self.results[i] = dataclasses.replace(e, meets=again.meets, retest=again)
            self.todo = []
            self.search.record(self.results)
        elif runs is not None:  # the rates came back
            it = iter(runs)
            for i in self.waiting:
                self.got[i] = [next(it) for _ in range(self.seeds)]
            rerun: list[int] = []
            for i in self.waiting:
                # no attainment and not stopped: no request measured, so no verdict either
                # way; such a run is run again, longer, until it measures requests (a
                # preset whose arrivals come in bursts, CV 13, left a quick plan's run of
                # 121 s at 2.2 req/s without one, and the plan ended there, exit 2)
                if all(
                    math.isnan(r.slo_attainment) and r.stopped_early_at_s is None
                    for r in self.got[i]
                ):
                    rate = self.points[i][0]
                    longer = self._longer(rate, self.horizons[i])
                    if longer is None:  # at the longest run allowed: none can judge it
                        h = self.horizons[i]
                        if h.bound is None:  # stopped by the requests bound's halvings
                            h = dataclasses.replace(h, bound="MAX_REQUESTS")
                        raise _unmeasured(self.src.label, rate, h)
                    self.horizons[i] = longer
                    self.num_longer += self.seeds
                    rerun.append(i)
            if rerun:
                self.waiting = rerun
                longer_tasks: list[PointTask] = []
                for i in rerun:
                    rate, long = self.points[i]
                    longer_tasks += self._tasks(rate, long, self.src.seed, self.horizons[i])[1]
                return self._sent(longer_tasks)
            self.results = [
                _evaluation(rate, long, h, got, target, self.rule)
                for (rate, long), h, got in zip(self.points, self.horizons, self.got, strict=True)
            ]
            tasks: list[PointTask] = []
            for i, e in enumerate(self.results):
                if self.retest and _retested(e, target, self.rule.alpha):
                    # fresh seeds, none of the search's own, at the confirmation length
                    d, t = self._tasks(e.rate_per_s, True, self.src.seed + self.seeds)
                    self.todo.append((i, d))
                    tasks += t
            if tasks:
                return self._sent(tasks)
            self.search.record(self.results)
        self.points = self.search.next_points()
        self.horizons = []
        self.waiting = list(range(len(self.points)))
        self.got = [[] for _ in self.points]
        tasks = []
        for rate, long in self.points:
            h, t = self._tasks(rate, long, self.src.seed)
            self.horizons.append(h)
            tasks += t
        return self._sent(tasks)

    def _longer(self, rate: float, h: Horizon) -> Horizon | None:
        """``h`` with its warm-up and window doubled, as far as the scenario bounds allow
        (MAX_DURATION_S of arrivals, :data:`~disaggsim.metrics.steady.REQUESTS_HEADROOM`
        of MAX_REQUESTS); None when it is at them already: no run there can measure more."""
        scale, bound = 2.0, h.bound
        if 2.0 * h.duration_s >= MAX_DURATION_S:
            scale, bound = MAX_DURATION_S / h.duration_s, "MAX_DURATION_S"
        expected = self._expected(rate)
        if expected is not None:
            cap = REQUESTS_HEADROOM * MAX_REQUESTS
            while scale > 1.0 + 1e-9 and expected(scale * h.duration_s) > cap:
                scale, bound = 1.0 + 0.5 * (scale - 1.0), "MAX_REQUESTS"
        if not scale > 1.0 + 1e-9:
            return None
        return dataclasses.replace(
            h,
            warmup_s=h.warmup_s * scale,
            measure_s=h.measure_s * scale,
            shrink=h.shrink * scale,
            bound=bound,
        )

    def _sent(self, tasks: list[PointTask]) -> list[PointTask]:
        self.sent_requests = sum(
            t.raw["workload"]["rate_per_s"] * t.raw["sim"]["duration_s"] for t in tasks
        )
        self.sent_runs = len(tasks)
        return tasks

    def priority(self) -> float:
        """The work this search has left (:func:`~disaggsim.sweep.executors.drive` sends
        the runs of the search with the most first): the expected arrivals of the runs
        just given, plus one such run per seed for each step :meth:`RateSearch.steps_left`
        expects (``confirm_factor`` of one at the confirmation length), times the
        scenario's relative CPU per request (:func:`request_cost`)."""
        if not self.sent_runs:
            return 0.0
        run = self.sent_requests / self.sent_runs
        short, long = self.search.steps_left()
        later = self.seeds * run * (short + self.rule.confirm_factor * long)
        return self.request_cost * (self.sent_requests + later)


def check_rule(name: str, rule: object) -> None:
    """A ``rule`` argument of the Python API is a :class:`RunLengthRule` or None (a string
    or a mapping was an AttributeError traceback at the first run)."""
    if rule is not None and not isinstance(rule, RunLengthRule):
        text = " ".join(repr(rule).split())[:40]
        raise UserError(
            f"{name}: give a RunLengthRule(min_measured_requests=..., service_multiple=...) "
            f"or None, got {type(rule).__name__} {text}"
        )


def goodput_many(
    scenarios: Sequence[Source],
    rate_lo: float,
    rate_hi: float,
    *,
    tol_per_s: float | None = None,
    tol_fraction: float = DEFAULT_TOL_FRACTION,
    seeds: int = 1,
    rule: RunLengthRule | None = None,
    confirm: bool = True,
    executor: Executor | None = None,
    progress: ProgressFn | None = None,
    brackets: Sequence[tuple[float, float]] | None = None,
    retest: bool = True,
    bisected: Sequence[bool] | None = None,
    rules: Sequence[RunLengthRule] | None = None,
    stop_early: bool = True,
    screens: Sequence[bool] | None = None,
    long_horizons: Sequence[Callable[[float], Horizon] | None] | None = None,
    rate_digits: int | None = None,
) -> list[GoodputResult]:
    """Steady-state goodput of several scenarios, searched side by side: each scenario's
    next rate(s) × seeds go to the executor as soon as its last ones are back (then its
    retests: module docstring), so scenarios needing fewer runs do not hold up the rest
    (:func:`~disaggsim.sweep.executors.drive`). ``brackets`` gives a starting ``(rate_lo,
    rate_hi)`` per scenario instead of the shared one; ``rules`` a run-length rule per
    scenario instead of the shared ``rule``; ``retest=False`` lets a trend-only miss stand
    (the search before retests); ``bisected`` (per scenario) marks brackets already
    bisected, whose ``rate_lo`` is only confirmed, ``screens`` (per scenario) those whose
    ``rate_lo`` is a screen that ends the search with status ``below`` when it misses
    (:class:`RateSearch`); ``stop_early=False`` runs every simulation to its end (module docstring, "Early
    stop": the same goodput, more simulated requests). ``long_horizons`` (per scenario, a
    function of the rate, or None) replaces the rule's confirmation-length horizon, and
    ``rate_digits`` rounds a bisected search's confirmation and step-down rates
    (:class:`RateSearch`): a planner checks a scenario as it will write it (its own
    ``sim`` section, its rate as written). Each scenario's result depends
    only on its own runs: the same with any executor or neighbours."""
    check_seeds(seeds)
    check_rule("rule", rule)
    for r in rules or ():
        check_rule("rules item", r)
    check_callable("progress", progress)
    retest = check_switch("retest", retest)
    stop_early = check_switch("stop_early", stop_early)
    confirm = check_switch("confirm", confirm)
    rate_lo, rate_hi, tol_per_s = (plain_number(v) for v in (rate_lo, rate_hi, tol_per_s))
    rule = rule or RunLengthRule()
    # the caller's values, checked as bad input; per-scenario ``brackets`` and
    # ``bisected`` come from a caller that computed them (the planner): one that breaks
    # the rules is that caller's bug, an internal error (RateSearch)
    shared = (rate_lo, rate_hi) if brackets is None else None
    check_search_args(shared, tol_per_s, tol_fraction)
    starts = list(brackets) if brackets is not None else [(rate_lo, rate_hi)] * len(scenarios)
    done_before = list(bisected) if bisected is not None else [False] * len(scenarios)
    own_rules = list(rules) if rules is not None else [rule] * len(scenarios)
    screened = list(screens) if screens is not None else [False] * len(scenarios)
    longs = list(long_horizons) if long_horizons is not None else [None] * len(scenarios)
    jobs = []
    for src, (lo, hi), was, r, scr, long_h in zip(
        scenarios, starts, done_before, own_rules, screened, longs, strict=True
    ):
        check_params([Param(RATE_PATH, (lo,))], src.raw, src.label)
        loaded = load_scenario(src.raw, base_dir=src.base_dir)
        refuse_fixed_time_events(loaded.scenario, src.label)
        profile = steady_profile(loaded, src.label)
        try:
            search = RateSearch(
                lo,
                hi,
                tol_per_s=tol_per_s,
                tol_fraction=tol_fraction,
                confirm=confirm,
                min_rate_per_s=IDLE_CONCURRENCY / profile.service_s,
                bisected=was,
                screen=scr,
                rate_digits=rate_digits,
            )
        except InvariantError as e:  # a bracket the caller computed (check_search_args)
            raise InvariantError(
                f"{src.name}: {e} (a starting bracket computed by the caller)"
            ) from None
        cost = request_cost(loaded.scenario, profile)
        wl = loaded.scenario.workload
        jobs.append(_Job(src, search, profile, r, seeds, retest, stop_early, cost, wl, long_h))
    done_tasks = 0
    # a typical search: 2 ends + ~8 midpoints + a confirmation (twice as long)
    total_est = len(jobs) * seeds * 12

    def on_done() -> None:
        nonlocal done_tasks
        done_tasks += 1
        if progress is not None:
            progress(done_tasks, max(total_est, done_tasks))

    # the first round sends both ends of every search
    with given_or_default(executor, 2 * len(jobs) * seeds) as ex:
        drive(ex, run_point, jobs, on_done)
    if progress is not None:
        progress(done_tasks, done_tasks)
    out = []
    for job in jobs:
        b = job.search
        rate = b.rate_per_s
        out.append(
            GoodputResult(
                scenario=job.src.name,
                num_gpus=job.src.num_gpus,
                rate_per_s=rate,
                per_gpu_per_s=rate / job.src.num_gpus,
                status=str(b.status),
                attainment_target=job.src.attainment_target,
                tol_per_s=b._tol(),
                evaluations=tuple(b.evaluations),
                confirmation=b.confirmation,
                unattainable_below_per_s=b.unattainable_below,
                service_s=job.profile.service_s,
                below_per_s=b.below,
                num_lengthened=job.num_longer,
            )
        )
    return out


def _retested(e: Evaluation, target: float, alpha: float) -> bool:
    """Whether ``e`` is a trend-only miss that a retest decides: attainment met, trend
    test failed with ``p >= alpha²`` (below that a stationary run is rejected no more
    often than two runs both would be, so it is a miss outright)."""
    return not e.stable and bool(e.attainment >= target) and not e.p_value < alpha * alpha


def _unmeasured(label: str, rate: float, h: Horizon) -> UserError:
    """A rate at which a run measures no request: no attainment, so no verdict. It was
    scored a miss, and a bracket far below the goodput (``--rate-lo 1e-9``) then read
    "goodput 0 (misses at 1e-09)": the SLO unattainable at every rate, where 6.6 req/s
    met."""
    longest = {
        "MAX_DURATION_S": " (the longest allowed: 30 days of arrivals)",
        "MAX_REQUESTS": f" (the longest allowed: {fmt(REQUESTS_HEADROOM * MAX_REQUESTS)} "
        "requests expected)",
    }.get(str(h.bound), "")
    return UserError(
        f"{label}: at {rate:g} req/s a run of {h.duration_s:g} s{longest} measures no "
        "request, so the SLO cannot be judged there; start the goodput search at a rate "
        "at which requests arrive"
    )


def _evaluation(
    rate: float,
    long: bool,
    h: Horizon,
    runs: list[Summary],
    target: float,
    rule: RunLengthRule,
) -> Evaluation:
    att = [s.slo_attainment for s in runs]
    mean = sum(att) / len(att)
    stopped = sum(s.stopped_early_at_s is not None for s in runs)
    if stopped:  # a certain miss (its seeds' mean below the target): no trend to test
        return Evaluation(
            rate, math.nan, False, False, h.duration_s, long, runs[0],
            num_stopped_early=stopped, num_runs=len(runs),
            window_shrink=h.shrink, window_bound=h.bound,
        )  # fmt: skip
    p = min(s.stability_p_value for s in runs) * len(runs)
    stable = bool(p >= rule.alpha)
    return Evaluation(
        rate, mean, stable, bool(mean >= target) and stable, h.duration_s, long, runs[0],
        p_value=min(1.0, p), num_runs=len(runs), window_shrink=h.shrink, window_bound=h.bound,
    )  # fmt: skip


def goodput(
    scenario: LoadedScenario | Scenario | str | Path | dict,
    rate_lo: float,
    rate_hi: float,
    *,
    tol_per_s: float | None = None,
    seeds: int = 1,
    rule: RunLengthRule | None = None,
    executor: Executor | None = None,
    overrides: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
    retest: bool = True,
    stop_early: bool = True,
) -> GoodputResult:
    """Steady-state goodput of one scenario, starting from ``[rate_lo, rate_hi]`` (the
    range widens until it brackets the goodput), to ``tol_per_s`` (default 1 % of the
    bracket's upper end), confirmed at twice the horizon; per GPU = rate / GPUs."""
    check_executor(executor)
    src = as_source(scenario, overrides)
    return goodput_many(
        [src],
        rate_lo,
        rate_hi,
        tol_per_s=tol_per_s,
        seeds=seeds,
        rule=rule,
        executor=executor,
        progress=progress,
        retest=retest,
        stop_early=stop_early,
    )[0]
