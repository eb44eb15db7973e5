"""TensorRT-LLM's FP8 GEMM (``ops.gemm.fp8``, cuBLASLt) and the dynamic per-tensor
activation scale its public kernel-table rows hold (issue 13).

AIConfigurator times TensorRT-LLM's FP8 ``Linear`` loaded without an input scale, so each
row runs ``quantize_e4m3_per_tensor`` (a memset of the scale, an amax kernel reading the
bf16 activations, the quantisation kernel) before the GEMM. The expected values here are
written out by hand from the formulas in docs/costmodel.md, or are measured rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.costmodel import ops
from disaggsim.hardware.profile import (
    GemmParams,
    GpuPeaks,
    ProfileError,
    load_profile,
    profile_from_dict,
    shipped_profile_path,
)
from tests.conftest import SHARED_DATA as DATA
from tests.conftest import needs_kernel_tables

PEAKS = GpuPeaks(
    bf16_flop_per_s=989e12, fp8_flop_per_s=1979e12, hbm_bytes_per_s=3.35e12, hbm_bytes=80e9
)


def test_dynamic_scale_time_by_hand() -> None:
    p = GemmParams(3e-6, 0.8, 120.0, 0.8, dynamic_scale_s=7e-6, dynamic_scale_bw_eff=0.9)
    # 64 tokens x 8192 inputs: the amax kernel reads 64 x 8192 x 2 = 1,048,576 bytes
    want = 7e-6 + 1_048_576 / (3.35e12 * 0.9)
    assert float(ops.fp8_dynamic_scale_time_s(PEAKS, p, 64, 8192)) == pytest.approx(want)
    # a profile that does not fit it (bf16, or written before the fields) costs nothing
    assert (
        float(ops.fp8_dynamic_scale_time_s(PEAKS, GemmParams(3e-6, 0.8, 120.0, 0.8), 64, 8192))
        == 0.0
    )


def _raw_h100() -> dict:
    import json

    return json.loads(shipped_profile_path("h100-sxm").read_text())


def test_profile_loads_the_optional_dynamic_scale_and_checks_it() -> None:
    raw = _raw_h100()
    fp8 = raw["ops"]["gemm"]["fp8"]
    prof = profile_from_dict(raw, "h100.json")
    assert prof.gemm_params("fp8").dynamic_scale_s == fp8["dynamic_scale_s"] > 0
    assert prof.gemm_params("bf16").dynamic_scale_bw_eff == 0.0  # absent: not fitted
    fp8["dynamic_scale_bw_eff"] = 1.5
    with pytest.raises(ProfileError, match=r"ops\.gemm\.fp8\.dynamic_scale_bw_eff"):
        profile_from_dict(raw, "h100.json")
    for key in ("dynamic_scale_s", "dynamic_scale_bw_eff"):  # an older profile still loads
        fp8.pop(key)
    assert profile_from_dict(raw, "h100.json").gemm_params("fp8").dynamic_scale_bw_eff == 0.0


def test_fit_recovers_a_known_gemm_and_dynamic_scale_from_synthetic_rows() -> None:
    """Synthetic TensorRT-LLM rows (GEMM + quantisation kernel + dynamic scale, written out
    below with max_eff 0.78, half_sat 130, mem_eff 0.8, scale 7.5 µs at 0.9, 2% noise):
    the fit gets back the GEMM's efficiencies and the scale's fixed time and bandwidth, the
    floor being the one it is given."""
    import pandas as pd

    from calibration.fit_public import fit_gemm_fp8
    from disaggsim.hardware.profile import ElementwiseParams

    ew = ElementwiseParams(launch_s=2.3e-6, bw_eff=0.55)
    m = np.repeat([1, 4, 16, 64, 256, 1024, 4096, 16384], 12).astype(float)
    n = np.tile([1024, 4096, 8192, 14336, 28672, 2048, 512, 6144, 3072, 16384, 768, 10240], 8)
    k = np.tile([4096, 8192, 4096, 1024, 8192, 1024, 16384, 2048, 4096, 8192, 512, 5120], 8)
    n, k = n.astype(float), k.astype(float)
    by_hand = (
        3e-6
        + np.maximum(
            2 * m * n * k / (1979e12 * 0.78 * np.minimum(np.minimum(m, n), k)
                             / (np.minimum(np.minimum(m, n), k) + 130.0)),
            (m * k + k * n + m * n) / (3.35e12 * 0.8),
        )
        + (2.3e-6 + 3 * m * k / (3.35e12 * 0.55))  # the quantisation kernel
        + (7.5e-6 + 2 * m * k / (3.35e12 * 0.9))  # the dynamic scale
    )  # fmt: skip
    t = by_hand * np.exp(np.random.default_rng(3).normal(0.0, 0.02, size=m.shape))
    rows = pd.DataFrame(
        {"dtype": "fp8", "framework": "trtllm", "m": m, "n": n, "k": k, "t_s": t, "table": "x"}
    )
    got, err, _, _ = fit_gemm_fp8(rows, PEAKS, ew, 3e-6, held_out=False)
    assert got["launch_s"] == 3e-6
    assert got["max_eff"] == pytest.approx(0.78, rel=0.05)
    assert got["mem_eff"] == pytest.approx(0.8, rel=0.05)
    assert got["dynamic_scale_s"] == pytest.approx(7.5e-6, rel=0.15)
    assert got["dynamic_scale_bw_eff"] == pytest.approx(0.9, rel=0.15)
    assert err["median_ape"] < 0.03


@needs_kernel_tables
def test_shipped_h100_fp8_gemm_predicts_tensorrt_llm_rows_with_their_dynamic_scale() -> None:
    """Every TensorRT-LLM FP8 row of the H100 table, predicted by hand from the shipped
    ``ops.gemm.fp8`` (GEMM + quantisation kernel + dynamic scale): median APE under 6%,
    p90 under 20% (29.3% / 50.5% before the scale was modelled: docs/validation.md); the
    same profile without the scale errs far more (the ~7.6 µs it holds at small shapes)."""
    from calibration import public

    prof = load_profile("h100-sxm")
    p, ew = prof.gemm_params("fp8"), prof.elementwise
    g = public.aic_gemm(DATA, "h100-sxm")
    t = g[(g["framework"] == "trtllm") & (g["dtype"] == "fp8")]
    m, n, k, meas = (t[c].to_numpy(float) for c in ("m", "n", "k", "t_s"))
    d = np.minimum(np.minimum(m, n), k)
    gemm = p.launch_s + np.maximum(
        2 * m * n * k / (1979e12 * p.max_eff * d / (d + p.half_sat)),
        (m * k + k * n + m * n) / (3.35e12 * p.mem_eff),
    )
    quant = ew.launch_s + 3 * m * k / (3.35e12 * ew.bw_eff)
    scale = p.dynamic_scale_s + 2 * m * k / (3.35e12 * p.dynamic_scale_bw_eff)
    ape = np.abs(gemm + quant + scale - meas) / meas
    assert len(t) > 30000
    assert np.median(ape) < 0.06 and np.percentile(ape, 90) < 0.20
    ape_without = np.abs(gemm + quant - meas) / meas
    assert np.median(ape_without) > 0.20


def test_tensorrt_llm_engine_step_runs_the_cublaslt_fit_without_the_dynamic_scale() -> None:
    """A TensorRT-LLM worker with FP8 weights runs ``ops.gemm.fp8`` (its engine profile names
    no kernel of its own) with static activation scales (the checkpoints carry them): a
    decode step's GEMM part is the smooth form alone, by hand for Llama-3-8B at batch 8
    (QKV 6144 x 4096, O 4096 x 4096, gate+up 28672 x 4096, down 4096 x 14336, 32 layers)."""
    from disaggsim.costmodel.step import build_worker_cost

    p = load_profile("h100-sxm").gemm_params("fp8")
    assert p.dynamic_scale_s > 0
    w = build_worker_cost("llama-3-8b", "h100-sxm", 1, weight_dtype="fp8", engine="trtllm")
    assert w.gemm_kernel == "generic"
    m = 8.0
    want = 0.0
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        d = min(m, n, k)
        want += p.launch_s + max(
            2 * m * n * k / (1979e12 * p.max_eff * d / (d + p.half_sat)),
            (m * k + k * n + m * n) / (3.35e12 * p.mem_eff),
        )
    got = w.breakdown(decode_batch=8, decode_context_tokens=8000).gemm_s
    assert got == pytest.approx(32 * want, rel=1e-9)
