"""Hardware profiles: per-GPU fitted efficiency parameters, loaded from JSON.

A profile is the only place the cost model gets efficiencies from. Profiles ship inside
the package (``disaggsim/hardware/profiles/<gpu_id with - as _>.json``) and are written
by the calibration fitter. Schema (version 1)::

    {
      "schema_version": 1,
      "gpu": "h100-sxm",
      "peaks": {"bf16_flop_per_s": ..., "fp8_flop_per_s": ..., "hbm_bytes_per_s": ...,
                "hbm_bytes": ...},
      "ops": {
        "gemm": {"bf16": {"launch_s", "max_eff", "half_sat", "mem_eff"},
                 "fp8": {..., ["dynamic_scale_s", "dynamic_scale_bw_eff"]}},
        "decode_attention": {"bf16": {"floor_s", "per_seq_s", "bw_eff",
                             ["per_seq_kv_elem_s", "par_half_sat"]}, "fp8": {...}},
        "prefill_attention": {"bf16": {"floor_s", "max_eff", "half_sat"}},
        "elementwise": {"launch_s", "bw_eff"},
        "allreduce": {"2": {"latency_s", "bus_bw_bytes_per_s",
                            ["ll_latency_s", "ll_bus_bw_bytes_per_s"]}, "4": {...}, ...},
        "copy": {"d2d" | "h2d_pinned" | "d2h_pinned" | "p2p" | "gather":
                 {"latency_s", "bw_bytes_per_s", "per_block_s"}}
      },
      "attention_backends": {                                   (optional)
        "<backend>": {"decode_attention": {"bf16": {...}, "fp8": {...}},
                      "prefill_attention": {"bf16": {...}}}, ...},
      "attention_auto": {"decode": [...], "prefill": [...]},   (optional: auto's candidates)
      "gemm_kernels": {                                         (optional)
        "<kernel>": {"dtype": "fp8", "num_sms", "launch_s", "mem_eff",
                     "epilogue_s_per_elem", "source", "l2_bytes_per_s" (optional),
                     "branches": [{"max_m" (null: no limit), "tile_m", "tile_n",
                                   "cluster_m", "cluster_n", "max_eff",
                                   "max_n", "min_m", "min_k", "swap_ab" (optional)},
                                  ...]}},
      "graph_replay": {"per_layer_s": ...},                     (optional, default 0)
      "fit_error": {"<op>": {"median_ape": ..., "mean_ape": ..., "n": ..., ...}},
      "provenance": {"kind": "measured" | "fitted-public" | "prior" | "provisional",
                     "source": "...", "date": "...", ...}
    }

``ops.decode_attention`` / ``ops.prefill_attention`` are the generic attention kernel;
``attention_backends`` holds one fitted set per named kernel (:data:`ATTENTION_BACKENDS`),
among which the step model picks the fastest per shape family unless a scenario names one
(``attention_backend``). ``gemm_kernels`` holds named GEMM kernels fitted by a tile form
(:data:`GEMM_KERNELS`, :class:`TiledGemmParams`): a serving engine whose profile names one
(``fp8_gemm_kernel``) runs its FP8 GEMMs on it where the hardware profile fits it; a
profile without the section (or without that kernel) gives every engine ``ops.gemm.fp8``. ``graph_replay.per_layer_s`` is what a replayed CUDA graph costs
per layer beyond its kernels. Serving-engine overheads (CPU time) are not a GPU property:
they live in :mod:`disaggsim.hardware.engines`.

Formulas that consume these parameters are in :mod:`disaggsim.costmodel.ops`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from disaggsim.inputs import read_json

SCHEMA_VERSION = 1
PROVENANCE_KINDS = ("measured", "fitted-public", "prior", "provisional")
# Attention kernels a profile may hold fitted parameters for: the FlashAttention builds of
# vLLM and SGLang, TensorRT-LLM's attention op (public kernel tables), and the kernels the
# calibration harness times itself (torch SDPA's backends, FlexAttention).
ATTENTION_BACKENDS = (
    "vllm-flash",
    "sglang-flash",
    "trtllm",
    "sdpa-flash",
    "sdpa-cudnn",
    "sdpa-efficient",
    "flex",
    "trtllm-mmha",
)
# The framework that ships each attention kernel: a serving engine's ``auto`` runs only its
# own framework's kernels (engines.ENGINE_FRAMEWORKS), never another's because it is faster.
# The harness-timed PyTorch kernels (SDPA's backends, FlexAttention) belong to no serving
# engine: only a scenario naming one, or the kernel-only engine profile, runs them.
ATTENTION_BACKEND_FRAMEWORKS = {
    "vllm-flash": "vllm",
    "sglang-flash": "sglang",
    "trtllm": "trtllm",
    "sdpa-flash": "pytorch",
    "sdpa-cudnn": "pytorch",
    "sdpa-efficient": "pytorch",
    "flex": "pytorch",
    "trtllm-mmha": "trtllm",
}
# Decode-only kernels: an engine runs them for the decode layouts its main kernel does not
# take (TensorRT-LLM's masked multi-head attention beside its XQA: engine profile
# ``per_query_head_decode_backend``); a scenario cannot name them, having no prefill.
DECODE_ONLY_BACKENDS = ("trtllm-mmha",)
ATTENTION_CHOICES = ("auto", *(b for b in ATTENTION_BACKENDS if b not in DECODE_ONLY_BACKENDS))
# GEMM kernels a profile may hold a tile-form fit for (``gemm_kernels``), and the weight
# dtype each runs: SGLang's FP8 GEMM on Hopper (sgl-kernel ``fp8_scaled_mm``, CUTLASS with a
# CTA-tile dispatch table by m) and vLLM's (``cutlass_scaled_mm``, CUTLASS with a dispatch
# table by m, n and k that swaps the operands for m <= 64)
GEMM_KERNELS = {"sglang-fp8": "fp8", "vllm-fp8": "fp8"}


class ProfileError(ValueError):
    """A profile file is missing or malformed; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class GpuPeaks:
    bf16_flop_per_s: float
    fp8_flop_per_s: float
    hbm_bytes_per_s: float
    hbm_bytes: float

    def flop_per_s(self, dtype: str) -> float:
        if dtype == "fp8":
            if self.fp8_flop_per_s <= 0:
                raise ValueError("this GPU has no FP8 tensor cores")
            return self.fp8_flop_per_s
        return self.bf16_flop_per_s


