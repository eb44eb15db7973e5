"""The prefix cache of one worker: HBM blocks, plus the lower tiers it reads through.

Blocks are identified by canonical prefix ids (``disaggsim/workload/chains.py``): an id
names a block *and its whole prefix*, so one dict lookup per block answers "is this
prefix cached" and a request's lookup is a walk along its chain that stops at the first
miss — work per request and per block, never per token.

What a worker's HBM holds, in tokens (``tokens_total``):

- **cached blocks**: computed KV that later requests can hit. A block is *pinned* while
  any running request uses it (reference counted) and *unpinned* (evictable) otherwise.
  The eviction order of unpinned blocks is the policy's (:mod:`disaggsim.cache.policies`:
  ``lru`` as vLLM, ``radix`` as SGLang). Pinned blocks are never evicted.
- **pending blocks**: the uncached suffix of admitted requests, allocated at admission
  and private to the request until its prefill computes them (:meth:`commit`); then they
  become cached blocks (or, when another request committed the same block meanwhile, the
  private copy is freed and the shared one used). Under ``lru`` a prompt's partial last
  block is never cached (vLLM hashes full blocks only): it stays private until release.

The two policies differ in what they cache (partial last blocks: ``radix`` yes, ``lru``
no) more than in what they evict: a request pins and releases its whole chain, so a
block is never released before any of its descendants and the least recently released
unpinned block is always a leaf; vLLM's release-ordered queue and SGLang's
least-recently-used leaf then pick the same victims (the hand-built tests show both).

Lower tiers (:class:`~disaggsim.cache.store.BlockStore`, shared objects): the host DRAM
of the worker's node and an optional remote store shared by every worker. A lookup
walks each block through HBM, then DRAM, then the remote store; the hit prefix may mix
tiers. Admission copies lower-tier hits up into HBM (promotion: DRAM over PCIe, the
remote store over the NIC) and the results say how many bytes each link carries, so the
engine can issue the fabric flows. Blocks evicted from HBM are copied down to DRAM
(demotion, write-back); newly computed blocks are written through to the remote store
at :meth:`commit` (as Mooncake's prefill nodes put KV into Mooncake Store).

Bytes a copy moves (promotion, demotion, write-through) come from one function,
``kv_bytes(tokens)``: the KV one sequence of ``tokens`` tokens holds, the same
:func:`~disaggsim.costmodel.interface.context_kv_bytes` that sizes KV handoffs and swap
copies (full-attention layers keep every token, sliding/chunked layers at most their
window). A *stored* block (demoted to DRAM, written through to the remote store) holds
``kv_bytes(t)`` for its ``t`` tokens: a later hit may end at that block, and then its
windowed layers need the block's own tokens (at most the window). A *promotion* moves
only what continuing the prompt after the hit needs: with the hit prefix ending at token
``h``, the block covering tokens ``[a, b)`` moves ``kv_bytes(h - a) - kv_bytes(h - b)``
(its full-attention layers whole, its windowed layers where the block lies within the
window before ``h``), so promoting a whole hit prefix moves ``kv_bytes(h)``, exactly what
a handoff of it moves. Without a window every layer keeps every token and all three are
``t × kv_bytes_per_token``.

The cache never holds more than the limit the engine gives it: :meth:`admit` evicts
unpinned blocks to fit and refuses (changing nothing) when even evicting all of them
would not; :meth:`evict_to` shrinks it when the engine needs memory for something else.
The last prompt token is never a hit (``docs/prefix-caching.md``): its forward pass
yields the first output token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol

from disaggsim.cache.policies import EvictionPolicy, LruPolicy, RadixPolicy
from disaggsim.cache.store import BlockStore
from disaggsim.costmodel.interface import WorkerCost, context_kv_bytes

CachePolicyName = Literal["lru", "radix"]
CACHE_POLICIES: tuple[str, ...] = ("lru", "radix")

KvBytes = Callable[[int], int]
"""Bytes of KV one sequence of ``tokens`` tokens holds on a worker (all its GPUs)."""


def worker_kv_bytes(cost: WorkerCost) -> KvBytes | None:
    """The cache's ``kv_bytes`` for a worker: the cost model's
    :func:`~disaggsim.costmodel.interface.context_kv_bytes` (the function handoffs and
    swaps use), or None when every layer keeps every token (then a copy of ``t`` tokens
    is ``t × kv_bytes_per_token`` and the cache keeps its integer arithmetic)."""
    if getattr(cost, "context_kv_bytes", None) is None:
        return None
    return partial(context_kv_bytes, cost)


def stored_bytes_per_token(cost: WorkerCost, block_tokens: int) -> float:
    """Bytes a DRAM or remote tier spends per token of a stored full block
    (``kv_bytes(block_tokens) / block_tokens``): what a tier's GiB convert to tokens with
    (:meth:`CacheConfig.dram_tokens`). Equals ``kv_bytes_per_token`` without a window."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    return context_kv_bytes(cost, block_tokens) / block_tokens


