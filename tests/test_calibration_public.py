"""Accuracy of the shipped cost model on the public measured kernel tables (every row)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration import public, validate
from disaggsim.costmodel import ops
from disaggsim.hardware.profile import load_profile
from tests.conftest import SHARED_DATA as DATA

pytestmark = pytest.mark.skipif(
    not (DATA / "kernels").is_dir(), reason=f"public kernel tables absent at {DATA}"
)

# Targets the shipped profiles do not meet yet, each stated in docs/validation.md. strict:
# if a refit meets one, this test fails until it is removed from the list.
KNOWN_MISSES: set[tuple[str, str, str]] = {
    # (SGLang FP8 GEMM: 12.9% with the shared FP8 GEMM, met by SGLang's own kernel, the
    # engine profile's fp8_gemm_kernel, in sample and with its (n, k) families held out)
    # (vLLM FP8-KV decode, 10.8% under the bandwidth-share form, meets its target at 9.8%
    # as a split-KV kernel: docs/costmodel.md)
}


@pytest.fixture(scope="module")
def report() -> validate.Report:
    return validate.run(["a100-80gb", "h100-sxm"], DATA, extended=False)


def _targeted(report: validate.Report):
    return [r for r in report.rows if r.met is not None]


def test_validation_covers_every_targeted_table(report: validate.Report) -> None:
    got = {(r.gpu, r.op) for r in _targeted(report)}
    for gpu in ("a100-80gb", "h100-sxm"):
        assert {
            (gpu, "gemm"),
            (gpu, "decode_attention"),
            (gpu, "prefill_attention"),
            (gpu, "allreduce"),
        } <= got
    # every bf16 vLLM GEMM row is counted (row count read independently of validate)
    g = public.aic_gemm(DATA, "h100-sxm")
    n = int(((g["framework"] == "vllm") & (g["dtype"] == "bf16")).sum())
    row = next(
        r
        for r in report.rows
        if r.gpu == "h100-sxm" and r.source == "AIC vllm bf16" and r.bucket == "all"
    )
    assert row.n == n > 30000


@pytest.mark.parametrize(
    "key",
    [
        ("a100-80gb", "gemm", "AIC vllm bf16"),
        ("h100-sxm", "gemm", "AIC vllm bf16"),
        ("h100-sxm", "gemm", "AIC sglang fp8 (sglang-fp8)"),
        ("a100-80gb", "decode_attention", "AIC vllm kv bf16 (vllm-flash)"),
        ("h100-sxm", "decode_attention", "AIC vllm kv bf16 (vllm-flash)"),
        ("h100-sxm", "decode_attention", "AIC vllm kv fp8 (vllm-flash)"),
        ("a100-80gb", "prefill_attention", "AIC vllm kv bf16 (vllm-flash)"),
        ("h100-sxm", "prefill_attention", "AIC vllm kv bf16 (vllm-flash)"),
        *[
            (g, "allreduce", f"nccl-tests {n} GPUs")
            for g in ("a100-80gb", "h100-sxm")
            for n in (2, 4, 8)
        ],
    ],
)
def test_accuracy_target(report: validate.Report, key: tuple[str, str, str]) -> None:
    gpu, op, source = key
    row = next(
        r for r in report.rows if (r.gpu, r.op, r.source, r.bucket) == (gpu, op, source, "all")
    )
    med_max, mean_max, _ = validate.TARGETS[op]
    ok = row.median_ape <= med_max and (mean_max is None or row.mean_ape <= mean_max)
    if key in KNOWN_MISSES:
        if ok:
            pytest.fail(f"{key} now meets its target: remove it from KNOWN_MISSES and docs")
        pytest.xfail(f"known miss: median {row.median_ape:.1%}, mean {row.mean_ape:.1%}")
    assert ok, f"{key}: median {row.median_ape:.1%} mean {row.mean_ape:.1%} (target {row.target})"


def test_sglang_fp8_kernel_meets_the_gemm_target_held_out_by_shape_family() -> None:
    """The SGLang FP8 kernel's target row is in sample, as every target row; the same target
    holds for each row predicted by a refit without its (n, k) family."""
    from calibration.fit_public import NUM_SMS, fit_sglang_fp8_kernel

    prof = load_profile("h100-sxm")
    g = public.aic_gemm(DATA, "h100-sxm")
    entry, err, held = fit_sglang_fp8_kernel(g, prof.peaks, prof.elementwise, NUM_SMS["h100-sxm"])
    assert err["held_out"] == "shape families" and len(held) > 30000
    med_max, mean_max, _ = validate.TARGETS["gemm"]
    assert np.median(held) <= med_max and np.mean(held) <= mean_max
    # the shipped kernel is this fit (rounded to five significant digits)
    shipped = prof.gemm_kernels["sglang-fp8"]
    assert shipped.launch_s == pytest.approx(entry["launch_s"], rel=1e-3)
    for b, e in zip(shipped.branches, entry["branches"], strict=True):
        assert b.max_eff == pytest.approx(e["max_eff"], rel=1e-3)


def test_vllm_fp8_kernel_beats_the_shared_fp8_gemm_held_out_by_shape_family() -> None:
    """vLLM's FP8 GEMM by its CUTLASS dispatch table (no target row: the target is SGLang's):
    each row predicted by a refit without its (n, k) family errs far less than the shared
    ``ops.gemm.fp8`` in sample (docs/validation.md: 8.3% against 21.8% median), and the
    shipped kernel is this fit."""
    from calibration.fit_public import NUM_SMS, VLLM_FP8, fit_tiled_fp8_kernel, quant_s

    prof = load_profile("h100-sxm")
    g = public.aic_gemm(DATA, "h100-sxm")
    entry, err, held = fit_tiled_fp8_kernel(
        g, prof.peaks, prof.elementwise, NUM_SMS["h100-sxm"], VLLM_FP8
    )
    assert err["held_out"] == "shape families" and len(held) > 30000
    t = g[(g["dtype"] == "fp8") & (g["framework"] == "vllm")]
    m, n, k = (t[c].to_numpy(float) for c in ("m", "n", "k"))
    shared = ops.gemm_time_s(prof.peaks, prof.gemm_params("fp8"), m, n, k, "fp8")
    shared_ape = np.abs((shared + quant_s(prof.peaks, prof.elementwise, m, k)) / t["t_s"] - 1)
    assert np.median(held) < 0.10 < 0.20 < np.median(shared_ape)
    assert np.mean(held) < 0.15 < np.mean(shared_ape)
    shipped = prof.gemm_kernels["vllm-fp8"]
    for b, e in zip(shipped.branches, entry["branches"], strict=True):
        assert b.max_eff == pytest.approx(e["max_eff"], rel=1e-3)
        assert b.swap_ab == e.get("swap_ab", False)


def test_apes_are_recomputed_independently_for_a_sample() -> None:
    """Spot check validate's arithmetic: recompute APE of 200 sampled H100 GEMM rows by hand."""
    prof = load_profile("h100-sxm")
    g = public.aic_gemm(DATA, "h100-sxm")
    g = g[(g["framework"] == "vllm") & (g["dtype"] == "bf16")].sample(200, random_state=0)
    p = prof.gemm_params("bf16")
    m, n, k = (g[c].to_numpy() for c in ("m", "n", "k"))
    eff = (
        p.max_eff * np.minimum(np.minimum(m, n), k) / (np.minimum(np.minimum(m, n), k) + p.half_sat)
    )
    by_hand = p.launch_s + np.maximum(
        2 * m * n * k / (989e12 * eff), 2 * (m * k + k * n + m * n) / (3.35e12 * p.mem_eff)
    )
    np.testing.assert_allclose(ops.gemm_time_s(prof.peaks, p, m, n, k), by_hand, rtol=1e-12)
    assert np.median(np.abs(by_hand / g["t_s"].to_numpy() - 1)) < 0.15


