"""Eviction order of a worker's HBM prefix cache: which unpinned block goes first.

A policy never decides *whether* to evict (the cache does, to stay under its limit)
nor sees pinned blocks as candidates; it only orders the blocks no running request
uses. Two policies, as the production engines implement them:

- :class:`LruPolicy` — vLLM's automatic prefix caching: unpinned blocks wait in one
  queue in the order they were released, and a request releases its chain tail first,
  so the oldest release goes first and, within one release, the deepest block first.
  The queue does not look at the tree: were an inner block ever first, its cached
  descendants would stay in memory unreachable (a chain walk stops at the gap). With
  disaggsim's whole-chain pins it never is (``worker.py`` explains why), and the two
  policies pick the same victims; they differ in what gets cached.
- :class:`RadixPolicy` — SGLang's RadixAttention: the cache is a radix tree and only an
  unpinned *leaf* (a block with no cached child) can go, the least recently accessed
  first (ties: lowest id). Evicting a leaf can make its parent a leaf. The tree never
  holds a block whose parent is missing.

Both are O(1) or O(log n) per block event. The cache calls the hooks; ``tracks_children``
says whether it must keep child counts up to date for the policy.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol


class EvictionPolicy(Protocol):
    tracks_children: bool

    def on_unpinned(self, block_id: int) -> None:
        """The block's last user released it."""

    def on_pinned(self, block_id: int) -> None:
        """A request started using the (unpinned) block."""

    def on_leaf(self, block_id: int) -> None:
        """The block's last cached child left the cache (radix only)."""

    def on_removed(self, block_id: int) -> None:
        """The block left the cache (evicted or dropped)."""

    def victim(self) -> int | None:
        """The next block to evict, or None when no block can be evicted."""

    def clear(self) -> None: ...


class LruPolicy:
    """vLLM-style: evict in release order (see the module docstring)."""

    tracks_children = False

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict()

    def on_unpinned(self, block_id: int) -> None:
        self._queue[block_id] = None
        self._queue.move_to_end(block_id)

    def on_pinned(self, block_id: int) -> None:
        self._queue.pop(block_id, None)

    def on_leaf(self, block_id: int) -> None:
        pass

    def on_removed(self, block_id: int) -> None:
        self._queue.pop(block_id, None)

    def victim(self) -> int | None:
        return next(iter(self._queue), None)

    def clear(self) -> None:
        self._queue.clear()


class RadixPolicy:
    """SGLang-style: evict the least recently accessed unpinned leaf.

    ``state(block_id)`` returns ``(refs, children, tick)`` of a cached block, or None
    when it is not cached; heap entries that no longer match are skipped (lazy
    deletion).
    """

    tracks_children = True

    __slots__ = ("_heap", "_state")

    def __init__(self, state: Callable[[int], tuple[int, int, int] | None]) -> None:
        self._heap: list[tuple[int, int]] = []  # (tick, block_id)
        self._state = state

    def _push_if_candidate(self, block_id: int) -> None:
        s = self._state(block_id)
        if s is not None and s[0] == 0 and s[1] == 0:
            heapq.heappush(self._heap, (s[2], block_id))

    def on_unpinned(self, block_id: int) -> None:
        self._push_if_candidate(block_id)

    def on_pinned(self, block_id: int) -> None:
        pass  # its heap entry is skipped when popped (refs > 0)

    def on_leaf(self, block_id: int) -> None:
        self._push_if_candidate(block_id)

    def on_removed(self, block_id: int) -> None:
        pass

    def victim(self) -> int | None:
        heap = self._heap
        while heap:
            tick, block_id = heap[0]
            s = self._state(block_id)
            if s is not None and s[0] == 0 and s[1] == 0 and s[2] == tick:
                return block_id
            heapq.heappop(heap)  # stale: pinned, has children, touched since, or gone
        return None

    def clear(self) -> None:
        self._heap.clear()
