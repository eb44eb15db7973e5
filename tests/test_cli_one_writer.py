"""One command at a time writes to an output (docs/safety.md, "One writer per output").

Two ``disaggsim run`` started together into one ``--out`` both said "results written to
r/": each checked the folder before simulating, and the later one then replaced the
earlier one's result as "an earlier disaggsim run result" (a lost result). A command now
holds its output from its check to its write (an exclusive lock on ``.r.disaggsim-lock``
beside it), and a second command is refused before it starts its work.

The holder is a real command in another process, stopped inside its work by this test
(``simulate`` or the sweep's ``run_tasks`` made to wait for a line on its standard
input): no timing is hoped for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from disaggsim.errors import UserError
from disaggsim.output import MARKER, hold_folder, write_folder
from tests.conftest import REPO

CHUNKED = str(REPO / "scenarios" / "ci" / "chunked.yaml")
SHORT = ["--set", "sim.duration_s=10", "--set", "sim.warmup_s=1"]

# A command run as `disaggsim ARGV`, whose work (`simulate` for run, `run_tasks` for a
# sweep) first says "working" and waits for a line on its standard input.
HOLDER = """
import importlib
import sys
from disaggsim.cli import main

run = importlib.import_module("disaggsim.run")  # the modules, not the functions so named
core = importlib.import_module("disaggsim.sweep.core")

def waiting(real):
    def wait_then_work(*args, **kwargs):
        print("working", flush=True)
        sys.stdin.readline()
        return real(*args, **kwargs)
    return wait_then_work

run.simulate = waiting(run.simulate)
core.run_tasks = waiting(core.run_tasks)
sys.exit(main(sys.argv[1:]))
"""


def start_holder(work: Path, *argv: str) -> subprocess.Popen:
    """``disaggsim ARGV`` in another process, returned once it is inside its work (so it
    holds its output)."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *argv],
        cwd=work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if line != "working\n":
        p.kill()
        raise AssertionError(f"holder did not start its work: {line!r} {p.stderr.read()}")
    return p


def finish(p: subprocess.Popen) -> tuple[int, str, str]:
    out, err = p.communicate("\n", timeout=300)
    return p.returncode, out, err


def disaggsim(work: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "disaggsim", *argv],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (what a refused command must not touch)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<folder>"
        for p in sorted(folder.rglob("*"))
    }


CONTENDERS = {
    "run": ["run", CHUNKED, "--out", "r", "--quiet", "--no-plots", *SHORT],
    "sweep": ["sweep", CHUNKED, "--param", "workload.rate_per_s=1,2", "--out", "r", "--quiet",
              "--no-plots", "--workers", "1", *SHORT],
    "compare": ["compare", CHUNKED, CHUNKED, "--out", "r", "--quiet", "--no-plots"],
    "plan": ["plan", CHUNKED, "--out", "r", "--quiet", "--no-plots"],
    "trace": ["run", CHUNKED, "--out", "r2", "--trace", "r/trace.json", "--quiet",
              "--no-plots", *SHORT],
}  # fmt: skip


@pytest.mark.parametrize("holder", ["run", "sweep"])
def test_a_second_command_into_a_held_folder_is_refused(work, holder):
    """While a run (or a sweep) works towards ``--out r``, every command that would write
    there is refused in one line naming the folder and the holder, exit 2, and touches
    nothing; the holder then writes its result as if alone."""
    p = start_holder(work, *CONTENDERS[holder])
    try:
        before = listing(work)
        assert ".r.disaggsim-lock" in before, sorted(before)
        for name, argv in CONTENDERS.items():
            if holder == "sweep" and name not in ("run", "sweep"):
                continue  # one holder is enough for the other commands
            r = disaggsim(work, *argv)
            flag = "--trace r/trace.json" if name == "trace" else "--out r"
            assert (r.returncode, r.stderr) == (
                2,
                f"disaggsim: error: {flag}: another disaggsim command (pid {p.pid}) is "
                f"writing there now; wait until it ends or give another "
                f"{'trace' if name == 'trace' else 'folder'}\n",
            ), (name, r.stderr[-2000:])
            assert listing(work) == before, name
    finally:
        rc, out, err = finish(p)
    assert rc == 0, err[-2000:]
    assert "written to r/" in out and "replaced" not in out, out[-2000:]
    names = sorted(os.listdir(work))
    assert names == ["keep.txt", "r"], names  # the lock file removed with the hold
    assert MARKER in os.listdir(work / "r")


