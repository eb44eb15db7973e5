"""TensorRT-LLM's prefill attention with an FP8 KV cache (issue 13): its context FMHA runs
the FP8 kernel, fitted apart (``attention_backends.trtllm.prefill_attention.fp8``), and a
TensorRT-LLM worker with ``kv_dtype: fp8`` prefills with it. Expected values are written
out by hand from the formula in docs/costmodel.md, or are measured rows."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.hardware.profile import load_profile
from tests.conftest import SHARED_DATA as DATA
from tests.conftest import needs_kernel_tables


def _by_hand(p, num_seqs, new_tokens, pairs, heads, head_dim, peak=989e12):
    mean_len = new_tokens / num_seqs
    return p.floor_s + 4 * pairs * heads * head_dim / (
        peak * p.max_eff * mean_len / (mean_len + p.half_sat)
    )


@needs_kernel_tables
def test_fp8_kv_rows_time_as_the_fp8_fmha_not_as_the_bf16_one() -> None:
    """The premise, on the raw table: TensorRT-LLM's H100 rows with bf16 attention math
    and an FP8 KV cache take the time of its FP8-math rows (the same shapes), and the
    bf16-KV rows are slower once prompts are long."""
    import pandas as pd

    path = sorted(
        (DATA / "kernels/aiconfigurator/h100_sxm/attention/trtllm").glob(
            "*/context_attention_perf.parquet"
        )
    )[-1]
    d = pd.read_parquet(path)
    d = d[d["window_size"] == 0]
    d = d.assign(combo=d["attn_dtype"] + "/" + d["kv_cache_dtype"])
    keys = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"]
    p = d.pivot_table(index=keys, columns="combo", values="latency").dropna().reset_index()
    same = p["bfloat16/fp8"] / p["fp8/fp8"]
    assert len(p) > 15000
    assert 0.95 < float(np.median(same)) < 1.05
    long = p["isl"] > 4096
    assert float(np.median((p["bfloat16/bfloat16"] / p["bfloat16/fp8"])[long])) > 1.25


@needs_kernel_tables
def test_shipped_fp8_kv_prefill_fit_predicts_its_rows() -> None:
    """Every H100 TensorRT-LLM prefill row with an FP8 KV cache, by hand from the shipped
    fit: median APE under 16% (20.0% with the bf16 fit, docs/validation.md), and the bf16
    fit on the same rows errs more."""
    from calibration import public
    from calibration.fit_public import _backend_rows

    prof = load_profile("h100-sxm")
    fp8 = prof.backend("trtllm").prefill["fp8"]
    bf16 = prof.backend("trtllm").prefill["bf16"]
    t = _backend_rows(public.aic_prefill_attention(DATA, "h100-sxm"), "trtllm")
    t = t[t["kv_dtype"] == "fp8"]
    cols = ("num_seqs", "new_tokens", "pairs", "heads", "head_dim")
    args = [t[c].to_numpy(float) for c in cols]
    meas = t["t_s"].to_numpy(float)
    ape = np.abs(_by_hand(fp8, *args) / meas - 1)
    ape_bf16 = np.abs(_by_hand(bf16, *args) / meas - 1)
    assert len(t) > 15000
    assert np.median(ape) < 0.16 < 0.18 < np.median(ape_bf16)


def test_trtllm_worker_with_fp8_kv_prefills_on_the_fp8_fmha_fit() -> None:
    """Llama-3-8B on one H100, one 4,096-token prompt: the attention part is 32 layers of
    the kernel by hand, the ``trtllm`` FP8-KV fit under ``engine: trtllm`` with an FP8 KV
    cache, its bf16 fit with a bf16 cache; a vLLM worker's pick keeps its one (bf16) fit."""
    from disaggsim.costmodel.step import build_worker_cost

    prof = load_profile("h100-sxm")
    n = 4096
    pairs = n * (n + 1) / 2
    for engine, kv, dt in (
        ("trtllm", "fp8", "fp8"),
        ("trtllm", "bf16", "bf16"),
        ("vllm", "fp8", "bf16"),
    ):
        w = build_worker_cost("llama-3-8b", "h100-sxm", 1, kv_dtype=kv, engine=engine)
        if engine == "trtllm":
            assert w.prefill_backend == "trtllm"
        else:  # auto's pick among vLLM's candidates, which have no FP8-KV fit of their own
            assert w.prefill_backend in ("vllm-flash", "sglang-flash")
            assert "fp8" not in prof.backend(w.prefill_backend).prefill
        p = prof.backend(w.prefill_backend).prefill[dt]
        want = 32 * _by_hand(p, 1.0, float(n), pairs, 32.0, 128.0)
        got = w.breakdown(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=pairs)
        assert got.attention_s == pytest.approx(want, rel=1e-9), (engine, kv)
