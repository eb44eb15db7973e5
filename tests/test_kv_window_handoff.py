"""KV handoff and swap bytes follow the KV the model holds (issue 17): windowed layers
(sliding or chunked attention) keep at most their window, so a handoff of a context
longer than the window moves less than ``tokens × full per-token bytes``; a swap copy on
a data-parallel worker runs over the GPUs of the ranks that hold the sequences (MLA's
latent replicated over a rank's TP group). Expected bytes derived by hand from the model
configs (docs/costmodel.md)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from disaggsim.costmodel.interface import context_kv_bytes, kv_copy_gpus
from disaggsim.costmodel.moe import build_cost
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.engine.handoff import Handoff
from disaggsim.workload.requests import Requests


@pytest.fixture(scope="module")
def gpt_oss():
    return build_cost("gpt-oss-120b", "h100-sxm", 1, weight_dtype="released")


@pytest.fixture(scope="module")
def maverick():
    return build_cost("llama-4-maverick", "h100-sxm", 8, weight_dtype="fp8")


def handed_off_bytes(cost, prompt_tokens: int) -> list[float]:
    """Bytes the engine hands to the transfer-time function for one request."""
    seen: list[float] = []

    def transfer(nbytes, src, dst):
        seen.append(nbytes)
        return 0.001

    reqs = Requests(
        arrival_s=np.array([0.0]),
        prompt_tokens=np.array([prompt_tokens]),
        output_tokens=np.array([2]),
    )
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, cost, 8, max(prompt_tokens, 8192)),
            PoolSpec("decode", 1, cost, 8, 8192),
        )
    )
    raw = run_cluster(reqs, cfg, transfer)
    assert raw.log.finish_at_s[0] > 0
    return seen


def test_gpt_oss_handoff_keeps_the_sliding_window(gpt_oss):
    # 36 layers, 8 KV heads x 64, bf16: 2 x 8 x 64 x 2 = 2,048 B per token per layer;
    # 18 sliding layers (window 128), 18 full ones
    per = 2 * 8 * 64 * 2
    assert context_kv_bytes(gpt_oss, 1000) == (18 * 1000 + 18 * 128) * per == 41_582_592
    assert context_kv_bytes(gpt_oss, 100) == 36 * 100 * per  # inside the window: all layers
    # tokens x the full layers' bytes (what the engine allocates per token) misses the
    # sliding layers' window
    assert gpt_oss.kv_bytes_per_token == 18 * per
    assert handed_off_bytes(gpt_oss, 1000) == [41_582_592]
    # the same bytes from the cost model's KV helper (disaggsim cost kv, summaries)
    from disaggsim.costmodel.kv import kv_bytes

    assert kv_bytes("gpt-oss-120b", 1000) == 41_582_592


def test_maverick_handoff_bounds_the_chunked_layers(maverick):
    # 48 layers, 8 KV heads x 128, bf16: 4,096 B per token per layer; 36 chunked layers
    # (chunk 8192) keep at most 8192 tokens, 12 full layers every token
    per = 2 * 8 * 128 * 2
    want = (12 * 20_000 + 36 * 8192) * per
    assert want == 2_190_999_552
    assert context_kv_bytes(maverick, 20_000) == want
    assert 20_000 * maverick.kv_bytes_per_token == 20_000 * 48 * per  # 1.79x more
    assert handed_off_bytes(maverick, 20_000) == [want]


def test_dense_models_keep_tokens_times_bytes_per_token():
    cost = build_worker_cost("llama-3-8b", "h100-sxm", 1)
    assert context_kv_bytes(cost, 3000) == 3000 * cost.kv_bytes_per_token
    assert kv_copy_gpus(cost, 5) == cost.num_gpus


def test_swap_copies_run_over_the_ranks_holding_the_kv():
    # DeepSeek-V3 tp1 x dp16 (MLA: one GPU per rank holds a sequence's whole latent):
    # 3 sequences sit on 3 ranks, 20 on 16 ranks with 2 on the busiest
    ds = build_cost("deepseek-v3", "h100-sxm", 1, dp=16, weight_dtype="released")
    assert kv_copy_gpus(ds, 3) == 3.0
    assert kv_copy_gpus(ds, 20) == 20 / 2
    # Qwen3-235B tp2 x dp4: 4 KV heads over 2 GPUs, so a sequence spans its rank's 2 GPUs
    qw = build_cost("qwen3-235b-a22b", "h100-sxm", 2, dp=4, weight_dtype="fp8")
    assert kv_copy_gpus(qw, 1) == 2.0
    assert kv_copy_gpus(qw, 4) == 8.0
    assert kv_copy_gpus(qw, 6) == 6 / 2 * 2
    # the engine's swap copy: bytes timed as if spread over all 16 GPUs = the busiest
    # GPU's bytes on each (1 sequence of 1 MB on one GPU of DeepSeek-V3's 16: 16 MB;
    # 16 sequences, one per GPU: 1 MB)
    seen: list[float] = []

    def swap_time(cost, nbytes, direction):
        seen.append(nbytes)
        return 0.0

    cfg = SimpleNamespace(topology=None, link_windows=(), swap_time=swap_time)
    env = simpy.Environment()
    h = Handoff(env, cfg, None, None, None, {}, lambda *a: None)  # type: ignore[arg-type]
    h.swap_copy(SimpleNamespace(cost=ds, index=0), 1e6, "out", 1)  # type: ignore[arg-type]
    h.swap_copy(SimpleNamespace(cost=ds, index=0), 1e6, "out", 16)  # type: ignore[arg-type]
    assert seen == [16e6, 1e6]
