"""The simulator never imports torch: only ``calibration/`` may. Every module of the
``disaggsim`` package is imported, and a scenario is simulated, in a fresh interpreter
where importing torch fails; the check is then that nothing tried."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

BLOCK_TORCH = """
import importlib.abc, sys
tried = []
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            tried.append(name)
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
"""

IMPORT_ALL = """
import importlib, pkgutil
import disaggsim
names = [m.name for m in pkgutil.walk_packages(disaggsim.__path__, "disaggsim.")]
for name in names:
    if name.endswith("__main__"):
        continue
    importlib.import_module(name)
assert len(names) > 50, names
"""

RUN = """
from disaggsim.run import simulate
result = simulate(SCENARIO, ["workload.num_requests=1500"])
assert result.summary.num_requests > 0
"""


def _run_blocked(body: str) -> subprocess.CompletedProcess:
    code = BLOCK_TORCH + body + "\nassert not tried, tried\nprint('torch never imported')\n"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_every_disaggsim_module_imports_without_torch():
    r = _run_blocked(IMPORT_ALL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch never imported" in r.stdout


def test_a_scenario_runs_without_torch():
    body = RUN.replace("SCENARIO", repr(str(REPO / "scenarios/quickstart.yaml")))
    r = _run_blocked(body)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch never imported" in r.stdout


def test_the_block_would_see_an_import_of_torch():
    """The check can fail: a body that imports torch is caught (whether or not torch is
    installed)."""
    r = _run_blocked("import torch\n")
    assert r.returncode != 0
    assert "torch is blocked" in r.stderr
