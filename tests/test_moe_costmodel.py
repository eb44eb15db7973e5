"""The MoE / MLA / expert-parallel cost model: a wide-EP decode step worked out by hand,
parts that add up, affine decode, monotone costs, memory that follows the layout, and
one-line errors for layouts that cannot run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.catalog import get_gpu, get_model
from disaggsim.costmodel import ops
from disaggsim.costmodel.interface import WorkerCost, decode_step_time_s
from disaggsim.costmodel.moe import (
    MoeWorkerCost,
    all_to_all_time_s,
    all_to_all_volume_bytes,
    build_cost,
    build_moe_worker_cost,
    grouped_gemm_tile_compute_s,
    grouped_gemm_time_s,
    power_law_imbalance,
)
from disaggsim.costmodel.moe_params import GroupedGemmParams, load_moe_params
from disaggsim.costmodel.step import RooflineWorkerCost, build_worker_cost
from disaggsim.errors import UserError


@pytest.fixture(scope="module")
def ds_decode() -> MoeWorkerCost:
    """DeepSeek-V3 decode unit as published: 18 H800 nodes, attention DP144, EP144 with
    32 redundant experts (288 slots, 2 per GPU), fp8 block-scaled weights."""
    return build_moe_worker_cost(
        "deepseek-v3",
        "h800-sxm",
        1,
        dp=144,
        weight_dtype="fp8-block",
        redundant_experts=32,
        max_seqs=144 * 64,
    )


def test_it_is_a_worker_cost(ds_decode):
    assert isinstance(ds_decode, WorkerCost)
    assert ds_decode.num_gpus == 144 and ds_decode.ep == 144
    assert ds_decode.local_experts == 2 and ds_decode.nodes == 18
    assert ds_decode.uses_all_to_all


def test_wide_ep_decode_step_by_hand(ds_decode):
    """64 sequences per DP rank with 4000 cached tokens each: every part recomputed from
    the shapes and the fitted parameters, and the parts add up to the step."""
    c = ds_decode
    b, ctx = 144 * 64, 144 * 64 * 4000
    bd = c.breakdown(decode_batch=b, decode_context_tokens=ctx)
    assert bd.total_s == pytest.approx(decode_step_time_s(c, b, ctx), rel=1e-9)
    assert bd.total_s == pytest.approx(sum(bd.as_dict().values()), rel=1e-12)
    gpu, params = get_gpu("h800-sxm"), load_moe_params("h800-sxm")
    hbm = gpu.hbm_bytes_per_s
    # routed experts: 9216 tokens x top-8 over 144 ranks = 512 token copies per GPU, on
    # its 2 experts of 7168 x 2048 (gate, up, down) in fp8 with 128x128 block scales
    routed = 9216 * 8 / 144
    assert routed == 512
    # (the default engine, vllm, runs vLLM's own kernel: its fit in the parameter file)
    assert c.expert_kernel == "vllm"
    gg = params.gemm("fp8-block", "vllm")
    elem = 1 + 4 / 128**2
    flop = 2 * routed * 7168 * 2048 * 3
    weights = 2 * 3 * 7168 * 2048 * elem
    acts = routed * (2 * 7168 + 4 * 2048) * 2
    per_expert = routed / 2
    sat = min(per_expert / (per_expert + gg.half_sat), 2048 / (2048 + gg.width_half_sat))
    eff = gg.max_eff * sat
    # the 512 token copies arrive by dispatch: at most 512 distinct tokens to permute in
    # and reduce out (bf16, hidden 7168)
    tokens = 512 * 7168 * 2 * 2 / (hbm * gg.token_eff)
    one_layer = (
        gg.launch_s
        + max(flop / (1979e12 * eff), (weights + acts) / (hbm * gg.mem_eff))
        + tokens
        + 2 * gg.expert_s  # each of the 2 touched experts' own cost
    )
    assert bd.expert_gemm_s == pytest.approx(58 * one_layer, rel=1e-12)
    # low-latency dispatch (decode only): 64 tokens per GPU, one copy per selected expert,
    # 8 x 7/144 of them to the other GPUs of the node over NVLink (200 GB/s on H800) and
    # 8 x 136/144 over RDMA (400 Gb/s NIC); FP8 payload + one fp32 scale per 128 values
    payload = 7168 + 7168 / 128 * 4
    nv, rd = 64 * 8 * 7 / 144 * payload, 64 * 8 * 136 / 144 * payload
    p = params.all_to_all["low_latency"]["dispatch"]
    want = (
        p.latency_s
        + p.rdma_latency_s  # 18 nodes: the RDMA path
        + max(nv / (200e9 * p.nvlink_eff), rd / (50e9 * p.rdma_eff))
    )
    assert bd.dispatch_s == pytest.approx(58 * want, rel=1e-12)
    pc = params.all_to_all["low_latency"]["combine"]
    want_c = (
        pc.latency_s
        + pc.rdma_latency_s
        + max(
            nv / payload * 7168 * 2 / (200e9 * pc.nvlink_eff),
            rd / payload * 7168 * 2 / (50e9 * pc.rdma_eff),
        )
    )
    assert bd.combine_s == pytest.approx(58 * want_c, rel=1e-12)
    # MLA decode on each rank: 64 sequences, 256,000 cached tokens, 576 bf16 values each
    dp = params.decode("bf16")
    per_tok = max(576 * 2 / (hbm * dp.bw_eff), 2 * 128 * 1088 / (989e12 * dp.compute_eff))
    attn = dp.floor_s + dp.per_seq_s * 64 + 64 * 4000 * per_tok
    assert bd.attention_s == pytest.approx(61 * attn, rel=1e-12)
    # no tensor parallelism inside a rank, experts reached by all-to-all: no all-reduce
    assert bd.allreduce_s == 0.0 and bd.overlap_s == 0.0


def test_decode_is_the_smallest_of_its_affine_lines_at_fixed_batch(ds_decode):
    # MLA: one line; GQA layers on a split-KV kernel (FlashAttention's): the smaller of the
    # stream plus its fill bound and the stream at the few items' bandwidth share
    for c, num_lines in (
        (ds_decode, 1),
        (build_moe_worker_cost("gpt-oss-120b", "h100-sxm", 8, weight_dtype="released"), 2),
        (build_moe_worker_cost("llama-4-maverick", "h200-sxm", 8), 2),
    ):
        b = 96
        lines = (c.decode_coeffs(b), *c.decode_min_coeffs(b))
        assert len(lines) == num_lines
        for ctx in (0, 100, 10_000, 1_000_000):
            assert c.breakdown(decode_batch=b, decode_context_tokens=ctx).total_s == (
                pytest.approx(min(base + per * ctx for base, per in lines), rel=1e-9)
            )


def test_mla_kv_bytes_and_capacity_per_dp_rank(ds_decode):
    m = get_model("deepseek-v3")
    assert ds_decode.kv_bytes_per_token == 61 * 576 * 2 == m.kv_bytes_per_token()
    # each DP rank keeps its sequences' latents on its one GPU
    free = (
        81090 * 2**20 * 0.9  # CUDA's total on the H800 (as the H100 SXM: gpus.yaml)
        - ds_decode.weights_bytes_per_gpu
        # vLLM's reserve per DP rank (costmodel/reserve.py) at ceil(8192 / 144) = 57 tokens
        # and 64 sequences: 0.3183 GiB + the larger of the forward pass
        # 1.21 x 57 x (2 x 7168 + 3 x 18432) x 2 bytes and the logits 15.40 x 64 x 129280
        - 0.3183 * 2**30
        - max(1.21 * 57 * (2 * 7168 + 3 * 18432) * 2, 15.40 * 64 * 129280)
        - 2 * 2**30  # DeepEP buffers
    )
    assert ds_decode.kv_capacity_tokens_per_rank == int(free // (61 * 576 * 2))
    assert ds_decode.kv_capacity_tokens == 144 * ds_decode.kv_capacity_tokens_per_rank
    # attention TP replicates the latent: 8 GPUs of one rank hold what one GPU holds
    tp8 = build_moe_worker_cost("deepseek-v3", "h200-sxm", 8, weight_dtype="fp8-block")
    assert tp8.kv_bytes_per_token_per_gpu == 61 * 576 * 2


def test_expert_weights_per_gpu_follow_the_layout():
    m = get_model("qwen3-235b-a22b")
    per_expert = m.expert_params * 2  # bf16
    for ep in (1, 2, 4, 8):
        c = build_moe_worker_cost(m, "h200-sxm", 8, ep=ep)
        w = c.weights_breakdown_bytes_per_gpu()
        # 128 experts over ep ranks, each split 8 / ep ways: always 1/8 of them per GPU
        assert w["routed_experts"] == pytest.approx(94 * 128 / ep * per_expert / (8 / ep))
    # with DP attention the attention weights are replicated, the experts spread
    dp = build_moe_worker_cost(m, "h200-sxm", 1, dp=16)
    tp = build_moe_worker_cost(m, "h200-sxm", 8)
    wd, wt = dp.weights_breakdown_bytes_per_gpu(), tp.weights_breakdown_bytes_per_gpu()
    assert wd["routed_experts"] == pytest.approx(wt["routed_experts"] / 2)
    # TP4 shards the 4 KV heads exactly: a DP rank of one GPU holds 4 times as much
    wt4 = build_moe_worker_cost(m, "h200-sxm", 4).weights_breakdown_bytes_per_gpu()
    assert wd["attention"] == pytest.approx(4 * wt4["attention"], rel=1e-12)
    assert dp.weights_bytes == 16 * dp.weights_bytes_per_gpu


def test_sliding_window_layers_bound_kv_and_decode_reads():
    c = build_moe_worker_cost("gpt-oss-120b", "h100-sxm", 4, weight_dtype="released", max_seqs=64)
    # the engine allocates per token only for the 18 full-attention layers
    assert c.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2 == 36_864
    # the 18 sliding layers reserve 128 tokens for each of the 64 sequences (2 KV heads/GPU)
    assert c.window_reserve_bytes_per_gpu == 64 * 128 * 18 * 2 * 2 * 64 * 2
    base, per = c.decode_coeffs(32)
    # only full layers read per context token: 18 of 36 layers
    dense_like = build_moe_worker_cost(
        "gpt-oss-120b", "h100-sxm", 4, weight_dtype="released", max_seqs=64
    )
    assert per == pytest.approx(dense_like.decode_coeffs(32)[1])
    d = c._dec
    share = float(ops.decode_attention_bw_scale(d, 32, 2))  # 32 seqs x 2 heads
    want_per = 18 * 2 * 2 * 64 * 2 / (3.35e12 * d.bw_eff * share)
    assert per == pytest.approx(want_per, rel=1e-9)
    # chunked layers (Llama 4, 8192 tokens) are charged per token: exact within a chunk
    mv = build_moe_worker_cost("llama-4-maverick", "h200-sxm", 8)
    assert mv.kv_bytes_per_token == 48 * 2 * 8 * 128 * 2


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.floats(1, 65536),
    more=st.floats(1.0, 4.0),
    touched=st.integers(1, 64),
    width=st.sampled_from([512, 1536, 2048, 2880, 14336]),
)
def test_grouped_gemm_is_monotone_in_tokens(tokens, more, touched, width):
    p = load_moe_params("h100-sxm").gemm("bf16")
    t1 = grouped_gemm_time_s(p, 989e12, 3.35e12, tokens, min(touched, tokens), 4096, width, 2.0)
    t2 = grouped_gemm_time_s(
        p, 989e12, 3.35e12, tokens * more, min(touched, tokens * more), 4096, width, 2.0
    )
    assert t2 >= t1 * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.floats(1, 65536),
    more=st.floats(1.0, 4.0),
    touched=st.integers(1, 128),
    width=st.sampled_from([64, 192, 768, 1792, 7168]),
)
def test_tiled_grouped_gemm_is_monotone_in_tokens(tokens, more, touched, width):
    # SGLang's tuned-tile set (the tile form): padding to whole tiles never makes more
    # tokens cheaper
    p = load_moe_params("h100-sxm").gemm("bf16", "sglang", tuned=True)
    assert p.tile_m_tokens > 0
    t1 = grouped_gemm_time_s(p, 989e12, 3.35e12, tokens, min(touched, tokens), 4096, width, 2.0)
    t2 = grouped_gemm_time_s(
        p, 989e12, 3.35e12, tokens * more, min(touched, tokens * more), 4096, width, 2.0
    )
    assert t2 >= t1 * (1 - 1e-12)


def test_tiled_grouped_gemm_by_hand():
    """4 touched experts of 100 tokens each (padded to 2 tiles of 64 rows), hidden 4,096,
    shard 192 (gate/up N = 384: 3 tiles of 128; down N = 4,096: 32 tiles), 100 K steps of
    fill and epilogue per tile, at half of 1e15 FLOP/s: 8 row tiles x (3 x (4,096 + 100) +
    32 x (192 + 100)) tile-K steps of 2 x 64 x 128 FLOP each."""
    p = GroupedGemmParams(0.0, 0.5, 0.0, 1.0, tile_m_tokens=64, tile_n=128, tile_overhead_k=100)
    by_hand = 2 * 64 * 128 * 8 * (3 * 4196 + 32 * 292) / 5e14
    assert grouped_gemm_tile_compute_s(p, 1e15, 100.0, 4.0, 4096, 192, 3.0) == pytest.approx(
        by_hand, rel=1e-12
    )
    # the whole layer: launch 0, the weight stream (mem_eff 1 at 1e15 B/s) shorter
    assert grouped_gemm_time_s(p, 1e15, 1e15, 400.0, 4.0, 4096, 192, 2.0) == pytest.approx(
        by_hand, rel=1e-12
    )
    # never faster than the FLOP at peak x max_eff (the step model's lower bound)
    flop = 2.0 * 400 * 4096 * 192 * 3
    assert by_hand > flop / 5e14


@pytest.mark.parametrize("mode", ["normal", "low_latency"])
def test_all_to_all_is_monotone_in_tokens_and_nodes(mode):
    params = load_moe_params("h100-sxm").all_to_all[mode]["dispatch"]
    prev_nodes = 0.0
    for ep in (8, 16, 32, 64, 128):
        prev = 0.0
        for tokens in (1, 16, 128, 1024, 8192):
            nv, rd = all_to_all_volume_bytes(tokens, 7392, 8, ep, 8, mode)
            t = all_to_all_time_s(params, nv, rd, math.ceil(ep / 8), 450e9, 50e9)
            assert t > prev
            prev = t
        assert prev >= prev_nodes  # same tokens per GPU across more nodes is not faster
        prev_nodes = prev


def test_decode_step_grows_with_batch_and_experts_with_tokens(ds_decode):
    prev = (0.0, 0.0)
    for b in (144, 144 * 8, 144 * 32, 144 * 128):
        bd = ds_decode.breakdown(decode_batch=b, decode_context_tokens=b * 2000)
        cur = (bd.total_s, bd.expert_gemm_s)
        assert cur[0] > prev[0] and cur[1] >= prev[1]
        prev = cur


def test_two_batch_overlap_hides_all_to_all_and_parts_add_up():
    kw = dict(dp=32, weight_dtype="fp8-block", redundant_experts=32)
    plain = build_moe_worker_cost("deepseek-v3", "h800-sxm", 1, **kw)
    tbo = build_moe_worker_cost("deepseek-v3", "h800-sxm", 1, two_batch_overlap=True, **kw)
    args = dict(prefill_seqs=64, prefill_tokens=32 * 8192, prefill_attn_pairs=64 * 4096 * 4097 / 2)
    a, b = plain.breakdown(**args), tbo.breakdown(**args)
    assert b.overlap_s < 0 and b.total_s < a.total_s
    assert b.total_s == pytest.approx(sum(b.as_dict().values()), rel=1e-12)
    assert tbo.prefill_time_s(64, 32 * 8192, 64 * 4096 * 4097 / 2) == pytest.approx(b.total_s)
    # the hidden time is at most the all-to-all itself
    assert -b.overlap_s <= a.dispatch_s + a.combine_s


def test_power_law_imbalance_is_deterministic_and_eplb_lowers_it():
    f = power_law_imbalance(4096, 256, 8, 32, 1.01)
    assert f == power_law_imbalance(4096, 256, 8, 32, 1.01)
    assert 1.0 < f < 32.0
    assert power_law_imbalance(4096, 256, 8, 32, 1.01, redundant_experts=32) < f
    assert power_law_imbalance(4096, 256, 8, 1, 1.01) == 1.0
    skewed = build_moe_worker_cost(
        "deepseek-v3", "h800-sxm", 1, dp=32, weight_dtype="fp8-block", routing="power_law"
    )
    even = build_moe_worker_cost("deepseek-v3", "h800-sxm", 1, dp=32, weight_dtype="fp8-block")
    assert skewed.imbalance(4096) > 1.0 == even.imbalance(4096)
    assert skewed.decode_time_s(2048, 2048 * 1000) > even.decode_time_s(2048, 2048 * 1000)


def test_power_law_imbalance_at_any_exponent_the_cli_accepts():
    """`cost decode --routing power_law --power-law-alpha 1000` (any exponent > 0 is
    accepted) ended in an OverflowError: the sample ``((hi^a1 - lo^a1) u + lo^a1)^(1/a1)``,
    a1 = 1 - alpha, raised lo = 0.01 (fewer token copies than experts) to -999. Drawn as
    ``lo (1 + u ((hi/lo)^a1 - 1))^(1/a1)``, the same law, no power overflows; a steep law
    puts every expert's load near ``lo``, so the ranks are nearly even."""
    for alpha in (1e-9, 0.5, 1.01, 2.0, 50.0, 1000.0, 1e300):
        for tokens in (8, 4096):  # lo = 0.01 (8 x 8 copies < 256 experts) and lo = 1
            f = power_law_imbalance(tokens, 256, 8, 8, alpha)
            assert math.isfinite(f) and 1.0 <= f <= 8.0, (alpha, tokens, f)
    assert power_law_imbalance(8, 256, 8, 8, 1000.0) < 1.05
    # the same draws as the textbook inverse CDF where that does not overflow
    alpha, lo, hi = 1.5, 1.0, 0.8 * 4096
    u = np.random.default_rng(0).random(256)
    a1 = 1.0 - alpha
    x = ((hi**a1 - lo**a1) * u + lo**a1) ** (1.0 / a1)
    load = x / x.sum() * 4096 * 8
    direct = load.reshape(8, -1).sum(axis=1).max() / (4096 * 8 / 8)
    assert power_law_imbalance(4096, 256, 8, 8, alpha, draws=1) == pytest.approx(direct, rel=1e-12)


