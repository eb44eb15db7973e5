"""Shared test helpers: paths to the project and to the public data beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomize): the suite passes or
# fails on the code, never on the draw. `DISAGGSIM_HYPOTHESIS=explore` draws new examples
# (and keeps failing ones in .hypothesis/) for a search beyond the suite.
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("DISAGGSIM_HYPOTHESIS", "suite"))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# tests that read the public kernel tables (shared/data/kernels)
needs_kernel_tables = pytest.mark.skipif(
    not (SHARED_DATA / "kernels").is_dir(),
    reason=f"public kernel tables absent at {SHARED_DATA / 'kernels'}",
)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The current folder of a user who runs disaggsim: empty but for one file of theirs,
    ``keep.txt``, which no command may touch."""
    w = tmp_path / "work"
    w.mkdir()
    (w / "keep.txt").write_text("a user's file\n")
    monkeypatch.chdir(w)
    return w


@pytest.fixture(scope="session")
def moe_tables() -> SimpleNamespace:
    """The public H100 MoE rows as ``calibration.fit_moe`` reads them, loaded once for every
    test that compares or refits MoE parameters: ``moe`` (the grouped-GEMM rows of every
    fitted framework), ``mla_generation``, ``mla_context``, ``deepep``. Tests only read
    them (selections are copies)."""
    if not (SHARED_DATA / "kernels" / "aiconfigurator" / "h100_sxm" / "moe").is_dir():
        pytest.skip("needs ../shared/data (AIConfigurator H100 MoE tables)")
    from calibration import fit_moe as fm

    return SimpleNamespace(
        moe=fm.moe_rows(SHARED_DATA, (fm.REF_MOE, *fm.GEMM_FRAMEWORKS)),
        mla_generation=fm.mla_rows(SHARED_DATA, "generation"),
        mla_context=fm.mla_rows(SHARED_DATA, "context"),
        deepep=fm.deepep_rows(SHARED_DATA),
    )


@pytest.fixture(scope="session")
def mmha_split_h100():
    """``calibration.fit_public.mmha_split_fit`` on the H100 rows (errors, residuals,
    fits), computed once for the masked-MHA tests that score it."""
    if not (SHARED_DATA / "kernels").is_dir():
        pytest.skip(f"public kernel tables absent at {SHARED_DATA / 'kernels'}")
    from calibration.fit_public import mmha_split_fit

    return mmha_split_fit(SHARED_DATA, "h100-sxm")


def one_error_line(err: str) -> str:
    """The one line a failing command wrote to stderr (asserting it wrote one)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def runs_in(partial: Path) -> list[dict]:
    """The runs a stopped command kept in its ``OUT.partial/`` journal."""
    return [json.loads(x) for x in (partial / "runs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_worker_cluster():
    """A real one-worker ``LocalCluster`` for the tests of runs kept when a Dask command
    stops (tests/test_sweep_keeps_runs.py, tests/test_compare_plan_keep_runs.py)."""
    distributed = pytest.importorskip("distributed")
    import dask

    # a task whose worker dies is given up at once (dask's default retries it on 3 more
    # workers); a loaded 2-core machine may take long to start the worker
    conf = {
        "distributed.comm.timeouts.connect": "120s",
        "distributed.comm.timeouts.tcp": "120s",
        "distributed.scheduler.allowed-failures": 0,
    }
    with (
        dask.config.set(conf),
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as c,
    ):
        yield c


def run_in_own_session(err_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``args`` in a child process in a session of its own (stdout dropped, stderr kept in
    ``err_path``), whose processes are all ended after it: a killed command's pool may
    leave processes holding its pipes."""
    with open(err_path, "w+") as err:
        p = subprocess.Popen(
            args,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        try:
            rc = p.wait(timeout=600)
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        err.seek(0)
        return subprocess.CompletedProcess(p.args, rc, "", err.read())