def test_a_lock_left_by_a_killed_command_is_taken_over(work):
    """SIGKILL runs no cleanup: the holder's lock file stays. The next command takes it
    over (the system released the lock with the process) and removes it when done."""
    p = start_holder(work, *CONTENDERS["run"])
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert (work / ".r.disaggsim-lock").is_file()
    r = disaggsim(work, *CONTENDERS["run"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(work)) == ["keep.txt", "r"]


def test_a_default_output_held_is_named_and_left_clean_when_the_holder_stops(work):
    """A default ``results/<name>`` held by one run: the second is refused naming it as
    the default; the ``results/`` the holder made to hold it is removed when the holder is
    stopped (SIGTERM), with its lock."""
    argv = ["run", CHUNKED, "--quiet", "--no-plots", *SHORT]
    p = start_holder(work, *argv)
    assert sorted(os.listdir(work / "results")) == [".ci-chunked.disaggsim-lock"]
    r = disaggsim(work, *argv)
    assert (r.returncode, r.stderr) == (
        2,
        "disaggsim: error: results/ci-chunked (the default output; choose another with "
        f"--out): another disaggsim command (pid {p.pid}) is writing there now; wait until "
        "it ends or give another folder\n",
    )
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert sorted(os.listdir(work)) == ["keep.txt"]


def test_a_lock_file_disaggsim_did_not_write_is_left_alone(work):
    (work / ".r.disaggsim-lock").write_text("my notes\n")
    with pytest.raises(UserError) as e:
        with hold_folder("r"):
            pass
    assert str(e.value) == (
        "--out r: .r.disaggsim-lock beside it is a file disaggsim did not write; move it away"
    )
    assert (work / ".r.disaggsim-lock").read_text() == "my notes\n"
    assert sorted(os.listdir(work)) == [".r.disaggsim-lock", "keep.txt"]


def _result(folder: Path, text: str) -> None:
    folder.mkdir()
    (folder / "a.txt").write_text(text)
    (folder / MARKER).write_text(
        '{"written_by": "disaggsim", "command": "run", "files": ["a.txt"]}\n'
    )


def test_a_result_put_there_meanwhile_without_the_lock_is_not_replaced(work):
    """Something that takes no lock (an older disaggsim, a copy) puts a result at ``r``
    while this command works: replacing it would lose it. Both are kept, the new one in
    ``r.unplaced-XXXXXXXX``, and the line says where."""
    with hold_folder("r"):
        _result(work / "r", "theirs")
        with pytest.raises(UserError) as e:
            write_folder("r", lambda tmp: (tmp / "a.txt").write_text("mine"), "run")
    unplaced = [n for n in os.listdir(work) if n.startswith("r.unplaced-")]
    assert len(unplaced) == 1, os.listdir(work)
    assert str(e.value) == (
        "--out r: could not put the result there (another result was put there while this "
        f"command worked; both are kept); it is in {work / unplaced[0]}/"
    )
    assert (work / "r" / "a.txt").read_text() == "theirs"
    assert (work / unplaced[0] / "a.txt").read_text() == "mine"
    assert sorted(os.listdir(work)) == sorted(["keep.txt", "r", unplaced[0]])


def test_an_earlier_result_found_when_held_is_replaced_as_before(work):
    _result(work / "r", "earlier")
    with hold_folder("r") as previous:
        assert previous is not None and previous.files == ("a.txt",)
        written = write_folder("r", lambda tmp: (tmp / "b.txt").write_text("new"), "run")
    assert written.replaced is not None
    assert sorted(os.listdir(work / "r")) == [MARKER, "b.txt"]
    assert sorted(os.listdir(work)) == ["keep.txt", "r"]


def test_a_run_into_a_folder_calibrate_measures_into_is_refused(work):
    """``calibrate --out c`` writes as it measures (claim_folder ... seal_folder): held
    meanwhile, so a run into ``c`` is refused; sealed, the hold and its lock are gone."""
    from disaggsim.output import claim_folder, seal_folder

    claim_folder("c", "calibrate")
    try:
        r = disaggsim(work, "run", CHUNKED, "--out", "c", "--quiet", "--no-plots", *SHORT)
        assert (r.returncode, r.stderr) == (
            2,
            f"disaggsim: error: --out c: another disaggsim command (pid {os.getpid()}) is "
            "writing there now; wait until it ends or give another folder\n",
        )
    finally:
        seal_folder("c", "calibrate")
    assert sorted(os.listdir(work)) == ["c", "keep.txt"]
    assert os.listdir(work / "c") == [MARKER]


def test_a_lock_the_filesystem_refuses_is_one_line(work, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, how):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(UserError) as e:
        with hold_folder("r"):
            pass
    assert str(e.value) == ("--out r: cannot lock .r.disaggsim-lock beside it (No locks available)")
    assert sorted(os.listdir(work)) == ["keep.txt"]


@pytest.mark.parametrize(
    "kind, said",
    [("folder", "a folder"), ("link", "a symbolic link"), ("fifo", "a named pipe (FIFO)")],
)
def test_a_lock_path_that_is_no_file_is_named_and_left_alone(work, kind, said):
    lock = work / ".r.disaggsim-lock"
    if kind == "folder":
        lock.mkdir()
    elif kind == "link":
        lock.symlink_to(work / "keep.txt")
    else:
        os.mkfifo(lock)
    with pytest.raises(UserError) as e:
        with hold_folder("r"):
            pass
    assert str(e.value) == (
        f"--out r: .r.disaggsim-lock beside it is {said}, not a lock disaggsim made; move it away"
    )
    assert sorted(os.listdir(work)) == [".r.disaggsim-lock", "keep.txt"]
    assert (work / "keep.txt").read_text() == "a user's file\n"


# A process that holds PATH (a single file, as a command's hold_file does) until a line
# comes on its standard input.
FILE_HOLDER = """
import sys
from disaggsim.output import hold_file, prefix_owned

with hold_file(sys.argv[1], "--write-doc", prefix_owned("#"), "validation doc"):
    print("working", flush=True)
    sys.stdin.readline()
"""


def test_a_validation_doc_being_written_is_refused_before_the_work(work, capsys, monkeypatch):
    """``calibrate validate --write-doc v.md`` works about 40 s before it writes: a second
    one started meanwhile replaced the first's doc. Held, the second is refused at once,
    before validating anything."""
    from calibration import validate
    from disaggsim.cli import main

    def no_work(*args, **kwargs):
        raise AssertionError("validated while another command held the doc")

    monkeypatch.setattr(validate, "run", no_work)

    p = subprocess.Popen(
        [sys.executable, "-c", FILE_HOLDER, "v.md"],
        cwd=work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "working\n"
        argv = ["calibrate", "validate", "--gpu", "a100-80gb", "--write-doc", "v.md"]
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"disaggsim: error: --write-doc v.md: another disaggsim command (pid {p.pid}) is "
            "writing there now; wait until it ends or give another validation doc\n"
        )
    finally:
        p.communicate("\n", timeout=60)
    assert sorted(os.listdir(work)) == ["keep.txt"]
