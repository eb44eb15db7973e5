"""End-to-end CPU run of the calibration harness: sweep → raw CSV → fit → profile → ops."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "torch", reason="the calibration harness needs torch (pip install 'disaggsim[calibrate]')"
)

from calibration import harness
from calibration.cli import main as calibrate_main
from calibration.fit import blocks_separable
from calibration.rawio import COLUMNS, read_raw
from disaggsim.costmodel import ops
from disaggsim.hardware.profile import load_profile
from tests.device_scripts import HAVE_SHELL, REPO, run_device_script


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("raw")
    harness.run("cpu", out)
    return out


def test_raw_csvs_have_every_column_and_positive_times(raw_dir: Path) -> None:
    df = read_raw(raw_dir)
    assert set(df["op"]) == {
        "gemm",
        "decode_attention",
        "prefill_attention",
        "elementwise",
        "copy",
        "allreduce",
    }
    assert list(df.columns) == list(COLUMNS)
    assert (df["median_s"] > 0).all()
    assert (df["p10_s"] <= df["median_s"]).all() and (df["median_s"] <= df["p90_s"]).all()
    assert (df["repeats"] >= 20).all()
    assert df["torch_version"].notna().all() and df["date"].notna().all()
    # attention rows record which kernel ran; every kernel the device runs is timed, the
    # FlexAttention path included (one point on CPU)
    attn = df[df["op"].str.contains("attention")]
    assert set(attn["backend"]) <= {"sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"}
    assert "flex" in set(attn["backend"]) and "sdpa-flash" in set(attn["backend"])
    # the CPU path runs the graph code path without graphs (test_time_kernel_batches_...)
    kern = df[df["op"].isin(["gemm", "elementwise"])]
    assert (kern["timing"] == "cpu").all() and (kern["ops_per_replay"] >= 1).all()
    ew = df[df["op"] == "elementwise"]
    assert {"add", "silu_mul"} <= set(ew["kind"]) and (ew["nbytes"] > 0).all()
    # copies span KB to MB and include the paged-block gather
    cp = df[df["op"] == "copy"]
    assert {"d2d", "gather"} <= set(cp["kind"])
    assert cp["nbytes"].min() <= 4096 and cp["nbytes"].max() >= 1 << 20
    # of two block sizes, so that a per-block cost is told from the bandwidth
    g = cp[cp["kind"] == "gather"]
    assert (g["nbytes"] / g["num_blocks"]).nunique() == 2
    assert blocks_separable(g["nbytes"], g["num_blocks"])
    # all-reduce ran over two real ranks (gloo processes on CPU), one row per message size
    ar = df[df["op"] == "allreduce"]
    assert set(ar["num_gpus"]) == {2}
    assert set(ar["backend"]) == {"torch.distributed.all_reduce gloo"}
    assert sorted(ar["nbytes"]) == sorted(harness.cpu_sweep().allreduce_bytes)


def test_time_kernel_batches_short_calls_like_a_graph_replay() -> None:
    # a call far shorter than a replay's target runs max_ops times per timed run and the row
    # is one call's share; robust to machine load (the estimate, a median of three list
    # appends, would have to exceed GRAPH_TARGET_S / 5.5, 36 µs, for n to drop below 6)
    import torch

    calls: list[int] = []

    def make_call(i: int):
        return lambda: calls.append(i)

    t = harness.time_kernel(
        torch, False, make_call, working_bytes=2**30, warmup=1, repeats=5, max_ops=6
    )
    assert t["timing"] == "cpu" and t["ops_per_replay"] == 6 and t["repeats"] == 5
    # one input copy: the working set already exceeds L2, so every call uses copy 0
    assert set(calls) == {0}
    # first call + 3 estimate calls (warm-up 1, repeats 3) + (1 warm-up + 5 repeats) x 6
    assert len(calls) == 1 + 4 + 6 * 6
    assert 0 < t["p10_s"] <= t["median_s"] <= t["p90_s"]


def test_fit_writes_a_loadable_measured_profile(raw_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "prof.json"
    rc = calibrate_main(["fit", str(raw_dir), "--gpu", "h200-sxm", "--out", str(out)])
    assert rc == 0
    prof = load_profile("h200-sxm", path=out)
    prov = prof.provenance
    assert prov["kind"] == "measured"
    assert "gemm.bf16" in prov["measured"] and "copy.gather" in prov["measured"]
    # two ranks measured: all-reduce over 2 is fitted; 4 and 8 and the engines come from
    # the base profile, which for h200-sxm (shipped profile measured) is the prior
    # fit_public writes beside
    assert "allreduce.2" in prov["measured"] and "allreduce.2" not in prov["carried"]
    assert {"allreduce.4", "allreduce.8", "graph_replay"} <= set(prov["carried"])
    assert "allreduce:torch.distributed.all_reduce gloo" in prov["backends"]
    assert prov["base_profile"] == "calibration/priors/h200_sxm.json"
    assert prov["base_kind"] == "prior"
    prior = json.loads((REPO / "calibration" / "priors" / "h200_sxm.json").read_text())
    raw_prof = json.loads(out.read_text())
    for world in ("4", "8"):
        assert raw_prof["ops"]["allreduce"][world] == prior["ops"]["allreduce"][world]
    assert raw_prof["ops"]["allreduce"]["2"] != prior["ops"]["allreduce"]["2"]
    assert prof.fit_error["allreduce.2"]["n"] == len(harness.cpu_sweep().allreduce_bytes)
    # SDPA's flash kernel is fitted as its own attention backend; auto's candidates stay
    assert "sdpa-flash" in raw_prof["attention_backends"]
    assert raw_prof["attention_auto"] == prior["attention_auto"]
    assert prof.fit_error["gemm.bf16"]["n"] > 0
    # the fitted parameters drive the ops formulas, and the times are in the measured range
    df = read_raw(raw_dir)
    g = df[df["op"] == "gemm"]
    pred = ops.gemm_time_s(prof.peaks, prof.gemm_params("bf16"), g["m"], g["n"], g["k"])
    ratio = np.asarray(pred) / g["median_s"].to_numpy()
    # CPU timings of tiny GEMMs on a shared, loaded machine are noisy: the fit is held to
    # the measured order of magnitude and to its own rows, not to an accuracy
    assert np.isfinite(ratio).all() and 0.1 < np.median(ratio) < 10
    assert prof.fit_error["gemm.bf16"]["n"] == len(g)


def test_cli_run_needs_device_and_out(capsys) -> None:
    assert calibrate_main([]) == 2
    assert "--device" in capsys.readouterr().err


def test_fit_on_missing_raw_dir_is_one_line_error(tmp_path: Path, capsys) -> None:
    rc = calibrate_main(["fit", str(tmp_path / "nope"), "--gpu", "h100-sxm"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "nope" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not HAVE_SHELL, reason="needs bash and timeout")
def test_gpu_run_script_cpu_path(tmp_path: Path) -> None:
    # the sweep itself is tested above (raw_dir); here the script's stages, on two sweeps
    run_device_script("gpu_run.sh", tmp_path, CAL_DEVICE="cpu", CAL_OPS="gemm,copy")
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert 1 <= len(files) <= 13
    for p in files:
        rel = p.relative_to(tmp_path)
        assert len(rel.parts) <= 2 and all(re.fullmatch(r"[A-Za-z0-9._-]+", s) for s in rel.parts)
    prof = json.loads((tmp_path / "h200_sxm.json").read_text())
    assert prof["provenance"]["kind"] == "measured"
    log = (tmp_path / "run.log").read_text()
    assert "sweep exit code 0" in log and "fit exit code 0" in log
    assert "steps exit code 0" in log and "validate-steps exit code 0" in log
    # the CPU path runs the graph-timing code without graphs; every row says how it was timed
    raw = read_raw(tmp_path / "raw")
    assert set(raw["timing"]) == {"cpu"}
    assert (tmp_path / "steps" / "steps.csv").is_file()
    assert "step model" in (tmp_path / "validate_steps.txt").read_text()
