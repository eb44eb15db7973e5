"""The MoE / MLA / windowed-attention models and the H800: every field against the
model's config.json, parameter counts against the model cards, and KV bytes per token
worked out by hand."""

from __future__ import annotations

import json

import pytest

from disaggsim.catalog import DENSE_MODEL_IDS, MODEL_IDS, get_gpu, get_model
from disaggsim.hardware.profile import load_profile
from tests.conftest import SHARED_DATA

HF = SHARED_DATA / "models" / "hf_configs"
HF_FILE = {
    "deepseek-v3": "deepseek-ai--DeepSeek-V3_config.json",
    "deepseek-r1": "deepseek-ai--DeepSeek-R1_config.json",
    "qwen3-235b-a22b": "Qwen--Qwen3-235B-A22B_config.json",
    "qwen3-30b-a3b": "Qwen--Qwen3-30B-A3B_config.json",
    "gpt-oss-120b": "openai--gpt-oss-120b_config.json",
    "gpt-oss-20b": "openai--gpt-oss-20b_config.json",
    "mixtral-8x7b": "mistralai--Mixtral-8x7B-v0.1_config.json",
    "llama-3.1-405b": "meta-llama--Meta-Llama-3.1-405B_config.json",
    "llama-4-maverick": "meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json",
}


def _config(model_id: str) -> dict:
    path = HF / HF_FILE[model_id]
    if not path.is_file():
        pytest.skip(f"{path} absent: needs ../shared/data")
    raw = json.loads(path.read_text())
    return raw.get("text_config", raw)


def test_dense_ids_are_the_dense_specs():
    assert tuple(m for m in MODEL_IDS if get_model(m).is_dense) == DENSE_MODEL_IDS
    assert "llama-3.1-405b" in DENSE_MODEL_IDS and "mixtral-8x7b" not in DENSE_MODEL_IDS


@pytest.mark.parametrize("model_id", list(HF_FILE))
def test_shape_fields_are_the_config_json_ones(model_id):
    c = _config(model_id)
    m = get_model(model_id)
    assert m.num_layers == c["num_hidden_layers"]
    assert m.hidden == c["hidden_size"]
    assert m.num_heads == c["num_attention_heads"]
    assert m.num_kv_heads == c["num_key_value_heads"]
    assert m.vocab == c["vocab_size"]
    assert m.tied_embeddings == c.get("tie_word_embeddings", False)
    assert m.attention_bias == c.get("attention_bias", False)
    if "head_dim" in c:
        assert m.head_dim == c["head_dim"]
    elif m.mla is None:
        assert m.head_dim == c["hidden_size"] // c["num_attention_heads"]
    experts = c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts")
    if m.moe is None:
        assert experts is None
        assert m.ffn == c["intermediate_size"]
        return
    assert m.moe.num_experts == experts
    assert m.moe.top_k == c["num_experts_per_tok"]
    assert m.moe.expert_ffn == c.get("moe_intermediate_size", c["intermediate_size"])
    assert m.moe.num_shared_experts == c.get("n_shared_experts", 1 if "llama-4" in model_id else 0)
    assert m.moe.first_dense_layers == c.get("first_k_dense_replace", 0)
    assert m.moe.layer_step == c.get("interleave_moe_layer_step", 1)
    if "intermediate_size_mlp" in c:
        assert m.ffn == c["intermediate_size_mlp"]


def test_which_layers_are_moe():
    # DeepSeek: first_k_dense_replace 3 -> layers 0-2 dense, 3-60 MoE
    ds = get_model("deepseek-v3")
    assert ds.num_moe_layers == 58 and ds.num_dense_mlp_layers == 3
    assert not ds.moe.is_moe_layer(2) and ds.moe.is_moe_layer(3)
    # Llama 4 Maverick: interleave step 2 -> odd layers 1, 3, ..., 47 are MoE
    mv = get_model("llama-4-maverick")
    assert [i for i in range(48) if mv.moe.is_moe_layer(i)] == list(range(1, 48, 2))
    for mid in ("qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b"):
        m = get_model(mid)
        assert m.num_moe_layers == m.num_layers and m.num_dense_mlp_layers == 0


