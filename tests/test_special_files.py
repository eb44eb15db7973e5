"""Paths that name something other than a regular file (docs/safety.md): a named pipe
(FIFO), a device, a folder, a symbolic link where disaggsim's own file should be.

Reading a named pipe blocks until another process writes to it, so each of these hung
the command for ever before (``run --trace FIFO``: the recogniser of disaggsim's own
traces opened it; ``cost --input FIFO``; ``--out`` a folder whose marker is a FIFO;
``workload.path`` a FIFO was "no such file"). Each is now one line naming the path and
what it is, exit 2, nothing written. The cases run in-process under an alarm, so a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from disaggsim.cli import main
from disaggsim.errors import UserError
from disaggsim.inputs import read_json
from disaggsim.output import MARKER
from tests.conftest import REPO

QUICK = str(REPO / "scenarios" / "quickstart.yaml")
SHORT = ["--set", "sim.duration_s=2", "--set", "sim.warmup_s=0", "--quiet", "--no-plots"]
PREFIX = "disaggsim: error: "


class _Hung(Exception):
    pass


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    (w / "keep.txt").write_text("a user's file\n")
    os.mkfifo(w / "pipe")
    monkeypatch.chdir(w)

    def hung(*_):
        raise _Hung

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)  # a case that blocks on the pipe fails here instead of hanging
    yield w
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _listing(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_fifo() else None
        for p in sorted(root.rglob("*"))
    }


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def _fifo_marker(w: Path) -> None:
    (w / "r").mkdir()
    os.mkfifo(w / "r" / MARKER)


@pytest.mark.parametrize(
    ("setup", "argv", "start"),
    [
        (None, ["run", "pipe"], "pipe: a named pipe (FIFO), not a scenario file"),
        (None, ["run", "."], ".: a folder, not a scenario file"),
        (None, ["run", QUICK, "--out", "r", "--trace", "pipe", *SHORT],
         "--trace pipe: exists and is a named pipe (FIFO); give a new trace name"),
        (_fifo_marker, ["run", QUICK, "--out", "r", *SHORT],
         "--out r: folder holds files disaggsim did not write (.disaggsim-result.json)"),
        (None, ["cost", "prefill", "--input", "pipe"],
         "cost prefill: pipe: a named pipe (FIFO), not a query table"),
        (None, ["run", QUICK, "--out", "r", *SHORT, "--set",
                "workload={kind: trace, path: {work}/pipe, format: azure}"],
         f"{QUICK}: workload.path: "),
    ],
    ids=["scenario", "scenario-folder", "trace-out", "out-marker", "cost-input",
         "workload-path"],
)  # fmt: skip
def test_a_named_pipe_is_refused_in_one_line_without_reading_it(work, capsys, setup, argv, start):
    if setup is not None:
        setup(work)
    argv = [a.replace("{work}", str(work)) for a in argv]
    before = _listing(work)
    rc, err = _cli(argv, capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(PREFIX + start), err
    if "workload.path" in start:
        assert "a named pipe (FIFO), not a trace file" in err, err
    assert _listing(work) == before


def test_a_json_file_a_user_names_may_not_be_a_pipe(work):
    """read_json (profiles, --base, MoE parameters, regression references) opened the
    pipe and waited."""
    with pytest.raises(UserError, match=r"pipe: a named pipe \(FIFO\), not a file"):
        read_json(work / "pipe", UserError)


def test_a_marker_that_is_a_symbolic_link_is_no_marker(work, capsys):
    """A marker disaggsim wrote is a regular file in the result folder; a link to a
    marker elsewhere (here one listing the user's notes) does not make the folder an
    earlier result whose listed files may be deleted."""
    (work / "elsewhere").mkdir()
    (work / "elsewhere" / MARKER).write_text(
        '{"written_by": "disaggsim", "command": "run", "files": ["notes.txt"]}'
    )
    (work / "r").mkdir()
    (work / "r" / "notes.txt").write_text("the user's notes\n")
    (work / "r" / MARKER).symlink_to(work / "elsewhere" / MARKER)
    rc, err = _cli(["run", QUICK, "--out", "r", *SHORT], capsys)
    assert rc == 2 and err.startswith(PREFIX + "--out r: folder holds files disaggsim"), err
    assert (work / "r" / "notes.txt").read_text() == "the user's notes\n"


def test_an_earlier_result_whose_listed_file_is_now_a_folder_is_refused_first(work, capsys):
    """An earlier result in which a listed name is now a folder (summary.json/ made by
    the user): the new result was renamed in, then deleting the listed 'file' raised
    IsADirectoryError: exit 2 after writing, the earlier result left hidden in
    .r.old-XXXXXXXX. Refused before the run now, as a folder with files disaggsim did
    not write."""
    rc, err = _cli(["run", QUICK, "--out", "r", *SHORT], capsys)
    assert rc == 0, err
    (work / "r" / "summary.json").unlink()
    (work / "r" / "summary.json").mkdir()
    (work / "r" / "summary.json" / "mine.txt").write_text("mine\n")
    before = _listing(work)
    rc, err = _cli(["run", QUICK, "--out", "r", *SHORT], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(PREFIX + "--out r: holds an earlier disaggsim result plus files"), err
    assert "summary.json" in err
    assert _listing(work) == before


def test_validate_checks_its_write_doc_before_the_work(work, capsys, monkeypatch):
    """`calibrate validate --write-doc keep.txt` ran the whole validation (about 40 s)
    and then refused the user's file; single-file targets are checked before the work
    (docs/safety.md). Found by the fuzz lane's --out probes."""
    from calibration import cli as calibration_cli
    from calibration import validate

    def ran(*a, **k):
        raise AssertionError("the validation ran before --write-doc was checked")

    monkeypatch.setattr(validate, "run", ran)
    rc, err = _cli(
        ["calibrate", "validate", "--gpu", "h100-sxm", "--write-doc", "keep.txt"], capsys
    )
    assert rc == 2 and err.startswith(PREFIX + "--write-doc keep.txt: exists and is not a "), err
    # the title the check recognises is the one the doc is written with
    doc = (REPO / "docs" / "validation.md").read_text().split("\n", 1)[0]
    assert doc == calibration_cli.VALIDATION_DOC_TITLE


@pytest.mark.parametrize("name", ["gemm.csv", "steps.csv"])
@pytest.mark.parametrize("verb", ["fit", "fit-steps"])
def test_calibration_raw_csv_that_is_a_named_pipe_is_one_line(work, capsys, name, verb):
    """A raw measurement folder whose CSV is a named pipe: pandas blocked on it for ever
    (`calibrate fit RAW` with RAW/gemm.csv a FIFO; the fuzz lane's note). Now one line
    naming the file and what it is, exit 2, nothing written."""
    raw = work / "raw"
    raw.mkdir()
    os.mkfifo(raw / name)
    before = _listing(work)
    rc, err = _cli(["calibrate", verb, "raw", "--gpu", "h200-sxm"], capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(PREFIX), err
    if (verb == "fit") == (name == "gemm.csv"):
        assert "a named pipe (FIFO), not a " in err and name in err, err
    assert _listing(work) == before


def test_a_profile_that_is_a_named_pipe_is_named_as_such(work, capsys):
    """`calibrate show h100-sxm --profile pipe` said 'hardware profile not found' for a
    pipe or a folder that exists (Path.is_file): it names what the path is."""
    rc, err = _cli(["calibrate", "show", "h100-sxm", "--profile", "pipe"], capsys)
    assert rc == 2 and "pipe: a named pipe (FIFO), not a " in err, err
    rc, err = _cli(["calibrate", "show", "h100-sxm", "--profile", "."], capsys)
    assert rc == 2 and ".: a folder, not a " in err, err
