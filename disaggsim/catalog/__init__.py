"""Model and GPU catalogs: shapes and datasheet peaks, read from the YAML files beside
this module into frozen dataclasses.

``models.yaml`` holds each model's transformer shape as in its Hugging Face config, with
optional ``moe`` (routed/shared experts, which layers are MoE), ``mla`` (DeepSeek latent
attention ranks) and ``attention_window`` (sliding or chunked layers) sections;
``gpus.yaml`` holds each GPU's datasheet peaks in human units (``_tflops``,
``_gb_per_s`` with GB = 1e9 bytes, ``hbm_mib`` with MiB = 2**20 bytes, ``_gbit_per_s``),
converted once on load to SI (FLOP/s, bytes, bytes/s). Device memory comes twice:
``hbm_mib`` as nvidia-smi reports it, and ``cuda_mib``, the total CUDA reports
(``cudaMemGetInfo``, PyTorch's ``total_memory``), which is what serving engines size
their KV cache from (:attr:`GpuSpec.usable_bytes`). The ids below are the public
names scenarios and the CLI use; an unknown id is a :class:`~disaggsim.errors.UserError`
listing the allowed ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from disaggsim.errors import UserError, closest_hint
from disaggsim.units import DTYPE_BYTES, GBIT, TFLOP, MiB

__all__ = [
    "DENSE_MODEL_IDS",
    "GPU_IDS",
    "MODEL_IDS",
    "RELEASED_WEIGHTS",
    "AttentionWindowSpec",
    "GpuSpec",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "dtype_bytes",
    "get_gpu",
    "get_model",
    "id_hint",
    "load_gpus",
    "load_models",
]

MODEL_IDS: tuple[str, ...] = (
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "opt-13b",
    "opt-66b",
    "mistral-7b",
    "qwen2-72b",
    "deepseek-v3",
    "deepseek-r1",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "llama-3.1-405b",
    "llama-4-maverick",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mixtral-8x22b",
    "llama-4-scout",
)
GPU_IDS: tuple[str, ...] = (
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
    "l40s",
    "h800-sxm",
)
NORMS = ("rmsnorm", "layernorm")
# How the model's weights are released: bf16 everywhere; fp8-block (e4m3 with 128x128
# block scales on every linear layer but embeddings, LM head and router: DeepSeek-V3/R1);
# mxfp4-moe (routed-expert weights in MXFP4, the rest bf16: gpt-oss).
RELEASED_WEIGHTS = ("bf16", "fp8-block", "mxfp4-moe")
WINDOW_KINDS = ("sliding", "chunked")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (bf16/fp16 = 2, fp8 = 1); UserError otherwise."""
    if dtype not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r} (allowed: {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Mixture-of-experts layers: routed experts (each a gated MLP of width
    ``expert_ffn``), ``top_k`` of them per token, plus ``num_shared_experts`` always-on
    experts of width ``shared_expert_ffn``. Layer ``i`` is MoE when
    ``i >= first_dense_layers`` and ``i % layer_step == layer_step - 1`` (DeepSeek:
    first_k_dense_replace 3, step 1; Llama 4: interleave_moe_layer_step 2, odd layers);
    the other layers have the model's dense MLP (``ModelSpec.ffn``)."""

    num_experts: int
    top_k: int
    expert_ffn: int
    num_shared_experts: int = 0
    shared_expert_ffn: int = 0
    first_dense_layers: int = 0
    layer_step: int = 1
    expert_bias: bool = False  # gpt-oss: biases on every expert's gate/up and down
    router_bias: bool = False  # gpt-oss: bias on the router logits

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_dense_layers and layer % self.layer_step == self.layer_step - 1

    def num_moe_layers(self, num_layers: int) -> int:
        return sum(1 for i in range(num_layers) if self.is_moe_layer(i))


@dataclass(frozen=True, slots=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_lora_rank``
    bottleneck (0: a direct projection), keys and values from a compressed latent of
    ``kv_lora_rank`` plus a shared RoPE key of ``qk_rope_head_dim``; per head, queries
    and keys have ``qk_nope_head_dim + qk_rope_head_dim`` dimensions, values
    ``v_head_dim``. The cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token
    per layer, for all heads at once."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_elems_per_token(self) -> int:
        """Cached values per token per layer: latent + shared RoPE key (576 for V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class AttentionWindowSpec:
    """``num_layers`` layers attend to a bounded span: ``sliding`` layers to the last
    ``tokens`` tokens (gpt-oss: 128), ``chunked`` layers to the tokens of the current
    ``tokens``-long chunk (Llama 4: 8192). Those layers keep at most ``tokens`` tokens of
    KV per sequence; the other layers attend to (and keep) the whole context."""

    kind: str
    tokens: int
    num_layers: int


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape (counts, not bytes): dense by default; with
    ``moe``, ``mla`` or ``attention_window`` set, the MoE/MLA/windowed parts follow those
    sections (``disaggsim.costmodel.moe`` costs such models)."""

    id: str
    hf_id: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    gated_mlp: bool
    vocab: int
    tied_embeddings: bool
    norm: str
    qkv_bias: bool
    linear_bias: bool
    learned_positions: int
    context_tokens: int  # the longest prompt + output a server accepts
    attention_bias: bool = False  # bias on Q, K, V and O (gpt-oss)
    released_weights: str = "bf16"
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    attention_window: AttentionWindowSpec | None = None

    @property
    def is_dense(self) -> bool:
        """A plain GQA/MHA transformer with one dense MLP per layer (the dense cost model)."""
        return self.moe is None and self.mla is None and self.attention_window is None

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.moe.num_moe_layers(self.num_layers)

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention block (projections, their biases, and MLA's
        latent norms)."""
        h = self.hidden
        if self.mla is not None:
            a = self.mla
            q = (
                h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * self.num_heads * a.qk_head_dim
                if a.q_lora_rank
                else h * self.num_heads * a.qk_head_dim
            )
            kv = h * a.cache_elems_per_token + a.kv_lora_rank
            kv += a.kv_lora_rank * self.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
            return q + kv + self.num_heads * a.v_head_dim * h
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        params = h * (q_out + 2 * kv_out) + q_out * h
        if self.attention_bias:
            params += q_out + 2 * kv_out + h
        elif self.linear_bias:
            params += self.qkv_out + h
        elif self.qkv_bias:
            params += self.qkv_out
        return params

    def mlp_params(self, width: int) -> int:
        """Weights of one MLP of intermediate size ``width`` (gated: gate, up, down)."""
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert, biases included when the model has them."""
        assert self.moe is not None
        w = self.moe.expert_ffn
        bias = ((2 if self.gated_mlp else 1) * w + self.hidden) if self.moe.expert_bias else 0
        return self.mlp_params(w) + bias

    @property
    def router_params(self) -> int:
        assert self.moe is not None
        return self.hidden * self.moe.num_experts + (
            self.moe.num_experts if self.moe.router_bias else 0
        )

    @property
    def moe_layer_params(self) -> int:
        """Weights of one MoE block: routed experts, shared experts and the router."""
        assert self.moe is not None
        shared = self.moe.num_shared_experts * self.mlp_params(self.moe.shared_expert_ffn)
        return self.moe.num_experts * self.expert_params + shared + self.router_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: every layer's attention and dense MLP, ``top_k``
        routed plus the shared experts and the router in MoE layers, the LM head (the
        embedding lookup included, as model cards count it)."""
        if self.moe is None:
            return self.num_params
        moe = self.moe
        shared = moe.num_shared_experts * self.mlp_params(moe.shared_expert_ffn)
        active_moe = moe.top_k * self.expert_params + shared + self.router_params
        return (
            self.num_params
            - self.num_moe_layers * self.moe_layer_params
            + self.num_moe_layers * active_moe
        )

    @property
    def num_full_attention_layers(self) -> int:
        """Layers whose KV grows with the whole context."""
        w = self.attention_window
        return self.num_layers - (w.num_layers if w is not None else 0)

    @property
    def qkv_out(self) -> int:
        """Output features of the fused QKV projection (whole model, unsharded)."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's linear layers (QKV, O, MLP), biases excluded."""
        attn = self.hidden * self.qkv_out + self.num_heads * self.head_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attn + mlp

    @property
    def layer_params(self) -> int:
        """All parameters of one layer: linear weights, biases and the two norms."""
        norm_params = (2 if self.norm == "layernorm" else 1) * self.hidden
        bias = 0
        if self.linear_bias:
            bias = (
                self.qkv_out + self.hidden + self.ffn * (2 if self.gated_mlp else 1) + self.hidden
            )
        elif self.qkv_bias:
            bias = self.qkv_out
        return self.layer_matmul_params + bias + 2 * norm_params

    @property
    def embedding_params(self) -> int:
        """Token embedding plus any learned position embedding."""
        return (self.vocab + self.learned_positions) * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Output projection weights (0 when tied to the token embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """Total parameters: embeddings + untied LM head + layers + final norm (MoE models:
        every routed and shared expert; DeepSeek's multi-token-prediction layer is not
        counted, it serves only speculative decoding)."""
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden
        if self.is_dense:
            layers = self.num_layers * self.layer_params
        else:
            norms = 2 * (2 if self.norm == "layernorm" else 1) * self.hidden
            layers = self.num_layers * (self.attention_params + norms)
            layers += self.num_dense_mlp_layers * self.mlp_params(self.ffn)
            if self.moe is not None:
                layers += self.num_moe_layers * self.moe_layer_params
        return self.embedding_params + self.lm_head_params + layers + final_norm

    def weights_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all weights stored in ``dtype`` (bf16/fp16: 2 bytes, fp8: 1)."""
        return self.num_params * dtype_bytes(dtype)

    def kv_elems_per_token_per_layer(self) -> int:
        """Cached values per token per layer: K and V of every KV head (GQA/MHA), or
        MLA's latent plus RoPE key (one copy for all heads)."""
        if self.mla is not None:
            return self.mla.cache_elems_per_token
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV-cache bytes per token if every layer keeps every token: layers × values per
        token per layer × elem — GQA: 2 (K and V) × kv_heads × head_dim; MLA:
        kv_lora_rank + qk_rope_head_dim. Exact for contexts up to the attention window;
        :meth:`kv_bytes` is exact for any context."""
        return self.num_layers * self.kv_elems_per_token_per_layer() * dtype_bytes(kv_dtype)

    def kv_bytes(self, tokens: int, kv_dtype: str = "bf16") -> int:
        """KV-cache bytes of one sequence of ``tokens`` tokens: full-attention layers keep
        every token, windowed layers at most the window."""
        per_layer_token = self.kv_elems_per_token_per_layer() * dtype_bytes(kv_dtype)
        w = self.attention_window
        kept = self.num_full_attention_layers * tokens
        if w is not None:
            kept += w.num_layers * min(tokens, w.tokens)
        return kept * per_layer_token


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Datasheet peaks of one GPU, SI units; link bandwidths per direction, per GPU."""

    id: str
    name: str
    bf16_flop_per_s: float
    fp8_flop_per_s: float  # 0 where the GPU has no FP8 tensor cores
    hbm_bytes: float  # device memory as nvidia-smi reports it (the datasheet's, in MiB)
    usable_bytes: float  # the total CUDA reports: what engines size their KV cache from
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # 0 without NVLink
    pcie_gen: int
    pcie_bytes_per_s: float
    nic_bytes_per_s: float
    gpus_per_node: int
    fp4_flop_per_s: float = 0.0  # dense FP4 tensor-core peak; 0 before Blackwell
    silicon: str = ""  # another catalog GPU with the same chip (H800: h100-sxm); "" = itself

    @property
    def has_fp8(self) -> bool:
        return self.fp8_flop_per_s > 0

    def flop_per_s(self, dtype: str) -> float:
        return self.fp8_flop_per_s if dtype == "fp8" else self.bf16_flop_per_s


_MODEL_KEYS: dict[str, type] = {
    "hf_id": str,
    "num_layers": int,
    "hidden": int,
    "num_heads": int,
    "num_kv_heads": int,
    "head_dim": int,
    "ffn": int,
    "gated_mlp": bool,
    "vocab": int,
    "tied_embeddings": bool,
    "norm": str,
    "qkv_bias": bool,
    "linear_bias": bool,
    "learned_positions": int,
    "context_tokens": int,
}
# optional model keys (default: a dense bf16 model without them)
_MODEL_OPTIONAL: dict[str, type] = {
    "attention_bias": bool,
    "released_weights": str,
    "moe": dict,
    "mla": dict,
    "attention_window": dict,
}
_MOE_KEYS: dict[str, type] = {"num_experts": int, "top_k": int, "expert_ffn": int}
_MOE_OPTIONAL: dict[str, type] = {
    "num_shared_experts": int,
    "shared_expert_ffn": int,
    "first_dense_layers": int,
    "layer_step": int,
    "expert_bias": bool,
    "router_bias": bool,
}
_MLA_KEYS: dict[str, type] = {
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_nope_head_dim": int,
    "qk_rope_head_dim": int,
    "v_head_dim": int,
}
_WINDOW_KEYS: dict[str, type] = {"kind": str, "tokens": int, "num_layers": int}
_GPU_KEYS: dict[str, type] = {
    "name": str,
    "bf16_tflops": float,
    "fp8_tflops": float,
    "hbm_mib": int,
    "hbm_gb_per_s": float,
    "nvlink_gb_per_s": float,
    "pcie_gen": int,
    "pcie_gb_per_s": float,
    "nic_gbit_per_s": float,
    "gpus_per_node": int,
}
_GPU_OPTIONAL: dict[str, type] = {"fp4_tflops": float, "silicon": str, "cuda_mib": int}

CUDA_RESERVED_MIB = 583
"""What a GPU without a measured ``cuda_mib`` loses between nvidia-smi's total and CUDA's:
the median of the catalog's measured differences (H100 SXM 469, L40S 479, H100 PCIe 551,
H200 615, B200 717, A100 871 MiB; gpus.yaml says where each was read)."""


def _read_yaml(name: str) -> tuple[str, dict[str, Any]]:
    path = resources.files("disaggsim.catalog") / name
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        raise UserError(f"{path}:{line} not valid YAML") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of id -> entry at top level")
    return str(path), raw


def _check_entry(
    path: str,
    ident: str,
    entry: Any,
    keys: dict[str, type],
    optional: dict[str, type] | None = None,
) -> dict[str, Any]:
    optional = optional or {}
    if not isinstance(entry, dict):
        raise UserError(f"{path}: {ident}: expected a mapping")
    extra = sorted(set(entry) - set(keys) - set(optional))
    missing = [k for k in keys if k not in entry]
    if extra or missing:
        what = f"unknown key {extra[0]!r}" if extra else f"missing key {missing[0]!r}"
        raise UserError(f"{path}: {ident}: {what} (keys: {', '.join([*keys, *optional])})")
    out: dict[str, Any] = {}
    for key, typ in {**keys, **optional}.items():
        if key not in entry:
            continue
        v = entry[key]
        ok = (
            isinstance(v, bool)
            if typ is bool
            else isinstance(v, str)
            if typ is str
            else isinstance(v, dict)
            if typ is dict
            else isinstance(v, int) and not isinstance(v, bool)
            if typ is int
            else isinstance(v, (int, float)) and not isinstance(v, bool)
        )
        if not ok:
            raise UserError(f"{path}: {ident}.{key}: expected {typ.__name__}, got {v!r}")
        if typ in (int, float) and v < 0:
            raise UserError(f"{path}: {ident}.{key}: must be >= 0, got {v!r}")
        out[key] = v
    return out


@cache
def load_models() -> Mapping[str, ModelSpec]:
    """All catalog models by id (read once; the mapping is read-only)."""
    path, raw = _read_yaml("models.yaml")
    if tuple(raw) != MODEL_IDS:
        raise UserError(f"{path}: model ids must be exactly: {', '.join(MODEL_IDS)}")
    models = {}
    for ident, entry in raw.items():
        e = _check_entry(path, ident, entry, _MODEL_KEYS, _MODEL_OPTIONAL)
        if e["norm"] not in NORMS:
            raise UserError(f"{path}: {ident}.norm: {e['norm']!r} (allowed: {', '.join(NORMS)})")
        for key in (
            "num_layers",
            "hidden",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "ffn",
            "vocab",
            "context_tokens",
        ):
            if e[key] <= 0:
                raise UserError(f"{path}: {ident}.{key}: must be > 0")
        if e["num_heads"] % e["num_kv_heads"]:
            raise UserError(f"{path}: {ident}.num_kv_heads: must divide num_heads")
        e = _model_sections(path, ident, e)
        models[ident] = ModelSpec(id=ident, **e)
    return MappingProxyType(models)


def _model_sections(path: str, ident: str, e: dict[str, Any]) -> dict[str, Any]:
    """Check and build the optional moe / mla / attention_window sections."""
    rw = e.get("released_weights", "bf16")
    if rw not in RELEASED_WEIGHTS:
        raise UserError(
            f"{path}: {ident}.released_weights: {rw!r} (allowed: {', '.join(RELEASED_WEIGHTS)})"
        )
    if "moe" in e:
        m = _check_entry(path, f"{ident}.moe", e["moe"], _MOE_KEYS, _MOE_OPTIONAL)
        moe = MoeSpec(**m)
        if moe.num_experts < 2 or not 1 <= moe.top_k <= moe.num_experts or moe.expert_ffn < 1:
            raise UserError(
                f"{path}: {ident}.moe: need num_experts >= 2, 1 <= top_k <= num_experts"
            )
        if moe.layer_step < 1 or moe.num_moe_layers(e["num_layers"]) == 0:
            raise UserError(f"{path}: {ident}.moe: layer_step >= 1 and at least one MoE layer")
        if moe.num_shared_experts and moe.shared_expert_ffn < 1:
            raise UserError(
                f"{path}: {ident}.moe.shared_expert_ffn: must be > 0 with shared experts"
            )
        e["moe"] = moe
    if "mla" in e:
        a = _check_entry(path, f"{ident}.mla", e["mla"], _MLA_KEYS)
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if a[key] <= 0:
                raise UserError(f"{path}: {ident}.mla.{key}: must be > 0")
        e["mla"] = MlaSpec(**a)
    if "attention_window" in e:
        w = _check_entry(path, f"{ident}.attention_window", e["attention_window"], _WINDOW_KEYS)
        if w["kind"] not in WINDOW_KINDS:
            raise UserError(
                f"{path}: {ident}.attention_window.kind: {w['kind']!r} "
                f"(allowed: {', '.join(WINDOW_KINDS)})"
            )
        if w["tokens"] < 1 or not 1 <= w["num_layers"] < e["num_layers"]:
            raise UserError(
                f"{path}: {ident}.attention_window: tokens >= 1 and 1 <= num_layers < num_layers"
            )
        e["attention_window"] = AttentionWindowSpec(**w)
    return e


@cache
def load_gpus() -> Mapping[str, GpuSpec]:
    """All catalog GPUs by id, converted to SI (read once; the mapping is read-only)."""
    path, raw = _read_yaml("gpus.yaml")
    if tuple(raw) != GPU_IDS:
        raise UserError(f"{path}: GPU ids must be exactly: {', '.join(GPU_IDS)}")
    gpus = {}
    for ident, entry in raw.items():
        e = _check_entry(path, ident, entry, _GPU_KEYS, _GPU_OPTIONAL)
        if e.get("silicon", ident) not in (*raw, ""):
            raise UserError(
                f"{path}: {ident}.silicon: {e['silicon']!r} (allowed: {', '.join(raw)})"
            )
        for key in ("bf16_tflops", "hbm_mib", "hbm_gb_per_s", "pcie_gb_per_s", "nic_gbit_per_s"):
            if e[key] <= 0:
                raise UserError(f"{path}: {ident}.{key}: must be > 0")
        cuda_mib = e.get("cuda_mib", e["hbm_mib"] - CUDA_RESERVED_MIB)
        if not 0 < cuda_mib <= e["hbm_mib"]:
            raise UserError(
                f"{path}: {ident}.cuda_mib: must be > 0 and at most hbm_mib "
                f"({e['hbm_mib']}), got {cuda_mib}"
            )
        gpus[ident] = GpuSpec(
            id=ident,
            name=e["name"],
            bf16_flop_per_s=float(e["bf16_tflops"]) * TFLOP,
            fp8_flop_per_s=float(e["fp8_tflops"]) * TFLOP,
            hbm_bytes=float(e["hbm_mib"] * MiB),
            usable_bytes=float(cuda_mib * MiB),
            hbm_bytes_per_s=float(e["hbm_gb_per_s"]) * 1e9,
            nvlink_bytes_per_s=float(e["nvlink_gb_per_s"]) * 1e9,
            pcie_gen=e["pcie_gen"],
            pcie_bytes_per_s=float(e["pcie_gb_per_s"]) * 1e9,
            nic_bytes_per_s=float(e["nic_gbit_per_s"]) * GBIT,
            gpus_per_node=e["gpus_per_node"],
            fp4_flop_per_s=float(e.get("fp4_tflops", 0.0)) * TFLOP,
            silicon=e.get("silicon", ""),
        )
    return MappingProxyType(gpus)


DENSE_MODEL_IDS: tuple[str, ...] = tuple(
    m
    for m in MODEL_IDS
    if m
    not in (
        "deepseek-v3",
        "deepseek-r1",
        "qwen3-235b-a22b",
        "qwen3-30b-a3b",
        "gpt-oss-120b",
        "gpt-oss-20b",
        "mixtral-8x7b",
        "llama-4-maverick",
        "mixtral-8x22b",
        "llama-4-scout",
    )
)  # checked against each spec's is_dense by tests/test_moe_catalog.py


def get_model(model: str | ModelSpec) -> ModelSpec:
    """The catalog model ``model`` (a spec passes through); UserError for unknown ids."""
    if isinstance(model, ModelSpec):
        return model
    models = load_models()
    if model not in models:
        raise UserError(
            f"unknown model {model!r} (allowed: {', '.join(MODEL_IDS)}){id_hint('model', model)}"
        )
    return models[model]


def get_gpu(gpu: str | GpuSpec) -> GpuSpec:
    """The catalog GPU ``gpu`` (a spec passes through); UserError for unknown ids."""
    if isinstance(gpu, GpuSpec):
        return gpu
    gpus = load_gpus()
    if gpu not in gpus:
        raise UserError(f"unknown GPU {gpu!r} (allowed: {', '.join(GPU_IDS)}){id_hint('gpu', gpu)}")
    return gpus[gpu]


# Suffixes a user's name may carry that do not change a model's shapes (fine-tunes and
# repository naming); stripped before matching a name against the catalog.
_NAME_SUFFIXES = ("-instruct", "-chat", "-hf", "-base", "-it")


def _name_key(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-").replace(" ", "-")
    for suffix in _NAME_SUFFIXES:
        key = key.removesuffix(suffix)
    return key.removeprefix("meta-")


def id_hint(kind: str, name: str) -> str:
    """`` (did you mean ...?)`` for an unknown ``kind`` (``model`` or ``gpu``) id that
    resembles catalog ids (case, a Hugging Face repository id such as
    ``meta-llama/Llama-3.1-8B-Instruct``, a GPU's name, a name the ids start with, a close
    spelling), else ``""`` (:func:`disaggsim.errors.closest_hint`). The id is never
    substituted: a scenario names the catalog id it runs, and a close spelling is offered
    only with the same numbers (never a model of another size or a GPU of other memory)."""
    names: dict[str, str] = {}
    if kind == "model":
        for ident, spec in load_models().items():
            names.setdefault(ident, ident)
            names.setdefault(spec.hf_id, ident)
    else:
        names = {ident: ident for ident in GPU_IDS}
        for ident, gpu in load_gpus().items():
            names.setdefault(gpu.name, ident)
    return closest_hint(str(name), names, key=_name_key, cutoff=0.8, prefix=True, same_numbers=True)
