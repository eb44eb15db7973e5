"""The request table every workload produces: numpy columns, one row per request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from disaggsim.workload.chains import PrefixChains, blocks_for


@dataclass(frozen=True, slots=True)
class Requests:
    """Requests sorted by arrival. ``output_tokens`` counts every generated token, the
    first (produced by the prefill) included, so it is >= 1.

    ``prefix_chains`` (optional: traces with hashes, session workloads) holds each
    request's canonical prefix ids, one per block of its prompt
    (:class:`~disaggsim.workload.chains.PrefixChains`)."""

    arrival_s: np.ndarray  # float64, non-decreasing, seconds from simulation start
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    prefix_chains: PrefixChains | None = None

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

    def __len__(self) -> int:
        return len(self.arrival_s)
