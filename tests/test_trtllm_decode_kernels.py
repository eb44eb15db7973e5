"""TensorRT-LLM's two decode kernels: XQA for grouped layouts, masked MHA for the others.

TensorRT-LLM decodes a layout with XQA only when it has 2 to 32 query heads per KV head
and a head size that is a multiple of 16 in 16..256 (decoderXQAImplJIT kernelUtils.cpp);
vanilla MHA and larger groups run masked multi-head attention, one work item per
(sequence, query head), each reading its KV head. The hardware profiles fit the two
kernels separately (``trtllm`` and ``trtllm-mmha``) and the engine profile names the
fallback, so a worker runs the kernel TensorRT-LLM would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from calibration import fit_public, public
from disaggsim.catalog import get_gpu
from disaggsim.costmodel import ops
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.hardware.engines import ZERO_ENGINE, EngineProfileError, load_engines
from disaggsim.hardware.profile import (
    ATTENTION_CHOICES,
    DECODE_ONLY_BACKENDS,
    DecodeAttentionParams,
    GpuPeaks,
    load_profile,
)
from tests.conftest import SHARED_DATA as DATA
from tests.conftest import needs_kernel_tables


def test_xqa_takes_the_layouts_tensorrt_llm_gives_it() -> None:
    heads = np.array([32, 32, 64, 32, 128, 256, 64, 64, 64])
    kv = np.array([32, 8, 2, 1, 4, 4, 8, 8, 8])
    dim = np.array([128, 128, 128, 128, 128, 128, 512, 72, 64])
    # query heads per KV head 1 (MHA): no; 4, 32, 32, 32: yes; 64: no; 8 with head dim 512
    # or 72 (not a multiple of 16): no; 8 with head dim 64: yes
    want = [False, True, True, True, True, False, False, False, True]
    assert fit_public.trtllm_xqa(heads, kv, dim).tolist() == want


def test_shipped_engine_names_the_masked_mha_fallback() -> None:
    trt = load_engines()["trtllm"]
    assert trt.per_query_head_decode_backend == "trtllm-mmha"
    assert trt.grouped_decode_q_per_kv == tuple(range(2, 33))
    assert [trt.grouped_decode_covers(g) for g in (1, 2, 8, 32, 48)] == [
        False,
        True,
        True,
        True,
        False,
    ]
    # a decode-only kernel is no scenario choice
    assert "trtllm-mmha" in DECODE_ONLY_BACKENDS and "trtllm-mmha" not in ATTENTION_CHOICES


def test_engine_profile_rejects_an_unknown_fallback(tmp_path: Path) -> None:
    import json

    from disaggsim.hardware.engines import engines_from_dict, shipped_engines_path

    raw = json.loads(shipped_engines_path().read_text())
    raw["engines"]["trtllm"]["per_query_head_decode_backend"] = "vllm-flash"
    with pytest.raises(EngineProfileError, match=r"per_query_head_decode_backend: 'vllm-flash'"):
        engines_from_dict(raw, "x.json")


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb"])
def test_worker_runs_the_kernel_tensorrt_llm_picks(gpu: str) -> None:
    prof = load_profile(gpu)
    assert "trtllm-mmha" in prof.attention_backends
    assert prof.attention_backends["trtllm-mmha"].prefill == {}
    # Llama-2-7B: MHA (32 / 32): masked MHA; Llama-3-8B: 4 query heads per KV head: XQA
    mha = build_worker_cost("llama-2-7b", gpu, 1, engine="trtllm")
    gqa = build_worker_cost("llama-3-8b", gpu, 1, engine="trtllm")
    assert (mha.decode_backend, mha.prefill_backend) == ("trtllm-mmha", "trtllm")
    assert (gqa.decode_backend, gqa.prefill_backend) == ("trtllm", "trtllm")
    # other engines never take the fallback, even running TensorRT-LLM's kernels by name
    named = build_worker_cost("llama-2-7b", gpu, 1, engine="vllm", attention_backend="trtllm")
    assert named.decode_backend == "trtllm"
    # a profile without the masked-MHA fit keeps the XQA fit for every layout
    bare = dataclasses.replace(
        prof,
        attention_backends={
            k: v for k, v in prof.attention_backends.items() if k not in DECODE_ONLY_BACKENDS
        },
    )
    old = build_worker_cost("llama-2-7b", gpu, 1, engine="trtllm", profile=bare)
    assert old.decode_backend == "trtllm"


def test_per_query_head_kernel_by_hand() -> None:
    """Masked MHA over 4 query heads per KV head: work items per query head (B x KH x 4) in
    the per-item work and the bandwidth share; the KV stream the longer of HBM and 4 x the
    bytes at the re-read rate."""
    pk = GpuPeaks(989e12, 1979e12, 3.35e12, 80e9)
    p = DecodeAttentionParams(
        floor_s=5e-6,
        per_seq_s=1e-8,
        bw_eff=0.8,
        per_seq_kv_elem_s=1e-10,
        par_half_sat=4.0,
        overlap=1.0,
        reread_bytes_per_s=6e12,
    )
    b, kh, d, g = 16.0, 8.0, 128.0, 4.0
    for ctx in (16 * 64, 16 * 8192):
        kv_bytes = 2 * ctx * kh * d * 2.0
        work = b * kh * g
        hbm = 1.0 / (3.35e12 * 0.8 * work / (work + 4.0))
        stream = kv_bytes * max(hbm, g / 6e12)
        items = 1e-10 * work * d
        want = 5e-6 + 1e-8 * b + max(items, stream)
        got = ops.decode_attention_time_s(pk, p, b, ctx, kh, d, 2.0, g)
        assert float(got) == pytest.approx(want, rel=1e-12)
    # one query head per KV head: the HBM stream alone, items per KV head
    plain = dataclasses.replace(p, reread_bytes_per_s=0.0)
    assert float(ops.decode_attention_time_s(pk, p, b, 4096, kh, d, 2.0, 1.0)) == pytest.approx(
        float(ops.decode_attention_time_s(pk, plain, b, 4096, kh, d, 2.0)), rel=1e-12
    )


@pytest.mark.parametrize("model,tp", [("llama-2-7b", 1), ("llama-2-7b", 4), ("opt-13b", 2)])
def test_step_model_masked_mha_equals_ops(model: str, tp: int) -> None:
    w = build_worker_cost(model, "h100-sxm", tp, engine="trtllm")
    assert w.decode_backend == "trtllm-mmha"
    bare = build_worker_cost(
        model, "h100-sxm", tp, engine=dataclasses.replace(ZERO_ENGINE), attention_backend="trtllm"
    )
    dec = w.profile.decode_attention_for("trtllm-mmha", "bf16")
    hq, hkv = w.heads_per_gpu, w.kv_heads_per_gpu
    for batch, ctx in ((1, 100), (64, 64 * 2048), (512, 512 * 300)):
        want = float(
            ops.decode_attention_time_s(
                w.profile.peaks, dec, batch, ctx, hkv, w.model.head_dim, 2.0, hq // hkv
            )
        )
        got = w.breakdown(decode_batch=batch, decode_context_tokens=ctx).attention_s
        assert got / w.model.num_layers == pytest.approx(want, rel=1e-12)
        base, per = w.decode_coeffs(batch)
        ib, ip = w.decode_item_coeffs(batch)
        assert w.decode_time_s(batch, ctx) == pytest.approx(
            max(base + per * ctx, ib + ip * ctx), rel=1e-12
        )
        assert bare.decode_backend == "trtllm"


def test_a_layout_beyond_xqa_rereads_at_the_kernel_rate() -> None:
    """64 query heads per KV head (beyond XQA's 32): masked MHA re-reads each KV head 64
    times, at the masked-MHA fit's own rate when the engine names none."""
    from disaggsim.catalog import get_model

    spec = dataclasses.replace(get_model("llama-3-8b"), num_heads=64, num_kv_heads=1)
    eng = dataclasses.replace(load_engines()["trtllm"], per_query_head_kv_bytes_per_s=0.0)
    w = build_worker_cost(spec, "h100-sxm", 1, engine=eng)
    assert w.decode_backend == "trtllm-mmha"
    dec = w.profile.decode_attention_for("trtllm-mmha", "bf16")
    assert dec.reread_bytes_per_s > get_gpu("h100-sxm").hbm_bytes_per_s
    per_token = w.decode_coeffs(256)[1] / spec.num_layers
    assert per_token == pytest.approx(2 * 1 * 128 * 2.0 * 64 / dec.reread_bytes_per_s, rel=1e-12)


@needs_kernel_tables
def test_split_fits_beat_one_fit_over_both_kernels_held_out() -> None:
    """On the masked-MHA rows (H100, bf16 KV), a fit of that kernel alone, held out by shape
    family, errs less than one decode form fitted over XQA and masked-MHA rows together
    (the fit before the split), and its re-read rate is per element: the bf16 and FP8
    fits read about the same number of query-head elements per second, above HBM peak."""
    prof = load_profile("h100-sxm")
    errs = prof.fit_error
    split = errs["attention.trtllm-mmha.decode.bf16"]["held_out_median_ape"]
    d = public.aic_decode_attention(DATA, "h100-sxm")
    t = d[(d["framework"] == "trtllm") & (d["dtype"] == "bf16")]
    mmha = ~fit_public.trtllm_xqa(t["heads"], t["kv_heads"], t["head_dim"])
    from calibration.fit import fit_decode_attention, shape_family

    one = fit_decode_attention(
        prof.peaks, t["batch"], t["context_tokens"], t["kv_heads"], t["head_dim"], t["t_s"],
        held_out=False,
    )  # fmt: skip
    m = t[mmha]
    pred = ops.decode_attention_time_s(
        prof.peaks, one.params, m["batch"], m["context_tokens"], m["kv_heads"], m["head_dim"]
    )
    mixed = float(np.median(np.abs(pred / m["t_s"].to_numpy() - 1)))
    assert split < mixed, (split, mixed)
    assert shape_family(m["heads"], m["kv_heads"], m["head_dim"]).size == len(m)
    bf = prof.decode_attention_for("trtllm-mmha", "bf16").reread_bytes_per_s
    f8 = prof.decode_attention_for("trtllm-mmha", "fp8").reread_bytes_per_s
    assert bf / 2.0 == pytest.approx(f8, rel=0.2)
    assert min(bf, f8 * 2) > prof.peaks.hbm_bytes_per_s
