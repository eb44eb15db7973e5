"""Standard output closed by its reader (``disaggsim ... | head``): the command's files are
written whole, and it exits quietly with 141, the status a shell reports for a process
SIGPIPE ended (as ``yes | head``). Before, rich turned the closed pipe into exit 1 (the
status of a regression that drifted, or a validation target missed) and a plain print
was a BrokenPipeError traceback. A character the terminal's encoding lacks is printed as
an escape (it was a UnicodeEncodeError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

CHUNKED = str(REPO / "scenarios" / "ci" / "chunked.yaml")


def closed_stdout(work, *argv: str) -> tuple[int, str]:
    """``disaggsim ARGV`` whose standard output's reader has gone before it prints."""
    with subprocess.Popen(
        [sys.executable, "-m", "disaggsim", *argv],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as p:
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # the reader is gone: the first write fails with EPIPE
        err = p.stderr.read()
        return p.wait(timeout=300), err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", CHUNKED, "--out", "r", "--no-plots", "--quiet"],  # rich's console
        ["calibrate", "show", "h100-sxm"],  # plain prints
    ],
    ids=["run", "calibrate-show"],
)
def test_a_closed_stdout_exits_quietly_with_141(work, argv):
    rc, err = closed_stdout(work, *argv)
    assert (rc, err) == (141, ""), (rc, err[-2000:])
    if argv[0] == "run":
        names = sorted(p.name for p in (work / "r").iterdir())
        assert "summary.json" in names and "requests.parquet" in names, names


def test_a_character_the_terminal_cannot_show_is_escaped(work):
    """Under ``PYTHONIOENCODING=ascii`` the sweep's last line ("2 points × 1 seed") was a
    UnicodeEncodeError traceback, exit 1, after its table was written."""
    argv = ["sweep", CHUNKED, "--param", "workload.rate_per_s=1,2", "--out", "s", "--quiet",
            "--no-plots", "--workers", "1", "--set", "sim.duration_s=10", "--set",
            "sim.warmup_s=1"]  # fmt: skip
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    p = subprocess.run([sys.executable, "-m", "disaggsim", *argv], cwd=work, env=env,
                       capture_output=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.decode("ascii").strip() == "2 runs (2 points \\xd7 1 seed) written to s/"
