"""Prefix caching: KV blocks reused across requests that share a prompt prefix.

Pure Python, no simpy: the engine calls these objects at its state changes
(``docs/prefix-caching.md``, "Engine integration contract").

- :class:`WorkerKvCache` — one worker's HBM blocks (``lru`` or ``radix`` eviction) and
  the lower tiers it reads through; :class:`BlockStore` — a DRAM or remote tier;
- :func:`cache_aware_costs`, :func:`pick_lowest_cost`, :class:`OverlapIndex` — the
  cache-aware router's cost (Dynamo's) and its global view of cached blocks;
- :func:`expected_hit_share` — the planner's estimate from a workload;
- :func:`prefix_summary` — the summary keys; :class:`CacheConfig` — the ``cache:`` section.
"""

from disaggsim.cache.config import CacheConfig, validate_cache_section
from disaggsim.cache.estimate import expected_hit_share
from disaggsim.cache.routing import (
    OverlapIndex,
    cache_aware_costs,
    pick_lowest_cost,
    uncached_prompt_tokens,
)
from disaggsim.cache.store import BlockStore
from disaggsim.cache.summary import SUMMARY_KEYS, TIMESERIES_COLUMNS, prefix_summary
from disaggsim.cache.worker import (
    CACHE_POLICIES,
    Admission,
    Commit,
    Eviction,
    Lookup,
    WorkerKvCache,
)

__all__ = [
    "CACHE_POLICIES",
    "SUMMARY_KEYS",
    "TIMESERIES_COLUMNS",
    "Admission",
    "BlockStore",
    "CacheConfig",
    "Commit",
    "Eviction",
    "Lookup",
    "OverlapIndex",
    "WorkerKvCache",
    "cache_aware_costs",
    "expected_hit_share",
    "pick_lowest_cost",
    "prefix_summary",
    "uncached_prompt_tokens",
    "validate_cache_section",
]
