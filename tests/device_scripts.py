"""Running the one-shot device scripts (``calibration/gpu_*.sh``) on their CPU path, as
the device tool runs them: from the repo root, ``OUT`` set, this venv's python first on
``PATH`` and no ``PYTHONPATH`` (the installed package must be enough)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HAVE_SHELL = shutil.which("bash") is not None and shutil.which("timeout") is not None


def run_device_script(script: str, out: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``bash calibration/<script>`` with ``OUT=out`` and the extra ``env``; fail the
    test with the output's tail when it exits non-zero."""
    full_env = dict(
        os.environ,
        OUT=str(out),
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        **env,
    )
    full_env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", f"calibration/{script}"],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc
