"""Roofline step-time model of one worker (a TP group holding one copy of the weights).

Owns the mapping from a model shape, a GPU, a tensor-parallel degree and a hardware
profile to (a) the time of one forward pass — prefill batch, decode step, mixed chunked
step — and (b) the worker's memory: weights per GPU and KV capacity in tokens.

One iteration over ``m`` tokens (``docs/costmodel.md`` has the derivation):

- per layer, per GPU shard: QKV GEMM ``(m, (heads + 2 kv_heads)·head_dim / tp, hidden)``,
  O GEMM ``(m, hidden, heads·head_dim / tp)``, MLP up ``(m, (2 if gated)·ffn / tp,
  hidden)``, MLP down ``(m, hidden, ffn / tp)``; prefill attention over ``heads / tp`` and
  decode attention over ``kv_heads / tp`` as separate kernels; seven element-wise kernels
  (two norms, rope, KV-cache write, activation, two residual adds); two ring all-reduces
  of ``m × hidden × 2`` bytes when ``tp > 1`` (hierarchical across nodes when ``tp``
  exceeds a node, :mod:`disaggsim.costmodel.tp_layout`);
- with FP8 weights, one activation-quantisation kernel before each GEMM (element-wise:
  reads 2 and writes 1 byte per input element);
- × ``num_layers``; + final norm and LM-head GEMM ``(sequences emitting a token,
  vocab / tp, hidden)``; + the serving engine's overhead (:mod:`disaggsim.hardware.engines`:
  per iteration, per TP rank, per sequence, per token, per layer) and, for engines that
  replay CUDA graphs, the GPU's per-layer graph cost.

Attention runs the kernel the profile fitted for the named ``attention_backend``, or with
``auto`` the serving engine's own kernels, prefill and decode alike: the kernel its engine
profile names (TensorRT-LLM's) where the profile fits it, else its framework's fitted
kernels (vLLM's, SGLang's; the fastest for this worker's head layout when a framework has
several), else the profile's generic kernel — never another framework's kernel because it
is faster; chosen once per worker (:func:`pick_attention_backends`).

GEMMs run the profile's ``ops.gemm`` fit for the weight dtype, or with FP8 weights the
serving engine's own FP8 GEMM kernel where its engine profile names one (SGLang's
``sglang-fp8``) and the profile fits it (``gemm_kernels``: a tile form with the kernel's
dispatch table, ``ops.tiled_gemm_time_s``).

Every operator time is the formula of :mod:`disaggsim.costmodel.ops`. The engine calls
these methods in its hot loop, so they are evaluated here with plain float arithmetic
written term for term like ``ops.py`` (numpy scalars cost microseconds each);
``tests/test_costmodel.py`` checks the two agree. Decode time is exactly affine in the
context tokens at fixed batch: only decode attention reads the KV cache, and its time is
linear in the bytes read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from disaggsim.catalog import GpuSpec, ModelSpec, dtype_bytes, get_gpu, get_model
from disaggsim.costmodel.interface import decode_knee_tokens, decode_step_time_s
from disaggsim.costmodel.ops import (
    KIB,
    MMHA_SMEM_BYTES_PER_4_TOKENS,
    MMHA_SMEM_OPTIN_MARGIN,
    MMHA_SMEM_RESERVED_PER_BLOCK,
    MMHA_UNTUNED_BLOCKS_PER_SM,
    decode_wave_min_lines,
    mmha_occupancy_regimes,
)
from disaggsim.costmodel.overhead import (
    ELEMENTWISE_KERNELS_PER_LAYER,
    StepOverhead,
    step_overhead,
    unhidden_launches_s,
)
from disaggsim.costmodel.reserve import (
    DEFAULT_BATCH_SEQS,
    DEFAULT_BATCH_TOKENS,
    runtime_reserve_bytes,
)
from disaggsim.costmodel.tp_layout import TpLayout, allreduce_s, tp_layout
from disaggsim.errors import UserError
from disaggsim.hardware.engines import ENGINE_CHOICES, EngineProfile, resolve_engine
from disaggsim.hardware.profile import (
    ATTENTION_BACKEND_FRAMEWORKS,
    ATTENTION_CHOICES,
    DECODE_ONLY_BACKENDS,
    DecodeAttentionParams,
    ElementwiseParams,
    GemmParams,
    HardwareProfile,
    PrefillAttentionParams,
    TiledGemmParams,
    load_profile,
)
from disaggsim.units import GiB

__all__ = [
    "ACT_BYTES",
    "ATTENTION_CHOICES",
    "ENGINE_CHOICES",
    "ELEMENTWISE_KERNELS_PER_LAYER",
    "KV_DTYPES",
    "WEIGHT_DTYPES",
    "RooflineWorkerCost",
    "StepBreakdown",
    "build_worker_cost",
    "pick_attention_backends",
    "prefill_attention_at_length_s",
    "valid_tps",
]

WEIGHT_DTYPES = ("bf16", "fp16", "fp8")
KV_DTYPES = ("bf16", "fp16", "fp8")
ACT_BYTES = 2  # activations stay in 16-bit even with FP8 weights or KV
MAX_TP = 64
FP8_QUANT_BYTES_PER_ELEM = 3.0  # activation quantisation: read bf16, write fp8
# reference points at which ``auto`` compares attention backends for one head layout:
# decode (batch, context tokens per sequence) and prefill (prompt tokens)
_AUTO_DECODE_POINTS = ((1, 512), (8, 2048), (64, 1024), (256, 512), (32, 8192))
_AUTO_PREFILL_POINTS = (256, 2048, 8192)


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Seconds of one iteration by part; ``total_s`` is their sum."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    allreduce_s: float
    lm_head_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return (
            self.gemm_s
            + self.attention_s
            + self.elementwise_s
            + self.allreduce_s
            + self.lm_head_s
            + self.overhead_s
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "gemm_s": self.gemm_s,
            "attention_s": self.attention_s,
            "elementwise_s": self.elementwise_s,
            "allreduce_s": self.allreduce_s,
            "lm_head_s": self.lm_head_s,
            "overhead_s": self.overhead_s,
        }


# --- scalar copies of the ops.py formulas (same terms, same order) -------------------


def _gemm_s(peak: float, hbm: float, p: GemmParams, m: float, n: float, k: float, elem: float):
    d = min(m, n, k)
    eff = p.max_eff * d / (d + p.half_sat)
    compute_s = 2.0 * m * n * k / (peak * eff)
    memory_s = (m * k + k * n + m * n) * elem / (hbm * p.mem_eff)
    return p.launch_s + max(compute_s, memory_s)


def _tiled_gemm_s(
    peak: float, hbm: float, p: TiledGemmParams, m: float, n: float, k: float
) -> float:
    b = p.branch(m, n, k)
    rows, cols = (n, m) if b.swap_ab else (m, n)  # the kernel's m and n
    tiles = (
        math.ceil(math.ceil(rows / b.tile_m) / b.cluster_m) * b.cluster_m
        * math.ceil(math.ceil(cols / b.tile_n) / b.cluster_n) * b.cluster_n
    )  # fmt: skip
    waves = math.ceil(tiles / p.num_sms)
    area = float(b.tile_m * b.tile_n)
    per_tile = p.epilogue_s_per_elem * area + 2.0 * area * k / (peak / p.num_sms * b.max_eff)
    elem = 1.0 if p.dtype == "fp8" else 2.0
    memory_s = (m * k + k * n + m * n) * elem / (hbm * p.mem_eff)
    t = max(waves * per_tile, memory_s)
    if p.l2_bytes_per_s > 0.0:  # operand tiles from L2, shared over each cluster
        l2_bytes = tiles * (b.tile_m / b.cluster_n + b.tile_n / b.cluster_m) * k * elem
        t = max(t, l2_bytes / p.l2_bytes_per_s)
    return p.launch_s + t


def _elementwise_s(hbm: float, p: ElementwiseParams, nbytes: float) -> float:
    return p.launch_s + nbytes / (hbm * p.bw_eff)


def _fp8_quant_s(
    hbm: float, p: ElementwiseParams, tokens: float, inputs: Iterable[float], onto_s: float = 0.0
) -> float:
    """FP8 linear layers' activation quantisation: one elementwise kernel per GEMM input of
    ``k`` elements a token (``FP8_QUANT_BYTES_PER_ELEM``: reads 2, writes 1 byte each),
    added one kernel at a time onto ``onto_s`` (the dense and the MoE step both call it)."""
    t = onto_s
    for k in inputs:
        t += _elementwise_s(hbm, p, FP8_QUANT_BYTES_PER_ELEM * tokens * k)
    return t


def _prefill_attention_s(
    peak: float,
    p: PrefillAttentionParams,
    num_seqs: float,
    new_tokens: float,
    pairs: float,
    heads: float,
    head_dim: float,
) -> float:
    return prefill_attention_at_length_s(
        peak, p, new_tokens / max(num_seqs, 1.0), pairs, heads, head_dim
    )


def prefill_attention_at_length_s(
    peak: float,
    p: PrefillAttentionParams,
    length: float,
    pairs: float,
    heads: float,
    head_dim: float,
) -> float:
    """Prefill attention over ``pairs`` (query, key) pairs at the efficiency of a
    ``length``-token query (the step uses the batch's mean new tokens per sequence)."""
    eff = p.max_eff * length / (length + p.half_sat)
    return p.floor_s + 4.0 * pairs * heads * head_dim / (peak * eff)


def _dec_floor_s(p: DecodeAttentionParams, batch: float, kv_heads: float) -> float:
    """ops.decode_attention_floor_s for scalars: ``multi_floor_s`` added when B > 1 and KH > 1."""
    return p.floor_s + p.multi_floor_s if batch > 1.0 and kv_heads > 1.0 else p.floor_s


def _dec_fill_s(p: DecodeAttentionParams, items: float) -> float:
    """A split-KV kernel's fill bound ``split_fill_s × h / (P + h)`` over ``items`` = P work
    items (ops.decode_split_shortfall_s; 0 for other kernels)."""
    if p.split_fill_s <= 0.0:
        return 0.0
    return p.split_fill_s * p.par_half_sat / (items + p.par_half_sat)


def _dec_shortfall_s(p: DecodeAttentionParams, stream: float, items: float) -> float:
    """ops.decode_split_shortfall_s for scalars: ``min(stream × h / P, fill bound)``."""
    if p.split_fill_s <= 0.0:
        return 0.0
    return min(stream * p.par_half_sat / items, _dec_fill_s(p, items))


def _dec_bw_scale(p: DecodeAttentionParams, batch: float, kv_heads: float) -> float:
    """ops.decode_attention_bw_scale for scalars: ``P / (P + par_half_sat)``, P = B × KH (1
    for a split-KV kernel)."""
    if p.par_half_sat <= 0.0 or p.split_fill_s > 0.0:
        return 1.0
    items = batch * kv_heads
    return items / (items + p.par_half_sat)


def _dec_work_heads(p: DecodeAttentionParams, kv_heads: float, group: float) -> float:
    """ops.decode_work_heads for scalars: query heads for a per-query-head kernel."""
    return kv_heads * group if p.per_query_head else kv_heads


def _dec_item_terms_s(
    p: DecodeAttentionParams,
    batch: float,
    work: float,
    kv_heads: float,
    head_dim: float,
    q_per_kv: float,
) -> float:
    """ops.decode_item_seconds for scalars, less its ``per_seq_kv_elem_s`` part (the
    callers keep that product as it was written, so kernels without the item terms give
    the same floats to the last bit)."""
    t = 0.0
    if p.per_item_s > 0.0:
        t += p.per_item_s * batch * work
    if p.per_q_elem_s > 0.0:
        t += p.per_q_elem_s * batch * kv_heads * q_per_kv * head_dim
    return t


def _dec_per_byte_s(
    hbm: float,
    p: DecodeAttentionParams,
    batch: float,
    kv_heads: float,
    group: float,
    reread: float,
    q_per_kv: float = 1.0,
) -> float:
    """ops.decode_stream_seconds_per_byte for scalars."""
    work = _dec_work_heads(p, kv_heads, group)
    per_byte = 1.0 / (hbm * p.bw_eff * _dec_bw_scale(p, batch, work))
    rate = reread if reread > 0.0 else p.reread_bytes_per_s
    if group > 1.0 and rate > 0.0:
        per_byte = max(per_byte, group / rate)
    if p.group_bytes_per_s > 0.0:
        per_byte = max(per_byte, q_per_kv / p.group_bytes_per_s)
    return per_byte


def _mmha_resident_blocks(history_tokens: float, smem_per_sm_kib: float) -> float:
    """ops.mmha_resident_blocks for a scalar."""
    per = MMHA_SMEM_BYTES_PER_4_TOKENS
    smem_per_sm = smem_per_sm_kib * KIB
    optin = smem_per_sm - MMHA_SMEM_RESERVED_PER_BLOCK - MMHA_SMEM_OPTIN_MARGIN
    splits = max(math.ceil(math.ceil((history_tokens + 1.0) / 4.0) / math.floor(optin / per)), 1)
    held = math.ceil((history_tokens + 1.0) / splits) if splits > 1 else history_tokens
    smem = per * math.ceil((held + 1.0) / 4.0) + MMHA_SMEM_RESERVED_PER_BLOCK
    return min(max(float(math.floor(smem_per_sm / smem)), 1.0), MMHA_UNTUNED_BLOCKS_PER_SM)


def _dec_occ_per_byte_s(
    p: DecodeAttentionParams, batch: float, work: float, group: float, history_tokens: float
) -> float:
    """ops.mmha_occupancy_seconds_per_byte for scalars (0 where the term does not apply)."""
    if p.block_bytes_per_s <= 0.0 or batch * work < MMHA_UNTUNED_BLOCKS_PER_SM * p.occupancy_sms:
        return 0.0
    k = _mmha_resident_blocks(history_tokens, p.smem_per_sm_kib)
    return group / (k * p.occupancy_sms * p.block_bytes_per_s)


def pick_attention_backends(
    profile: HardwareProfile,
    backend: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    engine_backend: str = "auto",
    framework: str | None = None,
) -> tuple[str, str]:
    """``(decode backend, prefill backend)`` a worker with this per-GPU head layout runs.

    A named ``backend`` must be fitted in the profile. ``auto`` runs the serving engine's
    own kernels, one rule for both phases: for each phase, the kernel the engine profile
    names (``engine_backend``, :class:`~disaggsim.hardware.engines.EngineProfile`) where
    the profile fits it for that phase, else the fitted kernels of the engine's framework
    (``framework``: :data:`~disaggsim.hardware.profile.ATTENTION_BACKEND_FRAMEWORKS`; the
    fastest of them when several), else ``generic`` (the profile's ``ops`` entries) —
    never another framework's kernel because it is faster. Only an engine without a
    framework (``framework`` None: the kernel-only profile) takes, separately for decode
    and prefill, the backend with the smallest summed time over a few reference shapes of
    this head layout (its shape family) among the profile's ``attention_auto`` candidates
    (the backends whose fit is trusted; all fitted ones when the profile names none).
    Decode-only kernels (an engine's fallback for layouts its main kernel does not take)
    are never picked here. Raises :class:`UserError` for an unknown or unfitted name."""
    if backend not in ATTENTION_CHOICES:
        raise UserError(
            f"attention_backend: unknown backend {backend!r} (allowed: {', '.join(ATTENTION_CHOICES)})"
        )
    fitted = profile.attention_backends
    if backend != "auto":
        if backend not in fitted:
            have = ", ".join(["auto", *sorted(fitted)])
            raise UserError(
                f"attention_backend: {backend!r} is not fitted in the {profile.gpu} profile "
                f"{profile.path} (allowed here: {have})"
            )
        return backend, backend
    if not fitted:
        return "generic", "generic"
    peaks = profile.peaks
    kv_elem = float(dtype_bytes(kv_dtype))
    hkv, hd = float(kv_heads), float(head_dim)
    q_per_kv = float(heads) / hkv

    def decode_cost(name: str) -> float:
        d = profile.decode_attention_for(name, kv_dtype)
        total = 0.0
        for b, ctx in _AUTO_DECODE_POINTS:
            if d.wave_sms > 0.0:  # a multi-block wave kernel: the smallest of its lines
                lines = decode_wave_min_lines(peaks, d, b, hkv, hd, kv_elem, q_per_kv)
                total += min(b0 + k0 * b * ctx for b0, k0 in lines)
                continue
            kv_bytes = 2.0 * b * ctx * hkv * hd * kv_elem
            bw = peaks.hbm_bytes_per_s * d.bw_eff * _dec_bw_scale(d, b, hkv)
            items = d.per_seq_kv_elem_s * b * hkv * hd + _dec_item_terms_s(
                d, b, hkv, hkv, hd, q_per_kv
            )
            stream = kv_bytes / bw
            stream += _dec_shortfall_s(d, stream, b * hkv)
            total += (
                _dec_floor_s(d, b, hkv)
                + d.per_seq_s * b
                + max(items, stream)
                + (1.0 - d.overlap) * min(items, stream)
            )
        return total

    def prefill_cost(name: str) -> float:
        pre = profile.prefill_attention_for(name, "bf16")
        return sum(
            _prefill_attention_s(
                peaks.bf16_flop_per_s, pre, 1.0, float(n), n * (n + 1) / 2.0, float(heads), hd
            )
            for n in _AUTO_PREFILL_POINTS
        )

    own = fitted.get(engine_backend) if engine_backend != "auto" else None
    if framework is not None:  # the engine's own kernels only
        ours = [
            n
            for n in fitted
            if ATTENTION_BACKEND_FRAMEWORKS.get(n) == framework and n not in DECODE_ONLY_BACKENDS
        ]
        first = [engine_backend] if own is not None else []
        dec_own = first + sorted(
            (n for n in ours if n not in first), key=lambda n: (decode_cost(n), n)
        )
        pre_own = (first if own is not None and own.prefill else []) + sorted(
            (n for n in ours if fitted[n].prefill and n not in first),
            key=lambda n: (prefill_cost(n), n),
        )
        return (dec_own[0] if dec_own else "generic"), (pre_own[0] if pre_own else "generic")
    if own is not None and own.prefill:
        return engine_backend, engine_backend
    auto = profile.attention_auto
    dec_names = list(auto.get("decode", tuple(fitted)))
    pre_names = [n for n in auto.get("prefill", tuple(fitted)) if fitted[n].prefill]
    decoders = sorted(dec_names, key=lambda n: (decode_cost(n), n))
    prefillers = sorted(pre_names, key=lambda n: (prefill_cost(n), n))
    if own is not None:  # the engine's kernel for decode, auto's pick for prefill
        return engine_backend, (prefillers[0] if prefillers else "generic")
    return (decoders[0] if decoders else "generic"), (prefillers[0] if prefillers else "generic")


def valid_tps(model: ModelSpec, max_tp: int = MAX_TP) -> tuple[int, ...]:
    """TP degrees that shard ``model``: divide the query heads, and either divide the KV
    heads or are a multiple of them (then each GPU holds one replicated KV head)."""
    return tuple(
        tp
        for tp in range(1, max_tp + 1)
        if model.num_heads % tp == 0
        and (model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0)
    )


class RooflineWorkerCost:
    """:class:`~disaggsim.costmodel.interface.WorkerCost` from per-operator rooflines.

    Build with :func:`build_worker_cost`. Attributes named in the protocol:
    ``num_gpus`` (= tp), ``kv_bytes_per_token`` (the model's KV bytes per token, all
    layers and shards, without TP replication: what a handoff moves),
    ``kv_capacity_tokens``, ``weights_bytes`` (all GPUs of the worker).
    """

    __slots__ = (
        "model",
        "gpu",
        "profile",
        "tp",
        "weight_dtype",
        "kv_dtype",
        "engine",
        "engine_profile",
        "attention_backend",
        "decode_backend",
        "prefill_backend",
        "decode_min_lines",
        "_wave",
        "gpu_mem_util",
        "activation_reserve_bytes",
        "num_gpus",
        "kv_bytes_per_token",
        "kv_bytes_per_token_per_gpu",
        "kv_capacity_tokens",
        "weights_bytes",
        "weights_bytes_per_gpu",
        "heads_per_gpu",
        "kv_heads_per_gpu",
        "_gemm_shapes",
        "_lm_head_n",
        "_gemm_dtype",
        "_gemm",
        "_gemm_peak",
        "_gemm_elem",
        "_tiles",
        "_lm_head_gemm",
        "gemm_kernel",
        "_dec",
        "_pre",
        "_ew",
        "_hbm",
        "_bf16_peak",
        "_kv_elem",
        "_ar_protocols",
        "tp_layout",
        "_ov",
        "_launch_s",
        "_quant_k",
        "_reread_group",
        "_q_per_kv",
        "_reread_bytes_per_s",
        "_decode_cache",
        "_wave_cache",
        "_min_cache",
        "decode_interval_lines",
        "_occ_regimes",
        "_interval_cache",
        "_longest_cache",
        "_gemm_layer_cache",
    )  # _decode_cache: batch -> (stream-bound line, item-bound line)

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: HardwareProfile,
        tp: int,
        weight_dtype: str,
        kv_dtype: str,
        engine: EngineProfile,
        gpu_mem_util: float,
        activation_reserve_bytes: float,
        attention_backend: str = "auto",
        gpus_per_node: int | None = None,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.profile = profile
        self.tp = tp
        self.weight_dtype = weight_dtype
        self.kv_dtype = kv_dtype
        self.engine = engine.name
        self.engine_profile = engine
        self.attention_backend = attention_backend
        self.gpu_mem_util = gpu_mem_util
        self.activation_reserve_bytes = activation_reserve_bytes
        self.num_gpus = tp

        self.heads_per_gpu = model.num_heads // tp
        self.kv_heads_per_gpu = max(model.num_kv_heads // tp, 1)
        hq, hkv, hd = self.heads_per_gpu, self.kv_heads_per_gpu, model.head_dim
        ffn = -(-model.ffn // tp)
        self._gemm_shapes: tuple[tuple[float, float], ...] = (  # (n, k) per layer
            (float((hq + 2 * hkv) * hd), float(model.hidden)),  # QKV
            (float(model.hidden), float(hq * hd)),  # O
            (float((2 if model.gated_mlp else 1) * ffn), float(model.hidden)),  # up (+gate)
            (float(model.hidden), float(ffn)),  # down
        )
        self._lm_head_n = float(-(-model.vocab // tp))

        self._gemm_dtype = "fp8" if weight_dtype == "fp8" else "bf16"
        peaks = profile.peaks
        self._hbm = peaks.hbm_bytes_per_s
        self._bf16_peak = peaks.bf16_flop_per_s
        self._gemm = profile.gemm_params(self._gemm_dtype)
        self._gemm_peak = peaks.flop_per_s(self._gemm_dtype)
        self._gemm_elem = 1.0 if self._gemm_dtype == "fp8" else 2.0
        # the engine's own FP8 GEMM kernel where the profile fits it (None: ops.gemm)
        self._tiles = profile.gemm_kernel(engine.fp8_gemm_kernel, self._gemm_dtype)
        # the LM head stays 16-bit in FP8 checkpoints (vocab_params_per_gpu): a bf16 GEMM
        # (params, peak, bytes per element, the engine's FP8 tiles or None)
        self._lm_head_gemm: tuple[GemmParams, float, float, TiledGemmParams | None] = (
            (profile.gemm_params("bf16"), peaks.bf16_flop_per_s, 2.0, None)
            if self._gemm_dtype == "fp8"
            else (self._gemm, self._gemm_peak, self._gemm_elem, self._tiles)
        )
        self.gemm_kernel = "generic" if self._tiles is None else str(engine.fp8_gemm_kernel)
        self.decode_backend, self.prefill_backend = pick_attention_backends(
            profile,
            attention_backend,
            self.heads_per_gpu,
            self.kv_heads_per_gpu,
            hd,
            kv_dtype,
            engine.attention_backend,
            engine.framework,
        )
        # the engine's own decode kernels: where its grouped kernel does not take this
        # layout it runs its per-query-head kernel, when the profile fits one
        # (TensorRT-LLM: masked MHA where XQA refuses the layout)
        fallback = engine.per_query_head_decode_backend
        if (
            fallback is not None
            and self.decode_backend == engine.attention_backend
            and not engine.grouped_decode_covers(hq // hkv)
            and fallback in profile.attention_backends
        ):
            self.decode_backend = fallback
        self._dec = profile.decode_attention_for(self.decode_backend, kv_dtype)
        # a per-query-head decode kernel (the engine's grouped kernel does not cover this
        # layout) reads each KV head once per query head: the re-reads come from L2, at the
        # engine's measured rate where it has one, else at the kernel fit's
        if self._dec.per_query_head:
            self._reread_group = float(hq // hkv)
        else:
            self._reread_group = float(engine.decode_reread_group(hq // hkv))
        self._reread_bytes_per_s = engine.per_query_head_kv_bytes_per_s
        self._q_per_kv = float(hq // hkv)  # a grouped kernel's group rate (group_bytes_per_s)
        if self._dec.wave_sms > 0.0 and not self._dec.per_query_head and (self._reread_group > 1.0):
            raise UserError(
                f"attention_backend {self.decode_backend!r}: its decode kernel (a multi-block "
                f"wave kernel, TensorRT-LLM's XQA) has no per-query-head form for "
                f"{hq // hkv} query heads per KV head; the engine profile names none "
                f"(per_query_head_decode_backend) the {profile.gpu} profile fits"
            )
        # the prefill kernel for the KV dtype where the backend's fit has one (TensorRT-LLM's
        # FP8 context FMHA with an FP8 KV cache), else its bf16 one
        self._pre = profile.prefill_attention_for(self.prefill_backend, kv_dtype)
        # FP8 weights: one quantisation kernel per GEMM input (k elements per token)
        self._quant_k: tuple[float, ...] = (
            tuple(k for _, k in self._gemm_shapes) if self._gemm_dtype == "fp8" else ()
        )
        self._ew = profile.elementwise
        self._kv_elem = float(dtype_bytes(kv_dtype))
        # TP beyond one node: hierarchical all-reduce (costmodel/tp_layout.py); the
        # in-node part uses the fit for the GPUs the group holds in each node. The node is
        # the cluster's (a topology fabric's gpus_per_node), else the catalog's.
        self.tp_layout: TpLayout = tp_layout(gpu, tp, gpus_per_node)
        g = self.tp_layout.gpus_in_node
        self._ar_protocols = profile.allreduce.protocols_for_gpus(g) if g > 1 else ()
        # the engine's host time (costmodel/overhead.py, shared with the MoE model)
        self._ov: StepOverhead = step_overhead(engine, profile, tp, model.num_layers)
        # an eager engine's kernel launches, overlapped with the kernels: the layers take
        # the longer of their kernels and this (a dense layer's launches: the rate the
        # engine profile gives, costmodel/overhead.py)
        self._launch_s = self._ov.launch_per_layer_s * model.num_layers
        if self._launch_s > 0.0 and 0.0 < self._dec.overlap < 1.0:
            # the step would be the longest of three lines in the context (the stream, the
            # item work partly overlapped, the launches); the engine takes at most two
            raise UserError(
                f"engine {engine.name!r}: launch_per_layer_s needs a decode attention fit "
                f"with overlap 0 or 1 ({self.decode_backend}: {self._dec.overlap})"
            )

        # Memory (bytes). KV per token: the model's logical KV; per GPU it includes the
        # replicated KV heads when tp > kv_heads.
        self.kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype)
        self.kv_bytes_per_token_per_gpu = int(2 * model.num_layers * hkv * hd * self._kv_elem)
        vocab_params = vocab_params_per_gpu(model, tp)
        self.weights_bytes_per_gpu = (_params_per_gpu(model, tp) - vocab_params) * dtype_bytes(
            weight_dtype
        ) + vocab_params * VOCAB_BYTES_PER_PARAM
        self.weights_bytes = self.weights_bytes_per_gpu * tp
        free = (
            gpu.usable_bytes * gpu_mem_util - self.weights_bytes_per_gpu - activation_reserve_bytes
        )
        self.kv_capacity_tokens = max(int(free // self.kv_bytes_per_token_per_gpu), 0)
        self._decode_cache: dict[int, tuple[tuple[float, float], tuple[float, float]]] = {}
        # tokens -> one layer's GEMM seconds (sum of gemm_layer_times_s): a step's GEMMs
        # depend on its token count alone, and a run's steps repeat a few thousand counts
        self._gemm_layer_cache: dict[float, float] = {}
        # a multi-block wave decode kernel (TensorRT-LLM's XQA, or its masked MHA where
        # the profile fits that as one): its attention is the smallest of a few lines in
        # the context (ops.decode_wave_lines: a per-query-head wave kernel takes its own
        # fitted re-read rate, the one its other terms were fitted with), per batch
        # A split-KV line-form kernel (split_fill_s > 0: FlashAttention's) likewise: its
        # stream falls short by the lesser of two amounts (ops.decode_split_shortfall_s), so
        # its kernel-bound part is the smaller of two lines, the stream plus its fill bound
        # and the stream at the few items' bandwidth share
        self._wave = self._dec.wave_sms > 0.0
        self.decode_min_lines = self._wave or self._dec.split_fill_s > 0.0
        if self._dec.split_fill_s > 0.0 and (
            self._dec.overlap != 1.0 or self._dec.block_bytes_per_s > 0.0
        ):
            # max(items, min(two lines)) + (1 - overlap) min(...) is not the larger of the
            # item line and the smaller stream line, and an occupancy kernel's stream lines
            # change by context interval: neither is fitted so
            raise UserError(
                f"attention_backend {self.decode_backend!r}: a split-KV decode fit needs "
                f"overlap 1 and no occupancy term ({profile.path})"
            )
        self._wave_cache: dict[int, tuple[tuple[float, float], ...]] = {}
        self._min_cache: dict[int, tuple[tuple[float, float], ...]] = {}
        # a line-form decode kernel with an occupancy term (TensorRT-LLM's masked MHA: the
        # blocks its shared memory lets reside per SM fall as the sequences grow): its
        # stream line changes with the tokens per sequence, one line per context interval
        # (decode_interval_coeffs)
        d = self._dec
        self._occ_regimes: tuple[tuple[float, float], ...] = (
            mmha_occupancy_regimes(d.smem_per_sm_kib)
            if d.block_bytes_per_s > 0.0 and d.wave_sms == 0.0
            else ()
        )
        self.decode_interval_lines = len(self._occ_regimes) > 1
        self._interval_cache: dict[int, tuple[tuple[float, tuple[float, float]], ...]] = {}
        self._longest_cache: dict[int, tuple[tuple[float, tuple[float, float]], ...]] = {}

    # --- the WorkerCost protocol ---------------------------------------------------

    def prefill_time_s(
        self, num_seqs: int, new_tokens: int, attn_pairs: float, cached_tokens: int = 0
    ) -> float:
        """Seconds for one prefill batch (see :mod:`disaggsim.costmodel.interface`)."""
        return sum(self._parts(0, 0, num_seqs, new_tokens, attn_pairs))

    def decode_coeffs(self, batch: int) -> tuple[float, float]:
        """``(base_s, per_context_token_s)`` of the KV-stream-bound line: a decode step over
        ``batch`` sequences holding C cached tokens in all takes ``base_s +
        per_context_token_s × C`` seconds whenever the KV stream outlasts the attention
        kernel's per-item work (C above :meth:`decode_knee_tokens`: sequences longer than a
        few hundred tokens). Below the knee the step is the larger of this and
        :meth:`decode_item_coeffs`' line (:meth:`decode_time_s` takes it)."""
        return self._decode_lines(batch)[0]

    def decode_item_coeffs(self, batch: int) -> tuple[float, float]:
        """``(base_s, per_context_token_s)`` of the item-bound line (see
        :meth:`decode_coeffs`); it lies above the stream-bound line only below the knee.
        With an eager engine's launch floor (``launch_per_layer_s``) it is the longer of the
        item work and the launches, constant in C (the decode kernel's item work is then
        constant in C too: a fit with ``overlap`` 1, or 0 where the item work rides on the
        stream line)."""
        return self._decode_lines(batch)[1]

    def decode_min_coeffs(self, batch: int) -> tuple[tuple[float, float], ...]:
        """Further ``(base_s, per_context_token_s)`` lines of the kernel-bound part: a decode
        step takes the smallest of these and :meth:`decode_coeffs`' line (the larger of
        that and :meth:`decode_item_coeffs`' line). Empty but for a multi-block wave decode
        kernel (``decode_min_lines``: TensorRT-LLM's XQA, or its masked MHA where the
        profile fits it as one; one line per split count its rule takes,
        :meth:`decode_coeffs` the most split)."""
        if not self.decode_min_lines or batch <= 0:
            return ()
        self._decode_lines(batch)
        return self._min_cache[batch]

    def _wave_lines(self, batch: int) -> tuple[tuple[float, float], ...]:
        """Per layer: the wave decode kernel's lines at ``batch`` (ops.decode_wave_min_lines)."""
        hit = self._wave_cache.get(batch)
        if hit is None:
            hit = self._wave_cache[batch] = decode_wave_min_lines(
                self.profile.peaks,
                self._dec,
                float(batch),
                float(self.kv_heads_per_gpu),
                float(self.model.head_dim),
                self._kv_elem,
                self._q_per_kv,
            )
        return hit

    def decode_interval_coeffs(self, batch: int) -> tuple[tuple[float, tuple[float, float]], ...]:
        """``(from_context_tokens, (base_s, per_context_token_s))`` of the stream-bound line
        over each further context interval, in order: from ``from_context_tokens`` (C, all
        sequences together; ``⌈C / batch − 1⌉`` cached tokens per sequence) up to the next
        entry's, the stream-bound line is this one instead of :meth:`decode_coeffs`' (which
        holds below the first). Empty but for a kernel with an occupancy term over enough work items
        (``decode_interval_lines``: TensorRT-LLM's masked MHA, whose resident blocks fall as
        the sequences grow: ``ops.mmha_occupancy_regimes``); the item line is unchanged."""
        if not self.decode_interval_lines or batch <= 0:
            return ()
        hit = self._interval_cache.get(batch)
        if hit is None:
            # equal lengths: ops' whole tokens per sequence, ceil(C / batch - 1), reach
            # hist once C > batch × hist
            hit = self._interval_cache[batch] = tuple(
                (batch * hist + 1.0, line) for hist, line in self.decode_longest_coeffs(batch)
            )
        return hit

    def decode_longest_coeffs(self, batch: int) -> tuple[tuple[float, tuple[float, float]], ...]:
        """``(from_history_tokens, (base_s, per_context_token_s))`` of the stream-bound line
        by the batch's longest sequence, in order: while the longest sequence holds at least
        ``from_history_tokens`` cached tokens (and fewer than the next entry's), the
        stream-bound line is this one instead of :meth:`decode_coeffs`' (which holds below
        the first). The kernel sizes every block's shared memory by the longest sequence
        (TensorRT-LLM's ``params.timestep``, the batch's longest past KV length), so one
        long sequence sets the resident blocks of the whole batch. Empty where
        :meth:`decode_interval_coeffs` is."""
        if not self.decode_interval_lines or batch <= 0:
            return ()
        hit = self._longest_cache.get(batch)
        if hit is not None:
            return hit
        d = self._dec
        work = _dec_work_heads(d, float(self.kv_heads_per_gpu), self._reread_group)
        out: list[tuple[float, tuple[float, float]]] = []
        if batch * work >= MMHA_UNTUNED_BLOCKS_PER_SM * d.occupancy_sms:
            base, per0 = self._decode_lines(batch)[0]
            last = per0
            for hist, _ in self._occ_regimes[1:]:
                per = self._stream_per_token_s(batch, hist)
                if per != last:
                    out.append((hist, (base, per)))
                    last = per
        hit = self._longest_cache[batch] = tuple(out)
        return hit

    def _stream_per_token_s(self, batch: int, history_tokens: float) -> float:
        """Seconds per context token (all layers) of the line-form decode kernel's KV stream
        at ``batch`` over sequences of ``history_tokens`` cached tokens."""
        d = self._dec
        hkv = float(self.kv_heads_per_gpu)
        per_byte = _dec_per_byte_s(
            self._hbm, d, batch, hkv, self._reread_group, self._reread_bytes_per_s, self._q_per_kv
        )
        if d.block_bytes_per_s > 0.0:
            work = _dec_work_heads(d, hkv, self._reread_group)
            occ = _dec_occ_per_byte_s(d, float(batch), work, self._reread_group, history_tokens)
            per_byte = max(per_byte, occ)
        return self.model.num_layers * (2.0 * hkv * self.model.head_dim * self._kv_elem * per_byte)

    def decode_knee_tokens(self, batch: int) -> float:
        """Context tokens (all sequences together) above which the kernel-bound part of the
        step outlasts the item-bound line; 0 when it does at every context. With one
        kernel line, where the two lines cross. A wave kernel's kernel-bound part is the
        smallest of its lines (:meth:`decode_min_coeffs`), concave and rising in C: it
        outlasts the item line once every one of its lines does, past the largest of their
        crossings."""
        stream, item = self._decode_lines(batch)
        return max(
            decode_knee_tokens(line, item) for line in (stream, *self.decode_min_coeffs(batch))
        )

    def _decode_lines(self, batch: int) -> tuple[tuple[float, float], tuple[float, float]]:
        hit = self._decode_cache.get(batch)
        if hit is not None:
            return hit
        if batch <= 0:
            lines = ((0.0, 0.0), (0.0, 0.0))
        elif self._wave:  # the wave kernel's lines over the rest of the step
            layers = self.model.num_layers
            parts = self._parts(batch, 0, 0, 0, 0.0)
            base_items = sum(parts)  # C = 0 (with the launches the kernels do not hide)
            unhidden = unhidden_launches_s(self._launch_s, sum(parts[:4]))
            rest = base_items - unhidden - parts[1]  # all but the attention kernel
            kernel = [(rest + layers * b0, layers * k0) for b0, k0 in self._wave_lines(batch)]
            self._min_cache[batch] = tuple(kernel[:-1])
            # the item line: the step at C = 0, constant (the launches' floor where any)
            lines = (kernel[-1], (base_items, 0.0))
        else:
            d = self._dec
            hkv = float(self.kv_heads_per_gpu)
            layers = self.model.num_layers
            parts = self._parts(batch, 0, 0, 0, 0.0)
            base_items = sum(parts)  # C = 0: the whole item work (or the launches)
            # the launches' excess over the kernels at C = 0: in the constant line only
            unhidden = unhidden_launches_s(self._launch_s, sum(parts[:4]))
            work = _dec_work_heads(d, hkv, self._reread_group)
            items = layers * d.per_seq_kv_elem_s * batch * work * self.model.head_dim
            if d.per_item_s > 0.0 or d.per_q_elem_s > 0.0:
                items += layers * _dec_item_terms_s(
                    d, batch, work, hkv, float(self.model.head_dim), self._q_per_kv
                )
            per_token = self._stream_per_token_s(batch, 0.0)
            stream_base = base_items - unhidden - d.overlap * items
            fill = layers * _dec_fill_s(d, batch * work)
            lines = (
                (stream_base + fill, per_token),
                (base_items, (1.0 - d.overlap) * per_token if self._launch_s == 0.0 else 0.0),
            )
            if d.split_fill_s > 0.0:  # the stream at the few items' bandwidth share
                share = per_token * (1.0 + d.par_half_sat / (batch * work))
                self._min_cache[batch] = ((stream_base, share),)
        self._decode_cache[batch] = lines
        return lines

    def decode_time_s(
        self, batch: int, context_tokens: int, longest_history_tokens: float | None = None
    ) -> float:
        """Seconds of one decode step (:func:`~disaggsim.costmodel.interface.
        decode_step_time_s`; ``longest_history_tokens``: the cached tokens of the batch's
        longest sequence, None for sequences of equal length)."""
        return decode_step_time_s(self, batch, context_tokens, longest_history_tokens)

    def mixed_time_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        prefill_cached_tokens: int = 0,
        decode_longest_history_tokens: float | None = None,
    ) -> float:
        """Seconds for one chunked step: ``decode_batch`` decode tokens and a prefill part
        share every GEMM (m = decode_batch + prefill_tokens); attention runs twice.
        ``decode_longest_history_tokens``: the cached tokens of the longest decoding
        sequence (None: sequences of equal length), for a kernel that sizes its shared
        memory by it (:meth:`decode_longest_coeffs`)."""
        return sum(
            self._parts(
                decode_batch,
                decode_context_tokens,
                prefill_seqs,
                prefill_tokens,
                prefill_attn_pairs,
                decode_longest_history_tokens,
            )
        )

    # --- breakdown for the CLI and notebooks ----------------------------------------

    def gemm_layer_times_s(self, tokens: float) -> tuple[float, ...]:
        """Seconds of each of one layer's GEMMs (QKV, O, up (+gate), down) over ``tokens``
        tokens: the parts a step's ``gemm_s`` sums (per layer, then over the layers)."""
        m = float(tokens)
        if self._tiles is None:
            return tuple(
                _gemm_s(self._gemm_peak, self._hbm, self._gemm, m, n, k, self._gemm_elem)
                for n, k in self._gemm_shapes
            )
        return tuple(
            _tiled_gemm_s(self._gemm_peak, self._hbm, self._tiles, m, n, k)
            for n, k in self._gemm_shapes
        )

    def breakdown(
        self,
        *,
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
        prefill_seqs: int = 0,
        prefill_tokens: int = 0,
        prefill_attn_pairs: float = 0.0,
        decode_longest_history_tokens: float | None = None,
    ) -> StepBreakdown:
        """Per-part seconds of one iteration (any mix of decode and prefill;
        ``decode_longest_history_tokens`` as :meth:`mixed_time_s`)."""
        return StepBreakdown(
            *self._parts(
                decode_batch,
                decode_context_tokens,
                prefill_seqs,
                prefill_tokens,
                prefill_attn_pairs,
                decode_longest_history_tokens,
            )
        )

    def _parts(
        self,
        decode_batch: int,
        decode_context_tokens: float,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        decode_longest_history_tokens: float | None = None,
    ) -> tuple[float, float, float, float, float, float]:
        m = float(decode_batch + prefill_tokens)
        if m <= 0:
            return (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        model = self.model
        layers = model.num_layers
        hbm = self._hbm
        hidden = float(model.hidden)
        hd = float(model.head_dim)

        gemm_layer = self._gemm_layer_cache.get(m)
        if gemm_layer is None:
            gemm_layer = self._gemm_layer_cache[m] = sum(self.gemm_layer_times_s(m))

        attn_layer = 0.0
        if prefill_tokens > 0:
            attn_layer += _prefill_attention_s(
                self._bf16_peak,
                self._pre,
                float(prefill_seqs),
                float(prefill_tokens),
                float(prefill_attn_pairs),
                float(self.heads_per_gpu),
                hd,
            )
        if decode_batch > 0 and self._wave:
            c = decode_context_tokens
            attn_layer += min(b0 + k0 * c for b0, k0 in self._wave_lines(decode_batch))
        elif decode_batch > 0:
            d = self._dec
            hkv_dec = float(self.kv_heads_per_gpu)
            kv_bytes = 2.0 * decode_context_tokens * hkv_dec * hd * self._kv_elem
            work = _dec_work_heads(d, hkv_dec, self._reread_group)
            items = d.per_seq_kv_elem_s * decode_batch * work * hd
            if d.per_item_s > 0.0 or d.per_q_elem_s > 0.0:
                items += _dec_item_terms_s(d, decode_batch, work, hkv_dec, hd, self._q_per_kv)
            per_byte = _dec_per_byte_s(
                hbm,
                d,
                decode_batch,
                hkv_dec,
                self._reread_group,
                self._reread_bytes_per_s,
                self._q_per_kv,
            )
            if d.block_bytes_per_s > 0.0:  # masked MHA's resident blocks: by the longest
                hist = (
                    math.ceil(decode_context_tokens / decode_batch - 1.0)
                    if decode_longest_history_tokens is None
                    else decode_longest_history_tokens
                )
                occ = _dec_occ_per_byte_s(d, float(decode_batch), work, self._reread_group, hist)
                per_byte = max(per_byte, occ)
            stream = kv_bytes * per_byte
            stream += _dec_shortfall_s(d, stream, decode_batch * work)
            attn_layer += (
                _dec_floor_s(d, decode_batch, hkv_dec)
                + d.per_seq_s * decode_batch
                + max(items, stream)
                + (1.0 - d.overlap) * min(items, stream)
            )

        a = float(ACT_BYTES)
        ew = self._ew
        hq, hkv = float(self.heads_per_gpu), float(self.kv_heads_per_gpu)
        ffn_shard = self._gemm_shapes[3][1]
        ew_layer = (
            2.0 * _elementwise_s(hbm, ew, 2.0 * m * hidden * a)  # input and post-attention norms
            + _elementwise_s(hbm, ew, 2.0 * m * (hq + hkv) * hd * a)  # rope on q and k
            + _elementwise_s(hbm, ew, m * 2.0 * hkv * hd * (a + self._kv_elem))  # KV write
            + _elementwise_s(hbm, ew, (3.0 if model.gated_mlp else 2.0) * m * ffn_shard * a)
            + 2.0 * _elementwise_s(hbm, ew, 3.0 * m * hidden * a)  # two residual adds
        )
        ew_layer = _fp8_quant_s(hbm, ew, m, self._quant_k, ew_layer)  # () unless FP8

        ar_layer = 0.0
        if self.tp > 1:
            ar_layer = 2.0 * allreduce_s(self.tp_layout, self._ar_protocols, m * hidden * a)

        out_seqs = float(decode_batch + prefill_seqs)
        lm_head = 0.0
        if out_seqs > 0:
            lm_gemm, lm_peak, lm_elem, lm_tiles = self._lm_head_gemm
            lm_head = _elementwise_s(hbm, ew, 2.0 * out_seqs * hidden * a) + (
                _gemm_s(lm_peak, hbm, lm_gemm, out_seqs, self._lm_head_n, hidden, lm_elem)
                if lm_tiles is None
                else _tiled_gemm_s(lm_peak, hbm, lm_tiles, out_seqs, self._lm_head_n, hidden)
            )
        overhead = self._ov.host_s(out_seqs, m)
        if self._launch_s > 0.0:  # launches the layers' kernels do not hide
            kernels = layers * (gemm_layer + attn_layer + ew_layer + ar_layer)
            overhead += unhidden_launches_s(self._launch_s, kernels)
        return (
            layers * gemm_layer,
            layers * attn_layer,
            layers * ew_layer,
            layers * ar_layer,
            lm_head,
            overhead,
        )

    def __repr__(self) -> str:
        return (
            f"RooflineWorkerCost({self.model.id}, {self.gpu.id}, tp={self.tp}, "
            f"weights={self.weight_dtype}, kv={self.kv_dtype}, engine={self.engine}, "
            f"attention={self.decode_backend}/{self.prefill_backend})"
        )


VOCAB_BYTES_PER_PARAM = 2
"""The embedding and LM head stay 16-bit whatever the weight dtype: FP8 checkpoints
quantise the linear layers only (ModelOpt's FP8 config, which TensorRT-LLM's
``--quantization FP8`` runs, disables ``*lm_head*``; an embedding is a lookup, not a
GEMM), as the MoE cost model's ``weights_breakdown_bytes_per_gpu`` also counts them."""


def vocab_params_per_gpu(model: ModelSpec, tp: int) -> int:
    """Parameters of the embedding (token and learned position) and the untied LM head one
    GPU of a TP group stores (the vocabulary sharded)."""
    vocab = -(-model.vocab // tp)
    emb = vocab * model.hidden + model.learned_positions * model.hidden
    return emb + (0 if model.tied_embeddings else vocab * model.hidden)


def _params_per_gpu(model: ModelSpec, tp: int) -> int:
    """Parameters one GPU of a TP group stores: sharded linear layers and vocabulary,
    replicated norms, row-parallel biases, position embeddings and (when tp > kv_heads)
    KV-head weights."""
    hq = model.num_heads // tp
    hkv = max(model.num_kv_heads // tp, 1)
    hd = model.head_dim
    ffn = -(-model.ffn // tp)
    vocab = -(-model.vocab // tp)
    qkv_out = (hq + 2 * hkv) * hd
    mlp_in = (2 if model.gated_mlp else 1) * ffn
    layer = model.hidden * qkv_out + hq * hd * model.hidden + mlp_in * model.hidden
    layer += ffn * model.hidden
    if model.linear_bias:
        layer += qkv_out + model.hidden + mlp_in + model.hidden
    elif model.qkv_bias:
        layer += qkv_out
    norm = (2 if model.norm == "layernorm" else 1) * model.hidden
    layer += 2 * norm
    emb = vocab * model.hidden + model.learned_positions * model.hidden
    lm_head = 0 if model.tied_embeddings else vocab * model.hidden
    return model.num_layers * layer + emb + lm_head + norm


def util_to_fit(hbm_bytes: float, needed_bytes: float, gpu_mem_util: float) -> str:
    """``"gpu_mem_util >= X"``: the smallest share of device memory (rounded up to 0.01)
    that holds ``needed_bytes`` per GPU (weights, reserves and one token of KV), when it is
    above ``gpu_mem_util`` and at most 1; else ``""`` (raising it would not help)."""
    share = math.ceil(100.0 * needed_bytes / hbm_bytes) / 100.0
    return f"gpu_mem_util >= {share:.2f}" if gpu_mem_util < share <= 1.0 else ""


def build_worker_cost(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = 1,
    *,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    engine: str | EngineProfile = "vllm",
    gpu_mem_util: float = 0.9,
    activation_reserve_bytes: float | None = None,
    profile: HardwareProfile | str | Path | None = None,
    attention_backend: str = "auto",
    gpus_per_node: int | None = None,
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
    max_batch_seqs: int = DEFAULT_BATCH_SEQS,
) -> RooflineWorkerCost:
    """A roofline cost model for one worker of ``tp`` × ``gpu`` serving ``model``.

    Parameters
    ----------
    model, gpu
        Catalog ids or specs.
    tp
        Tensor-parallel degree (GPUs in the worker); must shard the heads
        (:func:`valid_tps`).
    weight_dtype, kv_dtype
        ``bf16``/``fp16`` (2 bytes) or ``fp8`` (1 byte). FP8 weights use the profile's
        FP8 GEMM parameters and peak; FP8 KV halves KV bytes.
    engine
        Serving-engine profile (:mod:`disaggsim.hardware.engines`): ``vllm``, ``sglang``,
        ``trtllm``, ``vllm-eager-2023`` (aliases ``cuda-graphs`` = ``vllm``, ``eager`` =
        ``vllm-eager-2023``), or an :class:`EngineProfile`.
    gpu_mem_util
        Share of device memory the engine may use (weights + activations + KV), (0, 1].
    activation_reserve_bytes
        Bytes per GPU the engine holds besides weights and KV cache (activations,
        workspaces, communication buffers); None: the engine's own reserve for this
        model, TP and batch limits (:mod:`disaggsim.costmodel.reserve`).
    profile
        A loaded profile or a path to one; default: the profile shipped for ``gpu``.
    attention_backend
        ``auto`` (the engine's own kernels, :func:`pick_attention_backends`) or a backend
        the profile fits (:data:`disaggsim.hardware.profile.ATTENTION_BACKENDS`).
    gpus_per_node
        GPUs per node (NVLink domain) of the cluster: a topology fabric's
        ``gpus_per_node``; None: the GPU catalog's. Decides whether the TP group's
        all-reduce stays in one node or is hierarchical (:mod:`.tp_layout`).
    max_batch_tokens, max_batch_seqs
        The worker's batch limits (a pool's ``max_batch_tokens`` / ``max_batch_seqs``):
        the engine's activation memory is sized by them (:mod:`.reserve`).

    Raises
    ------
    UserError
        Unknown ids or options, an invalid TP degree, or weights that do not fit.
    """
    m = get_model(model)
    g = get_gpu(gpu)
    if not m.is_dense:  # MoE / MLA / windowed models: disaggsim.costmodel.moe, TP layout
        from disaggsim.costmodel.moe import build_moe_worker_cost

        return build_moe_worker_cost(  # type: ignore[return-value]
            m,
            g,
            tp,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            engine=engine,
            gpu_mem_util=gpu_mem_util,
            activation_reserve_bytes=activation_reserve_bytes,
            profile=profile,
            max_seqs=max_batch_seqs,
            max_batch_tokens=max_batch_tokens,
        )
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UserError(f"tp must be a positive integer, got {tp!r}")
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise UserError(f"gpus_per_node: must be a positive integer, got {gpus_per_node!r}")
    tps = valid_tps(m)
    if tp not in tps:
        raise UserError(
            f"tp {tp} does not shard model {m.id} ({m.num_heads} heads, {m.num_kv_heads} KV "
            f"heads): allowed tp: {', '.join(map(str, tps))}"
        )
    if weight_dtype not in WEIGHT_DTYPES:
        raise UserError(
            f"unknown weight dtype {weight_dtype!r} (allowed: {', '.join(WEIGHT_DTYPES)})"
        )
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"unknown KV dtype {kv_dtype!r} (allowed: {', '.join(KV_DTYPES)})")
    if not 0.0 < gpu_mem_util <= 1.0:
        raise UserError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util!r}")
    if activation_reserve_bytes is not None and not float(activation_reserve_bytes) >= 0:
        raise UserError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes!r}")
    for name, limit in (("max_batch_tokens", max_batch_tokens), ("max_batch_seqs", max_batch_seqs)):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UserError(f"{name} must be a positive integer, got {limit!r}")
    if isinstance(profile, HardwareProfile):
        prof = profile
    elif profile is None:
        prof = load_profile(g.id)
    else:
        prof = load_profile(g.id, path=profile)  # a profile fitted on another GPU is refused
    if weight_dtype == "fp8" and prof.peaks.fp8_flop_per_s <= 0:
        raise UserError(
            f"weight_dtype: {g.id} has no FP8 tensor cores for fp8 weights "
            "(allowed there: bf16, fp16)"
        )
    eng = resolve_engine(engine)

    def reserve_at(t: int) -> float:
        if activation_reserve_bytes is not None:
            return float(activation_reserve_bytes)
        return runtime_reserve_bytes(m, t, eng, max_batch_tokens, max_batch_seqs)

    reserve = reserve_at(tp)
    cost = RooflineWorkerCost(
        m,
        g,
        prof,
        tp,
        weight_dtype,
        kv_dtype,
        eng,
        gpu_mem_util,
        reserve,
        attention_backend,
        gpus_per_node,
    )
    if cost.kv_capacity_tokens < 1:
        fits = [
            t
            for t in tps
            if t > tp
            and RooflineWorkerCost(
                m,
                g,
                prof,
                t,
                weight_dtype,
                kv_dtype,
                eng,
                gpu_mem_util,
                reserve_at(t),
                attention_backend,
            ).kv_capacity_tokens
            >= 1
        ]
        util = util_to_fit(
            g.usable_bytes,
            cost.weights_bytes_per_gpu + reserve + cost.kv_bytes_per_token_per_gpu,
            gpu_mem_util,
        )
        hints = ([f"tp >= {fits[0]}"] if fits else []) + ([util] if util else [])
        hint = "use " + " or ".join(hints) if hints else "use fp8 weights or a GPU with more memory"
        raise UserError(
            f"model {m.id} ({cost.weights_bytes / 1e9:.0f} GB of {weight_dtype} "
            f"weights) does not fit on {tp} × {g.id} ({g.usable_bytes / GiB:.1f} GiB × "
            f"{gpu_mem_util:.2f}, {reserve / GiB:.1f} GiB reserved per GPU): {hint}"
        )
    return cost
