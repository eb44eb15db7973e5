"""A sweep that stops before its end keeps every finished run and says so in one line
(docs/safety.md, "Sweeps that stop"); the same command with ``--resume`` runs only the
others and writes the table an uninterrupted sweep writes.

Before, a sweep kept its runs in memory until the last one finished: a dead Dask worker
(dask's KilledWorker), a lost scheduler or a run raising inside a worker was a traceback
of dask's with exit 1, Ctrl-C or SIGTERM exit 130/143, and every finished run was lost in
all of them (found by the fuzz lane killing the workers and the scheduler of a real
``LocalCluster`` under ``disaggsim sweep --scheduler``, /tmp/fz/killworker.py). The Dask
cases run against a real one-worker ``LocalCluster``, the signals in a child process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from disaggsim.cli import main
from disaggsim.sweep import SerialExecutor, sweep
from tests.conftest import REPO, one_error_line, run_in_own_session, runs_in

CHUNKED = REPO / "scenarios" / "ci" / "chunked.yaml"
SHORT = ["sim.duration_s=40", "sim.warmup_s=5"]
RATES = [1, 2, 3, 4]
BAD_RATE = 4  # the last point: a one-worker cluster runs the others first


def argv(out: str, *more: str) -> list[str]:
    return [
        "sweep", str(CHUNKED), "--param", "workload.rate_per_s=1,2,3,4",
        *[a for s in SHORT for a in ("--set", s)],
        "--out", out, "--quiet", "--no-plots", *more,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def expected() -> pd.DataFrame:
    """The table of an uninterrupted sweep, run in this process."""
    return sweep(
        CHUNKED, {"workload.rate_per_s": RATES}, executor=SerialExecutor(), overrides=SHORT
    )


def check_resumed(work: Path, out: str, expected: pd.DataFrame, capsys, kept: int) -> None:
    """Without --resume the kept runs are refused, not rerun nor deleted; with it the
    others run and the table is the uninterrupted sweep's; the partial folder is gone."""
    partial = work / f"{out}.partial"
    before = (partial / "runs.jsonl").read_bytes()
    assert main(argv(out, "--workers", "1")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{out}.partial/ holds {kept} run" in line and "--resume" in line, line
    assert (partial / "runs.jsonl").read_bytes() == before
    assert main(argv(out, "--workers", "1", "--resume")) == 0
    last = capsys.readouterr().out.strip()
    assert f"{kept} reused from {out}.partial/" in last, last
    got = pd.read_parquet(work / out / "sweep.parquet")
    pd.testing.assert_frame_equal(got, expected)
    assert not partial.exists()
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", out]


# ---------------------------------------------------------------------------------------
# Dask: a run raising inside a worker, a worker dying, a scheduler that refuses


PLUGIN = "disaggsim-test-sabotage"


def sabotage(how: str):
    """A worker plugin that makes ``simulate`` of the point at ``BAD_RATE`` raise (or
    kill its worker process); set up again in every worker the nanny restarts. (Defined
    here, so that it travels to the workers by value.)"""
    import time

    from distributed import WorkerPlugin

    class Sabotage(WorkerPlugin):
        name = PLUGIN

        def setup(self, worker) -> None:
            import disaggsim.run as run_mod

            real = run_mod.simulate

            def simulate(loaded, *a, **kw):
                if loaded.scenario.workload.rate_per_s == BAD_RATE:
                    if how == "die":
                        # the worker reports finished tasks in batches: dying at once can
                        # lose the report of the run before (then the scheduler holds
                        # that run lost with this one, "2 of 4"); wait for it to go out
                        time.sleep(2.0)
                        os._exit(1)
                    raise ZeroDivisionError("float division by zero")
                return real(loaded, *a, **kw)

            simulate.real = real  # type: ignore[attr-defined]
            run_mod.simulate = simulate

        def teardown(self, worker) -> None:
            import disaggsim.run as run_mod

            run_mod.simulate = getattr(run_mod.simulate, "real", run_mod.simulate)

    return Sabotage()


@pytest.fixture
def sabotaged(one_worker_cluster, request):
    import distributed

    # no client of the test's is open while the command runs its own
    with distributed.Client(one_worker_cluster.scheduler_address) as client:
        client.register_plugin(sabotage(request.param))
    yield one_worker_cluster.scheduler_address
    with distributed.Client(one_worker_cluster.scheduler_address) as client:
        client.unregister_worker_plugin(PLUGIN)


@pytest.mark.parametrize(
    ("sabotaged", "rc", "fragment"),
    [
        (
            "raise",
            3,
            "internal error: run workload.rate_per_s=4 seed_index=0: ZeroDivisionError: "
            "float division by zero (raised at ",
        ),
        ("die", 4, "a run's workers died each time it was started (dask's KilledWorker)"),
    ],
    indirect=["sabotaged"],
)
def test_a_run_failing_on_a_dask_worker_keeps_the_finished_runs(
    sabotaged, rc, fragment, work, capsys, expected
):
    assert main(argv("s", "--scheduler", sabotaged)) == rc
    line = one_error_line(capsys.readouterr().err)
    assert fragment in line, line
    assert line.endswith(
        "3 of 4 runs finished and are kept in s.partial/ (the same command with --resume "
        "runs only the other 1)" + (" (please report)" if rc == 3 else "")
    ), line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "s.partial"]
    assert len(runs_in(work / "s.partial")) == 3
    check_resumed(work, "s", expected, capsys, kept=3)


