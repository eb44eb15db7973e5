"""Multi-head latent attention (DeepSeek-V2/V3): projection shapes, FLOP and bytes, and the
attention-kernel time formulas the MoE step model sums and ``calibration.fit_moe`` fits.

Shapes per layer on one GPU of an attention TP group of ``tp`` (``hq = heads / tp``;
V3: hidden 7168, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128):

- ``q_a`` (hidden → q_lora) and ``kv_a`` (hidden → kv_lora + rope) are replicated on
  every GPU of the group (their outputs are small); ``q_b`` (q_lora → hq × (nope +
  rope)) and ``o`` (hq × v → hidden) are sharded by heads.
- **naive prefill** (the MHA form): ``kv_b`` up-projects the latent of every new token
  (kv_lora → hq × (nope + v)); attention FLOP = ``2 × pairs × hq × (qk_head + v)``.
- **absorbed** (decode, and prefill when chosen): ``W_UK`` / ``W_UV`` become per-head
  batched GEMMs on the query / output (``2 × tokens × hq × nope × kv_lora`` and
  ``2 × tokens × hq × kv_lora × v`` FLOP); attention runs over the latent:
  FLOP = ``2 × pairs × hq × ((kv_lora + rope) + kv_lora)``, and a decode step reads
  ``(kv_lora + rope) × kv_elem`` bytes per cached token once for all heads.

Decode time of B sequences holding C cached tokens (per layer, per GPU):
``floor_s + per_seq_s × B + C × max((kv_lora + rope) × elem / (hbm × bw_eff),
2 × hq × (2 kv_lora + rope) / (peak × compute_eff))`` — the max of two terms linear in C,
so the step stays affine in the context at fixed batch (the engine's contract). With
128 local heads the kernel does ~240 FLOP per byte, near the H100 ridge, which is why
the compute term exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from disaggsim.catalog import MlaSpec, ModelSpec
from disaggsim.costmodel.moe_params import MlaDecodeParams, MlaPrefillParams

__all__ = [
    "MLA_PREFILL_FORMS",
    "MlaShapes",
    "mla_decode_attention_s",
    "mla_decode_flop_per_token",
    "mla_prefill_attention_s",
    "mla_prefill_flop_per_pair",
    "mla_shapes",
    "Num",
    "vmax",
]

MLA_PREFILL_FORMS = ("absorbed", "naive")
Num = float | np.ndarray  # the formulas take floats (engine) or whole table columns (fitter)


def vmax(a: Num, b: Num) -> Num:
    """``max(a, b)`` for floats (cheap in the engine's hot loop), elementwise for arrays
    (the fitter evaluates the same formulas on whole tables)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a > b else b


@dataclass(frozen=True, slots=True)
class MlaShapes:
    """One layer's MLA GEMM shapes ``(n, k)`` on one GPU, per token row."""

    heads: int  # local query heads
    projections: tuple[tuple[float, float], ...]  # q_a, q_b, kv_a, o (every token)
    kv_b: tuple[float, float]  # naive prefill: latent up-projection (prefill tokens)
    bmm_pre: tuple[float, float]  # absorbed: per head, nope -> kv_lora (n, k)
    bmm_post: tuple[float, float]  # absorbed: per head, kv_lora -> v
    cache_elems: int  # kv_lora + rope values cached per token per layer
    replicated_params: int  # q_a, kv_a and their norms (on every GPU of the group)
    sharded_params: int  # q_b, kv_b, o on this GPU


def mla_shapes(model: ModelSpec, tp: int) -> MlaShapes:
    a: MlaSpec | None = model.mla
    assert a is not None
    hq = model.num_heads // tp
    h = model.hidden
    q_in = a.q_lora_rank or h
    proj: list[tuple[float, float]] = []
    replicated = h * a.cache_elems_per_token + a.kv_lora_rank
    if a.q_lora_rank:
        proj.append((float(a.q_lora_rank), float(h)))
        replicated += h * a.q_lora_rank + a.q_lora_rank
    proj += [
        (float(hq * a.qk_head_dim), float(q_in)),
        (float(a.cache_elems_per_token), float(h)),
        (float(h), float(hq * a.v_head_dim)),
    ]
    sharded = (
        q_in * hq * a.qk_head_dim
        + a.kv_lora_rank * hq * (a.qk_nope_head_dim + a.v_head_dim)
        + hq * a.v_head_dim * h
    )
    return MlaShapes(
        heads=hq,
        projections=tuple(proj),
        kv_b=(float(hq * (a.qk_nope_head_dim + a.v_head_dim)), float(a.kv_lora_rank)),
        bmm_pre=(float(a.kv_lora_rank), float(a.qk_nope_head_dim)),
        bmm_post=(float(a.v_head_dim), float(a.kv_lora_rank)),
        cache_elems=a.cache_elems_per_token,
        replicated_params=replicated,
        sharded_params=sharded,
    )


def mla_decode_flop_per_token(mla: MlaSpec, heads: float) -> float:
    """Absorbed attention FLOP per cached token: q·k over kv_lora + rope, p·v over kv_lora."""
    return 2.0 * heads * (mla.cache_elems_per_token + mla.kv_lora_rank)


def mla_prefill_flop_per_pair(mla: MlaSpec, heads: float, form: str) -> float:
    """Causal attention FLOP per query-key pair in the ``absorbed`` or ``naive`` form."""
    if form == "absorbed":
        return 2.0 * heads * (mla.cache_elems_per_token + mla.kv_lora_rank)
    return 2.0 * heads * (mla.qk_head_dim + mla.v_head_dim)


def mla_decode_attention_s(
    p: MlaDecodeParams,
    peak_flop_per_s: float,
    hbm_bytes_per_s: float,
    batch: Num,
    context_tokens: Num,
    heads: Num,
    cache_bytes_per_token: Num,
    flop_per_token: Num,
) -> Num:
    """Seconds of one absorbed MLA decode kernel over ``batch`` sequences holding
    ``context_tokens`` cached tokens in all (numpy arrays or floats)."""
    mem = cache_bytes_per_token / (hbm_bytes_per_s * p.bw_eff)
    comp = flop_per_token / (peak_flop_per_s * p.compute_eff)
    per_token = vmax(comp, mem)
    return p.floor_s + p.per_seq_s * batch + context_tokens * per_token


def mla_prefill_attention_s(
    p: MlaPrefillParams,
    peak_flop_per_s: float,
    num_seqs: Num,
    new_tokens: Num,
    pairs: Num,
    flop_per_pair: Num,
) -> Num:
    """Seconds of one MLA prefill attention kernel (numpy arrays or floats)."""
    mean_len = new_tokens / vmax(num_seqs, 1.0)
    eff = p.max_eff * mean_len / (mean_len + p.half_sat)
    return p.floor_s + pairs * flop_per_pair / (peak_flop_per_s * eff)
