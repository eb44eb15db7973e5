"""Whole-layer step validation: the CPU path of calibration/gpu_step_run.sh end to end
(torch layer passes → steps.csv → validate-steps table) and its bad-input errors."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="the layer timing needs torch")

from calibration import steps  # noqa: E402
from calibration.cli import main as calibrate_main  # noqa: E402
from disaggsim.hardware.profile import load_profile  # noqa: E402
from tests.device_scripts import HAVE_SHELL, run_device_script  # noqa: E402


@pytest.fixture(scope="module")
def step_run(tmp_path_factory) -> Path:
    if not HAVE_SHELL:
        pytest.skip("needs bash and timeout")
    out = tmp_path_factory.mktemp("steps")
    run_device_script("gpu_step_run.sh", out, STEPS_DEVICE="cpu")
    return out


def test_script_writes_few_files_and_every_point(step_run: Path) -> None:
    files = [p for p in step_run.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["steps.csv", "steps_run.log", "validate_steps.txt"]
    df = pd.read_csv(step_run / "steps-raw" / "steps.csv")
    assert list(df.columns) == list(steps.COLUMNS)
    # two shapes × (prefill + decode points) in eager mode on CPU, all timed
    assert len(df) == 2 * (len(steps.CPU_PREFILL) + len(steps.CPU_DECODE))
    assert set(df["mode"]) == {"eager"} and (df["median_s"] > 0).all()
    assert "validate-steps exit code 0" in (step_run / "steps_run.log").read_text()


def test_validate_steps_rows_by_hand(step_run: Path) -> None:
    raw = step_run / "steps-raw"
    df = steps.read_steps(raw)
    p = steps.predict(df, "h200-sxm", load_profile("h200-sxm"))
    eager_layer_s = load_profile("h200-sxm").engine("eager").per_layer_s
    # measured per layer = pass median / layers per pass; prediction = kernels + gap
    assert (p["measured_per_layer_s"] == df["median_s"] / df["layers_per_pass"]).all()
    assert (p["pred_per_layer_s"] - p["kernels_per_layer_s"] - eager_layer_s).abs().max() < 1e-15
    # a decode layer reads at least its weights once: (QKV + O + up + down) × 2 bytes / HBM
    h200_hbm = 4.8e12
    w8 = 2 * (4096 * (32 + 16) * 128 + 4096 * 4096 + 2 * 14336 * 4096 + 14336 * 4096)
    dec = p[(p["shape"] == "llama-3-8b-tp1") & (p["kind"] == "decode")]
    assert (dec["kernels_per_layer_s"] > w8 / h200_hbm).all()
    text = (step_run / "validate_steps.txt").read_text()
    assert re.search(r"^all\s+8\s", text, re.M), text


def test_validate_steps_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    assert calibrate_main(["validate-steps", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps.csv" in err
    (tmp_path / "steps.csv").write_text("shape,model\nx,y\n")
    assert calibrate_main(["validate-steps", str(tmp_path)]) == 2
    assert "missing column tp" in capsys.readouterr().err
