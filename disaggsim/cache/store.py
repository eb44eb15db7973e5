"""A lower KV tier: host DRAM of one node, or the shared remote store.

A :class:`BlockStore` holds *copies* of blocks (canonical prefix ids, see
``disaggsim/workload/chains.py``) under a capacity in tokens, least recently used first
out. Nothing in it is pinned: a request that hits a block here gets it copied up into
its worker's HBM and uses that copy, so the store may drop its own at any time.
``capacity_tokens=None`` is unbounded (the ideal shared store).
"""

from __future__ import annotations

from collections import OrderedDict


class BlockStore:
    """Block copies under an LRU capacity (tokens). ``tier`` names it in results."""

    __slots__ = ("tier", "capacity_tokens", "tokens", "_blocks")

    def __init__(self, tier: str, capacity_tokens: int | None) -> None:
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"{tier}: capacity_tokens must be >= 0, got {capacity_tokens}")
        self.tier = tier
        self.capacity_tokens = capacity_tokens
        self.tokens = 0  # tokens held now
        self._blocks: OrderedDict[int, int] = OrderedDict()  # id -> tokens, LRU first

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def touch(self, block_id: int) -> None:
        """Mark a held block as just used (a hit)."""
        self._blocks.move_to_end(block_id)

    def put(self, block_id: int, tokens: int) -> bool:
        """Store a copy (or refresh one), evicting least recently used blocks to fit.
        Returns whether the block is held afterwards (a block larger than the whole
        capacity is not stored)."""
        blocks = self._blocks
        if block_id in blocks:
            blocks.move_to_end(block_id)
            return True
        cap = self.capacity_tokens
        if cap is not None:
            if tokens > cap:
                return False
            while self.tokens + tokens > cap:
                _, old = blocks.popitem(last=False)
                self.tokens -= old
        blocks[block_id] = tokens
        self.tokens += tokens
        return True

    def clear(self) -> None:
        """The tier is lost (its node or service went down)."""
        self._blocks.clear()
        self.tokens = 0
