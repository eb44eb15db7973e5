"""KV tier copies (promotions, demotions, write-through) are sized by the same function
as KV handoffs and swaps (``context_kv_bytes``): windowed layers keep at most their
window. Expected bytes derived by hand from the model configs (docs/costmodel.md,
tests/test_kv_window_handoff.py) and the block arithmetic of docs/prefix-caching.md.
"""

from __future__ import annotations

import random

import pytest

from disaggsim.cache import BlockStore, CacheConfig, WorkerKvCache
from disaggsim.cache.worker import stored_bytes_per_token, worker_kv_bytes
from disaggsim.costmodel.interface import context_kv_bytes
from disaggsim.costmodel.moe import build_cost
from disaggsim.costmodel.step import build_worker_cost

# gpt-oss-120b: 36 layers, 8 KV heads x 64, bf16 -> 2 x 8 x 64 x 2 = 2,048 B per token
# per layer; 18 sliding layers (window 128) and 18 full ones
GPT_OSS_LAYER_TOKEN_BYTES = 2 * 8 * 64 * 2
GPT_OSS_HALF = 18 * GPT_OSS_LAYER_TOKEN_BYTES  # one kind of layer, per token: 36,864 B


def gpt_oss_kv(tokens: int) -> int:
    """By hand: the full layers keep every token, the sliding ones at most 128."""
    return GPT_OSS_HALF * (tokens + min(tokens, 128))


@pytest.fixture(scope="module")
def gpt_oss():
    return build_cost("gpt-oss-120b", "h100-sxm", 1, weight_dtype="released")


def cache_with_dram(cost, capacity_tokens: int = 100_000, **kw) -> WorkerKvCache:
    return WorkerKvCache(
        0,
        capacity_tokens=capacity_tokens,
        block_tokens=512,
        kv_bytes_per_token=int(cost.kv_bytes_per_token),
        policy="radix",
        dram=BlockStore("dram", None),
        kv_bytes=worker_kv_bytes(cost),
        **kw,
    )


def test_the_hand_figures_are_the_cost_models(gpt_oss) -> None:
    assert gpt_oss.kv_bytes_per_token == GPT_OSS_HALF  # full layers only (per token grown)
    for n in (1, 100, 128, 129, 512, 1000, 1536):
        assert context_kv_bytes(gpt_oss, n) == gpt_oss_kv(n)


def test_gpt_oss_whole_prefix_moves_what_a_handoff_moves(gpt_oss) -> None:
    """1,000 tokens = blocks [0, 512) and [512, 1000); both demoted, then both promoted."""
    c = cache_with_dram(gpt_oss)
    adm = c.admit(1, [1, 2], 1000)
    assert adm is not None and adm.lookup.hit_blocks == 0
    c.commit(1)
    c.release(1)
    ev = c.evict_to(0)
    assert ev.freed_tokens == 1000
    # each stored block keeps its own tokens: 18 x (512 + 128) + 18 x (488 + 128) layer-tokens
    assert ev.demote_pcie_bytes == GPT_OSS_HALF * (640 + 616) == 46_301_184
    again = c.admit(2, [1, 2], 1000)
    assert again is not None and again.lookup.tier_hit_tokens() == (0, 999, 0)
    # block 0: full layers only (it lies beyond the 128-token window before token 1000);
    # block 1: full layers + the window -> 18 x 512 + 18 x 616 layer-tokens in all
    assert again.promote_pcie_bytes == GPT_OSS_HALF * (512 + 616) == 41_582_592
    assert again.promote_pcie_bytes == context_kv_bytes(gpt_oss, 1000)  # the handoff's
    assert again.promote_nic_bytes == 0
    # tokens x kv_bytes_per_token (the old sizing) missed the sliding layers' window
    assert 1000 * gpt_oss.kv_bytes_per_token == 36_864_000


def test_gpt_oss_promoting_the_tail_of_a_hit(gpt_oss) -> None:
    """Three full blocks; the two leaves go to DRAM, block 0 stays in HBM: continuing
    after token 1536 needs the full layers of tokens 512-1535 and the sliding layers'
    last 128 tokens, 18 x (1024 + 128) layer-tokens."""
    c = cache_with_dram(gpt_oss)
    adm = c.admit(1, [1, 2, 3], 1536)
    assert adm is not None
    c.commit(1)
    c.release(1)
    ev = c.evict_to(512)  # radix evicts leaves: block 3, then block 2
    assert ev.freed_tokens == 1024 and c.is_cached(1)
    assert ev.demote_pcie_bytes == 2 * GPT_OSS_HALF * 640 == 47_185_920
    again = c.admit(2, [1, 2, 3], 1536)
    assert again is not None and again.lookup.tier_hit_tokens() == (512, 1023, 0)
    assert again.promote_pcie_bytes == GPT_OSS_HALF * (1024 + 128) == 42_467_328
    assert 1024 * gpt_oss.kv_bytes_per_token == 37_748_736  # the old sizing


def test_gpt_oss_write_through_stores_each_block(gpt_oss) -> None:
    c = WorkerKvCache(
        0,
        100_000,
        512,
        int(gpt_oss.kv_bytes_per_token),
        remote=BlockStore("remote", None),
        kv_bytes=worker_kv_bytes(gpt_oss),
    )
    assert c.admit(1, [1, 2, 3], 1400) is not None
    # blocks of 512, 512 and 376 tokens, each with its sliding layers' 128
    assert c.commit(1).remote_put_bytes == GPT_OSS_HALF * (640 + 640 + 504) == 65_765_376
    c.release(1)
    # promoted from the remote store over the NIC by a second worker: the handoff's bytes
    d = WorkerKvCache(
        1,
        100_000,
        512,
        int(gpt_oss.kv_bytes_per_token),
        remote=c.remote,
        kv_bytes=worker_kv_bytes(gpt_oss),
    )
    adm = d.admit(2, [1, 2, 3], 1400)
    assert adm is not None and adm.promote_pcie_bytes == 0
    assert adm.promote_nic_bytes == GPT_OSS_HALF * (1400 + 128) == 56_328_192


