"""Steady-state goodput: the trend test, the run-length rule, the rate search (pure
functions of rate), and goodput by simulation checked against queueing theory (M/D/1,
Erlang's waiting-time distribution) and against the seed scenario's prefill capacity."""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import pytest

from disaggsim.costmodel.step import build_worker_cost
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.errors import UserError
from disaggsim.metrics.steady import (
    RunLengthRule,
    count_batch_means,
    horizon,
    service_time_s,
    slo_drain_s,
    stability,
    trend_test,
)
from disaggsim.run import simulate
from disaggsim.sweep import SerialExecutor, goodput, search_rate
from disaggsim.sweep.goodput import MAX_REFINE_STEPS
from tests.conftest import REPO
from tests.one_server import SERVICE_S, one_server, patch_constant_cost

SEED = REPO / "scenarios" / "seed-70b-4k"

# ------------------------------------------------------------------ the trend test


def test_trend_slope_and_p_value_match_scipy_linregress():
    from scipy import stats

    rng = np.random.default_rng(5)
    x = np.arange(10) * 3.0 + 1.5
    y = 0.2 * x + rng.normal(0, 1.0, 10)
    t = trend_test("ttft", x, y)
    ref = stats.linregress(x, y)
    assert t.slope_per_s == pytest.approx(ref.slope, rel=1e-12)
    assert t.t_stat == pytest.approx(ref.slope / ref.stderr, rel=1e-9)
    assert t.p_value == pytest.approx(ref.pvalue / 2, rel=1e-9)  # one-sided, slope > 0
    down = trend_test("ttft", x, -y)
    assert down.p_value == pytest.approx(1 - ref.pvalue / 2, rel=1e-9)


def test_trend_edge_cases():
    x = np.arange(10.0)
    assert trend_test("ttft", x, np.full(10, 3.0)).p_value > 0.4  # flat: no trend
    assert trend_test("ttft", x, 2.0 * x).p_value == 0.0  # a perfect upward line
    assert trend_test("ttft", x[:2], x[:2]).p_value == 1.0  # too few batches to tell
    y = np.where(x < 5, np.nan, x)  # batches without requests are dropped
    assert trend_test("ttft", x, y).num_batches == 5


def test_count_batch_means_by_hand():
    # request A in [0, 4), B in [1, 2), C from 3 on (never ends); batches [0,2), [2,4)
    means = count_batch_means(
        np.array([0.0, 1.0, 3.0]), np.array([4.0, 2.0, np.inf]), np.array([0.0, 2.0, 4.0])
    )
    assert means.tolist() == [(2 + 1) / 2, (2 + 1) / 2]


def test_count_batch_means_is_the_table_sum_bit_for_bit():
    # the definition: the (intervals x batches) overlap table summed down its columns
    rng = np.random.default_rng(7)
    start = rng.uniform(0.0, 100.0, 5_000)
    end = start + rng.exponential(5.0, len(start))
    end[rng.random(len(end)) < 0.05] = np.inf
    end[:50] = start[:50]  # empty intervals
    edges = np.linspace(3.0, 97.0, 11)
    table = np.clip(
        np.minimum(end[:, None], edges[None, 1:]) - np.maximum(start[:, None], edges[None, :-1]),
        0.0,
        None,
    )
    want = table.sum(axis=0) / np.diff(edges)
    got = count_batch_means(start, end, edges)
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist()
    assert count_batch_means(np.empty(0), np.empty(0), edges).tolist() == [0.0] * 10


def _frame(arrival, first, finish, status) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_at_s": arrival,
            "first_token_at_s": first,
            "finish_at_s": finish,
            "status": pd.Series(status, dtype="category"),
        }
    )


