"""The shipped profiles are what the documented refit writes from the shared data.

``python -m calibration.fit_public --data ../shared/data --engines`` (``docs/calibration.md``,
"Reproducing the shipped files") rewrites every hardware profile, the H200's prior and
``engines.json``. Here it runs whole, into a temporary folder, and every file it writes
must equal the shipped one (88 s of wall time on a 2-core box, 2026-12-04,
docs/calibration.md): the same keys, strings and lists, and every number within ``REL``
relative (``ABS`` absolute, for parameters at a solver's zero, ~1e-12 s). On one machine
the refit writes the same bytes every time (docs/calibration.md); the tolerance is for
another CPU model, whose OpenBLAS kernels round differently (one BLAS thread against two
moved decode-attention fits by at most 5e-4 relative here), while a stale or hand-edited
profile still fails. The MoE refit (``python -m calibration.fit_moe``) is checked in
tests/test_moe_reproducible.py, a file of its own so that the two refits run on two test
workers at once.
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
REL = 2e-3  # relative, per number
ABS = 1e-9  # absolute, for a parameter at the solver's zero


def _differences(written: object, shipped: object, where: str = "") -> list[str]:
    """Where two parsed JSON documents differ beyond the tolerance."""
    if isinstance(written, bool) or isinstance(shipped, bool):
        return [] if written == shipped else [where]
    if isinstance(written, (int, float)) and isinstance(shipped, (int, float)):
        ok = abs(written - shipped) <= max(ABS, REL * max(abs(written), abs(shipped)))
        return [] if ok else [f"{where}: {written!r} vs {shipped!r}"]
    if isinstance(written, dict) and isinstance(shipped, dict):
        if written.keys() != shipped.keys():
            return [f"{where}: keys {sorted(written.keys() ^ shipped.keys())}"]
        return [d for k in written for d in _differences(written[k], shipped[k], f"{where}.{k}")]
    if isinstance(written, list) and isinstance(shipped, list):
        if len(written) != len(shipped):
            return [f"{where}: {len(written)} vs {len(shipped)} items"]
        return [
            d
            for i, (a, b) in enumerate(zip(written, shipped, strict=True))
            for d in _differences(a, b, f"{where}[{i}]")
        ]
    return [] if written == shipped else [f"{where}: {written!r} vs {shipped!r}"]


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
        found = _differences(json.loads(text), json.loads(twin.read_text()))
        if found:
            differ.append(f"{twin.relative_to(REPO)} ({'; '.join(found[:3])})")
    assert not differ, (
        "shipped files differ from what the documented refit writes (rerun python -m "
        "calibration.fit_public --data ../shared/data --engines and ship what it writes): "
        + ", ".join(differ)
    )


def test_shipped_files_hold_no_run_date() -> None:
    # a date of the run in a written file would make every later refit differ from it
    files = [*(HARDWARE / "profiles").glob("*.json"), *PRIORS.glob("*.json"),
             *(HARDWARE / "moe").glob("*.json")]  # fmt: skip
    for path in [*files, HARDWARE / "engines.json"]:
        prov = json.loads(path.read_text()).get("provenance") or {}
        assert "date" not in prov, path.name


def test_the_comparison_catches_a_stale_number() -> None:
    shipped = {"a": {"x": 14.876, "zero": 1.0e-12, "name": "fit"}, "b": [1.0, 2.0]}
    assert _differences(shipped, {"a": {"x": 14.877, "zero": 1.07e-12, "name": "fit"},
                                  "b": [1.0, 2.0]}) == []  # fmt: skip
    assert _differences(shipped, {"a": {"x": 12.3, "zero": 1.0e-12, "name": "fit"},
                                  "b": [1.0, 2.0]})  # fmt: skip
    assert _differences(shipped, {"a": {"x": 14.876, "zero": 1.0e-12, "name": "fit2"},
                                  "b": [1.0, 2.0]})  # fmt: skip
    assert _differences(shipped, {"a": {"x": 14.876, "zero": 1.0e-12}, "b": [1.0, 2.0]})