def test_engine_rows_and_hopper_rows() -> None:
    """The engine section scores every engine with its shipped profile; the Hopper rows
    hold memory-bound decode steps to the H200/H100 bandwidth ratio."""
    rows = validate.engine_rows(DATA)
    engines_scored = {r.source.split(" ")[0] for r in rows if r.bucket == "all rows"}
    assert {"vllm", "sglang", "trtllm", "vllm-eager-2023"} <= engines_scored
    vllm = next(r for r in rows if r.source == "vllm (shipped profile)" and r.bucket == "all rows")
    assert vllm.n == 25 and vllm.target
    # vllm's dense and MoE rows apart (16 Mixtral batches, all held out: 8x7B and, since
    # 2026-12-04, vLLM PR 4002's 8x22B), recomputed here
    # from the kernel time and the shipped overheads
    from calibration import engines
    from disaggsim.hardware.engines import PARAM_KEYS, load_engines

    pts = engines.read_measurements()
    feat = engines.features(pts[pts["engine"] == "vllm"].reset_index(drop=True))
    eng = load_engines()["vllm"]
    pred = feat["kernels_s"] + sum(getattr(eng, k) * feat[f"x_{k}"] for k in PARAM_KEYS)
    ape = (pred / feat["value_s"] - 1).abs().to_numpy()
    moe = feat["model"].str.startswith("mixtral").to_numpy()
    for bucket, sel, n in (("dense-model rows", ~moe, 9), ("MoE-model rows", moe, 16)):
        r = next(r for r in rows if r.source == "vllm (shipped profile)" and r.bucket == bucket)
        assert r.n == sel.sum() == n
        assert r.median_ape == pytest.approx(np.median(ape[sel]), rel=1e-9)
        assert r.p90_ape == pytest.approx(np.percentile(ape[sel], 90), rel=1e-9)
    # the dense rows meet the target's figures; the MoE rows (vLLM's own grouped GEMM,
    # fitted on the H100) miss it on PR 3240's prefill-heavy A100 batches (docs/validation.md,
    # "Where targets are missed"): 15.9% / 26.0%
    assert np.median(ape[~moe]) < 0.05 and np.percentile(ape[~moe], 90) < 0.15
    assert np.median(ape[moe]) < 0.17 and np.percentile(ape[moe], 90) < 0.27
    # engines without MoE rows get no such buckets
    assert not any(r.bucket == "MoE-model rows" and r.source.startswith("sglang") for r in rows)
    sglang = next(r for r in rows if r.source == "sglang (shipped profile)")
    # three fit rows for two parameters (calibration/engines.py FIT_PARAMS): a target to meet
    assert sglang.n == 5 and sglang.target
    # vllm-eager-2023's launch floor is not linear in its parameters: validation runs the
    # step model with the shipped profile, and gets what the fit recorded in engines.json
    from disaggsim.hardware.engines import load_engines

    eager = next(
        r
        for r in rows
        if r.source == "vllm-eager-2023 (shipped profile)" and r.bucket == "all rows"
    )
    rec = load_engines()["vllm-eager-2023"].fit_error["all"]
    assert eager.n == rec["n"] == 557  # DistServe 428, Splitwise DGX-A100 64 and DGX-H100 65
    assert eager.median_ape == pytest.approx(rec["median_ape"], abs=2e-4)
    assert eager.p90_ape == pytest.approx(rec["p90_ape"], abs=2e-4)
    hop = validate.hopper_rows()
    assert all(r.met for r in hop if r.met is not None) and any(r.met is not None for r in hop)