@dataclass(frozen=True, slots=True)
class GemmParams:
    """A GEMM kernel's smooth-form parameters (``ops.gemm_time_s``). ``dynamic_scale_s`` and
    ``dynamic_scale_bw_eff`` (FP8 only, optional, 0: not fitted) cost the per-tensor scale a
    dynamically quantised FP8 GEMM computes before quantising its activations (a memset and
    an amax kernel reading the bf16 activations: ``ops.fp8_dynamic_scale_time_s``); the
    step model does not charge it (engines load static activation scales), the kernel
    tables whose rows hold it do."""

    launch_s: float
    max_eff: float
    half_sat: float
    mem_eff: float
    dynamic_scale_s: float = 0.0
    dynamic_scale_bw_eff: float = 0.0


@dataclass(frozen=True, slots=True)
class GemmTileBranch:
    """One entry of a GEMM kernel's dispatch table: GEMMs with ``m <= max_m`` tokens (the
    last entry: ``inf``), and where given ``n <= max_n``, ``m >= min_m`` and ``k >= min_k``,
    run CTA tiles of ``tile_m × tile_n`` outputs in clusters of ``cluster_m × cluster_n``
    tiles at ``max_eff`` of the SM's share of the peak. With ``swap_ab`` the kernel computes
    the transposed product (the weights as its first operand: vLLM's small-m configs), so
    its tile and cluster m run along the GEMM's n and their n along its m."""

    max_m: float
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    max_eff: float
    max_n: float = float("inf")
    min_m: float = 0.0
    min_k: float = 0.0
    swap_ab: bool = False

    def takes(self, m: float, n: float, k: float) -> bool:
        """Whether a GEMM of ``m`` tokens, ``n`` outputs and ``k`` inputs meets every
        condition of this entry."""
        return m <= self.max_m and n <= self.max_n and m >= self.min_m and k >= self.min_k


@dataclass(frozen=True, slots=True)
class TiledGemmParams:
    """A GEMM kernel fitted by its dispatch table (``ops.tiled_gemm_time_s``): the branch
    for ``m`` gives the tiles; the output grid, rounded up to whole clusters, runs in whole
    waves over ``num_sms`` SMs, each tile ``k`` deep at ``max_eff`` of ``peak / num_sms``
    plus ``epilogue_s_per_elem`` per output element (scaling and the store); the kernel
    takes the longer of that, the memory bound and, where ``l2_bytes_per_s`` > 0, the L2
    bound (every CTA tile loads its two operand tiles, ``(tile_m / cluster_n + tile_n /
    cluster_m) × k`` elements, from L2, TMA multicast sharing each over its cluster, at
    ``l2_bytes_per_s``), plus ``launch_s``. The first branch whose conditions hold
    (:meth:`GemmTileBranch.takes`) is the one taken, the last one otherwise.
    ``l2_bytes_per_s`` is optional in the JSON (0: no L2 bound), so older profiles load."""

    dtype: str
    num_sms: int
    launch_s: float
    mem_eff: float
    epilogue_s_per_elem: float
    branches: tuple[GemmTileBranch, ...]
    source: str = ""
    l2_bytes_per_s: float = 0.0

    def branch(self, m: float, n: float, k: float) -> GemmTileBranch:
        for b in self.branches:
            if b.takes(m, n, k):
                return b
        return self.branches[-1]


