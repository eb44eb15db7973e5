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


# -------------------------------------------------------------------------------------
# How the files are handed to the test workers (pytest-xdist, ``-n 2`` in pyproject.toml).
# Each file runs whole on one worker, so its module fixtures are computed once. Files that
# share a long session fixture form one unit (SAME_WORKER), run on one worker, so that
# fixture is computed once too. Units are handed out longest first (the seconds per file
# in tests/durations.json, measured by scripts/test_durations.py): a long file that
# started last would run alone while the other worker idles. A file the table does not
# know counts as its median. The order only spreads the work; which tests run is not
# changed, and ``-n 0`` runs them in the same order in one process.

DURATIONS = Path(__file__).with_name("durations.json")
SAME_WORKER = {
    # mmha_split_h100 (~50 s)
    "tests/test_mmha_split_rule.py": "mmha_split_h100",
    "tests/test_mmha_wave_decode.py": "mmha_split_h100",
    # moe_tables (~12 s)
    "tests/test_moe_fit_determined.py": "moe_tables",
    "tests/test_moe_reproducible.py": "moe_tables",
    "tests/test_moe_sglang_tiles.py": "moe_tables",
}


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its file's SAME_WORKER group."""
    file = nodeid.split("::", 1)[0]
    return SAME_WORKER.get(file, file)


def unit_order(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The order (indices into ``nodeids``) in which the tests are handed out: units by
    their files' ``seconds``, longest first (a file not in ``seconds`` at their median);
    a unit's tests together, in their order; units of equal weight as they came."""
    known = sorted(seconds.values())
    default = known[len(known) // 2] if known else 0.0
    weight: dict[str, float] = {}
    for file in {n.split("::", 1)[0] for n in nodeids}:
        weight[_unit(file)] = weight.get(_unit(file), 0.0) + seconds.get(file, default)
    first: dict[str, int] = {}
    for i, n in enumerate(nodeids):
        first.setdefault(_unit(n), i)
    key = [(-weight[_unit(n)], first[_unit(n)], i) for i, n in enumerate(nodeids)]
    return sorted(range(len(nodeids)), key=key.__getitem__)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    order = unit_order([it.nodeid for it in items], seconds)
    items[:] = [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Units as above, in the collection's order (``--no-loadscope-reorder`` in
    pyproject.toml: xdist would otherwise put the units with most tests first)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


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
