"""Operator-level time formulas: the one place where profile parameters meet physics.

Every function here is pure numpy (scalars or arrays broadcast), takes the GPU peaks and
one op's fitted parameters from a hardware profile, and returns seconds. The calibration
fitter (``calibration/fit.py``) fits exactly these functions to measured kernel times,
and the step model (``disaggsim.costmodel.step``) sums them into forward-pass times, so
calibration and prediction cannot drift apart.

Forms (``docs/costmodel.md`` has the derivations):

- GEMM (m tokens × k → n): ``launch_s + max(2mnk / (peak × eff_c), bytes / (hbm × mem_eff))``
  with ``eff_c = max_eff × d / (d + half_sat)``, ``d = min(m, n, k)``: compute efficiency
  saturating in the smallest dimension; ``bytes = (mk + kn + mn) × elem``.
- GEMM kernel with a dispatch table (a named ``gemm_kernels`` fit: SGLang's and vLLM's FP8
  GEMMs): the first branch whose conditions on m (and n, k) hold gives CTA tiles ``tm × tn``
  in clusters ``cm × cn``; ``tiles = ⌈⌈M/tm⌉/cm⌉·cm × ⌈⌈N/tn⌉/cn⌉·cn`` with ``(M, N) =
  (m, n)``, or ``(n, m)`` where the branch swaps the operands (``swap_ab``) run in ``⌈tiles / SMs⌉`` waves, each tile ``epilogue ×
  tm·tn + 2·tm·tn·k / (peak / SMs × eff_branch)``; ``launch_s + max(waves × tile, bytes /
  (hbm × mem_eff), l2_bytes / l2_bytes_per_s)``, ``l2_bytes = tiles × (tm / cn + tn / cm) ×
  k × elem``: every tile loads its two operand tiles from L2, TMA multicast sharing the A
  tile over the cluster's ``cn`` CTAs and the B tile over its ``cm`` (the L2 bound only
  where the profile fits ``l2_bytes_per_s``). Piecewise in m (whole tiles and waves; not
  monotone across branches, as the kernel is not).
- Decode attention (B sequences, C cached tokens in all, KH KV heads of dimension D):
  ``floor_s + per_seq_s × B + max(items, stream) + (1 − overlap) × min(items, stream)``, with
  ``items = P × (per_seq_kv_elem_s × D + per_item_s) + per_q_elem_s × B × KH × q × D``
  (each of the ``P = B × KH`` (sequence, KV head) work items sets up, loads its group's
  ``q`` query heads, combines its partial results and writes their outputs:
  :func:`decode_item_seconds`) and ``stream = kv_bytes / (hbm × bw_eff × P / (P + par_half_sat))`` (few items
  cannot keep every memory channel busy). A split-KV kernel (``split_fill_s`` > 0:
  FlashAttention/FlashInfer split-KV, TensorRT-LLM multi-block) splits each long sequence
  over several thread blocks, so few items do not starve the stream: it runs at ``hbm ×
  bw_eff`` and few items add the lesser of the share's loss, ``stream × par_half_sat / P``,
  and a fill bound ``split_fill_s × par_half_sat / (P + par_half_sat)`` (pipeline fill and
  the splits' reduction) to the stream, never beside it
  (:func:`decode_split_shortfall_s`): the time never falls as the batch or the context
  grows. With many items resident per SM, one item's
  fixed work runs while another streams KV: ``overlap`` = 1 makes the kernel take the
  longer of the two (the roofline), 0 their sum. The stream term never exceeds peak
  bandwidth (``bw_eff`` ≤ 1). A per-query-head kernel over a grouped layout (``group``
  query heads per KV head, each reading its KV head: an engine's fallback where its
  grouped kernel does not cover the layout) streams the longer of the KV bytes from HBM and
  ``group × kv_bytes / reread_bytes_per_s`` (the re-reads served by L2). A kernel fitted
  as one (its params' ``reread_bytes_per_s`` > 0: TensorRT-LLM's masked MHA) also counts
  its work items per query head, ``P = B × KH × group``, in ``items`` and in the bandwidth
  share, and takes its own re-read rate unless the caller gives one. At fixed B and
  shape the time is the larger of two affine functions of C
  (:func:`decode_attention_lines`; a split-KV kernel's stream-bound one the smaller of two,
  :func:`decode_attention_share_line`); above the knee, where the KV stream dominates, it is
  ``... + stream`` exactly. Newer parameters default to 0.
- Decode attention on a multi-block wave kernel (``wave_sms`` > 0: TensorRT-LLM's XQA,
  and its masked MHA where the profile fits it so): the smallest of a few lines affine in
  C, one per split count ``m`` the kernel's rule takes at this batch
  (:func:`decode_wave_lines`): ``I × m`` thread blocks in whole waves over the SMs plus a
  partial last wave, ``I`` the work items (XQA: ``B × KH``; masked MHA, a per-query-head
  kernel with ``reread_bytes_per_s`` > 0: ``B × KH × group``, its ``group`` query heads of
  a KV head reading it once from HBM and ``group`` times from L2), each streaming its
  share of its KV head's ``C / B`` tokens, a fixed time per block, and a reduction when
  ``m`` > 1. Never faster than the KV bytes at ``hbm × bw_eff``.
- Prefill attention (causal, FLOP = 4 × heads × head_dim × query-key pairs):
  ``floor_s + flop / (peak × max_eff × L / (L + half_sat))``, L = mean new tokens per
  sequence.
- Element-wise / norm kernels: ``launch_s + bytes / (hbm × bw_eff)``.
- All-reduce over n GPUs of S bytes (ring): ``latency_s + 2 (n-1)/n × S / bus_bw`` per
  NCCL protocol; with both Simple and LL (low-latency: small latency, about half the
  bandwidth) fitted, the faster of the two, as NCCL's tuner picks.
- Copies (KV moves): ``latency_s + S / bw``; paged gather adds ``per_block_s`` per block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from disaggsim.hardware.profile import (
    AllReduceParams,
    CopyParams,
    DecodeAttentionParams,
    ElementwiseParams,
    GemmParams,
    GpuPeaks,
    PrefillAttentionParams,
    TiledGemmParams,
)


def gemm_flop(m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
    return 2.0 * np.asarray(m, float) * np.asarray(n, float) * np.asarray(k, float)


def gemm_bytes(m: ArrayLike, n: ArrayLike, k: ArrayLike, elem_bytes: float) -> np.ndarray:
    m, n, k = (np.asarray(x, float) for x in (m, n, k))
    return (m * k + k * n + m * n) * elem_bytes


def gemm_compute_eff(p: GemmParams, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
    d = np.minimum(np.minimum(np.asarray(m, float), np.asarray(n, float)), np.asarray(k, float))
    return p.max_eff * d / (d + p.half_sat)


def gemm_time_s(
    peaks: GpuPeaks,
    p: GemmParams,
    m: ArrayLike,
    n: ArrayLike,
    k: ArrayLike,
    dtype: str = "bf16",
) -> np.ndarray:
    """Seconds for one (m × k) @ (k × n) GEMM in ``dtype`` (bf16 or fp8)."""
    peak = peaks.flop_per_s(dtype)
    elem = 1.0 if dtype == "fp8" else 2.0
    compute_s = gemm_flop(m, n, k) / (peak * gemm_compute_eff(p, m, n, k))
    memory_s = gemm_bytes(m, n, k, elem) / (peaks.hbm_bytes_per_s * p.mem_eff)
    return p.launch_s + np.maximum(compute_s, memory_s)


def _tiled_branch(p: TiledGemmParams, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per GEMM, the index of the first branch whose conditions hold (else the last)."""
    last = len(p.branches) - 1
    br = np.full(m.shape, last)
    for i in range(last - 1, -1, -1):
        b = p.branches[i]
        takes = (m <= b.max_m) & (n <= b.max_n) & (m >= b.min_m) & (k >= b.min_k)
        br = np.where(takes, i, br)
    return br