def test_held_out_gpu_like_with_like_recovers_a_known_per_call_time(tmp_path: Path) -> None:
    """Rows timed call by call = the profile's kernel time + 5 µs: the per-call time
    measured on the floor rows is 5 µs and the like-with-like rows are exact, while the
    kernel-alone rows are not (and carry no target)."""
    from calibration.fit_public import PRIORS_DIR
    from calibration.rawio import COLUMNS, raw_csv_path
    from disaggsim.hardware.profile import profile_filename

    prior = load_profile("h200-sxm", path=PRIORS_DIR / profile_filename("h200-sxm"))
    p = prior.gemm_params("bf16")
    shapes = [(m, n, k) for m in (1, 2, 4) for n in (64, 128) for k in (64, 128)]  # floor
    shapes += [(m, 8192, 8192) for m in (16, 256, 1024, 4096)]  # ≥ 40 µs
    m, n, k = (np.array(c, float) for c in zip(*shapes, strict=True))
    t = ops.gemm_time_s(prior.peaks, p, m, n, k) + 5e-6
    rows = []
    for i in range(len(m)):
        r = dict.fromkeys(COLUMNS, "")
        r.update(op="gemm", m=m[i], n=n[i], k=k[i], dtype="bf16", backend="cublas")
        r.update(median_s=t[i], p10_s=t[i], p90_s=t[i], repeats=20, timing="eager")
        r.update(ops_per_replay=1)
        rows.append(r)
    import pandas as pd

    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(raw_csv_path(tmp_path, "gemm"), index=False)
    got = validate.held_out_gpu_rows("h200-sxm", "h100-sxm", tmp_path)
    alone = next(r for r in got if r.bucket == "bf16" and "per-call" not in r.source)
    like = next(r for r in got if r.bucket == "bf16" and "per-call" in r.source)
    assert "(5.00 µs, median over 12 floor rows)" in like.source
    assert like.n == alone.n == 4 and like.median_ape < 1e-9 and like.met
    assert alone.median_ape > 0.01 and alone.target == ""


