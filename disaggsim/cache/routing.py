"""Cache-aware routing: which worker should prefill a request, given what each caches.

The cost is NVIDIA Dynamo's KV router's (docs.nvidia.com/dynamo, "KV Router" / "Router
Design"): ``cost = overlap_weight * prefill_blocks + decode_blocks``, lowest wins, where
``prefill_blocks`` is the prompt work the worker would have (its queued prefill plus
this request's uncached tokens) and ``decode_blocks`` the KV it would hold (its active
KV plus this request's). disaggsim counts tokens instead of blocks (the same ranking:
both terms scale by one block size) and breaks ties by the lowest worker id, which is
what Dynamo's deterministic mode (temperature 0) picks up to its tie order::

    cost_w = overlap_weight * (queued_prefill_tokens_w + prompt_tokens - overlap_tokens_w)
             + active_kv_tokens_w + prompt_tokens

``queued_prefill_tokens_w`` is the prefill work already booked on ``w``: Dynamo's router
books each request it routes at its *uncached* tokens on the chosen worker,
:func:`uncached_prompt_tokens` (``ActiveSequences::add_request`` adds ``new_tokens(isl,
overlap)`` to the worker's ``active_tokens``), and removes that same amount when the
prefill completes (``mark_prefill_completed``); the cost of a worker is then
``new_tokens(isl, overlap_w) + active_tokens_w`` prefill tokens
(``potential_blocks_and_tokens``; ai-dynamo/dynamo ``lib/llm/src/kv_router/sequence.rs``
@581ee33). ``overlap_weight`` defaults to 1.0, Dynamo's ``--kv-overlap-score-weight`` default;
higher values favour cache reuse (TTFT), lower ones even load (ITL). ``overlap_tokens_w``
is the request's prefix already cached in worker ``w``'s HBM (capped like a hit at
``prompt_tokens - 1``); host-DRAM and remote-store hits are not credited, as in Dynamo's
original cost (device overlap only).

:class:`OverlapIndex` is the router's global view (Dynamo's KvIndexer): for every cached
block, the workers holding it. One walk along the request's chain yields every
worker's overlap, in work proportional to the chain and to the workers that hold its
first block — not to the fleet. Workers holding none of it all have overlap 0, so the
best of them is the one with the least ``overlap_weight * queued + active``, which the
engine can keep in a heap (``docs/prefix-caching.md``, engine integration contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_OVERLAP_WEIGHT = 1.0


def uncached_prompt_tokens(prompt_tokens: int, overlap_tokens: int) -> int:
    """Prompt tokens a worker holding ``overlap_tokens`` of the prompt in HBM must
    compute: ``prompt_tokens - min(overlap_tokens, prompt_tokens - 1)`` (the last prompt
    token is always computed). What the router books as a routed request's queued
    prefill on the worker it picks, and takes off again when the request leaves that
    worker's queue (Dynamo's ``new_tokens(isl, overlap)``)."""
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    if overlap_tokens < 0:
        raise ValueError(f"overlap_tokens must be >= 0, got {overlap_tokens}")
    return prompt_tokens - min(overlap_tokens, prompt_tokens - 1)


def cache_aware_costs(
    overlap_tokens: np.ndarray | Sequence[int],
    queued_prefill_tokens: np.ndarray | Sequence[int],
    active_kv_tokens: np.ndarray | Sequence[int],
    prompt_tokens: int,
    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
) -> np.ndarray:
    """Dynamo's routing cost of each worker for one request (tokens; lower is better).

    Parameters
    ----------
    overlap_tokens : per worker, the request's prefix cached in its HBM.
    queued_prefill_tokens : per worker, prefill work routed there and not yet
        prefilled, each request counted at its uncached tokens on that worker when it
        was routed (:func:`uncached_prompt_tokens`).
    active_kv_tokens : per worker, KV tokens held by its running requests.
    prompt_tokens : the request's prompt length.
    overlap_weight : weight of the prefill term (>= 0).
    """
    overlap = np.minimum(np.asarray(overlap_tokens, dtype=np.float64), max(prompt_tokens - 1, 0))
    queued = np.asarray(queued_prefill_tokens, dtype=np.float64)
    active = np.asarray(active_kv_tokens, dtype=np.float64)
    prefill = queued + prompt_tokens - overlap
    decode = active + prompt_tokens
    return overlap_weight * prefill + decode


def pick_lowest_cost(costs: np.ndarray | Sequence[float], worker_ids: Sequence[int]) -> int:
    """The worker with the lowest cost; ties go to the lowest worker id."""
    costs = np.asarray(costs, dtype=np.float64)
    if len(costs) == 0 or len(costs) != len(worker_ids):
        raise ValueError("need one cost per worker and at least one worker")
    best = costs.min()
    return min(w for w, c in zip(worker_ids, costs, strict=True) if c == best)


class OverlapIndex:
    """Which workers hold each cached block in HBM; a
    :class:`~disaggsim.cache.worker.CacheListener` for every worker of a pool."""

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[int, set[int]] = {}

    def added(self, worker_id: int, block_id: int) -> None:
        self._holders.setdefault(block_id, set()).add(worker_id)

    def removed(self, worker_id: int, block_id: int) -> None:
        holders = self._holders.get(block_id)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[block_id]

    def holders(self, block_id: int) -> frozenset[int]:
        return frozenset(self._holders.get(block_id, ()))

    def overlaps(
        self, chain: Sequence[int], prompt_tokens: int, block_tokens: int
    ) -> dict[int, int]:
        """Per worker holding the chain's first block, the tokens of its longest cached
        prefix of the chain (capped at ``prompt_tokens - 1``). Workers not listed have
        overlap 0."""
        out: dict[int, int] = {}
        if not chain:
            return out
        live = set(self._holders.get(chain[0], ()))
        tokens = 0
        cap = max(prompt_tokens - 1, 0)
        for k, bid in enumerate(chain):
            holders = self._holders.get(bid)
            keep = live & holders if holders else set()
            for w in live - keep:
                out[w] = min(tokens, cap)
            live = keep
            if not live:
                break
            tokens += min(block_tokens, prompt_tokens - k * block_tokens)
        for w in live:
            out[w] = min(tokens, cap)
        return out