def test_mla_ranks_and_window_fields_are_the_config_json_ones():
    for mid in ("deepseek-v3", "deepseek-r1"):
        c, a = _config(mid), get_model(mid).mla
        assert (a.q_lora_rank, a.kv_lora_rank) == (c["q_lora_rank"], c["kv_lora_rank"])
        assert (a.qk_nope_head_dim, a.qk_rope_head_dim) == (
            c["qk_nope_head_dim"],
            c["qk_rope_head_dim"],
        )
        assert a.v_head_dim == c["v_head_dim"]
        assert get_model(mid).released_weights == "fp8-block"
        assert c["quantization_config"]["weight_block_size"] == [128, 128]
    for mid in ("gpt-oss-120b", "gpt-oss-20b"):
        c, w = _config(mid), get_model(mid).attention_window
        assert (w.kind, w.tokens) == ("sliding", c["sliding_window"])
        assert w.num_layers == c["layer_types"].count("sliding_attention")
        assert get_model(mid).num_full_attention_layers == c["layer_types"].count("full_attention")
        assert get_model(mid).released_weights == "mxfp4-moe"
        assert c["quantization_config"]["quant_method"] == "mxfp4"
    c, w = _config("llama-4-maverick"), get_model("llama-4-maverick").attention_window
    # chunked attention on 3 of every 4 layers (HF default no_rope_layer_interval 4)
    assert (w.kind, w.tokens, w.num_layers) == ("chunked", c["attention_chunk_size"], 36)


@pytest.mark.parametrize(
    "model_id, total_b, active_b",
    [  # model cards / vendor posts (models/README.md); active counts include the embedding
        ("deepseek-v3", 671.0, 37.5),  # 671B / 37B (MTP layer not counted)
        ("deepseek-r1", 671.0, 37.5),
        ("qwen3-235b-a22b", 235.1, 22.2),  # 235B / 22B
        ("qwen3-30b-a3b", 30.5, 3.35),  # 30.5B / 3.3B
        ("gpt-oss-120b", 116.83, 5.71),  # 116.8B / 5.1B without the 0.58B embedding
        ("gpt-oss-20b", 20.91, 4.19),  # 20.9B / 3.6B without the embedding
        ("mixtral-8x7b", 46.70, 12.88),  # 46.7B / 12.9B
        ("llama-3.1-405b", 405.85, 405.85),
        ("llama-4-maverick", 400.7, 17.18),  # 400B / 17B
    ],
)
def test_parameter_counts_match_the_model_cards(model_id, total_b, active_b):
    m = get_model(model_id)
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.003)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.01)


def test_deepseek_v3_parameters_by_hand():
    h = 7168
    attn = (
        h * 1536 + 1536  # q_a_proj + q_a_layernorm
        + 1536 * 128 * 192  # q_b_proj
        + h * 576 + 512  # kv_a_proj_with_mqa + kv_a_layernorm
        + 512 * 128 * (128 + 128)  # kv_b_proj
        + 128 * 128 * h  # o_proj
    )  # fmt: skip
    expert = 3 * h * 2048
    moe = 256 * expert + expert + h * 256  # routed + 1 shared + router
    layers = 61 * (attn + 2 * h) + 3 * 3 * h * 18432 + 58 * moe
    total = layers + 2 * 129280 * h + h  # embedding, LM head, final norm
    assert get_model("deepseek-v3").num_params == total


def test_gpt_oss_120b_parameters_by_hand():
    h, q, kv = 2880, 64 * 64, 8 * 64
    attn = h * (q + 2 * kv) + q * h + (q + 2 * kv + h)  # projections + their biases
    expert = h * 2 * 2880 + 2 * 2880 + 2880 * h + h  # gate_up (+bias), down (+bias)
    router = h * 128 + 128
    total = 36 * (attn + 2 * h + 128 * expert + router) + 2 * 201088 * h + h
    assert get_model("gpt-oss-120b").num_params == total