@dataclass(frozen=True, slots=True)
class DecodeAttentionParams:
    """``per_seq_kv_elem_s``: seconds per (sequence × KV head × head-dim element);
    ``par_half_sat``: (sequence, KV head) work items at which the kernel reaches half its
    bandwidth; ``multi_floor_s``: extra fixed time of the kernel's multi-sequence GQA launch
    path, taken when ``batch > 1`` and ``kv_heads > 1`` (one sequence or one KV head per
    shard runs the single-pass path at ``floor_s``); ``overlap`` in [0, 1]: the share of the
    smaller of the per-item work and the KV stream that runs under the larger (1: the
    kernel takes the longer of the two, 0: their sum); ``reread_bytes_per_s`` > 0 marks a
    per-query-head kernel (TensorRT-LLM's masked MHA: one work item per (sequence, query
    head), each reading its KV head, so a KV head shared by ``g`` query heads is read ``g``
    times, the re-reads from L2 at this rate: ``ops.decode_stream_seconds_per_byte``);
    ``split_fill_s`` > 0 marks a split-KV kernel (FlashAttention's and FlashInfer's split-KV,
    TensorRT-LLM's multi-block mode: a long sequence's KV is split over several thread
    blocks, so few work items still stream at full bandwidth): its KV stream runs at ``hbm ×
    bw_eff`` whatever the number of items, and few items add the lesser of the bandwidth
    share's loss and ``split_fill_s × par_half_sat / (P + par_half_sat)`` to the stream
    (``ops.decode_split_shortfall_s``);
    ``group_bytes_per_s`` > 0: a grouped kernel's work per query head of the group (the
    tensor-core products and softmax of each query head against every KV byte: TensorRT-LLM's
    XQA), so a KV byte costs ``q_per_kv / group_bytes_per_s`` of it and the stream runs at the
    longer of that and the HBM time (``ops.decode_stream_seconds_per_byte``);
    ``per_item_s``: fixed seconds per work item whatever its head size (a thread block's
    set-up, its softmax state and the write of its partial result), and ``per_q_elem_s``:
    seconds per query-head element (``batch × query heads × head_dim``: each query head's
    vector loaded and its output written; a grouped kernel's work item carries every query
    head of its group), both in the per-item work with ``per_seq_kv_elem_s``
    (``ops.decode_item_seconds``).
    ``wave_sms`` > 0 marks a multi-block wave kernel (TensorRT-LLM's XQA,
    ``ops.decode_wave_lines``): each work item's KV is split over ``m`` thread blocks by
    the kernel's own rule, the ``batch × kv_heads × m`` blocks run in waves over
    ``wave_sms`` SMs, each block paying ``cta_s + cta_q_elem_s × q_per_kv × head_dim``
    and streaming its share of the KV at ``hbm × bw_eff / wave_sms`` in a full wave, at
    ``min(cta_bytes_per_s, hbm × bw_eff / n)`` with ``n`` blocks in a partial one (and
    the group rate as above); a split (``m`` > 1) adds ``split_s + split_elem_s × m ×
    q_per_kv × head_dim`` (the reduction of the partial results). The kernel's time is the
    smallest of these lines over the split counts its rule takes (the other fields but
    ``floor_s``, ``bw_eff`` and ``group_bytes_per_s`` are unused). With
    ``reread_bytes_per_s`` > 0 too it is a per-query-head wave kernel (TensorRT-LLM's
    masked MHA and its multi-block rule): one work item per (sequence, query head), each
    block's query head and reduction carrying one query head, the ``q_per_kv`` query heads
    of a KV head reading it once from HBM and ``q_per_kv`` times from L2 at that rate.
    ``block_bytes_per_s`` > 0 (with ``occupancy_sms`` and ``smem_per_sm_kib``, a
    per-query-head line-form kernel only: TensorRT-LLM's masked MHA) is the KV stream rate of
    one resident 256-thread block: over ``4 × occupancy_sms`` or more work items the kernel
    runs 256-thread blocks, as many resident per SM as its shared memory allows (about 6
    bytes a cached token, ``ops.mmha_resident_blocks``), and its stream runs at no more than
    ``resident × occupancy_sms × block_bytes_per_s`` (``ops.mmha_occupancy_seconds_per_byte``).
    All optional in the JSON (0: term off), so older profiles still load."""

    floor_s: float
    per_seq_s: float
    bw_eff: float
    per_seq_kv_elem_s: float = 0.0
    par_half_sat: float = 0.0
    multi_floor_s: float = 0.0
    overlap: float = 0.0
    reread_bytes_per_s: float = 0.0
    split_fill_s: float = 0.0
    group_bytes_per_s: float = 0.0
    per_item_s: float = 0.0
    per_q_elem_s: float = 0.0
    wave_sms: float = 0.0
    cta_s: float = 0.0
    cta_q_elem_s: float = 0.0
    cta_bytes_per_s: float = 0.0
    split_s: float = 0.0
    split_elem_s: float = 0.0
    block_bytes_per_s: float = 0.0
    occupancy_sms: float = 0.0
    smem_per_sm_kib: float = 0.0

    @property
    def per_query_head(self) -> bool:
        """A per-query-head kernel (``reread_bytes_per_s`` > 0): one work item per
        (sequence, query head), a KV head read once per query head of its group."""
        return self.reread_bytes_per_s > 0.0