def _md1(rho: float, n: int, seed: int) -> pd.DataFrame:
    """An M/D/1 queue (service 1 s) by Lindley's recursion: prefill-only requests."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rho, n))
    finish = np.empty(n)
    free = 0.0
    for i, a in enumerate(arrival):
        free = max(a, free) + 1.0
        finish[i] = free
    return _frame(arrival, finish, finish, ["completed"] * n)


@pytest.mark.parametrize(("rho", "stable"), [(0.5, True), (0.8, True), (1.1, False), (1.3, False)])
def test_stable_and_unstable_queues_are_told_apart(rho, stable):
    f = _md1(rho, 3000, seed=11)
    t0, t1 = f["arrival_at_s"].iloc[300], f["arrival_at_s"].iloc[-1]
    assert stability(f, t0, t1).stable is stable


def test_false_alarm_rate_on_a_stationary_queue():
    # the stated rate is <= 1 % when batch means are independent; at rho = 0.7 over
    # 1000-request windows they nearly are: 200 independent runs, binomial(200, 0.01)
    # exceeds 8 with probability < 2e-4
    flagged = 0
    for seed in range(200):
        f = _md1(0.7, 1100, seed=seed)
        flagged += not stability(f, f["arrival_at_s"].iloc[100], f["arrival_at_s"].iloc[-1]).stable
    assert flagged <= 8


def test_unfinished_and_abandoned_count_as_waiting():
    # arrivals every second; the last half never get a first token: their TTFT is at
    # least the time to the end of the run, which grows towards the start of that half
    n = 40
    arrival = np.arange(n, dtype=float)
    first = np.where(arrival < 20, arrival + 0.5, np.nan)
    status = ["completed"] * 20 + ["unfinished"] * 20
    f = _frame(arrival, first, first, status)
    s = stability(f, 0.0, 40.0)
    assert not s.stable
    assert s.slope("waiting") > 0
    # a time-varying load tests only the TTFT
    assert [t.signal for t in stability(f, 0.0, 40.0, stationary=False).tests] == ["ttft"]
    # a trend too small to matter is no trend: every request waits 20 ms longer than the
    # one before (an overload of 2 %), 0.72 s over the batch centres, under 2 % of a
    # 100 s TTFT target, over it for a 1 s target
    climb = _frame(arrival, arrival + 0.5 + 0.02 * arrival, arrival + 1.0, ["completed"] * n)
    assert stability(climb, 0.0, 40.0, ttft_target_s=100.0).stable
    assert not stability(climb, 0.0, 40.0, ttft_target_s=1.0).stable


@pytest.mark.parametrize(
    ("growth", "stable"), [(0.002, True), (0.008, True), (0.012, False), (0.05, False)]
)
def test_a_trend_counts_only_for_an_overload_of_one_percent(growth, stable):
    """A queue offered (1 + e) times what it serves: each arrival waits e seconds longer
    per second, and the number waiting rises by e / (1 + e) of the arrival rate. Arrivals
    every 0.1 s for 400 s, every request's wait growing by ``growth`` s/s with no noise:
    both signals are significant (p ~ 0) and their rises material (at 0.002: 0.72 s of
    TTFT, 7.2 requests waiting), yet below an overload of 1 % they are the queue still
    filling (docs/metrics.md), not a trend. Each signal decides alone: the TTFT with a
    stationary=False run (waiting not tested), the waiting count with a TTFT target so
    large that no TTFT rise is material."""
    arrival = np.arange(4000) * 0.1
    first = arrival + 0.5 + growth * arrival
    f = _frame(arrival, first, first + 1.0, ["completed"] * len(arrival))
    ttft_only = stability(f, 0.0, 400.0, stationary=False, ttft_target_s=1.0)
    assert ttft_only.slope("ttft") == pytest.approx(growth)
    assert ttft_only.stable is stable
    waiting_only = stability(f, 0.0, 400.0, ttft_target_s=1e6)
    # a request arriving at a waits until a (1 + growth) + 0.5: those waiting at t arrived
    # after (t - 0.5) / (1 + growth), so their number rises at 10 growth / (1 + growth)
    assert waiting_only.slope("waiting") == pytest.approx(10 * growth / (1 + growth), rel=5e-3)
    assert waiting_only.stable is stable


def test_the_overload_floor_counts_only_the_requests_that_join_the_queue():
    """Rejected requests leave at once and never wait, so the queue's growth is measured
    against the rate that joins it: 10 arrivals a second, every other one rejected, the
    waits of the 5 a second admitted growing by 1.5 % per second (an overload of 1.5 %,
    the number waiting rising by 0.074/s). Against all arrivals the floor would be 0.099/s
    and call it stable; against those admitted it is 0.050/s. The TTFT target is so large
    that only the waiting count decides."""
    arrival = np.arange(4000) * 0.1
    admitted = np.arange(4000) % 2 == 0
    first = np.where(admitted, arrival + 0.5 + 0.015 * arrival, np.nan)
    status = np.where(admitted, "completed", "rejected").tolist()
    f = _frame(arrival, first, first + 1.0, status)
    s = stability(f, 0.0, 400.0, ttft_target_s=1e6)
    assert s.slope("waiting") == pytest.approx(5 * 0.015 / 1.015, rel=5e-3)
    assert not s.stable


# ------------------------------------------------------------------ run length


def test_horizon_rule():
    rule = RunLengthRule(min_measured_requests=1000, service_multiple=20)
    h = horizon(rule, 10.0, service_s=2.0, drain_s=7.0)
    assert (h.measure_s, h.warmup_s, h.drain_s) == (100.0, 10.0, 7.0)  # 1000 requests
    h = horizon(rule, 100.0, service_s=2.0, drain_s=7.0)
    assert (h.measure_s, h.warmup_s) == (40.0, 6.0)  # 20 service times; 3 for warm-up
    long = horizon(rule, 100.0, service_s=2.0, drain_s=7.0, confirm=True)
    assert (long.measure_s, long.warmup_s, long.duration_s) == (80.0, 12.0, 2 * h.duration_s)
    assert h.overrides() == ["sim.duration_s=46.0", "sim.warmup_s=6.0", "sim.max_drain_s=7.0"]
    # never longer than a scenario may run (30 days of arrivals)
    slow = horizon(rule, 1e-6, service_s=2.0, drain_s=7.0)
    assert slow.duration_s == pytest.approx(30 * 86400) and slow.warmup_s < slow.measure_s
    with pytest.raises(UserError, match="confirm_factor must be"):
        RunLengthRule(confirm_factor=1.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_measured_requests", 0),
        ("min_measured_requests", -5),
        ("min_measured_requests", "1000"),
        ("min_measured_requests", 2.5),
        ("min_measured_requests", True),
        ("service_multiple", float("nan")),
        ("service_multiple", float("inf")),
        ("service_multiple", 0.0),
        ("service_multiple", "10"),
        ("warmup_service_multiple", -1.0),
        ("warmup_service_multiple", float("nan")),
        ("warmup_share", float("nan")),
        ("warmup_share", -0.1),
        ("confirm_factor", float("nan")),
        ("alpha", 0.0),
        ("alpha", 1.0),
        ("alpha", float("nan")),
    ],
)
def test_a_bad_run_length_rule_is_one_line_naming_its_field(field, value):
    with pytest.raises(UserError) as e:
        RunLengthRule(**{field: value})
    msg = str(e.value)
    assert msg.startswith(f"RunLengthRule: {field} must be ") and repr(value) in msg
    assert "\n" not in msg


def test_the_edges_of_a_run_length_rule_are_accepted():
    rule = RunLengthRule(
        min_measured_requests=np.int64(1), service_multiple=1e-9, warmup_service_multiple=0,
        warmup_share=0.0, confirm_factor=2, alpha=0.5,
    )  # fmt: skip
    assert rule.min_measured_requests == 1


def test_compare_and_plan_shorten_the_warmup_with_the_window():
    """--service-multiple below the default warm-up (3 service times) shortens the warm-up
    to it in compare as in plan (compare kept 3 and ran a 1-service-time window after a
    3-service-time warm-up); above it the warm-up stays at 3."""
    from disaggsim.cli.compare import run_length_rule
    from disaggsim.plan import PlanOptions

    for m, warm in ((1.0, 1.0), (0.5, 0.5), (20.0, 3.0)):
        rule = run_length_rule(None, m)
        assert (rule.service_multiple, rule.warmup_service_multiple) == (m, warm)
        opts = PlanOptions().with_run_length(None, m)
        assert (opts.rule.service_multiple, opts.rule.warmup_service_multiple) == (m, warm)
    assert run_length_rule(None, None) == RunLengthRule()


def test_service_time_and_drain_by_hand():
    costs = {"colocated": ConstantCost(prefill_base_s=0.5, decode_base_s=0.02)}
    assert service_time_s(costs, 100, 11) == pytest.approx(0.5 + 10 * 0.02)
    # a 200-token reply meeting a 2 s TTFT and 50 ms ITL ends within 2 + 199 x 0.05 s
    assert slo_drain_s(2.0, 0.05, 200) == pytest.approx(11.95)


# ------------------------------------------------------------------ the rate search


def _step(threshold: float, long_threshold: float | None = None):
    """Meets below ``threshold``; at the confirmation length below ``long_threshold``."""

    def evaluate(rate: float, long: bool) -> tuple[float, bool]:
        t = long_threshold if long and long_threshold is not None else threshold
        return (1.0, True) if rate <= t else (0.5, True)

    return evaluate


def test_search_brackets_bisects_and_confirms():
    s = search_rate(_step(7.3), 1.0, 20.0, 0.9, tol_per_s=0.01)
    assert s.status == "found" and s.confirmation is not None and s.confirmation.confirm
    assert 7.3 - 0.01 <= s.rate_per_s <= 7.3
    assert [e.rate_per_s for e in s.evaluations[:3]] == [1.0, 20.0, 10.5]
    assert s.evaluations[-1].confirm and s.evaluations[-1].rate_per_s == s.rate_per_s


def test_search_widens_until_bracketed():
    up = search_rate(_step(70.0), 1.0, 5.0, 0.9, tol_fraction=0.01)
    assert up.status == "found" and 70.0 * 0.98 <= up.rate_per_s <= 70.0
    assert [e.rate_per_s for e in up.evaluations[:5]] == [1.0, 5.0, 10.0, 20.0, 40.0]
    down = search_rate(_step(0.3), 4.0, 8.0, 0.9, tol_fraction=0.01)
    assert down.status == "found" and 0.29 <= down.rate_per_s <= 0.3
    never = search_rate(_step(-1.0), 4.0, 8.0, 0.9, tol_fraction=0.01)
    assert never.status == "unattainable" and never.rate_per_s == 0.0
    assert never.unattainable_below == 4.0 / 4**5
    # it does not widen below the rate at which the system is all but idle
    idle = search_rate(_step(-1.0), 4.0, 8.0, 0.9, tol_fraction=0.01, min_rate_per_s=0.2)
    assert idle.status == "unattainable" and idle.unattainable_below == 0.25
    assert min(e.rate_per_s for e in idle.evaluations) == 0.25


def test_search_lowers_the_rate_when_the_long_run_misses():
    s = search_rate(_step(7.3, long_threshold=6.0), 1.0, 20.0, 0.9, tol_per_s=0.05)
    assert s.status == "refined"
    assert 6.0 - 0.05 <= s.rate_per_s <= 6.0
    assert s.confirmation is not None and s.confirmation.confirm and s.confirmation.meets


def test_a_tiny_tolerance_still_steps_down_to_a_rate_that_meets():
    """A confirmation miss steps down by 2 x tol, doubling, 8 times: from a tolerance far
    below the rate (--tol 1e-9 at ~7 req/s) that covered 510 x tol, and the search called
    the SLO unattainable (goodput 0) where 6.0 req/s met at the confirmation length. The
    first step is at least 1 % of the rate, so 8 doublings cover the rate."""
    s = search_rate(_step(7.3, long_threshold=6.0), 1.0, 20.0, 0.9, tol_per_s=1e-9)
    assert s.status == "refined", (s.status, s.unattainable_below)
    assert 6.0 - 1e-9 <= s.rate_per_s <= 6.0
    # the default tolerance (1 % of the bracket's top) steps as before: 2 x tol
    d = search_rate(_step(7.3, long_threshold=6.0), 1.0, 20.0, 0.9, tol_fraction=0.01)
    first_down = next(e for e in d.evaluations if e.confirm and e.rate_per_s < d.lo)
    assert d.tol == pytest.approx(0.01 * 20.0)  # set when the bracket [1, 20] formed
    assert first_down.rate_per_s == pytest.approx(d.lo - 2 * d.tol)


def test_a_tolerance_wider_than_the_rate_never_steps_to_zero_or_below():
    """A confirmation miss steps down by 2 x tol: with a tolerance as wide as the rate
    (`compare --rate-lo 1 --rate-hi 8 --tol 1.0` at a goodput under 2 req/s) the first step
    went below zero and the run at -1.75 req/s ended the command in a traceback. A step
    that would reach zero divides the rate by 4 instead (as the bracket widens down), so
    every rate run is positive and the search still finds a rate that met at the
    confirmation length."""
    s = search_rate(_step(0.6, long_threshold=0.2), 0.5, 1.0, 0.9, tol_per_s=1.0)
    assert all(e.rate_per_s > 0 for e in s.evaluations), [e.rate_per_s for e in s.evaluations]
    assert s.status == "refined" and s.confirmation is not None and s.confirmation.meets
    # 0.5 met short and missed long; 0.125 met long: the result is a rate that met there
    assert [(e.rate_per_s, e.confirm) for e in s.evaluations[-2:]] == [(0.5, True), (0.125, True)]
    assert s.rate_per_s == 0.125
    # missing at every length down to the last step: unattainable below the last rate run,
    # after at most MAX_REFINE_STEPS step-downs, each a positive rate
    never = search_rate(_step(0.6, long_threshold=0.0), 0.5, 1.0, 0.9, tol_per_s=1.0)
    downs = [e.rate_per_s for e in never.evaluations if e.confirm][1:]
    assert never.status == "unattainable" and len(downs) == MAX_REFINE_STEPS
    assert downs == [0.5 / 4**k for k in range(1, MAX_REFINE_STEPS + 1)]
    assert never.unattainable_below == downs[-1]
    # nor below the rate at which the system is all but idle (as the bracket)
    idle = search_rate(
        _step(0.6, long_threshold=0.0), 0.5, 1.0, 0.9, tol_per_s=1.0, min_rate_per_s=0.1
    )
    assert idle.status == "unattainable" and idle.unattainable_below == 0.125
    assert min(e.rate_per_s for e in idle.evaluations) == 0.125
    # the planner's check as written rounds each rate it runs; a step to zero is refused
    # the same way
    w = search_rate(
        _step(0.6, long_threshold=0.2), 0.5, 0.6, 0.9, tol_per_s=1.0, bisected=True, rate_digits=3
    )
    assert all(e.rate_per_s > 0 for e in w.evaluations) and w.rate_per_s == 0.125


def test_a_tolerance_below_the_rates_resolution_ends_the_bisection():
    """``--tol 1e-300`` is a finite tolerance > 0, but no two rates near 7 req/s are that
    close: once the meeting and the missing rate were adjacent floats the midpoint was one
    of them, and the bisection ran it again forever (`compare --tol 1e-300` ran 8,555 runs
    in 2 minutes and never ended). It ends where no rate lies between the two, as the
    bisection at the confirmation length does."""
    s = search_rate(_step(7.3), 1.0, 20.0, 0.9, tol_per_s=1e-300)
    assert s.status == "found" and s.rate_per_s <= 7.3
    short = [e.rate_per_s for e in s.evaluations if not e.confirm]
    assert len(short) == len(set(short)) and len(short) < 80  # each rate once; ~52 halvings
    assert math.nextafter(s.rate_per_s, math.inf) > 7.3  # the highest float that meets
    r = search_rate(_step(7.3, long_threshold=6.0), 1.0, 20.0, 0.9, tol_per_s=1e-300)
    assert r.status == "refined" and math.nextafter(r.rate_per_s, math.inf) > 6.0


def test_a_bisected_bracket_is_only_confirmed():
    """Quick plans confirm an explored goodput at once: the bracket [7.0, 7.5] met and
    missed already, so the search runs 7.0 at the confirmation length and stops; when
    that misses it steps down at that length as after any confirmation."""
    s = search_rate(_step(7.3), 7.0, 7.5, 0.9, tol_per_s=0.1, bisected=True)
    assert s.status == "found" and s.rate_per_s == 7.0
    assert [(e.rate_per_s, e.confirm) for e in s.evaluations] == [(7.0, True)]
    r = search_rate(_step(7.3, long_threshold=6.0), 7.0, 7.5, 0.9, tol_per_s=0.1, bisected=True)
    assert r.status == "refined" and 5.9 <= r.rate_per_s <= 6.0
    assert all(e.confirm for e in r.evaluations)
    with pytest.raises(UserError, match="confirmation"):
        search_rate(_step(7.3), 7.0, 7.5, 0.9, confirm=False, bisected=True)


def test_a_check_as_written_runs_only_rates_as_written():
    """A planner's check of a file as written (plan/holds.py) rounds every rate it runs
    to the digits the file writes, so the rate written is the rate run: the start, each
    step down and each midpoint, and the result."""
    s = search_rate(
        _step(7.3, long_threshold=6.123456789),
        7.0123456789,
        7.5,
        0.9,
        tol_per_s=0.01,
        bisected=True,
        rate_digits=4,
    )
    rates = [e.rate_per_s for e in s.evaluations]
    assert rates[0] == 7.012 and all(e.confirm for e in s.evaluations)
    assert all(r == float(f"{r:.4g}") for r in rates)
    assert s.status == "refined" and s.rate_per_s == float(f"{s.rate_per_s:.4g}")
    assert 6.123456789 - 0.01 - 1e-3 <= s.rate_per_s <= 6.123456789
    # without the digits the same search runs unrounded rates
    free = search_rate(
        _step(7.3, long_threshold=6.123456789), 7.0123456789, 7.5, 0.9, tol_per_s=0.01,
        bisected=True,
    )  # fmt: skip
    assert free.evaluations[0].rate_per_s == 7.0123456789


def test_search_counts_instability_and_nan_as_misses():
    s = search_rate(lambda r, long: (1.0, r <= 4.0), 1.0, 20.0, 0.9, tol_per_s=0.1)
    assert 3.9 <= s.rate_per_s <= 4.0
    s = search_rate(
        lambda r, long: (float("nan") if r > 4 else 1.0, True), 1.0, 20.0, 0.9, tol_per_s=0.1
    )
    assert 3.9 <= s.rate_per_s <= 4.0
    with pytest.raises(UserError, match="rate_lo < rate_hi"):
        search_rate(_step(1.0), 5.0, 5.0, 0.9)


# ------------------------------------------------------------------ by simulation


@pytest.fixture
def constant_costs(monkeypatch):
    patch_constant_cost(monkeypatch)


def test_evenly_spaced_arrivals_goodput_is_the_capacity(constant_costs):
    # D/D/1: below 10 req/s every request finds the server idle (TTFT 0.1 s <= 0.15 s);
    # above it the backlog grows by (0.1 - 1/rate) s per arrival and TTFTs pass 0.15 s
    s = one_server(0.15, {"arrival": "gamma", "burstiness_cv": 1e-4})
    g = goodput(s, 2.0, 20.0, tol_per_s=0.05, executor=SerialExecutor())
    assert g.status == "found" and g.confirmed
    assert 10.0 - 0.05 - 0.02 <= g.rate_per_s <= 10.0
    assert g.per_gpu_per_s == g.rate_per_s and g.num_gpus == 1 and g.tol_per_s == 0.05
    assert g.service_s == pytest.approx(SERVICE_S)
    s["pool"] = {**s["pool"], "tp": 4}  # same (patched) cost, 4 GPUs per worker
    g4 = goodput(s, 2.0, 20.0, tol_per_s=0.05, executor=SerialExecutor())
    assert g4.num_gpus == 4 and g4.per_gpu_per_s == g4.rate_per_s / 4


def _md1_ttft_attainment(rate: float, ttft_s: float) -> float:
    """P(TTFT <= ttft_s) in a steady M/D/1 queue with service SERVICE_S: Erlang's
    waiting-time distribution P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/D)}
    (lambda (k D - t))^k / k! e^{-lambda (k D - t)}, at t = ttft - D (alternating terms:
    summed at 60 digits)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    d, t = SERVICE_S, ttft_s - SERVICE_S
    total = mpmath.mpf(0)
    for k in range(int(t / d) + 1):
        x = mpmath.mpf(rate) * (k * d - t)
        total += x**k / mpmath.factorial(k) * mpmath.exp(-x)
    return float((1 - rate * d) * total)


