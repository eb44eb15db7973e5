"""Raw calibration files (calibration/rawio.py) under a disk that fills and after a cut
row: a row is written whole or not at all, a full disk stops the measurement in one line
(the rows before it kept), and a cut last row or a cell that is no number is dropped or
refused instead of failing inside the fit.

Before: under a full disk the harness logged ``gemm: FAILED OSError: [Errno 27] File too
large``, went on and exited 0, leaving ``gemm.csv`` with its last row cut, and ``calibrate
fit`` on that folder was a TypeError traceback ('<' between str and float).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from calibration.rawio import RawWriter, read_raw
from disaggsim.errors import UserError

ENV = {"device_name": "cpu x86_64", "driver": "", "torch_version": "2", "cuda_version": "",
       "date": "2026-12-03T00:00:00"}  # fmt: skip
TIMING = {"median_s": 1e-5, "p10_s": 9e-6, "p90_s": 2e-5, "repeats": 20, "timing": "cpu",
          "ops_per_replay": 1}  # fmt: skip


def two_rows(folder: Path) -> Path:
    w = RawWriter(folder, ENV)
    for n in (64, 128):
        w.write("gemm", {"m": 1, "n": n, "k": 64, "kind": "square"}, "bf16", "linear", TIMING)
    return folder / "gemm.csv"


def test_a_folder_whose_only_row_was_cut_is_one_line(work, tmp_path, capsys):
    """The header and a first row cut short (a full disk, a kill): ``calibrate fit`` was
    a TypeError traceback ('<' between str and float), then an IndexError."""
    from disaggsim.cli import main

    path = two_rows(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:-20])
    assert main(["calibrate", "fit", str(tmp_path), "--gpu", "h100-sxm", "--out", "p.json"]) == 2
    assert capsys.readouterr().err == (
        f"disaggsim: error: {tmp_path}: no measured row in gemm.csv (a run stopped before one)\n"
    )


def test_a_cut_last_row_is_dropped(tmp_path):
    path = two_rows(tmp_path)
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[1][:60])  # a third row cut short
    df = read_raw(tmp_path)
    assert list(df["n"]) == [64, 128]
    assert df["median_s"].dtype.kind == "f"


@pytest.mark.parametrize("column, value", [("n", "abc"), ("median_s", "1e-5x"), ("k", "[1]")])
def test_a_cell_that_is_no_number_is_one_line(tmp_path, column, value):
    path = two_rows(tmp_path)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[2].split(",")
    cells[header.index(column)] = value
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        read_raw(tmp_path)
    assert str(e.value) == (
        f"{path}: row 2: {column}: {value!r} is not a number (a raw file calibrate wrote "
        "holds numbers there)"
    )


def test_a_row_the_disk_refuses_in_part_is_cut_off_again(tmp_path, monkeypatch):
    path = two_rows(tmp_path)
    before = path.read_bytes()
    real = os.write

    def fills(fd, data):
        real(fd, bytes(data[:30]))  # part of the row, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", fills)
    with pytest.raises(UserError) as e:
        RawWriter(tmp_path, ENV).write("gemm", {"m": 2, "n": 64, "k": 64}, "bf16", "l", TIMING)
    monkeypatch.undo()
    assert str(e.value) == (
        f"{path}: could not write a measured row (No space left on device); the rows "
        f"measured before it are kept in {tmp_path}/"
    )
    assert path.read_bytes() == before
    # a new file whose first row is refused is not left empty
    monkeypatch.setattr(os, "write", fills)
    with pytest.raises(UserError):
        RawWriter(tmp_path, ENV).write("copy", {"nbytes": 64, "kind": "d2d"}, "bf16", "c", TIMING)
    monkeypatch.undo()
    assert not (tmp_path / "copy.csv").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="calibrate needs torch")
def test_a_full_disk_stops_the_measurement_in_one_line(tmp_path):
    """The real harness under RLIMIT_FSIZE (a full disk without root: a file grown past
    1,000 bytes fails with EFBIG): exit 2, one line naming the raw file, whole rows only,
    and the folder fits."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    argv = ["calibrate", "--device", "cpu", "--quick", "--ops", "gemm", "--out", "c"]
    p = subprocess.run([sys.executable, "-m", "disaggsim", *argv], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, preexec_fn=limited)  # fmt: skip
    err = [line for line in p.stderr.splitlines() if not line.startswith("[calibrate ")]
    assert p.returncode == 2 and err == [
        "disaggsim: error: c/gemm.csv: could not write a measured row (File too large); the "
        "rows measured before it are kept in c/"
    ], p.stderr[-2000:]
    text = (tmp_path / "c" / "gemm.csv").read_text()
    assert text.endswith("\n") and len(text) <= 1000
    assert len(read_raw(tmp_path / "c")) == text.count("\n") - 1


def test_a_seal_that_fails_after_a_failed_measurement_keeps_the_first_error(
    work, capsys, monkeypatch
):
    """`calibrate --out` sealed its folder in a ``finally``: where the disk refused even the
    marker written in place, the seal's OSError replaced the measurement's own one line
    (the full disk, a stop) that said what happened."""
    from calibration import harness
    from disaggsim import output
    from disaggsim.cli import main

    def measure_then_fail(*a, **k):
        raise UserError("c/gemm.csv: the disk is full (rows before it kept)")

    def seal_refused(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(harness, "run", measure_then_fail)
    monkeypatch.setattr(output, "seal_folder", seal_refused)
    assert main(["calibrate", "--device", "cpu", "--quick", "--ops", "gemm", "--out", "c"]) == 2
    err = capsys.readouterr().err
    assert err == "disaggsim: error: c/gemm.csv: the disk is full (rows before it kept)\n", err