@dataclass(frozen=True, slots=True)
class PrefillAttentionParams:
    floor_s: float
    max_eff: float
    half_sat: float


@dataclass(frozen=True, slots=True)
class ElementwiseParams:
    launch_s: float
    bw_eff: float


@dataclass(frozen=True, slots=True)
class AllReduceParams:
    """Per GPU count: the Simple protocol's latency and bus bandwidth and, optionally, the
    low-latency (LL) protocol's; NCCL runs the faster of the two for each size. Counts not
    measured use the nearest."""

    # (num_gpus, latency_s, bus_bw_bytes_per_s[, ll_latency_s, ll_bus_bw_bytes_per_s])
    by_gpus: tuple[tuple[float, ...], ...]

    def _row(self, num_gpus: int) -> tuple[float, ...]:
        return min(self.by_gpus, key=lambda row: (abs(row[0] - num_gpus), row[0]))

    def for_gpus(self, num_gpus: int) -> tuple[float, float]:
        """Simple-protocol ``(latency_s, bus_bw_bytes_per_s)``."""
        best = self._row(num_gpus)
        return best[1], best[2]

    def protocols_for_gpus(self, num_gpus: int) -> tuple[tuple[float, float], ...]:
        """``(latency_s, bus_bw_bytes_per_s)`` of every protocol fitted for ``num_gpus``."""
        best = self._row(num_gpus)
        out = [(best[1], best[2])]
        if len(best) >= 5 and best[4] > 0:
            out.append((best[3], best[4]))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class CopyParams:
    latency_s: float
    bw_bytes_per_s: float
    per_block_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AttentionBackendParams:
    """One attention kernel's fitted parameters, per dtype (decode: KV dtype)."""

    decode: dict[str, DecodeAttentionParams]
    prefill: dict[str, PrefillAttentionParams]


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    gpu: str
    peaks: GpuPeaks
    gemm: dict[str, GemmParams]
    decode_attention: dict[str, DecodeAttentionParams]
    prefill_attention: dict[str, PrefillAttentionParams]
    elementwise: ElementwiseParams
    allreduce: AllReduceParams
    copy: dict[str, CopyParams]
    attention_backends: dict[str, AttentionBackendParams] = field(default_factory=dict)
    # backends ``auto`` chooses among, per phase ("decode", "prefill"); all when absent
    attention_auto: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # named GEMM kernels (tile-form fits) an engine profile may name; none when absent
    gemm_kernels: dict[str, TiledGemmParams] = field(default_factory=dict)
    graph_layer_s: float = 0.0
    fit_error: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    path: str = ""

    def gemm_params(self, dtype: str) -> GemmParams:
        return _pick(self.gemm, dtype, "gemm", self.path)

    def decode_attention_params(self, kv_dtype: str) -> DecodeAttentionParams:
        return _pick(self.decode_attention, kv_dtype, "decode_attention", self.path)

    def prefill_attention_params(self, dtype: str) -> PrefillAttentionParams:
        return _pick(self.prefill_attention, dtype, "prefill_attention", self.path)

    def gemm_kernel(self, name: str | None, dtype: str) -> TiledGemmParams | None:
        """The tile-form fit of GEMM kernel ``name`` for ``dtype`` GEMMs, or None when no
        kernel is named, the kernel runs another dtype or this profile does not fit it
        (the caller then uses :meth:`gemm_params`: what every profile without
        ``gemm_kernels`` gives)."""
        if name is None or GEMM_KERNELS.get(name) != dtype:
            return None
        return self.gemm_kernels.get(name)

    def backend(self, name: str) -> AttentionBackendParams:
        """The fitted parameters of attention backend ``name``."""
        if name not in self.attention_backends:
            have = ", ".join(sorted(self.attention_backends)) or "none"
            raise ProfileError(
                f"{self.path}: attention_backends: no backend {name!r} for {self.gpu} "
                f"(fitted here: {have})"
            )
        return self.attention_backends[name]

    def decode_attention_for(self, backend: str, kv_dtype: str) -> DecodeAttentionParams:
        """Decode-attention parameters of ``backend`` (``generic``: ``ops.decode_attention``)."""
        if backend == "generic":
            return self.decode_attention_params(kv_dtype)
        return _pick(self.backend(backend).decode, kv_dtype, f"{backend}.decode", self.path)

    def prefill_attention_for(self, backend: str, dtype: str = "bf16") -> PrefillAttentionParams:
        """Prefill-attention parameters of ``backend`` (``generic``: ``ops.prefill_attention``)."""
        if backend == "generic":
            return self.prefill_attention_params(dtype)
        return _pick(self.backend(backend).prefill, dtype, f"{backend}.prefill", self.path)


