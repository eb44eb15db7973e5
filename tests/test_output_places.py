"""Where a result may not go, and what happens when the system refuses to put it there
(docs/safety.md, "Where results go"): found by fuzzing ``--out`` over nested results,
immutable and busy folders, mount points and unexpanded ``~`` (2026-12-03, second
session). A finished result is never deleted because it could not be moved into place:
it is kept in a visible ``NAME.unplaced-XXXXXXXX`` beside the target and the one error
line names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from disaggsim import output
from disaggsim.cli import main
from disaggsim.errors import UserError
from disaggsim.output import MARKER, json_owned, write_file, write_folder
from tests.conftest import REPO

QUICK = str(REPO / "scenarios" / "quickstart.yaml")
SHORT = ["--set", "sim.duration_s=2", "--set", "sim.warmup_s=0", "--quiet", "--no-plots"]
PREFIX = "disaggsim: error: "


def _listing(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    got = capsys.readouterr()
    return rc, got.out, got.err


def _earlier(work: Path, name: str = "r") -> Path:
    folder = work / name
    folder.mkdir()
    (folder / "summary.json").write_text("{}\n")
    (folder / MARKER).write_text(
        '{"written_by": "disaggsim", "command": "sweep", "files": ["summary.json"]}\n'
    )
    return folder


def _render(tmp: Path) -> None:
    (tmp / "a.txt").write_text("new result\n")


@pytest.mark.parametrize("out", ["r/sub", "r/sub/deeper"])
def test_a_result_folder_inside_an_earlier_result_is_refused_first(work, capsys, out):
    """`sweep --out r/sub` with r an earlier result wrote a result inside it: r then held a
    folder its marker did not list, and replacing r later was refused."""
    _earlier(work)
    before = _listing(work)
    rc, _, err = _cli(["run", QUICK, *SHORT, "--out", out], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{PREFIX}--out {out}: lies inside {work / 'r'}, an earlier "), err
    assert "disaggsim sweep result" in err
    assert _listing(work) == before


@pytest.mark.parametrize("flag", ["--out", "--trace"])
@pytest.mark.parametrize("path", ["~", "~/r", "~someone/r"])
def test_an_unexpanded_tilde_is_refused(work, capsys, flag, path):
    """`--out=~/r` reaches the program unexpanded: a folder named "~" was made in the
    working folder (a later `rm -r ~...` aims at the home folder)."""
    argv = ["run", QUICK, *SHORT, flag, path] + (["--out", "r"] if flag == "--trace" else [])
    rc, _, err = _cli(argv, capsys)
    assert rc == 2, err
    assert (
        err
        == f"{PREFIX}{flag} {path}: starts with '~', which the shell did not expand; give the full path\n"
    )
    assert sorted(os.listdir(work)) == ["keep.txt"]


def test_a_file_name_starting_with_tilde_is_a_name(work, capsys):
    rc, _, err = _cli(["run", QUICK, *SHORT, "--out", "r", "--trace", "~t.json"], capsys)
    assert rc == 0, err
    assert (work / "~t.json").is_file()


def test_a_mount_point_is_refused_before_the_run(work, capsys, monkeypatch):
    """An empty mounted volume as --out: the result was simulated, then the rename over
    the mount point failed (EBUSY/EXDEV) and the result was deleted."""
    (work / "disk").mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) == str(work / "disk") or real(p))
    rc, _, err = _cli(["run", QUICK, *SHORT, "--out", "disk"], capsys)
    assert rc == 2, err
    assert err.startswith(f"{PREFIX}--out disk: is a mount point"), err
    assert os.listdir(work / "disk") == []


def _unplaced(folder: Path, name: str) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f"{name}.unplaced-")]


def test_a_folder_that_changed_during_the_work_keeps_the_result_beside_it(work):
    """A user's file dropped into --out while the simulation ran: the re-check refused
    the folder and the finished result was deleted. Now kept and named."""

    def render(tmp: Path) -> None:
        _render(tmp)
        (work / "r").mkdir()
        (work / "r" / "notes.txt").write_text("mine\n")

    with pytest.raises(UserError) as e:
        write_folder(work / "r", render, command="run")
    kept = _unplaced(work, "r")
    assert len(kept) == 1
    assert str(e.value) == (
        f"--out {work / 'r'}: could not put the result there (folder holds files disaggsim "
        f"did not write (notes.txt); give a new or empty folder); it is in {kept[0]}/"
    )
    assert (kept[0] / "a.txt").read_text() == "new result\n"
    assert (kept[0] / MARKER).is_file()
    assert os.listdir(work / "r") == ["notes.txt"]
    assert not [p for p in work.iterdir() if p.name.startswith(".")]  # no hidden litter


@pytest.mark.parametrize("earlier", [False, True])
def test_a_rename_the_system_refuses_keeps_the_result_and_the_earlier_state(
    work, monkeypatch, earlier
):
    """An immutable or busy --out (rename EPERM/EBUSY): the result was deleted, an earlier
    result's empty `.r.old-XXXX` sibling was left behind, and the error named a hidden
    temporary path without the flag."""
    if earlier:
        _earlier(work)
    else:
        (work / "r").mkdir()
    before = _listing(work / "r")
    real = os.rename

    def rename(src, dst):
        if Path(src) == work / "r" or Path(dst) == work / "r":
            raise PermissionError(1, "Operation not permitted")
        return real(src, dst)

    monkeypatch.setattr(output.os, "rename", rename)
    with pytest.raises(UserError) as e:
        write_folder(work / "r", _render, command="run")
    kept = _unplaced(work, "r")
    assert len(kept) == 1
    assert str(e.value) == (
        f"--out {work / 'r'}: could not put the result there (Operation not permitted); "
        f"it is in {kept[0]}/"
    )
    assert (kept[0] / "a.txt").read_text() == "new result\n"
    assert _listing(work / "r") == before
    assert not [p for p in work.iterdir() if p.name.startswith(".")]


def test_earlier_files_the_system_will_not_delete_are_named(work, monkeypatch):
    """An earlier result's listed file that cannot be deleted: exit 2 after the new result
    was written, the earlier one hidden in `.r.old-XXXX` unnamed. Now the new result
    stands and the note names where the rest of the earlier one is."""
    _earlier(work)
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name == "summary.json" and ".old-" in self.parent.name:
            raise PermissionError(1, "Operation not permitted")
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    written = write_folder(work / "r", _render, command="run")
    assert written.left_in is not None and written.left_in.parent == work
    assert (written.left_in / "summary.json").read_text() == "{}\n"
    assert (work / "r" / "a.txt").read_text() == "new result\n"
    assert written.note().endswith(
        f"(replaced the earlier disaggsim sweep result there: 1 file; some of its files "
        f"could not be deleted and are in {written.left_in}/)"
    )


def test_a_file_the_system_will_not_replace_is_kept_beside_it(work, monkeypatch):
    owned = json_owned("mine")
    (work / "p.json").write_text('{"mine": 1}\n')
    real = os.replace

    def replace(src, dst):
        if Path(dst) == work / "p.json":
            raise PermissionError(1, "Operation not permitted")
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", replace)
    with pytest.raises(UserError) as e:
        write_file(work / "p.json", lambda t: t.write_text('{"mine": 2}\n'), "--out", owned)
    kept = _unplaced(work, "p.json")
    assert len(kept) == 1 and kept[0].read_text() == '{"mine": 2}\n'
    assert str(e.value) == (
        f"--out {work / 'p.json'}: could not put the result there (Operation not "
        f"permitted); it is in {kept[0]}"
    )
    assert (work / "p.json").read_text() == '{"mine": 1}\n'


def test_local_workers_beyond_four_per_cpu_are_refused(work, capsys, monkeypatch):
    """`--workers 100000` started one process per task sent (each ~130-160 MB): a sweep of
    thousands of points would exhaust the machine's memory."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv = ["sweep", QUICK, "--param", "workload.rate_per_s=1,2", *SHORT, "--out", "s"]
    rc, _, err = _cli([*argv, "--workers", "9"], capsys)
    assert rc == 2, err
    assert err == (
        f"{PREFIX}--workers 9: at most 8 worker processes on this machine (4 per CPU, 2 "
        "CPUs; each holds the simulator: docs/safety.md)\n"
    )
    assert sorted(os.listdir(work)) == ["keep.txt"]


def _raw_run(work: Path) -> Path:
    import shutil

    raw = work / "raw"
    shutil.copytree(REPO / "calibration" / "runs" / "h200-2026-11-29", raw)
    return raw


def test_calibrate_fit_says_it_replaced_the_profile_of_a_raw_folder(work, capsys):
    """`calibrate fit RAW --gpu ...` without --out writes RAW/<gpu>.json: in a checkout's
    calibration/runs/<run>/ that is the profile fitted on the device, replaced by a local
    refit while the command printed only "wrote ..."."""
    raw = _raw_run(work)
    rc, out, err = _cli(["calibrate", "fit", "raw", "--gpu", "h200-sxm"], capsys)
    assert rc == 0, err
    assert "profile written to raw/h200_sxm.json (replaced the earlier profile there)" in out
    (raw / "h200_sxm.json").write_text("a user's notes\n")
    rc, out, err = _cli(["calibrate", "fit", "raw", "--gpu", "h200-sxm"], capsys)
    assert rc == 2
    assert err == (
        f"{PREFIX}raw/h200_sxm.json (the default output; choose another with --out): exists "
        "and is not a profile disaggsim wrote; give a new name or remove it\n"
    )
    assert (raw / "h200_sxm.json").read_text() == "a user's notes\n"