@pytest.mark.parametrize(
    "model_id, bf16_bytes_per_token",
    [
        ("deepseek-v3", 61 * (512 + 64) * 2),  # MLA latent + rope key: 70,272
        ("deepseek-r1", 70_272),
        ("qwen3-235b-a22b", 94 * 2 * 4 * 128 * 2),  # 192,512
        ("qwen3-30b-a3b", 48 * 2 * 4 * 128 * 2),  # 98,304
        ("gpt-oss-120b", 36 * 2 * 8 * 64 * 2),  # 73,728 while the context fits the window
        ("gpt-oss-20b", 24 * 2 * 8 * 64 * 2),  # 49,152
        ("mixtral-8x7b", 32 * 2 * 8 * 128 * 2),  # 131,072
        ("llama-3.1-405b", 126 * 2 * 8 * 128 * 2),  # 516,096
        ("llama-4-maverick", 48 * 2 * 8 * 128 * 2),  # 196,608
    ],
)
def test_kv_bytes_per_token_by_hand(model_id, bf16_bytes_per_token):
    m = get_model(model_id)
    assert m.kv_bytes_per_token("bf16") == bf16_bytes_per_token
    assert m.kv_bytes_per_token("fp8") == bf16_bytes_per_token // 2
    assert m.kv_bytes(1, "bf16") == bf16_bytes_per_token


def test_windowed_layers_bound_the_kv_of_long_sequences():
    # gpt-oss-120b: 18 full layers keep every token, 18 sliding layers at most 128
    per_layer_token = 2 * 8 * 64 * 2
    m = get_model("gpt-oss-120b")
    assert m.kv_bytes(100) == 36 * 100 * per_layer_token
    assert m.kv_bytes(10_000) == (18 * 10_000 + 18 * 128) * per_layer_token
    # Llama 4 Maverick: 36 chunked layers keep at most 8192 tokens, 12 global ones all
    mv = get_model("llama-4-maverick")
    assert mv.kv_bytes(8192) == 8192 * 196_608
    assert mv.kv_bytes(100_000) == (12 * 100_000 + 36 * 8192) * 4096
    # MLA and dense models: no window
    assert get_model("deepseek-v3").kv_bytes(100_000) == 100_000 * 70_272


def test_h800_is_h100_silicon_with_cut_nvlink():
    h800, h100 = get_gpu("h800-sxm"), get_gpu("h100-sxm")
    assert h800.silicon == "h100-sxm"
    for key in ("bf16_flop_per_s", "fp8_flop_per_s", "hbm_bytes", "hbm_bytes_per_s"):
        assert getattr(h800, key) == getattr(h100, key)
    assert h800.nvlink_bytes_per_s == 200e9  # 400 GB/s bidirectional
    prof, ref = load_profile("h800-sxm"), load_profile("h100-sxm")
    assert prof.gemm == ref.gemm and prof.decode_attention == ref.decode_attention
    # NVLink-bound terms scaled by 200 / 450
    lat, bw = prof.allreduce.for_gpus(8)
    assert bw == pytest.approx(ref.allreduce.for_gpus(8)[1] * 200 / 450, rel=1e-3)
    assert prof.copy["p2p"].bw_bytes_per_s == pytest.approx(
        ref.copy["p2p"].bw_bytes_per_s * 200 / 450, rel=1e-3
    )


