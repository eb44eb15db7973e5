"""Split-KV decode kernels (``split_fill_s`` > 0): FlashAttention's and FlashInfer's
split-KV and TensorRT-LLM's multi-block mode split a long sequence's KV over several
thread blocks, so a decode kernel over few (sequence, KV head) items still streams at full
bandwidth; what few items cost is a fixed time (pipeline fill, the splits' reduction),
not a bandwidth share. By hand, the step model against ``ops``, the fitter on synthetic
data, and the public TensorRT-LLM XQA rows fitted on short contexts and tested on long
ones (the issue-13 extrapolation check that the bandwidth-share form failed: 157% median
on the H100)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calibration.fit import fit_decode_attention
from disaggsim.costmodel import ops
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.hardware.profile import DecodeAttentionParams, GpuPeaks, load_profile
from tests.test_calibration_engines import DATA, needs_data

PEAKS = GpuPeaks(
    bf16_flop_per_s=989e12, fp8_flop_per_s=1979e12, hbm_bytes_per_s=3.35e12, hbm_bytes=80e9
)
SPLIT = DecodeAttentionParams(
    floor_s=8e-6,
    per_seq_s=2e-8,
    bw_eff=0.8,
    per_seq_kv_elem_s=2e-10,
    par_half_sat=20.0,
    multi_floor_s=1e-6,
    overlap=1.0,
    split_fill_s=5e-6,
)


def test_split_kv_time_by_hand() -> None:
    # B 1, KH 1, D 128, 131072 tokens bf16: 2 x 131072 x 128 x 2 = 67,108,864 bytes at the
    # full 0.8 x 3.35 TB/s (no share of few items); P = 1: fill 5 us x 20 / 21
    want = 8e-6 + 2e-8 + 5e-6 * 20 / 21 + 67_108_864 / (3.35e12 * 0.8)
    got = float(ops.decode_attention_time_s(PEAKS, SPLIT, 1, 131072, 1, 128))
    assert got == pytest.approx(want, rel=1e-12)
    assert float(ops.decode_attention_bw_scale(SPLIT, 1, 1)) == 1.0
    # the same kernel without split-KV: the stream at a 1/21 share of the bandwidth
    share = dataclasses.replace(SPLIT, split_fill_s=0.0)
    slow = 8e-6 + 2e-8 + 67_108_864 / (3.35e12 * 0.8 / 21)
    assert float(ops.decode_attention_time_s(PEAKS, share, 1, 131072, 1, 128)) == pytest.approx(
        slow, rel=1e-12
    )
    # many items: the fill vanishes, B 64 x KH 8 = 512 items, multi-sequence floor
    b, c = 64, 64 * 4096
    stream = 2 * c * 8 * 128 * 2 / (3.35e12 * 0.8)
    want = 8e-6 + 1e-6 + 5e-6 * 20 / 532 + 64 * 2e-8 + max(2e-10 * 64 * 8 * 128, stream)
    assert float(ops.decode_attention_time_s(PEAKS, SPLIT, b, c, 8, 128)) == pytest.approx(
        want, rel=1e-12
    )
    # a short sequence: the stream (2 x 16 x 128 x 2 = 8,192 bytes: 3.06 ns) is short of
    # the bandwidth share by 20 items' worth (61.1 ns), under the fill bound (4.76 us), so
    # the shortfall is the share's; the item work (2e-10 x 128 = 25.6 ns) is shorter still
    stream = 8192 / (3.35e12 * 0.8)
    want = 8e-6 + 2e-8 + stream * (1 + 20 / 1)
    assert float(ops.decode_attention_time_s(PEAKS, SPLIT, 1, 16, 1, 128)) == pytest.approx(
        want, rel=1e-12
    )


def test_lines_stay_affine_in_context() -> None:
    # the engine's closed-form decode runs need the step piecewise affine in C at a fixed
    # batch: the item line, or the smaller of the two stream lines where that is larger
    for b, kh in ((1, 1), (4, 8), (256, 2)):
        (base, per), (ibase, iper) = ops.decode_attention_lines(PEAKS, SPLIT, b, kh, 128)
        share = ops.decode_attention_share_line(PEAKS, SPLIT, b, kh, 128)
        assert share is not None
        sbase, sper = share
        for c in (b * 1.0, b * 16.0, b * 512.0, b * 4096.0, b * 131072.0):
            t = float(ops.decode_attention_time_s(PEAKS, SPLIT, b, c, kh, 128))
            stream = min(base + per * c, sbase + sper * c)
            assert t == pytest.approx(max(stream, ibase + iper * c), rel=1e-12)


def test_step_model_uses_the_split_form() -> None:
    prof = load_profile("h100-sxm")
    split = {b: prof.decode_attention_for(b, "bf16") for b in prof.attention_backends}
    assert any(p.split_fill_s > 0 for p in split.values())
    w = build_worker_cost("llama-3-8b", "h100-sxm", 1, attention_backend="vllm-flash")
    d = w._dec
    assert d.split_fill_s > 0
    # one layer's decode attention at batch 2, 8 KV heads, 30000 tokens each: ops' time
    bd = w.breakdown(decode_batch=2, decode_context_tokens=60000)
    one = float(ops.decode_attention_time_s(prof.peaks, d, 2, 60000, 8, 128))
    assert bd.attention_s == pytest.approx(32 * one, rel=1e-9)


def test_fitter_recovers_split_parameters() -> None:
    b = np.repeat([1, 4, 16, 64, 256, 1024], 6).astype(float)
    c = b * np.tile([16, 128, 1024, 4096, 16384, 65536], 6)
    b, c = np.tile(b, 3), np.tile(c, 3)
    kh = np.repeat([1.0, 2.0, 8.0], 36)
    d = np.repeat([128.0, 64.0, 128.0], 36)
    t = ops.decode_attention_time_s(PEAKS, SPLIT, b, c, kh, d)
    t = t * np.exp(np.random.default_rng(3).normal(0.0, 0.02, size=t.shape))
    got = fit_decode_attention(PEAKS, b, c, kh, d, t, held_out=False, split_kv=True).params
    assert got.bw_eff == pytest.approx(0.8, rel=0.05)
    assert got.floor_s == pytest.approx(8e-6, rel=0.15)
    assert got.split_fill_s == pytest.approx(5e-6, rel=0.4)


@needs_data
@pytest.mark.slow
def test_xqa_fitted_on_short_contexts_extrapolates_to_long() -> None:
    """TensorRT-LLM's XQA rows (H100), fitted on ≤ 2048 tokens per sequence, predict the
    > 8192-token rows within a median 30% (the bandwidth-share form: 157%)."""
    from calibration import public
    from calibration.validate import MINOR_KERNELS, _decode_backend_rows, peaks_of

    d = public.aic_decode_attention(DATA, "h100-sxm")
    d = d[(~d["kernel"].isin(MINOR_KERNELS)) & (d["dtype"] == "bf16")]
    t = _decode_backend_rows(d, "trtllm")
    per_seq = (t["context_tokens"] / t["batch"]).to_numpy()
    tr, te = t[per_seq <= 2048], t[per_seq > 8192]
    pk = peaks_of("h100-sxm")
    cols = ("batch", "context_tokens", "kv_heads", "head_dim")
    f = fit_decode_attention(pk, *(tr[k] for k in cols), tr["t_s"], held_out=False, split_kv=True)
    pred = ops.decode_attention_time_s(pk, f.params, *(te[k] for k in cols))
    ape = np.abs(pred - te["t_s"].to_numpy()) / te["t_s"].to_numpy()
    assert np.median(ape) < 0.30


def test_xqa_block_count_follows_its_source_rule() -> None:
    """calibration.fit_public.xqa_blocks_per_sequence (the --xqa-split diagnostic) by hand
    from decoderXQAImplCommon.h: 128 tokens a block, at most round(sqrt(8 m)), cut to 8
    waves of the SMs."""
    from calibration.fit_public import xqa_blocks_per_sequence

    got = xqa_blocks_per_sequence([100, 2048, 131072, 32768], [1, 1, 1, 32], 132)
    # 100 tokens: 0 blocks -> 1; 2048: 16 -> sqrt(128) = 11.3 -> 11; 131072: 1024 ->
    # sqrt(8192) = 90.5 -> 91; 32768 x 32 items: 256 -> 45, 32 x 45 / 1056 = 1.36 -> 33
    assert got.tolist() == [1.0, 11.0, 91.0, 33.0]
