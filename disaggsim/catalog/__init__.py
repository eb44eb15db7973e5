"""Model and GPU catalogs: shapes and datasheet peaks, read from the YAML files beside
this module into frozen dataclasses.

``models.yaml`` holds each model's transformer shape as in its Hugging Face config;
``gpus.yaml`` holds each GPU's datasheet peaks in human units (``_tflops``,
``_gb_per_s`` with GB = 1e9 bytes, ``hbm_mib`` with MiB = 2**20 bytes, ``_gbit_per_s``),
converted once on load to SI (FLOP/s, bytes, bytes/s). The ids below are the public
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

from disaggsim.errors import UserError
from disaggsim.units import DTYPE_BYTES, GBIT, TFLOP, MiB

__all__ = [
    "GPU_IDS",
    "MODEL_IDS",
    "GpuSpec",
    "ModelSpec",
    "dtype_bytes",
    "get_gpu",
    "get_model",
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
)
GPU_IDS: tuple[str, ...] = ("a100-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200", "l40s")
NORMS = ("rmsnorm", "layernorm")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (bf16/fp16 = 2, fp8 = 1); UserError otherwise."""
    if dtype not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r} (allowed: {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder-only transformer's shape (counts, not bytes)."""

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
        """Total parameters: embeddings + untied LM head + layers + final norm."""
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_layers * self.layer_params
            + final_norm
        )

    def weights_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all weights stored in ``dtype`` (bf16/fp16: 2 bytes, fp8: 1)."""
        return self.num_params * dtype_bytes(dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV-cache bytes per token: 2 (K and V) × layers × kv_heads × head_dim × elem."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Datasheet peaks of one GPU, SI units; link bandwidths per direction, per GPU."""

    id: str
    name: str
    bf16_flop_per_s: float
    fp8_flop_per_s: float  # 0 where the GPU has no FP8 tensor cores
    hbm_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # 0 without NVLink
    pcie_gen: int
    pcie_bytes_per_s: float
    nic_bytes_per_s: float
    gpus_per_node: int

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
}
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


def _check_entry(path: str, ident: str, entry: Any, keys: dict[str, type]) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise UserError(f"{path}: {ident}: expected a mapping")
    extra = sorted(set(entry) - set(keys))
    missing = [k for k in keys if k not in entry]
    if extra or missing:
        what = f"unknown key {extra[0]!r}" if extra else f"missing key {missing[0]!r}"
        raise UserError(f"{path}: {ident}: {what} (keys: {', '.join(keys)})")
    out: dict[str, Any] = {}
    for key, typ in keys.items():
        v = entry[key]
        ok = (
            isinstance(v, bool)
            if typ is bool
            else isinstance(v, str)
            if typ is str
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
        e = _check_entry(path, ident, entry, _MODEL_KEYS)
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
        ):
            if e[key] <= 0:
                raise UserError(f"{path}: {ident}.{key}: must be > 0")
        if e["num_heads"] % e["num_kv_heads"]:
            raise UserError(f"{path}: {ident}.num_kv_heads: must divide num_heads")
        models[ident] = ModelSpec(id=ident, **e)
    return MappingProxyType(models)


@cache
def load_gpus() -> Mapping[str, GpuSpec]:
    """All catalog GPUs by id, converted to SI (read once; the mapping is read-only)."""
    path, raw = _read_yaml("gpus.yaml")
    if tuple(raw) != GPU_IDS:
        raise UserError(f"{path}: GPU ids must be exactly: {', '.join(GPU_IDS)}")
    gpus = {}
    for ident, entry in raw.items():
        e = _check_entry(path, ident, entry, _GPU_KEYS)
        for key in ("bf16_tflops", "hbm_mib", "hbm_gb_per_s", "pcie_gb_per_s", "nic_gbit_per_s"):
            if e[key] <= 0:
                raise UserError(f"{path}: {ident}.{key}: must be > 0")
        gpus[ident] = GpuSpec(
            id=ident,
            name=e["name"],
            bf16_flop_per_s=float(e["bf16_tflops"]) * TFLOP,
            fp8_flop_per_s=float(e["fp8_tflops"]) * TFLOP,
            hbm_bytes=float(e["hbm_mib"] * MiB),
            hbm_bytes_per_s=float(e["hbm_gb_per_s"]) * 1e9,
            nvlink_bytes_per_s=float(e["nvlink_gb_per_s"]) * 1e9,
            pcie_gen=e["pcie_gen"],
            pcie_bytes_per_s=float(e["pcie_gb_per_s"]) * 1e9,
            nic_bytes_per_s=float(e["nic_gbit_per_s"]) * GBIT,
            gpus_per_node=e["gpus_per_node"],
        )
    return MappingProxyType(gpus)


def get_model(model: str | ModelSpec) -> ModelSpec:
    """The catalog model ``model`` (a spec passes through); UserError for unknown ids."""
    if isinstance(model, ModelSpec):
        return model
    models = load_models()
    if model not in models:
        raise UserError(f"unknown model {model!r} (allowed: {', '.join(MODEL_IDS)})")
    return models[model]


def get_gpu(gpu: str | GpuSpec) -> GpuSpec:
    """The catalog GPU ``gpu`` (a spec passes through); UserError for unknown ids."""
    if isinstance(gpu, GpuSpec):
        return gpu
    gpus = load_gpus()
    if gpu not in gpus:
        raise UserError(f"unknown GPU {gpu!r} (allowed: {', '.join(GPU_IDS)})")
    return gpus[gpu]
