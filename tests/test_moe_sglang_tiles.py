"""SGLang's Triton fused_moe as two parameter sets: a worker whose (local experts, shard
width, GPU, dtype) has a shipped tuned tile config (hardware/moe/sglang_triton_configs.csv)
runs the tuned set, every other worker the default-tile set; the choice is made once per
worker, and the fit classifies the public table's rows by the same list."""

from __future__ import annotations

import csv
import json
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from disaggsim.costmodel.moe import build_moe_worker_cost
from disaggsim.costmodel.moe_params import (
    SGLANG_DEVICE_NAMES,
    has_tuned_config,
    load_moe_params,
    moe_params_from_dict,
    moe_params_path,
)
from disaggsim.hardware.profile import ProfileError
from tests.conftest import SHARED_DATA

CONFIGS = Path(str(resources.files("disaggsim.hardware") / "moe" / "sglang_triton_configs.csv"))
SELECTOR = {
    "bf16": "",
    "fp8": ",dtype=fp8_w8a8",
    "fp8-block": ",dtype=fp8_w8a8,block_shape=[128, 128]",
}


def _rows() -> list[dict[str, str]]:
    lines = [ln for ln in CONFIGS.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def test_each_listed_file_names_its_key() -> None:
    # the key columns are the file's own name (SGLang's get_config_file_name), in a
    # configs/triton_* folder the loader searches (or in the folder-less configs/ that
    # PR #5955 moved into triton_3_1_0), with the commit it was seen at
    rows = _rows()
    assert rows
    for r in rows:
        name = f"E={r['num_experts']},N={r['n']},device_name={r['device_name']}"
        name += SELECTOR[r["dtype"]] + ".json"
        moved = r["triton_folder"] == "triton_3_1_0" and r["path"] == (
            f"python/sglang/srt/layers/moe/fused_moe_triton/configs/{name}"
        )
        assert moved or r["path"].endswith(f"/configs/{r['triton_folder']}/{name}"), r["path"]
        assert re.fullmatch(r"triton_\d+_\d+_\d+", r["triton_folder"])
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"])
        assert r["device_name"] in SGLANG_DEVICE_NAMES.values()


def test_the_key_is_exactly_sglangs_lookup() -> None:
    # Mixtral-8x7B at moe TP2 on the H100 (E=8, N=7168): a shipped file; TP1 (N=14336) none
    assert has_tuned_config("sglang", 8, 7168.0, "h100-sxm", "bf16")
    assert not has_tuned_config("sglang", 8, 14336.0, "h100-sxm", "bf16")
    assert has_tuned_config("sglang", 8, 7168.0, "h200-sxm", "bf16")  # its own H200 file
    assert not has_tuned_config("sglang", 8, 7168.0, "a100-80gb", "bf16")
    assert not has_tuned_config("sglang", 8, 7168.0, "h100-sxm", "fp8")  # another dtype
    assert not has_tuned_config("vllm", 8, 7168.0, "h100-sxm", "bf16")  # SGLang's lookup only
    assert not has_tuned_config("sglang", 8, 7168.5, "h100-sxm", "bf16")
    assert not has_tuned_config("sglang", 8, 7168.0, "no-such-gpu", "bf16")
    assert not has_tuned_config("sglang", 8, 7168.0, "h100-sxm", "mxfp4")


def test_a_worker_takes_the_set_of_its_shape(tmp_path: Path) -> None:
    params = load_moe_params("h100-sxm")
    tuned = params.gemm("bf16", "sglang", tuned=True)
    default = params.gemm("bf16", "sglang")
    assert tuned != default
    tp2 = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine="sglang")
    assert tp2.expert_tuned_tiles and tp2._expert_params == tuned
    # TP1 (N=14336: no file) on an H200, where the weights fit on one GPU
    tp1 = build_moe_worker_cost("mixtral-8x7b", "h200-sxm", 1, engine="sglang")
    assert not tp1.expert_tuned_tiles
    assert tp1._expert_params.max_eff == default.max_eff  # carried to the H200, untuned
    vllm = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine="vllm")
    assert not vllm.expert_tuned_tiles
    assert vllm._expert_params == params.gemm("bf16", "vllm")
    # tuned tiles run a long prompt's expert GEMMs faster than the default tiles would
    # (the table: 547 vs 200 TFLOP/s at 16k tokens)
    raw = json.loads(Path(params.path).read_text())
    raw.pop("grouped_gemm_tuned")
    (tmp_path / "no_tuned.json").write_text(json.dumps(raw))
    untuned = build_moe_worker_cost(
        "mixtral-8x7b", "h100-sxm", 2, engine="sglang", moe_params=tmp_path / "no_tuned.json"
    )
    assert untuned._expert_params == default  # a file without a tuned set: default tiles
    long_prompt = (1, 8192, 8192 * 8193 / 2.0)
    assert tp2.prefill_time_s(*long_prompt) < 0.8 * untuned.prefill_time_s(*long_prompt)


def test_the_file_refuses_an_unknown_tuned_framework() -> None:
    raw = json.loads(moe_params_path("h100-sxm").read_text())
    raw["grouped_gemm_tuned"] = {"vllm": raw["grouped_gemm_tuned"]["sglang"]}
    with pytest.raises(
        ProfileError, match=r"grouped_gemm_tuned\.vllm: unknown \(allowed: sglang\)"
    ):
        moe_params_from_dict(raw, "x.json")


@pytest.mark.skipif(
    not (SHARED_DATA / "kernels" / "aiconfigurator" / "h100_sxm" / "moe").is_dir(),
    reason="needs ../shared/data",
)
def test_the_table_runs_two_rates_split_by_the_list() -> None:
    """SGLang 0.5.14's H100 table: Mixtral-8x7B at 16k tokens, all experts on the rank, runs
    its expert GEMMs at 547 TFLOP/s at moe TP2 (listed) and 200 at TP1 (no file); the tuned
    set predicts the listed rows (the TP2 rows above 1,024 tokens: measured over predicted
    1.00 in median, 0.93-1.10; the one set of before 2026-12-03 predicted them 2.06x slow
    in median), the default set would predict them about 2x slow."""
    from calibration import fit_moe as fm

    moe = fm.moe_rows(SHARED_DATA, ("sglang",))
    mix = moe[(moe.hidden_size == 4096) & (moe.inter_size == 14336) & (moe.moe_ep_size == 1)
              & (moe.dtype == "bf16") & (moe.distribution == "balanced")]  # fmt: skip
    tuned = mix.groupby("moe_tp_size").tuned_tiles.all()
    assert tuned[2] and not tuned[1] and not tuned[16]
    params = load_moe_params("h100-sxm")
    tp2 = mix[(mix.moe_tp_size == 2) & (mix.num_tokens > 1024)]
    ratio = tp2.meas_s.to_numpy() / fm._gg(params.gemm("bf16", "sglang", True), tp2)
    assert abs(np.median(ratio) - 1.0) < 0.05, ratio
    default = fm._gg(params.gemm("bf16", "sglang"), tp2) / tp2.meas_s.to_numpy()
    assert np.median(default) > 1.8
