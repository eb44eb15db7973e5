"""The MoE / MLA / DeepEP fits: the fitter recovers known parameters through the very
formulas the step model sums, and the shipped parameters hold against the public H100
tables (figures derived by hand in ../shared/data/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.fit import KeptResults, fit_generic
from calibration.fit_moe import (
    _a2a,
    _gg,
    _mla_dec,
    deepep_rows,
    fitted_rows,
    kernel_comparison,
    m_range_check,
    mla_rows,
    moe_rows,
    slower_than_more_work,
    tuning_cache_shared,
    untuned_summary,
)
from disaggsim.costmodel.moe import build_moe_worker_cost, grouped_gemm_time_s
from disaggsim.costmodel.moe_params import (
    GroupedGemmParams,
    load_moe_params,
    moe_params_from_dict,
    moe_params_path,
)
from disaggsim.hardware.profile import ProfileError
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
    true = GroupedGemmParams(
        launch_s=2.5e-5,
        max_eff=0.85,
        half_sat=250.0,
        mem_eff=0.85,
        width_half_sat=800.0,
        token_eff=0.5,
        expert_s=3e-7,
    )
    rng = np.random.default_rng(7)
    tokens = rng.choice([1, 8, 64, 512, 4096, 32768], 600).astype(float)
    experts = rng.choice([2, 8, 32, 128], 600).astype(float)
    width = rng.choice([96.0, 384.0, 1536.0, 7168.0], 600)
    layer = tokens / rng.choice([1.0, 2.0, 8.0], 600)  # tokens x top-k / EP
    touched = np.minimum(experts, tokens)
    meas = grouped_gemm_time_s(
        true, 989e12, 3.35e12, tokens, touched, 4096.0, width, 2.0, True, layer
    )

    def model(x, idx):
        p = GroupedGemmParams(*x)
        return grouped_gemm_time_s(
            p, 989e12, 3.35e12, tokens[idx], touched[idx], 4096.0, width[idx], 2.0, True,
            layer[idx],
        )  # fmt: skip

    x, err = fit_generic(
        model,
        meas,
        [[1e-5, 0.5, 60.0, 0.6, 300.0, 0.2, 1e-6]],
        [1e-7, 0.01, 0.5, 0.05, 1.0, 0.01, 1e-10],
        [1e-3, 1.0, 1e4, 1.0, 1e5, 1.0, 1e-4],
        held_out=False,
    )
    assert x == pytest.approx([2.5e-5, 0.85, 250.0, 0.85, 800.0, 0.5, 3e-7], rel=0.02)
    assert err.median_ape < 1e-3


def _old_file() -> dict:
    """The shipped file as schema 1 wrote it before the width and token terms."""
    raw = json.loads(moe_params_path("h100-sxm").read_text())
    raw.pop("grouped_gemm_frameworks", None)
    for p in raw["grouped_gemm"].values():
        p.pop("width_half_sat", None)
        p.pop("token_eff", None)
        p.pop("expert_s", None)
    return raw


def test_a_file_without_the_new_terms_loads_and_keeps_the_old_form():
    """Schema 1 files written before 2026-12-03 load unchanged: no width term, no token
    term, every engine on the one (reference) set. Old form by hand: launch + max(FLOP /
    (peak x max_eff x t / (t + half_sat)), bytes / (hbm x mem_eff))."""
    raw = _old_file()
    raw["grouped_gemm"]["bf16"] = {
        "launch_s": 3e-5, "max_eff": 0.5, "half_sat": 100.0, "mem_eff": 0.8,
    }  # fmt: skip
    p = moe_params_from_dict(raw).gemm("bf16", "vllm")
    assert (p.width_half_sat, p.token_eff, p.expert_s) == (0.0, 0.0, 0.0)
    # 65,536 token copies on 8 experts (8,192 each), hidden 4096, width 1536: compute-bound
    # (5.1 ms against 0.66 ms of bytes), a million layer tokens charged nothing
    flop = 2 * 65536 * 4096 * 1536 * 3
    want = 3e-5 + flop / (989e12 * 0.5 * 8192 / 8292)
    got = grouped_gemm_time_s(p, 989e12, 3.35e12, 65536.0, 8.0, 4096.0, 1536.0, 2.0, True, 1e6)
    assert got == pytest.approx(want, rel=1e-12)


def test_efficiencies_above_one_are_refused():
    """Every efficiency is a share of a peak (FLOP/s or HBM bytes/s): a file with one above
    1 would make a kernel run faster than the GPU can."""
    for key in ("max_eff", "mem_eff", "token_eff"):
        raw = _old_file()
        raw["grouped_gemm"]["fp8"][key] = 1.2
        with pytest.raises(ProfileError, match=rf"grouped_gemm\.fp8\.{key}: expected at most 1"):
            moe_params_from_dict(raw, "x.json")
    raw = _old_file()
    raw["grouped_gemm_frameworks"] = {"tgi": {"bf16": raw["grouped_gemm"]["bf16"]}}
    with pytest.raises(ProfileError, match=r"grouped_gemm_frameworks\.tgi: unknown"):
        moe_params_from_dict(raw, "x.json")


@pytest.mark.parametrize("fw", ["trtllm", "vllm", "sglang"])
def test_shipped_grouped_gemm_never_beats_the_peaks(params, fw):
    """Over every table shape and 1-65,536 tokens, no framework's fitted kernel runs its
    FLOPs above the tensor-core peak or its weight and activation bytes above HBM
    bandwidth."""
    rng = np.random.default_rng(3)
    n = 2000
    tokens = rng.choice([1.0, 7.0, 64.0, 300.0, 4096.0, 65536.0], n)
    touched = np.minimum(rng.choice([1.0, 4.0, 32.0, 128.0], n), tokens)
    hidden = rng.choice([2048.0, 4096.0, 7168.0], n)
    width = rng.choice([16.0, 96.0, 768.0, 2048.0, 14336.0], n)
    for dt, elem, peak in (("bf16", 2.0, 989e12), ("fp8-block", 1.0, 1979e12)):
        p = params.gemm(dt, fw)
        t = grouped_gemm_time_s(
            p, peak, 3.35e12, tokens, touched, hidden, width, elem, True, tokens
        )
        flop = 2 * tokens * hidden * width * 3
        weights = touched * 3 * hidden * width * elem
        assert np.all(flop / t <= peak) and np.all(weights / t <= 3.35e12)


def test_large_token_rows_of_the_reference_table(trtllm, params):
    """The issue-13 rows: TensorRT-LLM moe_perf, balanced, more than 1,024 tokens. One
    efficiency curve in tokens per expert erred 29.7% / 38.8% / 31.9% (median; bf16, fp8,
    fp8-block) there: narrow expert shards ran 2x slower and wide ones 1.6x faster than
    it."""
    d = trtllm[(trtllm.distribution == "balanced") & (trtllm.num_tokens > 1024)]
    for dt in ("bf16", "fp8", "fp8-block"):
        s = d[d.dtype == dt]
        assert np.median(_ape(_gg(params.gemm(dt), s), s.meas_s)) < 0.15, dt


def test_each_touched_expert_costs_its_own_setup(trtllm, params):
    """A cost per touched expert (``expert_s``): every balanced TensorRT-LLM row, median
    7.1% / 7.7% / 5.9% (bf16, fp8, fp8-block; untuned cells included); without it 8.2% /
    9.9% / 8.2% (fitted to every row), and the
    fp8-block rows of 65-1,024 tokens p90 24.1% (now 16.0%)."""
    d = trtllm[trtllm.distribution == "balanced"]
    for dt, bound in (("bf16", 0.08), ("fp8", 0.09), ("fp8-block", 0.07)):
        s = d[d.dtype == dt]
        assert np.median(_ape(_gg(params.gemm(dt), s), s.meas_s)) < bound, dt
        assert 0 < params.gemm(dt).expert_s < 1e-6  # below a microsecond an expert
    s = d[(d.dtype == "fp8-block") & (d.num_tokens > 64) & (d.num_tokens <= 1024)]
    assert np.percentile(_ape(_gg(params.gemm("fp8-block"), s), s.meas_s), 90) < 0.18


def test_narrow_expert_shards_run_at_a_lower_share_of_peak(trtllm, params):
    """Qwen3-235B-A22B (4096 / 1536, 128 experts, top-8) at 16,384 tokens, EP 1: the same
    tokens per expert at moe_tp 1 (width 1536) and 16 (96). The narrow shard's FLOPs take
    measurably longer per FLOP; predicted within 25% of the measured ratio (one curve in
    tokens per expert predicted the same FLOP rate for both)."""
    d = trtllm[
        (trtllm.distribution == "balanced")
        & (trtllm.dtype == "bf16")
        & (trtllm.hidden_size == 4096)
        & (trtllm.inter_size == 1536)
        & (trtllm.num_experts == 128)
        & (trtllm.num_tokens == 16384)
        & (trtllm.moe_ep_size == 1)
        & trtllm.moe_tp_size.isin([1, 16])
    ].sort_values("moe_tp_size")
    assert len(d) == 2
    pred = _gg(params.gemm("bf16"), d)
    per_flop_meas = d.meas_s.to_numpy() / d.width.to_numpy()
    per_flop_pred = pred / d.width.to_numpy()
    meas_ratio = per_flop_meas[1] / per_flop_meas[0]
    assert meas_ratio > 3.0
    assert per_flop_pred[1] / per_flop_pred[0] == pytest.approx(meas_ratio, rel=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["2048/768/128/8", "4096/14336/8/2"])
def test_held_out_shape_family_large_token_rows(trtllm, family):
    """Refit the bf16 reference set without one shape family and predict its rows above
    1,024 tokens: Qwen3-30B-A3B (the narrowest experts, 768) and Mixtral-8x7B (the widest,
    14,336). With one curve in tokens per expert these held-out rows erred 23.9% and 62.1%
    (median)."""
    d = trtllm[(trtllm.distribution == "balanced") & (trtllm.dtype == "bf16")]
    train = d[d.family != family].reset_index(drop=True)
    test = d[(d.family == family) & (d.num_tokens > 1024)]

    def model(x, idx):
        return _gg(GroupedGemmParams(*x), train.iloc[idx])

    x, _ = fit_generic(
        model,
        train.meas_s.to_numpy(),
        [[3e-5, 0.9, 64.0, 0.8, 500.0, 0.5, 2e-7]],
        [1e-6, 0.05, 0.5, 0.05, 1.0, 0.01, 1e-10],
        [5e-4, 1.0, 4096.0, 1.0, 1e5, 1.0, 1e-4],
        held_out=False,
    )
    assert np.median(_ape(_gg(GroupedGemmParams(*x), test), test.meas_s)) < 0.15


@pytest.mark.slow
def test_large_token_rows_held_out_by_token_range_are_not_priced_fast(data):
    """TensorRT-LLM's own kernel table at 8,192-16,384 tokens (the iterations of the max-load
    rows that run fast, docs/calibration.md): the shipped bf16 and fp8 sets predict them no
    faster than measured (measured over predicted 0.96 / 0.97 in median, Mixtral-8x7B 0.96 /
    0.92), and refitted on the rows of at most 4,096 tokens the form extrapolates to them
    slow, not fast (0.90 / 0.96; Mixtral 0.95 / 0.95): the large-m grouped GEMM is not what
    runs those rows fast."""
    t = m_range_check(data).set_index(["dtype", "fit", "rows"])
    for dt in ("bf16", "fp8"):
        for fit in ("shipped (all token counts)", "refit on <= 4096 tokens"):
            for rows in ("all shapes", "Mixtral-8x7B"):
                r = t.loc[(dt, fit, rows)]
                assert r.n > 0 and 0.85 < r.measured_over_predicted <= 1.0, (dt, fit, rows)
        shipped = t.loc[(dt, "shipped (all token counts)", "all shapes")]
        assert shipped.median_ape < 0.12  # in sample
        assert t.loc[(dt, "refit on <= 4096 tokens", "all shapes")].median_ape < 0.20


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


def test_each_engine_runs_its_own_frameworks_kernel(data):
    """Mixtral-8x7B's routed experts at TP 2 (width 7,168) on the H100, 16,384 prompt
    tokens: each engine's worker runs its framework's kernel, within 15% of its measured
    moe_perf row (bf16, balanced, moe_tp 2: 7.2, 8.6 and 10.6 ms). SGLang's with the tuned
    tile set, its shipped config for E=8, N=7168 on the H100 (the one SGLang set of before
    2026-12-03 predicted 19.2 ms; the same experts at TP 1, default tiles, take 57.6 ms).
    The tuned set's saturation curve over 24 cells predicted this row 8.19 ms (1.29x
    short, which this test then allowed at 30%): narrow tuned cells needed a higher
    max_eff than Mixtral's wide ones run at. Timed by its tiles since (the tile
    form, moe.grouped_gemm_tile_compute_s) it predicts 9.37 ms (1.13x)."""
    base = data / "kernels" / "aiconfigurator" / "h100_sxm" / "moe"
    for engine, ver in (("trtllm", "1.3.0rc20"), ("vllm", "0.24.0"), ("sglang", "0.5.14")):
        t = pd.read_parquet(base / engine / ver / "moe_perf.parquet")
        row = t[
            (t.moe_dtype == "bfloat16")
            & (t.hidden_size == 4096)
            & (t.inter_size == 14336)
            & (t.num_experts == 8)
            & (t.moe_tp_size == 2)
            & (t.moe_ep_size == 1)
            & (t.num_tokens == 16384)
            & (t.distribution == "balanced")
        ]
        meas_s = float(row.latency.iloc[0]) * 1e-3
        c = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine=engine)
        assert c.expert_kernel == engine
        bd = c.breakdown(
            prefill_seqs=4, prefill_tokens=16384, prefill_attn_pairs=4 * 4096 * 4097 / 2
        )
        assert c.expert_tuned_tiles == (engine == "sglang")
        assert bd.expert_gemm_s / 32 == pytest.approx(meas_s, rel=0.15), engine
    # the 2023 eager vLLM engine runs vLLM's kernel too
    eager = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine="vllm-eager-2023")
    assert eager.expert_kernel == "vllm"


@pytest.fixture(scope="module")
def frameworks(data):
    return moe_rows(data, ("vllm", "sglang"))


@pytest.mark.parametrize("fw", ["vllm", "sglang"])
def test_mxfp4_fit_takes_the_kernel_that_runs_gpt_oss(frameworks, fw):
    """vLLM's and SGLang's w4a16_mxfp4 tables hold two kernels: their Triton MXFP4 kernel on
    gpt-oss's shapes (the catalog's MXFP4 experts) and Marlin on one Kimi-K3 shape
    (3584/3072/896/16, activation approximated: 'situ_as_silu'). Fitted together, each
    model held out was predicted from the other kernel's rows: gpt-oss-20b by vLLM's fit
    44.6% median, gpt-oss-120b by SGLang's 22.9%. The fit takes the Triton rows only;
    held out by model, each gpt-oss model is predicted from the other within 20% median
    (measured 14.0 / 16.4% vLLM, 12.9 / 13.6% SGLang)."""
    d = fitted_rows(frameworks, fw, "mxfp4")
    kernels = set(d.kernel_source.astype(str))
    assert not any("marlin" in k for k in kernels), kernels
    assert len(kernels) == 1 and "triton" in next(iter(kernels))
    assert set(zip(d.hidden_size, d.inter_size, strict=True)) == {(2880, 2880)}  # gpt-oss
    starts = [[3e-5, 0.9, 64.0, 0.8, 500.0, 0.5, 2e-7], [1e-5, 0.5, 128.0, 0.6, 2000.0, 0.2, 1e-6]]
    lower = [1e-6, 0.05, 0.5, 0.05, 1.0, 0.01, 1e-10]
    upper = [5e-4, 1.0, 4096.0, 1.0, 1e5, 1.0, 1e-4]
    for held in (32, 128):
        train = d[d.num_experts != held].reset_index(drop=True)
        test = d[d.num_experts == held].reset_index(drop=True)

        def model(x, idx, train=train):
            return _gg(GroupedGemmParams(*x), train.iloc[idx])

        x, _ = fit_generic(model, train.meas_s.to_numpy(), starts=starts, lower=lower,
                           upper=upper)  # fmt: skip
        ape = _ape(_gg(GroupedGemmParams(*x), test), test.meas_s)
        assert np.median(ape) < 0.20, (fw, held, float(np.median(ape)))


def test_kernel_comparison_names_each_kernel_against_trtllm(data):
    """The diagnostic behind docs/calibration.md's note on vLLM's FP8 (per-tensor) rows:
    they are ModelOpt FP8 on FlashInfer's CUTLASS MoE, 2.97-3.94x TensorRT-LLM's CUTLASS
    FP8 on the same points (median per token band), reading the touched experts' weights at
    12% of HBM at <= 16 tokens, where vLLM's fp8-block FlashInfer CUTLASS runs 1.04-1.09x
    TensorRT-LLM's and its bf16 Triton 1.04-1.13x."""
    # by hand from the tables: Mixtral-8x7B experts at TP 2, 16 and 16,384 tokens, balanced
    base = data / "kernels" / "aiconfigurator" / "h100_sxm" / "moe"
    ms = {}
    for fw, ver in (("vllm", "0.24.0"), ("trtllm", "1.3.0rc20")):
        r = pd.read_parquet(base / fw / ver / "moe_perf.parquet")
        r = r[(r.moe_dtype == "fp8") & (r.hidden_size == 4096) & (r.num_experts == 8)
              & (r.moe_tp_size == 2) & (r.moe_ep_size == 1) & (r.distribution == "balanced")]  # fmt: skip
        ms[fw] = r.set_index("num_tokens").latency
    assert ms["vllm"][16] / ms["trtllm"][16] == pytest.approx(1.173 / 0.255, rel=0.01)
    assert ms["vllm"][16384] / ms["trtllm"][16384] == pytest.approx(22.381 / 4.082, rel=0.01)
    t = kernel_comparison(data).set_index(["framework", "dtype", "kernel"])
    fp8 = t.loc[("vllm", "fp8", "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts")]
    assert fp8.matched > 10_000
    for band in ("le64", "65_1024", "gt1024"):
        assert 2.5 < fp8[f"over_trtllm_{band}"] < 4.5
    assert fp8.hbm_share_le16_median < 0.2
    block = t.loc[("vllm", "fp8-block", "vllm_fp8moe_flashinfer_cutlass_flashinferexperts")]
    bf16 = t.loc[("vllm", "bf16", "vllm_unquantizedfusedmoe_triton_tritonexperts")]
    for row in (block, bf16):
        assert all(0.9 < row[f"over_trtllm_{b}"] < 1.2 for b in ("le64", "65_1024", "gt1024"))
    assert not t.loc[("vllm", "mxfp4"), "fitted"].all()  # the Marlin rows are reported only


