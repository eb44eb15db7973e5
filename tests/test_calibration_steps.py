"""Whole-layer step validation: the CPU path of calibration/gpu_step_run.sh end to end
(torch layer passes → steps.csv → validate-steps table) and its bad-input errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch", reason="the layer timing needs torch")

from calibration import steps
from calibration.cli import main as calibrate_main
from disaggsim.hardware.profile import load_profile
from disaggsim.output import MARKER, read_marker
from tests.device_scripts import HAVE_SHELL, run_device_script


@pytest.fixture(scope="module")
def step_run(tmp_path_factory) -> Path:
    if not HAVE_SHELL:
        pytest.skip("needs bash and timeout")
    out = tmp_path_factory.mktemp("steps")
    run_device_script("gpu_step_run.sh", out, STEPS_DEVICE="cpu")
    return out


def test_script_writes_few_files_and_every_point(step_run: Path) -> None:
    files = [p for p in step_run.rglob("*") if p.is_file() and p.name != MARKER]
    assert sorted(p.name for p in files) == ["steps.csv", "steps_run.log", "validate_steps.txt"]
    assert read_marker(step_run / "steps-raw").files == ("steps.csv",)
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
    # measured per layer = pass median / layers per pass; prediction = kernels (eager passes:
    # bare torch, no serving engine; graph passes add the GPU's graph_replay.per_layer_s)
    assert (p["measured_per_layer_s"] == df["median_s"] / df["layers_per_pass"]).all()
    assert (p["pred_per_layer_s"] - p["kernels_per_layer_s"]).abs().max() < 1e-15
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


def _synthetic_passes(
    out: Path, per_layer_s: dict[str, float], noise: float, device: str = "NVIDIA H200 (synthetic)"
) -> pd.DataFrame:
    """steps.csv of both shapes × both modes, timed as the step model's kernels per layer
    (× lognormal noise) plus a known per-layer cost per mode, 4 layers per pass."""
    pts = [("prefill", 1, 512), ("prefill", 1, 2048), ("prefill", 4, 1024)] + [
        ("decode", b, c) for b in (1, 8, 64, 256) for c in (512, 4096)
    ]
    rows = []
    for label, model, tp, *_ in steps.SHAPES:
        for mode in ("eager", "cuda-graphs"):
            for kind, b, n in pts:
                row = dict.fromkeys(steps.COLUMNS, "")
                row.update(
                    shape=label, model=model, tp=tp, mode=mode, kind=kind, batch=b, tokens=n,
                    layers_per_pass=4, median_s=1.0, p10_s=1.0, p90_s=1.0, repeats=20,
                    device_name=device, torch_version="0", date="2026-11-29",
                )  # fmt: skip
                rows.append(row)
    df = pd.DataFrame(rows, columns=list(steps.COLUMNS))
    kern = steps.predict(df, "h200-sxm", load_profile("h200-sxm"))["kernels_per_layer_s"]
    rng = np.random.default_rng(3)
    extra = df["mode"].map(per_layer_s).to_numpy(float)
    df["median_s"] = 4 * (kern.to_numpy() * np.exp(rng.normal(0, noise, len(df))) + extra)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "steps.csv", index=False)
    return df


def test_fit_steps_recovers_the_graph_layer_cost_and_writes_the_profile(
    tmp_path: Path, capsys
) -> None:
    raw = tmp_path / "raw"
    df = _synthetic_passes(raw, {"eager": 40e-6, "cuda-graphs": 6e-6}, noise=0.0)
    out = tmp_path / "prof.json"
    assert calibrate_main(["fit-steps", str(raw), "--gpu", "h200-sxm", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "graph_replay.per_layer_s = 6.00 us" in printed
    assert "eager passes beside (not written): 40.00 us" in printed
    prof = load_profile("h200-sxm", path=out)
    shipped = load_profile("h200-sxm")
    assert prof.graph_layer_s == pytest.approx(6e-6, rel=1e-4)
    # everything else is the starting profile's
    assert prof.gemm_params("bf16") == shipped.gemm_params("bf16")
    assert prof.attention_backends == shipped.attention_backends
    err = prof.fit_error["graph_replay"]
    assert err["n"] == int((df["mode"] == "cuda-graphs").sum())
    assert err["median_ape"] < 1e-6 and err["held_out"] == "shapes"
    prov = prof.provenance
    assert "steps.csv" in prov["graphs_from"] and "synthetic" in prov["graphs_from"]
    assert "graph_replay" not in prov["carried"]


@pytest.mark.parametrize("verb", ["fit-steps", "validate-steps"])
def test_passes_of_another_gpu_are_refused(tmp_path: Path, capsys, verb) -> None:
    # as `calibrate fit` refuses a raw run of another GPU: H100 passes fitted as an H200
    # gave an h200-sxm profile of H100 timings, silently
    raw = tmp_path / "raw"
    _synthetic_passes(raw, {"eager": 40e-6, "cuda-graphs": 6e-6}, 0.0, "NVIDIA H100 80GB HBM3")
    assert calibrate_main([verb, str(raw), "--gpu", "h200-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "measured on NVIDIA H100 80GB HBM3, not --gpu h200-sxm" in err, err
    assert sorted(p.name for p in raw.iterdir()) == ["steps.csv"]


def test_fit_steps_with_noise_generalises_across_shapes(tmp_path: Path) -> None:
    _synthetic_passes(tmp_path, {"eager": 30e-6, "cuda-graphs": 4e-6}, noise=0.03)
    f = steps.graph_layer_fit(tmp_path, "h200-sxm", load_profile("h200-sxm"))
    assert f["per_layer_s"] == pytest.approx(4e-6, abs=3e-6)
    assert f["error"]["held_out_median_ape"] < 0.05
    # a model that misses no kernel time gets no graph cost: never negative
    _synthetic_passes(tmp_path, {"eager": 0.0, "cuda-graphs": 0.0}, noise=0.0)
    assert steps.graph_layer_fit(tmp_path, "h200-sxm")["per_layer_s"] == pytest.approx(0, abs=1e-12)


def test_fit_steps_without_graph_passes_is_one_line(step_run: Path, capsys) -> None:
    # the CPU run times eager passes only
    assert calibrate_main(["fit-steps", str(step_run / "steps-raw"), "--gpu", "h200-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no cuda-graphs rows" in err
    assert "fit-steps: skipped" in (step_run / "steps_run.log").read_text()
