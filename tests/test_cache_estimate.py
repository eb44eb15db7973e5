"""The planner's expected hit share (disaggsim/cache/estimate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.cache import expected_hit_share
from disaggsim.workload import Requests, read_trace
from disaggsim.workload.chains import canonical_chains
from disaggsim.workload.reuse import trace_prefix_reuse


def requests(rows: list[tuple[int, list[int]]], block: int = 4) -> Requests:
    lengths = np.array([n for n, _ in rows], dtype=np.int64)
    return Requests(
        arrival_s=np.arange(len(rows), dtype=np.float64),
        prompt_tokens=lengths,
        output_tokens=np.ones(len(rows), dtype=np.int64),
        prefix_chains=canonical_chains([h for _, h in rows], lengths, block),
    )


def test_hand_built() -> None:
    # A, B, A: the third request hits A's 8 tokens (capped at 7) if A is still cached
    r = requests([(8, [1, 2]), (8, [3, 4]), (8, [1, 2])])
    assert expected_hit_share(r) == 7 / 24
    assert expected_hit_share(r, capacity_tokens_per_worker=16) == 7 / 24
    assert expected_hit_share(r, capacity_tokens_per_worker=8) == 0.0  # B evicted A
    # two workers: cache-aware pools 2 x 8 tokens; round robin sends A to 0 and 2
    assert expected_hit_share(r, num_workers=2, capacity_tokens_per_worker=8) == 7 / 24
    assert (
        expected_hit_share(r, num_workers=2, capacity_tokens_per_worker=8, routing="round_robin")
        == 7 / 24
    )
    r2 = requests([(8, [1, 2]), (8, [1, 2]), (8, [3, 4])])
    rr = expected_hit_share(r2, num_workers=2, routing="round_robin")
    assert rr == 0.0 and expected_hit_share(r2, num_workers=2) == 7 / 24
    plain = Requests(np.zeros(2), np.array([5, 5]), np.array([1, 1]))
    assert expected_hit_share(plain) == 0.0
    with pytest.raises(ValueError, match="routing"):
        expected_hit_share(r, routing="random")  # type: ignore[arg-type]


def test_unbounded_estimate_equals_the_independent_trace_figure(shared_data) -> None:
    """Two implementations that share no code: the cache replayed in arrival order, and
    workload/reuse.py reading the file."""
    path = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    reuse = trace_prefix_reuse(path)
    r = read_trace(path)
    assert int(r.prompt_tokens.sum()) == reuse.prompt_tokens
    assert expected_hit_share(r) == reuse.prefix_hit_tokens / reuse.prompt_tokens


def test_capacity_and_routing_order(shared_data) -> None:
    r = read_trace(shared_data / "traces" / "mooncake_synthetic_trace.jsonl")
    unbounded = expected_hit_share(r)
    shares = [expected_hit_share(r, capacity_tokens_per_worker=c) for c in (10**5, 10**6)]
    assert shares[0] <= shares[1] <= unbounded
    rr = expected_hit_share(r, num_workers=4, routing="round_robin")
    assert rr < unbounded
    lru = expected_hit_share(r, policy="lru")
    assert lru <= unbounded  # partial last blocks are not cached