def _pick(table: dict, dtype: str, op: str, path: str):
    if dtype in table:
        return table[dtype]
    if dtype in ("fp16", "bf16") and "bf16" in table:
        return table["bf16"]
    if dtype == "fp8" and "bf16" in table:
        return table["bf16"]  # an FP8 kernel is no slower than the BF16 one it replaces
    raise ProfileError(
        f"{path}: ops.{op}: no parameters for dtype {dtype!r} (have: {sorted(table)})"
    )


def profile_filename(gpu_id: str) -> str:
    return gpu_id.replace("-", "_") + ".json"


def shipped_profile_path(gpu_id: str) -> Path:
    return Path(str(resources.files("disaggsim.hardware") / "profiles" / profile_filename(gpu_id)))


def shipped_gpu_ids() -> list[str]:
    """GPU ids with a profile shipped in the package (``profile_filename`` inverted)."""
    folder = Path(str(resources.files("disaggsim.hardware") / "profiles"))
    return sorted(p.stem.replace("_", "-") for p in folder.glob("*.json"))


def load_profile(gpu_id: str | None = None, path: str | Path | None = None) -> HardwareProfile:
    """Load the shipped profile for ``gpu_id``, or the profile file at ``path``."""
    shipped = path is None
    if path is None:
        if gpu_id is None:
            raise ValueError("load_profile needs gpu_id or path")
        path = shipped_profile_path(gpu_id)
    path = Path(path)
    if not path.exists() and not path.is_symlink():  # a pipe or a folder: read_json names it
        allowed = f" (shipped: {', '.join(shipped_gpu_ids())})" if shipped else ""
        raise ProfileError(
            f"{path}: hardware profile not found"
            + (f" for GPU {gpu_id!r}" if gpu_id else "")
            + allowed
        )
    raw = read_json(path, ProfileError)
    prof = profile_from_dict(raw, str(path))
    if gpu_id is not None and prof.gpu != gpu_id:
        raise ProfileError(f"{path}: gpu is {prof.gpu!r}, expected {gpu_id!r}")
    return prof


def _num(d: dict, key: str, where: str, path: str, positive: bool = True) -> float:
    if not isinstance(d, dict) or key not in d:
        raise ProfileError(f"{path}: {where}.{key}: missing")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProfileError(f"{path}: {where}.{key}: expected a number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise ProfileError(
            f"{path}: {where}.{key}: must be {'> 0' if positive else '>= 0'}, got {v!r}"
        )
    return float(v)


def _section(d: Any, key: str, where: str, path: str) -> dict:
    if not isinstance(d, dict) or not isinstance(d.get(key), dict):
        raise ProfileError(f"{path}: {where + '.' if where else ''}{key}: missing or not an object")
    return d[key]


# optional fields a profile file leaves out where they are 0 (calibration.fit writes them
# only where fitted): a decode kernel's re-read rate (per-query-head kernels), few-item time
# (split-KV), item terms and multi-block wave terms; an FP8 GEMM's dynamic-scale terms
DECODE_FIELDS_OMITTED_AT_ZERO = (
    "reread_bytes_per_s",
    "split_fill_s",
    "per_item_s",
    "per_q_elem_s",
    "wave_sms",
    "cta_s",
    "cta_q_elem_s",
    "cta_bytes_per_s",
    "split_s",
    "split_elem_s",
    "block_bytes_per_s",
    "occupancy_sms",
    "smem_per_sm_kib",
)
GEMM_FIELDS_OMITTED_AT_ZERO = ("dynamic_scale_s", "dynamic_scale_bw_eff")
_DEC_KEYS: tuple[Any, ...] = (
    DecodeAttentionParams,
    ("floor_s", "per_seq_s", "bw_eff"),
    ("per_seq_s",),
    (
        "per_seq_kv_elem_s",
        "par_half_sat",
        "multi_floor_s",
        "overlap",
        "group_bytes_per_s",
        *DECODE_FIELDS_OMITTED_AT_ZERO,
    ),
)
_PRE_KEYS: tuple[Any, ...] = (
    PrefillAttentionParams,
    ("floor_s", "max_eff", "half_sat"),
    ("half_sat",),
)