def test_poisson_goodput_is_just_below_capacity_and_near_erlang(constant_costs):
    # M/D/1 with a 2 s TTFT target: the steady state meets 90 % up to 9.42 req/s
    # (Erlang), capacity 10 req/s. A fixed 60 s run passes above capacity; the
    # steady-state search must not, for any of these seeds.
    lo, hi = 5.0, 9.999
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _md1_ttft_attainment(mid, 2.0) >= 0.9 else (lo, mid)
    analytic = lo
    assert analytic == pytest.approx(9.416, abs=0.002)
    s = one_server(2.0)
    short = simulate(s, ["workload.rate_per_s=10.2", "sim.duration_s=60", "seed=4"]).summary
    assert short["slo_attainment"] >= 0.9  # the trap: above capacity, a short run passes
    for seed in (1, 3, 4):
        g = goodput(
            s, 2.0, 20.0, tol_per_s=0.05, executor=SerialExecutor(), overrides=[f"seed={seed}"]
        )
        assert g.status in ("found", "refined") and g.confirmed
        assert 0.95 * analytic <= g.rate_per_s < 10.0, seed
        c = g.confirmation
        assert c is not None and c.confirm and c.rate_per_s == g.rate_per_s
        if g.status == "found":  # confirmed at twice the search's horizon at that rate
            assert c.duration_s == pytest.approx(2 * g.search_duration_s)


