"""The request table every workload produces: numpy columns, one row per request."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from disaggsim.workload.chains import PrefixChains, blocks_for


@dataclass(frozen=True, slots=True)
class Requests:
    """Requests sorted by arrival. ``output_tokens`` counts every generated token, the
    first (produced by the prefill) included, so it is >= 1: the reply's realised length,
    which only decides when generation stops.

    ``max_tokens`` is the most the client asked for (the request's ``max_tokens``): what
    the router and KV admission plan on; ``output_tokens <= max_tokens``. ``None``: not
    set; :meth:`with_context` fills it with the model's context length minus the prompt
    (vLLM's default) and marks it ``max_tokens_default``, and an engine given none plans on
    ``output_tokens`` (a client that asks for exactly the reply it gets, as benchmark
    clients do with ``ignore_eos``).

    ``prefix_chains`` (optional: traces with hashes, session workloads) holds each
    request's canonical prefix ids, one per block of its prompt
    (:class:`~disaggsim.workload.chains.PrefixChains`)."""

    arrival_s: np.ndarray  # float64, non-decreasing, seconds from simulation start
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    prefix_chains: PrefixChains | None = None
    max_tokens: np.ndarray | None = None  # int64 >= output_tokens
    # max_tokens is the server's default (with_context filled it: the clients set none);
    # the engine then promises decode KV for a bounded reserve of it (docs/engine.md)
    max_tokens_default: bool = False

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("Requests columns must have equal length")
        chains = self.prefix_chains
        if chains is not None:
            if len(chains) != n:
                raise ValueError("Requests.prefix_chains must have one chain per request")
            if not np.array_equal(
                chains.num_blocks, blocks_for(self.prompt_tokens, chains.block_tokens)
            ):
                raise ValueError("every prefix chain needs ceil(prompt_tokens / block) blocks")
        if self.max_tokens is not None:
            if len(self.max_tokens) != n:
                raise ValueError("Requests columns must have equal length")
            if n and bool(np.any(self.output_tokens > self.max_tokens)):
                raise ValueError("Requests: output_tokens must be <= max_tokens")

    def with_max_tokens(self, max_tokens: np.ndarray | None) -> Requests:
        """These requests with the clients' ``max_tokens`` (None: unset); each realised
        reply is cut at its cap (``min(output_tokens, max_tokens)``)."""
        if max_tokens is None:
            return replace(self, max_tokens=None, max_tokens_default=False)
        mt = np.asarray(max_tokens, dtype=np.int64)
        return replace(
            self,
            output_tokens=np.minimum(self.output_tokens, mt),
            max_tokens=mt,
            max_tokens_default=False,
        )

    def with_context(self, context_tokens: int) -> Requests:
        """Fill an unset ``max_tokens`` as a server does for a client that sets none: the
        model's context length minus the prompt (vLLM), at least 1 (a prompt that fills
        the context is then refused at admission, ``exceeds_context``)."""
        if self.max_tokens is not None:
            return self
        filled = self.with_max_tokens(np.maximum(context_tokens - self.prompt_tokens, 1))
        return replace(filled, max_tokens_default=True)

    def __len__(self) -> int:
        return len(self.arrival_s)