def _per_dtype(
    parent: Any,
    where: str,
    op: str,
    cls: Any,
    keys: tuple[str, ...],
    nonneg: tuple[str, ...],
    optional: tuple[str, ...],
    path: str,
) -> dict[str, Any]:
    """``{dtype: cls(...)}`` from ``parent[op]``; ``optional`` keys (non-negative) may be
    absent (the dataclass default applies); efficiencies must lie in (0, 1]."""
    sec = _section(parent, op, where, path)
    if not sec:
        raise ProfileError(f"{path}: {where}.{op}: needs at least one dtype")
    out = {}
    for dt, params in sec.items():
        w = f"{where}.{op}.{dt}"
        kw = {k: _num(params, k, w, path, positive=k not in nonneg) for k in keys}
        for k in optional:
            if isinstance(params, dict) and k in params:
                kw[k] = _num(params, k, w, path, positive=False)
        for k in ("max_eff", "bw_eff", "mem_eff", "overlap", "dynamic_scale_bw_eff"):
            if k in kw and kw[k] > 1.0:
                raise ProfileError(f"{path}: {w}.{k}: must be in (0, 1], got {kw[k]}")
        if kw.get("block_bytes_per_s", 0.0) > 0.0 and not (
            kw.get("occupancy_sms", 0.0) > 0.0
            and kw.get("smem_per_sm_kib", 0.0) >= 4.0
            and kw.get("reread_bytes_per_s", 0.0) > 0.0
            and kw.get("wave_sms", 0.0) == 0.0
            and kw.get("overlap", 0.0) == 1.0
        ):
            raise ProfileError(
                f"{path}: {w}.block_bytes_per_s: the occupancy term needs occupancy_sms > 0, "
                "smem_per_sm_kib >= 4 and reread_bytes_per_s > 0 (a per-query-head kernel) "
                "and no wave_sms (a line-form kernel) with overlap 1"
            )
        out[dt] = cls(**kw)
    return out


