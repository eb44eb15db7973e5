"""The request table every workload produces: numpy columns, one row per request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Requests:
    """Requests sorted by arrival. ``output_tokens`` counts every generated token, the
    first (produced by the prefill) included, so it is >= 1.

    ``prefix_hashes`` (optional, Mooncake traces) holds per-request tuples of 512-token
    block hashes."""

    arrival_s: np.ndarray  # float64, non-decreasing, seconds from simulation start
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    prefix_hashes: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("Requests columns must have equal length")

    def __len__(self) -> int:
        return len(self.arrival_s)
