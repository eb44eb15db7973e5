"""Plain-number inputs of the ``slo`` policy, derived from a worker's cost model, and
the cold-start delay. Duck-typed on the ``WorkerCost`` methods, so the constant-cost
test double works as well as the roofline model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from disaggsim.autoscale.config import PoolAutoscaleConfig
from disaggsim.costmodel.interface import DecodeLines, decode_step_time_s


class _PrefillCost(Protocol):
    def prefill_time_s(self, num_seqs: int, new_tokens: int, attn_pairs: float) -> float: ...


def prefill_tokens_per_s(cost: _PrefillCost, *, max_batch_tokens: int, prompt_tokens: int) -> float:
    """Prefill throughput of one worker running full batches of ``prompt_tokens``-long
    prompts: ``k = max(1, max_batch_tokens // prompt_tokens)`` prompts per batch,
    ``k × prompt_tokens / prefill_time_s(k, k × prompt_tokens, k × p (p + 1) / 2)``."""
    if prompt_tokens < 1 or max_batch_tokens < 1:
        raise ValueError("prompt_tokens and max_batch_tokens must be >= 1")
    k = max(1, max_batch_tokens // prompt_tokens)
    tokens = k * prompt_tokens
    pairs = k * prompt_tokens * (prompt_tokens + 1) / 2.0
    return tokens / cost.prefill_time_s(k, tokens, pairs)


def decode_step_fn(cost: DecodeLines) -> Callable[[int, float], float]:
    """``f(batch_seqs, context_tokens)``: one decode step as the engine times it
    (:func:`~disaggsim.costmodel.interface.decode_step_time_s`): ``base + per_token ×
    context`` from ``cost.decode_coeffs(batch_seqs)``, or the cost model's second line
    (``decode_item_coeffs``: per-sequence attention work at short contexts, an eager
    engine's launch floor) where that is longer."""

    def step_s(batch_seqs: int, context_tokens: float) -> float:
        return decode_step_time_s(cost, int(batch_seqs), context_tokens)

    return step_s


def cold_start_s(weights_bytes_per_gpu: float, cfg: PoolAutoscaleConfig) -> float:
    """Seconds from a scale-up decision until the new worker serves:
    ``provision_s + weights_bytes_per_gpu / (weights_load_gb_per_s × 1e9)`` (the GPUs of
    a TP group load their shards in parallel)."""
    if weights_bytes_per_gpu < 0:
        raise ValueError(f"weights_bytes_per_gpu must be >= 0, got {weights_bytes_per_gpu}")
    return cfg.provision_s + weights_bytes_per_gpu / cfg.weights_load_bytes_per_s