def test_dense_models_keep_the_dense_model():
    c = build_cost("llama-3-70b", "h100-sxm", 4)
    assert isinstance(c, RooflineWorkerCost)
    # and MoE models reach the MoE model through the dense entry point too (plan, cost)
    assert isinstance(build_worker_cost("mixtral-8x7b", "h100-sxm", 2), MoeWorkerCost)


@pytest.mark.parametrize(
    "model, kwargs, match",
    [
        ("llama-3-70b", dict(tp=4, ep=2), r"^ep: model llama-3-70b is dense.*allowed: ep 1"),
        ("llama-3-70b", dict(tp=4, dp=2), r"^dp: model llama-3-70b is dense"),
        (
            "llama-3-70b",
            dict(tp=4, moe={"two_batch_overlap": True}),
            r"^moe: model llama-3-70b is dense.*two_batch_overlap",
        ),
        ("deepseek-v3", dict(tp=1, dp=16, ep=6), r"^ep: 6 does not divide the worker's 16 GPUs"),
        ("deepseek-v3", dict(tp=1, dp=16, ep=8), r"^ep: with dp 16 .*allowed: 16"),
        ("mixtral-8x7b", dict(tp=8, ep=16), r"^ep: 16 does not divide the worker's 8 GPUs"),
        (
            "qwen3-235b-a22b",
            dict(tp=4, dp=6, moe={"redundant_experts": 0}),
            r"^ep: 24 does not divide the 128 expert slots .*allowed: none",
        ),
        ("qwen3-235b-a22b", dict(tp=3), r"^tp: 3 does not shard the 64 attention heads / 4 KV"),
        ("deepseek-v3", dict(tp=16), r"^tp: attention TP 16 spans nodes"),
        ("deepseek-v3", dict(tp=1, dp=2), r"^deepseek-v3 does not fit on 2 x h100-sxm"),
        ("deepseek-v3", dict(tp=8, moe={"routing": "zipf"}), r"^routing: 'zipf' \(allowed"),
    ],
)
def test_bad_layouts_are_one_line_errors_naming_the_field(model, kwargs, match):
    kwargs = dict(kwargs)
    tp = kwargs.pop("tp")
    with pytest.raises(UserError, match=match) as e:
        build_cost(model, "h100-sxm", tp, weight_dtype="bf16", **kwargs)
    assert "\n" not in str(e.value)


