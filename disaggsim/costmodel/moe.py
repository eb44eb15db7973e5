"""Step-time and memory model of a Mixture-of-Experts worker, possibly spanning nodes.

Owns everything the dense model (:mod:`disaggsim.costmodel.step`) does not: routed and
shared experts, dense-first / interleaved MoE layers, MLA attention (via
:mod:`disaggsim.costmodel.mla`), sliding-window and chunked-attention layers, FP8
block-scaled and 4-bit expert weights, and the parallel layout of a worker:

- ``tp``: attention tensor parallelism inside one data-parallel rank (one node at most);
- ``dp``: attention data-parallel ranks; the worker has ``gpus = tp × dp`` GPUs, each DP
  rank runs attention for its own sequences and holds their KV;
- ``ep``: expert parallelism; ``ep`` divides ``gpus`` and each expert is split
  ``moe_tp = gpus / ep`` ways. With ``dp > 1`` the experts span every GPU (``ep = gpus``)
  and tokens reach them by a dispatch/combine all-to-all (DeepEP normal or low-latency
  mode) over NVLink inside a node and RDMA across nodes; with ``dp = 1`` every GPU holds
  every token and the MoE output is all-reduced, as in tensor parallelism.

A worker is one whole EP unit and serves through the unchanged
:class:`~disaggsim.costmodel.interface.WorkerCost` interface: ``batch`` counts sequences
over the whole worker, spread over the DP ranks (the busiest rank, ``ceil(B / dp)``
sequences, sets the attention time); routed tokens spread over the EP ranks by the
routing model (balanced, or AIConfigurator's power law with optional EPLB placement, or
a given imbalance factor) and the most loaded rank sets the expert and all-to-all time.

Per MoE layer and GPU the time is the router GEMM, the shared experts, the grouped
expert GEMMs (``launch + max(FLOP / (peak × eff(tokens per expert)), bytes of the touched
experts / (hbm × mem_eff))``) and the dispatch + combine all-to-all
(``latency + max(NVLink bytes / (nvlink × eff), RDMA bytes / (nic × eff))``); with
two-batch overlap the layer's non-attention compute of one micro-batch hides the
other's all-to-all. Decode stays affine in the context tokens at fixed batch: only the
attention kernels read the KV cache (sliding-window layers read ``batch × window``
tokens, a constant at fixed batch). Per-shape costs are memoised per batch size, so
the engine's cost per state change does not grow with the GPUs in a worker.

``docs/costmodel.md`` (section "MoE, MLA and expert parallelism") has the derivation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from disaggsim.catalog import GpuSpec, ModelSpec, dtype_bytes, get_gpu, get_model
from disaggsim.costmodel import step as _step
from disaggsim.costmodel.interface import decode_knee_tokens, decode_step_time_s
from disaggsim.costmodel.mla import (
    MLA_PREFILL_FORMS,
    Num,
    mla_decode_attention_s,
    mla_decode_flop_per_token,
    mla_prefill_attention_s,
    mla_prefill_flop_per_pair,
    mla_shapes,
    vmax,
)
from disaggsim.costmodel.moe_params import (
    ENGINE_EXPERT_KERNELS,
    REFERENCE_FRAMEWORK,
    AllToAllParams,
    GroupedGemmParams,
    MoeParams,
    has_tuned_config,
    load_moe_params,
)
from disaggsim.costmodel.overhead import (
    StepOverhead,
    dense_layer_launches,
    step_overhead,
    unhidden_launches_s,
)
from disaggsim.costmodel.reserve import (
    DEFAULT_BATCH_SEQS,
    DEFAULT_BATCH_TOKENS,
    runtime_reserve_bytes,
)
from disaggsim.errors import UserError
from disaggsim.hardware.engines import EngineProfile, resolve_engine
from disaggsim.hardware.profile import (
    DECODE_FIELDS_OMITTED_AT_ZERO,
    DecodeAttentionParams,
    GemmParams,
    GpuPeaks,
    HardwareProfile,
    load_profile,
)
from disaggsim.units import GiB

__all__ = [
    "A2A_CHOICES",
    "AllToAllTraffic",
    "IterationFloor",
    "ROUTINGS",
    "WEIGHT_FORMATS",
    "MoeBreakdown",
    "MoeLayout",
    "MoeWorkerCost",
    "all_to_all_time_s",
    "all_to_all_volume_bytes",
    "build_moe_worker_cost",
    "grouped_gemm_time_s",
    "unit_node_gpus",
    "unit_nodes",
    "power_law_imbalance",
    "valid_layouts",
]

WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "fp8-block", "mxfp4", "nvfp4", "released")
ROUTINGS = ("balanced", "power_law")
A2A_CHOICES = ("auto", "normal", "low_latency")
KV_DTYPES = ("bf16", "fp16", "fp8")
ACT_BYTES = 2.0
# per GPU, when the layout runs an all-to-all: DeepEP's NVLink and RDMA buffers (normal
# mode ~1 GB NVL + RDMA; low-latency mode sized for 128 tokens per rank) - a prior
A2A_BUFFER_BYTES = 2 * GiB
# element-wise launches of every layer (MoeWorkerCost._ew_layer): two norms, rope, KV
# write, two residual adds (an MLP's activation counts with the MLP)
_EW_LAUNCHES = 6
# bytes per weight element of each weight format (block scales included)
_ELEM = {
    "bf16": 2.0,
    "fp8": 1.0,
    "fp8-block": 1.0 + 4.0 / (128 * 128),  # one fp32 scale per 128x128 block
    "mxfp4": (4.0 + 8.0 / 32.0) / 8.0,  # e2m1 + one e8m0 scale per 32
    "nvfp4": (4.0 + 8.0 / 16.0) / 8.0,  # e2m1 + one e4m3 scale per 16
}


def _weighted_prompt(new_tokens: float, pairs: float, cached_tokens: float) -> float | None:
    """A length the longest of a batch's prompts reaches (in new tokens), from the batch's
    totals alone. Prompt ``i`` adds ``n_i`` new tokens after ``c_i`` cached ones (a prefix
    cache hit, or the chunks before this one) and ``n_i c_i + n_i (n_i + 1) / 2`` pairs, so
    with ``M`` the most new tokens of a prompt, ``pairs ≤ M × cached + (M + 1) × tokens /
    2`` and ``M ≥ (2 × pairs − tokens) / (2 × cached + tokens)``. Uncached, that is ``Σ n² /
    Σ n``, the token-weighted mean prompt: the longest for prompts of one length and,
    within the short ones' share, for one long prompt among short ones; with cached
    prefixes it is that or less (exact where one prompt holds every cached token and
    nearly every new one). None where there are no new tokens."""
    if new_tokens <= 0:
        return None
    return max(0.0, (2.0 * pairs - new_tokens) / (2.0 * cached_tokens + new_tokens))


def _longest_context(history_tokens: float | None) -> float | None:
    """The longest decoding sequence's context (what its step reads: its cached tokens and
    the token the step adds) from its cached tokens (None: equal lengths)."""
    return None if history_tokens is None else float(history_tokens) + 1.0


def _vmin(a: Num, b: Num) -> Num:
    """``min(a, b)`` for floats, elementwise for arrays (as ``vmax``)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a < b else b


def grouped_gemm_time_s(
    p: GroupedGemmParams,
    peak_flop_per_s: Num,
    hbm_bytes_per_s: float,
    tokens: Num,
    touched_experts: Num,
    hidden: Num,
    width: Num,
    weight_elem: Num,
    gated: bool = True,
    layer_tokens: Num = 0.0,
) -> Num:
    """Seconds of one MoE layer's routed experts on one GPU: ``tokens`` routed token
    copies (tokens × top-k reaching this GPU) over ``touched_experts`` local experts of
    intermediate size ``width`` (this GPU's shard), ``layer_tokens`` the tokens the GPU
    permutes in and reduces out (every token of the layer where each GPU holds them all).
    Floats or numpy arrays.

    ``launch_s + max(FLOP / (peak × max_eff × sat), bytes / (hbm × mem_eff)) +
    layer_tokens × hidden × 2 × 2 / (hbm × token_eff) + touched_experts × expert_s``,
    ``sat = min(t / (t + half_sat),
    width / (width + width_half_sat))``, ``t`` the tokens per touched expert. The width
    term: an expert GEMM sharded narrow (Qwen3-30B-A3B's 768 over moe_tp 8 = 96) is short
    in the down GEMM's K and the gate/up GEMM's N, so its tiles spend their time in
    prologue and epilogue, as the dense GEMM's efficiency follows ``min(m, n, k)``
    (``ops.py``). The last term is the permute and finalize kernels (the layer's tokens read
    in and their weighted sum written out), which run whatever share of the experts the GPU
    holds. ``expert_s`` is each touched expert's own cost (its group's setup and tail in
    the grouped kernel, beyond the shared launch). Parameter files without
    ``width_half_sat`` / ``token_eff`` / ``expert_s`` (0) leave those terms out.

    A set with ``tile_m_tokens`` > 0 times the compute by its tiles instead
    (:func:`grouped_gemm_tile_compute_s`)."""
    mats = 3.0 if gated else 2.0
    per_expert = tokens / vmax(touched_experts, 1.0)
    if p.tile_m_tokens > 0:
        compute_s = grouped_gemm_tile_compute_s(
            p, peak_flop_per_s, per_expert, touched_experts, hidden, width, mats
        )
    else:
        flop = 2.0 * tokens * hidden * width * mats
        sat = per_expert / (per_expert + p.half_sat)
        if p.width_half_sat > 0:
            sat = _vmin(sat, width / (width + p.width_half_sat))
        compute_s = flop / (peak_flop_per_s * vmax(p.max_eff * sat, 1e-12))
    weight_bytes = touched_experts * mats * hidden * width * weight_elem
    act_bytes = tokens * (2.0 * hidden + 2.0 * (mats - 1.0) * width) * ACT_BYTES
    t = p.launch_s + vmax(compute_s, (weight_bytes + act_bytes) / (hbm_bytes_per_s * p.mem_eff))
    if p.token_eff > 0:
        t = t + layer_tokens * hidden * 2.0 * ACT_BYTES / (hbm_bytes_per_s * p.token_eff)
    return t + touched_experts * p.expert_s


def _vceil(a: Num) -> Num:
    """``ceil(a)`` for floats, elementwise for arrays (as ``vmax``)."""
    if isinstance(a, np.ndarray):
        return np.ceil(a)
    return float(math.ceil(a))


def grouped_gemm_tile_compute_s(
    p: GroupedGemmParams,
    peak_flop_per_s: Num,
    tokens_per_expert: Num,
    touched_experts: Num,
    hidden: Num,
    width: Num,
    mats: float,
) -> Num:
    """Seconds the tensor cores of a tiled grouped GEMM take (the compute term of
    :func:`grouped_gemm_time_s` for a set with ``tile_m_tokens`` > 0).

    The kernel pads each touched expert's tokens to whole tiles of ``tile_m_tokens`` rows
    (SGLang's ``moe_align_block_size`` pads every expert's rows to ``BLOCK_SIZE_M``) and
    each GEMM's N to whole tiles of ``tile_n``: the gate/up GEMM (N = (mats - 1) × width,
    K = hidden) and the down GEMM (N = hidden, K = width). Each tile costs its K plus
    ``tile_overhead_k`` K steps (the pipeline fill before its first product and the
    epilogue after its last, which a short K cannot hide), at ``peak × max_eff``:

    ``2 × tile_m × tile_n × (up_tiles × (hidden + k0) + down_tiles × (width + k0)) /
    (peak × max_eff)``, ``up_tiles = E × ceil(t / tile_m) × ceil((mats - 1) × width /
    tile_n)``, ``down_tiles = E × ceil(t / tile_m) × ceil(hidden / tile_n)``.

    So a narrow shard (short down-GEMM K, few gate/up N tiles) and few tokens per expert
    (padded rows) lose efficiency, and a wide one with thousands of tokens per expert runs
    at ``max_eff``: the plateau the tuned SGLang rows show (Mixtral-8x7B at N = 1,792-7,168
    runs 490-608 TFLOP/s from 2,048 tokens on, docs/calibration.md), where a hyperbola in
    width or tokens keeps rising. The waves over the GPU's SMs are left continuous (the
    tiles are thousands where compute binds)."""
    m_tiles = touched_experts * _vceil(tokens_per_expert / p.tile_m_tokens)
    up_tiles = m_tiles * _vceil((mats - 1.0) * width / p.tile_n)
    down_tiles = m_tiles * _vceil(hidden / p.tile_n)
    k0 = p.tile_overhead_k
    tile_flop = 2.0 * p.tile_m_tokens * p.tile_n
    return (
        tile_flop
        * (up_tiles * (hidden + k0) + down_tiles * (width + k0))
        / (peak_flop_per_s * p.max_eff)
    )


