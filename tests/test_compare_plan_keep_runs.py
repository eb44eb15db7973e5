"""``compare`` and ``plan`` that stop before their end keep every finished simulation and
say so in one line, as ``sweep`` does (docs/sweeps.md, "A sweep that stops before its
end"); the same command with ``--resume`` reuses them and writes what an uninterrupted
command writes. A Dask scheduler without workers, a refused scheduler address and the
local pool's processes after the command is killed are here too.

Before, a dead Dask worker, a lost scheduler or Ctrl-C during ``compare``/``plan`` gave
one line and exit 4/130, and every finished simulation was lost (fuzz lane, 2026-12-03);
a scheduler with no worker held the runs forever; a refused address waited dask's 10 s
connect timeout, silently; a SIGKILLed sweep's worker processes finished their run and
then waited forever, with the forkserver and the resource tracker. The Dask cases run
against a real one-worker ``LocalCluster``, the signals in a child process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from disaggsim.cli import main
from tests.conftest import REPO, one_error_line, run_in_own_session, runs_in

CI = REPO / "scenarios" / "ci"
COMPARE = [
    "compare", str(CI / "disaggregated.yaml"), str(CI / "chunked.yaml"),
    "--param", "workload.rate_per_s=0.5:3:3", "--set", "sim.duration_s=20",
    "--set", "sim.warmup_s=2", "--rate-hi", "12", "--min-requests", "100",
    "--service-multiple", "1", "--quiet", "--no-plots",
]  # fmt: skip
PLAN = [
    "plan", str(REPO / "scenarios" / "advisor" / "two-gpus.yaml"), "--gpus", "2",
    "--quick", "--min-requests", "60", "--service-multiple", "0.5", "--quiet", "--no-plots",
]  # fmt: skip
RESUMED = "(the same command with --resume reuses them and runs only the others)"


PLUGIN = "disaggsim-test-die-once"


def die_once(count_file: str, at: int):
    """A worker plugin whose worker process dies when it starts its ``at``-th simulation
    (counted in ``count_file`` across the nanny's restarts), once."""
    from distributed import WorkerPlugin

    class DieOnce(WorkerPlugin):
        name = PLUGIN

        def setup(self, worker) -> None:
            import disaggsim.run as run_mod

            real = run_mod.simulate

            def simulate(loaded, *a, **kw):
                with open(count_file, "a+") as f:
                    f.write("x")
                    f.seek(0)
                    n = len(f.read())
                if n == at:
                    os._exit(1)
                return real(loaded, *a, **kw)

            simulate.real = real  # type: ignore[attr-defined]
            run_mod.simulate = simulate

        def teardown(self, worker) -> None:
            import disaggsim.run as run_mod

            run_mod.simulate = getattr(run_mod.simulate, "real", run_mod.simulate)

    return DieOnce()


def test_compare_on_dask_keeps_its_runs_when_a_worker_dies_and_resumes(
    one_worker_cluster, work, capsys, tmp_path
):
    import distributed

    address = one_worker_cluster.scheduler_address
    # the uninterrupted comparison, on the same cluster
    assert main([*COMPARE, "--scheduler", address, "--out", "u"]) == 0
    capsys.readouterr()
    with distributed.Client(address) as client:  # the 9th run: inside the goodput searches
        client.register_plugin(die_once(str(tmp_path / "count"), 9))
    try:
        assert main([*COMPARE, "--scheduler", address, "--out", "c"]) == 4
    finally:
        with distributed.Client(address) as client:
            client.unregister_worker_plugin(PLUGIN)
    line = one_error_line(capsys.readouterr().err)
    kept = len(runs_in(work / "c.partial"))
    assert kept >= 1
    assert "a run's workers died each time it was started (dask's KilledWorker)" in line, line
    assert line.endswith(f"{kept} runs finished and are kept in c.partial/ {RESUMED}"), line
    assert sorted(p.name for p in work.iterdir()) == ["c.partial", "keep.txt", "u"]

    # without --resume the kept runs are refused, neither rerun nor deleted
    before = (work / "c.partial" / "runs.jsonl").read_bytes()
    assert main([*COMPARE, "--scheduler", address, "--out", "c"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"c.partial/ holds {kept} runs of an earlier command" in line and "--resume" in line
    assert (work / "c.partial" / "runs.jsonl").read_bytes() == before

    assert main([*COMPARE, "--scheduler", address, "--out", "c", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"written to c/; {kept} runs reused from c.partial/" in " ".join(out.split()), out
    pd.testing.assert_frame_equal(
        pd.read_parquet(work / "c" / "compare.parquet"),
        pd.read_parquet(work / "u" / "compare.parquet"),
    )
    assert (work / "c" / "goodput.csv").read_bytes() == (work / "u" / "goodput.csv").read_bytes()
    assert sorted(p.name for p in work.iterdir()) == ["c", "keep.txt", "u"]


CHILD = """
import os, signal, sys
from disaggsim.cli import main
from disaggsim.sweep.journal import Journal

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in the background
at, how = int(sys.argv[1]), getattr(signal, sys.argv[2])
real = Journal.record_run
def record_run(self, run, summary):
    real(self, run, summary)
    if self.num_kept == at:  # so many runs are on disk: stop now
        os.kill(os.getpid(), how)
Journal.record_run = record_run
sys.exit(main(sys.argv[3:]))
"""


def run_child(work: Path, at: int, sig: str, argv: list[str]) -> subprocess.CompletedProcess:
    """``disaggsim ARGV`` in a child process that sends itself ``sig`` once ``at`` runs
    are on disk (in a session of its own, whose processes are ended after it)."""
    return run_in_own_session(
        work.parent / "child.err", [sys.executable, "-c", CHILD, str(at), sig, *argv]
    )


def test_plan_on_dask_interrupted_keeps_its_runs_and_resumes(one_worker_cluster, work, capsys):
    address = one_worker_cluster.scheduler_address
    assert main([*PLAN, "--scheduler", address, "--out", "u"]) == 0
    capsys.readouterr()
    p = run_child(work, 20, "SIGINT", [*PLAN, "--scheduler", address, "--out", "p"])
    assert p.returncode == 130, p.stderr[-2000:]
    assert one_error_line(p.stderr) == (
        f"disaggsim: interrupted; 20 runs finished and are kept in p.partial/ {RESUMED}"
    )
    assert len(runs_in(work / "p.partial")) == 20
    assert sorted(x.name for x in work.iterdir()) == ["keep.txt", "p.partial", "u"]

    assert main([*PLAN, "--scheduler", address, "--out", "p", "--resume"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "plan written to p/; 20 runs reused from p.partial/", last
    assert json.loads((work / "p" / "plan.json").read_text()) == json.loads(
        (work / "u" / "plan.json").read_text()
    )
    assert (work / "p" / "ranked.csv").read_bytes() == (work / "u" / "ranked.csv").read_bytes()
    assert sorted(x.name for x in work.iterdir()) == ["keep.txt", "p", "u"]


def test_a_plan_without_out_keeps_its_runs_beside_results(work, capsys):
    """A plan without --out writes nothing but its report; its runs are kept in
    results/<name>-plan.partial while it runs, and nothing is left when it ends."""
    p = run_child(work, 5, "SIGTERM", [*PLAN, "--workers", "1"])
    assert p.returncode == 128 + signal.SIGTERM, p.stderr[-2000:]
    partial = "results/advisor-two-gpus-plan.partial"
    # the run the worker held when the signal came finishes while the pool stops: kept too
    kept = len(runs_in(work / partial))
    assert kept in (5, 6)
    assert one_error_line(p.stderr) == (
        f"disaggsim: stopped by SIGTERM; nothing half-written; {kept} runs finished and are "
        f"kept in {partial}/ {RESUMED}"
    )
    assert sorted(x.name for x in (work / "results").iterdir()) == [Path(partial).name]
    assert main([*PLAN, "--workers", "1", "--resume", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"]
    assert f"{kept} runs reused from {partial}/" in captured.err, captured.err
    assert sorted(x.name for x in work.iterdir()) == ["keep.txt"]


# ---------------------------------------------------------------------------------------
# a scheduler without workers, a refused address


@pytest.fixture(scope="module")
def no_workers():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as c:
        yield c.scheduler_address


SWEEP = [
    "sweep", str(CI / "chunked.yaml"), "--param", "workload.rate_per_s=1,2",
    "--set", "sim.duration_s=20", "--out", "s", "--quiet", "--no-plots",
]  # fmt: skip


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_scheduler_without_workers_is_waited_for_a_bounded_time(
    no_workers, work, capsys, monkeypatch, how
):
    # the flag: long enough for the note a wait of more than 5 s prints
    wait_s = 6 if how == "flag" else 2
    if how == "flag":
        argv = [*SWEEP, "--scheduler", no_workers, "--wait-workers-s", str(wait_s)]
    else:
        monkeypatch.setenv("DISAGGSIM_WAIT_WORKERS_S", str(wait_s))
        argv = [*SWEEP, "--scheduler", no_workers]
    start = time.monotonic()
    assert main(argv) == 4
    took = time.monotonic() - start
    lines = capsys.readouterr().err.strip().splitlines()
    if how == "flag":
        assert lines[0] == (
            f"disaggsim: the Dask scheduler at {no_workers} has no worker; waiting up to 6 s "
            "for one"
        )
        lines = lines[1:]
    assert lines == [
        f"disaggsim: error: --scheduler {no_workers}: the scheduler has had no worker for "
        f"{wait_s} s, so no run could go on; start workers (dask worker {no_workers}), or wait "
        "longer with --wait-workers-s or $DISAGGSIM_WAIT_WORKERS_S"
    ]
    assert wait_s <= took < wait_s + 30
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    ("flag", "env", "fragment"),
    [
        ("0", None, "--wait-workers-s 0.0: must be a number of seconds > 0"),
        ("nan", None, "--wait-workers-s nan: must be a number of seconds > 0"),
        ("inf", None, "--wait-workers-s inf: must be a number of seconds > 0"),
        (None, "soon", "DISAGGSIM_WAIT_WORKERS_S=soon: expected a number of seconds > 0"),
        (None, "-1", "DISAGGSIM_WAIT_WORKERS_S=-1: must be a number of seconds > 0"),
    ],
)
def test_a_bad_worker_wait_is_one_line(work, capsys, monkeypatch, flag, env, fragment):
    argv = [*SWEEP, "--scheduler", "tcp://127.0.0.1:1"]
    if flag is not None:
        argv += ["--wait-workers-s", flag]
    if env is not None:
        monkeypatch.setenv("DISAGGSIM_WAIT_WORKERS_S", env)
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert fragment in line, line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_a_worker_wait_without_a_scheduler_is_refused(work, capsys, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert main([*SWEEP, "--workers", "1", "--wait-workers-s", "5"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--wait-workers-s 5: bounds the wait for a Dask scheduler's workers" in line, line


def test_a_refused_address_fails_at_once(work, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    assert main([*SWEEP, "--scheduler", f"tcp://127.0.0.1:{port}"]) == 2
    took = time.monotonic() - start
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"disaggsim: error: --scheduler tcp://127.0.0.1:{port}: cannot connect (connection "
        "refused: no scheduler listens there)"
    )
    assert took < 5  # it waited dask's 10 s connect timeout
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def _server(greeting: bytes | None):
    """A TCP server on a free local port that sends ``greeting`` to each connection, or
    nothing (None: an HTTP server, such as a dashboard's, waits for a request), and keeps
    it open; returns (port, stop)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if greeting is not None:
                conn.sendall(greeting)

    threading.Thread(target=serve, daemon=True).start()

    def stop() -> None:
        srv.close()
        for c in held:
            c.close()

    return srv.getsockname()[1], stop


@pytest.mark.parametrize("greeting", [b"SSH-2.0-OpenSSH_9.2\r\n", None], ids=["ssh", "silent"])
def test_a_server_that_is_not_a_scheduler_is_one_line(work, capsys, greeting):
    # dask's client read the SSH greeting as a message of 3 EiB ("out of memory", exit 4)
    # and waited forever for a silent server's handshake (an HTTP port: a dashboard's);
    # then the silent server was waited on for dask's whole connect timeout (30 s), where a
    # scheduler greets within milliseconds: now 5 s from the accepted connection
    port, stop = _server(greeting)
    try:
        start = time.monotonic()
        assert main([*SWEEP, "--scheduler", f"tcp://127.0.0.1:{port}"]) == 2
        took = time.monotonic() - start
    finally:
        stop()
    lines = capsys.readouterr().err.strip().splitlines()
    where = f"disaggsim: error: --scheduler tcp://127.0.0.1:{port}: cannot connect (the server"
    if greeting is None:
        assert lines[0].startswith("disaggsim: waiting up to 5 s for the Dask scheduler")
        assert lines[1] == (
            f"{where} there accepted the connection but sent nothing in 5 s, where a Dask "
            "scheduler answers at once; the scheduler's port is usually 8786, its "
            "dashboard's 8787)"
        )
        assert 5 <= took < 20
    else:
        assert lines == [
            f"{where} there is not a Dask scheduler: it sent 'SSH-2.0-'...; the scheduler's "
            "port is usually 8786, its dashboard's 8787)"
        ]
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


# ---------------------------------------------------------------------------------------
# the local pool's processes end with the command


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` still running (zombies are not)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_sweeps_worker_processes_end_with_it(work):
    # runs long enough to be killed mid-simulation (about a minute of CPU each)
    argv = [
        "sweep", str(CI / "chunked.yaml"), "--param", "workload.rate_per_s=1,2,3,4",
        "--set", "sim.duration_s=20000", "--workers", "2", "--out", "s", "--quiet",
        "--no-plots",
    ]  # fmt: skip
    p = subprocess.Popen(
        [sys.executable, "-m", "disaggsim", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        # the sweep, its resource tracker, the forkserver and two workers
        while len(_session(p.pid)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_session(p.pid)) >= 5, "the pool did not start"
        p.kill()
        p.wait()
        deadline = time.monotonic() + 15
        while _session(p.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _session(p.pid) == []
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_plan_refuses_an_empty_scheduler_address(work, capsys, monkeypatch):
    # plan built its executor apart from sweep and compare: --scheduler "$ADDR" with the
    # variable unset ran the plan on local processes, silently
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert main([*PLAN, "--scheduler", ""]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("disaggsim: error: --scheduler '': empty;"), line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


_INTERRUPTED_API = """
import json, multiprocessing, os, signal, sys, threading, time
from disaggsim.sweep import RunLengthRule, goodput_many
from disaggsim.sweep.compare import compare
from disaggsim.sweep.core import as_source

if __name__ == "__main__":
    path = sys.argv[2]
    start = time.monotonic()
    # a notebook's interrupt: SIGINT to this process alone, not to its workers (with
    # Python's own handler: a test runner's worker may have left SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        if sys.argv[1] == "compare":
            compare([path, path], {"sim.duration_s": [200000]}, seeds=3, rate_lo=1, rate_hi=4)
        else:
            rule = RunLengthRule(min_measured_requests=500000)  # runs of 125,000-500,000 s
            goodput_many([as_source(path)] * 3, 1.0, 4.0, rule=rule, stop_early=False)
    except KeyboardInterrupt:
        print(json.dumps([time.monotonic() - start, len(multiprocessing.active_children())]))
"""


@pytest.mark.parametrize("api", ["compare", "goodput_many"])
def test_an_interrupted_api_call_ends_its_own_workers_at_once(work, api):
    """``compare()`` and ``goodput_many()`` without an executor run on a local pool of
    their own. Interrupted (a notebook's interrupt reaches the kernel, not its workers),
    the pool was closed waiting for every running simulation (here 72 s for ``compare``,
    94 s for ``goodput_many``, interrupted 3 s in). Now the interrupt ends the workers at
    once (3.0 s)."""
    script = work / "interrupted.py"
    script.write_text(_INTERRUPTED_API)
    out = subprocess.run(
        [sys.executable, str(script), api, str(CI / "chunked.yaml")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert out.stdout, out.stderr
    elapsed_s, children = json.loads(out.stdout)
    assert children == 0
    assert elapsed_s < 30.0, out.stderr
