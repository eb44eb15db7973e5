"""FP8 linear layers of an MoE model quantise their input activations in a kernel of their
own, as the dense step prices them (``step.FP8_QUANT_BYTES_PER_ELEM``: read 2 bytes, write
1 per input element): every attention projection's input, the dense MLP layers' two GEMM
inputs and the shared experts' two. The routed experts' quantisation is not added: the
grouped-GEMM fits time the whole fused MoE op, quantisation included."""

from __future__ import annotations

import pytest

from disaggsim.catalog import get_model
from disaggsim.costmodel.moe import build_moe_worker_cost
from disaggsim.hardware.profile import load_profile


def _ew(gpu: str, worker_kwargs: dict, tokens: int) -> float:
    c = build_moe_worker_cost(**worker_kwargs)
    return c.breakdown(
        prefill_seqs=1, prefill_tokens=tokens, prefill_attn_pairs=tokens * (tokens + 1) / 2
    ).elementwise_s


@pytest.mark.parametrize("tokens", [1, 4096])
def test_mixtral_fp8_adds_one_pass_per_attention_projection(tokens: int) -> None:
    # Mixtral-8x7B at TP2: QKV reads the 4,096-wide hidden state, O the 16 x 128 = 2,048
    # query heads of the GPU; no dense MLP layers, no shared experts
    gpu = "h100-sxm"
    kw = {"model": "mixtral-8x7b", "gpu": gpu, "tp": 2, "engine": "trtllm"}
    fp8 = _ew(gpu, {**kw, "weight_dtype": "fp8"}, tokens)
    bf16 = _ew(gpu, {**kw, "weight_dtype": "bf16"}, tokens)
    prof = load_profile(gpu)
    ew, hbm = prof.elementwise, prof.peaks.hbm_bytes_per_s
    one = sum(ew.launch_s + 3.0 * tokens * k / (hbm * ew.bw_eff) for k in (4096, 2048))
    assert fp8 - bf16 == pytest.approx(32 * one, rel=1e-9)


def test_deepseek_quantises_its_dense_and_shared_expert_inputs() -> None:
    # DeepSeek-V3 as released (fp8 blocks): one pass per MLA projection of every layer, two
    # per dense MLP layer (the first three) and two per MoE layer's shared expert. With no
    # token the passes cost their launches: the count of quantisation kernels
    gpu = "h200-sxm"
    kw = {"model": "deepseek-v3", "gpu": gpu, "tp": 8, "engine": "vllm"}
    c = build_moe_worker_cost(**kw, weight_dtype="released")
    m = get_model("deepseek-v3")
    assert m.num_dense_mlp_layers == 3 and m.num_moe_layers == 58
    launch = load_profile(gpu).elementwise.launch_s
    bd = c.breakdown(decode_batch=1, decode_context_tokens=1)
    c._quant = False  # the same worker without its quantisation kernels
    bd0 = c.breakdown(decode_batch=1, decode_context_tokens=1)
    kernels = 61 * len(c._attn_shapes) + 3 * 2 + 58 * 2
    extra = bd.elementwise_s - bd0.elementwise_s
    assert extra == pytest.approx(kernels * launch, rel=0.02)  # one token: ~launch-bound
    assert bd.expert_gemm_s == bd0.expert_gemm_s  # the routed experts: in the fits


def test_bf16_weights_add_nothing() -> None:
    c = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, weight_dtype="bf16")
    assert not c._quant
    assert c._quant_s(4096.0, (4096.0, 2048.0)) == 0.0