def test_seed_disaggregated_goodput_is_within_prefill_capacity():
    # one TP4 prefill worker runs two 4096-token prompts per 8192-token batch
    cost = build_worker_cost("llama-3-70b", "h100-sxm", 4, weight_dtype="fp16", kv_dtype="fp16")
    capacity = 2 / cost.prefill_time_s(2, 8192, 2 * 4096 * 4097 / 2)
    assert capacity == pytest.approx(3.7, rel=0.05)  # ~3.67 req/s when the issue was filed
    path = SEED / "disaggregated.yaml"
    # the trap: 3 % above capacity a 60 s run (30 s measured) meets the target
    short = simulate(path, [f"workload.rate_per_s={1.03 * capacity}", "sim.duration_s=60"])
    assert short.summary["slo_attainment"] >= 0.9
    rule = RunLengthRule(min_measured_requests=600)
    g = goodput(path, 2.0, 4.5, tol_per_s=0.1, rule=rule, executor=SerialExecutor())
    assert g.status in ("found", "refined") and g.confirmed
    assert 0.6 * capacity <= g.rate_per_s <= capacity
    # the search ran long enough to fail above capacity
    above = [e for e in g.evaluations if e.rate_per_s > capacity]
    assert above and not any(e.meets for e in above)
    assert math.isfinite(g.per_gpu_per_s) and g.num_gpus == 8


