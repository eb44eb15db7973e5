"""Prefix-hash chains of a request table, in columnar form.

A request's prompt is cut into blocks of ``block_tokens`` tokens (the last one may be
partial); its *chain* is one id per block. Ids here are **canonical prefix ids**: two
blocks have the same id exactly when their whole prefix is the same (the same tokens up to
and including the block). A prefix cache can therefore key blocks by id alone, and a
chain walk stops at the first id it does not hold.

Storage is two flat int64 arrays, no per-request Python objects: ``ids`` holds every
chain back to back and request ``i``'s chain is ``ids[offsets[i]:offsets[i + 1]]``.
Every chain has exactly ``ceil(prompt_tokens / block_tokens)`` blocks, and block ``k`` of
a prompt of ``L`` tokens covers ``min(block_tokens, L - k * block_tokens)`` tokens.

Traces carry raw hashes (Mooncake ``hash_ids``) whose meaning is the trace's own;
:func:`canonical_chains` turns them into canonical ids by keying each block on (id of
its parent, raw hash, tokens it covers). For a trace whose hashes already are prefix
hashes of full-content blocks (both published Mooncake traces: every hash occurs at one
position, after one parent, covering one token count) this is a renaming that changes no
equality; for other traces it makes equal ids mean equal prefixes by construction. A
prompt clipped mid-block gets a new id for its shortened last block (shared with prompts
clipped the same way, never with the full block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PrefixChains:
    """Canonical prefix ids of every request, ``ids[offsets[i]:offsets[i + 1]]`` for
    request ``i``; ids are dense in ``[0, num_ids)``."""

    ids: np.ndarray  # int64, every chain back to back
    offsets: np.ndarray  # int64, len = requests + 1, offsets[0] = 0
    block_tokens: int  # tokens per (full) block
    num_ids: int  # ids are in [0, num_ids)

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if len(self.offsets) < 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.ids):
            raise ValueError("PrefixChains offsets must start at 0 and end at len(ids)")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_blocks(self) -> np.ndarray:
        """Blocks per request (int64)."""
        return np.diff(self.offsets)

    def chain(self, i: int) -> list[int]:
        """Request ``i``'s chain as a list of Python ints (what a cache walks)."""
        return self.ids[self.offsets[i] : self.offsets[i + 1]].tolist()

    def take(self, index: np.ndarray) -> PrefixChains:
        """The chains of the requests at ``index`` (in that order); ids keep their values
        (a subset of canonical chains is canonical)."""
        index = np.asarray(index, dtype=np.int64)
        starts, ends = self.offsets[index], self.offsets[index + 1]
        counts = ends - starts
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # position of every output block in the flat input: start of its chain + rank
        rank = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
        ids = self.ids[np.repeat(starts, counts) + rank]
        return PrefixChains(ids, offsets, self.block_tokens, self.num_ids)


def blocks_for(prompt_tokens: np.ndarray | int, block_tokens: int) -> np.ndarray:
    """``ceil(prompt_tokens / block_tokens)``: the blocks a prompt is cut into."""
    return -(-np.asarray(prompt_tokens, dtype=np.int64) // block_tokens)


def block_token_counts(prompt_tokens: int, block_tokens: int) -> list[int]:
    """Tokens each block of a ``prompt_tokens`` prompt covers (the last may be partial)."""
    n = -(-prompt_tokens // block_tokens)
    return [min(block_tokens, prompt_tokens - k * block_tokens) for k in range(n)]


def canonical_chains(
    raw: Sequence[Sequence[object]] | PrefixChains,
    prompt_tokens: np.ndarray,
    block_tokens: int,
) -> PrefixChains:
    """Canonical prefix ids for raw per-request hash chains.

    Block ``k`` of request ``i`` is keyed by (canonical id of block ``k - 1``, raw hash,
    tokens covered); keys get dense ids in order of first appearance. ``raw[i]`` may be
    longer than ``ceil(prompt_tokens[i] / block_tokens)`` (a clipped prompt: extra
    hashes are dropped) but not shorter (callers check: a trace whose hashes do not
    cover its prompt is a user error).
    """
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)
    counts = blocks_for(prompt_tokens, block_tokens)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    fast = _already_canonical(raw, counts, offsets, prompt_tokens, block_tokens)
    if fast is not None:
        return fast
    return _canonical_loop(raw, counts, offsets, prompt_tokens, block_tokens)


def _canonical_loop(
    raw: Sequence[Sequence[object]] | PrefixChains,
    counts: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_tokens: int,
) -> PrefixChains:
    """The general path: one dict lookup per block."""
    ids = np.empty(int(offsets[-1]), dtype=np.int64)
    table: dict[tuple[int, object, int], int] = {}
    get_raw = raw.chain if isinstance(raw, PrefixChains) else raw.__getitem__
    pos = 0
    for i in range(len(counts)):
        n = int(counts[i])
        hashes = get_raw(i)
        if len(hashes) < n:
            raise ValueError(f"request {i}: {len(hashes)} hashes for {n} blocks")
        tail = int(prompt_tokens[i]) - (n - 1) * block_tokens
        parent = -1
        for k in range(n):
            key = (parent, hashes[k], block_tokens if k < n - 1 else tail)
            cid = table.get(key)
            if cid is None:
                cid = table[key] = len(table)
            ids[pos] = cid
            parent = cid
            pos += 1
    return PrefixChains(ids, offsets, block_tokens, len(table))


def _already_canonical(
    raw: Sequence[Sequence[object]] | PrefixChains,
    counts: np.ndarray,
    offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    block_tokens: int,
) -> PrefixChains | None:
    """Vectorised path for raw integer hashes that already are prefix ids (every hash
    after one parent hash, covering one token count: the published Mooncake traces).
    Returns the same ids as the general loop (dense, in order of first appearance), or
    None when the raw hashes are not of that kind."""
    if isinstance(raw, PrefixChains):
        if not np.array_equal(raw.num_blocks, counts):
            return None
        flat = raw.ids
    else:
        if any(len(h) != c for h, c in zip(raw, counts.tolist(), strict=True)):
            return None
        try:
            flat = np.fromiter(
                (h for hashes in raw for h in hashes), dtype=np.int64, count=int(offsets[-1])
            )
        except (TypeError, ValueError, OverflowError):
            return None
    n = len(flat)
    if n == 0:
        return PrefixChains(flat.astype(np.int64), offsets, block_tokens, 0)
    first = np.zeros(n, dtype=bool)
    first[offsets[:-1][counts > 0]] = True
    parent = np.empty(n, dtype=np.int64)
    parent[1:] = flat[:-1]
    is_last = np.zeros(n, dtype=bool)
    is_last[offsets[1:][counts > 0] - 1] = True
    tail = prompt_tokens - (counts - 1) * block_tokens
    cover = np.full(n, block_tokens, dtype=np.int64)
    cover[is_last] = tail[counts > 0]
    # every occurrence of a hash must agree with its first one on parent and coverage
    uniq, first_at, inverse = np.unique(flat, return_index=True, return_inverse=True)
    ref = first_at[inverse]
    if not (
        np.array_equal(first[ref], first)
        and np.array_equal(parent[ref][~first], parent[~first])
        and np.array_equal(cover[ref], cover)
    ):
        return None
    # a hash that is some block's parent must not start another chain, nor vice versa
    # (covered above: `first` agrees). Dense ids by first appearance:
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first_at, kind="stable")] = np.arange(len(uniq), dtype=np.int64)
    return PrefixChains(rank[inverse], offsets, block_tokens, len(uniq))
