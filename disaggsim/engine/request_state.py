"""Each request's token counts and the KV block arithmetic the whole engine shares.

Columnar: one typed ``array.array`` per quantity, indexed by request id (as fast to index
as a list, 8 bytes a request instead of a Python int object; numpy scalars would be
slower per access). What a
request *may* need (``max_tokens``: what the client allowed) is what routing, admission
and reservations plan on; what it gets (``output_tokens``) only decides when it stops.
"""

from __future__ import annotations

from array import array

import numpy as np

from disaggsim.workload.requests import Requests


def _column(values: np.ndarray) -> array[int]:
    return array("q", np.ascontiguousarray(values, dtype=np.int64).tobytes())


class RequestState:
    """Token counts of every request and the blocks its KV takes.

    ``block_tokens`` tokens make one KV block; ``reserve_full``: admission reserves a
    sequence's longest length (prompt + ``max_tokens``) at once, instead of growing a
    block at a time (``on_demand``). ``reserved_decode_tokens``: the reply tokens the
    router promises a request whose ``max_tokens`` is the server's default
    (``Requests.max_tokens_default``), growing on demand (:meth:`promise_blocks`).
    """

    __slots__ = (
        "block_tokens",
        "ended",
        "generated",
        "longest_blocks",
        "max_tokens",
        "output_tokens",
        "prefilled_tokens",
        "prompt_tokens",
        "reserve_full",
        "reserve_tokens",
    )

    def __init__(
        self,
        requests: Requests,
        block_tokens: int,
        reserve_full: bool,
        reserved_decode_tokens: int | None = None,
    ) -> None:
        n = len(requests)
        self.block_tokens = block_tokens
        self.reserve_full = reserve_full
        # the reply reserve promised for default caps (None: every promise is the longest
        # sequence; reserving in full, the join takes the longest sequence anyway)
        self.reserve_tokens = (
            reserved_decode_tokens if requests.max_tokens_default and not reserve_full else None
        )
        self.prompt_tokens = _column(requests.prompt_tokens)
        self.output_tokens = _column(requests.output_tokens)
        # no max_tokens given: a client asking for exactly the reply it gets
        cap = requests.max_tokens if requests.max_tokens is not None else requests.output_tokens
        self.max_tokens = _column(cap)
        # blocks of each request's longest sequence (full_blocks), computed once: the
        # router and the decode workers read it three times a request (kv_aware)
        longest = np.asarray(requests.prompt_tokens, dtype=np.int64) + np.asarray(
            cap, dtype=np.int64
        )
        self.longest_blocks = _column(-(-longest // block_tokens))
        # the two columns written during the run are unsigned (non-negative counts): an
        # unsigned array.array stores a Python int without PyArg_Parse (records.py)
        self.generated = array("Q", bytes(8 * n))  # tokens delivered so far
        # tokens the last prefill computed (prompt + tokens delivered when it started)
        self.prefilled_tokens = array("Q", self.prompt_tokens)
        self.ended = bytearray(n)  # 1: completed, rejected or abandoned

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    # -- token counts ------------------------------------------------------------------

    def prefill_len(self, rid: int) -> int:
        """Tokens the next prefill of ``rid`` computes: its prompt, plus the tokens
        already delivered when the KV is rebuilt after a preemption or a failure."""
        return self.prompt_tokens[rid] + self.generated[rid]

    def longest_tokens(self, rid: int) -> int:
        """The longest sequence ``rid`` may become: prompt + max_tokens."""
        return self.prompt_tokens[rid] + self.max_tokens[rid]

    def done_generating(self, rid: int) -> bool:
        return self.generated[rid] >= self.output_tokens[rid]

    # -- KV blocks ---------------------------------------------------------------------

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def full_blocks(self, rid: int) -> int:
        """Blocks of ``rid``'s longest possible sequence (prompt + max_tokens)."""
        return self.longest_blocks[rid]

    def promise_blocks(self, rid: int) -> int:
        """Blocks the router promises ``rid`` on a decode worker and counts as its
        committed KV: its longest sequence (prompt + ``max_tokens``), or, when its cap is
        the server's default (the model's context less the prompt), its context now plus
        a reserve of ``reserve_tokens`` reply tokens, at most the cap: prompt + min(cap,
        delivered + reserve). A reply that outgrows the reserve grows on demand, and its
        decode worker preempts when its blocks run out (as SGLang reserves
        ``num_reserved_decode_tokens`` per request and retracts, and vLLM allocates
        on demand and preempts)."""
        reserve = self.reserve_tokens
        if reserve is None:
            return self.longest_blocks[rid]
        cap = self.max_tokens[rid]
        reply = self.generated[rid] + reserve
        return -(-(self.prompt_tokens[rid] + (cap if cap < reply else reply)) // self.block_tokens)

    def prefill_blocks(self, rid: int) -> int:
        """Blocks a prefill worker holds for ``rid``'s KV until the handoff."""
        return -(-(self.prompt_tokens[rid] + self.generated[rid]) // self.block_tokens)

    def join_blocks(self, rid: int) -> int:
        """Blocks a decode worker needs to take ``rid`` from its last prefill (its
        longest sequence when reserving in full; else the prefilled context plus the slot
        of the token that prefill produced, whether or not that token is delivered yet)."""
        if self.reserve_full:
            return self.full_blocks(rid)
        return -(-(self.prefilled_tokens[rid] + 1) // self.block_tokens)

    def context_blocks(self, rid: int) -> int:
        """Blocks of ``rid``'s context now (prompt + tokens delivered): a swapped-out
        sequence's KV when it comes back (reserving in full: its longest sequence)."""
        if self.reserve_full:
            return self.full_blocks(rid)
        return -(-(self.prompt_tokens[rid] + self.generated[rid]) // self.block_tokens)

    def colocated_blocks(self, rid: int) -> int:
        """Blocks a colocated worker takes when ``rid``'s prefill starts."""
        if self.reserve_full:
            return self.full_blocks(rid)
        return -(-(self.prompt_tokens[rid] + self.generated[rid] + 1) // self.block_tokens)