def test_maverick_chunked_layers_bounded_in_a_promotion() -> None:
    """Llama-4-Maverick: 12 full layers, 36 chunked (8,192), 4,096 B per token per layer.
    A 20,000-token prefix promoted whole moves its handoff's bytes; each stored block
    (512 tokens, inside the chunk) keeps every layer."""
    mav = build_cost("llama-4-maverick", "h100-sxm", 8, weight_dtype="fp8")
    per = 2 * 8 * 128 * 2
    c = cache_with_dram(mav, capacity_tokens=1_000_000)
    chain = list(range(1, 41))  # 39 full blocks + 32 tokens
    assert c.admit(1, chain, 20_000) is not None
    c.commit(1)
    c.release(1)
    ev = c.evict_to(0)
    assert ev.demote_pcie_bytes == 48 * 20_000 * per == 3_932_160_000
    again = c.admit(2, chain, 20_000)
    assert again is not None
    assert again.promote_pcie_bytes == (12 * 20_000 + 36 * 8192) * per == 2_190_999_552


def test_tier_capacity_counts_a_stored_blocks_bytes(gpt_oss) -> None:
    # a 512-token block stores 18 x (512 + 128) layer-tokens: 46,080 B per token
    assert stored_bytes_per_token(gpt_oss, 512) == GPT_OSS_HALF * 640 / 512 == 46_080
    cfg = CacheConfig.model_validate(
        {"tiers": {"dram": {"capacity_gib_per_node": 64}, "remote": {"capacity_gib": 1}}}
    )
    per = stored_bytes_per_token(gpt_oss, 512)
    assert cfg.dram_tokens(per) == 64 * 2**30 // 46_080 == 1_491_308
    assert cfg.remote_tokens(per) == 2**30 // 46_080 == 23_301
    # dense: a stored block spends kv_bytes_per_token per token, as before
    dense = build_worker_cost("llama-3-8b", "h100-sxm", 1)
    assert worker_kv_bytes(dense) is None
    assert stored_bytes_per_token(dense, 512) == dense.kv_bytes_per_token == 131_072
    with pytest.raises(ValueError, match="block_tokens must be >= 1"):
        stored_bytes_per_token(dense, 0)


@pytest.mark.parametrize("policy", ["lru", "radix"])
def test_without_a_window_the_function_changes_nothing(policy: str) -> None:
    """Dense: tokens x kv_bytes_per_token through the function or the integer path give
    identical admissions, commits and evictions on a random request sequence."""
    rng = random.Random(7)
    kvb = 131_072

    def make(kv_bytes):
        return WorkerKvCache(
            0,
            40,
            4,
            kvb,
            policy,  # type: ignore[arg-type]
            dram=BlockStore("dram", 30),
            remote=BlockStore("remote", 50),
            kv_bytes=kv_bytes,
        )

    a, b = make(None), make(lambda n: n * kvb)
    moved = 0
    for rid in range(300):
        chain = [rng.randrange(1, 4)]  # ids of k + 1 digits at position k: canonical
        for _ in range(rng.randrange(4)):
            chain.append(chain[-1] * 10 + rng.randrange(1, 3))
        prompt = 4 * len(chain)
        x, y = a.admit(rid, chain, prompt), b.admit(rid, chain, prompt)
        assert x == y
        if x is None:
            continue
        moved += x.promote_pcie_bytes + x.promote_nic_bytes + x.demote_pcie_bytes
        assert a.commit(rid) == b.commit(rid)
        a.release(rid)
        b.release(rid)
        limit = rng.randrange(40)
        assert a.evict_to(limit) == b.evict_to(limit)
    assert moved > 0  # the sequence exercised the tiers


def test_the_engine_builds_caches_with_the_one_function(gpt_oss) -> None:
    """The engine's build step (engine/prefix.py) for a gpt-oss worker: a 64 GiB DRAM
    tier holds 64 GiB / 46,080 B tokens, and a whole 1,000-token prefix promoted from it
    moves the handoff's 41,582,592 B."""
    from types import SimpleNamespace

    import numpy as np

    from disaggsim.engine.prefix import PrefixCaches, PrefixSetup
    from disaggsim.workload.chains import PrefixChains

    cfg = CacheConfig.model_validate({"tiers": {"dram": {"capacity_gib_per_node": 64}}})
    chains = PrefixChains(np.array([0, 1]), np.array([0, 2]), 512, 2)
    caches = PrefixCaches(PrefixSetup(cache=cfg, chains=chains), [1000])
    cache = caches.attach(SimpleNamespace(index=0, cost=gpt_oss))  # type: ignore[arg-type]
    assert caches.dram[0].capacity_tokens == 64 * 2**30 // 46_080 == 1_491_308
    assert cache.admit(0, [0, 1], 1000) is not None
    cache.commit(0)
    cache.release(0)
    cache.evict_to(0)
    again = cache.admit(1, [0, 1], 1000)
    assert again is not None and again.promote_pcie_bytes == 41_582_592