def test_fit_moe_names_a_table_that_is_not_a_regular_file(tmp_path, capsys):
    """`python -m calibration.fit_moe --data D [--kernels]` with one of D's tables a named
    pipe: one line naming it, exit 2 (was a UserError traceback from both, exit 1), nothing
    written."""
    import os

    from calibration import fit_moe

    table = tmp_path / "kernels/aiconfigurator/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet"
    table.parent.mkdir(parents=True)
    os.mkfifo(table)
    out = tmp_path / "out.json"
    for extra in (["--kernels"], ["--out", str(out)]):
        assert fit_moe.main(["--data", str(tmp_path), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "named pipe" in err and str(table) in err, err
    assert not out.exists()


def _cells(rows) -> pd.DataFrame:
    """A moe_perf-like frame: (moe_dtype, hidden, inter, experts, topk, tp, ep, tokens,
    latency ms) per row, balanced."""
    cols = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size",
            "moe_ep_size", "num_tokens", "latency"]  # fmt: skip
    d = pd.DataFrame(rows, columns=cols).assign(distribution="balanced")
    d["meas_s"] = d.latency * 1e-3
    return d


def test_tuning_cache_keys_as_the_collector_names_them():
    """AIConfigurator's TensorRT-LLM collector loads the first tuning cache whose name starts
    with f"{moe_dtype}_{hidden}_{inter // tp}_{experts // ep}" and then skips tuning. By hand:
    Llama-4 Scout (16 experts) at EP 1 and Maverick (128) at EP 8 both name
    bfloat16_5120_8192_16; Maverick at EP 128 (..._1) is a prefix of both; Maverick at TP 2
    EP 4 (bfloat16_5120_4096_32) has its key alone; w4a16_mxfp4 takes no cache."""
    d = _cells([
        ("bfloat16", 5120, 8192, 16, 1, 1, 1, 8, 1.0),     # Scout EP1: ..._8192_16
        ("bfloat16", 5120, 8192, 128, 1, 1, 8, 8, 1.0),    # Maverick EP8: ..._8192_16
        ("bfloat16", 5120, 8192, 128, 1, 1, 128, 8, 1.0),  # Maverick EP128: ..._8192_1
        ("bfloat16", 5120, 8192, 128, 1, 2, 4, 8, 1.0),    # ..._4096_32, alone
        ("fp8", 5120, 8192, 128, 1, 1, 128, 8, 1.0),       # fp8_5120_8192_1: no fp8 _1x key
        ("w4a16_mxfp4", 2880, 2880, 128, 4, 1, 1, 8, 1.0),
        ("w4a16_mxfp4", 2880, 2880, 32, 4, 1, 4, 8, 1.0),  # same key, but no cache
    ])  # fmt: skip
    assert tuning_cache_shared(d).tolist() == [True, True, True, False, False, False, False]


def test_a_cell_slower_than_one_with_more_work():
    """A cell is slower than more work when a cell of the same shape with moe_tp' <= moe_tp
    and moe_ep' <= moe_ep (at least its work per GPU) took less than 1/1.25 of its time, the
    median over their common token counts."""
    rows = []
    for tokens in (16, 256, 4096):
        for tp, ep, ms in ((1, 1, 4.0), (2, 1, 2.4), (1, 2, 4.8), (2, 2, 3.2), (1, 4, 1.0)):
            rows.append(("bfloat16", 4096, 1536, 128, 8, tp, ep, tokens, ms))
    d = _cells(rows)
    # (1, 2) at 1.2x (1, 1): within 1.25; (2, 2) at 1.33x (2, 1); (1, 4) the fastest
    got = d[d.num_tokens == 16].assign(slow=slower_than_more_work(d)[d.num_tokens == 16])
    assert got.set_index(["moe_tp_size", "moe_ep_size"]).slow.to_dict() == {
        (1, 1): False, (2, 1): False, (1, 2): False, (2, 2): True, (1, 4): False,
    }  # fmt: skip


def test_only_cells_on_another_shapes_tuning_run_slower_than_more_work(data):
    """TensorRT-LLM's moe_perf on the H100: no cell with a tuning-cache key of its own is
    slower than a cell of the same shape with more work per GPU, in any dtype or routing;
    55 bf16 and 45 fp8 balanced cells whose key another cell shares are (not fitted), none of
    fp8-block (its 190 shared-key cells run as fast as their neighbours) or mxfp4 (no cache).
    Llama-4 Maverick bf16 at TP 1, 1,024 tokens, halves with each EP doubling to 0.205 ms at
    EP 64 and takes 0.509 ms at EP 128 (key ..._8192_1, a prefix of ..._8192_16 and _128)."""
    t = untuned_summary(data).set_index(["dtype", "distribution"])
    assert (t.own_key_and_slower == 0).all()
    assert t.loc[("bf16", "balanced"), "untuned_cells"] == 55
    assert t.loc[("fp8", "balanced"), "untuned_cells"] == 45
    assert (t.loc["fp8-block", "untuned_cells"] == 0).all()
    assert t.loc[("fp8-block", "balanced"), "key_shared"] == 190
    assert (t.loc["mxfp4", "key_shared"] == 0).all()


def test_untuned_cells_are_not_fitted(trtllm):
    d = trtllm[(trtllm.dtype == "bf16") & (trtllm.distribution == "balanced")]
    mav = d[(d.hidden_size == 5120) & (d.num_experts == 128) & (d.moe_tp_size == 1)
            & (d.num_tokens == 1024)].set_index("moe_ep_size")  # fmt: skip
    assert mav.latency[64] == pytest.approx(0.205, abs=1e-3)
    assert mav.latency[128] == pytest.approx(0.509, abs=1e-3)
    assert mav.untuned[128] and not mav.untuned.drop(128).any()
    fitted = fitted_rows(trtllm, "trtllm", "bf16")
    assert len(fitted) == len(d) - 1485 and not fitted.untuned.any()


def test_fit_moe_says_when_it_replaced_an_earlier_fit(tmp_path, monkeypatch, capsys):
    """The default --out is the shipped parameter file: a refit over an earlier MoE fit says
    it replaced it (was only 'wrote X', as `calibrate fit` said before it named the profile
    it replaced). The fit itself is stubbed by the shipped file's contents."""
    from calibration import fit_moe

    shipped = json.loads(moe_params_path(fit_moe.GPU).read_text())
    monkeypatch.setattr(fit_moe, "fit_all", lambda data: ({}, {}))
    monkeypatch.setattr(fit_moe, "profile_dict", lambda params, errors, data: shipped)
    out = tmp_path / "h100_sxm.json"
    assert fit_moe.main(["--data", str(tmp_path), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"MoE fit written to {out}"
    assert fit_moe.main(["--data", str(tmp_path), "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"MoE fit written to {out} (replaced the earlier MoE fit there)"
    assert json.loads(out.read_text()) == shipped


def test_moe_rows_are_read_once_per_files_and_handed_out_as_copies(tmp_path, monkeypatch):
    # moe_rows keeps a table by the files it reads (path, size, modification time): the
    # same files are not read again, a caller changing its table does not change the next
    # caller's, and a file that changed (or a folder without the tables) is read anew
    from calibration import fit_moe

    reads = []

    def fake_read(data, frameworks):
        reads.append(tuple(frameworks))
        return pd.DataFrame({"meas_s": [1.0, 2.0]})

    monkeypatch.setattr(fit_moe, "_MOE_ROWS", KeptResults(limit=3))
    monkeypatch.setattr(fit_moe, "_read_moe_rows", fake_read)
    for p, _, _ in fit_moe._moe_tables(tmp_path, ("vllm", "sglang", "trtllm")):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"table")
    first = fit_moe.moe_rows(tmp_path, ("trtllm", "vllm"))
    first.loc[0, "meas_s"] = -1.0
    again = fit_moe.moe_rows(tmp_path, ("vllm", "trtllm"))  # the same files: kept
    assert len(reads) == 1 and again.meas_s.tolist() == [1.0, 2.0]
    again.loc[1, "meas_s"] = -2.0
    assert fit_moe.moe_rows(tmp_path, ("vllm", "trtllm")).meas_s.tolist() == [1.0, 2.0]
    fit_moe.moe_rows(tmp_path, ("vllm", "sglang", "trtllm"))  # more files: read
    assert len(reads) == 2
    trt = fit_moe._moe_tables(tmp_path, ("trtllm",))[0][0]
    trt.write_bytes(b"another table")
    fit_moe.moe_rows(tmp_path, ("vllm", "trtllm"))
    assert len(reads) == 3
    fit_moe.moe_rows(tmp_path / "elsewhere", ("vllm",))  # no tables there: never kept
    fit_moe.moe_rows(tmp_path / "elsewhere", ("vllm",))
    assert len(reads) == 5
