"""Serving-engine fits against the collected end-to-end measurements and DistServe's 2023-vLLM
curves, the graph-replay gap, the two-protocol all-reduce fit, and the rules that keep
measured profiles from being overwritten by public fits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration import engines, fit_public
from calibration.cli import default_base
from calibration.fit import KeptResults, fit_allreduce
from disaggsim.costmodel import ops
from disaggsim.errors import UserError
from disaggsim.hardware.engines import PARAM_KEYS, load_engines, shipped_engines_path
from disaggsim.hardware.profile import AllReduceParams, load_profile, shipped_profile_path
from tests.conftest import SHARED_DATA as DATA

needs_data = pytest.mark.skipif(
    not (DATA / "kernels" / "distserve").is_dir(), reason=f"DistServe profiles absent at {DATA}"
)


def test_overhead_solver_recovers_known_overheads() -> None:
    # synthetic measurements = kernels + 0.7 ms per iteration + 45 µs per layer-iteration
    # + 3 µs per sequence, over a mix of iteration counts, layer counts and batch sizes
    rng = np.random.default_rng(0)
    kern = rng.uniform(5e-3, 0.5, 80)
    iters = rng.integers(1, 200, 80).astype(float)
    layers = np.repeat([40.0, 64.0], 40)
    seqs = iters * rng.integers(1, 256, 80)
    x = np.column_stack([iters, iters * layers, seqs])
    meas = kern + x @ np.array([7e-4, 45e-6, 3e-6])
    theta = engines.solve(kern, x, meas)
    np.testing.assert_allclose(theta, [7e-4, 45e-6, 3e-6], rtol=1e-6)
    # overheads are never negative, even when kernels alone overshoot
    assert engines.solve(kern, x, kern * 0.9).min() >= 0.0


@needs_data
def test_whole_step_points_are_the_curves_by_hand() -> None:
    pts = engines.whole_step_points(DATA, "distserve")
    raw = json.loads((DATA / "kernels/distserve/profiler-a100-80g.distserve.json").read_text())
    a, b, c = raw["facebook/opt-13b"]["1"]["prefill"]
    row = pts[(pts.model == "opt-13b") & (pts.tp == 1) & (pts.kind == "prefill")]
    row = row[(row.batch == 2) & (row.tokens == 512)]
    assert row["t_s"].item() == pytest.approx((a + b * 1024 + c * 2 * 512**2) / 1e3, rel=1e-12)
    a, b, c = raw["facebook/opt-66b"]["8"]["decoding_largebs"]  # batch 128 > threshold 95
    row = pts[(pts.model == "opt-66b") & (pts.tp == 8) & (pts.kind == "decode")]
    row = row[(row.batch == 128) & (row.tokens == 1024)]
    assert row["t_s"].item() == pytest.approx((a + b * 128 * 1024 + c * 128) / 1e3, rel=1e-12)
    # decode points stay inside DistServe's KV capacity (OPT-13B TP1: 66144 tokens)
    d = pts[(pts.model == "opt-13b") & (pts.tp == 1) & (pts.kind == "decode")]
    assert (d.batch * d.tokens).max() <= 66144


def test_measurement_rows_follow_their_sources_by_hand() -> None:
    df = engines.read_measurements()
    # TensorRT-LLM 0.9.0 static batches: latency = batch x osl / (tok/s/GPU x TP), recomputed
    # from the raw throughput column (a different column from value_s)
    t = df[(df["source"] == "trtllm-0.9.0-perf") & (df["metric"] == "batch_latency_s")]
    assert len(t) == 36
    tput = t["raw"].str.extract(r"^([0-9]+)")[0].astype(float)
    np.testing.assert_allclose(t["value_s"], t["batch"] * t["osl"] / (tput * t["tp"]), rtol=1e-5)
    # one row by hand: H200 Llama-2-70B, batch 1024, TP1, 128/128 at 3,989 tok/s/GPU
    row = t[(t["gpu"] == "h200-sxm") & (t["model"] == "llama-2-70b") & (t["batch"] == 1024)]
    assert row["value_s"].item() == pytest.approx(1024 * 128 / 3989, rel=1e-5)
    # vLLM's CI latency test: 8 prompts of 32 tokens, 128 out, on three GPUs
    v = df[df["source"] == "vllm-perf-benchmark"]
    assert set(v["gpu"]) == {"a100-80gb", "h100-sxm", "h200-sxm"}
    assert (v["batch"] == 8).all() and (v["isl"] == 32).all() and (v["osl"] == 128).all()
    # every engine holds rows out of its fit; every row names its URL and carries its
    # provenance (the engine version, the figure as published, how the value follows)
    for e in ("vllm", "sglang", "trtllm"):
        assert (df[df["engine"] == e]["split"] == "holdout").any()
    assert df["url"].str.startswith("https://").all()
    for col in ("version", "raw", "derivation"):
        assert (df[col].fillna("").str.strip().str.len() > 0).all(), col


# the figure each SGLang / vLLM row quotes, as the source prints it: the number after
# these words in the row's raw column is the value in seconds
_QUOTED = {
    "sglang-issue-1008": "median latency:",
    "sglang-pr-1401": "median latency:",
    "vllm-pr-10933": "Avg latency:",
    "vllm-pr-11000": "Avg latency:",
    "vllm-issue-9471": "t_elap:",
    "vllm-pr-3240": "Avg latency:",
}


def test_collected_sglang_and_vllm_rows_are_their_quoted_figures() -> None:
    df = engines.read_measurements()
    rows = df[df["source"].isin(list(_QUOTED))]
    # 5 SGLang decode steps (issue 1008: TP1 batch 1 and 128, TP8 batch 1; PR 1401: triton
    # and flashinfer at batch 1) and 10 vLLM batches (PRs 10933 and 11000, issue 9471, and
    # PR 3240's seven Mixtral batches)
    assert len(rows[rows["engine"] == "sglang"]) == 5
    assert len(rows[rows["engine"] == "vllm"]) == 10
    for r in rows.to_dict("records"):
        quoted = str(r["raw"]).split(_QUOTED[str(r["source"])])[1].split()[0]
        assert float(r["value_s"]) == pytest.approx(float(quoted), rel=1e-5), r["source"]
    # no configuration twice (PR 1401's two rows differ in attention backend, in version)
    key = ["source", "version", "model", "gpu", "tp", "batch", "isl", "osl", "metric"]
    assert not rows.duplicated(subset=key).any()
    # one row by hand: SGLang issue 1008, Llama-3-8B TP1 at batch 128, 128 in / 8 out: the
    # median decode step 11.84 ms (10,815 tokens/s over 128 sequences)
    r = rows[(rows["source"] == "sglang-issue-1008") & (rows["batch"] == 128)]
    assert r["value_s"].item() == pytest.approx(128 / 10815.07, rel=1e-3)
    assert (r["isl"].item(), r["osl"].item(), r["metric"].item()) == (128, 8, "decode_step_s")
    # vLLM's benchmark_latency defaults (32 in / 128 out) where the command sets only the batch
    b1 = rows[rows["source"].isin(["vllm-pr-10933", "vllm-pr-11000"])]
    assert (b1["batch"] == 1).all() and (b1["isl"] == 32).all() and (b1["osl"] == 128).all()


def test_mixtral_rows_follow_their_sources_by_hand() -> None:
    df = engines.read_measurements()
    mx = df[df["model"] == "mixtral-8x7b"]
    # vLLM's CI latency test on Mixtral-8x7B at TP2 (8 prompts, 32 in / 128 out): the mean
    # latency in ms as the table prints it, on A100, H100 and H200
    ci = mx[mx["source"] == "vllm-perf-benchmark"].set_index("gpu")
    assert set(ci.index) == {"a100-80gb", "h100-sxm", "h200-sxm"}
    assert ci.loc["a100-80gb", "value_s"] == pytest.approx(3643.84e-3, rel=1e-9)
    assert ci.loc["h100-sxm", "value_s"] == pytest.approx(2326.97e-3, rel=1e-9)
    assert ci.loc["h200-sxm", "value_s"] == pytest.approx(1917.44e-3, rel=1e-9)
    for gpu, r in ci.iterrows():
        ms = float(str(r["raw"]).split("mean latency")[1].split()[0])
        assert r["value_s"] == pytest.approx(ms / 1e3, rel=1e-9), gpu
        assert (r["tp"], r["batch"], r["isl"], r["osl"]) == (2, 8, 32, 128)
    # vLLM PR 3240: benchmark_latency at batch 1-64, 1000 in / 50 out, TP2 on the A100, the
    # PR's tuned-config rows (not master's untuned ones), one row per batch
    pr = mx[mx["source"] == "vllm-pr-3240"]
    assert sorted(pr["batch"]) == [1, 2, 4, 8, 16, 32, 64]
    assert (pr["gpu"] == "a100-80gb").all() and (pr["tp"] == 2).all()
    assert (pr["isl"] == 1000).all() and (pr["osl"] == 50).all()
    assert pr[pr["batch"] == 8]["value_s"].item() == pytest.approx(2.0341408042260447)
    assert pr["raw"].str.contains("--input-len 1000 --output-len 50 -tp 2").all()
    for r in pr.to_dict("records"):
        assert f"--batch-size {r['batch']} " in str(r["raw"])
    assert (mx["engine"] == "vllm").all() and (mx["weight_dtype"] == "bf16").all()


@needs_data
def test_the_mixtral_ci_rows_hold_and_the_dense_rows_keep_the_overhead_gain() -> None:
    # docs/validation.md: the held-out Mixtral-8x7B rows run vLLM's own MoE kernel (fitted on
    # vLLM 0.24's H100 table). The CI's A100, H100 and H200 batches (TP2, batch 8) hold
    # within 6% (0.95x, 0.95x, 1.03x measured/predicted);
    # PR 3240's prefill-heavy A100 batches (16-64 prompts of 1,000 tokens) are the known miss
    # ("Where targets are missed": a 2024 Triton kernel on a GPU with no MoE table), the nine
    # rows 15.9% / 26.0% (nine before the CI's A100 row; ten rows 10.5% / 25.5%), all 19 vllm
    # rows 4.6% / 20.4% with the H200's own GEMM memory efficiency (18 rows 5.2% / 20.4%
    # before; 4.6% / 11.0% before 2026-12-03, when one curve fitted to TensorRT-LLM's table
    # ran wide experts 1.6x slow on the H100)
    # (and since 2026-12-04 vLLM PR 4002's six decode-bound A100 Mixtral-8x22B batches,
    # 0.91-1.15x: the sixteen MoE rows 9.4% / 21.9%)
    fits = engines.fit_all(DATA)
    rows = fits["vllm"]["rows"]
    moe = rows["model"].str.startswith("mixtral").to_numpy()
    assert moe.sum() == 16
    a, k = rows["ape"].to_numpy(float), rows["kernels_ape"].to_numpy(float)
    ci = moe & (rows["source"] == "vllm-perf-benchmark").to_numpy()
    assert ci.sum() == 3 and (a[ci] < 0.06).all()
    a100 = moe & (rows["source"] == "vllm-pr-3240").to_numpy()
    prefill_heavy = a100 & (rows["batch"] >= 16).to_numpy()
    assert np.median(a[a100 & ~prefill_heavy]) < 0.12
    assert (a[prefill_heavy] > 0.12).all()  # measured 1.19-1.42x the prediction
    assert np.median(a[moe]) < 0.17 and np.percentile(a[moe], 90) < 0.27
    assert np.median(a) < 0.06 and np.percentile(a, 90) < 0.22
    # dense rows: the fitted overhead shortens the tail and the median against kernels alone
    assert np.percentile(a[~moe], 90) < np.percentile(k[~moe], 90)
    assert np.median(a[~moe]) < np.median(k[~moe])
    assert np.median(a[~moe]) < 0.05 and np.percentile(a[~moe], 90) < 0.15


def test_the_moe_floor_check_runs_the_shipped_fit_and_names_the_carry() -> None:
    t = engines.moe_floor_check()
    # its shipped column is the vllm fit's own prediction of those rows
    pts = engines.read_measurements()
    feat = engines.features(pts[pts["engine"] == "vllm"].reset_index(drop=True))
    fit = engines.fit_engine_linear(feat, "vllm")["rows"]
    fit = fit[fit["model"].str.startswith("mixtral")].reset_index(drop=True)
    # (engines.json rounds the parameters to 5 digits)
    np.testing.assert_allclose(t["pred_shipped_s"], fit["pred_s"], rtol=1e-4)
    assert (t["split"] == "holdout").all() and len(t) == 16

    def ape(name: str) -> pd.Series:
        return (t[f"pred_{name}_s"] / t["value_s"] - 1).abs()

    # the H100's small-m compute floor used unscaled makes the decode-bound A100 rows
    # (batch 1-8) 1.1-1.7x slow; carried by machine balance (the shipped rule) 9.5% median
    a100 = (t["gpu"] == "a100-80gb").to_numpy() & (t["batch"] <= 8).to_numpy()
    assert np.median(ape("uncarried")[a100]) > 0.25
    assert np.median(ape("shipped")[a100]) < 0.12
    # on the H100, where the floor was fitted, nothing is carried
    h100 = (t["gpu"] == "h100-sxm").to_numpy()
    np.testing.assert_array_equal(t["pred_uncarried_s"][h100], t["pred_shipped_s"][h100])
    np.testing.assert_allclose(t["pred_no_floor_s"][h100], t["pred_shipped_s"][h100], rtol=0.01)
    # on the H200 (the H100's FLOPs, 1.43x its bandwidth) the unscaled floor is slow too
    # (0.91x; 0.79x with the reference kernel's one-curve fit before 2026-12-03)
    h200 = (t["gpu"] == "h200-sxm").to_numpy()
    assert (t["measured_over_uncarried"][h200] < 0.93).all()
    assert (abs(t["measured_over_shipped"][h200] - 1) < 0.05).all()


def test_held_out_rows_never_enter_the_sglang_and_vllm_fits() -> None:
    pts = engines.all_points(None)
    # whole sources held out: SGLang's PR 1401, vLLM's PR and issue rows (V0, V1, FP8,
    # Mixtral on the A100), and every MoE row (Mixtral-8x7B: vLLM's CI on H100 and H200 too)
    held = {"sglang-pr-1401", "vllm-pr-10933", "vllm-pr-11000", "vllm-issue-9471", "vllm-pr-3240"}
    for src in held:
        assert (pts[pts["source"] == src]["split"] == "holdout").all(), src
    assert (pts[pts["model"] == "mixtral-8x7b"]["split"] == "holdout").all()
    mine = pts[pts["engine"].isin(["sglang", "vllm"])].reset_index(drop=True)
    feat = engines.features(mine)
    # the held-out rows' measurements scaled by 3: the fitted parameters do not move
    skewed = feat.copy()
    out = (skewed["split"] == "holdout").to_numpy()
    skewed.loc[out, "value_s"] = skewed.loc[out, "value_s"] * 3.0
    for e in ("sglang", "vllm"):
        a = engines.fit_engine_linear(feat, e)["params"]
        b = engines.fit_engine_linear(skewed, e)["params"]
        assert a == b, e
        # and the fit rows do move them (the test can fail)
        moved = feat.copy()
        fit = ((moved["engine"] == e) & (moved["split"] == "fit")).to_numpy()
        moved.loc[fit, "value_s"] = moved.loc[fit, "value_s"] * 1.5
        assert engines.fit_engine_linear(moved, e)["params"] != a, e


def test_a_bad_measurement_row_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    df = pd.read_csv(engines.MEASUREMENTS)
    df.loc[3, "engine"] = "tgi"
    bad = tmp_path / "m.csv"
    df.to_csv(bad, index=False)
    with pytest.raises(UserError, match=r"m.csv: line 5: engine 'tgi' \(allowed: vllm, sglang"):
        engines.read_measurements(bad)


@needs_data
def test_engine_fits_beat_kernels_alone_and_ship() -> None:
    fits = engines.fit_all(DATA)
    eager = fits["vllm-eager-2023"]["error"]
    # the 2023 eager engine's time is mostly host time: held-out families gain most
    assert eager["held_out_by_family"]["median_ape"] < eager["kernels_only"]["median_ape"] / 2
    # vllm: its held-out Mixtral rows, whose kernels alone exceed the measurements, are the
    # test above; here every engine without such rows
    for name in ("trtllm", "vllm-eager-2023"):
        e = fits[name]["error"]
        kern = e["kernels_only"]
        # the overhead (least squares on relative error) shortens the tail, also for each
        # (source, model, GPU, TP) family predicted by a refit without it, and gives up no
        # more than half a point of median: a median of 62 TensorRT-LLM rows has a
        # bootstrap standard error of 0.7 points, so a strict median gain would test noise
        # (trtllm: kernels alone 4.8% / 14.8%, fitted 4.2% / 12.5%, held out by family
        # 4.5% / 13.1%; before the split-KV refit 4.1% / 13.9% against 4.4% / 11.9%)
        assert e["all"]["p90_ape"] < kern["p90_ape"]
        assert e["held_out_by_family"]["p90_ape"] < kern["p90_ape"]
        assert e["all"]["median_ape"] < kern["median_ape"] + 0.005
    # the shipped engines.json holds exactly these fits (rounded to 5 digits)
    shipped = load_engines()
    for name, f in fits.items():
        for k, v in f["params"].items():
            assert getattr(shipped[name], k) == pytest.approx(v, rel=1e-4, abs=1e-12), (name, k)


def test_gap_slope_recovers_a_known_graph_gap() -> None:
    # synthetic: graph-replayed = 1.5 µs + 1.05 × kernel duration, 2% noise, a few outliers
    rng = np.random.default_rng(2)
    kernel = rng.uniform(4e-6, 140e-6, 400)
    graph = (1.5e-6 + 1.05 * kernel) * np.exp(rng.normal(0, 0.02, kernel.shape))
    graph[:8] *= 1.6  # soft-L1 keeps a handful of slow repeats from dragging the fit
    gap, slope = engines.gap_slope(kernel, graph)
    assert gap == pytest.approx(1.5e-6, abs=0.3e-6)
    assert slope == pytest.approx(1.05, abs=0.01)


def test_graphs_into_sets_the_per_layer_gap_of_the_gapless_kernels(monkeypatch) -> None:
    from disaggsim.costmodel.step import ELEMENTWISE_KERNELS_PER_LAYER

    raw = json.loads(shipped_profile_path("a100-80gb").read_text())
    raw["provenance"]["carried"] = ["copy.p2p", "graph_replay"]

    def fake_gap(gap_s: float):
        return lambda data, gpu: {"gap_s": gap_s, "error": {"gap_us": gap_s * 1e6}}

    monkeypatch.setattr(engines, "graph_gap", fake_gap(2e-6))
    out = engines.graphs_into(raw, DATA, "a100-80gb")
    assert out["graph_replay"]["per_layer_s"] == pytest.approx(ELEMENTWISE_KERNELS_PER_LAYER * 2e-6)
    assert out["ops"] == raw["ops"]  # untouched
    assert out["provenance"]["carried"] == ["copy.p2p"]
    assert out["fit_error"]["graph_replay"] == {"gap_us": 2.0}
    # a negative gap (graph faster than the bare kernels' fit) adds nothing
    monkeypatch.setattr(engines, "graph_gap", fake_gap(-4e-7))
    assert engines.graphs_into(raw, DATA, "a100-80gb")["graph_replay"]["per_layer_s"] == 0.0


@pytest.mark.skipif(
    not (DATA / "kernels" / "vidur").is_dir(), reason=f"public kernel tables absent at {DATA}"
)
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_graph_gap_on_public_tables_and_the_shipped_profiles(gpu: str) -> None:
    from disaggsim.costmodel.step import ELEMENTWISE_KERNELS_PER_LAYER

    gg = engines.graph_gap(DATA, gpu)
    rows = gg["rows"]
    # matched shapes from all three AIConfigurator frameworks, latency-bound GEMMs only
    assert set(rows["framework"]) == {"vllm", "sglang", "trtllm"}
    assert rows["m"].max() <= engines.GRAPH_GAP_MAX_M and len(rows) > 300
    # the graph-replayed op is its kernel duration within a few percent, and the
    # per-kernel gap is small beside the 4–140 µs kernels it is fitted on
    assert abs(gg["gap_s"]) < 1.5e-6 and 0.9 < gg["slope"] < 1.15
    assert gg["bound_s"] < 2e-6
    assert gg["error"]["held_out_median_ape"] < 0.08
    # the shipped profile holds this estimate
    shipped = load_profile(gpu)
    want = ELEMENTWISE_KERNELS_PER_LAYER * max(gg["gap_s"], 0.0)
    assert shipped.graph_layer_s == pytest.approx(want, abs=1e-9)
    assert shipped.fit_error["graph_replay"]["n"] == len(rows)


def test_two_protocol_allreduce_fit_recovers_both_protocols() -> None:
    true = AllReduceParams(((2, 3.5e-5, 1.9e11, 1.0e-5, 4.2e10),))
    s = 512.0 * 2.0 ** np.arange(21)  # 512 B … 512 MiB
    # by hand: LL below the crossing size, Simple above
    t = ops.allreduce_time_s(true, s, 2)
    assert t[0] == pytest.approx(1.0e-5 + 512 / 4.2e10)
    assert t[-1] == pytest.approx(3.5e-5 + s[-1] / 1.9e11)
    noisy = t * np.exp(np.random.default_rng(1).normal(0, 0.02, t.shape))
    lat, bw, ll_lat, ll_bw = fit_allreduce(s, noisy, 2, held_out=False).params
    assert bw == pytest.approx(1.9e11, rel=0.1) and ll_bw == pytest.approx(4.2e10, rel=0.15)
    assert lat == pytest.approx(3.5e-5, rel=0.2) and ll_lat == pytest.approx(1.0e-5, rel=0.2)


def test_old_single_protocol_allreduce_profile_still_loads() -> None:
    raw = json.loads(shipped_profile_path("a100-80gb").read_text())
    for prm in raw["ops"]["allreduce"].values():
        prm.pop("ll_latency_s", None)
        prm.pop("ll_bus_bw_bytes_per_s", None)
    from disaggsim.hardware.profile import profile_from_dict

    ar = profile_from_dict(raw, "old.json").allreduce
    lat, bw = ar.for_gpus(4)
    assert ar.protocols_for_gpus(4) == ((lat, bw),)
    assert float(ops.allreduce_time_s(ar, 1e6, 4)) == pytest.approx(lat + 1.5e6 / bw)


def test_fit_public_never_overwrites_a_measured_profile(tmp_path: Path) -> None:
    # the shipped h200-sxm profile is measured: its prior goes to calibration/priors/
    assert load_profile("h200-sxm").provenance["kind"] == "measured"
    assert fit_public.destination("h200-sxm", None) == fit_public.PRIORS_DIR / "h200_sxm.json"
    assert fit_public.destination("b200", None) == shipped_profile_path("b200")
    # with --out-dir: a measured file already there is protected the same way
    shutil.copy(shipped_profile_path("h200-sxm"), tmp_path / "h200_sxm.json")
    assert fit_public.destination("h200-sxm", str(tmp_path)) == tmp_path / "priors/h200_sxm.json"
    assert fit_public.destination("l40s", str(tmp_path)) == tmp_path / "l40s.json"


def test_calibrate_fit_base_is_the_prior_or_an_explicit_one(monkeypatch, tmp_path) -> None:
    assert default_base("h200-sxm") == fit_public.PRIORS_DIR / "h200_sxm.json"
    assert default_base("b200") == shipped_profile_path("b200")  # a prior: fine as a base
    monkeypatch.setattr(fit_public, "PRIORS_DIR", tmp_path)  # no prior written yet
    with pytest.raises(UserError, match=r"h200-sxm profile is itself measured; give --base"):
        default_base("h200-sxm")


def _synthetic_eager_steps(seed: int, n: int, prefill_flags: bool = False) -> dict:
    """Inputs of the eager forms for ``n`` random steps of 40- and 64-layer models (the
    ``pre`` flag of half of them with ``prefill_flags``); the caller adds ``meas``."""
    rng = np.random.default_rng(seed)
    layers = rng.choice([40.0, 64.0], n)
    d = {
        "layer_k": layers * rng.uniform(50e-6, 2e-3, n),
        "lm": rng.uniform(1e-4, 1e-3, n),
        "tokens": rng.integers(1, 4096, n).astype(float),
        "layers": layers,
        "multi": (rng.integers(1, 9, n) > 1).astype(float),
    }
    if prefill_flags:
        d["pre"] = (rng.uniform(size=n) < 0.5).astype(float)
    return d


def test_overlap_form_fit_recovers_known_host_time() -> None:
    # synthetic eager steps: per layer the longer of kernels and a 300 µs launch, plus a
    # 150 µs sync with TP > 1, 2 ms per iteration and 40 µs per token
    n = 300
    d = _synthetic_eager_steps(1, n)
    truth = np.array([2e-3, 40e-6, 300e-6, 150e-6])
    d["meas"] = engines._eager_form_pred("overlap", truth, d)
    theta = engines._fit_eager_form("overlap", d, np.ones(n, bool))
    np.testing.assert_allclose(theta, truth, rtol=1e-3)


@pytest.mark.parametrize("form", ["overlap", engines.EAGER_OVERLAP_HIDDEN])
def test_a_launch_floor_no_fit_row_binds_is_set_by_the_rule(form: str) -> None:
    # steps whose kernels outlast any launch floor up to their smallest headroom: every
    # floor from 0 to it fits them alike; the rule picks the largest ("sup", shipped) or
    # none ("zero"), at the same cost, whatever the solver's start
    n = 200
    d = _synthetic_eager_steps(2, n)
    d["layer_k"] = d["layers"] * np.random.default_rng(3).uniform(800e-6, 2e-3, n)
    truth = np.array([2e-3, 40e-6, 0.0, 150e-6])
    d["meas"] = engines._eager_form_pred(form, truth, d)
    every = np.ones(n, bool)
    sup = engines._fit_eager_form(form, d, every)
    zero = engines._fit_eager_form(form, d, every, "zero")
    head = engines._floor_headroom(form, sup, d)
    assert sup[2] == pytest.approx(head.min(), rel=1e-12)
    assert zero[2] == 0.0
    np.testing.assert_allclose(sup[[0, 1, 3]], zero[[0, 1, 3]], rtol=0, atol=0)
    np.testing.assert_allclose(
        engines._eager_form_pred(form, sup, d), engines._eager_form_pred(form, zero, d), rtol=1e-12
    )
    # a floor that binds a fit row is identified: the rule leaves it
    bound = engines._fit_eager_form("overlap", d | {"layer_k": d["layer_k"] * 0.1}, every)
    assert (
        bound[2]
        > engines._floor_headroom("overlap", bound, d | {"layer_k": d["layer_k"] * 0.1}).min()
    )
    with pytest.raises(ValueError, match="unbound floor rule"):
        engines._floor_rule("overlap", sup, d, every, "mid")


@needs_data
def test_eager_forms_overlap_is_the_shipped_fit_and_keeps_the_holdout_miss() -> None:
    forms = engines.eager_forms(DATA)
    shipped = load_engines()["vllm-eager-2023"]
    ov = forms["overlap"]["params"]
    # the shipped profile is the overlap form fitted on DistServe's fit families
    assert ov["per_iteration_s"] == pytest.approx(shipped.per_iteration_s, rel=1e-3)
    assert ov["per_token_s"] == pytest.approx(shipped.per_token_s, rel=1e-3)
    assert ov["launch_per_layer_s"] == pytest.approx(shipped.launch_per_layer_s, rel=1e-3)
    assert ov["sync_per_layer_tp_s"] == pytest.approx(shipped.per_layer_tp_s, rel=1e-3)
    assert shipped.per_tp_rank_s == shipped.per_seq_s == shipped.per_layer_s == 0.0
    # two fitters of the additive form (NNLS over the design matrix, least squares over the
    # parts) agree
    add = forms["additive"]["params"]
    lin = engines.fit_engine_linear(
        engines.features(engines.eager_points(DATA)), "vllm-eager-2023"
    )["params"]
    for k in ("per_iteration_s", "per_token_s", "per_layer_tp_s"):
        assert add[k] == pytest.approx(lin[k], rel=1e-2), k
    assert forms["additive"]["all"]["n"] == forms["overlap"]["all"]["n"] > 400
    # docs/validation.md: overlapped host time fits better but keeps the held-out p90 miss
    assert forms["overlap"]["all"]["p90_ape"] < forms["additive"]["all"]["p90_ape"]
    assert forms["overlap"]["holdout"]["p90_ape"] > 0.15


@needs_data
def test_distserve_curve_checks_flag_the_opt13b_tp4_decode_slope() -> None:
    checks = engines.curve_checks(DATA, 2.039e12).set_index(["model", "tp"])
    # the held-out OPT-13B TP4 decode curve reads KV faster than the A100's HBM peak; no
    # other family does
    assert checks.loc[("opt-13b", 4), "of_hbm_peak"] > 1.2
    assert (checks.drop(index=("opt-13b", 4))["of_hbm_peak"] < 1.0).all()
    # by hand: slope b ms per (batch x context) token against 2 x 40 layers x 10 KV heads
    # x 128 x 2 bytes per token on one GPU
    b = engines.load_curves(DATA, "vllm")["facebook/opt-13b"]["4"]["decoding_smallbs"][1]
    assert checks.loc[("opt-13b", 4), "decode_kv_tb_per_s"] == pytest.approx(
        2 * 40 * 10 * 128 * 2 / (b * 1e-3) / 1e12
    )
    quad = checks.loc["opt-66b", "prefill_quad_ns_x_tp"]
    assert quad.min() < 0 < 100 < quad.max()


@needs_data
def test_engines_cli_rows_and_eager_forms(capsys) -> None:
    assert engines.main(["--data", str(DATA), "--rows", "trtllm"]) == 0
    out = capsys.readouterr().out
    assert "measured_over_predicted" in out and out.count("trtllm-0.9.0-perf") == 54
    assert engines.main(["--data", str(DATA), "--eager-forms"]) == 0
    out = capsys.readouterr().out
    assert "vllm-eager-2023 overlap:" in out and "of_hbm_peak" in out
    assert "vllm_minus_cxx_prefill_us_per_token" in out
    assert "prefill kernel scale (not shipped)" in out and "outside the profiled grid" in out
    assert "per-all-reduce cost c x g(tp) (not shipped)" in out
    assert "vllm-eager-2023 overlap-prefill:" in out and "every_family_in_sample" in out
    assert "Where the shipped profile's p90 comes from" in out and "+ every term" in out
    assert "Second source, Splitwise's 2023-vLLM measurements" in out and "overlap-hidden" in out


def test_harness_holds_distserve_published_grid() -> None:
    # evaluation/0-test-single-forward-performance/main.py get_profiling_params (DistServe
    # e2d4dca), typed here from the source: batches to 192, prompts to 2020 tokens
    h = engines.harness()
    assert h["limits"] == {
        ("opt-13b", 1): 49152,
        ("opt-13b", 2): 98304,
        ("opt-13b", 4): 250000,
        ("opt-66b", 2): 8192,
        ("opt-66b", 3): 36864,
        ("opt-66b", 4): 65000,
    }
    assert (h["max_batch"], h["max_len"]) == (192, 2020)
    for src in h["sources"]:
        assert len(src["commit"]) == 40 and src["repo"] and src["path"]


def test_in_profiled_domain_by_hand() -> None:
    pts = pd.DataFrame(
        [
            ("opt-13b", 1, 192, 256),  # 192 × 256 = 49152: the limit itself
            ("opt-13b", 1, 192, 257),  # 257 rounds up to 272: 52224 > 49152
            ("opt-13b", 4, 96, 2020),  # 96 × 2032 = 195072 ≤ 250000
            ("opt-13b", 4, 96, 2048),  # longer than any profiled prompt
            ("opt-13b", 4, 256, 64),  # larger than any profiled batch
            ("opt-66b", 8, 1, 64),  # family absent from the published grid
        ],
        columns=["model", "tp", "batch", "isl"],
    )
    assert engines.in_profiled_domain(pts).tolist() == [True, False, True, False, False, False]


def test_a_bad_harness_file_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "h.json"
    bad.write_text('{"token_limits": []}')
    with pytest.raises(UserError, match="cannot read the DistServe harness"):
        engines.harness(bad)


def test_prefill_scale_fit_recovers_a_known_scale() -> None:
    # synthetic steps: kernels + 4 ms per iteration + 20 µs per token + 150 µs per layer with
    # TP > 1, prefill kernels 1.3× slower than the model
    rng = np.random.default_rng(1)
    n = 120
    pre = np.arange(n) % 2 == 0
    tp = rng.choice([1, 2, 4], n)
    tokens = np.where(pre, rng.integers(64, 8192, n), rng.integers(1, 256, n)).astype(float)
    kern = rng.uniform(5e-3, 0.8, n)
    x = {k: np.zeros(n) for k in PARAM_KEYS}
    x["per_iteration_s"] = np.ones(n)
    x["per_tp_rank_s"] = tp - 1.0
    x["per_seq_s"] = rng.integers(1, 8, n).astype(float)
    x["per_token_s"] = tokens
    model = np.where(np.arange(n) % 3 == 0, "opt-13b", "opt-66b")
    x["per_layer_s"] = np.where(model == "opt-13b", 40.0, 64.0)
    x["per_layer_tp_s"] = x["per_layer_s"] * (tp > 1)
    meas = kern * np.where(pre, 1.3, 1.0) + 4e-3 + 20e-6 * tokens + 150e-6 * x["per_layer_tp_s"]
    rows = pd.DataFrame(
        {
            "kernels_s": kern,
            **{f"x_{k}": v for k, v in x.items()},
            "value_s": meas,
            "metric": np.where(pre, "prefill_step_s", "decode_ctx_step_s"),
            "split": "fit",
            "model": model,
            "tp": tp,
        }
    )
    f = engines.prefill_scale_fit(rows)
    p = f["params"]
    assert p["prefill_kernel_scale"] == pytest.approx(0.3, rel=1e-3)
    assert p["per_iteration_s"] == pytest.approx(4e-3, rel=1e-3)
    assert p["per_token_s"] == pytest.approx(20e-6, rel=1e-3)
    assert p["per_layer_tp_s"] == pytest.approx(150e-6, rel=1e-3)
    assert f["all"]["median_ape"] < 1e-6 and f["held_out_by_family"]["p90_ape"] < 1e-6


@needs_data
def test_same_box_comparison_follows_the_two_curves_by_hand() -> None:
    v = json.loads((DATA / "kernels/distserve/profiler-a100-80g.vllm.json").read_text())
    d = json.loads((DATA / "kernels/distserve/profiler-a100-80g.distserve.json").read_text())
    box = engines.same_box_comparison(DATA).set_index(["model", "tp"])
    for hf, model in (("facebook/opt-13b", "opt-13b"), ("facebook/opt-66b", "opt-66b")):
        for tp_s in v[hf]:
            cv, cd = v[hf][tp_s], d[hf][tp_s]
            # prefill of 4 prompts × 2048 tokens: a + b·8192 + c·4·2048², in ms
            pv = cv["prefill"][0] + cv["prefill"][1] * 8192 + cv["prefill"][2] * 4 * 2048**2
            pd_ = cd["prefill"][0] + cd["prefill"][1] * 8192 + cd["prefill"][2] * 4 * 2048**2
            # decode at batch 1, 64 context tokens (small-batch curve): a + b·64 + c·1
            dv = sum(c * w for c, w in zip(cv["decoding_smallbs"], (1, 64, 1), strict=True))
            dd = sum(c * w for c, w in zip(cd["decoding_smallbs"], (1, 64, 1), strict=True))
            row = box.loc[(model, int(tp_s))]
            assert row["vllm_minus_cxx_prefill_us_per_token"] == pytest.approx(
                (pv - pd_) / 8192 * 1e3, rel=1e-9
            )
            assert row["vllm_minus_cxx_decode_b1_ms"] == pytest.approx(dv - dd, rel=1e-9)
    assert box["in_published_grid"].sum() == 6 and not box.loc[("opt-66b", 8), "in_published_grid"]


@needs_data
def test_cxx_engine_runs_at_the_kernel_model_time_at_low_tp() -> None:
    # DistServe's C++ engine on the same A100s: where TP is low the kernel model alone is its
    # step time (within 6%); the 2023-vLLM curves of the same families are >= 1.18x
    box = engines.same_box_comparison(DATA).set_index(["model", "tp"])
    for fam in (("opt-13b", 1), ("opt-66b", 2), ("opt-66b", 3)):
        r = box.loc[fam]
        assert 0.95 < r["cxx_prefill_x_kernels"] < 1.06
        assert 0.95 < r["cxx_decode_x_kernels"] < 1.06
        assert r["vllm_prefill_x_kernels"] > 1.3 and r["vllm_decode_x_kernels"] > 1.15


def test_a_tp_growing_allreduce_cost_fits_the_cxx_engine_but_not_2023_vllm() -> None:
    # validation.md, vllm-eager-2023: a cost per all-reduce growing with TP, fitted on the C++
    # engine's fit families, predicts its held-out families (OPT-13B TP4, OPT-66B TP8) far
    # better than the kernels alone, but carried to 2023 vLLM it leaves the held-out p90
    # where it was, and vLLM's own fit gives it no weight: not shipped
    t = engines.tp_allreduce_term(DATA).set_index("form")
    base = t.loc["none (additive form)"]
    assert base["vllm_all_p90"] == pytest.approx(0.2505, abs=5e-4)
    for g in engines.AR_TP_FORMS:
        cxx = t.loc[f"C++-fitted c x {g}"]
        assert 5.0 < cxx["c_us"] < 20.0
        assert cxx["cxx_held_out"] < 0.5 * base["cxx_held_out"]
        assert cxx["vllm_held_out_p90"] > 0.3 and cxx["vllm_held_out"] > base["vllm_held_out"]
        assert t.loc[f"vLLM's own c x {g}", "c_us"] < 1e-3  # the solver's zero


@needs_data
def test_the_eager_p90_is_the_held_out_families_and_no_screened_cost_closes_it() -> None:
    # validation.md, vllm-eager-2023: with the shipped launch floor the DistServe points at or
    # above the p90 are mostly the two held-out families: OPT-13B TP4's prefills (0.59-0.74x:
    # predicted too slow) and OPT-66B TP8's small-batch decode (0.81-0.83x: the floor fitted
    # where every launch-bound fit point has 40 layers runs long at 64); OPT-13B TP4's
    # small-batch decode (1.35-1.40x under the additive form) is no longer among them
    top = engines.eager_p90_points(DATA)
    n = int(top["n"].sum())
    assert 40 <= n <= 46
    key = top["model"] + " TP" + top["tp"].astype(str)
    assert int(top["n"][key.isin(["opt-13b TP4", "opt-66b TP8"])].sum()) > 0.75 * n

    def group(k: str, phase: str, batches: str) -> pd.DataFrame:
        return top[(key == k) & (top["phase"] == phase) & (top["batches"] == batches)]

    assert group("opt-13b TP4", "decode", "1-8").empty
    pre = group("opt-13b TP4", "prefill", "1-8").iloc[0]
    assert 0.55 < pre["measured_over_predicted_min"] <= pre["measured_over_predicted_max"] < 0.75
    dec = group("opt-66b TP8", "decode", "1-8").iloc[0]
    assert dec["n"] >= 10
    assert 0.78 < dec["measured_over_predicted_min"] <= dec["measured_over_predicted_max"] < 0.85
    # each cost of the 2023 stack added to the additive form: none brings the all-rows p90
    # within the 15% target, the held-out p90 stays above 25%, and even every term at once
    # fitted to every family in sample stays above 15%
    t = engines.eager_term_screen(DATA).set_index("form")
    assert set(t.index) == {"additive", "+ every term"} | {f"+ {k}" for k in engines.EAGER_TERMS}
    assert t.loc["additive", "all_p90"] == pytest.approx(0.2505, abs=5e-4)
    assert (t["all_p90"] > 0.2).all() and (t["held_out_p90"] > 0.25).all()
    assert (t["every_family_in_sample_p90"] > 0.15).all()
    # the fit gives the Ray fan-out and the TP-growing sync no weight, and a slower decode
    # kernel almost none (1.4% over the decode kernels of 2026-12-04, 0 before; p90 +0.1 point)
    for k in ("seqs x tp", "layers x (tp - 1)", "layers x log2(tp)"):
        assert t.loc[f"+ {k}", "coef"] == 0.0
        assert t.loc[f"+ {k}", "all_p90"] == pytest.approx(t.loc["additive", "all_p90"], abs=1e-3)
    assert t.loc["+ decode attention x s", "coef"] < 0.02
    assert t.loc["+ decode attention x s", "all_p90"] == pytest.approx(
        t.loc["additive", "all_p90"], abs=2e-3
    )


def test_term_columns_by_hand() -> None:
    p = pd.DataFrame(
        {
            "tp": [1, 4], "num_layers": [40.0, 64.0], "tokens": [2048.0, 8.0],
            "metric": ["prefill_step_s", "decode_ctx_step_s"], "batch": [1, 8],
            "attention_s": [1e-3, 2e-3], "allreduce_s": [0.0, 3e-3], "elementwise_s": [4e-3, 5e-4],
            "layer_kernels_s": [0.1, 0.02], "lm_head_s": [1e-3, 2e-4], "hidden": [5120.0, 9216.0],
        }
    )  # fmt: skip
    c = engines._eager_term_columns(p)
    assert set(c) == set(engines.EAGER_TERMS)
    np.testing.assert_allclose(c["seqs x tp"], [1.0, 32.0])
    np.testing.assert_allclose(c["tokens x tp"], [2048.0, 32.0])
    np.testing.assert_allclose(c["layers x (tp - 1)"], [0.0, 192.0])
    np.testing.assert_allclose(c["layers x log2(tp)"], [0.0, 128.0])
    np.testing.assert_allclose(c["decode attention x s"], [0.0, 2e-3])
    np.testing.assert_allclose(c["prefill kernels x s"], [0.101, 0.0])
    np.testing.assert_allclose(c["tokens x layers x hidden"], [2048 * 40 * 5120, 8 * 64 * 9216])


def test_overlap_prefill_form_fit_recovers_a_known_scale() -> None:
    # the overlap form with prefill kernels 1.3x: the fitter recovers all five parameters
    n = 300
    d = _synthetic_eager_steps(2, n, prefill_flags=True)
    truth = np.array([2e-3, 40e-6, 300e-6, 150e-6, 0.3])
    d["meas"] = engines._eager_form_pred(engines.EAGER_OVERLAP_PREFILL, truth, d)
    theta = engines._fit_eager_form(engines.EAGER_OVERLAP_PREFILL, d, np.ones(n, bool))
    np.testing.assert_allclose(theta, truth, rtol=1e-3)


@needs_data
def test_overlap_prefill_fits_every_family_in_sample_but_not_held_out() -> None:
    # validation.md: the one form found that fits every DistServe family within the p90 target
    # in sample; fitted on the fit families it keeps a held-out p90 above 25%
    f = engines.eager_forms(DATA, forms=(engines.EAGER_OVERLAP_PREFILL,))
    f = f[engines.EAGER_OVERLAP_PREFILL]
    assert f["every_family_in_sample"]["p90_ape"] < 0.15
    assert f["holdout"]["p90_ape"] > 0.25 and f["all"]["p90_ape"] > 0.15
    assert 0.2 < f["params"]["prefill_kernel_scale"] < 0.35


def test_engines_cli_eager_forms_without_data_is_one_line_error(tmp_path: Path, capsys) -> None:
    assert engines.main(["--data", str(tmp_path), "--eager-forms"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "kernel tables not found" in err


@needs_data
def test_trtllm_per_query_head_decode_holds_out_on_h200_and_on_v05() -> None:
    """TensorRT-LLM 0.9's XQA took 1 or 8 query heads per KV head: of its measured models
    only Mistral-7B (4) ran the per-query-head kernel; 0.5 had no XQA, so Llama-2-70B (8)
    ran it too. The re-read rate is fitted on the 0.9 H100 and A100 Mistral rows only. Two
    held-out checks: the 0.9 H200 Mistral batches (the H100's SMs and L2, 1.43x its HBM
    bandwidth), predicted at least twice as well as by the grouped kernel, and the 0.5 H200
    Llama-2-70B batches (another model, group size and release) within 10% median. (Those
    four are FP8-weight, FP8-KV 70B batches whose steps are mostly FP8 GEMMs and prefills:
    since TensorRT-LLM's FP8 GEMM is fitted with its rows' dynamic scale apart and its
    FP8-KV prefill runs its FP8 context FMHA (2026-12-02) they no longer tell the two
    decode paths apart: 6.2% with the re-reads, 5.0% for the grouped variant's refit, which
    puts all host time on the extra TP rank and none per iteration; the re-reads had 2.1%.)"""
    points = engines.all_points(DATA)
    hit = engines.per_query_head_rows(points)
    got = set(zip(points[hit]["source"], points[hit]["model"], strict=True))
    assert got == {
        ("trtllm-0.9.0-perf", "mistral-7b"),
        ("trtllm-0.5.0-h200-blog", "llama-2-70b"),
    }
    feat = engines.features(points)
    with_reread = engines.fit_engine(
        feat, "trtllm", engines.reread_variants(points, feat, "trtllm")
    )
    grouped = engines.fit_engine(engines.features(points, reread_bytes_per_s={}), "trtllm")
    r = with_reread["rows"]
    batches = (r["metric"] == "batch_latency_s") & (r["gpu"] == "h200-sxm")
    for source, model, n, better_by in (
        ("trtllm-0.9.0-perf", "mistral-7b", 4, 2.0),
        ("trtllm-0.5.0-h200-blog", "llama-2-70b", 4, 0.0),
    ):
        sel = (batches & (r["source"] == source) & (r["model"] == model)).to_numpy()
        assert (r["split"][sel] == "holdout").all() and sel.sum() == n
        a_reread = np.median(with_reread["rows"]["ape"].to_numpy()[sel])
        a_grouped = np.median(grouped["rows"]["ape"].to_numpy()[sel])
        assert a_reread * better_by < a_grouped and a_reread < 0.10, (source, a_reread, a_grouped)
    # an L2 rate: above the H100's HBM peak, within the grid
    rate = with_reread["params"]["per_query_head_kv_bytes_per_s"]
    assert 3.35e12 < rate < 2e13
    # issue 13's engine target, every trtllm row (fit and held out): median <= 5%, p90 <= 15%
    every = with_reread["error"]["all"]
    assert every["median_ape"] <= 0.05 and every["p90_ape"] <= 0.15, every


def test_v05_h200_rows_follow_the_blog_by_hand() -> None:
    df = engines.read_measurements()
    t = df[df["source"] == "trtllm-0.5.0-h200-blog"]
    assert len(t) == 4 and (t["split"] == "holdout").all()
    # Llama-70B, TP2, batch 512, 128 in / 2048 out at 1,654 tok/s/GPU
    row = t[t["tp"] == 2]
    assert row["value_s"].item() == pytest.approx(512 * 2048 / (1654 * 2), rel=1e-5)
    tput = t["raw"].str.replace(",", "").str.extract(r"^([0-9]+)")[0].astype(float)
    np.testing.assert_allclose(t["value_s"], t["batch"] * t["osl"] / (tput * t["tp"]), rtol=1e-5)


@needs_data
def test_per_query_head_rates_are_the_rows_beyond_xqa() -> None:
    """TensorRT-LLM rows with more than 32 query heads per KV head (beyond its XQA) as
    query-head bytes and elements per second: bytes = elements x 1 (FP8) or 2 (bf16)."""
    r = fit_public.per_query_head_rates(DATA, "h100-sxm").reset_index()
    assert not r.empty and (r["q_per_kv"] > fit_public.XQA_MAX_Q_PER_KV).all()
    per_elem = np.where(r["dtype"] == "fp8", 1.0, 2.0)
    np.testing.assert_allclose(r["q_tb_per_s"], r["q_t_elem_per_s"] * per_elem, atol=0.011)
    # one group by hand: bf16, head dim 128, 64 query heads per KV head
    d = engines.public.aic_decode_attention(DATA, "h100-sxm")
    d = d[(d["framework"] == "trtllm") & (d["dtype"] == "bf16") & (d["head_dim"] == 128)]
    d = d[d["heads"] == 64 * d["kv_heads"]]
    q_bytes = 2.0 * d["context_tokens"] * d["heads"] * 128 * 2.0
    want = float(np.median((q_bytes / d["t_s"] / 1e12)[q_bytes >= 2e9]))
    got = r[(r["dtype"] == "bf16") & (r["head_dim"] == 128) & (r["q_per_kv"] == 64)]
    assert got["q_tb_per_s"].item() == pytest.approx(want, abs=0.006)


def test_splitwise_rows_are_the_transcription_by_hand() -> None:
    # the measurements hold exactly what the builder makes of the transcribed runs
    df = engines.read_measurements()
    s = df[df["source"] == engines.SPLITWISE_SOURCE].reset_index(drop=True)
    built = engines.splitwise_rows()
    assert len(s) == len(built) == 64
    for col in ("tp", "batch", "isl", "osl", "metric", "raw", "split", "url"):
        assert (s[col].astype(str) == built[col].astype(str)).all(), col
    np.testing.assert_allclose(s["value_s"], built["value_s"], rtol=1e-9)
    # held out entirely, one source, Llama-2-70B fp16 on the A100, the file at a pinned commit
    assert (s["split"] == "holdout").all() and (s["engine"] == "vllm-eager-2023").all()
    assert set(s["tp"]) == {2, 4, 8} and (s["model"] == "llama-2-70b").all()
    assert s["url"].str.contains("/blob/378088013a54df6f2052c27ff5ae6ea7619c3ecc/").all()
    # by hand: the median of five runs (ms), TP8 batch-1 decode after a 512-token prompt,
    # TP2 batch-1 first token of a 512-token prompt
    row = s[(s["tp"] == 8) & (s["batch"] == 1) & (s["isl"] == 512)]
    dec = row[row["metric"] == "decode_step_s"]["value_s"].item()
    assert dec == pytest.approx(np.median([44.8435, 44.7826, 44.8523, 45.0957, 44.9955]) / 1e3)
    row = s[(s["tp"] == 2) & (s["batch"] == 1) & (s["isl"] == 512)]
    ttft = row[row["metric"] == "ttft_s"]["value_s"].item()
    assert ttft == pytest.approx(196.8624e-3, rel=1e-5)  # value_s keeps 6 digits
    # prefills only where one iteration under any 2023 token budget; decode steps except
    # the two TP2 batches the source did not serve as one (e2e far above prompt + 127 tokens)
    pre = s[s["metric"] == "ttft_s"]
    assert ((pre["batch"] == 1) | (pre["batch"] * pre["isl"] <= 2560)).all() and len(pre) == 27
    dec = s[s["metric"] == "decode_step_s"]
    assert not ((dec["tp"] == 2) & (dec["batch"] >= 32)).any() and len(dec) == 37
    assert set(engines.SPLITWISE_DECODE_EXCLUDED["a100-80gb"]) == {(2, 32), (2, 64)}


def test_splitwise_h100_rows_are_the_transcription_by_hand() -> None:
    # the DGX-H100 runs of the same file: their own source, the H100 SXM, fit rows of the
    # one parameter they alone tell (that host's speed); the measurements hold exactly what
    # the builder makes of the transcribed runs
    df = engines.read_measurements()
    s = df[df["source"] == engines.SPLITWISE_H100_SOURCE].reset_index(drop=True)
    built = engines.splitwise_rows("h100-sxm")
    assert len(s) == len(built) == 65
    for col in ("tp", "batch", "isl", "osl", "metric", "raw", "split", "url", "version"):
        assert (s[col].astype(str) == built[col].astype(str)).all(), col
    np.testing.assert_allclose(s["value_s"], built["value_s"], rtol=1e-9)
    assert (s["split"] == "fit").all() and (s["gpu"] == "h100-sxm").all()
    assert (s["engine"] == "vllm-eager-2023").all() and (s["model"] == "llama-2-70b").all()
    # by hand from data/perf_model.csv at the pinned commit (ms, the median of five runs):
    # TP4 batch-1 decode after a 512-token prompt, TP2 batch-1 first token of 8192 tokens
    row = s[(s["tp"] == 4) & (s["batch"] == 1) & (s["isl"] == 512)]
    dec = row[row["metric"] == "decode_step_s"]["value_s"].item()
    assert dec == pytest.approx(np.median([29.7623, 29.2666, 29.7387, 29.5440, 29.7181]) / 1e3)
    row = s[(s["tp"] == 2) & (s["batch"] == 1) & (s["isl"] == 8192)]
    ttft = row[row["metric"] == "ttft_s"]["value_s"].item()
    assert ttft == pytest.approx(1339.8417e-3, rel=1e-5)
    # only TP2 batch 64 is excluded on the H100 (its batch 32 was served as one batch)
    dec = s[s["metric"] == "decode_step_s"]
    assert ((dec["tp"] == 2) & (dec["batch"] == 32)).any() and len(dec) == 38
    assert set(engines.SPLITWISE_DECODE_EXCLUDED["h100-sxm"]) == {(2, 64)}
    # the same configurations as the A100 file, five runs each
    a100 = pd.read_csv(engines.SPLITWISE_RAW)
    h100 = pd.read_csv(engines.SPLITWISE_H100_RAW)
    keys = ["tensor_parallel", "batch_size", "prompt_size", "token_size", "run"]
    assert sorted(map(tuple, a100[keys].to_numpy())) == sorted(map(tuple, h100[keys].to_numpy()))


def test_splitwise_rejects_a_file_of_another_gpu(tmp_path: Path) -> None:
    bad = tmp_path / "sw.csv"
    shutil.copy(engines.SPLITWISE_RAW, bad)
    with pytest.raises(UserError, match="hardware must be 'h100-80gb'"):
        engines.splitwise_rows("h100-sxm", bad)
    with pytest.raises(UserError, match="allowed: a100-80gb, h100-sxm"):
        engines.splitwise_rows("b200")


def test_eager_rows_run_on_their_own_gpu() -> None:
    # a 2023-vLLM row of the H100 costs the H100's kernels, not the A100's (the A100 is
    # where DistServe's curves, and the eager profile's fit rows, were measured)
    df = engines.read_measurements()
    pair = []
    for src in (engines.SPLITWISE_SOURCE, engines.SPLITWISE_H100_SOURCE):
        r = df[(df["source"] == src) & (df["tp"] == 2) & (df["batch"] == 1) & (df["isl"] == 8192)]
        pair.append(r[r["metric"] == "ttft_s"])
    parts = engines.eager_parts(engines.REPO, None, pd.concat(pair, ignore_index=True))
    a100, h100 = parts["layer_kernels_s"].to_numpy()
    # an 8192-token prefill is GEMM-bound: the H100's fp16 GEMMs at about 3x the A100's
    assert 2.0 < a100 / h100 < 3.5


def test_overlap_hidden_form_fit_recovers_known_host_time() -> None:
    # per layer the longer of the kernels and a 300 µs launch + 150 µs sync with TP > 1
    n = 300
    d = _synthetic_eager_steps(3, n)
    truth = np.array([2e-3, 40e-6, 300e-6, 150e-6])
    d["meas"] = engines._eager_form_pred(engines.EAGER_OVERLAP_HIDDEN, truth, d)
    theta = engines._fit_eager_form(engines.EAGER_OVERLAP_HIDDEN, d, np.ones(n, bool))
    np.testing.assert_allclose(theta, truth, rtol=1e-3)


@needs_data
def test_splitwise_second_source_holds_the_shipped_profile_out_and_no_form_meets_both() -> None:
    # validation.md, vllm-eager-2023 second source: Splitwise's measurements (never fitted)
    # against each form fitted on DistServe's fit families, then with Splitwise's other TPs
    recs = engines.second_source_check(DATA)
    by = {(r["form"], r["fitted_on"], r["rows"]): r for r in recs}
    ds = "DistServe fit families"

    def get(form: str, rows: str, fitted: str = ds) -> dict:
        return by[(form, fitted, rows)]

    # the additive form on DistServe's fit families (shipped until 2026-12-02): Splitwise
    # held out well outside the targets, its TP2 decode steps predicted too slow
    assert get("additive", "DistServe, all rows")["p90_ape"] == pytest.approx(0.2505, abs=5e-4)
    sw = get("additive", "Splitwise, all rows (held out)")
    assert sw["n"] == 64 and sw["median_ape"] > 0.15 and sw["p90_ape"] > 0.25
    assert get("additive", "Splitwise TP2 decode (held out)")["median_ape"] > 0.2
    # host time hidden behind the kernels (a launch floor): Splitwise's decode steps within
    # the p90 target at every TP from DistServe's fit alone (median 5.1-8.3% over the decode
    # kernels of 2026-12-04: TP2 8.3%, under 7% before); its prefills and DistServe's
    # held-out families are not
    hid = engines.EAGER_OVERLAP_HIDDEN
    for tp in engines.SECOND_SOURCE_TPS:
        r = get(hid, f"Splitwise TP{tp} decode (held out)")
        assert r["median_ape"] < 0.09 and r["p90_ape"] < 0.13
    assert get(hid, "Splitwise, all rows (held out)")["p90_ape"] > 0.15
    assert get(hid, "DistServe held-out families")["p90_ape"] > 0.3
    # with Splitwise's other TPs in the fit no form holds every left-out TP within the p90
    # target (the closest: host time hidden, TP2 left out, 15.3%), and DistServe's held-out
    # families stay at 29.9-33.7% p90
    for form in ("additive", "overlap", hid):
        p90 = []
        for tp in engines.SECOND_SOURCE_TPS:
            fitted = f"{ds} + Splitwise without TP{tp}"
            p90.append(get(form, f"Splitwise TP{tp} (held out)", fitted)["p90_ape"])
            assert get(form, "DistServe held-out families", fitted)["p90_ape"] > 0.29
        assert min(p90) > 0.14 and max(p90) > 0.2, (form, p90)


@needs_data
def test_the_step_model_runs_the_shipped_eager_fit_as_fitted() -> None:
    # vllm-eager-2023 ships the overlap form (a launch floor): the step model, with the
    # shipped profile, predicts every row (DistServe's curves and Splitwise's measurements)
    # as the form's fit does, so the errors engines.json and validation.md report are the
    # simulator's
    points = engines.all_points(DATA)
    rows = engines.features(points[points["engine"] == "vllm-eager-2023"])
    f = engines.fit_eager(rows.reset_index(drop=True))
    shipped = load_engines()["vllm-eager-2023"]
    assert shipped.launch_per_layer_s > 0.0
    pred = engines.step_model_pred(f["rows"], shipped)
    # params rounded to 5 significant digits in engines.json
    np.testing.assert_allclose(pred, f["rows"]["pred_s"].to_numpy(float), rtol=1e-4)
    # the floor binds where the kernels are short: OPT-13B TP4 small-batch decode steps
    # are the launches (and so the same at every context), OPT-66B TP2's are not
    r = f["rows"].assign(pred=pred)
    dec = r[(r["metric"] == "decode_ctx_step_s") & (r["batch"] == 1)]
    t4 = dec[(dec["model"] == "opt-13b") & (dec["tp"] == 4)]["pred"].to_numpy(float)
    assert np.ptp(t4) == pytest.approx(0.0, abs=1e-12) and len(t4) >= 5
    t2 = dec[(dec["model"] == "opt-66b") & (dec["tp"] == 2)]["pred"].to_numpy(float)
    assert np.ptp(t2) > 1e-4


@needs_data
def test_a_launch_floor_explains_the_opt13b_tp4_curve_slope_above_hbm_peak() -> None:
    # validation.md, vllm-eager-2023: DistServe's OPT-13B TP4 small-batch decode curve has a
    # slope in the context that implies reading KV at 1.30x the A100's HBM peak. The
    # shipped step model (every kernel within the peak, plus the launch floor), sampled on
    # DistServe's profiled grid and fitted with DistServe's own form, gives the same
    # signature there (the steps are flat in the context under the floor), and elsewhere at
    # most at the peak's level: OPT-66B TP8, whose 9 KV heads a GPU put part of its grid
    # under the floor too, 1.02 x over the decode kernels of 2026-12-04 (under 1 before;
    # the others 0.75-0.86)
    t = engines.floor_curve_slopes(DATA).set_index(["model", "tp"])
    assert t.loc[("opt-13b", 4), "curve_of_peak"] > 1.2
    assert t.loc[("opt-13b", 4), "model_of_peak"] > 1.2
    others = t.drop(index=[("opt-13b", 4), ("opt-66b", 8)])
    assert (others["model_of_peak"] < 1.0).all()
    assert t.loc[("opt-66b", 8), "model_of_peak"] < 1.1


@needs_data
def test_no_eager_form_meets_the_target_even_fitted_to_every_row() -> None:
    # validation.md, vllm-eager-2023: fitted to all 492 rows of both A100 sources, nothing held
    # out, no form reaches the p90 target of 15% (the best about 20%): the miss is in the
    # data's mutual consistency, not only in extrapolation to the held-out rows
    every = engines.eager_every_row_in_sample(DATA)
    assert set(every) == set(engines.EAGER_SECOND_FORMS)
    for form, a in every.items():
        assert len(a) == 492
        assert np.percentile(a, 90) > 0.19, form


def test_gemm_layer_times_sum_to_the_breakdown() -> None:
    from disaggsim.costmodel.step import build_worker_cost

    for model, tp in (("opt-13b", 2), ("llama-2-70b", 8)):
        w = build_worker_cost(model, "a100-80gb", tp, engine=engines.ZERO_ENGINE)
        layers = w.model.num_layers
        for tokens in (1, 64, 4096):
            bd = w.breakdown(prefill_seqs=1, prefill_tokens=tokens, prefill_attn_pairs=1.0)
            assert layers * sum(w.gemm_layer_times_s(tokens)) == pytest.approx(bd.gemm_s, rel=1e-12)


@needs_data
def test_prefill_structure_all_reduce_factor_and_screen() -> None:
    ar = engines.cxx_prefill_allreduce(DATA)
    # DistServe's C++ engine (no Python) on the same A100s: its prefill steps are the kernel
    # model with every all-reduce ~1.5x nccl-tests' time (2026-12-02: 1.495)
    assert 1.3 < ar["cxx"]["allreduce_scale"] < 1.7
    assert ar["cxx"]["fitted"]["p90_ape"] < 0.10 < ar["cxx"]["kernels_only"]["p90_ape"]
    # and it holds with each family held out of the fit (2026-12-02: 1.35-1.57, p90 10.4%)
    lo, hi = ar["cxx"]["allreduce_scale_without_each_family"]
    assert 1.25 < lo <= hi < 1.75
    assert ar["cxx"]["held_out_by_family"]["p90_ape"] < 0.12
    assert 1.5 < ar["splitwise"]["allreduce_scale"] < 2.5
    screen = engines.eager_prefill_screen(DATA, cxx_allreduce=ar["cxx"]["allreduce_scale"])
    first = screen.iloc[0]
    assert first["shipped"] and screen["shipped"].sum() == 1
    shipped = load_engines()["vllm-eager-2023"]
    # the screen's first form is the shipped fit
    assert first["params"]["per token"] == pytest.approx(shipped.per_token_s, rel=1e-3)
    assert first["params"]["launch_per_layer_s"] == pytest.approx(
        shipped.launch_per_layer_s, rel=1e-3
    )
    assert first["all"]["median_ape"] == pytest.approx(
        shipped.fit_error["all"]["median_ape"], abs=2e-3
    )
    # no form of the screen reaches the target's p90 on every row (the miss is documented)
    assert all(r["p90_ape"] > 0.15 for r in screen["all"])
    # the Ray workers' block tables (per context block and rank): a positive cost that moves
    # the all-rows p90 by under a point and the in-sample p90 by under one (0.6 point over
    # the decode kernels of 2026-12-04: 18.8% -> 18.2%; none before them)
    blocks = screen.set_index("form").loc["per token + per context block x tp"]
    assert blocks["params"]["per context block x tp"] > 1e-8
    assert first["all"]["p90_ape"] - 0.01 < blocks["all"]["p90_ape"] < first["all"]["p90_ape"]
    assert blocks["distserve_every_family_in_sample"]["p90_ape"] == pytest.approx(
        first["distserve_every_family_in_sample"]["p90_ape"], abs=0.01
    )
    # per-token work sharded by TP (each rank on its own shard) beside the shared per-token
    # time: the fit rows put nothing on it (2026-12-03: 3e-26 s a token), and as the only
    # per-token time it is worse on every row than the shared one (p90 26.9 % vs 22.4 %)
    split = screen.set_index("form").loc["per token + per token / tp"]
    assert split["params"]["per token / tp"] < 1e-9
    assert split["params"]["per token"] == pytest.approx(first["params"]["per token"], rel=0.01)
    per_rank = screen.set_index("form").loc["per token / tp"]
    assert per_rank["all"]["p90_ape"] > first["all"]["p90_ape"] + 0.02
    assert per_rank["distserve_fit"]["p90_ape"] > first["distserve_fit"]["p90_ape"]


def test_lmdeploy_rows_follow_the_table_and_no_overhead_fits_the_mha_model() -> None:
    """LMDeploy TurboMind's A100 FP16 table (docs/en/benchmark/a100_fp16.md): batch latency
    = batch x generated tokens / output throughput. Llama-2-7B (32 KV heads) decodes faster
    than the step model's kernels alone: no engine overhead >= 0 fits it, so no lmdeploy
    profile ships (docs/calibration.md)."""
    t = engines.lmdeploy_check()
    r = t[(t["model"] == "llama-2-7b") & (t["batch"] == 1) & (t["isl"] == 1)].iloc[0]
    assert r["value_s"] == pytest.approx(128 / 100.02, rel=1e-9)
    r = t[(t["model"] == "llama-2-70b") & (t["batch"] == 64) & (t["osl"] == 2048)].iloc[0]
    assert r["value_s"] == pytest.approx(64 * 2048 / 1391.8, rel=1e-9) and r["tp"] == 4
    assert len(t) == 22 and set(t["gpu"]) == {"a100-80gb"}
    assert t["raw"].str.contains("throughput\\(out tok/s\\)").all()
    # every batch-1 and long-decode row of the 7B: the kernels alone exceed the measurement
    mha = (t["model"] == "llama-2-7b") & ((t["batch"] == 1) | (t["osl"] == 2048))
    assert (t.loc[mha, "kernels_over_measured"] > 1.04).all()
    assert (t.loc[mha, "implied_host_ms"] < 0).all()


@needs_data
def test_eager_host_check_compares_the_same_runs_on_both_dgxs() -> None:
    hc = engines.eager_host_check(DATA)
    r = hc["ratio"]
    row = r[(r["metric"] == "decode_step_s") & (r["tp"] == 4) & (r["batch"] == 1)]
    row = row[row["isl"] == 512]
    # by hand: the medians of the five runs in each transcription (ms)
    want = np.median([29.7623, 29.2666, 29.7387, 29.5440, 29.7181]) / np.median(
        [44.3180, 44.6144, 44.9913, 45.2837, 45.5883]
    )
    assert row["ratio"].item() == pytest.approx(want, rel=1e-5)
    # the diagnostic's factor is a grid value, and it is what the H100 rows' error is least at
    assert hc["host_scale"] in engines.HOST_SCALE_GRID
    assert hc["scaled_h100"][0] <= hc["shipped"]["h100-sxm"][0]


@needs_data
def test_sglang_moe_rows_split_by_tile_config() -> None:
    t = engines.sglang_moe_configs(DATA).set_index(["moe_tp_size", "moe_ep_size"])
    tp2 = t.loc[(2, 1)]
    assert (tp2["E"], tp2["N"]) == (8, 7168)  # the shape SGLang ships an H100 config for
    # by hand: SGLang 0.5.14's TP2 row at 16,384 tokens took 10.553414 ms for 2 x 32,768
    # routed tokens x 4096 x 7168 x 3 matrices of FLOPs
    want = 2 * 32768 * 4096 * 7168 * 3 / 10.553414e-3 / 1e12
    assert tp2["sglang_tflop_per_s"] == pytest.approx(want, rel=1e-5)
    # the tuned shapes (TP 2-8, all experts on the rank) run 2.3-2.8x the untuned ones
    tuned = t.loc[[(2, 1), (4, 1), (8, 1)], "sglang_tflop_per_s"]
    untuned = t.loc[[(1, 1), (16, 1), (32, 1)], "sglang_tflop_per_s"]
    assert tuned.min() > 2.2 * untuned.max()
    # each row is predicted with the set of the tiles it ran (moe_params.gemm(tuned=...)):
    # TP2, 4 and 8, whose shapes have a listed config (TP4/8 since 2026-12-04: the vLLM
    # files SGLang's configs/triton_3_1_0 copied), by the tuned set within 15 % (0.91,
    # 0.90, 0.99; TP4 and TP8 were 2.10x and 2.24x on the default-tile set before)
    tp248 = t.loc[[(2, 1), (4, 1), (8, 1)], "sglang_pred_over_measured_gt1024"]
    assert (abs(tp248 - 1.0) < 0.15).all(), tp248


def test_h800_gemm_check_against_deepgemm_by_hand() -> None:
    t = engines.h800_gemm_check()
    assert len(t) == 18 and set(t["m"]) == {64, 128, 4096}
    row = t[(t["m"] == 64) & (t["n"] == 7168) & (t["k"] == 16384)]
    # by hand: 336 TFLOPS for 2 x 64 x 7168 x 16384 FLOP; the README's 2668 GB/s is the same
    # run's (m k + k n + 2 m n) bytes over that time, 0.796 of the H800's 3.35 TB/s
    t_s = 2 * 64 * 7168 * 16384 / 336e12
    assert row["measured_us"].item() == pytest.approx(t_s * 1e6, rel=1e-9)
    assert row["streamed_of_peak"].item() == pytest.approx(2668e9 / 3.35e12, rel=5e-3)
    # the H800 profile's FP8 GEMM (the H100 SXM's efficiencies, carried) holds the
    # decode-sized (weight-streaming) rows within 10% at the median
    mem = t[t["m"] <= engines.DEEPGEMM_STREAM_M]["measured_over_predicted"]
    assert 0.9 < mem.median() < 1.1


@needs_data
def test_eager_host_scale_fits_the_h100_host_only() -> None:
    # the A100-fitted host terms do not move with the H100 rows; the H100 host's factor
    # follows them (every H100 measurement doubled: the host part of each roughly doubles,
    # so the factor grows, and the A100 parameters stay put)
    points = engines.all_points(DATA)
    rows = engines.features(points[points["engine"] == "vllm-eager-2023"]).reset_index(drop=True)
    base = engines.fit_eager(rows)
    h100 = (rows["gpu"] == "h100-sxm").to_numpy()
    assert h100.sum() == 65 and set(base["host_scale"]) == {"h100-sxm"}
    assert 0.4 < base["host_scale"]["h100-sxm"] < 0.9  # Splitwise: the same runs 0.667x
    slow = rows.copy()
    slow.loc[h100, "value_s"] = slow.loc[h100, "value_s"] * 2.0
    moved = engines.fit_eager(slow)
    assert moved["params"] == base["params"]
    assert moved["host_scale"]["h100-sxm"] > 1.5 * base["host_scale"]["h100-sxm"]
    # each H100 TP family predicted by a fit without it beats the A100 host's terms as is
    r = base["rows"]
    h = r[r["gpu"] == "h100-sxm"]
    lofo = np.abs(h["lofo_pred_s"] / h["value_s"] - 1.0)
    as_is_median = engines.eager_host_check(DATA)["shipped"]["h100-sxm"][0]
    assert np.median(lofo) < 0.5 * as_is_median


def test_eager_regimes_split_every_row_by_hand() -> None:
    # four rows: two decode batches in different bands, one prefill, one miss
    rows = pd.DataFrame(
        {
            "source": ["s", "s", "s", "s"],
            "model": ["m", "m", "m", "m"],
            "tp": [2, 2, 2, 2],
            "metric": ["decode_step_s", "decode_step_s", "ttft_s", "decode_ctx_step_s"],
            "batch": [1, 64, 4, 8],
            "value_s": [1.0, 2.0, 3.0, 1.2],
            "pred_s": [1.0, 1.0, 3.3, 1.0],
        }
    )
    t = engines.eager_regimes(rows).set_index(["phase", "batches"])
    assert int(t["n"].sum()) == len(rows)
    small = t.loc[("decode", "1-8")]
    # the batch-1 and batch-8 decode rows: ratios 1.0 and 1.2 (APE 0 and 1/6 = 16.7%)
    assert small["n"] == 2 and small["measured_over_predicted"] == pytest.approx(1.1)
    assert small["lowest"] == pytest.approx(1.0) and small["highest"] == pytest.approx(1.2)
    assert small["above_miss"] == 1
    assert t.loc[("decode", "16-64"), "measured_over_predicted"] == pytest.approx(2.0)
    assert t.loc[("prefill", "1-8"), "median_ape"] == pytest.approx(0.1)
    assert t.loc[("prefill", "1-8"), "above_miss"] == 0


@needs_data
def test_eager_per_query_head_check_moves_only_the_grouped_rows() -> None:
    t = engines.eager_per_query_head_check(DATA, rates=(2e12, 1e18))
    shipped = load_engines()["vllm-eager-2023"]
    by = t.set_index(["reread_tb_per_s", "rows"])
    # rate 0 is the shipped fit: its H100 host factor and all-rows error as engines.json has
    assert by.loc[(0.0, "all"), "h100_host_scale"] == pytest.approx(
        shipped.host_scale_for("h100-sxm"), rel=1e-4
    )
    doc = json.loads(shipped_engines_path().read_text())
    err = doc["engines"]["vllm-eager-2023"]["fit_error"]
    assert by.loc[(0.0, "all"), "median_ape"] == pytest.approx(err["all"]["median_ape"], abs=1e-4)
    # OPT (DistServe) is MHA: per-query-head decode changes none of its rows at any rate
    for rate in (2.0, 1e6):
        assert by.loc[(rate, "distserve-vllm"), "p90_ape"] == pytest.approx(
            by.loc[(0.0, "distserve-vllm"), "p90_ape"], rel=1e-9
        )
    # re-reads at a rate no GPU has cost nothing: the shipped figures again
    assert by.loc[(1e6, "splitwise-sim"), "median_ape"] == pytest.approx(
        by.loc[(0.0, "splitwise-sim"), "median_ape"], rel=1e-6
    )
    # at about the HBM peak they cost the Llama-2-70B decode steps: the H100 rows move
    assert by.loc[(2.0, "splitwise-sim-h100"), "median_ape"] != pytest.approx(
        by.loc[(0.0, "splitwise-sim-h100"), "median_ape"], rel=1e-3
    )


def test_engines_cli_eager_regimes(capsys) -> None:
    assert engines.main(["--data", str(DATA), "--eager-regimes"]) == 0
    out = capsys.readouterr().out
    assert "by regime" in out and "above_miss" in out and "splitwise-sim-h100" in out
    assert "head_mapping" in out and "reread_tb_per_s" in out


def test_splitwise_tp_split_solves_sharded_and_unsharded_parts_by_hand() -> None:
    # measured T(tp) = 600 / tp + 50 ms, predicted 400 / tp + 80 ms, at one prompt length
    tps = (2, 4, 8)
    rows = pd.DataFrame(
        {
            "source": [engines.SPLITWISE_H100_SOURCE] * 3,
            "gpu": ["h100-sxm"] * 3,
            "metric": ["ttft_s"] * 3,
            "batch": [1] * 3,
            "isl": [1000] * 3,
            "tp": list(tps),
            "value_s": [(600 / t + 50) * 1e-3 for t in tps],
            "pred_s": [(400 / t + 80) * 1e-3 for t in tps],
        }
    )
    t = engines.splitwise_tp_split(rows).iloc[0]
    assert t["sharded_ms"] == pytest.approx(600.0) and t["unsharded_ms"] == pytest.approx(50.0)
    assert t["unsharded_us_per_token"] == pytest.approx(50.0)  # 50 ms over 1,000 tokens
    assert t["tp8_from_split_ms"] == pytest.approx(600 / 8 + 50) == t["tp8_ms"]
    assert t["pred_sharded_ms"] == pytest.approx(400.0)
    assert t["pred_unsharded_ms"] == pytest.approx(80.0)


def test_splitwise_tp_split_and_spread_on_the_transcription_by_hand() -> None:
    # the H100 runs of a 2,048-token prompt (calibration/engine_data/splitwise_llama2_70b_h100.csv):
    # medians 310.3167 ms at TP 2 and 200.6807 ms at TP 4
    rows = pd.concat([engines.splitwise_rows(g) for g in engines.SPLITWISE_FILES]).assign(
        pred_s=1.0
    )
    t = engines.splitwise_tp_split(rows).set_index(["gpu", "isl"])
    r = t.loc[("h100-sxm", 2048)]
    assert r["unsharded_ms"] == pytest.approx(2 * 200.6807 - 310.3167, abs=1e-3)
    assert r["sharded_ms"] == pytest.approx(4 * (310.3167 - 200.6807), abs=1e-3)
    # its TP-8 runs of a 4,096-token prompt: 322.0708 to 418.5787 ms, median 390.2908
    s = engines.splitwise_run_spread("h100-sxm").set_index(["tp", "isl"])
    assert s.loc[(8, 4096), "run_spread"] == pytest.approx((418.5787 - 322.0708) / 390.2908)
    with pytest.raises(UserError, match="allowed"):
        engines.splitwise_run_spread("b200")


@needs_data
def test_engines_cli_splitwise_tp_split(capsys) -> None:
    assert engines.main(["--data", str(DATA), "--splitwise-tp-split"]) == 0
    out = capsys.readouterr().out
    assert "unsharded_us_per_token" in out and "spread of the five runs" in out


def test_tp_consistency_bound_by_hand() -> None:
    # batch 1: T(tp) = 8 / tp + 1 s (sharded 8 s, the rest 1 s): T1 9, T2 5, T4 3;
    # batch 2: the same but T4 = 2.5 s, faster than any sharded-plus-rest engine allows
    base = {"source": "s", "gpu": "g", "model": "m", "metric": "prefill_step_s", "isl": 8, "osl": 0}
    rows = pd.DataFrame(
        [
            {**base, "batch": b, "tp": tp, "value_s": v, "pred_s": 8 / tp + 1}
            for b, times in ((1, (9.0, 5.0, 3.0)), (2, (9.0, 5.0, 2.5)))
            for tp, v in zip((1, 2, 4), times, strict=True)
        ]
    )
    t = engines.tp_consistency(rows).set_index("batch")
    # bound T4 >= T2 - 1 x T1 x (1/2 - 1/4) = 5 - 9/4 = 2.75 s
    assert t.loc[1, "bound_s"] == pytest.approx(2.75) and t.loc[2, "bound_s"] == pytest.approx(2.75)
    assert t.loc[1, "ratio"] == pytest.approx(3 / 2.75) and t.loc[2, "ratio"] == pytest.approx(
        2.5 / 2.75
    )
    assert t["pred_ratio"].tolist() == pytest.approx([3 / 2.75] * 2)
    marked = engines.tp_inconsistent_rows(rows, engines.tp_consistency(rows))
    assert marked.tolist() == [False] * 3 + [True] * 3


@needs_data
def test_the_step_model_is_tp_consistent_and_distserve_opt13b_tp4_is_not() -> None:
    rows = engines.fit_all(DATA)[engines.EAGER_ENGINE]["rows"]
    t = engines.tp_consistency(rows)
    # the step model is a sharded-plus-rest engine: its own predictions never cross the bound
    assert (t["pred_ratio"] >= 1.0).all()
    # DistServe's OPT-13B prefill of 4 x 2,048 tokens: 1.3086 s at TP 1, 0.9110 at TP 2,
    # 0.4596 at TP 4 (--rows vllm-eager-2023), under the bound 0.9110 - 1.3086 / 4
    q = t[
        (t["model"] == "opt-13b")
        & (t["metric"] == "prefill_step_s")
        & (t["batch"] == 4)
        & (t["isl"] == 2048)
        & (t["tp_a"] == 1)
        & (t["tp_c"] == 4)
    ]
    assert q["ratio"].item() == pytest.approx(0.4596 / (0.9110 - 1.3086 / 4), rel=1e-3)


@needs_data
def test_engines_cli_tp_consistency(capsys) -> None:
    assert engines.main(["--data", str(DATA), "--tp-consistency"]) == 0
    out = capsys.readouterr().out
    assert "below the bound" in out and "missed_in_triple" in out


def test_a_fit_is_made_once_per_rows_and_handed_out_as_a_copy(monkeypatch) -> None:
    # fit_engine keeps its results by what they are computed from: the same rows are not
    # fitted again, a caller changing its result does not change the next caller's, and
    # other rows (another value, another kernel time) are fitted anew
    monkeypatch.setattr(engines, "_FITTED", KeptResults(limit=16))
    calls = []
    linear = engines.fit_engine_linear
    monkeypatch.setattr(
        engines, "fit_engine_linear", lambda *a, **k: calls.append(1) or linear(*a, **k)
    )
    points = engines.all_points(DATA)
    feat = engines.features(points)
    first = engines.fit_engine(feat, "vllm")
    first["params"]["per_iteration_s"] = -1.0
    first["rows"]["value_s"] = 0.0
    again = engines.fit_engine(feat.copy(), "vllm")
    assert len(calls) == 1
    assert again["params"]["per_iteration_s"] >= 0.0 and (again["rows"]["value_s"] > 0.0).all()
    for column in ("value_s", "kernels_s"):
        other = feat.copy()
        i = np.flatnonzero((other["engine"] == "vllm") & (other["split"] == "fit"))[0]
        other.loc[i, column] *= 1.5
        moved = engines.fit_engine(other, "vllm")
        assert moved["params"] != again["params"], column
    assert len(calls) == 3