def _expert_param_key(fmt: str) -> str:
    """The grouped-GEMM parameter set (``MoeParams.gemm``) an expert weight format runs."""
    if fmt in ("mxfp4", "nvfp4"):
        return "mxfp4"
    if fmt in ("fp8", "fp8-block"):
        return fmt
    return "bf16"


# decode-attention terms the layer model (MoeWorkerCost._attention_s) does not evaluate:
# a grouped kernel's group rate, and every optional term a profile leaves out at 0 but the
# few-item fill time (per-query-head re-reads, per-item work, XQA's waves; a term added to
# the profile later is unmodelled here until the layer model evaluates it)
_UNMODELLED_DECODE_TERMS = ("group_bytes_per_s",) + tuple(
    k for k in DECODE_FIELDS_OMITTED_AT_ZERO if k != "split_fill_s"
)


def _one_line_decode_fit(d: DecodeAttentionParams) -> bool:
    """Whether the layer model evaluates decode fit ``d`` whole: none of its
    :data:`_UNMODELLED_DECODE_TERMS` is set (FlashAttention-family fits)."""
    return all(getattr(d, k) == 0.0 for k in _UNMODELLED_DECODE_TERMS)


def _expert_peak(fmt: str, gpu: GpuSpec, peaks: GpuPeaks) -> float:
    """Tensor-core FLOP/s the expert GEMMs of weight format ``fmt`` run at on ``gpu``:
    FP4 where the GPU has FP4 tensor cores (else bf16), FP8 for FP8 formats, else bf16."""
    if fmt in ("mxfp4", "nvfp4"):
        return gpu.fp4_flop_per_s or peaks.bf16_flop_per_s
    if fmt in ("fp8", "fp8-block"):
        return peaks.fp8_flop_per_s
    return peaks.bf16_flop_per_s


@cache
def _fitted_profile(fitted_gpu: str) -> HardwareProfile:
    """The shipped profile of the GPU the MoE parameters were fitted on (the peaks and
    dense-GEMM fits ``calibration.fit_moe`` fitted against), read once."""
    return load_profile(fitted_gpu)


def _fitted_balance_flop_per_byte(fitted_gpu: str, fmt: str) -> float:
    """Expert FLOP/s over HBM bytes/s of the GPU the MoE parameters were fitted on."""
    prof = _fitted_profile(fitted_gpu)
    return _expert_peak(fmt, get_gpu(fitted_gpu), prof.peaks) / prof.peaks.hbm_bytes_per_s


def carry_half_sat(
    p: GroupedGemmParams,
    expert_peak_flop_per_s: float,
    hbm_bytes_per_s: float,
    fmt: str,
    fitted_gpu: str,
) -> GroupedGemmParams:
    """Grouped-GEMM parameters fitted on ``fitted_gpu`` carried to another GPU's peaks.

    ``half_sat`` is the tokens per expert at which the grouped GEMM reaches half its
    compute efficiency: below it a tile's weights are read for few rows and the kernel is
    held by the weight stream, not the tensor cores. Where that happens is set by the
    machine balance (FLOP per HBM byte), so ``half_sat`` scales with it: an A100
    (156 bf16 FLOP/B) saturates at about half the tokens per expert of an H100 (295),
    an H200 (206) at 0.70x. Carried unscaled, the small-m compute floor of the H100 fit
    did not follow bandwidth (Mixtral-8x7B decode on A100/H200 vs the vLLM measurements
    in ``calibration/engines``: docs/calibration.md). ``launch_s`` and ``max_eff``
    carry as they are; ``hbm_bytes_per_s`` is the GPU's peak (a GPU of the same SM
    architecture reaches the same fraction of it: docs/calibration.md, "Hopper rule")."""
    fitted = _fitted_balance_flop_per_byte(fitted_gpu, fmt)
    ratio = (expert_peak_flop_per_s / hbm_bytes_per_s) / fitted
    return replace(p, half_sat=p.half_sat * ratio)


