"""Output safety (docs/safety.md): disaggsim writes only into a folder it creates, an empty
one, or an earlier disaggsim result; it replaces an earlier result and says so, and never
deletes or overwrites a file it did not write. The table-driven CLI cases live in
tests/test_bad_input.py; these test the rule itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from disaggsim.cli import main
from disaggsim.errors import UserError
from disaggsim.output import (
    MARKER,
    check_file,
    check_folder,
    claim_folder,
    json_owned,
    read_marker,
    seal_folder,
    write_file,
    write_folder,
)
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
SHORT = ["--set", "sim.duration_s=20", "--set", "sim.warmup_s=2", "--quiet", "--no-plots"]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (hidden ones included)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def render(names: dict[str, str]):
    def write(tmp: Path) -> None:
        for n, text in names.items():
            (tmp / n).write_text(text)

    return write


def test_new_folder_gets_files_and_marker(tmp_path):
    w = write_folder(tmp_path / "a" / "b", render({"x.txt": "1", "y.txt": "2"}), "run")
    assert w.replaced is None
    assert sorted(os.listdir(tmp_path / "a" / "b")) == [MARKER, "x.txt", "y.txt"]
    assert read_marker(tmp_path / "a" / "b").files == ("x.txt", "y.txt")
    assert os.listdir(tmp_path / "a") == ["b"]  # no temporary sibling left


def test_empty_folder_is_used(tmp_path):
    (tmp_path / "out").mkdir()
    write_folder(tmp_path / "out", render({"x.txt": "1"}), "run")
    assert (tmp_path / "out" / "x.txt").read_text() == "1"


def test_second_write_replaces_only_the_listed_files_and_says_so(tmp_path):
    out = tmp_path / "out"
    write_folder(out, render({"x.txt": "old", "links.parquet": "old"}), "run")
    w = write_folder(out, render({"x.txt": "new"}), "sweep")
    assert w.replaced is not None and w.replaced.command == "run"
    assert sorted(w.replaced.files) == ["links.parquet", "x.txt"]
    assert "replaced the earlier disaggsim run result there: 2 files" in w.note()
    assert sorted(os.listdir(out)) == [MARKER, "x.txt"]  # the stale file went with it
    assert (out / "x.txt").read_text() == "new"
    assert os.listdir(tmp_path) == ["out"]


def test_user_file_added_to_a_result_blocks_the_write(tmp_path):
    out = tmp_path / "out"
    write_folder(out, render({"x.txt": "old"}), "run")
    (out / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    with pytest.raises(UserError, match=r"files it did not write \(notes.txt\)"):
        write_folder(out, render({"x.txt": "new"}), "run")
    assert tree(tmp_path) == before


def test_failed_render_leaves_the_earlier_result(tmp_path):
    out = tmp_path / "out"
    write_folder(out, render({"x.txt": "old"}), "run")
    before = tree(tmp_path)

    def broken(tmp: Path) -> None:
        (tmp / "x.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_folder(out, broken, "run")
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("make", "target", "fragment"),
    [
        (lambda d: None, ".", "names an existing folder"),
        (lambda d: None, "..", "names an existing folder"),
        (lambda d: None, "/", "names an existing folder"),
        (lambda d: None, "{cwd}", "is the working folder or a folder above it"),
        (lambda d: None, "{parent}", "is the working folder or a folder above it"),
        (lambda d: (d / "f.txt").write_text("x"), "f.txt", "exists and is not a folder"),
        (lambda d: (d / "f.txt").write_text("x"), "f.txt/out", "is a file, not a folder"),
        (lambda d: (d / "f.txt").write_text("x"), "f.txt/a/b", "is a file, not a folder"),
        (lambda d: (d / "u").mkdir() or (d / "u" / "k").write_text(""), "u", "did not write"),
        (lambda d: (d / "t").mkdir() or (d / "l").symlink_to(d / "t"), "l", "symbolic link"),
        (lambda d: None, "x" * 250, "name longer than"),
        (lambda d: (d / "m").mkdir() or (d / "m" / MARKER).write_text("{"), "m", "did not write"),
    ],
)
def test_folder_targets_refused(tmp_path, monkeypatch, make, target, fragment):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    make(work)
    target = target.format(cwd=work, parent=tmp_path)
    before = tree(tmp_path)
    with pytest.raises(UserError, match=fragment) as e:
        check_folder(target)
    assert "\n" not in str(e.value) and str(e.value).startswith("--out ")
    assert tree(tmp_path) == before


def test_checkout_root_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="did not write"):
        check_folder(REPO)


def test_unwritable_location_fails_before_work(monkeypatch, tmp_path):
    import tempfile

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", deny)
    with pytest.raises(UserError, match=r"cannot write in .*Permission denied"):
        check_folder(tmp_path / "new" / "out")
    assert list(tmp_path.iterdir()) == []


def test_single_file_rule(tmp_path):
    owned = json_owned("format", "points")
    user = tmp_path / "ref.json"
    user.write_text('{"mine": 1}')
    with pytest.raises(UserError, match="not a reference disaggsim wrote"):
        write_file(user, lambda t: t.write_text("{}"), "--reference-dir", owned, "reference")
    assert user.read_text() == '{"mine": 1}'
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")  # not even text: not ours either
    with pytest.raises(UserError, match="not a reference"):
        check_file(tmp_path / "bin.json", "--x", owned, "reference")
    ours = tmp_path / "ours.json"
    w = write_file(ours, lambda t: t.write_text('{"format": 1, "points": []}'), "--x", owned)
    assert w.replaced is None and w.note() == f"written to {ours}"
    w = write_file(ours, lambda t: t.write_text('{"format": 2, "points": []}'), "--x", owned)
    assert w.replaced is not None and "replaced" in w.note()
    assert json.loads(ours.read_text())["format"] == 2
    assert sorted(os.listdir(tmp_path)) == ["bin.json", "ours.json", "ref.json"]


def test_file_written_into_a_result_folder_joins_its_manifest(tmp_path):
    out = tmp_path / "raw"
    write_folder(out, render({"gemm.csv": "1"}), "calibrate")
    write_file(out / "gpu.json", lambda t: t.write_text("{}"), "--out", json_owned())
    assert read_marker(out).files == ("gemm.csv", "gpu.json")
    check_folder(out)  # still a clean earlier result: a rerun may replace it


def test_claim_and_seal_stream_folder(tmp_path):
    out = tmp_path / "raw"
    assert claim_folder(out, "calibrate") is None
    (out / "a.csv").write_text("1")
    seal_folder(out, "calibrate")
    assert read_marker(out).files == ("a.csv",)
    previous = claim_folder(out, "calibrate")
    assert previous is not None and previous.files == ("a.csv",)
    assert os.listdir(out) == [MARKER]


# ------------------------------------------------------------------ through the CLI


def test_second_run_into_the_same_out_reports_the_replacement(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "out"
    argv = ["run", str(CI / "chunked.yaml"), "--out", str(out), *SHORT]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "replaced" not in first
    first_summary = (out / "summary.json").read_text()
    assert main([*argv, "--set", "seed=5"]) == 0
    second = capsys.readouterr().out
    assert f"written to {out}/ (replaced the earlier disaggsim run result there" in second
    assert (out / "summary.json").read_text() != first_summary
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_run_into_a_user_folder_deletes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("user data")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old.txt").write_text("user data")
    before = tree(tmp_path)
    for out in (".", "..", "results", str(tmp_path), "keep.txt", "keep.txt/x"):
        rc = main(["run", str(CI / "chunked.yaml"), "--out", out, *SHORT])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith("disaggsim: error: --out")
    for name in ("..", "."):
        rc = main(["run", str(CI / "chunked.yaml"), "--set", f"name={name}", *SHORT])
        err = capsys.readouterr().err
        assert rc == 2 and "name" in err
    assert tree(tmp_path) == before


def test_trace_never_overwrites_a_user_file(tmp_path, capsys):
    user = tmp_path / "trace.json"
    user.write_text('{"traceEvents": []}')
    out = tmp_path / "out"
    rc = main(["run", str(CI / "chunked.yaml"), "--out", str(out), "--trace", str(user), *SHORT])
    assert rc == 2 and "--trace" in capsys.readouterr().err
    assert user.read_text() == '{"traceEvents": []}' and not out.exists()
    t2 = tmp_path / "t2.json"
    argv = ["run", str(CI / "chunked.yaml"), "--out", str(out), "--trace", str(t2), *SHORT]
    assert main(argv) == 0
    assert main(argv) == 0
    assert "replaced the earlier trace there" in capsys.readouterr().out


def test_regress_update_refuses_a_foreign_reference_file(tmp_path, capsys):
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "chunked.json").write_text('{"mine": true}')
    before = tree(tmp_path)
    rc = main(["regress", "--update", "--reference-dir", str(ref), "--only", "chunked",
               "--ci-dir", str(CI), "--param", "workload.rate_per_s=1", "--quiet",
               "--workers", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "not a reference disaggsim wrote" in err and err.count("\n") == 1
    assert tree(tmp_path) == before


def test_calibrate_fit_refuses_a_foreign_profile_path(tmp_path, capsys):
    target = tmp_path / "notes.json"
    target.write_text("[1, 2]")
    rc = main(["calibrate", "fit", str(REPO / "calibration" / "runs" / "h200-2026-11-29"),
               "--gpu", "h200-sxm", "--out", str(target)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "not a profile disaggsim wrote" in err
    assert target.read_text() == "[1, 2]"


@pytest.mark.parametrize("where", ["out", "working-folder"])
def test_a_path_that_is_not_utf8_is_refused_before_the_run(tmp_path, capsys, monkeypatch, where):
    # a latin-1 byte in --out or in the working folder's name: the run simulated, then the
    # Parquet writer could not name the path (a UnicodeEncodeError traceback, exit 1; a
    # sweep's kept runs not said, an empty results/ left)
    work = tmp_path / ("w\udcff" if where == "working-folder" else "w")
    work.mkdir()
    monkeypatch.chdir(work)
    out = ["--out", "r\udcfe"] if where == "out" else []
    rc = main(["sweep", str(CI / "chunked.yaml"), "--param", "workload.rate_per_s=1,2",
               "--workers", "1", *SHORT, *out])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    if where == "out":
        assert err == (
            "disaggsim: error: --out r\\xfe: holds bytes that are not UTF-8 (disaggsim writes "
            "under UTF-8 names only: its Parquet writer cannot name others); give a path "
            "whose names are UTF-8\n"
        )
    else:
        assert err.startswith("disaggsim: error: results/ci-chunked-sweep (the default output")
        assert f"lies in {tmp_path}/w\\xff, whose name holds bytes that are not UTF-8" in err
    assert os.listdir(work) == []


def test_a_failed_write_removes_the_folders_it_made_above(tmp_path):
    # the default output's results/ was left behind, empty, by a command that wrote nothing
    def fails(tmp: Path) -> None:
        raise OSError(28, "No space left on device")

    # (one line naming the output: tests/test_full_disk.py)
    full = "could not write the (result|trace) [(]No space left on device[)]"
    with pytest.raises(UserError, match=full):
        write_folder(tmp_path / "results" / "deep" / "x", fails, command="run")
    with pytest.raises(UserError, match=full):
        write_file(tmp_path / "a" / "t.json", fails, "--trace", json_owned("x"), "trace")
    assert os.listdir(tmp_path) == []
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "mine.txt").write_text("a user's file\n")
    with pytest.raises(UserError, match=full):
        write_folder(tmp_path / "results" / "deep" / "x", fails, command="run")
    assert os.listdir(tmp_path / "results") == ["mine.txt"]


@pytest.mark.parametrize(
    "name", ["a\x00b", "x\x1bq", "\udcff", "n" * 256], ids=["nul", "escape", "surrogate", "long"]
)
def test_a_marker_listing_a_name_no_file_can_have_is_no_marker(tmp_path, name):
    """A marker edited to list a name with a NUL byte passed as an earlier result: the
    write ran, then deleting that name was a ValueError traceback and the earlier result
    was left hidden in ``.r.old-XXXXXXXX``. A name disaggsim could not have written (a
    control character, a lone surrogate, longer than NAME_MAX) makes the folder one of
    files disaggsim did not write: refused before any work, nothing touched."""
    r = tmp_path / "r"
    write_folder(r, render({"x.txt": "1"}), "run")
    doc = json.loads((r / MARKER).read_text())
    doc["files"].append(name)
    (r / MARKER).write_text(json.dumps(doc))
    before = tree(tmp_path)
    assert read_marker(r) is None
    with pytest.raises(UserError) as e:
        write_folder(r, render({"y.txt": "2"}), "run")
    # the marker is said to be damaged, not listed among a user's files alone
    assert str(e.value).endswith(
        "folder holds files disaggsim did not write (.disaggsim-result.json, x.txt) (its "
        ".disaggsim-result.json is not a marker disaggsim wrote: edited or damaged); give a "
        "new or empty folder"
    ), e.value
    assert tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["r"]
