"""Prefix caching as the engine drives it (``docs/prefix-caching.md``, "Engine
integration contract").

:class:`PrefixSetup` is what the engine is told: the validated ``cache:`` section, the
requests' prefix chains, how long promotions take on a ``kind: link`` fabric and how
workers group into nodes. :class:`PrefixCaches` builds, for the pool that prefills
(prefill workers of a disaggregated deployment), one
:class:`~disaggsim.cache.WorkerKvCache` per worker, one DRAM
:class:`~disaggsim.cache.BlockStore` per node, the optional remote store and the pool's
:class:`~disaggsim.cache.OverlapIndex` (the cache-aware router's view), and records per
request the hit tokens by tier of its last admission (:class:`PrefixLog`).

Nodes: on a ``kind: topology`` fabric a worker's node is where the topology placed it
(its first rank's node); otherwise workers fill nodes of ``gpus_per_node`` GPUs in worker
order (two TP4 workers share an 8-GPU node and its DRAM).

The worker side (admission into a prefill batch, commit, release, loss) is in
:class:`~disaggsim.engine.workers.PrefillWorker`; every call is per request or per block
of one request's chain, never per token.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from disaggsim.cache import BlockStore, CacheConfig, OverlapIndex, WorkerKvCache
from disaggsim.cache.worker import stored_bytes_per_token, worker_kv_bytes
from disaggsim.costmodel.interface import WorkerCost
from disaggsim.workload.chains import PrefixChains

if TYPE_CHECKING:
    from disaggsim.engine.workers import Worker

# (worker's cost, bytes host DRAM -> GPU over PCIe, bytes remote store -> GPU over the
# NIC) -> seconds until both copies are done
PromoteTime = Callable[[WorkerCost, int, int], float]


def default_promote_time(cost: WorkerCost, pcie_bytes: int, nic_bytes: int) -> float:
    """Each GPU of the worker copies its shard of the KV over its own PCIe link and its
    own NIC (50 GB/s each), the two tiers in parallel."""
    g = max(cost.num_gpus, 1)
    return max(pcie_bytes, nic_bytes) / g / 50e9


@dataclass(frozen=True, slots=True)
class PrefixSetup:
    """Prefix caching for one run (``None`` in :class:`EngineConfig`: no cache)."""

    cache: CacheConfig
    chains: PrefixChains
    promote_time: PromoteTime = default_promote_time
    gpus_per_node: int = 8


class PrefixLog:
    """Per request, the hit tokens by tier of its last admission through a cache (0
    when it hit nothing or was never admitted)."""

    __slots__ = ("dram_hit_tokens", "hbm_hit_tokens", "remote_hit_tokens")

    def __init__(self, n: int) -> None:
        self.hbm_hit_tokens = array("q", bytes(8 * n))
        self.dram_hit_tokens = array("q", bytes(8 * n))
        self.remote_hit_tokens = array("q", bytes(8 * n))

    def record(self, rid: int, tiers: tuple[int, int, int]) -> None:
        self.hbm_hit_tokens[rid], self.dram_hit_tokens[rid], self.remote_hit_tokens[rid] = tiers

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(hbm, dram, remote)`` hit tokens per request."""
        return (
            np.asarray(self.hbm_hit_tokens, dtype=np.int64),
            np.asarray(self.dram_hit_tokens, dtype=np.int64),
            np.asarray(self.remote_hit_tokens, dtype=np.int64),
        )


class PrefixCaches:
    """The caches of the workers that prefill, their tiers and the pool's overlap index."""

    def __init__(
        self,
        setup: PrefixSetup,
        prompt_tokens: Sequence[int],
        placed_nodes: dict[int, int] | None = None,
    ) -> None:
        self.setup = setup
        self._prompt_tokens = prompt_tokens
        self.cfg = setup.cache
        self.chains = setup.chains
        self.block_tokens = setup.chains.block_tokens
        self.index = OverlapIndex()
        self.log = PrefixLog(len(prompt_tokens))
        self.remote: BlockStore | None = None
        self.dram: dict[int, BlockStore] = {}  # per node
        self._node_gpus: list[int] = []  # GPUs placed on each node so far (no topology)
        self._placed = placed_nodes  # worker index -> topology node
        self.node_of: dict[int, int] = {}  # worker index -> node
        self.by_worker: dict[int, WorkerKvCache] = {}

    def chain(self, rid: int) -> list[int]:
        return self.chains.chain(rid)

    def prompt_tokens(self, rid: int) -> int:
        return self._prompt_tokens[rid]

    def attach(self, w: Worker) -> WorkerKvCache:
        """Build worker ``w``'s cache (on the next node with room for its GPUs)."""
        kvb = int(w.cost.kv_bytes_per_token)
        stored = stored_bytes_per_token(w.cost, self.block_tokens)
        cfg = self.cfg
        if cfg.has_remote and self.remote is None:
            self.remote = BlockStore("remote", cfg.remote_tokens(stored))
        if self._placed is not None and w.index in self._placed:
            node = self._placed[w.index]
        else:
            gpus = max(int(w.cost.num_gpus), 1)
            per_node = max(self.setup.gpus_per_node, gpus)
            if not self._node_gpus or self._node_gpus[-1] + gpus > per_node:
                self._node_gpus.append(0)
            node = len(self._node_gpus) - 1
            self._node_gpus[node] += gpus
        dram_tokens = cfg.dram_tokens(stored)
        if dram_tokens is not None and node not in self.dram:
            self.dram[node] = BlockStore("dram", dram_tokens)
        self.node_of[w.index] = node
        cache = WorkerKvCache(
            w.index,
            int(w.cost.kv_capacity_tokens),
            self.block_tokens,
            kvb,
            cfg.policy,
            dram=self.dram.get(node),
            remote=self.remote,
            listener=self.index,
            kv_bytes=worker_kv_bytes(w.cost),
        )
        self.by_worker[w.index] = cache
        return cache

    def dram_tokens_of(self, worker_index: int) -> int:
        store = self.dram.get(self.node_of.get(worker_index, -1))
        return 0 if store is None else store.tokens

    def remote_tokens(self) -> int:
        return 0 if self.remote is None else self.remote.tokens

    def workers(self) -> Sequence[int]:
        return list(self.by_worker)