# ------------------------------------------------------------------ scenario bounds


def _fleet(workload: dict, num_workers: int, tp: int) -> dict:
    """Llama-3.1-8B on ``num_workers`` B200 workers of ``tp`` GPUs (vllm)."""
    return {
        "name": "big-fleet",
        "seed": 5,
        "model": "llama-3.1-8b",
        "architecture": "colocated",
        "pool": {"gpu": "b200", "num_workers": num_workers, "tp": tp, "scheduler": "vllm"},
        "fabric": {"link": "infiniband"},
        "slo": {"ttft_ms": 200, "itl_ms": 20, "attainment_target": 0.9},
        "workload": workload,
        "sim": {"duration_s": 60, "warmup_s": 5},
    }


@pytest.mark.parametrize(
    ("workload", "workers", "capacity_per_s"),
    [
        # 1024 x tp4 (4096 GPUs) at ~400 req/s each: ten service times of a run pass 2M
        (
            {
                "kind": "synthetic",
                "rate_per_s": 1000.0,
                "prompt_tokens": {"dist": "fixed", "value": 100},
                "output_tokens": {"dist": "fixed", "value": 50},
            },
            (1024, 4),
            1.6e6,
        ),
        # the rate is of session starts, each 2,000 requests: 1,000 measured starts are 2M
        (
            {
                "kind": "sessions",
                "rate_per_s": 1.0,
                "turns": {"dist": "fixed", "value": 2000},
                "user_tokens": {"dist": "fixed", "value": 20},
                "output_tokens": {"dist": "fixed", "value": 20},
                "think_time_s": {"dist": "exponential", "mean_s": 1},
            },
            (64, 1),
            20.0,
        ),
    ],
    ids=["big-fleet", "long-sessions"],
)
def test_goodput_runs_stay_within_max_requests(monkeypatch, workload, workers, capacity_per_s):
    """A goodput search whose run-length rule asks for more requests than a run may hold
    (MAX_REQUESTS) shortens those runs and says so; it used to end with the bound's error
    at the first such run (docs/safety.md). No simulation: each run meets the SLO below
    ``capacity_per_s`` and its scenario must load (the bound is checked there)."""
    from disaggsim.config.bounds import MAX_REQUESTS, expected_requests
    from disaggsim.config.loader import load_scenario

    seen: list[float] = []

    def fake_run(task):
        loaded = load_scenario(task.raw)
        n = expected_requests(loaded.scenario.workload, loaded.scenario.sim.duration_s)
        seen.append(n)
        rate = task.raw["workload"]["rate_per_s"]
        return _FakeSummary(1.0 if rate <= capacity_per_s else 0.5)

    # the module (``disaggsim.sweep.goodput`` as an attribute is the function)
    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    s = _fleet(workload, *workers)
    g = goodput(s, 0.6 * capacity_per_s, 1.2 * capacity_per_s, executor=SerialExecutor())
    assert g.status == "found" and g.confirmed
    assert 0.98 * capacity_per_s <= g.rate_per_s <= capacity_per_s
    assert seen and max(seen) <= 0.9 * MAX_REQUESTS * (1 + 1e-6)  # overrides: 9 digits
    short = g.shortened
    assert short and all(e.window_bound == "MAX_REQUESTS" and e.window_shrink < 1 for e in short)
    assert g.confirmation is not None and g.confirmation.window_shrink < 1
    (note,) = g.notes
    assert "MAX_REQUESTS" in note and f"of {g.num_runs} runs shortened" in note
    # compare's goodput table counts them
    from disaggsim.sweep.compare import goodput_frame
    from disaggsim.sweep.core import as_source

    frame = goodput_frame([as_source(s)], [{}], [g])
    assert frame["num_shortened"].tolist() == [sum(e.num_runs for e in short)]


