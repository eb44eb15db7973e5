"""MoE decode attention takes the dense step's split-KV form (ops.decode_split_shortfall_s):
a split-KV kernel's few work items add the lesser of the stream's bandwidth-share loss and
its fill bound to the KV stream, so the attention never falls as the batch or the context
grows. Until 2026-12-04 the MoE layer model added the fill to the floor, and Mixtral-8x7B's
decode attention on H100 TP2 at 16 tokens a sequence fell from 0.414 ms at batch 1 to
0.411 ms at batch 4. The engine's decode lines (decode_coeffs, decode_min_coeffs) give the
same step as the layer model evaluated whole."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.costmodel.moe import build_moe_worker_cost
from disaggsim.costmodel.ops import decode_split_shortfall_s

BATCHES = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512)
TOKENS_PER_SEQ = (1, 16, 128, 1024, 8192)

WORKERS = {
    # GQA: 8 KV heads, 4 per GPU at TP2, vLLM's FlashAttention (split-KV)
    "mixtral-8x7b": {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 2, "engine": "vllm"},
    # GQA: 4 KV heads, all on one GPU
    "qwen3-30b-a3b": {"model": "qwen3-30b-a3b", "gpu": "h100-sxm", "tp": 1, "engine": "vllm"},
    # MLA: the absorbed decode kernel
    "deepseek-v3": {
        "model": "deepseek-v3",
        "gpu": "h200-sxm",
        "tp": 8,
        "engine": "vllm",
        "weight_dtype": "released",
    },
}


def _attention(c, batch: int, per_seq: int) -> float:
    return c.breakdown(decode_batch=batch, decode_context_tokens=batch * per_seq).attention_s


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_decode_attention_and_step_never_fall_as_batch_or_context_grow(name: str) -> None:
    c = build_moe_worker_cost(**WORKERS[name])
    attn = np.array([[_attention(c, b, n) for n in TOKENS_PER_SEQ] for b in BATCHES])
    step = np.array([[c.decode_time_s(b, b * n) for n in TOKENS_PER_SEQ] for b in BATCHES])
    for t in (attn, step):
        assert (np.diff(t, axis=0) >= 0.0).all(), t  # batch, tokens a sequence fixed
        assert (np.diff(t, axis=1) >= 0.0).all(), t  # context, batch fixed


def test_gqa_split_kernel_adds_the_lesser_of_share_loss_and_fill() -> None:
    # one layer's decode kernel on Mixtral TP2, by the fit's terms: floor, per-sequence
    # and per-element work, the KV stream at hbm x bw_eff, and ops' shortfall
    c = build_moe_worker_cost(**WORKERS["mixtral-8x7b"])
    d = c._dec
    assert d.split_fill_s > 0.0 and c.decode_min_lines
    hkv, hd = 4.0, 128.0
    for b, n in ((1, 16), (4, 16), (8, 1024), (256, 2048)):
        stream = 2.0 * b * n * hkv * hd * 2.0 / (c._hbm * d.bw_eff)
        want = (
            d.floor_s
            + (d.multi_floor_s if b > 1 else 0.0)
            + d.per_seq_s * b
            + d.per_seq_kv_elem_s * b * hkv * hd
            + stream
            + float(decode_split_shortfall_s(d, stream, b, hkv))
        )
        assert _attention(c, b, n) == pytest.approx(32 * want, rel=1e-12)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_decode_lines_give_the_whole_layer_model(name: str) -> None:
    # the engine's lines (the smaller of stream + fill and the stream at the share) against
    # the layer model evaluated at each context: the shortfall's kink is where they cross
    c = build_moe_worker_cost(**WORKERS[name])
    assert len(c.decode_min_coeffs(8)) == 1
    for b in BATCHES:
        for n in TOKENS_PER_SEQ:
            whole = c.mixed_time_s(b, b * n, 0, 0, 0.0)
            assert c.decode_time_s(b, b * n) == pytest.approx(whole, rel=1e-9)