def test_a_scheduler_that_refuses_is_one_line_and_leaves_nothing(work, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(argv("s", "--scheduler", f"tcp://127.0.0.1:{port}")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--scheduler tcp://127.0.0.1:{port}: cannot connect" in line, line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_scheduler_address_is_refused(work, capsys, address, monkeypatch):
    # it ran on local processes, silently (an unset variable: --scheduler "$ADDR")
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert main(argv("s", "--scheduler", address)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--scheduler" in line and "empty" in line, line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


# ---------------------------------------------------------------------------------------
# signals, and the sweep process killed outright

CHILD = """
import os, signal, sys
from disaggsim.cli import main
from disaggsim.sweep.journal import Journal

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in the background

real = Journal.record
def record(self, index, summary):
    real(self, index, summary)
    if self.num_kept == 2:  # two runs are on disk: stop now
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
Journal.record = record
sys.exit(main(sys.argv[2:]))
"""


def run_child(work: Path, sig: str) -> subprocess.CompletedProcess:
    """The sweep of ``argv("s")`` in a child process that sends itself ``sig`` once two
    runs are on disk. In a session of its own, whose processes are ended after it: a
    killed sweep leaves its pool's forkserver running (and holding the pipes)."""
    return run_in_own_session(
        work.parent / "child.err", [sys.executable, "-c", CHILD, sig, *argv("s", "--workers", "1")]
    )


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_stopped_sweep_keeps_its_finished_runs_and_resumes(work, capsys, expected, sig):
    p = run_child(work, sig)
    number = getattr(signal, sig)
    if sig == "SIGKILL":  # nothing runs: the journal on disk is all that is left
        assert p.returncode == -number, p.stderr[-2000:]
    else:
        assert p.returncode == (130 if sig == "SIGINT" else 128 + number), p.stderr[-2000:]
        stopped = "interrupted" if sig == "SIGINT" else f"stopped by {sig}; nothing half-written"
        assert one_error_line(p.stderr) == (
            f"disaggsim: {stopped}; 2 of 4 runs finished and are kept in s.partial/ (the "
            "same command with --resume runs only the other 2)"
        )
    # SIGKILL runs no cleanup: the lock that held s stays (the next command takes it over)
    left = [".s.disaggsim-lock"] if sig == "SIGKILL" else []
    assert sorted(x.name for x in work.iterdir()) == [*left, "keep.txt", "s.partial"]
    assert len(runs_in(work / "s.partial")) == 2
    check_resumed(work, "s", expected, capsys, kept=2)


# ---------------------------------------------------------------------------------------
# the partial folder: another sweep's, a user's, a torn or broken journal


def test_a_second_sweep_into_the_same_folder_is_refused_while_the_first_runs(work, capsys):
    from disaggsim.sweep.journal import open_journal

    first = open_journal(Path("s"), "--out", [], resume=False)  # a sweep running now
    try:
        assert main(argv("s", "--workers", "1")) == 2
    finally:
        first.close(finished=False)
    line = one_error_line(capsys.readouterr().err)
    assert "--out s: another disaggsim command is writing into it now" in line, line
    assert not (work / "s").exists()


def test_a_users_folder_at_the_partial_path_is_left_alone(work, capsys):
    (work / "s.partial").mkdir()
    (work / "s.partial" / "notes.txt").write_text("mine\n")
    assert main(argv("s", "--workers", "1")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        "disaggsim: error: --out s: s.partial/, where its finished runs are kept, holds files "
        "that are not the kept runs of a sweep"
    ), line
    assert sorted(p.name for p in (work / "s.partial").iterdir()) == ["notes.txt"]
    assert not (work / "s").exists()


@pytest.mark.parametrize("what", ["file", "default-out"])
def test_an_error_at_the_partial_path_names_the_out_typed(work, capsys, what):
    """The partial folder's errors named ``--out s.partial``, a flag value nobody typed:
    they name ``--out s`` (or the default output) and say which folder is in the way."""
    args = argv("s", "--workers", "1")
    out, shown = "--out s", "s.partial"
    if what == "file":
        (work / "s.partial").write_text("mine\n")
        why = "exists and is not a folder disaggsim wrote; move it away"
    else:
        i = args.index("--out")
        del args[i : i + 2]
        name = "ci-chunked-sweep"
        (work / "results").mkdir()
        (work / "results" / f"{name}.partial").write_text("mine\n")
        out = f"results/{name} (the default output; choose another with --out)"
        shown = f"results/{name}.partial"
        why = "exists and is not a folder disaggsim wrote; move it away"
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"disaggsim: error: {out}: {shown}/, where its finished runs are kept, {why}"
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before


def test_a_bad_grid_leaves_no_partial_folder(work, capsys):
    args = argv("s", "--workers", "1")
    args[args.index("workload.rate_per_s=1,2,3,4")] = "workload.rate_per_s=1,-2"
    assert main(args) == 2
    one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_a_torn_last_line_is_dropped_and_a_broken_one_refused(work, capsys, expected):
    # two runs kept by a sweep stopped after them, then a third line cut short (the
    # process killed while writing it)
    run_child(work, "SIGKILL")
    journal = work / "s.partial" / "runs.jsonl"
    good = journal.read_text()
    journal.write_text(good + good.splitlines()[0][:50])
    check_resumed(work, "s", expected, capsys, kept=2)

    (work / "t.partial").mkdir()
    marker = {
        "written_by": "disaggsim",
        "command": "sweep (finished runs of an unfinished sweep)",
        "files": ["runs.jsonl"],
    }
    (work / "t.partial" / ".disaggsim-result.json").write_text(json.dumps(marker))
    (work / "t.partial" / "runs.jsonl").write_text('{"run": 1}\n' + good)
    assert main(argv("t", "--workers", "1", "--resume")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "t.partial/runs.jsonl: line 1: not a run disaggsim kept" in line, line


@pytest.fixture(scope="module")
def kept_journal(tmp_path_factory) -> str:
    """The journal of ``argv("s")`` whose four runs finished and whose table could not be
    written (all four kept)."""
    import importlib

    output = importlib.import_module("disaggsim.sweep.output")
    where = tmp_path_factory.mktemp("kept")
    real, cwd = output.write_table, os.getcwd()

    def refused(df, folder, stem):
        raise OSError(28, "No space left on device")

    output.write_table = refused
    os.chdir(where)
    try:
        assert main(argv("s", "--workers", "1")) == 2
    finally:
        output.write_table = real
        os.chdir(cwd)
    return (where / "s.partial" / "runs.jsonl").read_text()


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("ttft_p99_s", "x", 'not a run disaggsim kept (ttft_p99_s: expected float, got "x")'),
        ("busy_share_colocated", {"a": 1}, 'busy_share_colocated: expected float, got {"a": 1}'),
        ("num_completed", 7.5, "num_completed: expected int, got 7.5"),
        ("meets_slo", "yes", 'meets_slo: expected bool, got "yes"'),
        ("num_completed", -5, "the run's summary is not what disaggsim wrote (its checksum"),
        ("ttft_p99_s", 0.001, "the run's summary is not what disaggsim wrote (its checksum"),
    ],
)
def test_a_kept_run_changed_on_disk_is_refused_not_reused(
    work, capsys, kept_journal, key, value, said
):
    """A kept summary is reused as the run's result: one whose value is of another kind
    was a pyarrow traceback when the table was built (exit 1), and one whose value
    changed (an edit, a damaged block) was written into the table as the run's."""
    partial = work / "s.partial"
    partial.mkdir()
    marker = {
        "written_by": "disaggsim",
        "command": "sweep (finished runs of an unfinished sweep)",
        "files": ["runs.jsonl"],
    }
    (partial / ".disaggsim-result.json").write_text(json.dumps(marker))
    lines = kept_journal.splitlines()
    doc = json.loads(lines[1])
    assert key in doc["summary"], sorted(doc["summary"])
    doc["summary"][key] = value
    lines[1] = json.dumps(doc)
    (partial / "runs.jsonl").write_text("\n".join(lines) + "\n")
    assert main(argv("s", "--workers", "1", "--resume")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("disaggsim: error: s.partial/runs.jsonl: line 2: "), line
    assert said in line, line
    assert not (work / "s").exists()


def test_a_stop_while_the_table_is_written_keeps_every_run(work, capsys, expected, monkeypatch):
    import importlib

    output = importlib.import_module("disaggsim.sweep.output")
    real = output.write_table

    def interrupted(df, folder, stem):
        real(df, folder, stem)
        raise KeyboardInterrupt  # Ctrl-C while the result folder is being written

    monkeypatch.setattr(output, "write_table", interrupted)
    assert main(argv("s", "--workers", "1")) == 130
    assert one_error_line(capsys.readouterr().err) == (
        "disaggsim: interrupted; 4 of 4 runs finished and are kept in s.partial/ (the same "
        "command with --resume writes the table from them)"
    )
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "s.partial"]
    monkeypatch.setattr(output, "write_table", real)
    check_resumed(work, "s", expected, capsys, kept=4)


def test_resuming_another_grid_names_the_runs_it_keeps(work, capsys):
    """The kept runs of another grid are finished simulations: a resume that does not use
    them keeps them, and its last line says what they are and what to do with them (it
    said "keeps 2 runs of another sweep")."""
    run_child(work, "SIGKILL")  # rates 1 and 2 kept
    args = argv("s", "--workers", "1", "--resume")
    args[args.index("workload.rate_per_s=1,2,3,4")] = "workload.rate_per_s=3,4"
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "2 runs (2 points × 1 seed) written to s/; s.partial/ keeps 2 runs of a sweep of "
        "ci-chunked, not runs of this sweep (another grid, scenario, seeds, command or "
        "version): that command with --resume into this --out reuses them; delete the "
        "folder to drop them"
    ), last
    assert len(runs_in(work / "s.partial")) == 4  # theirs, and this sweep's until it ended
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "s", "s.partial"]