def tiled_gemm_grid(
    p: TiledGemmParams, m: ArrayLike, n: ArrayLike, k: ArrayLike
) -> tuple[np.ndarray, ...]:
    """Per GEMM on a dispatch-table kernel: its CTA tiles (rounded up to whole clusters) and
    its branch's ``tile_m``, ``tile_n``, ``cluster_m``, ``cluster_n`` (the kernel's own
    coordinates: swapped with the operands)."""
    m, n, k = np.broadcast_arrays(*(np.asarray(x, float) for x in (m, n, k)))
    return _tile_grid(p, _tiled_branch(p, m, n, k), m, n)


def _tile_grid(p: TiledGemmParams, br: np.ndarray, m: np.ndarray, n: np.ndarray):
    tm, tn, cm, cn, swap = (
        np.array([getattr(b, f) for b in p.branches], float)[br]
        for f in ("tile_m", "tile_n", "cluster_m", "cluster_n", "swap_ab")
    )
    rows, cols = np.where(swap > 0, n, m), np.where(swap > 0, m, n)  # the kernel's m, n
    tiles = np.ceil(np.ceil(rows / tm) / cm) * cm * np.ceil(np.ceil(cols / tn) / cn) * cn
    return tiles, tm, tn, cm, cn


def tiled_gemm_time_s(
    peaks: GpuPeaks, p: TiledGemmParams, m: ArrayLike, n: ArrayLike, k: ArrayLike
) -> np.ndarray:
    """Seconds for one (m × k) @ (k × n) GEMM on a kernel with a CTA-tile dispatch table
    (:class:`~disaggsim.hardware.profile.TiledGemmParams`, module docstring), in its dtype."""
    m, n, k = np.broadcast_arrays(*(np.asarray(x, float) for x in (m, n, k)))
    br = _tiled_branch(p, m, n, k)
    tiles, tm, tn, cm, cn = _tile_grid(p, br, m, n)
    eff = np.array([b.max_eff for b in p.branches], float)[br]
    waves = np.ceil(tiles / p.num_sms)
    area = tm * tn
    per_sm = peaks.flop_per_s(p.dtype) / p.num_sms
    per_tile = p.epilogue_s_per_elem * area + 2.0 * area * k / (per_sm * eff)
    elem = 1.0 if p.dtype == "fp8" else 2.0
    memory_s = gemm_bytes(m, n, k, elem) / (peaks.hbm_bytes_per_s * p.mem_eff)
    t = np.maximum(waves * per_tile, memory_s)
    if p.l2_bytes_per_s > 0.0:
        t = np.maximum(t, tiled_gemm_l2_bytes(tiles, tm, tn, cm, cn, k, elem) / p.l2_bytes_per_s)
    return p.launch_s + t


def tiled_gemm_l2_bytes(tiles, tm, tn, cm, cn, k, elem_bytes: float) -> np.ndarray:
    """Bytes a tiled GEMM's CTAs load from L2: each of ``tiles`` loads a ``tm × k`` A tile
    and a ``tn × k`` B tile, TMA multicast sharing the A tile over the ``cn`` CTAs of its
    cluster row and the B tile over the ``cm`` of its column (:func:`tiled_gemm_grid`)."""
    tiles, tm, tn, cm, cn, k = (np.asarray(x, float) for x in (tiles, tm, tn, cm, cn, k))
    return tiles * (tm / cn + tn / cm) * k * elem_bytes


def decode_attention_bw_scale(p: DecodeAttentionParams, batch: ArrayLike, kv_heads: ArrayLike):
    """Share of ``hbm × bw_eff`` a decode-attention kernel over ``batch × kv_heads``
    (sequence, KV head) work items reaches: ``P / (P + par_half_sat)`` (1 when 0, and for a
    split-KV kernel, ``split_fill_s`` > 0, whose few items pay a fixed time instead)."""
    if p.par_half_sat <= 0.0 or p.split_fill_s > 0.0:
        return np.ones_like(np.asarray(batch, float) * np.asarray(kv_heads, float))
    items = np.asarray(batch, float) * np.asarray(kv_heads, float)
    return items / np.maximum(items + p.par_half_sat, 1e-300)


