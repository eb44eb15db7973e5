"""A disk that fills while disaggsim writes: one line naming what could not be written,
nothing half-written, an earlier result as it was, finished runs kept whole.

The disk is made "full" for real, without root or a tiny filesystem: the command runs in
a child process under ``RLIMIT_FSIZE`` (with SIGXFSZ ignored), so a write that would make
a file larger than the limit fails with ``EFBIG`` ("File too large"), as one past a full
disk fails with ``ENOSPC``. Before, such a write was ``disaggsim: error: Error writing
bytes to file. Detail: [errno 28] ...`` (pyarrow's words, naming no path), a ``--trace``
that did not fit exited 2 without saying the run's results had been written, and a sweep
or plan whose journal filled lost the clause saying where its finished runs were.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CHUNKED = str(REPO / "scenarios" / "ci" / "chunked.yaml")
PREFIX = "disaggsim: error: "


def _limited(limit_bytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


def cli(work: Path, *argv: str, limit_bytes: int | None = None) -> tuple[int, str, str]:
    """``disaggsim ARGV`` in a child process in ``work``; with ``limit_bytes``, no file it
    writes may grow past that many bytes."""
    p = subprocess.run(
        [sys.executable, "-m", "disaggsim", *argv],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=None if limit_bytes is None else (lambda: _limited(limit_bytes)),
    )
    return p.returncode, p.stdout, p.stderr


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones too) and a file's bytes."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def one_line(rc: int, err: str) -> str:
    assert rc == 2, (rc, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), err
    return lines[0][len(PREFIX) :]


# requests.parquet of ci-chunked is about 44 kB: 20 kB stops the result's largest file
SMALL_BYTES = 20_000


def test_a_result_the_disk_refuses_is_one_line_naming_the_out_folder(work):
    before = tree(work)
    rc, _, err = cli(work, "run", CHUNKED, "--out", "r", "--no-plots", "--quiet",
                     limit_bytes=SMALL_BYTES)  # fmt: skip
    line = one_line(rc, err)
    assert line.startswith("--out r: could not write the result (File too large"), line
    assert line.endswith("; nothing was written there"), line
    assert tree(work) == before  # no folder, no hidden temporary sibling


def test_a_refused_result_leaves_the_earlier_result_as_it_was(work):
    rc, _, err = cli(work, "run", CHUNKED, "--out", "r", "--no-plots", "--quiet")
    assert rc == 0, err
    before = tree(work)
    rc, _, err = cli(work, "run", CHUNKED, "--out", "r", "--no-plots", "--quiet",
                     "--set", "sim.duration_s=50", limit_bytes=SMALL_BYTES)  # fmt: skip
    line = one_line(rc, err)
    assert line.startswith("--out r: could not write the result (File too large"), line
    assert line.endswith("; the earlier result there is as it was"), line
    assert tree(work) == before


def test_a_trace_the_disk_refuses_says_the_results_were_written(work):
    """The results (largest file about 44 kB) fit under 60 kB, the trace (about 700 kB)
    does not: the line names --trace and says where the results are, since it exits 2
    after writing them."""
    rc, _, err = cli(work, "run", CHUNKED, "--out", "r", "--no-plots", "--quiet",
                     "--trace", "t.json", limit_bytes=60_000)  # fmt: skip
    line = one_line(rc, err)
    assert line.startswith("--trace t.json: could not write the trace (File too large)"), line
    assert line.endswith("; the run's results were written to r/"), line
    assert not (work / "t.json").exists()
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []
    assert (work / "r" / "summary.json").is_file()


def test_a_journal_the_disk_refuses_keeps_whole_runs_and_resumes(work):
    """A sweep's journal line is about 2.5 kB: under 7 kB the third run cannot be kept.
    The line says which file and how many runs are kept; the journal holds only whole
    lines, and --resume writes the table an uninterrupted sweep writes."""
    grid = ["--param", "workload.rate_per_s=1,2,3,4", "--no-plots", "--quiet", "--workers", "1"]
    rc, _, err = cli(work, "sweep", CHUNKED, "--out", "s", *grid, limit_bytes=7_000)
    line = one_line(rc, err)
    assert line.startswith("s.partial/runs.jsonl: could not keep a finished run there "
                           "(File too large); "), line  # fmt: skip
    kept = int(line.split("; ", 1)[1].split(" of 4 runs finished")[0])
    assert 1 <= kept < 4, line
    text = (work / "s.partial" / "runs.jsonl").read_text()
    assert text.endswith("\n") and text.count("\n") == kept  # whole lines only
    assert not (work / "s").exists()
    rc, out, err = cli(work, "sweep", CHUNKED, "--out", "s", *grid, "--resume")
    assert rc == 0, err
    assert f"{kept} reused from s.partial/" in out
    rc, _, err = cli(work, "sweep", CHUNKED, "--out", "whole", *grid)
    assert rc == 0, err
    assert (work / "s" / "sweep.csv").read_bytes() == (work / "whole" / "sweep.csv").read_bytes()
    assert not (work / "s.partial").exists()


def test_a_marker_the_disk_refuses_leaves_the_earlier_marker_whole(tmp_path, monkeypatch):
    """A marker is replaced whole or not at all: written in place, a full disk left it
    cut, and the folder then read as one holding files disaggsim did not write."""
    from disaggsim import output

    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    output._write_marker(folder, "run", ["a.json"])
    before = (folder / output.MARKER).read_bytes()
    real = Path.write_text

    def fills(self, text, *a, **k):
        real(self, text[:10], *a, **k)  # part of it, then the disk is full
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", fills)
    with pytest.raises(OSError):
        output._write_marker(folder, "run", ["a.json", "t.json"])
    monkeypatch.undo()
    assert (folder / output.MARKER).read_bytes() == before
    assert sorted(os.listdir(folder)) == [output.MARKER, "a.json"]
    assert output.read_marker(folder) == output.Previous(command="run", files=("a.json",))


def test_a_claimed_folder_is_sealed_in_place_when_no_new_marker_fits(tmp_path, monkeypatch):
    """``calibrate --out`` writes as it measures, then lists its files in the marker. On a
    full disk a new marker does not fit beside the old one: it is written over the old
    one in place (else the measured files stayed unlisted, and the next command refused
    the folder as holding files disaggsim did not write)."""
    from disaggsim import output

    folder = tmp_path / "c"
    output.claim_folder(folder, "calibrate", "--out")
    (folder / "gemm.csv").write_text("op\n")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "_write_marker", full)
    output.seal_folder(folder, "calibrate")
    monkeypatch.undo()
    assert output.read_marker(folder) == output.Previous(command="calibrate", files=("gemm.csv",))
    assert sorted(os.listdir(folder)) == [output.MARKER, "gemm.csv"]