def test_fp8_block_needs_fp8_tensor_cores():
    with pytest.raises(UserError, match=r"^weight_dtype: a100-80gb has no FP8"):
        build_moe_worker_cost("qwen3-30b-a3b", "a100-80gb", 1, weight_dtype="fp8-block")


def _python_calls(fn) -> int:
    """Python function calls made while running ``fn()`` (a deterministic work count)."""
    import sys

    calls = 0

    def prof(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_cost_per_state_change_does_not_grow_with_gpus_per_worker():
    """A step costs the same work on an 8-GPU and a 144-GPU unit (no per-GPU loop), and a
    decode batch size is costed once."""
    small = build_moe_worker_cost("deepseek-v3", "h200-sxm", 1, dp=8, weight_dtype="fp8-block")
    wide = build_moe_worker_cost(
        "deepseek-v3", "h800-sxm", 1, dp=144, weight_dtype="fp8-block", redundant_experts=32
    )
    counts = []
    for c in (small, wide):
        counts.append(
            (
                _python_calls(lambda c=c: c.prefill_time_s(16, 16 * 2048, 16 * 2048 * 2049 / 2)),
                _python_calls(lambda c=c: c.decode_coeffs(777)),
                _python_calls(lambda c=c: c.mixed_time_s(64, 64000, 1, 512, 512 * 513 / 2)),
            )
        )
        assert _python_calls(lambda c=c: c.decode_coeffs(777)) <= 2  # memoised
    assert counts[0] == counts[1]


def test_all_to_all_traffic_is_what_the_step_prices(ds_decode):
    """The traffic handed to a fabric model is the volume the dispatch time was priced on."""
    tr = ds_decode.all_to_all_traffic(144 * 64, 0)
    assert (tr.mode, tr.num_layers, tr.nodes) == ("low_latency", 58, 18)
    payload = 7168 + 7168 / 128 * 4
    assert tr.dispatch_nvlink_bytes == pytest.approx(64 * 8 * 7 / 144 * payload)
    assert tr.dispatch_rdma_bytes == pytest.approx(64 * 8 * 136 / 144 * payload)
    assert tr.combine_rdma_bytes == pytest.approx(64 * 8 * 136 / 144 * 7168 * 2)
    p = load_moe_params("h800-sxm").all_to_all["low_latency"]["dispatch"]
    one = float(
        all_to_all_time_s(p, tr.dispatch_nvlink_bytes, tr.dispatch_rdma_bytes, 18, 200e9, 50e9)
    )
    bd = ds_decode.breakdown(decode_batch=144 * 64, decode_context_tokens=0)
    assert bd.dispatch_s == pytest.approx(58 * one, rel=1e-12)
    assert ds_decode.all_to_all_traffic(144 * 64, 4096).mode == "normal"
    tp_only = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 4)
    assert tp_only.all_to_all_traffic(64, 0).num_layers == 0


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
@pytest.mark.parametrize("gpu", ["h200-sxm", "a100-80gb"])
def test_carried_grouped_gemm_follows_bandwidth_in_decode_and_flops_in_prefill(
    gpu, engine, tmp_path
):
    """The grouped-GEMM parameters are fitted on the H100 only. Carried to another GPU, a
    decode step's routed experts (Mixtral-8x7B TP2, batch 8: two tokens per expert, held by
    the weight stream) scale with the HBM bandwidth ratio, a long prefill's (16,384 tokens)
    tensor-core part with the FLOP ratio and its permute/finalize pass over the layer's
    tokens (``token_eff``, a bandwidth term) with the bandwidth ratio, each within 5%:
    the small-m compute floor scales with the machine balance (carry_half_sat), the weight
    stream with the GPU's bandwidth. Unscaled,
    the H100's floor made the H200 decode 0.95x the H100's (bandwidth says 0.70x) and the
    A100's 2.9x (1.64x). Each engine's own kernel (vLLM's pass over the tokens is 19% of
    its prefill, TensorRT-LLM's 1%). Both GPUs run the same parameter set: SGLang ships a
    tuned tile config for Mixtral at TP2 (E=8, N=7168) on the H100 and the H200, none on
    the A100 (hardware/moe/sglang_triton_configs.csv; on the H100 none at TP1/16/32 either,
    where Mixtral does not fit an A100 or does not shard), so SGLang against the A100 is
    compared with an H100 whose parameter file holds the default-tile set only."""
    untuned = None
    if (engine, gpu) == ("sglang", "a100-80gb"):
        raw = json.loads(Path(load_moe_params("h100-sxm").path).read_text())
        raw.pop("grouped_gemm_tuned")
        untuned = tmp_path / "default_tiles.json"
        untuned.write_text(json.dumps(raw))

    def experts_s(g: str) -> tuple[float, float]:
        file = untuned if g == "h100-sxm" else None
        c = build_moe_worker_cost("mixtral-8x7b", g, 2, engine=engine, moe_params=file)
        tiles.append(c.expert_tuned_tiles and file is None)  # no tuned set in the file
        dec = c.breakdown(decode_batch=8, decode_context_tokens=8 * 1000).expert_gemm_s
        pre = c.breakdown(
            prefill_seqs=4, prefill_tokens=16384, prefill_attn_pairs=4 * 4096 * 4097 / 2
        ).expert_gemm_s
        return dec, pre

    tiles: list[bool] = []
    (dec_h, pre_h), (dec_g, pre_g) = experts_s("h100-sxm"), experts_s(gpu)
    assert tiles[0] == tiles[1]
    h100, other = get_gpu("h100-sxm"), get_gpu(gpu)
    bw_ratio = h100.hbm_bytes_per_s / other.hbm_bytes_per_s
    flop_ratio = h100.bf16_flop_per_s / other.bf16_flop_per_s
    # the weight stream at the carried fraction of the GPU's peak
    assert dec_g / dec_h == pytest.approx(bw_ratio, rel=0.05)
    # 32 MoE layers, each reading the 16,384 tokens in and writing them out (bf16)
    p = load_moe_params("h100-sxm").gemm("bf16", engine, tiles[0])
    tokens_h = 32 * 16384 * 4096 * 2 * 2 / (h100.hbm_bytes_per_s * p.token_eff)
    want = (pre_h - tokens_h) * flop_ratio + tokens_h * bw_ratio
    assert pre_g == pytest.approx(want, rel=0.05)
    if engine == "trtllm":  # its token pass is ~1%: the prefill follows the FLOPs
        assert pre_g / pre_h == pytest.approx(flop_ratio, rel=0.05)