def decode_attention_floor_s(p: DecodeAttentionParams, batch: ArrayLike, kv_heads: ArrayLike):
    """Fixed time of a decode-attention kernel: ``floor_s``, plus ``multi_floor_s`` when the
    kernel takes its multi-sequence GQA path (``batch > 1`` and ``kv_heads > 1``). A
    split-KV kernel's few-item time is not fixed: :func:`decode_split_shortfall_s`."""
    b = np.asarray(batch, float)
    multi = (b > 1.0) & (np.asarray(kv_heads, float) > 1.0)
    return p.floor_s + p.multi_floor_s * multi


def decode_split_shortfall_s(
    p: DecodeAttentionParams, stream_s: ArrayLike, batch: ArrayLike, work_heads: ArrayLike
) -> np.ndarray:
    """What few work items add to a split-KV kernel's KV stream (``split_fill_s`` > 0;
    0 otherwise): ``min(stream × h / P, split_fill_s × h / (P + h))``, ``h =
    par_half_sat``, ``P = batch × work_heads`` (:func:`decode_work_heads`).

    ``stream × h / P`` is what the stream loses where ``P`` items reach the bandwidth share
    ``P / (P + h)`` (a kernel that does not split: ``h`` items' worth of stream); a split-KV
    kernel splits a long sequence over several thread blocks, so its loss is never more
    than its pipeline fill and the splits' reduction, ``split_fill_s × h / (P + h)``. The
    shortfall is the lesser of the two, a time the stream falls short by, never added
    beside it: ``stream + shortfall`` never falls as the batch grows at fixed tokens per
    sequence (where the fill binds, its fall ``split_fill_s × h / (P + h)²`` per item is
    under the stream's rise per item, ``stream / P``, because the fill binds only below
    ``stream × h / P``) nor as the context grows. Until 2026-12-04 the fill was added to the
    floor, so a doubled batch at short contexts was predicted up to 6% faster."""
    if p.split_fill_s <= 0.0:
        return np.zeros(np.broadcast(np.asarray(stream_s, float), np.asarray(batch, float)).shape)
    items = np.asarray(batch, float) * np.asarray(work_heads, float)
    h = p.par_half_sat
    share_loss = np.asarray(stream_s, float) * h / np.maximum(items, 1e-300)
    return np.minimum(share_loss, p.split_fill_s * h / (items + h))


def decode_work_heads(p: DecodeAttentionParams, kv_heads: ArrayLike, group: ArrayLike = 1.0):
    """Heads per sequence a decode kernel makes work items of: the KV heads, or for a
    per-query-head kernel (``p.per_query_head``) the query heads, ``kv_heads × group``."""
    kh = np.asarray(kv_heads, float)
    return kh * np.asarray(group, float) if p.per_query_head else kh


def decode_stream_seconds_per_byte(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: ArrayLike,
    kv_heads: ArrayLike,
    reread_group: ArrayLike = 1.0,
    reread_bytes_per_s: float = 0.0,
    q_per_kv: ArrayLike = 1.0,
) -> np.ndarray:
    """Seconds per KV byte of a decode kernel's KV stream: ``1 / (hbm × bw_eff × P / (P +
    par_half_sat))``, or for a per-query-head kernel over ``reread_group`` > 1 query heads
    per KV head the longer of that and ``reread_group / rate``: ``rate`` is
    ``reread_bytes_per_s`` when given (> 0), else the kernel's own ``p.reread_bytes_per_s``;
    ``P`` counts :func:`decode_work_heads`. A grouped kernel with a group rate
    (``p.group_bytes_per_s`` > 0) takes the longer of that and ``q_per_kv / group rate``
    (its work on the ``q_per_kv`` query heads sharing each KV byte)."""
    work = decode_work_heads(p, kv_heads, reread_group)
    bw = peaks.hbm_bytes_per_s * p.bw_eff * decode_attention_bw_scale(p, batch, work)
    per_byte = 1.0 / bw
    rate = reread_bytes_per_s if reread_bytes_per_s > 0.0 else p.reread_bytes_per_s
    g = np.asarray(reread_group, float)
    if rate > 0.0 and np.any(g > 1.0):
        per_byte = np.where(g > 1.0, np.maximum(per_byte, g / rate), per_byte)
    if p.group_bytes_per_s > 0.0:
        per_byte = np.maximum(per_byte, np.asarray(q_per_kv, float) / p.group_bytes_per_s)
    return per_byte


# TensorRT-LLM's masked-MHA shared memory and occupancy (1.x releases;
# decoderMaskedMultiheadAttentionLaunch.h smem_size_in_bytes and mmha_launch_kernel_ex,
# decoderMaskedMultiheadAttention.h estimate_min_multi_block_count): a block keeps its
# sequence's Q·K logits in shared memory, 16 bytes (fp32) plus 8 (bf16) per 4 tokens; over
# 4 × SMs or more (sequence, query head) items the launch keeps 256-thread blocks, at most 4
# resident per SM (32 warps, its register limit), fewer where their shared memory (plus the
# 1 KiB the driver reserves per block) does not fit the SM's; a sequence whose logits exceed
# a block's opt-in shared memory (the SM's less that 1 KiB, less a 2 KiB margin) is split
# over the fewest blocks that fit
KIB = 1024.0  # bytes
MMHA_SMEM_BYTES_PER_4_TOKENS = 24.0
MMHA_SMEM_RESERVED_PER_BLOCK = 1024.0
MMHA_SMEM_OPTIN_MARGIN = 2048.0
MMHA_UNTUNED_BLOCKS_PER_SM = 4.0
# history tokens per sequence up to which the occupancy regimes are listed for the step
# model's context intervals (the longest context the public tables time; longer sequences
# keep the last regime)
MMHA_OCCUPANCY_MAX_HISTORY = 131072


