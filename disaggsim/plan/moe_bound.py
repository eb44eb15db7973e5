"""An upper bound on the goodput per GPU of an MoE family (docs/planning.md, §2).

The analytic capacity of :mod:`disaggsim.plan.analytic` is no bound for MoE layouts (a
colocated pool's mixed iterations share the expert weights between its decode and prefill
tokens), so the search bounds an MoE family with the floor of its iterations instead
(:meth:`disaggsim.costmodel.moe.MoeWorkerCost.iteration_floor`): every iteration of a
worker takes at least ``floor(m, C, P)`` for ``m`` tokens, ``C`` decode context tokens and
``P`` prefill attention pairs, and ``floor(m) / m`` does not rise with ``m``. Served in
iterations of at most ``M`` tokens, a request's tokens therefore keep the worker busy for at
least

    T = tokens · floor(M) / M + kv_s_per_context_token · K + attn_s_per_pair · pairs

seconds (means over the scenario's requests): prefill ``new`` prompt tokens (the prompt
less what an unbounded prefix cache could hit: the workload's own ceiling on reuse),
pairs ``L(L+1)/2`` without a cache (0 with one), decode ``o − 1`` tokens over contexts of
at least ``K = (o−1)·L + (o−1)(o−2)/2`` tokens. ``M``: a disaggregated prefill worker's
token budget (at least the longest prompt); a decode worker's ``max_batch_seqs``, and no
more sequences than its KV holds at the shortest prompt; a colocated worker both
(``max_batch_seqs`` plus its largest token budget or chunk).

A disaggregated family of ``n_p`` prefill workers of ``G_p`` GPUs and ``n_d`` decode workers
of ``G_d`` serves ``r ≤ min(n_p / T_p, n_d / T_d)`` requests/s, so per GPU of its own
``r / (n_p G_p + n_d G_d) ≤ 1 / (G_p T_p + G_d T_d)`` whatever the worker counts; a colocated
family ``1 / (G T)``. SLOs only lower goodput, so this is a bound on it (the search still
multiplies it by its pruning slack: a finite run can measure a goodput slightly above the
capacity before its queues visibly grow).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from disaggsim.costmodel.moe import IterationFloor

__all__ = ["RequestWork", "colocated_bound_per_gpu", "disaggregated_bound_per_gpu", "request_work"]


@dataclass(frozen=True, slots=True)
class RequestWork:
    """Means over the requests of the work that cannot be avoided (tokens, context)."""

    new_prompt_tokens: float  # prompt tokens a prefill computes, at least
    prefill_pairs: float  # prefill attention pairs, at least
    decode_tokens: float  # decode steps (output tokens less the prefill's first)
    decode_context_tokens: float  # context tokens those steps read, at least
    min_prompt_tokens: int


def request_work(
    prompts: np.ndarray, outputs: np.ndarray, max_hit_share: float = 0.0
) -> RequestWork:
    """The work of the scenario's requests; ``max_hit_share``: the most of the prompt
    tokens a prefix cache can hit (0: no cache). Pairs count only without a cache."""
    p = np.asarray(prompts, dtype=np.float64)
    d = np.maximum(np.asarray(outputs, dtype=np.float64) - 1.0, 0.0)
    share = min(max(max_hit_share, 0.0), 1.0)
    pairs = float(np.mean(p * (p + 1.0) / 2.0)) if share <= 0 else 0.0
    return RequestWork(
        new_prompt_tokens=float(np.mean(p)) * (1.0 - share),
        prefill_pairs=pairs,
        decode_tokens=float(np.mean(d)),
        decode_context_tokens=float(np.mean(d * p + d * (d - 1.0) / 2.0)),
        min_prompt_tokens=int(np.min(prompts)),
    )


def _prefill_s(f: IterationFloor, w: RequestWork, max_tokens: float) -> float:
    return w.new_prompt_tokens * f.token_floor_s(max_tokens) + f.attn_s_per_pair * w.prefill_pairs


def _decode_s(f: IterationFloor, w: RequestWork, max_seqs: float) -> float:
    return (
        w.decode_tokens * f.token_floor_s(max_seqs)
        + f.kv_s_per_context_token * w.decode_context_tokens
    )


def decode_batch_limit(max_batch_seqs: int, kv_capacity_tokens: int, w: RequestWork) -> int:
    """Most sequences a decode iteration can hold: the batch limit, and no more than the
    worker's KV holds at the shortest prompt plus its first token."""
    return max(1, min(max_batch_seqs, kv_capacity_tokens // (w.min_prompt_tokens + 1)))


def disaggregated_bound_per_gpu(
    prefill: IterationFloor,
    prefill_gpus: int,
    prefill_max_tokens: int,
    decode: IterationFloor,
    decode_gpus: int,
    decode_max_seqs: int,
    w: RequestWork,
) -> float:
    """Requests/s per GPU no deployment of these two worker layouts can exceed."""
    t = prefill_gpus * _prefill_s(prefill, w, prefill_max_tokens) + decode_gpus * _decode_s(
        decode, w, decode_max_seqs
    )
    return 1.0 / t if t > 0 else float("inf")


def colocated_bound_per_gpu(
    floor: IterationFloor, gpus: int, max_tokens: int, w: RequestWork
) -> float:
    """Requests/s per GPU no colocated pool of this worker layout can exceed, every
    iteration holding at most ``max_tokens`` tokens (decode and prefill together)."""
    per_token = floor.token_floor_s(max_tokens)
    t = (
        (w.new_prompt_tokens + w.decode_tokens) * per_token
        + floor.attn_s_per_pair * w.prefill_pairs
        + floor.kv_s_per_context_token * w.decode_context_tokens
    )
    return 1.0 / (gpus * t) if t > 0 else float("inf")