class CacheListener(Protocol):
    """Told when a block becomes hit-able in a worker's HBM and when it stops being so
    (e.g. :class:`~disaggsim.cache.routing.OverlapIndex`, the router's global view)."""

    def added(self, worker_id: int, block_id: int) -> None: ...

    def removed(self, worker_id: int, block_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where a chain's blocks are. The hit prefix is the first ``hit_blocks`` blocks;
    ``*_block_tokens`` are the tokens those blocks cover per tier. The hit *tokens*
    exclude the last prompt token (it is always computed): see :attr:`hit_tokens`."""

    prompt_tokens: int
    hit_blocks: int
    hbm_blocks: int
    dram_blocks: int
    remote_blocks: int
    hbm_block_tokens: int
    dram_block_tokens: int
    remote_block_tokens: int
    last_tier: str  # tier of the last hit block ("" when nothing hit)

    @property
    def hit_tokens(self) -> int:
        """Tokens the prefill skips: the hit blocks' tokens, at most prompt - 1."""
        total = self.hbm_block_tokens + self.dram_block_tokens + self.remote_block_tokens
        return min(total, max(self.prompt_tokens - 1, 0))

    @property
    def new_tokens(self) -> int:
        """Tokens the prefill computes (>= 1)."""
        return self.prompt_tokens - self.hit_tokens

    def tier_hit_tokens(self) -> tuple[int, int, int]:
        """Hit tokens by tier ``(hbm, dram, remote)``, summing to :attr:`hit_tokens`
        (the recomputed last token is taken from the tier of the last hit block)."""
        tiers = {
            "hbm": self.hbm_block_tokens,
            "dram": self.dram_block_tokens,
            "remote": self.remote_block_tokens,
        }
        excess = sum(tiers.values()) - self.hit_tokens
        if excess:
            tiers[self.last_tier] -= excess
        return tiers["hbm"], tiers["dram"], tiers["remote"]


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted request: its lookup and the bytes each link must carry before its
    prefill can use the blocks (promotions) or because room was made (demotions)."""

    lookup: Lookup
    promote_pcie_bytes: int  # DRAM -> HBM, host to device over the worker's PCIe
    promote_nic_bytes: int  # remote store -> HBM over the worker's NIC
    demote_pcie_bytes: int  # HBM -> DRAM copies of the blocks evicted to make room
    evicted_tokens: int


@dataclass(frozen=True, slots=True)
class Commit:
    """Blocks a prefill computed became cached."""

    committed_tokens: int  # pending tokens that became cached blocks
    deduplicated_tokens: int  # of those, already cached by another request (copy freed)
    remote_put_bytes: int  # written through to the remote store over the NIC


@dataclass(frozen=True, slots=True)
class Eviction:
    freed_tokens: int
    demote_pcie_bytes: int
    reached: bool  # tokens_total <= the limit afterwards


class _Block:
    __slots__ = ("tokens", "parent", "refs", "children", "tick")

    def __init__(self, tokens: int, parent: int, refs: int, tick: int) -> None:
        self.tokens = tokens
        self.parent = parent  # id of the previous block of the chain, -1 for a first block
        self.refs = refs  # running requests using it
        self.children = 0  # cached child blocks (kept for the radix policy)
        self.tick = tick  # last access (logical clock)


class _Held:
    """A running request's hold on the cache."""

    __slots__ = ("chain", "prompt_tokens", "pinned", "next_pos", "pending_tokens")

    def __init__(self, chain: list[int], prompt_tokens: int) -> None:
        self.chain = chain
        self.prompt_tokens = prompt_tokens
        self.pinned: list[int] = []  # cached blocks it holds, in chain order
        self.next_pos = 0  # first chain position not yet a cached block it holds
        self.pending_tokens = 0  # private tokens of positions >= next_pos


class WorkerKvCache:
    """One worker's prefix cache (see the module docstring).

    Parameters
    ----------
    worker_id : the worker's id (passed to the listener).
    capacity_tokens : the most tokens HBM may hold (the worker's KV capacity).
    block_tokens : tokens per full block (the workload's hash block).
    kv_bytes_per_token : bytes a token's KV takes when moved (all layers and shards)
        when every layer keeps every token.
    policy : ``"lru"`` or ``"radix"``.
    dram : the host DRAM tier of the worker's node (shared by its workers), or None.
    remote : the shared remote store, or None.
    listener : told when blocks become hit-able here and stop being so.
    kv_bytes : bytes of KV a sequence of ``tokens`` tokens holds (:func:`worker_kv_bytes`
        of the worker's cost); None: ``tokens × kv_bytes_per_token``. Sizes every copy
        (module docstring).
    """

    def __init__(
        self,
        worker_id: int,
        capacity_tokens: int,
        block_tokens: int,
        kv_bytes_per_token: int,
        policy: CachePolicyName = "radix",
        dram: BlockStore | None = None,
        remote: BlockStore | None = None,
        listener: CacheListener | None = None,
        kv_bytes: KvBytes | None = None,
    ) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.worker_id = worker_id
        self.capacity_tokens = capacity_tokens
        self.block_tokens = block_tokens
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_bytes = kv_bytes
        self.dram = dram
        self.remote = remote
        self.listener = listener
        self._blocks: dict[int, _Block] = {}
        self._held: dict[int, _Held] = {}
        self._tick = 0
        self.cached_tokens = 0  # tokens of cached blocks, pinned or not
        self.unpinned_tokens = 0  # of those, not used by any running request
        self.pending_tokens = 0  # private tokens of admitted requests, not yet computed
        self._policy: EvictionPolicy
        match policy:
            case "lru":
                self._policy = LruPolicy()
            case "radix":
                self._policy = RadixPolicy(self._state)
            case _:
                raise ValueError(f"unknown cache policy {policy!r} (allowed: lru, radix)")
        self.policy = policy
        self.caches_partial_blocks = policy == "radix"
        """``radix`` caches a prompt's partial last block too (SGLang's tree is
        token-granular); ``lru`` caches full blocks only (vLLM hashes full blocks)."""

    # --- occupancy (O(1), for time series) ----------------------------------------

    @property
    def tokens_total(self) -> int:
        """HBM tokens the cache holds: cached blocks plus pending suffixes."""
        return self.cached_tokens + self.pending_tokens

    @property
    def pinned_tokens(self) -> int:
        return self.cached_tokens - self.unpinned_tokens

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def holds(self, request_id: int) -> bool:
        return request_id in self._held

    def is_cached(self, block_id: int) -> bool:
        """Whether the block is a cached (hit-able) HBM block here."""
        return block_id in self._blocks

    def refs(self, block_id: int) -> int:
        """Running requests using a cached block (0 when unpinned or not cached)."""
        b = self._blocks.get(block_id)
        return 0 if b is None else b.refs

    # --- the engine's calls ---------------------------------------------------------

    def lookup(self, chain: Sequence[int], prompt_tokens: int) -> Lookup:
        """Where the chain's blocks are (changes nothing)."""
        blocks, dram, remote = self._blocks, self.dram, self.remote
        bt = self.block_tokens
        counts = [0, 0, 0]
        tokens = [0, 0, 0]
        last = -1
        for k, bid in enumerate(chain):
            if bid in blocks:
                tier = 0
            elif dram is not None and bid in dram:
                tier = 1
            elif remote is not None and bid in remote:
                tier = 2
            else:
                break
            counts[tier] += 1
            tokens[tier] += min(bt, prompt_tokens - k * bt)
            last = tier
        hit = counts[0] + counts[1] + counts[2]
        return Lookup(
            prompt_tokens=prompt_tokens,
            hit_blocks=hit,
            hbm_blocks=counts[0],
            dram_blocks=counts[1],
            remote_blocks=counts[2],
            hbm_block_tokens=tokens[0],
            dram_block_tokens=tokens[1],
            remote_block_tokens=tokens[2],
            last_tier=("hbm", "dram", "remote")[last] if last >= 0 else "",
        )

    def admit(
        self,
        request_id: int,
        chain: Sequence[int],
        prompt_tokens: int,
        limit_tokens: int | None = None,
    ) -> Admission | None:
        """Start a request: pin its hit prefix, copy lower-tier hits up into HBM and
        allocate its uncached suffix (pending until :meth:`commit`), evicting unpinned
        blocks so that ``tokens_total <= limit_tokens`` (default: ``capacity_tokens``).

        Returns None, changing nothing, when even evicting every unpinned block would
        not make room (the engine waits or preempts, then retries).
        """
        if request_id in self._held:
            raise ValueError(f"request {request_id} is already admitted")
        limit = (
            self.capacity_tokens
            if limit_tokens is None
            else min(limit_tokens, self.capacity_tokens)
        )
        look = self.lookup(chain, prompt_tokens)
        blocks = self._blocks
        bt = self.block_tokens
        hit = look.hit_blocks
        # Tokens this admission adds: promoted blocks and the pending suffix.
        need = prompt_tokens - look.hbm_block_tokens
        protected = 0  # unpinned HBM hits: pinned below, so not evictable for this
        for bid in chain[:hit]:
            b = blocks.get(bid)
            if b is not None and b.refs == 0:
                protected += b.tokens
        if self.tokens_total - (self.unpinned_tokens - protected) + need > limit:
            return None

        self._tick += 1
        tick = self._tick
        held = _Held(list(chain), prompt_tokens)
        for bid in chain[:hit]:
            b = blocks.get(bid)
            if b is not None:
                self._pin(bid, b, tick)
                held.pinned.append(bid)
        # promote lower-tier hits before evicting: the demotions that eviction writes to
        # DRAM may push out of DRAM the very blocks this request is promoting
        promote_pcie = promote_nic = 0
        kvb, kvf = self.kv_bytes_per_token, self.kv_bytes
        dram, remote = self.dram, self.remote
        promoted_tokens = 0
        hit_end = min(hit * bt, prompt_tokens)  # tokens the hit blocks cover
        for k in range(hit):
            bid = chain[k]
            if bid in blocks:
                continue  # an HBM hit, pinned above
            t = min(bt, prompt_tokens - k * bt)
            promoted_tokens += t
            if kvf is None:
                nbytes = t * kvb
            else:  # what continuing after the hit needs of this block (module docstring)
                nbytes = kvf(hit_end - k * bt) - kvf(hit_end - k * bt - t)
            if dram is not None and bid in dram:
                dram.touch(bid)
                promote_pcie += nbytes
            else:
                assert remote is not None
                remote.touch(bid)
                promote_nic += nbytes
            self._insert(bid, t, chain[k - 1] if k else -1, tick)
            held.pinned.append(bid)
        # promoted blocks are in HBM now (pinned): make room for the pending suffix
        freed, demote_bytes = self._evict_until(limit - (need - promoted_tokens))
        # pinned keeps chain order: HBM hits and promotions interleave by position
        if look.dram_blocks or look.remote_blocks:
            position = {bid: k for k, bid in enumerate(chain[:hit])}
            held.pinned.sort(key=position.__getitem__)
        held.next_pos = hit
        held.pending_tokens = prompt_tokens - (
            look.hbm_block_tokens + look.dram_block_tokens + look.remote_block_tokens
        )
        self.pending_tokens += held.pending_tokens
        self._held[request_id] = held
        return Admission(look, promote_pcie, promote_nic, demote_bytes, freed)

    def commit(self, request_id: int, upto_blocks: int | None = None) -> Commit:
        """The request's prefill computed its chain up to block ``upto_blocks`` (default:
        all): those pending blocks become cached blocks it holds, hit-able by later
        requests, and are written through to the remote store."""
        held = self._held[request_id]
        chain = held.chain
        end = len(chain) if upto_blocks is None else min(upto_blocks, len(chain))
        bt, L = self.block_tokens, held.prompt_tokens
        blocks, remote = self._blocks, self.remote
        self._tick += 1
        tick = self._tick
        committed = dedup = put_tokens = put_bytes = 0
        kvf = self.kv_bytes
        for k in range(held.next_pos, end):
            bid = chain[k]
            t = min(bt, L - k * bt)
            if t < bt and not self.caches_partial_blocks:
                continue  # vLLM hashes full blocks only: the tail stays private
            held.pending_tokens -= t
            self.pending_tokens -= t
            committed += t
            b = blocks.get(bid)
            if b is not None:  # cached meanwhile: use it, free the private copy
                self._pin(bid, b, tick)
                dedup += t
            else:
                self._insert(bid, t, chain[k - 1] if k else -1, tick)
            held.pinned.append(bid)
            if remote is not None and bid not in remote and remote.put(bid, t):
                put_tokens += t
                if kvf is not None:
                    put_bytes += kvf(t)
        held.next_pos = max(held.next_pos, end)
        if kvf is None:
            put_bytes = put_tokens * self.kv_bytes_per_token
        return Commit(committed, dedup, put_bytes)

    def release(self, request_id: int) -> None:
        """The request no longer needs its KV here (handoff done, finished, preempted
        or cancelled): its cached blocks are unpinned (they stay cached), its pending
        (never computed) blocks are dropped."""
        held = self._held.pop(request_id)
        self.pending_tokens -= held.pending_tokens
        self._tick += 1
        tick = self._tick
        blocks, policy = self._blocks, self._policy
        for bid in reversed(held.pinned):  # tail first: evicted first at equal age
            b = blocks[bid]
            b.refs -= 1
            b.tick = tick
            if b.refs == 0:
                self.unpinned_tokens += b.tokens
                policy.on_unpinned(bid)

    def evict_to(self, limit_tokens: int) -> Eviction:
        """Evict unpinned blocks until ``tokens_total <= limit_tokens`` or none is left."""
        freed, demote_bytes = self._evict_until(limit_tokens)
        return Eviction(freed, demote_bytes, self.tokens_total <= limit_tokens)

    def clear(self) -> None:
        """The worker is lost: its HBM tier and every hold on it are gone (lower tiers
        are separate services and keep their blocks)."""
        if self.listener is not None:
            for bid in self._blocks:
                self.listener.removed(self.worker_id, bid)
        self._blocks.clear()
        self._held.clear()
        self._policy.clear()
        self.cached_tokens = self.unpinned_tokens = self.pending_tokens = 0

    # --- internals --------------------------------------------------------------------

    def _state(self, block_id: int) -> tuple[int, int, int] | None:
        b = self._blocks.get(block_id)
        return None if b is None else (b.refs, b.children, b.tick)

    def _pin(self, bid: int, b: _Block, tick: int) -> None:
        if b.refs == 0:
            self.unpinned_tokens -= b.tokens
            self._policy.on_pinned(bid)
        b.refs += 1
        b.tick = tick

    def _insert(self, bid: int, tokens: int, parent: int, tick: int) -> None:
        """A new cached block, pinned once (by the request inserting it)."""
        self._blocks[bid] = _Block(tokens, parent, 1, tick)
        self.cached_tokens += tokens
        if self._policy.tracks_children:
            p = self._blocks.get(parent)
            if p is not None:
                p.children += 1
        if self.listener is not None:
            self.listener.added(self.worker_id, bid)

    def _evict_until(self, limit_tokens: int) -> tuple[int, int]:
        freed = demoted = demoted_bytes = 0
        policy, blocks, dram, kvf = self._policy, self._blocks, self.dram, self.kv_bytes
        while self.tokens_total > limit_tokens:
            bid = policy.victim()
            if bid is None:
                break
            b = blocks.pop(bid)
            policy.on_removed(bid)
            self.cached_tokens -= b.tokens
            self.unpinned_tokens -= b.tokens
            freed += b.tokens
            if policy.tracks_children:
                p = blocks.get(b.parent)
                if p is not None:
                    p.children -= 1
                    if p.children == 0:
                        policy.on_leaf(b.parent)
            if self.listener is not None:
                self.listener.removed(self.worker_id, bid)
            if dram is not None and bid not in dram and dram.put(bid, b.tokens):
                demoted += b.tokens
                if kvf is not None:
                    demoted_bytes += kvf(b.tokens)
        if kvf is None:
            demoted_bytes = demoted * self.kv_bytes_per_token
        return freed, demoted_bytes