def mmha_resident_blocks(history_tokens, smem_per_sm_kib: float) -> np.ndarray:
    """256-thread masked-MHA blocks resident per SM over sequences of ``history_tokens``
    cached tokens (``smem_size_in_bytes``: ``24 × ⌈(T + 1) / 4⌉`` bytes of logits for the
    ``T`` tokens a block holds; a sequence too long for one block is split over
    ``estimate_min_multi_block_count`` blocks): at most 4, at least 1."""
    hist = np.asarray(history_tokens, float)
    per = MMHA_SMEM_BYTES_PER_4_TOKENS
    smem_per_sm = smem_per_sm_kib * KIB
    optin = smem_per_sm - MMHA_SMEM_RESERVED_PER_BLOCK - MMHA_SMEM_OPTIN_MARGIN
    splits = np.maximum(np.ceil(np.ceil((hist + 1.0) / 4.0) / np.floor(optin / per)), 1.0)
    held = np.where(splits > 1.0, np.ceil((hist + 1.0) / splits), hist)
    smem = per * np.ceil((held + 1.0) / 4.0) + MMHA_SMEM_RESERVED_PER_BLOCK
    fit = np.floor(smem_per_sm / smem)
    return np.clip(fit, 1.0, MMHA_UNTUNED_BLOCKS_PER_SM)


def mmha_occupancy_applies(p: DecodeAttentionParams, items: ArrayLike) -> np.ndarray:
    """Whether a decode kernel's occupancy term applies over ``items`` work items: a fit with
    ``block_bytes_per_s`` > 0 over at least ``4 × occupancy_sms`` items (masked MHA's
    untuned 256-thread launch; fewer items run larger tuned blocks or a multi-block split)."""
    i = np.asarray(items, float)
    if p.block_bytes_per_s <= 0.0:
        return np.zeros(i.shape, bool)
    return i >= MMHA_UNTUNED_BLOCKS_PER_SM * p.occupancy_sms


def mmha_occupancy_seconds_per_byte(
    p: DecodeAttentionParams, history_tokens, items: ArrayLike, group: ArrayLike = 1.0
) -> np.ndarray:
    """Seconds per KV byte the occupancy bound allows (0 where it does not apply): the
    ``group`` query heads of a KV head each stream it, at ``resident × occupancy_sms ×
    block_bytes_per_s`` over the GPU (:func:`mmha_resident_blocks`)."""
    on = mmha_occupancy_applies(p, items)
    if not np.any(on):
        return np.zeros(np.broadcast(np.asarray(history_tokens, float), on).shape)
    k = mmha_resident_blocks(history_tokens, p.smem_per_sm_kib)
    rate = k * p.occupancy_sms * p.block_bytes_per_s
    return np.where(on, np.asarray(group, float) / rate, 0.0)


@functools.lru_cache(maxsize=16)
def mmha_occupancy_regimes(smem_per_sm_kib: float) -> tuple[tuple[float, float], ...]:
    """``(first history tokens, resident blocks)`` of each run of history lengths with one
    resident-block count (:func:`mmha_resident_blocks`), from 0 up to
    :data:`MMHA_OCCUPANCY_MAX_HISTORY`, in order; the last holds beyond."""
    k = mmha_resident_blocks(np.arange(MMHA_OCCUPANCY_MAX_HISTORY + 1), smem_per_sm_kib)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(k)) + 1))
    return tuple((float(h), float(k[h])) for h in starts)


def decode_item_seconds(
    p: DecodeAttentionParams,
    batch: ArrayLike,
    work_heads: ArrayLike,
    kv_heads: ArrayLike,
    head_dim: ArrayLike,
    q_per_kv: ArrayLike = 1.0,
) -> np.ndarray:
    """Per-item work of a decode kernel (seconds, the ``items`` term): every one of the
    ``batch × work_heads`` work items (:func:`decode_work_heads`) pays ``per_item_s`` and
    ``per_seq_kv_elem_s`` per head-dim element, and every query-head element of the batch
    (``batch × kv_heads × q_per_kv × head_dim``) ``per_q_elem_s``. Constant in the context,
    so it stays in the item-bound line of :func:`decode_attention_lines`."""
    b = np.asarray(batch, float)
    d = np.asarray(head_dim, float)
    t = p.per_seq_kv_elem_s * b * np.asarray(work_heads, float) * d  # as before the terms
    if p.per_item_s > 0.0:
        t = t + p.per_item_s * b * np.asarray(work_heads, float)
    if p.per_q_elem_s > 0.0:
        q_heads = np.asarray(kv_heads, float) * np.asarray(q_per_kv, float)
        t = t + p.per_q_elem_s * b * q_heads * d
    return t


# TensorRT-LLM's XQA multi-block rule (decoderXQAImplCommon.h computeMultiBlockCount and
# decoderXQAConstants.h of the 1.x releases the public tables time): one thread block per
# 128 cached tokens, at most round(sqrt(8 x that)), cut to 8 waves of the SMs and to 6000
# sub-sequences over the batch; a block streams its tokens in tiles of 64
# (gemm0WarpGrpTileNbTokens / tokensPerTile), half a tile of rounding on average
XQA_MIN_TOKENS_PER_BLOCK = 128
XQA_TARGET_WAVES = 8
XQA_MAX_SUB_SEQUENCES = 6000
XQA_TILE_TOKENS = 64
# tokens per sequence at which the wave lines take the rule's split count: 128 x 2^j up to
# 131,072, the longest context the public tables time (one line per distinct count; the
# kernel takes the smallest line; longer sequences keep the 131,072-token count, which
# only errs slow)
XQA_LINE_CONTEXTS = tuple(128 * 2**j for j in range(11))


def xqa_blocks_per_sequence(history_tokens, items, batch, num_sms: float) -> np.ndarray:
    """Thread blocks XQA's multi-block mode gives each (sequence, KV head) work item over
    ``history_tokens`` cached tokens, with ``items`` work items in all over ``batch``
    sequences on ``num_sms`` SMs (``computeMultiBlockCount``)."""
    m0 = np.floor(np.asarray(history_tokens, float) / XQA_MIN_TOKENS_PER_BLOCK)
    m = np.maximum(np.minimum(m0, np.round(np.sqrt(8.0 * m0))), 1.0)
    adj = np.asarray(items, float) * m / (num_sms * XQA_TARGET_WAVES)
    m = np.maximum(np.where(adj > 1.0, np.floor(m / adj), m), 1.0)
    cap = np.floor(XQA_MAX_SUB_SEQUENCES / np.asarray(batch, float))
    return np.maximum(np.minimum(m, cap), 1.0)


