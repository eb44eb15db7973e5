"""The hit share the planner expects from a workload, without running the engine.

:func:`expected_hit_share` replays a workload's prefix chains through
:class:`~disaggsim.cache.worker.WorkerKvCache` objects in arrival order, each request
admitted, committed and released at once (no two requests overlap in time, so a block
is reusable by the very next request). That is an idealisation of time, not of
capacity or placement:

- ``routing="cache_aware"``: the pool acts as one cache of ``num_workers`` times the
  per-worker capacity — cache-aware routing sends a prefix to where it is cached and
  load balancing spreads the distinct prefixes, so the workers' caches add up;
- ``routing="round_robin"``: request ``i`` goes to worker ``i mod num_workers``, each
  with its own capacity, and hits only what that worker cached;
- ``capacity_tokens_per_worker=None``: unbounded (with ``cache_aware``, the figure an
  unbounded shared store allows; ``tests/test_cache_estimate.py`` checks it equals the
  independent computation of :mod:`disaggsim.workload.reuse`).

The capacity to pass is what a worker can keep for cached prefixes: its KV capacity
less the KV its running requests hold on average (the planner knows both). How the
planner uses the share is in ``docs/prefix-caching.md`` ("The planner").
Work: a few dict operations per block of every prompt (the Mooncake conversation trace,
288,500 blocks, takes about a second).
"""

from __future__ import annotations

from typing import Literal

from disaggsim.cache.worker import CachePolicyName, WorkerKvCache
from disaggsim.workload.requests import Requests

UNBOUNDED_TOKENS = 2**62
"""A capacity no workload reaches: the cache never evicts."""


def expected_hit_share(
    requests: Requests,
    *,
    num_workers: int = 1,
    capacity_tokens_per_worker: int | None = None,
    routing: Literal["cache_aware", "round_robin"] = "cache_aware",
    policy: CachePolicyName = "radix",
) -> float:
    """Prefix hit tokens / prompt tokens over the workload (0 without prefix chains)."""
    chains = requests.prefix_chains
    prompt = requests.prompt_tokens
    total = int(prompt.sum())
    if chains is None or total == 0:
        return 0.0
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if routing == "cache_aware":
        caches = 1
        capacity = (
            None if capacity_tokens_per_worker is None else capacity_tokens_per_worker * num_workers
        )
    elif routing == "round_robin":
        caches = num_workers
        capacity = capacity_tokens_per_worker
    else:
        raise ValueError(f"unknown routing {routing!r} (allowed: cache_aware, round_robin)")
    size = UNBOUNDED_TOKENS if capacity is None else int(capacity)
    workers = [WorkerKvCache(w, size, chains.block_tokens, 1, policy) for w in range(caches)]
    hit = 0
    for i in range(len(requests)):
        cache = workers[i % caches]
        admission = cache.admit(i, chains.chain(i), int(prompt[i]))
        if admission is None:
            continue  # a prompt larger than the cache: nothing cached, nothing hit
        hit += admission.lookup.hit_tokens
        cache.commit(i)
        cache.release(i)
    return hit / total