def test_held_out_h200_gemm_rows() -> None:
    from calibration.fit_public import MEASURED_RUNS

    runs = {g: Path(__file__).resolve().parents[1] / r for g, r in MEASURED_RUNS.items()}
    got = validate.held_out_gpu_rows("h200-sxm", "h100-sxm", runs["h200-sxm"])
    like = [r for r in got if r.op == "gemm" and "per-call" in r.source and r.target]
    assert {r.bucket for r in like} == {"bf16", "fp8"}
    for r in like:
        # the run's per-call time is launch-sized: its floors were 7-9 µs against 2.5-3 µs
        # graph-replayed kernels of the same architecture (docs/calibration.md)
        call_us = float(r.source.split("per-call time (")[1].split(" µs")[0])
        assert 2.0 < call_us < 8.0


def test_decode_rates_fp8_kv_depends_on_head_dim_and_framework() -> None:
    """docs/validation.md's reading of the FP8-KV decode miss: on large reads vLLM's FP8
    kernel slows with the head dim, its bf16 kernel does not, SGLang's FP8 kernel has the
    opposite trend."""
    from calibration.fit_public import decode_rates

    r = decode_rates(DATA, "h100-sxm")["median"]
    vllm_bf16, vllm_fp8 = r.loc[("vllm", "bf16")], r.loc[("vllm", "fp8")]
    assert vllm_fp8[256.0] < 0.6 * vllm_bf16[256.0]
    assert vllm_fp8[256.0] < vllm_fp8[192.0] < vllm_fp8[128.0]
    bf = vllm_bf16[[64.0, 128.0, 192.0, 256.0]]
    assert bf.max() / bf.min() < 1.1
    sg = r.loc[("sglang", "fp8")]
    assert sg[64.0] < sg[128.0] < sg[256.0]
    # bandwidths are physical: below the H100's 3.35 TB/s peak
    assert (r.stack().dropna() < 3.35).all()


def test_vllm_fp8_kv_decode_is_no_faster_than_bf16_at_head_dim_256() -> None:
    """docs/validation.md, FP8-KV decode: shape for shape, vLLM's FP8-KV kernel is slower than
    its bf16-KV kernel at head dim 256 (half the bytes), TensorRT-LLM's and SGLang's FP8
    kernels are not."""
    from calibration.fit_public import decode_fp8_over_bf16

    r = decode_fp8_over_bf16(DATA, "h100-sxm")
    v, n = r["median"].loc["vllm"], r["size"].loc["vllm"]
    assert v[256.0] > 1.0 > v[192.0] > v[64.0] > v[128.0] > 0.5
    assert n[256.0] > 100 and n[192.0] > 20
    for fw in ("trtllm", "sglang"):
        m = r["median"].loc[fw][[64.0, 128.0, 192.0, 256.0]]
        assert (m < 0.85).all() and (m > 0.45).all()