def profile_from_dict(raw: Any, path: str = "<profile>") -> HardwareProfile:
    """Validate a parsed profile; every error names the file and the field."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a JSON object at top level")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(
            f"{path}: schema_version: expected {SCHEMA_VERSION}, got {raw.get('schema_version')!r}"
        )
    gpu = raw.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise ProfileError(f"{path}: gpu: missing or not a string")
    pk = _section(raw, "peaks", "", path)
    peaks = GpuPeaks(
        bf16_flop_per_s=_num(pk, "bf16_flop_per_s", "peaks", path),
        fp8_flop_per_s=_num(pk, "fp8_flop_per_s", "peaks", path, positive=False),
        hbm_bytes_per_s=_num(pk, "hbm_bytes_per_s", "peaks", path),
        hbm_bytes=_num(pk, "hbm_bytes", "peaks", path),
    )
    ops = _section(raw, "ops", "", path)

    def per_dtype(op, cls, keys, nonneg=(), optional=()):
        return per_dtype_in(ops, "ops", op, cls, keys, nonneg, optional)

    def per_dtype_in(parent, where, op, cls, keys, nonneg=(), optional=()):
        return _per_dtype(parent, where, op, cls, keys, nonneg, optional, path)

    gemm = per_dtype(
        "gemm",
        GemmParams,
        ("launch_s", "max_eff", "half_sat", "mem_eff"),
        ("half_sat",),
        GEMM_FIELDS_OMITTED_AT_ZERO,
    )
    dec = per_dtype("decode_attention", *_DEC_KEYS)
    pre = per_dtype("prefill_attention", *_PRE_KEYS)
    ew = _section(ops, "elementwise", "ops", path)
    elementwise = ElementwiseParams(
        launch_s=_num(ew, "launch_s", "ops.elementwise", path, positive=False),
        bw_eff=_num(ew, "bw_eff", "ops.elementwise", path),
    )
    ar = _section(ops, "allreduce", "ops", path)
    rows = []
    for n, prm in sorted(ar.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        if not str(n).isdigit() or int(n) < 2:
            raise ProfileError(f"{path}: ops.allreduce.{n}: keys must be GPU counts >= 2")
        where = f"ops.allreduce.{n}"
        row: tuple[float, ...] = (
            int(n),
            _num(prm, "latency_s", where, path, positive=False),
            _num(prm, "bus_bw_bytes_per_s", where, path),
        )
        if isinstance(prm, dict) and ("ll_latency_s" in prm or "ll_bus_bw_bytes_per_s" in prm):
            row += (
                _num(prm, "ll_latency_s", where, path, positive=False),
                _num(prm, "ll_bus_bw_bytes_per_s", where, path),
            )
        rows.append(row)
    if not rows:
        raise ProfileError(f"{path}: ops.allreduce: needs at least one GPU count")
    cp = _section(ops, "copy", "ops", path)
    copies = {}
    for kind, prm in cp.items():
        where = f"ops.copy.{kind}"
        copies[kind] = CopyParams(
            latency_s=_num(prm, "latency_s", where, path, positive=False),
            bw_bytes_per_s=_num(prm, "bw_bytes_per_s", where, path),
            per_block_s=_num(prm, "per_block_s", where, path, positive=False)
            if "per_block_s" in prm
            else 0.0,
        )
    if "engines" in raw:
        raise ProfileError(
            f"{path}: engines: serving-engine overheads are no longer part of a hardware "
            "profile (they are CPU time, not a GPU property): remove this section; engine "
            "profiles live in disaggsim/hardware/engines.json"
        )
    backends: dict[str, AttentionBackendParams] = {}
    ab = raw.get("attention_backends", {})
    if not isinstance(ab, dict):
        raise ProfileError(f"{path}: attention_backends: not an object")
    for name, sec in ab.items():
        if name not in ATTENTION_BACKENDS:
            raise ProfileError(
                f"{path}: attention_backends.{name}: unknown backend "
                f"(allowed: {', '.join(ATTENTION_BACKENDS)})"
            )
        if not isinstance(sec, dict) or not isinstance(sec.get("decode_attention"), dict):
            raise ProfileError(f"{path}: attention_backends.{name}.decode_attention: missing")
        backends[name] = AttentionBackendParams(
            decode=per_dtype_in(sec, f"attention_backends.{name}", "decode_attention", *_DEC_KEYS),
            prefill=per_dtype_in(sec, f"attention_backends.{name}", "prefill_attention", *_PRE_KEYS)
            if "prefill_attention" in sec
            else {},
        )
    auto: dict[str, tuple[str, ...]] = {}
    for phase, names in (raw.get("attention_auto") or {}).items():
        if phase not in ("decode", "prefill") or not isinstance(names, list):
            raise ProfileError(
                f"{path}: attention_auto.{phase}: expected decode/prefill lists of backends"
            )
        for n in names:
            if n not in backends:
                raise ProfileError(
                    f"{path}: attention_auto.{phase}: {n!r} is not in attention_backends "
                    f"(have: {', '.join(sorted(backends)) or 'none'})"
                )
        auto[phase] = tuple(names)
    gemm_kernels = _gemm_kernels(raw.get("gemm_kernels", {}), peaks, path)
    graph_layer_s = 0.0
    if "graph_replay" in raw:
        graph_layer_s = _num(raw["graph_replay"], "per_layer_s", "graph_replay", path, False)
    prov = raw.get("provenance")
    if not isinstance(prov, dict) or prov.get("kind") not in PROVENANCE_KINDS:
        raise ProfileError(f"{path}: provenance.kind: must be one of {', '.join(PROVENANCE_KINDS)}")
    return HardwareProfile(
        gpu=gpu,
        peaks=peaks,
        gemm=gemm,
        decode_attention=dec,
        prefill_attention=pre,
        elementwise=elementwise,
        allreduce=AllReduceParams(tuple(rows)),
        copy=copies,
        attention_backends=backends,
        attention_auto=auto,
        gemm_kernels=gemm_kernels,
        graph_layer_s=graph_layer_s,
        fit_error=raw.get("fit_error", {}) or {},
        provenance=prov,
        path=path,
    )


_BRANCH_INTS = ("tile_m", "tile_n", "cluster_m", "cluster_n")
_BRANCH_KEYS = {
    "max_m", *_BRANCH_INTS, "max_eff", "max_n", "min_m", "min_k", "swap_ab"
}  # fmt: skip
_KERNEL_KEYS = {
    "dtype", "num_sms", "launch_s", "mem_eff", "epilogue_s_per_elem", "branches", "source",
    "l2_bytes_per_s",
}  # fmt: skip


def _count(d: dict, key: str, where: str, path: str) -> int:
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ProfileError(f"{path}: {where}.{key}: expected an integer >= 1, got {v!r}")
    return v


def _gemm_kernels(sec: Any, peaks: GpuPeaks, path: str) -> dict[str, TiledGemmParams]:
    """``gemm_kernels`` validated: known kernel names, their dtype, a dispatch table of
    branches with non-decreasing ``max_m`` ending in one that takes every GEMM (``max_m``
    ``null``: no limit, and no other condition), efficiencies in (0, 1]."""
    if not isinstance(sec, dict):
        raise ProfileError(f"{path}: gemm_kernels: not an object")
    out: dict[str, TiledGemmParams] = {}
    for name, prm in sec.items():
        w = f"gemm_kernels.{name}"
        if name not in GEMM_KERNELS:
            raise ProfileError(
                f"{path}: {w}: unknown GEMM kernel (allowed: {', '.join(GEMM_KERNELS)})"
            )
        if not isinstance(prm, dict):
            raise ProfileError(f"{path}: {w}: not an object")
        unknown = sorted(set(prm) - _KERNEL_KEYS)
        if unknown:
            raise ProfileError(
                f"{path}: {w}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_KERNEL_KEYS))})"
            )
        dtype = prm.get("dtype")
        if dtype != GEMM_KERNELS[name]:
            raise ProfileError(
                f"{path}: {w}.dtype: {name} runs {GEMM_KERNELS[name]} GEMMs, got {dtype!r}"
            )
        if dtype == "fp8" and peaks.fp8_flop_per_s <= 0:
            raise ProfileError(f"{path}: {w}: this GPU has no FP8 tensor cores")
        mem_eff = _num(prm, "mem_eff", w, path)
        if mem_eff > 1.0:
            raise ProfileError(f"{path}: {w}.mem_eff: must be in (0, 1], got {mem_eff}")
        raw_branches = prm.get("branches")
        if not isinstance(raw_branches, list) or not raw_branches:
            raise ProfileError(f"{path}: {w}.branches: expected a non-empty list")
        branches = []
        last = 0.0
        for i, b in enumerate(raw_branches):
            wb = f"{w}.branches[{i}]"
            if not isinstance(b, dict):
                raise ProfileError(f"{path}: {wb}: not an object")
            bad = sorted(set(b) - _BRANCH_KEYS)
            if bad:
                raise ProfileError(
                    f"{path}: {wb}.{bad[0]}: unknown key (allowed: {', '.join(sorted(_BRANCH_KEYS))})"
                )
            final = i == len(raw_branches) - 1
            max_m = float("inf") if b.get("max_m") is None else _num(b, "max_m", wb, path)
            max_n = float("inf") if b.get("max_n") is None else _num(b, "max_n", wb, path)
            min_m, min_k = (
                _num(b, key, wb, path, positive=False) if key in b else 0.0
                for key in ("min_m", "min_k")
            )
            swap = b.get("swap_ab", False)
            if not isinstance(swap, bool):
                raise ProfileError(f"{path}: {wb}.swap_ab: expected true or false, got {swap!r}")
            limited = max_m < float("inf") or max_n < float("inf") or min_m > 0 or min_k > 0
            if final and limited:
                raise ProfileError(
                    f"{path}: {wb}: the last branch takes every GEMM the others do not "
                    "(max_m null, no max_n, min_m or min_k)"
                )
            if not final and not limited:
                raise ProfileError(
                    f"{path}: {wb}: a branch before the last needs a condition (max_m, max_n, "
                    "min_m or min_k); as it is the branches after it are never taken"
                )
            if max_m < last:
                raise ProfileError(
                    f"{path}: {wb}.max_m: must not decrease from branch to branch, got {max_m}"
                )
            last = max_m
            eff = _num(b, "max_eff", wb, path)
            if eff > 1.0:
                raise ProfileError(f"{path}: {wb}.max_eff: must be in (0, 1], got {eff}")
            ints = {k: _count(b, k, wb, path) for k in _BRANCH_INTS}
            branches.append(
                GemmTileBranch(
                    max_m=max_m,
                    max_eff=eff,
                    max_n=max_n,
                    min_m=min_m,
                    min_k=min_k,
                    swap_ab=swap,
                    **ints,
                )
            )
        out[name] = TiledGemmParams(
            dtype=dtype,
            num_sms=_count(prm, "num_sms", w, path),
            launch_s=_num(prm, "launch_s", w, path, positive=False),
            mem_eff=mem_eff,
            epilogue_s_per_elem=_num(prm, "epilogue_s_per_elem", w, path, positive=False),
            branches=tuple(branches),
            source=str(prm.get("source", "")),
            l2_bytes_per_s=(
                _num(prm, "l2_bytes_per_s", w, path, positive=False)
                if "l2_bytes_per_s" in prm
                else 0.0
            ),
        )
    return out
