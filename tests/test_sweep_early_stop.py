"""The goodput search with the engine's early stop (disaggsim/sweep/goodput.py, "Early
stop"): a run that certainly misses ends early, its verdict is the full run's (a miss),
so the search takes the same steps and finds the same goodput as with every run to its
end; the stopped runs are counted and say so, and are never retested."""

from __future__ import annotations

import math

import pytest

from disaggsim.metrics.steady import RunLengthRule
from disaggsim.sweep import SerialExecutor
from disaggsim.sweep.compare import GOODPUT_COLUMNS, goodput_frame
from disaggsim.sweep.core import as_source
from disaggsim.sweep.goodput import goodput_many
from tests.one_server import one_server as one_server_dict
from tests.one_server import patch_constant_cost


@pytest.fixture
def one_server(monkeypatch):
    patch_constant_cost(monkeypatch)
    return [as_source(one_server_dict(t, name=f"one-server-{t:g}")) for t in (2.0, 0.6)]


def _steps(r):
    return [(e.rate_per_s, e.confirm, e.meets, e.retest is not None) for e in r.evaluations]


@pytest.mark.parametrize("seeds", [1, 2])
def test_early_stop_changes_no_verdict_and_says_which_runs_stopped(one_server, seeds):
    """Brackets that reach 3 x capacity: the runs far above it stop; every evaluation's
    verdict, the goodput, its status and its confirmation are those of full runs. With
    two seeds a run stops only below 1 - 2 (1 - target) = 0.8, where its mean with any
    other seed's attainment is below the target."""
    kw = {
        "rule": RunLengthRule(min_measured_requests=200),
        "tol_per_s": 0.2,
        "brackets": [(4.0, 30.0), (2.0, 30.0)],
        "seeds": seeds,
    }
    full = goodput_many(one_server, 0, 0, executor=SerialExecutor(), stop_early=False, **kw)
    cut = goodput_many(one_server, 0, 0, executor=SerialExecutor(), **kw)
    for f, c in zip(full, cut, strict=True):
        assert _steps(c) == _steps(f)
        assert (c.rate_per_s, c.status, c.confirmed) == (f.rate_per_s, f.status, f.confirmed)
        assert c.confirmation is not None and f.confirmation is not None
        assert c.confirmation.attainment == f.confirmation.attainment
        assert f.num_stopped_early == 0 and c.num_runs == f.num_runs
        assert 8.0 <= c.rate_per_s <= 11.0  # capacity 10 (short runs: near it)
    evaluations = [e for r in cut for e in r.evaluations]
    retests = [e.retest for e in evaluations if e.retest is not None]
    stopped = [e for e in evaluations + retests if e.num_stopped_early]
    assert stopped, "no run stopped: the case no longer tests the early stop"
    assert sum(r.num_stopped_early for r in cut) == sum(e.num_stopped_early for e in stopped)
    # a trend-only miss's retest may stop (a miss: the rate misses); a stopped run is
    # never retested (its attainment is not met)
    assert all(not e.meets for e in evaluations if e.retest is not None and e.retest in stopped)
    for e in stopped:
        assert not e.meets and not e.stable and e.retest is None
        assert math.isnan(e.attainment) and math.isnan(e.p_value)
        assert e.summary is not None
        # the summary of a stopped seed says when and how much it could have reached
        s = e.summary
        if s.stopped_early_at_s is not None:
            assert s.stopped_early_at_s < e.duration_s + 1.0
            assert s.slo_attainment_upper_bound is not None
            assert s.slo_attainment_upper_bound < 1 - seeds * 0.1
    frame = goodput_frame(one_server, [{}, {}], cut)
    assert list(frame.columns) == list(GOODPUT_COLUMNS)
    assert frame["num_stopped_early"].tolist() == [r.num_stopped_early for r in cut]
    assert frame["num_runs"].tolist() == [r.num_runs for r in cut]
    assert not frame["confirm_stopped_early"].any()  # confirmations that met ran in full
