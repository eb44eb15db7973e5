"""EP/DP layouts and unit sizes for an MoE pool: the search the planner calls per pool.

:func:`search_moe_layouts` enumerates every valid ``(tp, dp, ep)`` layout of each
candidate unit size (GPUs per worker: sub-node sizes and whole nodes), builds its cost
model (:func:`disaggsim.costmodel.moe.build_cost`) and ranks the layouts by what one GPU
delivers in that role:

- ``prefill``: prompt tokens per second per GPU, running batches of ``dp ×
  max(1, tokens_per_rank // prompt_tokens)`` whole prompts; with ``ttft_s``, the layouts
  that prefill one prompt alone within half of it first (a prompt prefills on one DP
  rank, so data-parallel attention trades a prompt's latency for throughput, and a prompt
  that arrives while another prefills waits for it: within the whole target a worker
  meets it only when idle. DeepSeek-V3 on 16 H200, 8000-token prompts, TTFT 1 s: tp1 x
  dp16 prefills one in 1.25 s, tp2 x dp4 in 0.81 s, tp8 in 0.39 s);
- ``decode``: output tokens per second per GPU at the largest batch whose step stays
  within ``itl_s`` with ``context_tokens`` cached per sequence and fits the KV capacity
  (found by bisection on the batch: step time grows with the batch).

It is a static first guess, like :mod:`disaggsim.plan.analytic` for dense pools: queueing,
the handoff and failures are the simulator's job. Layouts that do not fit (weights or
KV) are skipped; the reason for each is kept in ``skipped``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from disaggsim.catalog import get_gpu, get_model
from disaggsim.costmodel.moe import build_cost, valid_layouts
from disaggsim.errors import UserError

__all__ = ["LayoutEstimate", "LayoutSearch", "search_moe_layouts", "unit_sizes"]

ROLES = ("prefill", "decode")
# a prefill layout is ranked first when one prompt alone takes at most this share of the
# TTFT target (one prompt ahead of it in the queue leaves the rest of the target)
TTFT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class LayoutEstimate:
    role: str
    gpus: int
    nodes: int
    tp: int
    dp: int
    ep: int
    batch: int  # sequences per iteration over the whole worker
    step_s: float
    tokens_per_s_per_gpu: float  # prefill: prompt tokens; decode: output tokens
    kv_capacity_tokens: int
    # prefill: one prompt alone takes over half the TTFT target (ranked after the rest)
    slow_for_ttft: bool = False

    @property
    def label(self) -> str:
        return f"{self.gpus} GPUs (tp{self.tp} x dp{self.dp}, ep{self.ep})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayoutSearch:
    estimates: tuple[LayoutEstimate, ...]  # best first
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (layout, reason)

    @property
    def best(self) -> LayoutEstimate:
        if not self.estimates:
            raise UserError(
                "no layout fits: " + "; ".join(f"{k}: {r}" for k, r in self.skipped[:3])
            )
        return self.estimates[0]


def unit_sizes(gpus_per_node: int, max_nodes: int) -> tuple[int, ...]:
    """Candidate GPUs per worker: powers of two inside a node, then whole nodes."""
    sizes = [g for g in (1, 2, 4, 8, 16, 32, 64) if g < gpus_per_node]
    sizes += [n * gpus_per_node for n in range(1, max_nodes + 1)]
    return tuple(sizes)


def search_moe_layouts(
    model: str,
    gpu: str,
    role: str,
    *,
    prompt_tokens: int = 2048,
    context_tokens: int = 2048,
    itl_s: float = 0.05,
    tokens_per_rank: int = 8192,
    max_nodes: int = 4,
    sizes: tuple[int, ...] | None = None,
    weight_dtype: str = "released",
    kv_dtype: str = "bf16",
    moe: dict | None = None,
    gpus_per_node: int | None = None,
    ttft_s: float | None = None,
) -> LayoutSearch:
    """Rank the layouts of ``model`` on ``gpu`` for one pool ``role`` (see module doc);
    ``gpus_per_node``: the cluster's node size (a topology fabric's), else the catalog's;
    ``ttft_s``: the TTFT target whose :data:`TTFT_SHARE` a prefill layout's one prompt
    is held to (None: none)."""
    if role not in ROLES:
        raise UserError(f"role: {role!r} (allowed: {', '.join(ROLES)})")
    m = get_model(model)
    g = get_gpu(gpu)
    gpn = gpus_per_node or g.gpus_per_node
    out: list[LayoutEstimate] = []
    skipped: list[tuple[str, str]] = []
    for gpus in sizes or unit_sizes(gpn, max_nodes):
        redundant = int((moe or {}).get("redundant_experts") or 0)
        for tp, dp, ep in valid_layouts(m, gpus, gpn, redundant):
            key = f"{gpus} GPUs tp{tp} dp{dp} ep{ep}"
            if m.moe is None and (dp > 1 or ep > 1):
                continue
            try:
                cost = build_cost(
                    m,
                    g,
                    tp,
                    dp=dp,
                    ep=ep if m.moe is not None else None,
                    moe=moe if m.moe is not None else None,
                    weight_dtype=weight_dtype,
                    kv_dtype=kv_dtype,
                    gpus_per_node=gpn,
                )
            except UserError as e:
                skipped.append((key, str(e)))
                continue
            est = (
                _prefill(cost, gpus, tp, dp, ep, gpn, prompt_tokens, tokens_per_rank)
                if role == "prefill"
                else _decode(cost, gpus, tp, dp, ep, gpn, context_tokens, itl_s)
            )
            if est is None:
                skipped.append((key, _why_none(cost, role, prompt_tokens, context_tokens, itl_s)))
                continue
            if role == "prefill" and ttft_s is not None:
                p = prompt_tokens
                alone_s = cost.prefill_time_s(1, p, p * (p + 1) / 2.0)
                est = replace(est, slow_for_ttft=alone_s > TTFT_SHARE * ttft_s)
            out.append(est)
    out.sort(key=lambda e: (e.slow_for_ttft, -e.tokens_per_s_per_gpu, e.gpus, e.tp))
    return LayoutSearch(tuple(out), tuple(skipped))


def _why_none(cost, role: str, prompt: int, ctx: int, itl_s: float) -> str:
    """Why :func:`_prefill` or :func:`_decode` found no batch for a layout."""
    tokens = prompt if role == "prefill" else ctx
    if cost.kv_capacity_tokens < tokens:
        return f"its KV holds {cost.kv_capacity_tokens} tokens, under one {tokens}-token sequence"
    step_s = cost.decode_time_s(1, ctx)
    return (
        f"a decode step of one {ctx}-token sequence takes {step_s * 1e3:.4g} ms, over the "
        f"ITL target of {itl_s * 1e3:.4g} ms"
    )


def _nodes(gpus: int, gpn: int) -> int:
    return -(-gpus // gpn)


def _prefill(cost, gpus, tp, dp, ep, gpn, prompt, tokens_per_rank) -> LayoutEstimate | None:
    seqs = dp * max(1, tokens_per_rank // prompt)
    if seqs * prompt > cost.kv_capacity_tokens:
        seqs = max(cost.kv_capacity_tokens // prompt, 0)
    if seqs < 1:
        return None
    t = cost.prefill_time_s(seqs, seqs * prompt, seqs * prompt * (prompt + 1) / 2.0)
    return LayoutEstimate(
        "prefill", gpus, _nodes(gpus, gpn), tp, dp, ep, seqs, t,
        seqs * prompt / t / gpus, cost.kv_capacity_tokens,
    )  # fmt: skip


def _decode(cost, gpus, tp, dp, ep, gpn, ctx, itl_s) -> LayoutEstimate | None:
    cap = cost.kv_capacity_tokens // max(ctx, 1)
    if cap < 1 or cost.decode_time_s(1, ctx) > itl_s:
        return None
    lo, hi = 1, cap
    if cost.decode_time_s(hi, hi * ctx) <= itl_s:
        lo = hi
    while hi - lo > 1:  # largest batch within the ITL target
        mid = (lo + hi) // 2
        if cost.decode_time_s(mid, mid * ctx) <= itl_s:
            lo = mid
        else:
            hi = mid
    t = cost.decode_time_s(lo, lo * ctx)
    return LayoutEstimate(
        "decode", gpus, _nodes(gpus, gpn), tp, dp, ep, lo, t,
        lo / t / gpus, cost.kv_capacity_tokens,
    )  # fmt: skip
