"""A stop (Ctrl-C, SIGTERM, SIGHUP) that arrives in the few instructions between making
something on disk and the code that cleans it up (disaggsim/stops.py, docs/safety.md
"Sweeps that stop").

Each test sends the signal to this process from inside such a step (a wrapper around
the call that makes the thing), so Python raises its exception at the first instruction
after it: before, a stop right after ``open_journal`` made ``OUT.partial`` and before the
command held the journal left an empty ``OUT.partial``; one between the two renames that
put a result in place left the earlier result hidden in ``.r.old-XXXXXXXX`` and deleted
the new one."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from disaggsim.cli import main
from disaggsim.output import MARKER
from disaggsim.stops import stops_held
from tests.conftest import REPO, one_error_line

CI = REPO / "scenarios" / "ci"
QUICK = ["--set", "sim.duration_s=3", "--set", "sim.warmup_s=0", "--quiet", "--no-plots"]
COMMANDS = {
    "sweep": ["sweep", str(CI / "chunked.yaml"), "--param", "workload.rate_per_s=1,2", *QUICK],
    "compare": ["compare", str(CI / "chunked.yaml"), "--rate-hi", "4", *QUICK],
    "plan": [
        "plan", str(REPO / "scenarios" / "advisor" / "short-prompt.yaml"), "--gpus", "2",
        "--quick", "--quiet", "--no-plots",
    ],
}  # fmt: skip
STOPPED = {
    "SIGINT": (130, "disaggsim: interrupted"),
    "SIGTERM": (143, "disaggsim: stopped by SIGTERM; nothing half-written"),
    "SIGHUP": (129, "disaggsim: stopped by SIGHUP; nothing half-written"),
}


def _kill_self(name: str) -> None:
    os.kill(os.getpid(), getattr(signal, name))


@pytest.fixture
def python_sigint():
    """Ctrl-C raises KeyboardInterrupt and a hangup is not ignored, as in an interactive
    shell (a test runner started in the background may inherit SIGINT ignored, one started
    under nohup SIGHUP ignored: disaggsim then rightly keeps it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGINT, previous)
    signal.signal(signal.SIGHUP, previous_hup)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_as_the_journal_is_opened_leaves_no_partial_folder(
    work, capsys, monkeypatch, python_sigint, command, sig
):
    # (``import disaggsim.sweep.journal as j`` finds the function ``sweep``)
    journal_mod = importlib.import_module("disaggsim.sweep.journal")
    real = journal_mod.open_journal

    def open_then_stop(*a, **k):  # the journal made, not yet the command's
        journal = real(*a, **k)
        assert (work / "o.partial" / "runs.jsonl").exists()
        _kill_self(sig)
        return journal

    monkeypatch.setattr(journal_mod, "open_journal", open_then_stop)
    rc = main([*COMMANDS[command], "--out", "o", "--workers", "1"])
    code, line = STOPPED[sig]
    assert rc == code
    assert one_error_line(capsys.readouterr().err) == line
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_a_stop_inside_open_journal_leaves_no_partial_folder(
    work, capsys, monkeypatch, python_sigint, sig
):
    # after the folder, its marker and the journal file are made and locked, before the
    # code that deletes them on an error
    import fcntl

    real = fcntl.flock
    stopped = []

    def lock_then_stop(fd, op):
        real(fd, op)
        if not stopped and op & fcntl.LOCK_EX:
            stopped.append(fd)
            _kill_self(sig)

    monkeypatch.setattr(fcntl, "flock", lock_then_stop)
    rc = main([*COMMANDS["sweep"], "--out", "o", "--workers", "1"])
    assert stopped and rc == STOPPED[sig][0]
    assert one_error_line(capsys.readouterr().err) == STOPPED[sig][1]
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def _result_files(folder: Path) -> list[str]:
    marker = json.loads((folder / MARKER).read_text())
    return marker["files"]


@pytest.mark.parametrize("after", [1, 2], ids=["moved-aside", "moved-in"])
def test_a_stop_while_a_result_replaces_an_earlier_one_loses_neither(
    work, capsys, monkeypatch, python_sigint, after
):
    run = ["run", str(REPO / "scenarios" / "quickstart.yaml"), "--no-plots", "--quiet"]
    assert main([*run, "--out", "r"]) == 0
    earlier = _result_files(work / "r")
    capsys.readouterr()
    real = os.rename
    calls = []

    def rename_then_stop(src, dst, *a, **k):
        real(src, dst, *a, **k)
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == after:  # the earlier result moved aside; the new one moved in
            _kill_self("SIGINT")

    monkeypatch.setattr(os, "rename", rename_then_stop)
    rc = main([*run, "--out", "r", "--set", "seed=8"])
    monkeypatch.undo()
    assert rc == 130, capsys.readouterr().err
    assert calls[0][0] == "r" and calls[0][1].startswith(".r.old-")
    # the stop waited for the moves: the new result is in place, whole, and nothing hidden
    # is left (before: the earlier one hidden in .r.old-XXXXXXXX, the new one deleted)
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "r"]
    files = _result_files(work / "r")
    assert files == earlier
    assert sorted(p.name for p in (work / "r").iterdir()) == sorted([MARKER, *files])
    assert "seed: 8" in (work / "r" / "scenario.yaml").read_text()


def test_a_held_stop_is_raised_by_the_handler_that_was_there_after_the_step():
    got = []

    def handler(signum, frame):
        got.append(("raised", signum))
        raise RuntimeError("stopped")

    previous = signal.signal(signal.SIGHUP, handler)
    try:
        with pytest.raises(RuntimeError, match="stopped"):
            with stops_held():
                _kill_self("SIGHUP")
                got.append("step done")
        assert got == ["step done", ("raised", signal.SIGHUP)]
        assert signal.getsignal(signal.SIGHUP) is handler  # put back
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_an_ignored_signal_stays_ignored_and_other_threads_hold_nothing():
    import threading

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stops_held():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            _kill_self("SIGHUP")
        seen = []

        def in_thread():
            with stops_held():  # signal.signal is refused outside the main thread
                seen.append(signal.getsignal(signal.SIGINT))

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert seen == [signal.getsignal(signal.SIGINT)]
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_nohup_keeps_a_command_running_when_the_terminal_closes(work):
    # main() put its own SIGHUP handler over an ignored SIGHUP (nohup, a shell's
    # huponexit off): closing the terminal stopped a sweep started under nohup
    import subprocess

    child = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it\n"
        "import disaggsim.run as r\n"
        "real = r.simulate\n"
        "def sim(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGHUP)  # the terminal closes mid-run\n"
        "    return real(*a, **k)\n"
        "r.simulate = sim\n"
        "from disaggsim.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", child, "run", str(REPO / "scenarios" / "quickstart.yaml"),
         "--no-plots", "--quiet", "--out", "r"],
        cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert (work / "r" / "summary.json").exists()
