"""The MoE / MLA / DeepEP fits: the fitter recovers known parameters through the very
formulas the step model sums, and the shipped parameters hold against the public H100
tables (figures derived by hand in ../shared/data/README.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.fit import fit_generic
from calibration.fit_moe import _a2a, _gg, _mla_dec, deepep_rows, mla_rows, moe_rows
from disaggsim.costmodel.moe import grouped_gemm_time_s
from disaggsim.costmodel.moe_params import GroupedGemmParams, load_moe_params
from tests.conftest import SHARED_DATA


@pytest.fixture(scope="module")
def data():
    if not (SHARED_DATA / "kernels" / "aiconfigurator" / "h100_sxm" / "moe").is_dir():
        pytest.skip("needs ../shared/data (AIConfigurator H100 MoE tables)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def trtllm(data):
    return moe_rows(data, ("trtllm",))


@pytest.fixture(scope="module")
def params():
    return load_moe_params("h100-sxm")


def _ape(pred, meas):
    return np.abs(np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)


def test_fitter_recovers_grouped_gemm_parameters_from_synthetic_times():
    true = GroupedGemmParams(launch_s=2.5e-5, max_eff=0.55, half_sat=80.0, mem_eff=0.85)
    rng = np.random.default_rng(7)
    tokens = rng.choice([1, 8, 64, 512, 4096, 32768], 400).astype(float)
    experts = rng.choice([2, 8, 32, 128], 400).astype(float)
    touched = np.minimum(experts, tokens)
    meas = grouped_gemm_time_s(true, 989e12, 3.35e12, tokens, touched, 4096.0, 1536.0, 2.0)

    def model(x, idx):
        p = GroupedGemmParams(*x)
        return grouped_gemm_time_s(
            p, 989e12, 3.35e12, tokens[idx], touched[idx], 4096.0, 1536.0, 2.0
        )

    x, err = fit_generic(
        model,
        meas,
        [[1e-5, 0.3, 30.0, 0.6]],
        [1e-7, 0.01, 0.5, 0.05],
        [1e-3, 1.0, 1e4, 1.0],
        held_out=False,
    )
    assert x == pytest.approx([2.5e-5, 0.55, 80.0, 0.85], rel=0.02)
    assert err.median_ape < 1e-3


def test_shipped_parameters_are_fitted_to_the_public_tables(params):
    assert params.provenance["kind"] == "fitted-public"
    for op in ("grouped_gemm.fp8-block", "mla_decode.bf16", "all_to_all.low_latency.dispatch"):
        e = params.fit_error[op]
        assert e["held_out"] and e["held_out_median_ape"] is not None


def test_grouped_gemm_against_trtllm_deepseek_shape(trtllm, params):
    d = trtllm
    ds = d[
        (d.fw == "trtllm")
        & (d.hidden_size == 7168)
        & (d.num_experts == 256)
        & (d.distribution == "balanced")
        & (d.dtype == "fp8-block")
    ]
    err = _ape(_gg(params.gemm("fp8-block"), ds), ds.meas_s)
    assert np.median(err) < 0.25
    # EP scaling: more EP ranks never slower, predicted as measured (16384 tokens)
    big = ds[(ds.num_tokens == 16384) & (ds.moe_tp_size == 1)].sort_values("moe_ep_size")
    pred = _gg(params.gemm("fp8-block"), big)
    assert np.all(np.diff(pred) < 0) and np.all(np.diff(big.meas_s.to_numpy()) < 0)
    # one token reads 8 experts x 44 MB (fp8): 0.19 ms measured at EP1
    one = ds[(ds.num_tokens == 1) & (ds.moe_ep_size == 1) & (ds.moe_tp_size == 1)]
    assert float(_gg(params.gemm("fp8-block"), one)[0]) == pytest.approx(0.192e-3, rel=0.3)


def test_mla_decode_against_trtllm_and_sglang_bf16(data, params):
    gen = mla_rows(data, "generation")
    for fw in ("trtllm", "sglang"):
        d = gen[(gen.fw == fw) & (gen.kv == "bf16")]
        assert np.median(_ape(_mla_dec(params.decode("bf16"), d), d.meas_s)) < 0.15
    # reads over 1 GB run near 3 TB/s: bytes = B x (step+1) x 576 x 2
    d = gen[(gen.fw == "trtllm") & (gen.kv == "bf16") & (gen.num_heads == 16)]
    d = d[d.ctx * 576 * 2 > 1e9]
    pred = _mla_dec(params.decode("bf16"), d)
    assert np.median(d.ctx * 1152 / pred) == pytest.approx(3.0e12, rel=0.15)


@pytest.mark.parametrize("mode", ["normal", "low_latency"])
def test_deepep_against_one_and_many_nodes(data, params, mode):
    d = deepep_rows(data)
    for (phase, nodes), g in d[d["mode"] == mode].groupby(["phase", "node_num"]):
        err = _ape(_a2a(params.all_to_all[mode][phase], g), g.meas_s)
        assert np.median(err) < 0.3, (phase, nodes)
    # the README's figures: low-latency dispatch at 128 tokens per rank on 1 / 8 nodes
    if mode == "low_latency":
        ll = d[(d["mode"] == mode) & (d.phase == "dispatch") & (d.num_token == 128)]
        ll = ll[(ll.hidden_size == 7168) & (ll.num_experts == 256)]
        for nodes, us in ((1, 37e-6), (8, 167e-6)):
            row = ll[ll.node_num == nodes].head(1)
            pred = float(_a2a(params.all_to_all[mode]["dispatch"], row)[0])
            assert pred == pytest.approx(us, rel=0.3)


def test_power_law_rows_are_slower_and_predicted_slower(trtllm, params):
    d = trtllm
    d = d[(d.fw == "trtllm") & (d.dtype == "bf16") & (d.num_tokens >= 1024) & (d.moe_ep_size >= 8)]
    key = [
        "hidden_size",
        "inter_size",
        "num_experts",
        "topk",
        "moe_tp_size",
        "moe_ep_size",
        "num_tokens",
    ]
    bal = d[d.distribution == "balanced"].set_index(key)
    pl = d[d.distribution == "power_law_1.2"].set_index(key)
    both = bal.join(pl, how="inner", suffixes=("_b", "_p"))
    assert len(both) > 100
    assert (both.meas_s_p > both.meas_s_b).mean() > 0.9
    pred_b = _gg(params.gemm("bf16"), bal.loc[both.index].reset_index())
    pred_p = _gg(params.gemm("bf16"), pl.loc[both.index].reset_index())
    assert (pred_p > pred_b).mean() > 0.9
    ratio_meas = (both.meas_s_p / both.meas_s_b).to_numpy()
    ratio_pred = pred_p / pred_b
    assert np.median(ratio_pred / ratio_meas) == pytest.approx(1.0, abs=0.35)
    assert isinstance(both, pd.DataFrame)
