"""A command stopped by SIGTERM or SIGHUP (``kill``, ``timeout``, a CI job cancelled, a
terminal closed) cleans up as Ctrl-C does (docs/safety.md): the result folder being
written into its hidden temporary sibling is removed, the earlier state is left as it
was, and the exit code is 128 + the signal.

Before, the signal's default action killed the process mid-write and left
``.r.tmp-XXXXXXXX`` (the result's files so far) in the user's folder (found by sending
signals to runs and sweeps as they wrote, /tmp/fuzz/interrupt.py of the fuzz lane). Each
case runs in a child process, which sends the signal to itself from inside the writer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

QUICK = str(REPO / "scenarios" / "quickstart.yaml")

CHILD = """
import os, signal, sys
import disaggsim.run as run_mod
from disaggsim.cli import main

# a hangup as a closing terminal sends it, even where the test runner was started under
# nohup (SIGHUP ignored, inherited; disaggsim then rightly keeps it ignored)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

real = run_mod.write_folder

def write_folder(path, render, command, flag="--out"):
    def render_then_signal(tmp):
        render(tmp)  # every file is in the temporary sibling now
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return real(path, render_then_signal, command, flag)

run_mod.write_folder = write_folder
sys.exit(main(["run", sys.argv[2], "--out", "r", "--quiet", "--no-plots",
               "--set", "sim.duration_s=2", "--set", "sim.warmup_s=0"]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_a_result_is_written_leaves_nothing_half_written(tmp_path, sig):
    (tmp_path / "keep.txt").write_text("a user's file\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, sig, QUICK],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 128 + getattr(signal, sig), (p.returncode, p.stderr[-2000:])
    assert p.stderr == f"disaggsim: stopped by {sig}; nothing half-written\n", p.stderr[-2000:]
    assert sorted(x.name for x in Path(tmp_path).iterdir()) == ["keep.txt"]