# TensorRT-LLM's masked-MHA multi-block rule (decoderMaskedMultiheadAttentionLaunch.h
# multi_block_grid_setup and mmha_launch_kernel_ex of the 1.x releases): each (sequence,
# query head) item is split over min(ceil(SMs x blocks per SM / (B x H)), ceil((L + 1) /
# kv_loop)) thread blocks, at least 1; kv_loop = threads per block / threads per value x 8
# (the KV loop's unroll) tokens, threads per value = head dim rounded up to a power of two
# x 2 bytes (the compute type's, whatever the KV cache's) / 16. With B x H <= SMs the launch
# tunes the block to 1024 threads (block_size_factor); one such block resident per SM is
# assumed (the occupancy is not in the tables)
MMHA_BLOCK_THREADS = 1024
MMHA_KV_LOOP_UNROLL = 8
# split counts the masked-MHA wave lines take: the rule's count at ``kv_loop x 2^j - 1``
# cached tokens per sequence, 2^j up to 256 (more than one wave of any profiled GPU's SMs),
# cut to one wave of the SMs (one line per distinct count; the kernel takes the smallest)
MMHA_LINE_SPLITS = tuple(2.0**j for j in range(9))


def mmha_kv_loop_tokens(head_dim: ArrayLike) -> np.ndarray:
    """Tokens one 1024-thread masked-MHA block streams per KV loop (``seq_len_per_kv_loop``):
    the fewest a multi-block split gives each block."""
    d = np.asarray(head_dim, float)
    threads_per_value = 2.0 ** np.ceil(np.log2(d)) * 2.0 / 16.0
    return MMHA_BLOCK_THREADS / threads_per_value * MMHA_KV_LOOP_UNROLL


def mmha_blocks_per_sequence(history_tokens, items, head_dim, num_sms: float) -> np.ndarray:
    """Thread blocks masked MHA's multi-block mode gives each (sequence, query head) item over
    ``history_tokens`` cached tokens, with ``items`` = B x H items in all on ``num_sms`` SMs
    (``multi_block_grid_setup``): at most one wave, at least one KV loop per block."""
    cap = np.ceil(num_sms / np.asarray(items, float))
    need = np.ceil((np.asarray(history_tokens, float) + 1.0) / mmha_kv_loop_tokens(head_dim))
    return np.maximum(np.minimum(cap, need), 1.0)


@dataclass(frozen=True, slots=True)
class DecodeWaveGeometry:
    """The parameter-free part of a multi-block wave kernel's lines
    (:func:`decode_wave_geometry`): the split counts and waves of each line at one set of
    batches and layouts, each array of shape ``(number of lines, *broadcast shape)``
    (``head_dim``, ``q_per_kv``: the broadcast shape). The calibration fitter
    computes it once per set of rows and reuses it at every parameter vector it tries."""

    wave_sms: float
    per_query_head: bool
    head_dim: np.ndarray
    q_per_kv: np.ndarray
    splits: np.ndarray  # m: thread blocks per work item
    full_waves: np.ndarray  # W = floor(I m / S)
    rest_blocks: np.ndarray  # r = I m - W S
    partial: np.ndarray  # 1.0 where r > 0
    # products the lines reuse at every parameter vector: W + [r > 0], max(r, 1), B m, m > 1
    waves: np.ndarray
    rest_at_least_one: np.ndarray
    blocks_per_batch: np.ndarray
    split: np.ndarray

    def take(self, idx: np.ndarray) -> DecodeWaveGeometry:
        """The geometry of the points ``idx`` of a one-dimensional set."""
        return DecodeWaveGeometry(
            self.wave_sms, self.per_query_head, self.head_dim[idx],
            self.q_per_kv[idx], self.splits[:, idx], self.full_waves[:, idx],
            self.rest_blocks[:, idx], self.partial[:, idx], self.waves[:, idx],
            self.rest_at_least_one[:, idx], self.blocks_per_batch[:, idx], self.split[:, idx],
        )  # fmt: skip


def decode_wave_geometry(
    batch: ArrayLike,
    kv_heads: ArrayLike,
    head_dim: ArrayLike,
    q_per_kv: ArrayLike,
    wave_sms: float,
    per_query_head: bool,
) -> DecodeWaveGeometry:
    """Split counts and waves of :func:`decode_wave_lines` on ``wave_sms`` SMs (a
    per-query-head kernel where ``per_query_head``): they depend on the batch and layout,
    not on the kernel's fitted rates."""
    b = np.asarray(batch, float)
    kh = np.asarray(kv_heads, float)
    d = np.asarray(head_dim, float)
    q = np.asarray(q_per_kv, float)
    sms = wave_sms
    items = b * kh * q if per_query_head else b * kh
    lines = len(MMHA_LINE_SPLITS) if per_query_head else len(XQA_LINE_CONTEXTS)
    shape = (lines, *np.broadcast(b, kh, d, q).shape)
    col = (-1,) + (1,) * (len(shape) - 1)
    if per_query_head:
        cap = np.maximum(np.ceil(sms / items), 1.0)
        m = np.broadcast_to(np.minimum(np.array(MMHA_LINE_SPLITS).reshape(col), cap), shape)
    else:
        hist = np.array(XQA_LINE_CONTEXTS, float).reshape(col) - 1.0
        m = np.broadcast_to(xqa_blocks_per_sequence(hist, items, b, sms), shape)
    n = items * m
    full = np.floor(n / sms)
    rest = n - full * sms
    part = (rest > 0.0).astype(float)
    point = shape[1:]
    return DecodeWaveGeometry(
        float(sms), per_query_head, np.broadcast_to(d, point),
        np.broadcast_to(q, point), m, full, rest, part, full + part, np.maximum(rest, 1.0),
        b * m, m > 1.0,
    )  # fmt: skip