# mistralai/Mixtral-8x22B-v0.1 config.json (not among ../shared/data's hf_configs): the
# keys the catalog reads, as the file gives them
MIXTRAL_8X22B_CONFIG = {
    "hidden_size": 6144,
    "intermediate_size": 16384,
    "max_position_embeddings": 65536,
    "num_attention_heads": 48,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 56,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def test_mixtral_8x22b_is_its_config_json():
    c, m = MIXTRAL_8X22B_CONFIG, get_model("mixtral-8x22b")
    assert m.hf_id == "mistralai/Mixtral-8x22B-v0.1"
    assert (m.num_layers, m.hidden, m.num_heads, m.num_kv_heads) == (
        c["num_hidden_layers"],
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    assert m.head_dim == c["hidden_size"] // c["num_attention_heads"] == 128
    assert (m.vocab, m.tied_embeddings) == (c["vocab_size"], c["tie_word_embeddings"])
    assert m.context_tokens == c["max_position_embeddings"]
    assert (m.moe.num_experts, m.moe.top_k) == (c["num_local_experts"], c["num_experts_per_tok"])
    assert m.moe.expert_ffn == c["intermediate_size"] and m.moe.num_shared_experts == 0
    assert m.num_moe_layers == 56 and m.num_dense_mlp_layers == 0
    # the shape AIConfigurator's moe_perf tables time for it (data/README.md)
    assert (m.hidden, m.moe.expert_ffn, m.moe.num_experts, m.moe.top_k) == (6144, 16384, 8, 2)


def test_mixtral_8x22b_parameters_by_hand():
    # Mistral's announcement: 141B parameters, 39B active
    h, q, kv, ffn = 6144, 48 * 128, 8 * 128, 16384
    attn = h * (q + 2 * kv) + q * h
    expert = 3 * h * ffn
    layer = attn + 2 * h + 8 * expert + h * 8  # two norms, experts, router
    m = get_model("mixtral-8x22b")
    assert m.num_params == 56 * layer + 2 * 32000 * h + h
    active = 56 * (attn + 2 * h + 2 * expert + h * 8) + 2 * 32000 * h + h
    assert m.active_params == active
    assert m.num_params / 1e9 == pytest.approx(141.0, rel=0.003)
    assert m.active_params / 1e9 == pytest.approx(39.0, rel=0.01)
    assert m.kv_bytes_per_token("bf16") == 56 * 2 * 8 * 128 * 2  # 229,376


# meta-llama/Llama-4-Scout-17B-16E-Instruct config.json, text_config (not among
# ../shared/data's hf_configs; AIConfigurator's copy, ai-dynamo/aiconfigurator 64c5ddb6
# aic-core/src/aiconfigurator_core/model_configs/): the keys the catalog reads
LLAMA_4_SCOUT_CONFIG = {
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "head_dim": 128,
    "hidden_size": 5120,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "vocab_size": 202048,
}


def test_llama_4_scout_is_its_config_json():
    c, m = LLAMA_4_SCOUT_CONFIG, get_model("llama-4-scout")
    assert m.hf_id == "meta-llama/Llama-4-Scout-17B-16E-Instruct"
    assert (m.num_layers, m.hidden, m.num_heads, m.num_kv_heads, m.head_dim) == (
        c["num_hidden_layers"],
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    assert (m.vocab, m.attention_bias) == (c["vocab_size"], c["attention_bias"])
    assert m.context_tokens == c["max_position_embeddings"]
    assert m.ffn == c["intermediate_size_mlp"]
    assert (m.moe.num_experts, m.moe.top_k) == (c["num_local_experts"], c["num_experts_per_tok"])
    assert m.moe.expert_ffn == c["intermediate_size"]
    # the Llama 4 MoE block: one shared expert of the routed width beside the routed ones
    assert (m.moe.num_shared_experts, m.moe.shared_expert_ffn) == (1, c["intermediate_size"])
    # interleave_moe_layer_step 1: every layer is MoE (Maverick's 2: the odd ones)
    assert m.moe.layer_step == c["interleave_moe_layer_step"]
    assert m.num_moe_layers == 48 and m.num_dense_mlp_layers == 0
    # chunked attention on the RoPE layers, 3 of every 4 (HF default no_rope_layer_interval
    # 4: layers 3, 7, ..., 47 global), as Maverick
    w = m.attention_window
    assert (w.kind, w.tokens, w.num_layers) == ("chunked", c["attention_chunk_size"], 36)
    # the shape AIConfigurator's moe_perf tables time for it
    assert (m.hidden, m.moe.expert_ffn, m.moe.num_experts, m.moe.top_k) == (5120, 8192, 16, 1)


def test_llama_4_scout_parameters_by_hand():
    # Meta's model card: 109B parameters, 17B active (with the ~0.8B vision encoder, which
    # the text model here leaves out: 34 layers of width 1408 / 5632)
    h, q, kv, ffn = 5120, 40 * 128, 8 * 128, 8192
    attn = h * (q + 2 * kv) + q * h
    expert = 3 * h * ffn
    layer = attn + 2 * h + 16 * expert + expert + h * 16  # norms, routed, shared, router
    m = get_model("llama-4-scout")
    assert m.num_params == 48 * layer + 2 * 202048 * h + h
    active = 48 * (attn + 2 * h + 2 * expert + h * 16) + 2 * 202048 * h + h
    assert m.active_params == active
    assert m.num_params / 1e9 == pytest.approx(109.0, rel=0.015)  # 107.77
    assert m.active_params / 1e9 == pytest.approx(17.0, rel=0.015)  # 17.17
    assert m.kv_bytes_per_token("bf16") == 48 * 2 * 8 * 128 * 2  # 196,608