class _FakeSummary(dict):
    """What the search reads of a run's summary (attainment, stability, early stop)."""

    def __init__(self, attainment: float) -> None:
        super().__init__()
        self.slo_attainment = attainment
        self.stability_p_value = 1.0
        self.stopped_early_at_s = None


def test_horizon_fits_the_expected_requests():
    rule = RunLengthRule(min_measured_requests=1000, service_multiple=10)
    # 1e6 req/s for 10 service times of 1 s (+3 of warm-up): 13M requests expected
    h = horizon(rule, 1e6, 1.0, 5.0, expected_requests=lambda d: 1e6 * d)
    assert h.bound == "MAX_REQUESTS" and h.duration_s * 1e6 == pytest.approx(1.8e6)
    assert h.shrink == pytest.approx(1.8 / 13) and h.warmup_s / h.measure_s == pytest.approx(0.3)
    same = horizon(rule, 10.0, 1.0, 5.0, expected_requests=lambda d: 10.0 * d)
    assert (same.shrink, same.bound) == (1.0, None)
    assert same == horizon(rule, 10.0, 1.0, 5.0)


def test_a_rate_at_which_no_request_is_measured_is_not_a_miss():
    """At 1e-9 req/s a run of the longest length allowed (30 days of arrivals) measures no
    request: no attainment, so no verdict. It was scored a miss, and the search reported
    the SLO unattainable at every rate (goodput 0, "misses at 1e-09") for ci-chunked,
    whose goodput is about 6.6 req/s; now one line says so, naming the rate."""
    path = REPO / "scenarios" / "ci" / "chunked.yaml"
    with pytest.raises(UserError) as e:
        goodput(path, 1e-9, 2e-9, executor=SerialExecutor())
    assert str(e.value) == (
        f"{path}: at 1e-09 req/s a run of 2.592e+06 s (the longest allowed: 30 days of "
        "arrivals) measures no request, so the SLO cannot be judged there; start the "
        "goodput search at a rate at which requests arrive"
    )


