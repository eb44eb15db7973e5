"""TensorRT-LLM's XQA decode kernel works on every query head of its group against each KV
byte (issue 13): its KV stream runs at the longer of the HBM time and ``q_per_kv /
group_bytes_per_s`` per byte. Expected values by hand or measured rows."""

from __future__ import annotations

import pytest

from disaggsim.costmodel import ops
from disaggsim.hardware.profile import DecodeAttentionParams, GpuPeaks, load_profile
from tests.conftest import SHARED_DATA as DATA

PEAKS = GpuPeaks(
    bf16_flop_per_s=989e12, fp8_flop_per_s=1979e12, hbm_bytes_per_s=3.35e12, hbm_bytes=80e9
)


def test_group_rate_binds_only_for_large_groups_by_hand() -> None:
    p = DecodeAttentionParams(
        floor_s=5e-6, per_seq_s=0.0, bw_eff=0.8, overlap=1.0, group_bytes_per_s=2.68e13
    )
    # 64 sequences x 4096 tokens, 1 KV head of dim 128, bf16: 2 x 262,144 x 128 x 2 bytes
    kv = 2 * 64 * 4096 * 128 * 2.0
    hbm = kv / (3.35e12 * 0.8)  # HBM time: 1 / 2.68e12 s per byte
    for g, want in ((4, hbm), (16, kv * 16 / 2.68e13)):  # 16 / 2.68e13 > 1 / 2.68e12
        got = ops.decode_attention_time_s(PEAKS, p, 64, 64 * 4096, 1, 128, 2.0, q_per_kv=g)
        assert float(got) == pytest.approx(5e-6 + want, rel=1e-12)
    # without the field (every other kernel) the group size changes nothing
    q = DecodeAttentionParams(floor_s=5e-6, per_seq_s=0.0, bw_eff=0.8, overlap=1.0)
    a, b = (
        float(ops.decode_attention_time_s(PEAKS, q, 64, 64 * 4096, 1, 128, 2.0, q_per_kv=g))
        for g in (1, 32)
    )
    assert a == b == pytest.approx(5e-6 + hbm, rel=1e-12)


def test_trtllm_worker_decode_follows_the_group_rate() -> None:
    """Two Llama-shaped layouts, same KV bytes: the XQA fit's per-token decode cost grows
    with the query heads per KV head where the group rate binds, as the kernel's rows do
    (the step model's closed form and ops agree)."""
    from disaggsim.costmodel.step import build_worker_cost

    prof = load_profile("h100-sxm")
    p = prof.decode_attention_for("trtllm", "bf16")
    assert p.group_bytes_per_s > prof.peaks.hbm_bytes_per_s
    w = build_worker_cost("llama-3-70b", "h100-sxm", 8, engine="trtllm")  # 8 q heads, 1 KV head
    assert w.decode_backend == "trtllm"
    hbm_per_byte = 1.0 / (prof.peaks.hbm_bytes_per_s * p.bw_eff)
    per_byte = max(hbm_per_byte, 8.0 / p.group_bytes_per_s)
    # a batch of whole waves (2 x 132 SMs, one block per sequence and KV head), so every
    # block streams in a full wave at its SM's share: no partial wave's own block rate
    # enters, and the per-token cost is the KV stream's alone
    assert p.wave_sms == 132.0
    _, per_token = w.decode_coeffs(264)
    want = 80 * 2.0 * 1 * 128 * 2.0 * per_byte  # layers x K and V x KV heads x dim x bytes
    assert per_token == pytest.approx(want, rel=1e-9)


@pytest.mark.skipif(not (DATA / "kernels").is_dir(), reason=f"no kernel tables at {DATA}")
def test_xqa_rows_large_reads_slow_down_with_the_group() -> None:
    """The premise on the measured rows: TensorRT-LLM's H100 XQA rows reading >= 64 MB of
    bf16 KV reach a lower bandwidth with more query heads per KV head (HBM alone would not
    depend on it)."""
    from calibration import public
    from calibration.fit_public import _decode_backend_rows

    d = _decode_backend_rows(public.aic_decode_attention(DATA, "h100-sxm"), "trtllm")
    d = d[d["dtype"] == "bf16"]
    kv = 2.0 * d["context_tokens"] * d["kv_heads"] * d["head_dim"] * 2.0
    big = d[kv >= 64e6].assign(tbps=kv / d["t_s"] / 1e12, g=(d["heads"] / d["kv_heads"]).round())
    by_g = big.groupby("g")["tbps"].median()
    assert by_g[2.0] > 2.3 and by_g[32.0] < 1.6 and by_g[2.0] > by_g[8.0] > by_g[32.0]