def test_prose_figures_come_from_the_report_rows() -> None:
    # "Where targets are missed" quotes the tables: a refit that moves them moves the prose
    rows = [
        validate.Row("all", "engine", "e (shipped profile)", "all rows", 19, 0.049, 0.08, 0.203),
        validate.Row("all", "engine", "e (shipped profile)", "MoE rows", 10, 0.106, 0.1, 0.252),
    ]
    text = "e ({{e (shipped profile)|all rows}} over {{n:e (shipped profile)|all rows}} rows)"
    assert validate.fill_figures(text, rows) == "e (4.9% / 20.3% over 19 rows)"
    with pytest.raises(ValueError, match="names 0 rows"):
        validate.fill_figures("{{e (shipped profile)|dense rows}}", rows)
    # the shipped prose quotes its figures, and the generated doc has them all filled in
    quoted = validate.FIGURE.findall(validate.KNOWN_LIMITS_MD)
    assert len(quoted) >= 10
    assert len(validate.FIGURE.findall(validate.ENGINES_MD)) >= 4  # the engine section's too
    report = validate.Report(extra_md="")
    report.sections.append(validate.Section("S", "intro {{e (shipped profile)|MoE rows}}"))
    report.sections[0].rows += rows
    assert "intro 10.6% / 25.2%" in report.markdown()
    doc = (Path(validate.__file__).resolve().parents[1] / "docs" / "validation.md").read_text()
    assert "{{" not in doc


def test_cross_gpu_attention_carries_the_a100_fits_with_h100_peaks() -> None:
    """docs/validation.md, "Attention on a GPU without its own table": the H100 rows are
    predicted by the A100's decode and prefill parameters, unchanged but for the terms on
    the target's SMs and shared memory, at the H100's datasheet peaks; and an APE of the
    section is recomputed here by hand for one row of the vLLM bf16 decode table."""
    import json

    from calibration.fit_public import prior_from
    from disaggsim.catalog import get_gpu
    from disaggsim.hardware.profile import profile_from_dict, shipped_profile_path

    a100 = json.loads(shipped_profile_path("a100-80gb").read_text())
    prior = prior_from("h100-sxm", "a100-80gb", a100)
    for name, sec in a100["attention_backends"].items():
        for kv, prm in sec["decode_attention"].items():
            got = prior["attention_backends"][name]["decode_attention"][kv]
            moved = {k for k in prm if got[k] != prm[k]}
            assert moved <= {"wave_sms", "occupancy_sms", "smem_per_sm_kib"}, (name, kv)
            if prm.get("wave_sms"):
                assert got["wave_sms"] == 132.0
        for kv, prm in (sec.get("prefill_attention") or {}).items():
            assert prior["attention_backends"][name]["prefill_attention"][kv] == prm
    h100 = get_gpu("h100-sxm")
    assert prior["peaks"]["hbm_bytes_per_s"] == h100.hbm_bytes_per_s
    prof = profile_from_dict(prior, "prior")
    rows = validate.cross_gpu_attention_rows("h100-sxm", "a100-80gb", DATA)
    got = {(r.op, r.source, r.bucket.split(" (")[0]): r for r in rows}
    vllm = got[("decode_attention", "AIC vllm kv bf16 (vllm-flash) from a100-80gb's fits", "all")]
    d = public.aic_decode_attention(DATA, "h100-sxm")
    d = d[
        (d["framework"] == "vllm")
        & (d["dtype"] == "bf16")
        & ~d["kernel"].isin(validate.MINOR_KERNELS)
    ]
    assert vllm.n == len(d)
    r = d.iloc[len(d) // 2]
    p = prof.decode_attention_for("vllm-flash", "bf16")
    hand = float(
        ops.decode_attention_time_s(
            prof.peaks, p, r["batch"], r["context_tokens"], r["kv_heads"], r["head_dim"]
        )
    )
    assert hand == pytest.approx(
        float(validate.predict_decode_rows(prof.peaks, p, "bf16", d.iloc[[len(d) // 2]])[0]),
        rel=1e-12,
    )
    # every row's APE from the hand prediction's frame: the section's median
    pred = ops.decode_attention_time_s(
        prof.peaks, p, d["batch"], d["context_tokens"], d["kv_heads"], d["head_dim"]
    )
    a = np.abs(np.asarray(pred) - d["t_s"].to_numpy()) / d["t_s"].to_numpy()
    assert float(np.median(a)) == pytest.approx(vllm.median_ape, rel=1e-9)