@pytest.mark.parametrize(
    "rate_hi, tol, coarse",
    [(1e12, None, True), (1000.0, None, True), (10.0, None, False), (1e12, 0.05, False)],
    ids=["1e12", "1e3", "10", "1e12-tol"],
)
def test_a_coarse_goodput_says_how_coarse(monkeypatch, rate_hi, tol, coarse):
    """The default tolerance is 1 % of the range's top: ``goodput(s, 1, 1e12)`` of a
    scenario meeting up to 6.6 req/s stopped at once, "found" at 1 req/s with a
    tolerance of 1e10 req/s, and said nothing. Its notes now say how coarse the answer
    is and how to get a finer one; a tolerance within 10 % of the goodput says nothing.
    No simulation: a run meets the SLO up to 6.6 req/s."""
    capacity = 6.6

    def fake_run(task):
        return _FakeSummary(1.0 if task.raw["workload"]["rate_per_s"] <= capacity else 0.5)

    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    chunked = str(REPO / "scenarios" / "ci" / "chunked.yaml")
    g = goodput(chunked, 1.0, rate_hi, tol_per_s=tol, executor=SerialExecutor())
    assert g.status == "found"
    assert g.rate_per_s <= capacity
    # the tolerance the search used: the given one, else 1 % of the range's top
    assert g.tol_per_s == (tol if tol is not None else 0.01 * rate_hi)
    if not coarse:
        assert g.coarse_note is None
        assert not any("known only to within" in n for n in g.notes)  # (runs shortened: said)
        assert g.rate_per_s >= capacity - g.tol_per_s
        return
    missed = min(e.rate_per_s for e in g.evaluations if not e.meets)
    assert g.notes[-1] == (  # after the runs shortened to fit MAX_REQUESTS, if any
        f"goodput {g.rate_per_s:.4g} req/s is known only to within {g.tol_per_s:.3g} req/s, "
        "the search's tolerance (tol_per_s, by default 1 % of its range's top): it met at "
        f"{g.rate_per_s:.4g} req/s and missed at {missed:.4g} req/s; give a smaller "
        "tol_per_s or a range whose top is nearer the goodput for a finer answer"
    )
    assert missed > capacity and g.tol_per_s > 0.1 * g.rate_per_s


