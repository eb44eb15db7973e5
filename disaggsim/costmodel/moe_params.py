"""Fitted parameters of the MoE, MLA and expert-parallel all-to-all operators.

They live in their own file per GPU, ``disaggsim/hardware/moe/<gpu_id with - as _>.json``,
written by ``python -m calibration.fit_moe`` (schema below) and read here; the dense
operators' parameters stay in the hardware profile. Only ``h100_sxm.json`` is fitted
(the public MoE/MLA/DeepEP tables are H100 ones): every other GPU — and the H800, the
same chip — uses those efficiencies against its own peaks (FLOP/s, HBM, NVLink, NIC),
and :attr:`MoeParams.transferred_from` says so. Schema (version 1)::

    {
      "schema_version": 1,
      "gpu": "h100-sxm",
      "grouped_gemm": {"bf16" | "fp8" | "fp8-block" | "mxfp4": {"launch_s", "max_eff",
                       "half_sat", "mem_eff", ["width_half_sat", "token_eff", "expert_s"]}},
      ["grouped_gemm_frameworks": {"vllm" | "sglang": {<dtype>: {... as grouped_gemm}}},]
      ["grouped_gemm_tuned": {"sglang": {<dtype>: {... as grouped_gemm}}},]
      "mla_decode": {"bf16" | "fp8": {"floor_s", "per_seq_s", "bw_eff", "compute_eff"}},
      "mla_prefill": {"absorbed" | "naive": {"floor_s", "max_eff", "half_sat"}},
      "all_to_all": {"normal" | "low_latency": {"dispatch" | "combine":
                     {"latency_s", "rdma_latency_s", "nvlink_eff", "rdma_eff"}}},
      "fit_error": {...}, "provenance": {"kind": ..., "source": ..., ...}
    }

``grouped_gemm`` is TensorRT-LLM's CUTLASS MoE (the reference, taken by every engine not
named in ``grouped_gemm_frameworks``); the optional ``grouped_gemm_frameworks`` holds the
other frameworks' own kernels (vLLM's and SGLang's Triton fused_moe and the rest), fitted
to their own tables, which an engine takes by :data:`ENGINE_EXPERT_KERNELS`. SGLang's
Triton fused_moe runs one of two tile configurations: a tuned one where SGLang ships a
config file for the worker's (local experts, expert shard width, GPU, dtype) — listed with
provenance in ``hardware/moe/sglang_triton_configs.csv`` (:func:`has_tuned_config`) — else
its default tiles. ``grouped_gemm_frameworks.sglang`` holds the default-tile set and the
optional ``grouped_gemm_tuned.sglang`` the tuned one; a worker's set is chosen once, when
its cost model is built.

Formulas that consume them: :mod:`disaggsim.costmodel.moe` (grouped GEMM, all-to-all)
and :mod:`disaggsim.costmodel.mla`.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from disaggsim.hardware.engines import ENGINE_FRAMEWORKS
from disaggsim.hardware.profile import ProfileError
from disaggsim.inputs import read_json

__all__ = [
    "A2A_MODES",
    "ENGINE_EXPERT_KERNELS",
    "GEMM_FRAMEWORKS",
    "REFERENCE_FRAMEWORK",
    "EXPERT_DTYPES",
    "SGLANG_DEVICE_NAMES",
    "TUNED_TILE_FRAMEWORKS",
    "AllToAllParams",
    "GroupedGemmParams",
    "MlaDecodeParams",
    "MlaPrefillParams",
    "MoeParams",
    "has_tuned_config",
    "load_moe_params",
    "moe_params_from_dict",
    "moe_params_path",
    "sglang_tuned_configs",
]

SCHEMA_VERSION = 1
# the framework whose MoE kernel each shipped engine profile runs (the grouped-GEMM
# parameter set it takes): the engine's framework (engines.ENGINE_FRAMEWORKS); an engine not
# named there takes the reference (TensorRT-LLM)
REFERENCE_FRAMEWORK = "trtllm"
GEMM_FRAMEWORKS = ("vllm", "sglang")
ENGINE_EXPERT_KERNELS = dict(ENGINE_FRAMEWORKS)
FITTED_GPU = "h100-sxm"
EXPERT_DTYPES = ("bf16", "fp8", "fp8-block", "mxfp4")
A2A_MODES = ("normal", "low_latency")
# frameworks whose MoE kernel picks its tiles from shipped per-shape config files
TUNED_TILE_FRAMEWORKS = ("sglang",)
# the device name SGLang keys its config files by (torch.cuda.get_device_name with spaces
# as underscores), per catalog GPU
SGLANG_DEVICE_NAMES = {
    "a100-80gb": "NVIDIA_A100-SXM4-80GB",
    "h100-sxm": "NVIDIA_H100_80GB_HBM3",
    "h100-pcie": "NVIDIA_H100_PCIe",
    "h200-sxm": "NVIDIA_H200",
    "h800-sxm": "NVIDIA_H800",
    "b200": "NVIDIA_B200",
    "l40s": "NVIDIA_L40S",
}
SGLANG_CONFIGS_FILE = "sglang_triton_configs.csv"


@dataclass(frozen=True, slots=True)
class GroupedGemmParams:
    """One MoE layer's routed experts on one GPU (permute, grouped gate/up, activation,
    down, finalize): ``launch_s + max(FLOP / (peak × max_eff × sat), bytes / (hbm ×
    mem_eff)) + layer_tokens × hidden × 4 / (hbm × token_eff) + touched × expert_s``,
    ``sat = min(t / (t + half_sat), width / (width + width_half_sat))`` with ``t`` the
    tokens per touched expert and ``width`` the expert's shard
    (``moe.grouped_gemm_time_s``). ``width_half_sat``, ``token_eff`` and ``expert_s`` are
    optional in the file (0: the term is left out, the form before 2026-12-03).

    A set with ``tile_m_tokens`` > 0 (a kernel whose tiles are known: SGLang's shipped
    tuned Triton configs) times its compute by tiles instead of ``sat``: each touched
    expert's tokens padded to ``tile_m_tokens`` rows, each GEMM's N to ``tile_n`` columns,
    every tile costing its K plus ``tile_overhead_k`` (its fill and epilogue, in K
    steps) at ``peak × max_eff`` (``moe.grouped_gemm_time_s``); ``half_sat`` and
    ``width_half_sat`` are then 0."""

    launch_s: float
    max_eff: float
    half_sat: float
    mem_eff: float
    width_half_sat: float = 0.0
    token_eff: float = 0.0
    expert_s: float = 0.0
    tile_m_tokens: float = 0.0
    tile_n: float = 0.0
    tile_overhead_k: float = 0.0


@dataclass(frozen=True, slots=True)
class MlaDecodeParams:
    """Absorbed MLA decode attention: ``floor_s + per_seq_s × B + C × max(576 × elem /
    (hbm × bw_eff), 2 × heads × 1088 / (peak × compute_eff))``."""

    floor_s: float
    per_seq_s: float
    bw_eff: float
    compute_eff: float


@dataclass(frozen=True, slots=True)
class MlaPrefillParams:
    """MLA prefill attention, one form (absorbed: q·k over 576, v 512; naive: the MHA
    form after up-projection, q/k 192, v 128): ``floor_s + FLOP / (peak × max_eff × L /
    (L + half_sat))``, L the mean new tokens per sequence."""

    floor_s: float
    max_eff: float
    half_sat: float


@dataclass(frozen=True, slots=True)
class AllToAllParams:
    """One DeepEP phase (dispatch or combine) in one mode: ``latency_s + rdma_latency_s
    × [nodes > 1] + max(nvlink_bytes / (nvlink × nvlink_eff), rdma_bytes / (nic ×
    rdma_eff))`` per GPU."""

    latency_s: float
    rdma_latency_s: float
    nvlink_eff: float
    rdma_eff: float


@dataclass(frozen=True, slots=True)
class MoeParams:
    gpu: str
    grouped_gemm: dict[str, GroupedGemmParams]
    mla_decode: dict[str, MlaDecodeParams]
    mla_prefill: dict[str, MlaPrefillParams]
    all_to_all: dict[str, dict[str, AllToAllParams]]  # mode -> phase -> params
    fit_error: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    transferred_from: str = ""  # the GPU these were fitted on, when not this one
    path: str = ""
    # framework -> dtype -> params: other frameworks' own MoE kernels (optional)
    grouped_gemm_frameworks: dict[str, dict[str, GroupedGemmParams]] = field(default_factory=dict)
    # framework -> dtype -> params: the kernel with a shipped tuned tile config (optional)
    grouped_gemm_tuned: dict[str, dict[str, GroupedGemmParams]] = field(default_factory=dict)

    def gemm(
        self, dtype: str, framework: str = REFERENCE_FRAMEWORK, tuned: bool = False
    ) -> GroupedGemmParams:
        """The grouped-GEMM parameters of ``framework``'s kernel for ``dtype`` weights:
        with ``tuned`` (the shape has a shipped tile config, :func:`has_tuned_config`) its
        tuned set for exactly that dtype where the file fits one; else its own set where
        the file fits one (fp8-block falling back on fp8, any format on bf16), else the
        reference (TensorRT-LLM) set by the same rule."""
        if tuned:
            got = self.grouped_gemm_tuned.get(framework, {}).get(dtype)
            if got is not None:
                return got
        own = self.grouped_gemm_frameworks.get(framework)
        if own:
            got = _pick(own, dtype)
            if got is not None:
                return got
        got = _pick(self.grouped_gemm, dtype)
        if got is None:
            raise ProfileError(f"{self.path}: grouped_gemm: no parameters for {dtype!r}")
        return got

    def decode(self, kv_dtype: str) -> MlaDecodeParams:
        key = "fp8" if kv_dtype == "fp8" else "bf16"
        return self.mla_decode.get(key) or self.mla_decode["bf16"]


def _pick(sets: dict[str, GroupedGemmParams], dtype: str) -> GroupedGemmParams | None:
    if dtype in sets:
        return sets[dtype]
    if dtype == "fp8-block" and "fp8" in sets:
        return sets["fp8"]
    if dtype in ("fp8", "fp8-block", "mxfp4") and "bf16" in sets:
        return sets["bf16"]
    return None


def moe_params_path(gpu_id: str) -> Path:
    return Path(
        str(resources.files("disaggsim.hardware") / "moe" / (gpu_id.replace("-", "_") + ".json"))
    )


def _num(d: Any, key: str, where: str, path: str, positive: bool = True) -> float:
    if not isinstance(d, dict) or key not in d:
        raise ProfileError(f"{path}: {where}.{key}: missing")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        raise ProfileError(
            f"{path}: {where}.{key}: expected a {'positive' if positive else 'non-negative'} number, got {v!r}"
        )
    return float(v)


def _opt(d: dict, key: str, where: str, path: str) -> float:
    """An optional non-negative field (0 when absent: its term is left out)."""
    return _num(d, key, where, path, False) if key in d else 0.0


def _gemm_sets(sec: dict, where: str, path: str) -> dict[str, GroupedGemmParams]:
    gg = {}
    for dt, p in sec.items():
        if dt not in EXPERT_DTYPES:
            raise ProfileError(
                f"{path}: {where}.{dt}: unknown (allowed: {', '.join(EXPERT_DTYPES)})"
            )
        w = f"{where}.{dt}"
        gg[dt] = GroupedGemmParams(
            _num(p, "launch_s", w, path, False),
            _num(p, "max_eff", w, path),
            _num(p, "half_sat", w, path, False),
            _num(p, "mem_eff", w, path),
            _opt(p, "width_half_sat", w, path),
            _opt(p, "token_eff", w, path),
            _opt(p, "expert_s", w, path),
            _opt(p, "tile_m_tokens", w, path),
            _opt(p, "tile_n", w, path),
            _opt(p, "tile_overhead_k", w, path),
        )
        if (gg[dt].tile_m_tokens > 0) != (gg[dt].tile_n > 0):
            raise ProfileError(
                f"{path}: {w}: tile_m_tokens and tile_n: expected both positive (the tile "
                f"form) or both absent, got {gg[dt].tile_m_tokens!r} and {gg[dt].tile_n!r}"
            )
        for key in ("max_eff", "mem_eff", "token_eff"):  # shares of a peak
            if getattr(gg[dt], key) > 1.0:
                raise ProfileError(
                    f"{path}: {w}.{key}: expected at most 1 (a share of the peak), "
                    f"got {getattr(gg[dt], key)!r}"
                )
    return gg


def _sec(d: Any, key: str, path: str) -> dict:
    if not isinstance(d, dict) or not isinstance(d.get(key), dict) or not d[key]:
        raise ProfileError(f"{path}: {key}: missing or empty")
    return d[key]


def _framework_sets(
    raw: dict, key: str, allowed: Sequence[str], path: str
) -> dict[str, dict[str, GroupedGemmParams]]:
    """The optional per-framework grouped-GEMM sets under ``key`` (``{framework: {dtype:
    ...}}``); a framework outside ``allowed`` is an error naming the file and the field."""
    out: dict[str, dict[str, GroupedGemmParams]] = {}
    if key not in raw:
        return out
    fws = _sec(raw, key, path)
    for fw in fws:
        if fw not in allowed:
            raise ProfileError(f"{path}: {key}.{fw}: unknown (allowed: {', '.join(allowed)})")
        out[fw] = _gemm_sets(_sec(fws, fw, path), f"{key}.{fw}", path)
    return out


def moe_params_from_dict(raw: Any, path: str = "<moe params>") -> MoeParams:
    """Validate a parsed MoE parameter file; every error names the file and the field."""
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"{path}: schema_version: expected {SCHEMA_VERSION}")
    gg = _gemm_sets(_sec(raw, "grouped_gemm", path), "grouped_gemm", path)
    gg_fw = _framework_sets(raw, "grouped_gemm_frameworks", GEMM_FRAMEWORKS, path)
    gg_tuned = _framework_sets(raw, "grouped_gemm_tuned", TUNED_TILE_FRAMEWORKS, path)
    dec = {}
    for dt, p in _sec(raw, "mla_decode", path).items():
        w = f"mla_decode.{dt}"
        dec[dt] = MlaDecodeParams(
            _num(p, "floor_s", w, path, False),
            _num(p, "per_seq_s", w, path, False),
            _num(p, "bw_eff", w, path),
            _num(p, "compute_eff", w, path),
        )
    if "bf16" not in dec:
        raise ProfileError(f"{path}: mla_decode.bf16: missing")
    pre = {}
    for form, p in _sec(raw, "mla_prefill", path).items():
        w = f"mla_prefill.{form}"
        pre[form] = MlaPrefillParams(
            _num(p, "floor_s", w, path, False),
            _num(p, "max_eff", w, path),
            _num(p, "half_sat", w, path, False),
        )
    for form in ("absorbed", "naive"):
        if form not in pre:
            raise ProfileError(f"{path}: mla_prefill.{form}: missing")
    a2a: dict[str, dict[str, AllToAllParams]] = {}
    sec = _sec(raw, "all_to_all", path)
    for mode in A2A_MODES:
        phases = _sec(sec, mode, path)
        a2a[mode] = {}
        for phase in ("dispatch", "combine"):
            w = f"all_to_all.{mode}.{phase}"
            p = phases.get(phase)
            a2a[mode][phase] = AllToAllParams(
                _num(p, "latency_s", w, path, False),
                _num(p, "rdma_latency_s", w, path, False),
                _num(p, "nvlink_eff", w, path),
                _num(p, "rdma_eff", w, path),
            )
    prov = raw.get("provenance")
    if not isinstance(prov, dict) or "kind" not in prov:
        raise ProfileError(f"{path}: provenance.kind: missing")
    return MoeParams(
        gpu=str(raw.get("gpu", "")),
        grouped_gemm=gg,
        mla_decode=dec,
        mla_prefill=pre,
        all_to_all=a2a,
        fit_error=raw.get("fit_error") or {},
        provenance=prov,
        path=path,
        grouped_gemm_frameworks=gg_fw,
        grouped_gemm_tuned=gg_tuned,
    )


@cache
def _load_file(path: str) -> MoeParams:
    if not Path(path).exists():
        raise ProfileError(f"{path}: MoE parameter file not found")
    return moe_params_from_dict(read_json(path, ProfileError), path)


def load_moe_params(gpu_id: str, path: str | Path | None = None) -> MoeParams:
    """The MoE/MLA/all-to-all parameters for ``gpu_id``: its own file when one ships,
    else the fitted H100 file (efficiencies carried to this GPU's peaks)."""
    if path is not None:
        return _load_file(str(path))
    own = moe_params_path(gpu_id)
    if own.is_file():
        return _load_file(str(own))
    fitted = _load_file(str(moe_params_path(FITTED_GPU)))
    return MoeParams(
        gpu=gpu_id,
        grouped_gemm=fitted.grouped_gemm,
        mla_decode=fitted.mla_decode,
        mla_prefill=fitted.mla_prefill,
        all_to_all=fitted.all_to_all,
        fit_error=fitted.fit_error,
        provenance=fitted.provenance,
        transferred_from=FITTED_GPU,
        path=fitted.path,
        grouped_gemm_frameworks=fitted.grouped_gemm_frameworks,
        grouped_gemm_tuned=fitted.grouped_gemm_tuned,
    )


@cache
def sglang_tuned_configs() -> frozenset[tuple[int, int, str, str]]:
    """(local experts E, expert shard width N, SGLang device name, dtype) of every tuned
    Triton fused_moe config file ``hardware/moe/sglang_triton_configs.csv`` lists."""
    path = Path(str(resources.files("disaggsim.hardware") / "moe" / SGLANG_CONFIGS_FILE))
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    out = set()
    for i, row in enumerate(csv.DictReader(lines), start=2):
        try:
            out.add((int(row["num_experts"]), int(row["n"]), row["device_name"], row["dtype"]))
        except (KeyError, TypeError, ValueError):
            raise ProfileError(f"{path}: data row {i - 1}: expected num_experts, n, "
                               "device_name, dtype") from None  # fmt: skip
    return frozenset(out)


def has_tuned_config(
    framework: str, num_experts: float, width: float, gpu_id: str, dtype: str
) -> bool:
    """Whether ``framework``'s MoE kernel runs a shipped tuned tile config for a GPU
    ``gpu_id`` holding ``num_experts`` experts (redundant copies included) each ``width``
    wide (its shard) in weight format ``dtype`` (bf16, fp8, fp8-block): SGLang's Triton
    fused_moe looks its config file up by exactly that key (``get_moe_configs``)."""
    if framework not in TUNED_TILE_FRAMEWORKS or dtype not in ("bf16", "fp8", "fp8-block"):
        return False
    dev = SGLANG_DEVICE_NAMES.get(gpu_id)
    if dev is None or num_experts != int(num_experts) or width != int(width):
        return False
    return (int(num_experts), int(width), dev, dtype) in sglang_tuned_configs()
