"""Time-varying workloads: rate shapes (diurnal, step) and the traffic-mix shift, and a
pin that workloads without them draw exactly what they drew before these existed."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from disaggsim.workload import Requests, WorkloadConfig, generate_requests
from disaggsim.workload.arrivals import DiurnalSchedule
from disaggsim.workload.generate import STREAMS

ADAPTER = TypeAdapter(WorkloadConfig)
FIXED = {"dist": "fixed", "value": 100}


def cfg(data: dict[str, Any]) -> Any:
    return ADAPTER.validate_python(data)


def synthetic(**fields: Any) -> dict[str, Any]:
    return {"kind": "synthetic", "prompt_tokens": FIXED, "output_tokens": FIXED, **fields}


def digest(r: Requests) -> str:
    blob = r.arrival_s.tobytes() + r.prompt_tokens.tobytes() + r.output_tokens.tobytes()
    return hashlib.sha256(blob).hexdigest()


# Values printed by the code at commit b4a1014, before rate shapes and mix shifts existed
# (same numpy 2.4.6); a change here means old scenarios would draw different requests.
PINNED = {
    "poisson": (
        {
            "kind": "synthetic",
            "rate_per_s": 5,
            "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 4000},
            "output_tokens": {"dist": "uniform", "low": 10, "high": 500},
        },
        554, 0.6471508467282682, 244145, 145507,
        "b87d7f09a934e2f82fa3fc1ba00e17bb5df5031295b0004a8fdb1d6f501f2536",
    ),
    "gamma_schedule": (
        {
            "kind": "synthetic",
            "rate_schedule": [[0, 2], [30, 9], [60, 1]],
            "arrival": "gamma",
            "burstiness_cv": 2,
            "prompt_tokens": {"dist": "empirical", "quantiles": [[0, 1], [0.5, 200], [1, 3000]]},
            "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 1},
        },
        374, 1.351904008273508, 339081, 54835,
        "d6f248334855db1881ef8156a95cae994049f865764115550eb02ca6a82d651f",
    ),
    "preset": (  # gamma was the presets' default arrival process until empirical gaps
        {"kind": "preset", "preset": "azure-conv-2023", "arrival": "gamma"},
        645, 0.4074717419878839, 776895, 141655,
        "1f4f72a6dfd56a31180c921af423fd02c00817e2181d55e5e8746cd22f2783be",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PINNED))
def test_workloads_without_shift_are_unchanged(name: str) -> None:
    data, n, first_s, prompt_sum, output_sum, sha = PINNED[name]
    r = generate_requests(cfg(data), duration_s=120, seed=11, replication=2)
    assert len(r) == n
    assert float(r.arrival_s[0]) == first_s
    assert int(r.prompt_tokens.sum()) == prompt_sum
    assert int(r.output_tokens.sum()) == output_sum
    assert digest(r) == sha


def test_new_streams_are_appended() -> None:
    assert STREAMS[:4] == ("arrivals", "prompt_tokens", "output_tokens", "spare")
    assert STREAMS[4:6] == ("mix_prompt_tokens", "mix_output_tokens")
    assert all(name.startswith("session_") for name in STREAMS[6:-3])  # sessions.py
    assert STREAMS[-3:] == ("max_tokens", "trace_spread", "rate_phase")


# ---------------------------------------------------------------- diurnal


def test_diurnal_cumulative_by_hand() -> None:
    # m=2, A=0.5, P=100, phase 0: Lambda(t) = 2 (t + (25/pi) sin(2 pi t / 100)).
    d = DiurnalSchedule(mean_per_s=2.0, amplitude=0.5, period_s=100.0, phase_s=0.0)
    assert d.cumulative(25.0) == pytest.approx(50 + 50 / math.pi, rel=1e-12)
    assert d.cumulative(50.0) == pytest.approx(100.0, rel=1e-12)
    assert d.cumulative(100.0) == pytest.approx(200.0, rel=1e-12)
    assert d.cumulative(0.0) == 0.0
    assert math.isinf(d.cumulative(math.inf))
    # phase 25: the peak at t=25, Lambda(t) = 2 (t + (25/pi)(sin(w(t-25)) + 1)).
    shifted = DiurnalSchedule(mean_per_s=2.0, amplitude=0.5, period_s=100.0, phase_s=25.0)
    assert shifted.cumulative(25.0) == pytest.approx(50 + 50 / math.pi, rel=1e-12)
    assert float(shifted.rate_at(25.0)) == pytest.approx(3.0)
    assert float(shifted.rate_at(75.0)) == pytest.approx(1.0)


@pytest.mark.parametrize("amplitude", [0.0, 0.5, 1.0])
def test_diurnal_inversion_is_exact(amplitude: float) -> None:
    d = DiurnalSchedule(mean_per_s=3.0, amplitude=amplitude, period_s=86400.0, phase_s=3600.0)
    t = np.array([0.0, 1.0, 600.0, 20000.0, 43200.0, 86399.0, 200000.0])
    u = np.array([d.cumulative(x) for x in t])
    np.testing.assert_allclose(d.invert(u), t, rtol=1e-12, atol=1e-9)


def test_diurnal_arrivals_follow_the_curve() -> None:
    # Poisson, m=4/s, A=0.8, P=200 s, peak at 0: over 100 periods the expected count in
    # the half-period around the peak [-50, 50) is 4*(100 + 0.8*200/pi) = 603.7 per
    # period, and around the trough 4*(100 - 0.8*200/pi) = 196.3.
    w = cfg(
        synthetic(
            rate_shape={"kind": "diurnal", "mean_per_s": 4, "amplitude": 0.8, "period_s": 200}
        )
    )
    r = generate_requests(w, duration_s=20000, seed=5)
    phase = np.mod(r.arrival_s + 50.0, 200.0)
    near_peak = int(np.count_nonzero(phase < 100.0))
    near_trough = len(r) - near_peak
    for count, mean in ((near_peak, 100 * 4 * (100 + 160 / math.pi)),
                        (near_trough, 100 * 4 * (100 - 160 / math.pi))):  # fmt: skip
        assert abs(count - mean) < 5 * math.sqrt(mean)


# ---------------------------------------------------------------- step


def test_step_shape_equals_its_schedule() -> None:
    shape = cfg(
        synthetic(
            rate_shape={
                "kind": "step", "base_per_s": 2, "burst_per_s": 10, "start_s": 30, "duration_s": 20
            },
            arrival="gamma",
            burstiness_cv=1.5,
        )
    )  # fmt: skip
    sched = cfg(
        synthetic(rate_schedule=[[0, 2], [30, 10], [50, 2]], arrival="gamma", burstiness_cv=1.5)
    )
    a = generate_requests(shape, duration_s=100, seed=3)
    b = generate_requests(sched, duration_s=100, seed=3)
    assert digest(a) == digest(b) and len(a) > 100


def test_step_at_zero_and_zero_base() -> None:
    w = cfg(
        synthetic(
            rate_shape={
                "kind": "step", "base_per_s": 0, "burst_per_s": 50, "start_s": 0, "duration_s": 10
            }
        )
    )  # fmt: skip
    r = generate_requests(w, duration_s=1000, seed=1)
    assert r.arrival_s[-1] < 10.0
    assert abs(len(r) - 500) < 5 * math.sqrt(500)


# ---------------------------------------------------------------- mix shift


def test_mix_shift_keeps_early_requests_and_redraws_late_ones() -> None:
    chat = {"dist": "lognormal", "median": 300, "sigma": 0.5}
    base = synthetic(
        rate_per_s=5, prompt_tokens=chat, output_tokens={"dist": "uniform", "low": 100, "high": 400}
    )
    shifted = {
        **base,
        "mix_shift": {"at_s": 60, "prompt_tokens": {"dist": "fixed", "value": 16000},
                      "output_tokens": {"dist": "fixed", "value": 200}},
    }  # fmt: skip
    a = generate_requests(cfg(base), duration_s=120, seed=9)
    b = generate_requests(cfg(shifted), duration_s=120, seed=9)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    early = a.arrival_s < 60
    assert 200 < early.sum() < 400
    np.testing.assert_array_equal(a.prompt_tokens[early], b.prompt_tokens[early])
    np.testing.assert_array_equal(a.output_tokens[early], b.output_tokens[early])
    assert (b.prompt_tokens[~early] == 16000).all() and (b.output_tokens[~early] == 200).all()
    assert (a.prompt_tokens < 16000).all()


def test_mix_shift_draws_from_its_own_streams() -> None:
    # Only output lengths shift: prompts are untouched; the new outputs come from the
    # mix_output_tokens stream (child 5 of the seed sequence), drawn for the late ones.
    late_dist = {"dist": "uniform", "low": 1000, "high": 2000}
    base = synthetic(rate_per_s=5, output_tokens={"dist": "uniform", "low": 1, "high": 50})
    shifted = {**base, "mix_shift": {"at_s": 30, "output_tokens": late_dist}}
    a = generate_requests(cfg(base), duration_s=60, seed=4, replication=1)
    b = generate_requests(cfg(shifted), duration_s=60, seed=4, replication=1)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    late = b.arrival_s >= 30
    child = np.random.SeedSequence([4, 1]).spawn(6)[5]
    expected = np.random.default_rng(child).integers(
        1000, 2000, size=int(late.sum()), endpoint=True, dtype=np.int64
    )
    np.testing.assert_array_equal(b.output_tokens[late], expected)


def test_mix_shift_at_zero_and_past_the_end() -> None:
    late = {"dist": "fixed", "value": 7}
    all_new = generate_requests(
        cfg(synthetic(rate_per_s=5, mix_shift={"at_s": 0, "prompt_tokens": late})),
        duration_s=20,
        seed=0,
    )
    assert (all_new.prompt_tokens == 7).all() and len(all_new) > 50
    none_new = generate_requests(
        cfg(synthetic(rate_per_s=5, mix_shift={"at_s": 1e6, "prompt_tokens": late})),
        duration_s=20,
        seed=0,
    )
    assert (none_new.prompt_tokens == 100).all()


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (synthetic(rate_per_s=1, rate_shape={"kind": "step", "base_per_s": 1, "burst_per_s": 2,
                                             "start_s": 0, "duration_s": 1}),
         "exactly one of rate_per_s, rate_schedule or rate_shape, got rate_per_s and rate_shape"),
        (synthetic(rate_shape={"kind": "diurnal", "mean_per_s": 1, "amplitude": 1.5, "period_s": 10}),
         "less than or equal to 1"),
        (synthetic(rate_shape={"kind": "diurnal", "mean_per_s": 1, "amplitude": 0.5, "period_s": 0}),
         "greater than 0"),
        (synthetic(rate_shape={"kind": "diurnal", "mean_per_s": 1, "amplitude": 0.5}), "period_s"),
        (synthetic(rate_shape={"kind": "step", "base_per_s": 1, "burst_per_s": 0, "start_s": 0,
                               "duration_s": 1}), "greater than 0"),
        (synthetic(rate_shape={"kind": "step", "base_per_s": -1, "burst_per_s": 3, "start_s": 0,
                               "duration_s": 1}), "greater than or equal to 0"),
        (synthetic(rate_shape={"kind": "square", "mean_per_s": 1}), "'diurnal', 'step'"),
        (synthetic(rate_per_s=1, mix_shift={"at_s": 5}), "mix_shift needs prompt_tokens or output_tokens"),
        (synthetic(rate_per_s=1, mix_shift={"at_s": -5, "prompt_tokens": FIXED}),
         "greater than or equal to 0"),
        (synthetic(rate_per_s=1, mix_shift={"at_s": 5, "prompt_tokens": FIXED, "typo": 1}),
         "Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_validation_errors(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as err:
        ADAPTER.validate_python(data)
    text = str(err.value)
    assert words in text
