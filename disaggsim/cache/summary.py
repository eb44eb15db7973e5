"""Prefix-cache metrics: the summary keys and time-series columns (pure functions).

Per request the engine records the prompt tokens and the hit tokens by tier its
admission lookup found (``Lookup.tier_hit_tokens``: the hit prefix, without the last
prompt token). The summary sums them over the requests counted in the run's summary::

    prompt_tokens_total      = sum(prompt_tokens)
    prefix_hit_tokens        = sum(hbm + dram + remote hit tokens)
    prefix_hit_share         = prefix_hit_tokens / prompt_tokens_total
    prefix_hit_share_<tier>  = sum(<tier> hit tokens) / prompt_tokens_total

so the three tier shares add up to ``prefix_hit_share``. A request admitted more than
once (preempted or re-routed after a worker loss) counts its last admission.
"""

from __future__ import annotations

import numpy as np

SUMMARY_KEYS: tuple[str, ...] = (
    "prompt_tokens_total",
    "prefix_hit_tokens",
    "prefix_hit_share",
    "prefix_hit_share_hbm",
    "prefix_hit_share_dram",
    "prefix_hit_share_remote",
)

TIMESERIES_COLUMNS: tuple[str, ...] = (
    "cache_hbm_tokens",  # per worker: WorkerKvCache.tokens_total (cached + pending)
    "cache_hbm_pinned_tokens",  # per worker: WorkerKvCache.pinned_tokens
    "cache_hbm_pending_tokens",  # per worker: WorkerKvCache.pending_tokens
    "cache_dram_tokens",  # per node: BlockStore.tokens of its DRAM tier
    "cache_remote_tokens",  # the remote store's BlockStore.tokens
)
"""Cache occupancy columns, sampled like the other time series (one row per sample and
worker, or node for DRAM, or once for the remote store)."""


def prefix_summary(
    prompt_tokens: np.ndarray,
    hbm_hit_tokens: np.ndarray,
    dram_hit_tokens: np.ndarray,
    remote_hit_tokens: np.ndarray,
) -> dict[str, float | int]:
    """The summary keys of :data:`SUMMARY_KEYS` from per-request columns."""
    prompt = int(np.sum(prompt_tokens, dtype=np.int64))
    tiers = [
        int(np.sum(t, dtype=np.int64)) for t in (hbm_hit_tokens, dram_hit_tokens, remote_hit_tokens)
    ]
    hit = sum(tiers)
    if hit > prompt:
        raise ValueError(f"hit tokens {hit} exceed prompt tokens {prompt}")

    def share(x: int) -> float:
        return x / prompt if prompt else 0.0

    return {
        "prompt_tokens_total": prompt,
        "prefix_hit_tokens": hit,
        "prefix_hit_share": share(hit),
        "prefix_hit_share_hbm": share(tiers[0]),
        "prefix_hit_share_dram": share(tiers[1]),
        "prefix_hit_share_remote": share(tiers[2]),
    }
