"""``disaggsim calibrate``'s fitting subcommands fit on one BLAS thread, in-process.

The module entries (``python -m calibration.fit_public``, ``calibration.fit_moe``) restart
themselves with one-thread BLAS settings; ``disaggsim calibrate`` cannot (numpy is loaded,
and these tests call it in-process), so ``calibration/cli.py`` limits the loaded thread
pools around each fitting command (``calibration.fit.one_blas_thread``). Each test first
raises every pool to more threads than one (threadpoolctl sets a count above the box's
cores too), so it fails wherever a command fits without the limit, on any core count.
"""

from __future__ import annotations

import json

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import calibration.fit
from disaggsim.cli import main
from tests.conftest import REPO
from tests.test_calibration_reproducible import _differences

RUN = REPO / "calibration" / "runs" / "h200-2026-11-29"
OUTER_THREADS = 3


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_calibrate_fit_fits_on_one_blas_thread_and_writes_the_module_entrys_profile(
    tmp_path, monkeypatch
) -> None:
    seen: list[list[int]] = []
    solve = calibration.fit._least_squares_log

    def spy(*args, **kwargs):
        seen.append(_blas_threads())
        return solve(*args, **kwargs)

    monkeypatch.setattr(calibration.fit, "_least_squares_log", spy)
    out = tmp_path / "h200_sxm.json"
    import scipy.linalg  # noqa: F401  (its OpenBLAS under the outer limit too)

    with threadpool_limits(limits=OUTER_THREADS):
        assert set(_blas_threads()) == {OUTER_THREADS}
        rc = main(["calibrate", "fit", str(RUN), "--gpu", "h200-sxm", "--out", str(out)])
        after = _blas_threads()
    assert rc == 0
    assert seen, "the fit ran no least-squares solve"
    # numpy's and scipy's OpenBLAS both, every solve on one thread
    assert all(len(threads) >= 2 and set(threads) == {1} for threads in seen), seen
    assert set(after) == {OUTER_THREADS}  # the limit ends with the command
    # the shipped H200 profile is what `python -m calibration.fit_public` writes from this
    # run over the prior (docs/calibration.md); byte-identical on this box, within the
    # reproducibility test's tolerance on another CPU
    written = json.loads(out.read_text())
    shipped_path = REPO / "disaggsim" / "hardware" / "profiles" / "h200_sxm.json"
    shipped = json.loads(shipped_path.read_text())
    written["provenance"]["raw_dir"] = shipped["provenance"]["raw_dir"]  # the path given
    assert _differences(written, shipped) == []


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("argv", "module", "function"),
    [
        (["calibrate", "validate", "--gpu", "a100-80gb"], "calibration.validate", "run"),
        (
            ["calibrate", "fit-steps", str(RUN), "--gpu", "h200-sxm"],
            "calibration.steps",
            "graph_layer_fit",
        ),
    ],
)
def test_other_fitting_subcommands_run_on_one_blas_thread(
    argv: list[str], module: str, function: str, monkeypatch
) -> None:
    import importlib

    seen: list[list[int]] = []

    def stub(*args, **kwargs):
        seen.append(_blas_threads())
        raise _Stop

    monkeypatch.setattr(importlib.import_module(module), function, stub)
    with threadpool_limits(limits=OUTER_THREADS), pytest.raises(_Stop):
        main(argv)
    assert seen and set(seen[0]) == {1}, seen