def decode_wave_lines(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: ArrayLike,
    kv_heads: ArrayLike,
    head_dim: ArrayLike,
    kv_elem_bytes: float = 2.0,
    q_per_kv: ArrayLike = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A multi-block wave kernel's lines (``p.wave_sms`` > 0): ``(split counts, base_s,
    per_context_token_s)``, each of shape ``(number of lines, *broadcast shape)``; the kernel
    over C cached tokens in all takes ``min(base + per × C)`` over them.

    A grouped kernel (TensorRT-LLM's XQA) makes one work item per (sequence, KV head), ``I =
    B × KH``, split by :func:`xqa_blocks_per_sequence` at :data:`XQA_LINE_CONTEXTS`; a
    per-query-head kernel (``p.reread_bytes_per_s`` > 0: TensorRT-LLM's masked MHA) one per
    (sequence, query head), ``I = B × KH × q_per_kv``, split by
    :func:`mmha_blocks_per_sequence` into :data:`MMHA_LINE_SPLITS` blocks cut to one wave.
    With ``m`` thread blocks per item, ``n = I × m`` blocks run in ``W = floor(n / S)`` full
    waves and a partial one of ``r = n − W S``; each block streams ``T`` tokens of ``2 × D ×
    kv_elem`` bytes: XQA ``C / (B m) + 32`` (half a 64-token tile of rounding), masked MHA
    ``(C / B + 1) / m`` (the new token too). XQA streams them in a full wave at
    ``min(cta_bytes_per_s, hbm × bw_eff / S)`` (every SM's share, and never faster than a
    block alone), in the partial one at ``min(cta_bytes_per_s, hbm × bw_eff / r)``, never
    faster per byte than the group rate allows (``S × q_per_kv / group_bytes_per_s``), so a
    partial wave never takes longer than a full one; masked MHA's ``g = q_per_kv`` query
    heads of a KV head read it once from HBM and ``g`` times from L2, so a full wave streams
    at the longer of ``g × hbm × bw_eff / S`` and ``reread_bytes_per_s / S``, the partial one
    also at most at ``cta_bytes_per_s`` (its wave form is a diagnostic, not shipped: the
    full-wave cap is XQA's only). A block pays ``cta_s + cta_q_elem_s × q × D`` and a split
    item ``split_s + split_elem_s × m × q × D`` (its reduction), ``q`` the query heads of a work
    item (``q_per_kv`` for XQA, 1 for masked MHA). Since ``(W S + r) × T ≥ I × C / B``, no
    line beats the KV bytes at ``hbm × bw_eff``."""
    geometry = decode_wave_geometry(
        batch, kv_heads, head_dim, q_per_kv, p.wave_sms, p.per_query_head
    )
    return decode_wave_lines_of(peaks, p, geometry, kv_elem_bytes)


def decode_wave_lines_of(
    peaks: GpuPeaks, p: DecodeAttentionParams, geometry: DecodeWaveGeometry, kv_elem_bytes: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`decode_wave_lines` from its :func:`decode_wave_geometry` (which must be of
    ``p``'s SMs and kind of kernel)."""
    g = geometry
    per_qh = p.per_query_head
    if g.wave_sms != p.wave_sms or g.per_query_head != per_qh:
        raise ValueError(
            f"wave geometry of {g.wave_sms:g} SMs (per query head: {g.per_query_head}) used "
            f"with a kernel of {p.wave_sms:g} SMs (per query head: {per_qh})"
        )
    d, q = g.head_dim, g.q_per_kv
    m, full, rest, part = g.splits, g.full_waves, g.rest_blocks, g.partial
    sms = p.wave_sms
    bw = peaks.hbm_bytes_per_s * p.bw_eff
    bytes_per_token = 2.0 * d * kv_elem_bytes
    if per_qh:  # the g query heads of a KV head: one HBM read, g from L2
        hbm_per_block = 1.0 / (q * bw)
        l2_per_block = 1.0 / p.reread_bytes_per_s
        full_tok = bytes_per_token * sms * np.maximum(hbm_per_block, l2_per_block)
        rest_tok = bytes_per_token * np.maximum(
            1.0 / p.cta_bytes_per_s, rest * np.maximum(hbm_per_block, l2_per_block)
        )
        qb: np.ndarray | float = 1.0
        extra_tokens: np.ndarray | float = 1.0 / m
    else:
        group = sms * q / p.group_bytes_per_s if p.group_bytes_per_s > 0.0 else 0.0
        # a block streams no faster in a full wave than alone (cta_bytes_per_s): a wave of
        # more blocks never takes less time per token than one of fewer
        full_tok = bytes_per_token * np.maximum(
            np.maximum(sms / bw, 1.0 / p.cta_bytes_per_s), group
        )
        rest_rate = np.minimum(p.cta_bytes_per_s, bw / g.rest_at_least_one)
        rest_tok = bytes_per_token * np.maximum(1.0 / rest_rate, group)
        qb = q
        extra_tokens = 0.5 * XQA_TILE_TOKENS
    per_block_token = full * full_tok + part * rest_tok  # the waves' time per token a block streams
    block = p.cta_s + p.cta_q_elem_s * qb * d
    split = g.split * (p.split_s + p.split_elem_s * m * qb * d)
    base = p.floor_s + g.waves * block + split + extra_tokens * per_block_token
    per = per_block_token / g.blocks_per_batch
    return m, base, per


def decode_wave_time_s(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    geometry: DecodeWaveGeometry,
    context_tokens: ArrayLike,
    kv_elem_bytes: float = 2.0,
) -> np.ndarray:
    """A multi-block wave kernel's seconds over ``context_tokens`` cached tokens in all: the
    smallest of its lines (:func:`decode_wave_lines_of`)."""
    _, base, per = decode_wave_lines_of(peaks, p, geometry, kv_elem_bytes)
    return np.min(base + per * np.asarray(context_tokens, float), axis=0)


def decode_wave_min_lines(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: float,
    kv_heads: float,
    head_dim: float,
    kv_elem_bytes: float = 2.0,
    q_per_kv: float = 1.0,
) -> tuple[tuple[float, float], ...]:
    """:func:`decode_wave_lines` at one batch and layout as ``(base_s, per_token_s)``
    floats, one per distinct split count, steepest first (the smallest count)."""
    m, base, per = decode_wave_lines(peaks, p, batch, kv_heads, head_dim, kv_elem_bytes, q_per_kv)
    out: dict[float, tuple[float, float]] = {}
    for mi, bi, pi in zip(m.ravel(), base.ravel(), per.ravel(), strict=True):
        out.setdefault(float(mi), (float(bi), float(pi)))
    return tuple(out[k] for k in sorted(out))


def decode_attention_time_s(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: ArrayLike,
    context_tokens: ArrayLike,
    kv_heads: ArrayLike,
    head_dim: ArrayLike,
    kv_elem_bytes: float = 2.0,
    reread_group: ArrayLike = 1.0,
    reread_bytes_per_s: float = 0.0,
    q_per_kv: ArrayLike = 1.0,
    longest_history_tokens: ArrayLike | None = None,
) -> np.ndarray:
    """Seconds for one decode-attention kernel over ``batch`` sequences holding
    ``context_tokens`` cached tokens in total (per layer, per GPU shard); ``reread_group``
    > 1: query heads per KV head of a per-query-head kernel, whose query heads each read
    their KV head; ``q_per_kv``: the layout's query heads per KV head, for a grouped
    kernel's group rate (:func:`decode_stream_seconds_per_byte`) and the query-head work
    (:func:`decode_item_seconds`). A kernel with an occupancy term sizes every block's
    shared memory by the batch's longest sequence (``longest_history_tokens``, its cached
    tokens before this step); None: sequences of equal length, ``⌈C / batch − 1⌉``."""
    b = np.asarray(batch, float)
    kh = np.asarray(kv_heads, float)
    d = np.asarray(head_dim, float)
    if p.wave_sms > 0.0:  # a multi-block wave kernel: the smallest of its lines
        geometry = decode_wave_geometry(b, kh, d, q_per_kv, p.wave_sms, p.per_query_head)
        return decode_wave_time_s(peaks, p, geometry, context_tokens, kv_elem_bytes)
    c = np.asarray(context_tokens, float)
    kv_bytes = 2.0 * c * kh * d * kv_elem_bytes
    work = decode_work_heads(p, kh, reread_group)
    items = decode_item_seconds(p, b, work, kh, d, q_per_kv)
    per_byte = decode_stream_seconds_per_byte(
        peaks, p, b, kh, reread_group, reread_bytes_per_s, q_per_kv
    )
    if p.block_bytes_per_s > 0.0:  # masked MHA's resident blocks (its shared memory)
        # TensorRT-LLM sizes the launch's shared memory by the longest past KV length in
        # the batch (gptAttentionPlugin's max_context_kv_len -> params.timestep), so every
        # block of the launch reserves the longest sequence's logits
        hist = (
            np.ceil(c / np.maximum(b, 1.0) - 1.0)  # equal lengths: cached tokens each, whole
            if longest_history_tokens is None
            else np.asarray(longest_history_tokens, float)
        )
        occ = mmha_occupancy_seconds_per_byte(p, hist, b * work, reread_group)
        per_byte = np.maximum(per_byte, occ)
    stream = kv_bytes * per_byte
    stream = stream + decode_split_shortfall_s(p, stream, b, work)
    return (
        decode_attention_floor_s(p, b, kh)
        + p.per_seq_s * b
        + np.maximum(items, stream)
        + (1.0 - p.overlap) * np.minimum(items, stream)
    )


def decode_attention_lines(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: float,
    kv_heads: float,
    head_dim: float,
    kv_elem_bytes: float = 2.0,
    reread_group: float = 1.0,
    reread_bytes_per_s: float = 0.0,
    q_per_kv: float = 1.0,
    history_tokens: float = 0.0,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The two affine functions of the context tokens C whose maximum is
    :func:`decode_attention_time_s` at fixed batch and shape: ``((base, per_token)`` of the
    KV-stream-bound line, ``(base, per_token)`` of the item-bound line``)``. Stream-bound:
    ``fixed + (1 − overlap) × items + stream``; item-bound: ``fixed + items + (1 − overlap)
    × stream`` (equal at the knee, where items = stream). A split-KV kernel
    (``split_fill_s`` > 0, overlap 1) has a third line, :func:`decode_attention_share_line`:
    its stream-bound part is the smaller of that and this stream line, which then carries
    the fill bound (:func:`decode_split_shortfall_s`). A kernel with an occupancy term
    (``block_bytes_per_s`` > 0) has these lines per occupancy regime: the ones of the regime
    holding the batch's longest sequence of ``history_tokens`` cached tokens (C / batch − 1
    where the sequences are of equal length), valid while the longest stays in that regime
    (:func:`mmha_occupancy_regimes`)."""
    work = float(decode_work_heads(p, kv_heads, reread_group))
    fixed = float(decode_attention_floor_s(p, batch, kv_heads)) + p.per_seq_s * batch
    items = float(decode_item_seconds(p, batch, work, kv_heads, head_dim, q_per_kv))
    per_token = _decode_per_token_s(
        peaks, p, batch, kv_heads, head_dim, kv_elem_bytes, reread_group, reread_bytes_per_s,
        q_per_kv, history_tokens,
    )  # fmt: skip
    fill = 0.0
    if p.split_fill_s > 0.0:
        fill = p.split_fill_s * p.par_half_sat / (batch * work + p.par_half_sat)
    return (
        (fixed + (1.0 - p.overlap) * items + fill, per_token),
        (fixed + items, (1.0 - p.overlap) * per_token),
    )


def _decode_per_token_s(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: float,
    kv_heads: float,
    head_dim: float,
    kv_elem_bytes: float,
    reread_group: float,
    reread_bytes_per_s: float,
    q_per_kv: float,
    history_tokens: float,
) -> float:
    """Seconds per context token of a line-form decode kernel's KV stream."""
    work = float(decode_work_heads(p, kv_heads, reread_group))
    per_byte = float(
        decode_stream_seconds_per_byte(
            peaks, p, batch, kv_heads, reread_group, reread_bytes_per_s, q_per_kv
        )
    )
    if p.block_bytes_per_s > 0.0:
        occ = mmha_occupancy_seconds_per_byte(p, history_tokens, batch * work, reread_group)
        per_byte = max(per_byte, float(occ))
    return 2.0 * kv_heads * head_dim * kv_elem_bytes * per_byte


def decode_attention_share_line(
    peaks: GpuPeaks,
    p: DecodeAttentionParams,
    batch: float,
    kv_heads: float,
    head_dim: float,
    kv_elem_bytes: float = 2.0,
    reread_group: float = 1.0,
    reread_bytes_per_s: float = 0.0,
    q_per_kv: float = 1.0,
) -> tuple[float, float] | None:
    """A split-KV kernel's (``split_fill_s`` > 0) other stream-bound line at fixed batch and
    shape, ``(base, per_token)``: the stream at the few items' bandwidth share, ``fixed +
    stream × (1 + h / P)`` (:func:`decode_split_shortfall_s`); with overlap 1 the kernel
    takes ``max(item line, min(stream line, this))`` (:func:`decode_attention_lines`).
    None for other kernels."""
    if p.split_fill_s <= 0.0:
        return None
    work = float(decode_work_heads(p, kv_heads, reread_group))
    fixed = float(decode_attention_floor_s(p, batch, kv_heads)) + p.per_seq_s * batch
    items = float(decode_item_seconds(p, batch, work, kv_heads, head_dim, q_per_kv))
    per_token = _decode_per_token_s(
        peaks, p, batch, kv_heads, head_dim, kv_elem_bytes, reread_group, reread_bytes_per_s,
        q_per_kv, 0.0,
    )  # fmt: skip
    share = 1.0 + p.par_half_sat / (batch * work)
    return (fixed + (1.0 - p.overlap) * items, per_token * share)


def prefill_attention_flop(pairs: ArrayLike, heads: ArrayLike, head_dim: ArrayLike) -> np.ndarray:
    """FLOP of causal attention: QK^T and PV, 2 FLOP per multiply-add, per query-key pair."""
    return 4.0 * np.asarray(pairs, float) * np.asarray(heads, float) * np.asarray(head_dim, float)


def causal_pairs(new_tokens: ArrayLike, cached_tokens: ArrayLike = 0) -> np.ndarray:
    """Query-key pairs when ``new_tokens`` attend causally after ``cached_tokens``."""
    c = np.asarray(new_tokens, float)
    return c * np.asarray(cached_tokens, float) + c * (c + 1.0) / 2.0


def prefill_attention_time_s(
    peaks: GpuPeaks,
    p: PrefillAttentionParams,
    num_seqs: ArrayLike,
    new_tokens: ArrayLike,
    pairs: ArrayLike,
    heads: ArrayLike,
    head_dim: ArrayLike,
    dtype: str = "bf16",
) -> np.ndarray:
    """Seconds for one causal prefill-attention kernel (per layer, per GPU shard).

    ``new_tokens`` is the batch's total of new tokens, ``pairs`` its total query-key pairs
    (see :func:`causal_pairs`)."""
    mean_len = np.asarray(new_tokens, float) / np.maximum(np.asarray(num_seqs, float), 1.0)
    eff = p.max_eff * mean_len / (mean_len + p.half_sat)
    return p.floor_s + prefill_attention_flop(pairs, heads, head_dim) / (
        peaks.flop_per_s(dtype) * eff
    )


def elementwise_time_s(peaks: GpuPeaks, p: ElementwiseParams, nbytes: ArrayLike) -> np.ndarray:
    return p.launch_s + np.asarray(nbytes, float) / (peaks.hbm_bytes_per_s * p.bw_eff)


FP8_SCALE_BYTES_PER_ELEM = 2.0  # a dynamic per-tensor scale reads the bf16 activations once


def fp8_dynamic_scale_time_s(
    peaks: GpuPeaks, p: GemmParams, m: ArrayLike, k: ArrayLike
) -> np.ndarray:
    """Seconds a dynamically quantised FP8 GEMM of ``m`` tokens × ``k`` inputs spends on its
    per-tensor activation scale before quantising: a fixed time (TensorRT-LLM's
    ``quantize_e4m3_per_tensor``: a memset of the scale and an amax kernel on a fixed
    1024 × 1024 grid, ``invokeComputeScalesAndQuantizeMatrix``) plus one read of the bf16
    activations. 0 where the profile does not fit it (``dynamic_scale_bw_eff`` 0). Not part
    of a step (engines load static scales); the kernel tables whose rows quantise
    dynamically hold it."""
    mk = np.asarray(m, float) * np.asarray(k, float)
    if p.dynamic_scale_bw_eff <= 0:
        return np.zeros_like(mk)
    return p.dynamic_scale_s + FP8_SCALE_BYTES_PER_ELEM * mk / (
        peaks.hbm_bytes_per_s * p.dynamic_scale_bw_eff
    )


def allreduce_time_s(p: AllReduceParams, nbytes: ArrayLike, num_gpus: int) -> np.ndarray:
    """Seconds for a ring all-reduce of ``nbytes`` over ``num_gpus`` (0 for one GPU): the
    faster of the fitted protocols (Simple, and LL when the profile has it)."""
    s = np.asarray(nbytes, float)
    if num_gpus <= 1:
        return np.zeros_like(s)
    ring = 2.0 * (num_gpus - 1) / num_gpus * s
    times = [lat + ring / bus_bw for lat, bus_bw in p.protocols_for_gpus(num_gpus)]
    return np.minimum.reduce(times) if len(times) > 1 else times[0]


def copy_time_s(p: CopyParams, nbytes: ArrayLike, num_blocks: ArrayLike = 0) -> np.ndarray:
    return (
        p.latency_s
        + np.asarray(nbytes, float) / p.bw_bytes_per_s
        + p.per_block_s * np.asarray(num_blocks, float)
    )
