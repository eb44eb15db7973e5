"""The shipped profiles are what the documented refits write from the shared data.

``python -m calibration.fit_public --data ../shared/data --engines`` (``docs/calibration.md``,
"Reproducing the shipped files") rewrites every hardware profile, the H200's prior and
``engines.json``; ``python -m calibration.fit_moe --data ../shared/data`` the MoE
parameters. Here both run whole, into a temporary folder, and every file they write must
equal the shipped one byte for byte (about 30 s and 15 s on this 2-core box).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

HARDWARE = REPO / "disaggsim" / "hardware"
PRIORS = REPO / "calibration" / "priors"


def _shipped_twin(written: Path, out: Path) -> Path:
    rel = written.relative_to(out)
    if rel.parts[0] == "priors":
        return PRIORS / rel.name
    if rel.name == "engines.json":
        return HARDWARE / "engines.json"
    return HARDWARE / "profiles" / rel.name


@pytest.mark.slow
def test_refit_writes_the_shipped_files(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "refit"
    # the command as documented; a BLAS thread count in the environment must not matter
    # (fit_public restarts itself on one thread)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "calibration.fit_public", "--data", str(shared_data),
         "--engines", "--out-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = sorted(out.rglob("*.json"))
    shipped = {_shipped_twin(p, out) for p in written}
    # every profile, the H200 prior, engines.json
    assert shipped == {*(HARDWARE / "profiles").glob("*.json"), *PRIORS.glob("*.json"),
                       HARDWARE / "engines.json"}  # fmt: skip
    differ = []
    for path in written:
        text = path.read_text()
        # the measured H200 profile names the prior it was built over: the out-dir's copy
        text = text.replace(str(out / "priors"), "calibration/priors")
        twin = _shipped_twin(path, out)
        if text != twin.read_text():
            differ.append(str(twin.relative_to(REPO)))
    assert not differ, (
        "shipped files differ from what the documented refit writes (rerun python -m "
        "calibration.fit_public --data ../shared/data --engines and ship what it writes): "
        + ", ".join(differ)
    )


@pytest.mark.slow
def test_moe_refit_writes_the_shipped_file(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "h100_sxm.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "calibration.fit_moe", "--data", str(shared_data), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text() == (HARDWARE / "moe" / "h100_sxm.json").read_text(), (
        "disaggsim/hardware/moe/h100_sxm.json differs from what python -m calibration.fit_moe "
        "--data ../shared/data writes"
    )


def test_shipped_files_hold_no_run_date() -> None:
    # a date of the run in a written file would make every later refit differ from it
    files = [*(HARDWARE / "profiles").glob("*.json"), *PRIORS.glob("*.json"),
             *(HARDWARE / "moe").glob("*.json")]  # fmt: skip
    for path in [*files, HARDWARE / "engines.json"]:
        prov = json.loads(path.read_text()).get("provenance") or {}
        assert "date" not in prov, path.name