def test_prefill_attention_is_the_dense_steps_formula(monkeypatch):
    # Mixtral's prefill attention, one GPU of TP2 on the H100: the dense step's formula by
    # hand (the profile's prefill fit at the batch's mean prompt length) ...
    from disaggsim.costmodel import step

    c = build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine="trtllm")
    seqs, tokens = 4, 4 * 1500
    pairs = seqs * 1500 * 1501 / 2
    p, peak = c._pre, c._bf16
    mean_len = tokens / seqs
    eff = p.max_eff * mean_len / (mean_len + p.half_sat)
    by_hand = p.floor_s + 4.0 * pairs * 16 * 128 / (peak * eff)  # 32 heads / TP2, dim 128
    assert c._attention_s(0.0, 0.0, seqs, tokens, pairs) == pytest.approx(by_hand, rel=1e-12)
    base = c.breakdown(prefill_seqs=seqs, prefill_tokens=tokens, prefill_attn_pairs=pairs)

    # ... looked up on the step's module when called, so a diagnostic that swaps it for a
    # run (calibration.throughput --what-if prefix-attention) reaches MoE models: the
    # attention part follows the swap, nothing else moves
    def doubled(*args):
        return 2.0 * by_hand

    monkeypatch.setattr(step, "_prefill_attention_s", doubled)
    swapped = c.breakdown(prefill_seqs=seqs, prefill_tokens=tokens, prefill_attn_pairs=pairs)
    layers = get_model("mixtral-8x7b").num_layers
    assert swapped.attention_s == pytest.approx(base.attention_s + layers * by_hand, rel=1e-9)
    assert swapped.expert_gemm_s == base.expert_gemm_s


