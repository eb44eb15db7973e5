"""A run without a horizon whose requests cannot all end stops when nothing is left to
happen, with or without a stop check or progress ticks (Cluster.run).

Without them SimPy's loop runs out of events and the run stops (RunStalled). A stop check
or a progress tick used to schedule itself again for ever: the only events left were the
checks, the run never ended. Now neither is scheduled again once nothing else is queued,
so the run stops where the run without them stops. The stall is made by one request more
than the table holds (all_done can never succeed): what an engine bug leaving a request
unended would do. Counters that raise after many calls make a regression fail instead of
hang."""

from __future__ import annotations

import math

import numpy as np
import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import Cluster, RunStalled
from disaggsim.engine.config import EngineConfig, PoolSpec
from disaggsim.workload.requests import Requests

MAX_CALLS = 1000


def _cluster(horizon_s: float = math.inf, stalled: bool = True) -> Cluster:
    reqs = Requests(np.array([0.0, 0.5]), np.array([10, 10]), np.array([3, 3]))
    cfg = EngineConfig(
        pools=(PoolSpec("colocated", 1, ConstantCost(), 8, 1000, "vllm"),), horizon_s=horizon_s
    )
    cl = Cluster(reqs, cfg, lambda *a: 0.0)
    if stalled:
        cl._num_requests += 1  # a request that never ends: all_done never succeeds
    return cl


class _Counted:
    """A stop check / progress callback that never stops the run and raises past
    MAX_CALLS (a check rescheduled for ever)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, now: float, *rest: object) -> bool:
        self.calls += 1
        assert self.calls < MAX_CALLS, f"called {self.calls} times, now {now} s: runs for ever"
        return False


def test_without_a_check_the_stalled_run_stops():
    cl = _cluster()
    with pytest.raises(RunStalled, match="1 of 3 requests not ended"):
        cl.run()
    assert cl.num_done == 2 and math.isfinite(cl.env.now)


@pytest.mark.parametrize("progress", [False, True])
def test_a_stop_check_is_not_rescheduled_when_it_is_all_that_is_left(progress):
    cl = _cluster()
    check = _Counted()
    ticks = _Counted()
    kw = {"progress": ticks, "progress_every_s": 0.3} if progress else {}
    with pytest.raises(RunStalled):
        cl.run(stop_check=check, check_every_s=0.5, **kw)
    now = cl.env.now
    assert math.isfinite(now) and now < 10.0  # the two requests take well under a second
    assert 1 <= check.calls <= now / 0.5 + 1
    assert ticks.calls <= now / 0.3 + 1


def test_progress_ticks_alone_stop_too():
    cl = _cluster()
    ticks = _Counted()
    with pytest.raises(RunStalled):
        cl.run(progress=ticks, progress_every_s=0.25)
    assert math.isfinite(cl.env.now) and 1 <= ticks.calls <= cl.env.now / 0.25 + 1


@pytest.mark.parametrize("progress", [False, True])
def test_with_a_horizon_checks_go_on_until_it(progress):
    """A stalled run with a horizon ends at the horizon, checked throughout (a check may
    stop it at any instant before)."""
    cl = _cluster(horizon_s=20.0)
    check = _Counted()
    kw = {"progress": _Counted(), "progress_every_s": 0.3} if progress else {}
    raw = cl.run(stop_check=check, check_every_s=0.5, **kw)
    assert raw.end_at_s == 20.0
    assert check.calls == 40  # 0.5, 1.0, ..., 20.0


def test_a_run_that_ends_is_unchanged_by_the_guard():
    cl = _cluster(stalled=False)
    check = _Counted()
    raw = cl.run(stop_check=check, check_every_s=0.5)
    assert cl.all_done.triggered and math.isnan(raw.stopped_early_at_s)
