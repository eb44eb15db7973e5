"""Synthetic workloads: determinism, arrival statistics against theory, length samplers."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from disaggsim.workload import Requests, SyntheticWorkload, WorkloadConfig, generate_requests
from disaggsim.workload.arrivals import RateSchedule
from disaggsim.workload.generate import STREAMS, streams

ADAPTER = TypeAdapter(WorkloadConfig)
FIXED = {"dist": "fixed", "value": 100}


def synthetic(**fields: object) -> SyntheticWorkload:
    data: dict[str, object] = {
        "kind": "synthetic",
        "prompt_tokens": FIXED,
        "output_tokens": FIXED,
        **fields,
    }
    cfg = ADAPTER.validate_python(data)
    assert isinstance(cfg, SyntheticWorkload)
    return cfg


def assert_same(a: Requests, b: Requests) -> None:
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)


LOGNORMAL = {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 4000}


def test_same_seed_identical_different_seed_differs() -> None:
    cfg = synthetic(rate_per_s=5, arrival="gamma", burstiness_cv=2, prompt_tokens=LOGNORMAL)
    a = generate_requests(cfg, duration_s=200, seed=7)
    assert_same(a, generate_requests(cfg, duration_s=200, seed=7))
    for other in (
        generate_requests(cfg, duration_s=200, seed=8),
        generate_requests(cfg, duration_s=200, seed=7, replication=1),
    ):
        assert not np.array_equal(a.arrival_s[:50], other.arrival_s[:50])
        assert not np.array_equal(a.prompt_tokens[:50], other.prompt_tokens[:50])


def test_streams_are_stable_when_streams_are_appended() -> None:
    # spawn(k) children do not depend on k, so appending a stream keeps old results.
    ours = streams(3, 1)
    longer = np.random.SeedSequence([3, 1]).spawn(len(STREAMS) + 3)
    for i, name in enumerate(STREAMS):
        assert ours[name].random() == np.random.default_rng(longer[i]).random()
    assert STREAMS[:3] == ("arrivals", "prompt_tokens", "output_tokens")


def test_lengths_do_not_depend_on_the_arrival_process() -> None:
    # Independent streams: changing the arrival process leaves the lengths of the
    # first requests unchanged.
    a = generate_requests(synthetic(rate_per_s=5, prompt_tokens=LOGNORMAL), duration_s=100, seed=1)
    b = generate_requests(
        synthetic(rate_per_s=5, arrival="gamma", burstiness_cv=3, prompt_tokens=LOGNORMAL),
        duration_s=100,
        seed=1,
    )
    n = min(len(a), len(b))
    np.testing.assert_array_equal(a.prompt_tokens[:n], b.prompt_tokens[:n])
    assert not np.array_equal(a.arrival_s[:n], b.arrival_s[:n])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_rate_and_cv(seed: int) -> None:
    rate, duration = 10.0, 2000.0
    r = generate_requests(synthetic(rate_per_s=rate), duration_s=duration, seed=seed)
    expected = rate * duration  # Poisson count: mean = variance = 20,000
    assert abs(len(r) - expected) < 5 * math.sqrt(expected)
    assert r.arrival_s.min() >= 0 and r.arrival_s.max() < duration
    assert np.all(np.diff(r.arrival_s) >= 0)
    gaps = np.diff(r.arrival_s)
    # exponential gaps: mean 1/rate, CV 1; sd of the sample CV ~ sqrt(2/n) = 0.01
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_cv_and_rate(cv: float) -> None:
    rate, n = 20.0, 50_000
    cfg = synthetic(rate_per_s=rate, arrival="gamma", burstiness_cv=cv)
    r = generate_requests(cfg, duration_s=n / rate, seed=11)
    # renewal count: sd ~ cv * sqrt(n) (3 * 224 = 671 for cv 3)
    assert abs(len(r) - n) < 5 * cv * math.sqrt(n)
    gaps = np.diff(r.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_num_requests_caps_and_infinite_duration() -> None:
    cfg = synthetic(rate_per_s=8, num_requests=50_000)
    t0 = time.perf_counter()
    r = generate_requests(cfg, duration_s=math.inf, seed=42)
    elapsed = time.perf_counter() - t0
    assert len(r) == 50_000
    assert elapsed < 0.5
    assert r.arrival_s[-1] == pytest.approx(50_000 / 8, rel=0.03)
    capped = generate_requests(cfg, duration_s=100, seed=42)
    assert abs(len(capped) - 800) < 5 * math.sqrt(800)


def test_lognormal_lengths_are_fast() -> None:
    cfg = synthetic(rate_per_s=100, prompt_tokens=LOGNORMAL, output_tokens=LOGNORMAL)
    t0 = time.perf_counter()
    r = generate_requests(cfg, duration_s=500, seed=0)
    assert time.perf_counter() - t0 < 0.5
    assert len(r) > 45_000


def test_fixed_lengths_exact() -> None:
    cfg = synthetic(
        rate_per_s=5,
        prompt_tokens={"dist": "fixed", "value": 1024},
        output_tokens={"dist": "fixed", "value": 1},
    )
    r = generate_requests(cfg, duration_s=100, seed=0)
    assert np.all(r.prompt_tokens == 1024) and np.all(r.output_tokens == 1)
    assert r.prompt_tokens.dtype == np.int64


def test_uniform_lengths_bounds_and_mean() -> None:
    cfg = synthetic(rate_per_s=100, prompt_tokens={"dist": "uniform", "low": 10, "high": 20})
    r = generate_requests(cfg, duration_s=200, seed=0)
    p = r.prompt_tokens
    assert p.min() == 10 and p.max() == 20  # both ends included
    assert set(np.unique(p)) == set(range(10, 21))
    # discrete uniform on 11 values: mean 15, sd sqrt((11^2-1)/12) = 3.16
    assert abs(p.mean() - 15) < 5 * 3.16 / math.sqrt(len(p))


def test_lognormal_median_and_clip() -> None:
    dist = {"dist": "lognormal", "median": 500, "sigma": 1.0, "min": 20, "max": 8000}
    r = generate_requests(synthetic(rate_per_s=100, prompt_tokens=dist), duration_s=200, seed=3)
    p = r.prompt_tokens
    # sd of the sample median = median * sigma * sqrt(pi/2) / sqrt(n) ~ 0.9% at n=20k
    assert np.median(p) == pytest.approx(500, rel=0.05)
    assert p.min() == 20 and p.max() == 8000
    # P(X > 8000) = P(Z > ln 16) = 0.0028: the clip makes a mass at max
    assert np.mean(p == 8000) == pytest.approx(0.0028, abs=0.0015)
    # sigma from the log of the unclipped middle: IQR of ln X = 2 * 0.6745 * sigma
    q25, q75 = np.quantile(np.log(p), [0.25, 0.75])
    assert (q75 - q25) / (2 * 0.6745) == pytest.approx(1.0, rel=0.05)


def test_empirical_quantiles_reproduced() -> None:
    points: list[tuple[float, float]] = [
        (0, 1),
        (0.1, 50),
        (0.5, 400),
        (0.9, 2000),
        (0.99, 8000),
        (1, 16000),
    ]
    cfg = synthetic(rate_per_s=200, output_tokens={"dist": "empirical", "quantiles": points})
    r = generate_requests(cfg, duration_s=500, seed=5)
    x = r.output_tokens
    n = len(x)
    assert x.min() >= 1 and x.max() <= 16000
    for q, v in points[1:-1]:
        # empirical CDF at each knot: binomial sd sqrt(q(1-q)/n)
        assert abs(np.mean(x <= v) - q) < 5 * math.sqrt(q * (1 - q) / n) + 0.001


def test_rate_schedule_piecewise_rates() -> None:
    schedule = [[0, 2], [100, 20], [200, 0], [300, 5]]
    r = generate_requests(synthetic(rate_schedule=schedule), duration_s=400, seed=9)
    t = r.arrival_s
    assert np.all(np.diff(t) >= 0)
    for (lo, rate), hi in zip(schedule, [100, 200, 300, 400], strict=True):
        count = np.count_nonzero((t >= lo) & (t < hi))
        expected = rate * (hi - lo)
        assert abs(count - expected) <= 5 * math.sqrt(expected), (lo, count, expected)


def test_rate_schedule_inversion_by_hand() -> None:
    s = RateSchedule.from_points(((0.0, 2.0), (10.0, 0.0), (20.0, 4.0)))
    # Lambda: 2/s for 10 s -> 20, flat until 20 s, then 4/s
    assert s.cumulative(5.0) == 10.0
    assert s.cumulative(15.0) == 20.0
    assert s.cumulative(21.0) == 24.0
    np.testing.assert_allclose(s.invert(np.array([1.0, 19.0, 20.0, 22.0])), [0.5, 9.5, 20.0, 20.5])


def test_rate_schedule_ending_at_zero_with_infinite_duration() -> None:
    cfg = synthetic(rate_schedule=[[0, 50], [10, 0]])
    r = generate_requests(cfg, duration_s=math.inf, seed=0)
    assert r.arrival_s.max() < 10
    assert abs(len(r) - 500) < 5 * math.sqrt(500)


def test_endless_synthetic_needs_num_requests() -> None:
    from disaggsim.errors import UserError

    with pytest.raises(UserError, match="num_requests"):
        generate_requests(synthetic(rate_per_s=1), duration_s=math.inf, seed=0)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rate=st.floats(0.1, 50),
    cv=st.floats(0.2, 5),
    duration=st.floats(1, 100),
)
def test_invariants(seed: int, rate: float, cv: float, duration: float) -> None:
    cfg = synthetic(
        rate_per_s=rate,
        arrival="gamma",
        burstiness_cv=cv,
        prompt_tokens=LOGNORMAL,
        output_tokens={"dist": "uniform", "low": 1, "high": 3},
    )
    r = generate_requests(cfg, duration_s=duration, seed=seed)
    assert np.all(np.diff(r.arrival_s) >= 0)
    assert len(r) == 0 or (r.arrival_s[0] >= 0 and r.arrival_s[-1] < duration)
    assert np.all(r.prompt_tokens >= 1) and np.all(r.output_tokens >= 1)
    assert_same(r, generate_requests(cfg, duration_s=duration, seed=seed))


def test_empirical_rounds_to_nearest() -> None:
    # interp(U, [0, 1], [1, 3]) is uniform on [1, 3); rounding to nearest gives
    # 1 on [1, 1.5), 2 on [1.5, 2.5), 3 on [2.5, 3): probabilities 1/4, 1/2, 1/4.
    dist = {"dist": "empirical", "quantiles": [[0, 1], [1, 3]]}
    r = generate_requests(synthetic(rate_per_s=100, prompt_tokens=dist), duration_s=200, seed=4)
    n = len(r)
    for value, p in ((1, 0.25), (2, 0.5), (3, 0.25)):
        assert abs(np.mean(r.prompt_tokens == value) - p) < 5 * math.sqrt(p * (1 - p) / n)