def test_a_one_token_mla_extend_costs_no_more_than_decoding_it():
    """DeepSeek-V3 TP8 on the H200: a one-token chunk after a 32,768-token prefix (a
    resumed prompt's last token) attends the same keys as a decode step of one sequence at
    32,769 tokens; its prefill attention is at most that decode step's (it was 45x: the
    prefill fit's efficiency, a function of the mean new tokens a sequence, is fitted on
    fresh prompts and falls to 0.1 % of peak at one token). And adding a fresh 2,048-token
    prompt to its batch no longer makes the attention faster (62 -> 12 ms before)."""
    c = build_moe_worker_cost("deepseek-v3", "h200-sxm", 8, weight_dtype="fp8-block")
    one = c._attention_s(0, 0.0, 1, 1, 32_769.0)
    decode = c._attention_s(1, 32_769.0, 0, 0, 0.0)
    assert one <= decode * (1 + 1e-12)
    prompt_pairs = 2048 * 2049 / 2
    both = c._attention_s(0, 0.0, 2, 2049, 32_769.0 + prompt_pairs)
    assert both >= one
    assert both >= c._attention_s(0, 0.0, 1, 2048, prompt_pairs)
    # fresh prompts keep the prefill fit (the decode kernel is slower for them at every
    # length; 1 to 8,192 tokens)
    for n in (1, 64, 1024, 8192):
        pairs = n * (n + 1) / 2
        fresh = c._attention_s(0, 0.0, 1, n, pairs)
        assert fresh < c._attention_s(n, pairs, 0, 0, 0.0)
