"""The Dask executor against a real ``dask.distributed.LocalCluster`` (two worker
processes): the same sweep table and the same goodput as the in-process executor."""

from __future__ import annotations

import pandas as pd
import pytest

from disaggsim.sweep import DaskExecutor, RunLengthRule, SerialExecutor, goodput, sweep
from disaggsim.sweep.executors import make_executor
from tests.conftest import REPO

distributed = pytest.importorskip("distributed")

CI = REPO / "scenarios" / "ci"
SHORT = ["sim.duration_s=40", "sim.warmup_s=5"]
GRID = {"workload.rate_per_s": [1.0, 2.5, 4.0], "decode_pool.max_batch_seqs": [32, 128]}


@pytest.fixture(scope="module")
def cluster():
    import dask

    # a loaded 2-core CI machine can take longer than dask's 30 s default to start and
    # connect two worker processes; the timeouts bound a hang, not the test's speed
    timeouts = {
        "distributed.comm.timeouts.connect": "120s",
        "distributed.comm.timeouts.tcp": "120s",
    }
    with (
        dask.config.set(timeouts),
        distributed.LocalCluster(
            # ":0": the dashboard on a free port (None means the fixed default 8787, which
            # another process on the machine may hold)
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
        ) as c,
    ):
        yield c


def test_dask_table_equals_the_serial_table(cluster):
    expected = sweep(
        CI / "disaggregated.yaml", GRID, seeds=2, executor=SerialExecutor(), overrides=SHORT
    )
    done = []
    with DaskExecutor(address=cluster.scheduler_address) as ex:
        got = sweep(
            CI / "disaggregated.yaml", GRID, seeds=2, executor=ex, overrides=SHORT,
            progress=lambda d, t: done.append((d, t)),
        )  # fmt: skip
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == 12
    assert done[0] == (0, 12) and done[-1] == (12, 12) and len(done) == 13


def test_dask_goodput_equals_serial(cluster):
    args = (CI / "chunked.yaml", 1.0, 12.0)
    kw = {
        "tol_per_s": 0.5,
        "overrides": SHORT,
        "rule": RunLengthRule(min_measured_requests=150, service_multiple=2.0),
    }
    expected = goodput(*args, executor=SerialExecutor(), **kw)
    with distributed.Client(cluster) as client:
        got = goodput(*args, executor=DaskExecutor(client=client), **kw)
    assert got == expected


def test_scheduler_address_from_the_environment(cluster, monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    with make_executor() as ex:
        assert isinstance(ex, DaskExecutor)
        got = sweep(
            CI / "chunked.yaml", {"workload.rate_per_s": [2.0]}, executor=ex, overrides=SHORT
        )
    assert got["workload.rate_per_s"].tolist() == [2.0]


def test_remote_user_errors_come_back_as_user_errors(cluster):
    from disaggsim.errors import UserError
    from disaggsim.sweep import run_point
    from disaggsim.sweep.core import PointTask

    bad = PointTask(raw={"name": "x"}, base_dir=str(REPO))
    with DaskExecutor(address=cluster.scheduler_address) as ex, pytest.raises(UserError):
        ex.map(run_point, [bad])