def test_a_run_that_measures_no_request_is_run_again_longer(monkeypatch):
    """A run that measures no request is no evidence either way: inside the search it is
    run again with its warm-up and window doubled until it measures requests. It ended
    the search in one line (exit 2): a quick plan of the Azure code preset (arrivals of
    CV 13) saw no request in a 121 s run at 2.2 req/s and lost its verdict. No
    simulation: a run shorter than 500 s measures nothing; longer ones meet up to 6.6
    req/s."""
    capacity = 6.6
    seen: list[tuple[float, float]] = []

    def fake_run(task):
        rate = task.raw["workload"]["rate_per_s"]
        duration = task.raw["sim"]["duration_s"]
        seen.append((rate, duration))
        if duration < 500.0:
            return _FakeSummary(math.nan)
        return _FakeSummary(1.0 if rate <= capacity else 0.5)

    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    chunked = str(REPO / "scenarios" / "ci" / "chunked.yaml")
    g = goodput(chunked, 1.0, 10.0, tol_per_s=0.1, executor=SerialExecutor())
    assert g.status == "found" and capacity - 0.1 <= g.rate_per_s <= capacity
    # every verdict came from a run of at least 500 s, each reached by doubling
    assert all(e.duration_s >= 500.0 for e in g.evaluations)
    by_rate: dict[float, list[float]] = {}
    for rate, duration in seen:
        by_rate.setdefault(rate, []).append(duration)
    for durations in by_rate.values():  # a run too short is followed by one twice as long
        for a, b in zip(durations, durations[1:], strict=False):
            if a < 500.0:
                assert b == pytest.approx(2 * a, rel=1e-6)
    assert g.num_lengthened == sum(d < 500.0 for _, d in seen) > 0
    assert any("measured no request at their length" in n for n in g.notes)


def test_a_rate_at_which_no_run_can_measure_a_request_is_still_refused(monkeypatch):
    """Doubling stops at the scenario bounds (30 days of arrivals): a rate at which even
    the longest run measures nothing is one line naming it, as before."""

    def fake_run(task):
        return _FakeSummary(math.nan)

    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    chunked = str(REPO / "scenarios" / "ci" / "chunked.yaml")
    with pytest.raises(UserError) as e:
        goodput(chunked, 1.0, 10.0, executor=SerialExecutor())
    # 10 req/s reaches the requests bound first (0.9 x 2,000,000 in 180,000 s)
    assert "at 10 req/s a run of 180000 s (the longest allowed: 1,800,000 requests " in str(e.value)
    with pytest.raises(UserError) as e:
        goodput(chunked, 1e-3, 2e-3, executor=SerialExecutor())
    assert "s (the longest allowed: 30 days of arrivals) measures no request" in str(e.value)


def test_a_plan_of_a_bursty_preset_is_answered(tmp_path, monkeypatch):
    """The Azure code preset's arrivals come in bursts (gaps of CV 13): a quick plan of it
    ended with exit 2 after 3 runs ("at 4.87837 req/s a run of 50.9524 s measures no
    request"), its verdict lost. The empty run is now run again longer."""
    import json

    from disaggsim.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--preset",
            "azure-code-2023", "--ttft-ms", "2000", "--itl-ms", "100", "--quick", "--workers",
            "1", "--quiet", "--out", "p"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["verdict"] == "colocate_chunked" and plan["ranked"]


def test_compare_with_a_tolerance_wider_than_the_goodput_answers(tmp_path, monkeypatch, capsys):
    """The CLI fuzz's case (seed 61205): `compare --tol 1.0` over 6 s runs whose goodput is
    under 1 req/s stepped its confirmation down to -1.75 req/s and ended in a traceback
    (the run-length rule refuses a rate <= 0). Now it writes its table and says the answer
    is coarse."""
    import pandas as pd

    from disaggsim.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["compare", str(REPO / "scenarios" / "ci" / "colocated-vllm.yaml"), "--quiet",
            "--no-plots", "--set", "sim.duration_s=6", "--set", "sim.warmup_s=1",
            "--min-requests", "30", "--service-multiple", "0.5", "--rate-lo", "1",
            "--rate-hi", "8", "--tol", "1.0", "--workers", "1", "--out", "c"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and "is known only to within 1 req/s" in out
    row = pd.read_csv(tmp_path / "c" / "goodput.csv").iloc[0]
    assert row["status"] == "refined" and 0 < row["goodput_per_s"] < 1.0