def unit_nodes(tp: int, num_ranks: int, gpus_per_node: int) -> int:
    """Nodes a worker of ``num_ranks`` data-parallel ranks of ``tp`` GPUs spans: one when
    the whole unit fits a node, else ``ceil(num_ranks / (gpus_per_node // tp))`` nodes
    (each rank's TP group inside one node) — the fewest it can span. A topology fabric
    places units this way (a unit larger than a node on fresh nodes from their first GPU,
    as vLLM's one ``vllm serve`` per node, SGLang's ``--nnodes`` and Dynamo's
    ``multinode.nodeCount`` run them; :func:`disaggsim.fabric.topology.build_topology`),
    and the all-to-all's NVLink/RDMA split counts the same nodes."""
    return -(-num_ranks // (gpus_per_node // tp))


def unit_node_gpus(tp: int, num_ranks: int, gpus_per_node: int) -> int:
    """GPUs of such a unit in each of its nodes (the last may hold fewer): whole TP groups,
    ``min(tp × num_ranks, (gpus_per_node // tp) × tp)``."""
    return min(tp * num_ranks, (gpus_per_node // tp) * tp)


def all_to_all_volume_bytes(
    tokens_per_gpu: Num,
    payload_bytes: float,
    top_k: int,
    ep: int,
    gpus_per_node: int,
    mode: str,
) -> tuple[Num, Num]:
    """Expected bytes one GPU sends over NVLink and over RDMA in one dispatch (or
    combine) of ``tokens_per_gpu`` tokens, each going to ``top_k`` experts spread
    uniformly over ``ep`` ranks on ``ceil(ep / gpus_per_node)`` nodes.

    ``normal`` (DeepEP high-throughput): one copy per distinct destination rank inside
    the node, one RDMA copy per distinct remote node (forwarded over NVLink there).
    ``low_latency``: one copy per selected expert, straight to its rank."""
    r = min(ep, gpus_per_node)
    nodes = -(-ep // gpus_per_node)
    k = float(top_k)
    if mode == "normal":
        nv_copies = (r - 1) * (1.0 - (1.0 - 1.0 / ep) ** k)
        rdma_copies = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k) if nodes > 1 else 0.0
    else:
        nv_copies = k * (r - 1) / ep
        rdma_copies = k * (ep - r) / ep
    return (
        tokens_per_gpu * nv_copies * payload_bytes,
        tokens_per_gpu * rdma_copies * payload_bytes,
    )


def all_to_all_time_s(
    p: AllToAllParams,
    nvlink_bytes: Num,
    rdma_bytes: Num,
    nodes: Num,
    nvlink_bytes_per_s: float,
    nic_bytes_per_s: float,
) -> Num:
    """Seconds of one dispatch or combine on one GPU: latency (plus the RDMA path's own
    latency when the EP group spans nodes) + the slower of its NVLink and RDMA traffic
    (the two links run in parallel)."""
    nv = nvlink_bytes / (nvlink_bytes_per_s * p.nvlink_eff)
    rd = rdma_bytes / (nic_bytes_per_s * p.rdma_eff)
    return p.latency_s + p.rdma_latency_s * (nodes > 1) + vmax(nv, rd)


def power_law_imbalance(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    ep: int,
    alpha: float,
    redundant_experts: int | None = None,
    draws: int = 16,
    seed: int = 0,
) -> float:
    """Expected load of the most loaded EP rank over the mean rank load when expert loads
    follow AIConfigurator's power law (each expert's load drawn from a power law on
    [1, 0.8 × tokens], scaled to tokens × top_k; experts placed contiguously, E / ep per
    rank). With ``redundant_experts`` (EPLB; 0 = rebalance without copies) the hottest
    experts get extra replicas (each added where the load per replica is highest) and
    the slots are packed onto ranks by longest-processing-time first. Deterministic:
    ``draws`` draws from ``numpy.random.default_rng(seed)``."""
    if ep <= 1:
        return 1.0
    rng = np.random.default_rng(seed)
    m = max(int(num_tokens), 1)
    lo, hi = (1.0, 0.8 * m) if m * top_k > num_experts else (0.01, 2.0)
    hi = max(hi, lo * 1.0001)
    total = float(m * top_k)
    ratios = []
    for _ in range(draws):
        u = rng.random(num_experts)
        a1 = 1.0 - alpha
        if abs(a1) < 1e-9:
            x = lo * (hi / lo) ** u
        else:  # lo ((hi^a1 - lo^a1) u / lo^a1 + 1)^(1/a1): no power overflows (a1 < 1)
            x = lo * (1.0 + u * ((hi / lo) ** a1 - 1.0)) ** (1.0 / a1)
        load = x / x.sum() * total
        if redundant_experts is None:
            ranks = load.reshape(ep, -1).sum(axis=1) if num_experts % ep == 0 else None
            if ranks is None:
                raise ValueError("ep must divide the experts without EPLB")
        else:
            ranks = _eplb_rank_loads(load, redundant_experts, ep)
        ratios.append(ranks.max() / (total / ep))
    return float(np.mean(ratios))


def _eplb_rank_loads(load: np.ndarray, redundant: int, ep: int) -> np.ndarray:
    slots = len(load) + redundant
    replicas = np.ones(len(load))
    for _ in range(redundant):
        replicas[int(np.argmax(load / replicas))] += 1
    per_slot = np.repeat(load / replicas, replicas.astype(int))
    order = np.argsort(-per_slot, kind="stable")
    cap = slots // ep
    rank_load = np.zeros(ep)
    rank_fill = np.zeros(ep, dtype=int)
    for i in order:
        open_ = np.flatnonzero(rank_fill < cap)
        j = open_[int(np.argmin(rank_load[open_]))]
        rank_load[j] += per_slot[i]
        rank_fill[j] += 1
    return rank_load


@dataclass(frozen=True, slots=True)
class MoeLayout:
    """How one worker lays a model over its GPUs, and the MoE serving options."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    redundant_experts: int | None = None  # EPLB redundant expert slots (None: no EPLB)
    routing: str = "balanced"
    power_law_alpha: float = 1.01
    imbalance_factor: float = 1.0
    all_to_all: str = "auto"
    two_batch_overlap: bool = False
    mla_prefill: str = "absorbed"

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def moe_tp(self) -> int:
        return self.gpus // self.ep

    @property
    def is_default(self) -> bool:
        return self == MoeLayout(tp=self.tp)


@dataclass(frozen=True, slots=True)
class IterationFloor:
    """A lower bound on the time of every iteration of one MoE worker
    (:meth:`MoeWorkerCost.iteration_floor`): with ``m`` tokens in the worker (decode
    sequences plus prefill tokens), ``C`` decode context tokens and ``P`` prefill
    attention pairs, the cost model's iteration takes at least

        fixed_s + max(compute_s_per_token · m,
                      weight_s + weight_s_per_token · m
                      + expert_s · min(local_experts, copies_per_token · m))
                + serial_s_per_token · m + kv_s_per_context_token · C + attn_s_per_pair · P

    seconds. The GEMMs of one GPU (projections, dense and shared-expert MLPs, router,
    routed experts) each take at least the longer of their FLOPs at their best efficiency
    and their weight and activation reads, so together at least the longer of the two
    sums; element-wise kernels and kernel launches are taken as the cost model has them;
    the full-attention layers' KV reads and prefill attention FLOPs at their best rate;
    the engine's fixed host time and its time per token; all-reduces and the all-to-all
    at their latency (with two-batch overlap one half's all-to-all stays exposed). Left
    out: attention kernel floors, the all-to-all's and all-reduces' bytes, MLA's absorbed
    BMMs, the LM head, windowed layers' attention, load imbalance, the engine's time per
    sequence and an eager engine's launches. The busiest GPU takes at least the
    average GPU's share, so ``m / dp`` tokens a rank.

    ``time_s(m) / m`` does not rise with ``m`` (fixed costs and weight reads are shared
    by the iteration's tokens), so ``n`` tokens served in iterations of at most ``M``
    tokens take at least ``n · time_s(M) / M`` (:meth:`token_floor_s`)."""

    fixed_s: float
    compute_s_per_token: float
    weight_s: float
    weight_s_per_token: float  # activations the GEMMs read and write
    expert_s: float
    local_experts: float
    copies_per_token: float
    serial_s_per_token: float  # element-wise kernels
    kv_s_per_context_token: float
    attn_s_per_pair: float

    def time_s(self, tokens: float, context_tokens: float = 0.0, pairs: float = 0.0) -> float:
        """The floor of one iteration of ``tokens`` tokens (0 for an empty one)."""
        if tokens <= 0:
            return 0.0
        weights = (
            self.weight_s
            + self.weight_s_per_token * tokens
            + self.expert_s * min(self.local_experts, self.copies_per_token * tokens)
        )
        return (
            self.fixed_s
            + max(self.compute_s_per_token * tokens, weights)
            + self.serial_s_per_token * tokens
            + self.kv_s_per_context_token * context_tokens
            + self.attn_s_per_pair * pairs
        )

    def token_floor_s(self, max_tokens: float) -> float:
        """Seconds per token at least, over iterations of at most ``max_tokens`` tokens
        (context and pairs aside)."""
        return self.time_s(max_tokens) / max_tokens


@dataclass(frozen=True, slots=True)
class AllToAllTraffic:
    """One iteration's expert all-to-all as traffic (per MoE layer, per GPU of the busiest
    rank): what an engine needs to move it as flows on a topology fabric, where it would
    contend with KV handoffs. ``num_layers`` dispatch+combine pairs run per iteration."""

    mode: str  # "normal" | "low_latency" ("" when the layout has no all-to-all)
    num_layers: int
    nodes: int
    dispatch_nvlink_bytes: float
    dispatch_rdma_bytes: float
    combine_nvlink_bytes: float
    combine_rdma_bytes: float


@dataclass(frozen=True, slots=True)
class MoeBreakdown:
    """Seconds of one iteration by part (whole worker, the busiest GPU's view);
    ``total_s`` is their sum. ``overlap_s`` (<= 0 when two-batch overlap hides
    all-to-all time, > 0 when splitting the batch costs more than it hides)."""

    attention_gemm_s: float  # QKV/O (GQA) or MLA projections and absorbed BMMs
    attention_s: float  # attention kernels (prefill and decode)
    dense_mlp_s: float  # dense MLP layers (DeepSeek's first three, Llama 4's even ones)
    router_s: float
    shared_expert_s: float
    expert_gemm_s: float  # grouped routed-expert GEMMs
    dispatch_s: float
    combine_s: float
    allreduce_s: float
    elementwise_s: float
    lm_head_s: float
    overhead_s: float
    overlap_s: float

    @property
    def total_s(self) -> float:
        return sum(self.as_dict().values())

    @property
    def all_to_all_s(self) -> float:
        return self.dispatch_s + self.combine_s

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


def _gemm_s(peak: float, hbm: float, p: GemmParams, m: float, n: float, k: float, elem: float):
    """The dense GEMM roofline of ``ops.gemm_time_s`` (scalar copy, as in step.py)."""
    d = min(m, n, k)
    eff = p.max_eff * d / (d + p.half_sat)
    return p.launch_s + max(
        2.0 * m * n * k / (peak * eff), (m * k + k * n + m * n) * elem / (hbm * p.mem_eff)
    )


def _bmm_s(peak: float, hbm: float, p: GemmParams, m: float, heads: float, n: float, k: float):
    """A per-head batched GEMM (MLA's absorbed W_UK / W_UV): ``heads`` GEMMs of (m × k) @
    (k × n) launched as one kernel, bf16."""
    d = min(m, n, k)
    eff = p.max_eff * d / (d + p.half_sat)
    return p.launch_s + max(
        2.0 * m * n * k * heads / (peak * eff),
        heads * (m * k + k * n + m * n) * 2.0 / (hbm * p.mem_eff),
    )


def _ar_s(protocols, gpus: int, nbytes: float) -> float:
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    ring = 2.0 * (gpus - 1) / gpus * nbytes
    return min(lat + ring / bw for lat, bw in protocols)


class MoeWorkerCost:
    """:class:`~disaggsim.costmodel.interface.WorkerCost` of an MoE/MLA worker (one EP
    unit). Build with :func:`build_moe_worker_cost`. Protocol attributes:
    ``num_gpus`` (= tp × dp), ``kv_bytes_per_token`` (bytes per context token the engine
    allocates and a handoff moves: the layers whose KV grows with the context),
    ``kv_capacity_tokens`` (all DP ranks together), ``weights_bytes`` (all GPUs).

    Under an engine that launches its kernels from Python (``launch_per_layer_s`` > 0)
    the instance also has ``decode_item_coeffs`` and ``decode_knee_tokens``: a decode
    step is then the longer of the kernels' line in the context and the launches'
    constant line, as for a dense worker (``docs/costmodel.md``)."""

    # set in __init__ only under a launch floor (the engine looks them up with getattr)
    decode_item_coeffs: Callable[[int], tuple[float, float]]
    decode_knee_tokens: Callable[[int], float]
    # set in __init__ only with attention data parallelism (dp > 1): the busiest rank
    # holds the batch's longest sequence whole (:meth:`_rank_context`)
    decode_longest_context_coeffs: Callable[[int], tuple[float, float]]

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: HardwareProfile,
        params: MoeParams,
        layout: MoeLayout,
        weight_dtype: str,
        kv_dtype: str,
        engine: str | EngineProfile,
        gpu_mem_util: float,
        activation_reserve_bytes: float,
        max_seqs: int,
        gpus_per_node: int | None = None,
    ) -> None:
        self.model, self.gpu, self.profile, self.params = model, gpu, profile, params
        # the cluster's node size (a topology fabric's gpus_per_node), else the catalog's:
        # how many nodes an EP unit spans and which of its all-to-all goes over RDMA
        self.gpus_per_node = gpus_per_node or gpu.gpus_per_node
        self.layout = layout
        # the unit as a topology fabric places it: whole TP groups per node, the fewest
        # nodes (fabric.topology places it so; tests/test_moe_placement.py checks both)
        self.nodes = unit_nodes(layout.tp, layout.dp, self.gpus_per_node)
        self._node_gpus = unit_node_gpus(layout.tp, layout.dp, self.gpus_per_node)
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        self.engine = resolve_engine(engine).name
        self.gpu_mem_util = gpu_mem_util
        self.activation_reserve_bytes = activation_reserve_bytes
        self.max_seqs = max_seqs
        lo = layout
        self.tp, self.dp, self.ep = lo.tp, lo.dp, lo.ep
        self.num_gpus = lo.gpus
        moe = model.moe
        h = float(model.hidden)

        # --- dtypes and peaks ---------------------------------------------------------
        fmt = _resolve_format(weight_dtype, model)
        self.weight_format = fmt
        lin = _linear_dtype(fmt, model)
        self._lin_elem = 1.0 if lin == "fp8" else 2.0
        # FP8 GEMMs outside the routed experts quantise their input activations in a kernel
        # of their own, as the dense step prices them (step.FP8_QUANT_BYTES_PER_ELEM); the
        # routed experts' quantisation is inside the grouped-GEMM fits (the tables time the
        # whole fused MoE op)
        self._quant = lin == "fp8"
        peaks = profile.peaks
        self._hbm = peaks.hbm_bytes_per_s
        self._bf16 = peaks.bf16_flop_per_s
        self._lin_peak = peaks.flop_per_s(lin)
        self._lin = profile.gemm_params(lin)
        self._bf16_gemm = profile.gemm_params("bf16")
        self._expert_elem = _ELEM[fmt if fmt != "fp16" else "bf16"]
        self._expert_peak = _expert_peak(fmt, gpu, peaks)
        # the engine's own MoE kernel where the parameter file fits it (vLLM's and SGLang's
        # Triton fused_moe run 1.6x and 4x TensorRT-LLM's CUTLASS time on Mixtral prefill)
        self.expert_kernel = ENGINE_EXPERT_KERNELS.get(self.engine, REFERENCE_FRAMEWORK)
        # SGLang's Triton kernel runs tuned tiles where SGLang ships a config file for this
        # GPU's (local experts, shard width, GPU, dtype), else its default tiles: chosen
        # once per worker (moe_params.has_tuned_config)
        self.expert_tuned_tiles = model.moe is not None and has_tuned_config(
            self.expert_kernel,
            (model.moe.num_experts + (layout.redundant_experts or 0)) // layout.ep,
            model.moe.expert_ffn / layout.moe_tp,
            gpu.id,
            _expert_param_key(fmt),
        )
        self._expert_params = params.gemm(
            _expert_param_key(fmt), self.expert_kernel, self.expert_tuned_tiles
        )
        if params.transferred_from:
            self._expert_params = carry_half_sat(
                self._expert_params,
                self._expert_peak,
                peaks.hbm_bytes_per_s,
                fmt,
                params.transferred_from,
            )
        self._kv_elem = float(dtype_bytes(kv_dtype))
        # attention kernels (GQA/MHA layers: the engine's own, _pick_attention)
        self.decode_backend = self.prefill_backend = "generic"
        self._dec = profile.decode_attention_params(kv_dtype)
        self._pre = profile.prefill_attention_params("bf16")
        self._ew = profile.elementwise
        eng = resolve_engine(engine)  # disaggsim.hardware.engines: host time per iteration
        # the engine's host time and launches, as the dense model takes them
        # (costmodel/overhead.py)
        self._ov: StepOverhead = step_overhead(eng, profile, lo.tp, model.num_layers)
        self._ar_tp = profile.allreduce.protocols_for_gpus(lo.tp) if lo.tp > 1 else ()
        self._ar_all = profile.allreduce.protocols_for_gpus(lo.gpus) if lo.gpus > 1 else ()

        # --- layer counts and shapes ----------------------------------------------------
        tp = lo.tp
        self.num_moe_layers = model.num_moe_layers
        self.num_dense_layers = model.num_dense_mlp_layers
        w = model.attention_window
        self.num_window_layers = w.num_layers if w is not None else 0
        self.num_full_layers = model.num_layers - self.num_window_layers
        self.window_tokens = w.tokens if w is not None else 0
        self.window_kind = w.kind if w is not None else ""
        self.heads_per_gpu = model.num_heads // tp
        self.kv_heads_per_gpu = max(model.num_kv_heads // tp, 1)
        if model.mla is not None:
            self._mla = mla_shapes(model, tp)
            self._attn_shapes = self._mla.projections
            self._mla_flop_tok = mla_decode_flop_per_token(model.mla, self.heads_per_gpu)
            self._mla_pre_form = lo.mla_prefill
            self._mla_pre_flop = mla_prefill_flop_per_pair(
                model.mla, self.heads_per_gpu, lo.mla_prefill
            )
            self._mla_dec = params.decode(kv_dtype)
            self._mla_pre = params.mla_prefill[lo.mla_prefill]
        else:
            hq, hkv, hd = self.heads_per_gpu, self.kv_heads_per_gpu, model.head_dim
            self._attn_shapes = (
                (float((hq + 2 * hkv) * hd), h),
                (h, float(hq * hd)),
            )
            self._pick_attention(profile, eng, hq, hkv, hd, kv_dtype)
        self._dense_f = -(-model.ffn // tp)
        if moe is not None:
            self._slots = moe.num_experts + (lo.redundant_experts or 0)
            self.local_experts = self._slots // lo.ep
            self._expert_width = moe.expert_ffn / lo.moe_tp
            self._shared_f = moe.num_shared_experts * moe.shared_expert_ffn / tp
            self._top_k = moe.top_k
            self.uses_all_to_all = lo.dp > 1 and lo.ep > 1
            fp8_dispatch = fmt in ("fp8", "fp8-block") or lin == "fp8"
            self._dispatch_payload = (h + h / 128.0 * 4.0) if fp8_dispatch else h * ACT_BYTES
            self._combine_payload = h * ACT_BYTES
            self._nvlink_bw = gpu.nvlink_bytes_per_s or gpu.pcie_bytes_per_s
            self._nic_bw = gpu.nic_bytes_per_s
            self._imbalance_grid = self._imbalance_table()
        else:
            self.uses_all_to_all = False
            self.local_experts = 0
        self._lm_head_n = float(-(-model.vocab // tp))

        # --- memory -----------------------------------------------------------------------
        self.weights_bytes_per_gpu = int(self._weights_per_gpu())
        self.weights_bytes = self.weights_bytes_per_gpu * lo.gpus
        per_layer_gpu = (
            float(self._mla.cache_elems)
            if model.mla is not None
            else 2.0 * self.kv_heads_per_gpu * model.head_dim
        )
        per_layer_model = float(model.kv_elems_per_token_per_layer())
        # sliding layers keep a bounded window per sequence (reserved up front for the
        # batch); chunked layers are charged per token (exact within one chunk)
        growing = self.num_full_layers + (
            self.num_window_layers if self.window_kind == "chunked" else 0
        )
        self._kv_layers = growing
        self.kv_bytes_per_token = int(growing * per_layer_model * self._kv_elem)
        self.kv_bytes_per_token_per_gpu = growing * per_layer_gpu * self._kv_elem
        sliding = self.num_window_layers if self.window_kind == "sliding" else 0
        self.window_reserve_bytes_per_gpu = (
            -(-max_seqs // lo.dp) * self.window_tokens * sliding * per_layer_gpu * self._kv_elem
        )
        self.a2a_buffer_bytes_per_gpu = A2A_BUFFER_BYTES if self.uses_all_to_all else 0
        free = (
            gpu.usable_bytes * gpu_mem_util
            - self.weights_bytes_per_gpu
            - activation_reserve_bytes
            - self.window_reserve_bytes_per_gpu
            - self.a2a_buffer_bytes_per_gpu
        )
        per_rank = max(int(free // self.kv_bytes_per_token_per_gpu), 0)
        self.kv_capacity_tokens_per_rank = per_rank
        self.kv_capacity_tokens = per_rank * lo.dp
        self._decode_cache: dict[int, tuple[float, float]] = {}
        # a split-KV decode kernel (split_fill_s > 0: FlashAttention's) on GQA layers: its
        # stream falls short by the lesser of two amounts (ops.decode_split_shortfall_s), so
        # its decode step is the smaller of two lines, as the dense step's
        # (decode_min_coeffs)
        self.decode_min_lines = model.mla is None and self._dec.split_fill_s > 0.0
        self._min_cache: dict[int, tuple[tuple[float, float], ...]] = {}
        self._launch_cache: dict[tuple[bool, bool, bool], float] = {}
        if self._ov.launch_per_layer_s > 0.0:
            self._launch_lines: dict[int, tuple[float, float]] = {}
            self.decode_item_coeffs = self._launch_line
            self.decode_knee_tokens = self._launch_knee
        if lo.dp > 1:
            self.decode_longest_context_coeffs = self._longest_context_coeffs

    def context_kv_bytes(self, tokens: int) -> int:
        """KV bytes of one sequence of ``tokens`` tokens (all GPUs of its DP rank
        together, each TP shard once): full-attention layers keep every token, windowed
        layers (sliding or chunked) at most the window (:meth:`ModelSpec.kv_bytes`)."""
        per_layer = float(self.model.kv_elems_per_token_per_layer()) * self._kv_elem
        kept = self.num_full_layers * tokens + self.num_window_layers * min(
            tokens, self.window_tokens
        )
        return int(kept * per_layer)

    def kv_copy_gpus(self, num_seqs: int) -> float:
        """GPUs' worth of parallel links for a copy of ``num_seqs`` sequences' KV (swap):
        a sequence lives on one DP rank, spread over ``shard`` of its TP GPUs (``tp`` for
        sharded KV heads, 1 for MLA's replicated latent, each GPU copying all of it); the
        sequences spread evenly over the ranks, so the busiest rank holds
        ``ceil(n / dp)`` of them and the copy takes ``bytes × ceil(n / dp) / n / shard``
        per GPU."""
        n = max(int(num_seqs), 1)
        shard = self.kv_bytes_per_token / self.kv_bytes_per_token_per_gpu
        return n / -(-n // self.dp) * shard

    # --- routing ---------------------------------------------------------------------------

    def _imbalance_table(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Straggler factor on a log2 grid of worker tokens (1 .. 2^20), interpolated."""
        lo = self.layout
        moe = self.model.moe
        assert moe is not None
        grid = tuple(float(2**i) for i in range(21))
        if lo.routing != "power_law" or lo.ep <= 1:
            return grid, tuple(lo.imbalance_factor for _ in grid)
        vals = tuple(
            lo.imbalance_factor
            * power_law_imbalance(
                int(g), moe.num_experts, moe.top_k, lo.ep, lo.power_law_alpha, lo.redundant_experts
            )
            for g in grid
        )
        return grid, vals

    def imbalance(self, tokens: float) -> float:
        """Load of the busiest EP rank over the mean, for ``tokens`` tokens in the worker."""
        grid, vals = self._imbalance_grid
        if tokens <= grid[0]:
            return vals[0]
        if tokens >= grid[-1]:
            return vals[-1]
        x = math.log2(tokens)
        i = int(x)
        f = x - i
        return vals[i] * (1.0 - f) + vals[i + 1] * f

    # --- the WorkerCost protocol ------------------------------------------------------------

    def prefill_time_s(
        self, num_seqs: int, new_tokens: int, attn_pairs: float, cached_tokens: int = 0
    ) -> float:
        return sum(
            self._parts(
                0, 0.0, num_seqs, new_tokens, attn_pairs,
                prompt_tokens=_weighted_prompt(new_tokens, attn_pairs, cached_tokens),
            )
        )  # fmt: skip

    def decode_coeffs(self, batch: int) -> tuple[float, float]:
        hit = self._decode_cache.get(batch)
        if hit is not None:
            return hit
        if batch <= 0:
            coeffs = (0.0, 0.0)
        else:  # the kernels' line: without the launches an eager engine's step may wait for
            base = sum(self._parts(batch, 0.0, 0, 0, 0.0, launches=False))
            per = sum(self._parts(batch, 1.0e6, 0, 0, 0.0, launches=False)) - base
            coeffs = (base, per / 1.0e6)
            if self.decode_min_lines:
                coeffs = self._split_lines(batch, base, per)
        self._decode_cache[batch] = coeffs
        return coeffs

    def decode_min_coeffs(self, batch: int) -> tuple[tuple[float, float], ...]:
        """A further ``(base_s, per_context_token_s)`` line of the kernels: a decode step
        takes the smaller of this and :meth:`decode_coeffs`' line. Empty but for a
        split-KV decode kernel on GQA layers (``decode_min_lines``): the two lines are its
        stream plus its fill bound (:meth:`decode_coeffs`) and its stream at the few
        items' bandwidth share (this one), ops.decode_split_shortfall_s taken whole."""
        if not self.decode_min_lines or batch <= 0:
            return ()
        self.decode_coeffs(batch)
        return self._min_cache[batch]

    def _split_lines(self, batch: int, base: float, per: float) -> tuple[float, float]:
        """The split-KV kernel's two lines from the kernels' step at no context (``base``:
        no stream, no shortfall) and its rise to 1e6 context tokens (``per``, where the
        fill bound is the shortfall): the stream plus the fill, returned, and the stream at
        the bandwidth share, kept for :meth:`decode_min_coeffs`."""
        d = self._dec
        hkv = float(self.kv_heads_per_gpu)
        b_r = batch * self._rank_share(batch)
        # layers whose decode attention reads the whole context (sliding windows read a
        # fixed window: their shortfall is in ``base``)
        layers = self.num_full_layers + (
            self.num_window_layers if self.window_kind == "chunked" else 0
        )
        fill = layers * _step._dec_fill_s(d, b_r * hkv)
        stream_per = per / 1.0e6 - fill / 1.0e6
        self._min_cache[batch] = ((base, stream_per * (1.0 + d.par_half_sat / (b_r * hkv))),)
        return (base + fill, stream_per)

    def _launch_line(self, batch: int) -> tuple[float, float]:
        """``decode_item_coeffs`` under a launch floor: the step with the launches at no
        context, constant in it (the launches do not depend on the context and the
        kernels grow with it, so the step is the longer of this and the kernels' line)."""
        hit = self._launch_lines.get(batch)
        if hit is None:
            base = sum(self._parts(batch, 0.0, 0, 0, 0.0)) if batch > 0 else 0.0
            hit = self._launch_lines[batch] = (base, 0.0)
        return hit

    def _launch_knee(self, batch: int) -> float:
        """``decode_knee_tokens`` under a launch floor: where the kernels' line passes
        the launches'."""
        launch = self._launch_line(batch)
        return max(
            decode_knee_tokens(line, launch)
            for line in (self.decode_coeffs(batch), *self.decode_min_coeffs(batch))
        )

    def _longest_context_coeffs(self, batch: int) -> tuple[float, float]:
        """``decode_longest_context_coeffs`` (dp > 1): ``(u, v)`` such that a decode step
        whose longest sequence holds ``L`` context tokens (its cached tokens + 1) takes the
        decode lines at ``max(C, u × C + v × L)`` instead of ``C``. The lines
        (:meth:`decode_coeffs`) are in the context of sequences of equal length, on which
        the busiest rank's context is ``q × C`` (``q`` = :meth:`_rank_context` at ``C`` over
        ``C``); :meth:`_rank_context`'s longest-sequence term over ``q`` is ``u C + v L``,
        and its other term over ``q`` never exceeds ``C``."""
        if batch <= 0:
            return (0.0, 0.0)
        kappa = self._other_share(batch)
        q = self._rank_context(batch, 1.0e6, None) / 1.0e6
        return (kappa / q, (1.0 - kappa) / q)

    def decode_time_s(
        self, batch: int, context_tokens: int, longest_history_tokens: float | None = None
    ) -> float:
        """Seconds of one decode step (``longest_history_tokens``: the cached tokens of
        the batch's longest sequence; None: sequences of equal length)."""
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
        """Seconds of one chunked iteration; ``decode_longest_history_tokens`` (the
        cached tokens of the longest decoding sequence) sets the busiest DP rank's decode
        context with dp > 1 (:meth:`_rank_context`; None: sequences of equal length)."""
        return sum(
            self._parts(
                decode_batch,
                float(decode_context_tokens),
                prefill_seqs,
                prefill_tokens,
                prefill_attn_pairs,
                longest=_longest_context(decode_longest_history_tokens),
                prompt_tokens=_weighted_prompt(
                    prefill_tokens, prefill_attn_pairs, prefill_cached_tokens
                ),
            )
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
        prefill_cached_tokens: int = 0,
    ) -> MoeBreakdown:
        """:meth:`mixed_time_s`'s parts (their sum is its time for the same arguments)."""
        return MoeBreakdown(
            *self._parts(
                decode_batch,
                float(decode_context_tokens),
                prefill_seqs,
                prefill_tokens,
                prefill_attn_pairs,
                longest=_longest_context(decode_longest_history_tokens),
                prompt_tokens=_weighted_prompt(
                    prefill_tokens, prefill_attn_pairs, prefill_cached_tokens
                ),
            )
        )

    # --- one iteration ------------------------------------------------------------------------

    def _rank_share(self, count: int) -> float:
        """Share of ``count`` items the busiest DP rank gets: ceil(count / dp) / count."""
        if count <= 0:
            return 0.0
        return (-(-count // self.dp)) / count

    def _other_share(self, count: int) -> float:
        """Share of the other sequences' context on the rank holding the longest one:
        its ``r - 1`` other slots of the ``dp × r`` the ranks hold (``r = ceil(count /
        dp)``), ``(r - 1) / (dp × r)``; nondecreasing in ``count``."""
        r = -(-count // self.dp)
        return (r - 1) / (self.dp * r)

    def _rank_context(self, b: int, ctx: float, longest: float | None) -> float:
        """Decode context tokens on the busiest DP rank: ``b`` sequences of ``ctx`` tokens
        in all, the longest holding ``longest`` (None: sequences of equal length,
        ``ctx / b``). A sequence lives whole on one rank, so the busiest rank holds at
        least the longest sequence, and at least the mean rank's ``ctx / dp``; the rank
        holding the longest sequence also holds ``r - 1`` other sequences, taken at the
        other sequences' context per rank slot, ``(ctx - L) / (dp × r)`` each:

            max(ctx / dp, L + (ctx - L) × (r - 1) / (dp × r)),   r = ceil(b / dp).

        Nondecreasing as a sequence joins (``r`` and ``ctx - L`` never fall, ``L`` and
        ``ctx`` grow) or any context grows, so a step never gets faster by either. The
        rule it replaces, ``ctx × r / b`` (the mean sequence on each of ``r`` slots), fell
        as a short sequence joined (one 10,000-token sequence, then a 100-token one on 2
        ranks: 10,000 → 5,050). Equal to it for sequences of equal length when ``dp``
        divides ``b``; below it otherwise, where it counted the extra slot at the mean
        (docs/costmodel.md)."""
        if b <= 0:
            return 0.0
        if self.dp == 1:
            return ctx
        ell = ctx / b if longest is None else longest
        return max(ctx / self.dp, ell + (ctx - ell) * self._other_share(b))

    def _rank_prompts(
        self, s: int, n: float, pairs: float, ell: float, n_r: float, pairs_r: float
    ) -> tuple[float, float]:
        """New tokens and attention pairs on the busiest DP rank of ``s`` prompts of ``n``
        tokens and ``pairs`` pairs in all, one of which holds at least ``ell`` new tokens
        (and so at least ``ell (ell + 1) / 2`` pairs, more after a cached prefix): a
        prompt is prefilled whole on one rank, so that rank holds it and ``r - 1`` other
        slots at the other prompts' share (:meth:`_rank_context`'s rule): ``ell + (n -
        ell) × (r - 1) / (dp × r)``, each
        at most the whole batch's, and never below the mean share ``n_r``, ``pairs_r``
        (``ceil(s / dp) / s`` of them, exact for prompts of one length). Before, the
        mean share alone: one 30,000-token prompt on Qwen3-235B tp4 x dp2 took 1,599 ms
        alone and 1,074 ms once a 100-token prompt joined it."""
        kappa = self._other_share(s)
        ell = min(ell, n)
        p_ell = min(ell * (ell + 1.0) / 2.0, pairs)
        n_long = ell + (n - ell) * kappa
        pairs_long = p_ell + (pairs - p_ell) * kappa
        return max(n_r, n_long), max(pairs_r, pairs_long)

    def _parts(
        self,
        b: int,
        ctx: float,
        s: int,
        n: int,
        pairs: float,
        launches: bool = True,
        longest: float | None = None,
        prompt_tokens: float | None = None,
    ) -> tuple[float, ...]:
        """One iteration's parts (:class:`MoeBreakdown`'s order): ``b`` decoding
        sequences of ``ctx`` context tokens in all (``longest``: the longest one's
        context, None for equal lengths), ``s`` prefilling sequences of ``n`` new tokens
        and ``pairs`` attention pairs (``prompt_tokens``: a length the longest prompt
        reaches, :func:`_weighted_prompt`; None: not known)."""
        m_total = b + n
        if m_total <= 0:
            return (0.0,) * 13
        model = self.model
        lo = self.layout
        hbm = self._hbm
        h = float(model.hidden)
        a = ACT_BYTES
        sb, ss = self._rank_share(b), self._rank_share(s)
        # busiest DP rank's decode sequences and context (_rank_context)
        b_r, ctx_r = b * sb, self._rank_context(b, ctx, longest)
        s_r, n_r, pairs_r = s * ss, n * ss, pairs * ss
        if prompt_tokens is not None and self.dp > 1 and s > 1:
            n_r, pairs_r = self._rank_prompts(s, n, pairs, prompt_tokens, n_r, pairs_r)
        m_r = b_r + n_r

        # attention projections (every layer)
        lp, lelem, lpeak = self._lin, self._lin_elem, self._lin_peak
        attn_gemm = 0.0
        for nn, kk in self._attn_shapes:
            attn_gemm += _gemm_s(lpeak, hbm, lp, m_r, nn, kk, lelem)
        if model.mla is not None:
            ms = self._mla
            bg = self._bf16_gemm
            absorbed_rows = b_r + (n_r if self._mla_pre_form == "absorbed" else 0.0)
            if absorbed_rows > 0:
                attn_gemm += _bmm_s(self._bf16, hbm, bg, absorbed_rows, ms.heads, *ms.bmm_pre)
                attn_gemm += _bmm_s(self._bf16, hbm, bg, absorbed_rows, ms.heads, *ms.bmm_post)
            if n_r > 0 and self._mla_pre_form == "naive":
                attn_gemm += _gemm_s(lpeak, hbm, lp, n_r, ms.kv_b[0], ms.kv_b[1], lelem)
                attn_gemm += self._quant_s(n_r, (ms.kv_b[1],))

        # attention kernels: full layers and windowed layers
        attn_full = self._attention_s(b_r, ctx_r, s_r, n_r, pairs_r)
        attn_win = 0.0
        if self.num_window_layers:
            w = float(self.window_tokens)
            if self.window_kind == "sliding":
                ctx_w = b_r * w  # each decoding sequence reads at most the window
                pairs_w = min(pairs_r, n_r * w)
            else:
                ctx_w = ctx_r  # within one chunk every cached token is read
                pairs_w = min(pairs_r, n_r * (w + 1.0) / 2.0)
            attn_win = self._attention_s(b_r, ctx_w, s_r, n_r, pairs_w)
        attention = self.num_full_layers * attn_full + self.num_window_layers * attn_win

        # dense MLP layers (TP-sharded inside the DP rank)
        dense = 0.0
        if self.num_dense_layers:
            f = float(self._dense_f)
            dense = self.num_dense_layers * (
                _gemm_s(lpeak, hbm, lp, m_r, (2.0 if model.gated_mlp else 1.0) * f, h, lelem)
                + _gemm_s(lpeak, hbm, lp, m_r, h, f, lelem)
            )

        # MoE layers
        router = shared = experts = dispatch = combine = overlap = 0.0
        moe_ar = 0.0
        split = False  # two-batch overlap: the MoE layers run as two micro-batches
        if self.num_moe_layers:
            decode_only = n == 0
            r1, s1, e1, d1, c1 = self._moe_layer(m_total, m_r, decode_only)
            nl = self.num_moe_layers
            router, shared, experts, dispatch, combine = nl * r1, nl * s1, nl * e1, nl * d1, nl * c1
            split = lo.two_batch_overlap and self.uses_all_to_all and m_total >= 2
            if split:
                serial = r1 + s1 + e1 + d1 + c1 + self._attn_gemm_ew_layer(m_r)
                r2, s2, e2, d2, c2 = self._moe_layer(m_total / 2.0, m_r / 2.0, decode_only)
                x_h = r2 + s2 + e2 + self._attn_gemm_ew_layer(m_r / 2.0)
                a_h = d2 + c2
                overlap = nl * ((x_h + max(x_h, a_h) + a_h) - serial)
            if not self.uses_all_to_all and lo.dp == 1 and lo.gpus > 1:
                moe_ar = nl * _ar_s(self._ar_all, lo.gpus, m_r * h * a)

        # all-reduces: attention output over tp; dense MLP over tp; MoE with tp > 1 and dp > 1
        ar = 0.0
        if lo.tp > 1:
            one = _ar_s(self._ar_tp, lo.tp, m_r * h * a)
            ar = model.num_layers * one + self.num_dense_layers * one
            if self.uses_all_to_all:
                ar += self.num_moe_layers * one  # gather the rank's tokens after combine
        ar += moe_ar

        # element-wise kernels
        ew = model.num_layers * self._ew_layer(m_r)
        if self.num_dense_layers:
            ew += self.num_dense_layers * (
                _ew(hbm, self._ew, 3.0 * m_r * self._dense_f * a)
                + self._quant_s(m_r, (h, float(self._dense_f)))
            )
        if self.num_moe_layers and self._shared_f:
            ew += self.num_moe_layers * (
                _ew(hbm, self._ew, 3.0 * m_r * self._shared_f * a)
                + self._quant_s(m_r, (h, self._shared_f))
            )

        out_seqs = b_r + s_r
        lm_head = 0.0
        if out_seqs > 0:
            lm_head = _ew(hbm, self._ew, 2.0 * out_seqs * h * a) + _gemm_s(
                self._bf16, hbm, self._bf16_gemm, out_seqs, self._lm_head_n, h, 2.0
            )
        attn_gemm *= model.num_layers
        # the engine's host time over the busiest rank's sequences and tokens, and an eager
        # engine's launches the layers' kernels do not hide (costmodel/overhead.py)
        overhead = self._ov.host_s(out_seqs, m_r)
        if launches and self._ov.launch_per_layer_s > 0.0:
            kernels = (
                attn_gemm + attention + dense + router + shared + experts + dispatch + combine
                + ar + ew + overlap
            )  # fmt: skip
            overhead += unhidden_launches_s(self._launches_s(b > 0, n > 0, split), kernels)
        return (
            attn_gemm,
            attention,
            dense,
            router,
            shared,
            experts,
            dispatch,
            combine,
            ar,
            ew,
            lm_head,
            overhead,
            overlap,
        )

    def launches_per_iteration(self, decode: bool, prefill: bool, split: bool = False) -> int:
        """Kernels an iteration's layers launch, counted as :meth:`_parts` costs them: every
        layer its attention projections (GQA: QKV and O; MLA: its projections, the two
        absorbed BMMs where absorbed rows run, the naive form's ``kv_b`` in prefill), its
        attention kernels (``decode``, ``prefill``: one each), six element-wise kernels
        (two norms, rope, KV write, two residual adds) and with tp > 1 the attention
        all-reduce; a dense-MLP layer two GEMMs, the activation and with tp > 1 its
        all-reduce; an MoE layer the router GEMM, the shared experts' two GEMMs and
        activation, the routed experts' gate/up and down grouped GEMMs and activation,
        and the dispatch and combine of an all-to-all (with tp > 1 also the all-reduce
        that gathers the rank's tokens) or the all-reduce of the MoE output (dp = 1 over
        several GPUs). ``split`` (two-batch overlap) runs an MoE layer's projections,
        element-wise kernels and MoE kernels once per micro-batch. A layer shaped like a
        dense one (GQA attention, dense MLP) counts :func:`dense_layer_launches`."""
        model = self.model
        lo = self.layout
        tp_ar = 1 if lo.tp > 1 else 0
        proj = len(self._attn_shapes)
        per_layer = proj
        if model.mla is not None:
            if decode or (prefill and self._mla_pre_form == "absorbed"):
                per_layer += 2
            if prefill and self._mla_pre_form == "naive":
                per_layer += 1
        per_layer += int(decode) + int(prefill) + _EW_LAUNCHES + tp_ar
        total = model.num_layers * per_layer
        total += self.num_dense_layers * (2 + 1 + tp_ar)
        if self.num_moe_layers:
            moe = 1 + (3 if self._shared_f else 0) + 3
            if self.uses_all_to_all:
                moe += 2
                other = tp_ar
            else:
                other = 1 if lo.dp == 1 and lo.gpus > 1 else 0
            if split:
                moe = 2 * moe + proj + _EW_LAUNCHES
            total += self.num_moe_layers * (moe + other)
        return total

    def _launches_s(self, decode: bool, prefill: bool, split: bool) -> float:
        """Seconds an eager engine takes to launch an iteration's layers: its kernels
        (:meth:`launches_per_iteration`) at the engine's rate for a dense layer's
        (``launch_per_layer_s`` per :func:`dense_layer_launches` kernels)."""
        key = (decode, prefill, split)
        hit = self._launch_cache.get(key)
        if hit is None:
            dense = dense_layer_launches(self.layout.tp, int(decode) + int(prefill))
            count = self.launches_per_iteration(decode, prefill, split)
            hit = self._launch_cache[key] = self._ov.launch_per_layer_s * count / dense
        return hit

    def _pick_attention(
        self,
        profile: HardwareProfile,
        eng: EngineProfile,
        hq: int,
        hkv: int,
        hd: int,
        kv_dtype: str,
    ) -> None:
        """The attention kernels of a GQA/MHA layer: the engine's own, as a dense worker
        runs them (:func:`disaggsim.costmodel.step.pick_attention_backends`: its framework's
        fitted kernels, else the profile's generic one), prefill on the fit for the KV dtype
        where the kernel has one. A decode fit of a form this layer model does not evaluate
        (:func:`_one_line_decode_fit`: TensorRT-LLM's XQA wave kernel, masked MHA's per-item
        terms) keeps the profile's generic decode kernel."""
        from disaggsim.costmodel.step import pick_attention_backends

        dec_b, pre_b = pick_attention_backends(
            profile, "auto", hq, hkv, hd, kv_dtype, eng.attention_backend, eng.framework
        )
        dec = profile.decode_attention_for(dec_b, kv_dtype)
        if _one_line_decode_fit(dec):
            self.decode_backend, self._dec = dec_b, dec
        self.prefill_backend = pre_b
        self._pre = profile.prefill_attention_for(pre_b, kv_dtype)

    def _attention_s(self, b_r: float, ctx_r: float, s_r: float, n_r: float, pairs_r: float):
        """One layer's attention kernels on one GPU of the busiest DP rank."""
        model = self.model
        t = 0.0
        if model.mla is not None:
            if n_r > 0:
                # at most the absorbed decode kernel reading each new token's keys (n_r
                # query rows, pairs_r keys, no reuse between a sequence's rows): the
                # prefill fit's efficiency is a function of the mean new tokens a
                # sequence, fitted on fresh prompts (pairs ~ n^2 / 2), and falls to 0.1 %
                # of peak at one token, so a short chunk after a long prefix (1 token
                # after 32,768: 62 ms a step on DeepSeek-V3 TP8) cost 45x the decode
                # kernel on the same reads (1.4 ms) and adding a fresh prompt to its
                # batch made the step faster (docs/calibration.md, MoE section)
                t += min(
                    float(
                        mla_prefill_attention_s(
                            self._mla_pre, self._bf16, s_r, n_r, pairs_r, self._mla_pre_flop
                        )
                    ),
                    float(
                        mla_decode_attention_s(
                            self._mla_dec,
                            self._bf16,
                            self._hbm,
                            n_r,
                            pairs_r,
                            self.heads_per_gpu,
                            self._mla.cache_elems * self._kv_elem,
                            self._mla_flop_tok,
                        )
                    ),
                )
            if b_r > 0:
                t += float(
                    mla_decode_attention_s(
                        self._mla_dec,
                        self._bf16,
                        self._hbm,
                        b_r,
                        ctx_r,
                        self.heads_per_gpu,
                        self._mla.cache_elems * self._kv_elem,
                        self._mla_flop_tok,
                    )
                )
            return t
        hd = float(model.head_dim)
        if n_r > 0:
            # the dense step's prefill attention, looked up on its module when called: one
            # formula for both models, and a diagnostic that swaps it for a run
            # (``python -m calibration.throughput --what-if prefix-attention``) reaches MoE
            # models as well as dense ones
            t += _step._prefill_attention_s(
                self._bf16, self._pre, s_r, n_r, pairs_r, self.heads_per_gpu, hd
            )
        if b_r > 0:
            # the dense step's decode kernel form (ops.py): a split-KV kernel's few items
            # add the lesser of the stream's share loss and its fill to the stream, so the
            # time never falls as the batch or the context grows
            d = self._dec
            hkv = float(self.kv_heads_per_gpu)
            scale = _step._dec_bw_scale(d, b_r, hkv)
            stream = 2.0 * ctx_r * hkv * hd * self._kv_elem / (self._hbm * d.bw_eff * scale)
            stream += _step._dec_shortfall_s(d, stream, b_r * hkv)
            t += (
                _step._dec_floor_s(d, b_r, hkv)
                + d.per_seq_s * b_r
                + d.per_seq_kv_elem_s * b_r * hkv * hd
                + stream
            )
        return t

    def _moe_layer(
        self, m_total: float, m_r: float, decode_only: bool
    ) -> tuple[float, float, float, float, float]:
        """One MoE layer on the busiest GPU: router, shared experts, routed experts,
        dispatch, combine (seconds)."""
        model = self.model
        lo = self.layout
        hbm = self._hbm
        h = float(model.hidden)
        moe = model.moe
        assert moe is not None
        router = _gemm_s(self._bf16, hbm, self._bf16_gemm, m_r, float(moe.num_experts), h, 2.0)
        shared = 0.0
        if self._shared_f:
            lp, le, pk = self._lin, self._lin_elem, self._lin_peak
            sf = self._shared_f
            shared = _gemm_s(pk, hbm, lp, m_r, 2.0 * sf, h, le) + _gemm_s(
                pk, hbm, lp, m_r, h, sf, le
            )
        f = self.imbalance(m_total)
        routed = m_total * self._top_k / lo.ep * f
        touched = min(float(self.local_experts), routed)
        # tokens the GPU permutes in and reduces out: every token of the layer where each
        # GPU holds them all (dp = 1, the tables' setting), else those dispatched to it
        layer_tokens = min(m_total, routed) if self.uses_all_to_all else m_total
        experts = float(
            grouped_gemm_time_s(
                self._expert_params,
                self._expert_peak,
                hbm,
                routed,
                touched,
                h,
                self._expert_width,
                self._expert_elem,
                model.gated_mlp,
                layer_tokens,
            )
        )
        dispatch = combine = 0.0
        if self.uses_all_to_all:
            mode = lo.all_to_all
            if mode == "auto":  # DeepEP's own split: low-latency kernels for decode
                mode = "low_latency" if decode_only else "normal"
            per_gpu = m_total / lo.gpus * f
            gpn = self._node_gpus
            for phase, payload in (
                ("dispatch", self._dispatch_payload),
                ("combine", self._combine_payload),
            ):
                nv, rd = all_to_all_volume_bytes(per_gpu, payload, self._top_k, lo.ep, gpn, mode)
                t = float(
                    all_to_all_time_s(
                        self.params.all_to_all[mode][phase],
                        nv,
                        rd,
                        self.nodes,
                        self._nvlink_bw,
                        self._nic_bw,
                    )
                )
                if phase == "dispatch":
                    dispatch = t
                else:
                    combine = t
        return router, shared, experts, dispatch, combine

    def all_to_all_traffic(self, decode_batch: int, prefill_tokens: int) -> AllToAllTraffic:
        """The all-to-all of one iteration as traffic, for an engine that moves it as
        flows on a topology fabric: per MoE layer and per GPU, the bytes of dispatch and
        combine over NVLink and over RDMA (the same volumes the step time uses)."""
        lo = self.layout
        m = decode_batch + prefill_tokens
        if not self.uses_all_to_all or m <= 0 or self.model.moe is None:
            return AllToAllTraffic("", 0, 0, 0.0, 0.0, 0.0, 0.0)
        mode = lo.all_to_all
        if mode == "auto":
            mode = "low_latency" if prefill_tokens == 0 else "normal"
        per_gpu = m / lo.gpus * self.imbalance(m)
        gpn = self._node_gpus
        d_nv, d_rd = all_to_all_volume_bytes(
            per_gpu, self._dispatch_payload, self._top_k, lo.ep, gpn, mode
        )
        c_nv, c_rd = all_to_all_volume_bytes(
            per_gpu, self._combine_payload, self._top_k, lo.ep, gpn, mode
        )
        return AllToAllTraffic(
            mode,
            self.num_moe_layers,
            self.nodes,
            float(d_nv),
            float(d_rd),
            float(c_nv),
            float(c_rd),
        )

    def iteration_floor(self) -> IterationFloor:
        """A lower bound on this worker's iteration time (:class:`IterationFloor`), from
        the same shapes, peaks and parameters :meth:`_parts` uses: each GEMM at its best
        efficiency (``max_eff``, ``mem_eff``: its compute or its weight and activation
        reads, the longer), the element-wise kernels and launches exactly, all-reduces
        and the all-to-all at their latency. The planner bounds an MoE family's goodput
        with it (docs/planning.md)."""
        model = self.model
        lo = self.layout
        h = float(model.hidden)
        a = ACT_BYTES
        hbm = self._hbm
        fixed = self._ov.fixed_s
        flop_s = weight_s = act_s = 0.0  # flop_s, act_s: per token of one DP rank

        def gemm(count: float, peak: float, p, n: float, k: float, elem: float) -> None:
            nonlocal fixed, flop_s, weight_s, act_s
            fixed += count * p.launch_s
            flop_s += count * 2.0 * n * k / (peak * p.max_eff)
            weight_s += count * n * k * elem / (hbm * p.mem_eff)
            act_s += count * (n + k) * elem / (hbm * p.mem_eff)

        for nn, kk in self._attn_shapes:
            gemm(model.num_layers, self._lin_peak, self._lin, nn, kk, self._lin_elem)
        # element-wise kernels: linear in the rank's tokens, taken exactly
        ew0 = self._ew_layer(0.0)
        fixed += model.num_layers * ew0
        serial_s = model.num_layers * (self._ew_layer(1.0) - ew0)
        ew = self._ew
        if self.num_dense_layers:
            f = float(self._dense_f)
            for nn, kk in (((2.0 if model.gated_mlp else 1.0) * f, h), (h, f)):
                gemm(self.num_dense_layers, self._lin_peak, self._lin, nn, kk, self._lin_elem)
            fixed += self.num_dense_layers * ew.launch_s
            serial_s += self.num_dense_layers * 3.0 * f * a / (hbm * ew.bw_eff)
            q0 = self._quant_s(0.0, (h, f))
            fixed += self.num_dense_layers * q0
            serial_s += self.num_dense_layers * (self._quant_s(1.0, (h, f)) - q0)
        ar_lat = min((lat for lat, _ in self._ar_tp), default=0.0) if lo.tp > 1 else 0.0
        num_ar = model.num_layers + self.num_dense_layers
        expert_s = copies = expert_copy_s = 0.0
        moe = model.moe
        if moe is not None and self.num_moe_layers:
            nl = self.num_moe_layers
            gemm(nl, self._bf16, self._bf16_gemm, float(moe.num_experts), h, 2.0)  # router
            if self._shared_f:
                sf = self._shared_f
                for nn, kk in ((2.0 * sf, h), (h, sf)):
                    gemm(nl, self._lin_peak, self._lin, nn, kk, self._lin_elem)
                fixed += nl * ew.launch_s
                serial_s += nl * 3.0 * sf * a / (hbm * ew.bw_eff)
                q0 = self._quant_s(0.0, (h, sf))
                fixed += nl * q0
                serial_s += nl * (self._quant_s(1.0, (h, sf)) - q0)
            p = self._expert_params
            mats = 3.0 if model.gated_mlp else 2.0
            wd = self._expert_width
            fixed += nl * p.launch_s
            copies = self._top_k / lo.ep  # routed copies of a worker's token on one GPU
            expert_s = nl * mats * h * wd * self._expert_elem / (hbm * p.mem_eff)
            expert_copy_s = nl * 2.0 * mats * h * wd / (self._expert_peak * p.max_eff)
            expert_act_s = nl * (2.0 * h + 2.0 * (mats - 1.0) * wd) * a / (hbm * p.mem_eff)
            if self.uses_all_to_all:
                # two-batch overlap hides at most the other half's: one half's stays
                rdma = self.nodes > 1
                fixed += nl * min(
                    sum(
                        self.params.all_to_all[mode][phase].latency_s
                        + rdma * self.params.all_to_all[mode][phase].rdma_latency_s
                        for phase in ("dispatch", "combine")
                    )
                    for mode in ("normal", "low_latency")
                )
                num_ar += nl if lo.tp > 1 else 0
            elif lo.dp == 1 and lo.gpus > 1:
                fixed += nl * min(lat for lat, _ in self._ar_all)
        else:
            expert_act_s = 0.0
        fixed += num_ar * ar_lat
        serial_s += self._ov.per_token_s  # the engine's host time per token of a rank
        if model.mla is not None:
            kv_s = self._mla.cache_elems * self._kv_elem / (hbm * self._mla_dec.bw_eff)
            pair_s = self._mla_pre_flop / (self._bf16 * self._mla_pre.max_eff)
        else:
            hd = model.head_dim
            kv_s = 2.0 * self.kv_heads_per_gpu * hd * self._kv_elem / (hbm * self._dec.bw_eff)
            pair_s = 4.0 * self.heads_per_gpu * hd / (self._bf16 * self._pre.max_eff)
        full = float(self.num_full_layers)
        dp = float(lo.dp)
        return IterationFloor(
            fixed_s=fixed,
            compute_s_per_token=flop_s / dp + copies * expert_copy_s,
            weight_s=weight_s,
            weight_s_per_token=act_s / dp + copies * expert_act_s,
            expert_s=expert_s,
            local_experts=float(self.local_experts),
            copies_per_token=copies,
            serial_s_per_token=serial_s / dp,
            kv_s_per_context_token=full * kv_s / dp,
            attn_s_per_pair=full * pair_s / dp,
        )

    def _attn_gemm_ew_layer(self, m_r: float) -> float:
        """A layer's projections and element-wise kernels (what overlaps the all-to-all)."""
        t = self._ew_layer(m_r)
        for nn, kk in self._attn_shapes:
            t += _gemm_s(self._lin_peak, self._hbm, self._lin, m_r, nn, kk, self._lin_elem)
        return t

    def _ew_layer(self, m_r: float) -> float:
        """Norms, rope, KV write and residual adds of one layer (activation of the dense
        and shared MLPs is added by the caller; the routed experts' is in the grouped GEMM)."""
        model = self.model
        hbm, ew, a = self._hbm, self._ew, ACT_BYTES
        h = float(model.hidden)
        if model.mla is not None:
            rope = 2.0 * m_r * (self.heads_per_gpu + 1) * model.mla.qk_rope_head_dim * a
            kv_write = m_r * self._mla.cache_elems * (a + self._kv_elem)
        else:
            hq, hkv, hd = self.heads_per_gpu, self.kv_heads_per_gpu, model.head_dim
            rope = 2.0 * m_r * (hq + hkv) * hd * a
            kv_write = m_r * 2.0 * hkv * hd * (a + self._kv_elem)
        return (
            2.0 * _ew(hbm, ew, 2.0 * m_r * h * a)
            + _ew(hbm, ew, rope)
            + _ew(hbm, ew, kv_write)
            + 2.0 * _ew(hbm, ew, 3.0 * m_r * h * a)
            + self._quant_s(m_r, tuple(kk for _, kk in self._attn_shapes))
        )

    def _quant_s(self, m_r: float, inputs: tuple[float, ...]) -> float:
        """FP8 linear layers: one activation-quantisation kernel per GEMM input of ``k``
        elements a token (reads 2, writes 1 byte each), as the dense step; 0 in bf16."""
        return _step._fp8_quant_s(self._hbm, self._ew, m_r, inputs) if self._quant else 0.0

    # --- memory ------------------------------------------------------------------------------

    def weights_breakdown_bytes_per_gpu(self) -> dict[str, float]:
        """Bytes of weights on one GPU, by part."""
        model = self.model
        lo = self.layout
        tp = lo.tp
        h = model.hidden
        le = self._lin_elem
        norm = (2 if model.norm == "layernorm" else 1) * h
        if model.mla is not None:
            attn = (self._mla.replicated_params + self._mla.sharded_params) * le
        else:
            hq, hkv, hd = self.heads_per_gpu, self.kv_heads_per_gpu, model.head_dim
            attn = (h * (hq + 2 * hkv) * hd + hq * hd * h) * le
            if model.attention_bias:
                attn += ((hq + 2 * hkv) * hd + h) * 2
        out = {
            "attention": model.num_layers * attn,
            "norms": (2 * model.num_layers + 1) * norm * 2.0,
            "dense_mlp": self.num_dense_layers * model.mlp_params(self._dense_f) * le,
            "embedding": -(-model.vocab // tp) * h * 2.0 * (1 if model.tied_embeddings else 2),
        }
        moe = model.moe
        if moe is not None:
            nl = self.num_moe_layers
            out["router"] = nl * model.router_params * 2.0
            shared = moe.num_shared_experts * model.mlp_params(moe.shared_expert_ffn) / tp
            out["shared_experts"] = nl * shared * le
            out["routed_experts"] = (
                nl * self.local_experts * model.expert_params / lo.moe_tp * self._expert_elem
            )
        return out

    def _weights_per_gpu(self) -> float:
        return sum(self.weights_breakdown_bytes_per_gpu().values())

    def __repr__(self) -> str:
        lo = self.layout
        return (
            f"MoeWorkerCost({self.model.id}, {self.gpu.id}, tp={lo.tp}, dp={lo.dp}, "
            f"ep={lo.ep}, weights={self.weight_format}, kv={self.kv_dtype})"
        )


def _ew(hbm: float, p, nbytes: float) -> float:
    return p.launch_s + nbytes / (hbm * p.bw_eff)


def _resolve_format(weight_dtype: str, model: ModelSpec) -> str:
    if weight_dtype == "released":
        return {"bf16": "bf16", "fp8-block": "fp8-block", "mxfp4-moe": "mxfp4"}[
            model.released_weights
        ]
    return "bf16" if weight_dtype == "fp16" else weight_dtype


def _linear_dtype(fmt: str, model: ModelSpec) -> str:
    """The dtype of the GEMMs outside the routed experts (attention, dense layers, shared
    experts): fp8 for fp8 weights, and for FP4 experts of a model released in fp8 blocks
    (its other layers stay as released); bf16 otherwise."""
    if fmt in ("fp8", "fp8-block"):
        return "fp8"
    if fmt in ("mxfp4", "nvfp4") and model.released_weights == "fp8-block":
        return "fp8"
    return "bf16"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_layouts(
    model: ModelSpec, gpus: int, gpus_per_node: int, redundant_experts: int = 0
) -> list[tuple[int, int, int]]:
    """``(tp, dp, ep)`` layouts of ``gpus`` GPUs that shard ``model``: tp divides the
    heads (and the KV heads or is a multiple of them) and fits one node, tp × dp =
    gpus, ep divides gpus and the expert slots (experts + redundant), ep = gpus when
    dp > 1."""
    out = []
    experts = model.moe.num_experts + redundant_experts if model.moe is not None else 1
    for tp in _divisors(gpus):
        if tp > gpus_per_node or not _tp_ok(model, tp):
            continue
        dp = gpus // tp
        eps = [gpus] if dp > 1 else [e for e in _divisors(gpus) if experts % e == 0]
        for ep in eps:
            if dp > 1 and experts % ep:
                continue
            out.append((tp, dp, ep))
    return out


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    if model.num_heads % tp:
        return False
    if model.mla is not None:
        return True
    return model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0


def build_moe_worker_cost(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = 1,
    *,
    dp: int = 1,
    ep: int | None = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    engine: str | EngineProfile = "vllm",
    gpu_mem_util: float = 0.9,
    activation_reserve_bytes: float | None = None,
    profile: HardwareProfile | str | Path | None = None,
    moe_params: MoeParams | str | Path | None = None,
    max_seqs: int = DEFAULT_BATCH_SEQS,
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
    redundant_experts: int | None = None,
    routing: str = "balanced",
    power_law_alpha: float = 1.01,
    imbalance_factor: float = 1.0,
    all_to_all: str = "auto",
    two_batch_overlap: bool = False,
    mla_prefill: str = "absorbed",
    gpus_per_node: int | None = None,
) -> MoeWorkerCost:
    """A cost model for one worker of ``tp × dp`` GPUs serving an MoE/MLA model.

    Parameters
    ----------
    tp, dp, ep
        Attention TP per DP rank, attention DP ranks, expert parallelism (default: every
        GPU of the worker when dp > 1, else 1).
    weight_dtype
        ``bf16``/``fp16``, ``fp8`` (per-tensor), ``fp8-block`` (128x128 block scales),
        ``mxfp4``/``nvfp4`` (4-bit routed experts; the rest bf16, or fp8 for a model
        released in fp8-block), or ``released`` (as the checkpoint ships).
    max_seqs
        Most sequences in a batch (the pool's ``max_batch_seqs``): sliding-window layers
        reserve their bounded KV for that many sequences.
    max_batch_tokens
        The worker's iteration token budget (the pool's ``max_batch_tokens``). With
        ``max_seqs`` it sizes each DP rank's engine reserve (``ceil(limit / dp)`` per rank,
        :mod:`disaggsim.costmodel.reserve`) unless ``activation_reserve_bytes`` (bytes per
        GPU) is given.
    redundant_experts
        EPLB: extra expert slots spread over the EP ranks (None: no EPLB placement).
    routing, power_law_alpha, imbalance_factor
        Token spread over the experts: ``balanced`` or ``power_law`` (AIConfigurator's
        power law with exponent ``power_law_alpha``); the busiest rank's load is
        further multiplied by ``imbalance_factor``.
    all_to_all
        DeepEP mode: ``normal``, ``low_latency`` or ``auto`` (low-latency for decode-only
        iterations, normal when the iteration has prefill tokens).
    two_batch_overlap
        Split each iteration into two micro-batches so the all-to-all of one overlaps the
        other's non-attention compute.
    mla_prefill
        ``absorbed`` or ``naive`` (MHA form after up-projection) MLA prefill attention.
    gpus_per_node
        GPUs per node of the cluster (a topology fabric's ``gpus_per_node``); None: the
        GPU catalog's. Sets how many nodes a unit spans and its all-to-all's RDMA share.

    Raises
    ------
    UserError
        One line naming the field and the allowed values.
    """
    m = get_model(model)
    g = get_gpu(gpu)
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise UserError(f"gpus_per_node: must be a positive integer, got {gpus_per_node!r}")
    for name, v in (("tp", tp), ("dp", dp), ("max_seqs", max_seqs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"{name}: must be a positive integer, got {v!r}")
    gpus = tp * dp
    if m.moe is None:
        if dp != 1 or ep not in (None, 1) or redundant_experts is not None:
            field = "dp" if dp != 1 else ("ep" if ep not in (None, 1) else "redundant_experts")
            raise UserError(
                f"{field}: model {m.id} has no experts: expert/data-parallel layouts and MoE "
                f"options need an MoE model (allowed: dp 1, ep 1)"
            )
    if ep is None:
        ep = gpus if (dp > 1 and m.moe is not None) else 1
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise UserError(f"ep: must be a positive integer, got {ep!r}")
    node = gpus_per_node or g.gpus_per_node  # the cluster's node (a fabric's), else catalog's
    if m.num_heads % tp or not _tp_ok(m, tp):
        allowed = [t for t in _divisors(m.num_heads) if _tp_ok(m, t) and t <= node]
        raise UserError(
            f"tp: {tp} does not shard the {m.num_heads} attention heads"
            f"{'' if m.mla is not None else f' / {m.num_kv_heads} KV heads'} of {m.id} "
            f"(allowed: {', '.join(map(str, allowed))})"
        )
    if tp > node:
        allowed = [t for t in _divisors(m.num_heads) if _tp_ok(m, t) and t <= node]
        where = (
            f"gpus_per_node is {node}"
            if gpus_per_node is not None
            else f"{g.id} has {node} GPUs per node"
        )
        raise UserError(
            f"tp: attention TP {tp} spans nodes ({where}); "
            f"use dp for more GPUs (allowed tp: {', '.join(map(str, allowed))})"
        )
    if gpus % ep:
        raise UserError(
            f"ep: {ep} does not divide the worker's {gpus} GPUs (tp {tp} x dp {dp}; "
            f"allowed: {', '.join(map(str, _divisors(gpus)))})"
        )
    if m.moe is not None:
        if redundant_experts is not None and (
            isinstance(redundant_experts, bool)
            or not isinstance(redundant_experts, int)
            or redundant_experts < 0
        ):
            raise UserError(
                f"redundant_experts: must be an integer >= 0, got {redundant_experts!r}"
            )
        slots = m.moe.num_experts + (redundant_experts or 0)
        if dp > 1 and ep != gpus:
            raise UserError(
                f"ep: with dp {dp} the experts span every GPU of the worker (allowed: {gpus})"
            )
        if slots % ep:
            ok = [e for e in _divisors(gpus) if slots % e == 0 and (dp == 1 or e == gpus)]
            raise UserError(
                f"ep: {ep} does not divide the {slots} expert slots of {m.id} "
                f"({m.moe.num_experts} experts + {redundant_experts or 0} redundant; "
                f"allowed: {', '.join(map(str, ok)) or 'none: change redundant_experts'})"
            )
    if weight_dtype not in WEIGHT_FORMATS:
        raise UserError(f"weight_dtype: {weight_dtype!r} (allowed: {', '.join(WEIGHT_FORMATS)})")
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"kv_dtype: {kv_dtype!r} (allowed: {', '.join(KV_DTYPES)})")
    if routing not in ROUTINGS:
        raise UserError(f"routing: {routing!r} (allowed: {', '.join(ROUTINGS)})")
    if all_to_all not in A2A_CHOICES:
        raise UserError(f"all_to_all: {all_to_all!r} (allowed: {', '.join(A2A_CHOICES)})")
    if mla_prefill not in MLA_PREFILL_FORMS:
        raise UserError(f"mla_prefill: {mla_prefill!r} (allowed: {', '.join(MLA_PREFILL_FORMS)})")
    if not imbalance_factor >= 1.0:
        raise UserError(f"imbalance_factor: must be >= 1, got {imbalance_factor!r}")
    if not power_law_alpha > 0:
        raise UserError(f"power_law_alpha: must be > 0, got {power_law_alpha!r}")
    if not 0.0 < gpu_mem_util <= 1.0:
        raise UserError(f"gpu_mem_util: must be in (0, 1], got {gpu_mem_util!r}")
    if activation_reserve_bytes is not None and not float(activation_reserve_bytes) >= 0:
        raise UserError(f"activation_reserve_bytes: must be >= 0, got {activation_reserve_bytes!r}")
    for name, limit in (("max_seqs", max_seqs), ("max_batch_tokens", max_batch_tokens)):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UserError(f"{name}: must be a positive integer, got {limit!r}")
    reserve = (
        runtime_reserve_bytes(
            m, tp, resolve_engine(engine), -(-max_batch_tokens // dp), -(-max_seqs // dp)
        )
        if activation_reserve_bytes is None
        else float(activation_reserve_bytes)
    )
    if isinstance(profile, HardwareProfile):
        prof = profile
    elif profile is None:
        prof = load_profile(g.id)
    else:
        prof = load_profile(g.id, path=profile)  # a profile fitted on another GPU is refused
    fmt = _resolve_format(weight_dtype, m)
    if _linear_dtype(fmt, m) == "fp8" and prof.peaks.fp8_flop_per_s <= 0:
        # FP4 experts of an fp8-released model keep its other layers in fp8 (MoeWorkerCost)
        no_fp8 = [d for d in WEIGHT_FORMATS if _linear_dtype(_resolve_format(d, m), m) != "fp8"]
        what = (
            f"{weight_dtype} weights"
            if fmt in ("fp8", "fp8-block")
            else f"{weight_dtype} experts of {m.id} (its other layers stay fp8 as released)"
        )
        raise UserError(
            f"weight_dtype: {g.id} has no FP8 tensor cores for {what} "
            f"(allowed there: {', '.join(no_fp8)})"
        )
    resolve_engine(engine)  # an unknown engine name is a one-line error here
    params = moe_params if isinstance(moe_params, MoeParams) else load_moe_params(g.id, moe_params)
    layout = MoeLayout(
        tp=tp,
        dp=dp,
        ep=ep,
        redundant_experts=redundant_experts if m.moe is not None else None,
        routing=routing,
        power_law_alpha=power_law_alpha,
        imbalance_factor=imbalance_factor,
        all_to_all=all_to_all,
        two_batch_overlap=two_batch_overlap,
        mla_prefill=mla_prefill,
    )

    def make(lay: MoeLayout) -> MoeWorkerCost:
        return MoeWorkerCost(
            m,
            g,
            prof,
            params,
            lay,
            weight_dtype,
            kv_dtype,
            engine,
            gpu_mem_util,
            reserve,
            max_seqs,
            gpus_per_node,
        )

    cost = make(layout)
    if cost.kv_capacity_tokens < 1:
        per_gpu = cost.weights_bytes_per_gpu / 1e9
        needed = (
            cost.weights_bytes_per_gpu
            + reserve
            + cost.window_reserve_bytes_per_gpu
            + cost.a2a_buffer_bytes_per_gpu
            + cost.kv_bytes_per_token_per_gpu
        )
        from disaggsim.costmodel.step import util_to_fit

        util = util_to_fit(g.usable_bytes, needed, gpu_mem_util)
        # no field prefix: the layout as a whole does not fit, whichever field set it
        raise UserError(
            f"{m.id} does not fit on {gpus} x {g.id} with tp {tp}, dp {dp}, ep {ep} "
            f"({per_gpu:.1f} GB of {fmt} weights per GPU of {g.usable_bytes / GiB:.1f} GiB x "
            f"{gpu_mem_util:.2f}; no room left for KV): use more GPUs per worker, a larger ep, "
            f"{util + ', ' if util else ''}or smaller weights (weight_dtype)"
        )
    return cost


DENSE_WEIGHT_DTYPES = ("bf16", "fp16", "fp8")


def build_cost(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = 1,
    *,
    dp: int = 1,
    ep: int | None = None,
    moe: dict | None = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    engine: str | EngineProfile = "vllm",
    gpu_mem_util: float = 0.9,
    max_seqs: int = DEFAULT_BATCH_SEQS,
    profile: HardwareProfile | str | Path | None = None,
    attention_backend: str = "auto",
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
    activation_reserve_bytes: float | None = None,
    gpus_per_node: int | None = None,
):
    """The cost model of one worker of any catalog model: the dense roofline
    (:func:`disaggsim.costmodel.step.build_worker_cost`) for a dense model on a plain TP
    layout, :func:`build_moe_worker_cost` otherwise. ``moe`` holds the MoE options
    (``redundant_experts``, ``routing``, ``power_law_alpha``, ``imbalance_factor``,
    ``all_to_all``, ``two_batch_overlap``, ``mla_prefill``); on a dense model any of
    them, a ``dp`` or an ``ep`` other than 1 is a one-line error naming the field.
    ``gpus_per_node`` (a topology fabric's node size; None: the catalog's) sets the nodes
    an MoE unit spans for its all-to-all, and whether a dense TP group's all-reduce stays
    in one node or is hierarchical."""
    from disaggsim.costmodel.step import build_worker_cost

    m = get_model(model)
    opts = dict(moe or {})
    if m.moe is None and m.mla is None:
        if dp != 1 or ep not in (None, 1):
            field = "dp" if dp != 1 else "ep"
            raise UserError(
                f"{field}: model {m.id} is dense: expert/data-parallel layouts need an MoE "
                f"model (allowed: {field} 1)"
            )
        if opts:
            raise UserError(
                f"moe: model {m.id} is dense: MoE options need an MoE model (allowed: no moe "
                f"section; set: {', '.join(sorted(opts))})"
            )
    if m.is_dense and weight_dtype in DENSE_WEIGHT_DTYPES:
        return build_worker_cost(
            m,
            gpu,
            tp,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            engine=engine,
            gpu_mem_util=gpu_mem_util,
            activation_reserve_bytes=activation_reserve_bytes,
            profile=profile,
            attention_backend=attention_backend,
            gpus_per_node=gpus_per_node,
            max_batch_tokens=max_batch_tokens,
            max_batch_seqs=max_seqs,
        )
    if attention_backend != "auto":  # MoE/MLA attention has its own kernels (costmodel.mla)
        raise UserError(
            f"attention_backend: {attention_backend!r} applies to dense models; {m.id} runs "
            "its own attention kernels (allowed: auto)"
        )
    return build_moe_worker_cost(
        m,
        gpu,
        tp,
        dp=dp,
        ep=ep,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        engine=engine,
        gpu_mem_util=gpu_mem_util,
        activation_reserve_bytes=activation_reserve_bytes,
        max_seqs=max_seqs,
        max_batch_tokens=max_batch_tokens,
        profile=profile,
        gpus_per_node=gpus_per_node,
        **opts,
    )
