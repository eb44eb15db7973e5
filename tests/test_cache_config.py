"""The cache: section (disaggsim/cache/config.py) and the summary keys (summary.py)."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.cache import SUMMARY_KEYS, prefix_summary, validate_cache_section
from disaggsim.errors import UserError
from disaggsim.units import GiB


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"policy": "fifo"}, "s.yaml: cache.policy: unknown cache policy 'fifo' (allowed: lru, radix)"),
        ({"tiers": {"ssd": {"capacity_gib": 1}}}, "s.yaml: cache.tiers.ssd: unknown key (allowed: dram, remote)"),
        ({"polcy": "lru"}, "s.yaml: cache.polcy: unknown key (allowed: policy, routing, tiers)"),
        ({"tiers": {"dram": {"capacity_gib_per_node": -1}}}, "s.yaml: cache.tiers.dram.capacity_gib_per_node: Input should be greater than or equal to 0"),
        ({"tiers": {"dram": {"capacity_gib_per_node": float("nan")}}}, "s.yaml: cache.tiers.dram.capacity_gib_per_node: Input should be a finite number"),
        ({"tiers": {"remote": {"capacity_gib": float("inf")}}}, "s.yaml: cache.tiers.remote.capacity_gib: Input should be a finite number"),
        ({"tiers": {"remote": {"capacity_gib": -2}}}, "s.yaml: cache.tiers.remote.capacity_gib: Input should be greater than or equal to 0"),
        ({"tiers": {"remote": {"capacity_gib": "lots"}}}, "s.yaml: cache.tiers.remote.capacity_gib: 'lots' is not a capacity: give GiB (a finite number >= 0) or unbounded"),
        ({"tiers": {"remote": {}}}, "s.yaml: cache.tiers.remote.capacity_gib: required key is missing"),
        ({"routing": {"overlap_weight": -1}}, "s.yaml: cache.routing.overlap_weight: Input should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_bad_cache_sections_are_one_line(raw, expected) -> None:
    with pytest.raises(UserError) as err:
        validate_cache_section(raw, "s.yaml")
    assert str(err.value) == expected


def test_capacities_in_tokens() -> None:
    cfg = validate_cache_section(
        {"policy": "lru", "tiers": {"dram": {"capacity_gib_per_node": 1}, "remote": {"capacity_gib": "unbounded"}}},
        "s.yaml",
    )  # fmt: skip
    assert cfg.policy == "lru" and cfg.routing.overlap_weight == 1.0
    # 70B-class KV: 327,680 bytes per token -> 1 GiB holds 3276.8 tokens
    assert cfg.dram_tokens(327_680) == 3276 == GiB // 327_680
    assert cfg.remote_tokens(327_680) is None and cfg.has_remote
    default = validate_cache_section({}, "s.yaml")
    assert default.policy == "radix" and default.dram_tokens(1) is None and not default.has_remote


def test_prefix_summary() -> None:
    s = prefix_summary(
        np.array([100, 300]), np.array([50, 0]), np.array([0, 100]), np.array([0, 50])
    )
    assert tuple(s) == SUMMARY_KEYS
    assert s["prompt_tokens_total"] == 400 and s["prefix_hit_tokens"] == 200
    assert (s["prefix_hit_share"], s["prefix_hit_share_hbm"]) == (0.5, 0.125)
    assert (s["prefix_hit_share_dram"], s["prefix_hit_share_remote"]) == (0.25, 0.125)
    with pytest.raises(ValueError, match="exceed"):
        prefix_summary(np.array([1]), np.array([2]), np.array([0]), np.array([0]))
