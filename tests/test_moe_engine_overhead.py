"""An MoE worker takes the serving engine's overhead by the dense model's rules
(``disaggsim/costmodel/overhead.py``): host time per iteration, sequence and token, and an
eager engine's launch floor, its layers' kernels counted as the MoE model costs them.

Expected values are hand arithmetic: kernel counts from the model's structure, engine
parameters from the profiles given here (or the shipped one's fields), the LM head (a
kernel outside the launch floor, not under test) from the step's breakdown.
"""

from __future__ import annotations

import dataclasses

import pytest

from disaggsim.costmodel.moe import MoeWorkerCost, build_moe_worker_cost
from disaggsim.hardware.engines import EngineProfile, resolve_engine

MS = 1e-3
US = 1e-6
# Mixtral-8x7B at TP 2 (dp 1: the MoE output is all-reduced), per layer in a decode step:
# QKV and O GEMMs, decode attention, 6 element-wise (two norms, rope, KV write, two
# residual adds), router GEMM, gate/up and down grouped GEMMs and their activation, the
# attention and the MoE all-reduces: 2 + 1 + 6 + 1 + 3 + 2 = 15 kernels, 32 layers.
MIXTRAL_LAUNCHES = 32 * 15
# a 16-bit dense layer at TP > 1: 4 GEMMs + 1 attention + 7 element-wise + 2 all-reduces
DENSE_TP_LAUNCHES = 14
DENSE_TP1_LAUNCHES = 12

EAGER = EngineProfile(
    name="eager-test",
    per_iteration_s=1.0 * MS,
    per_seq_s=5 * US,
    per_token_s=10 * US,
    per_layer_tp_s=100 * US,
    launch_per_layer_s=700 * US,
    cuda_graphs=False,
)
NO_LAUNCH = dataclasses.replace(EAGER, name="no-launch-test", launch_per_layer_s=0.0)


def _mixtral(engine) -> MoeWorkerCost:
    return build_moe_worker_cost("mixtral-8x7b", "h100-sxm", 2, engine=engine)


def test_mixtral_counts_its_moe_kernels():
    assert _mixtral(EAGER).launches_per_iteration(decode=True, prefill=False) == 480
    assert MIXTRAL_LAUNCHES == 480


def test_launch_bound_decode_step_is_lm_head_host_and_launches_by_hand():
    c = _mixtral(EAGER)
    host = 1.0 * MS + 5 * US * 1 + 10 * US * 1 + 32 * 100 * US  # 1 sequence, 1 token
    launches = 700 * US * MIXTRAL_LAUNCHES / DENSE_TP_LAUNCHES  # 24.0 ms
    assert launches == pytest.approx(24.0 * MS, rel=1e-12)
    for ctx in (0, 1000, 4000):
        bd = c.breakdown(decode_batch=1, decode_context_tokens=ctx)
        kernels = bd.total_s - bd.lm_head_s - bd.overhead_s
        assert kernels < launches  # launch-bound: the precondition of the arithmetic
        want = bd.lm_head_s + host + launches
        assert c.decode_time_s(1, ctx) == pytest.approx(want, rel=1e-12)
        assert bd.total_s == pytest.approx(want, rel=1e-12)
    # constant in the context while launch-bound: the engine's second decode line
    assert c.decode_item_coeffs(1)[1] == 0.0


def test_eager_costs_more_than_the_same_engine_without_launches_by_the_floor():
    """Twice the launch rate adds the launches once more (both launch-bound), and an engine
    with the same host time but no launches pays the kernels instead."""
    double = dataclasses.replace(EAGER, launch_per_layer_s=1400 * US)
    one, two, none = _mixtral(EAGER), _mixtral(double), _mixtral(NO_LAUNCH)
    extra = 700 * US * MIXTRAL_LAUNCHES / DENSE_TP_LAUNCHES
    for ctx in (0, 2000):
        assert two.decode_time_s(1, ctx) - one.decode_time_s(1, ctx) == pytest.approx(
            extra, rel=1e-9
        )
        bd = none.breakdown(decode_batch=1, decode_context_tokens=ctx)
        kernels = bd.total_s - bd.lm_head_s - bd.overhead_s
        assert one.decode_time_s(1, ctx) - none.decode_time_s(1, ctx) == pytest.approx(
            extra - kernels, rel=1e-9
        )


def test_kernels_longer_than_the_launches_hide_them():
    """A small launch rate (3.4 ms of launches against ~7 ms of kernels at batch 1): the
    eager step equals the one without launches at every context."""
    light = dataclasses.replace(EAGER, launch_per_layer_s=100 * US)
    c, none = _mixtral(light), _mixtral(NO_LAUNCH)
    for b, ctx in ((1, 0), (1, 8000), (64, 64 * 2000)):
        assert c.decode_time_s(b, ctx) == none.decode_time_s(b, ctx)
    assert c.decode_knee_tokens(1) == 0.0


def test_decode_lines_match_the_direct_step_across_the_knee():
    """Where the kernels outgrow the launches (long contexts at batch 64) the step takes
    the kernels' line; the two lines and the direct breakdown agree at every context."""
    c = _mixtral(EAGER)
    b = 64
    knee = c.decode_knee_tokens(b)
    assert knee > 0
    for ctx in (0, knee / 2, knee, 2 * knee, 8 * knee):
        direct = c.breakdown(decode_batch=b, decode_context_tokens=int(ctx)).total_s
        assert c.decode_time_s(b, int(ctx)) == pytest.approx(direct, rel=1e-9)


def test_shipped_eager_engine_on_mixtral_by_hand():
    """``vllm-eager-2023`` (its fields as shipped) against ``vllm`` at batch 1: the eager
    step is the LM head, its host time and its launches; vLLM's the kernels, the LM head
    and its host time (per iteration and per extra TP rank). Every host term at the speed
    of the H100 machine's host (``host_scale``; vLLM's: 1)."""
    e, v = resolve_engine("vllm-eager-2023"), resolve_engine("vllm")
    eager, graphs = _mixtral("vllm-eager-2023"), _mixtral("vllm")
    bd = graphs.breakdown(decode_batch=1, decode_context_tokens=1000)
    kernels = bd.total_s - bd.lm_head_s - bd.overhead_s
    host_v = v.per_iteration_s + v.per_tp_rank_s + v.per_seq_s + v.per_token_s
    assert bd.overhead_s == pytest.approx(host_v, rel=1e-12)  # shipped profiles: no graph cost
    host = e.host_scale_for("h100-sxm")
    assert v.host_scale_for("h100-sxm") == 1.0
    host_e = host * (
        e.per_iteration_s + e.per_tp_rank_s + e.per_seq_s + e.per_token_s
        + 32 * (e.per_layer_s + e.per_layer_tp_s)
    )  # fmt: skip
    launches = host * e.launch_per_layer_s * MIXTRAL_LAUNCHES / DENSE_TP_LAUNCHES
    want = bd.lm_head_s + host_e + max(launches, kernels)
    assert eager.decode_time_s(1, 1000) == pytest.approx(want, rel=1e-12)
    assert eager.decode_time_s(1, 1000) - graphs.decode_time_s(1, 1000) == pytest.approx(
        host_e - host_v + max(launches - kernels, 0.0), rel=1e-9
    )


def test_deepseek_mla_expert_parallel_counts_by_hand():
    """DeepSeek-V3 on 2 DP ranks of TP 8 (EP 16, all-to-all): 61 layers of MLA attention
    (q_a, q_b, kv_a, o projections, the two absorbed BMMs in decode, one attention kernel,
    6 element-wise, the attention all-reduce: 14), 3 dense-MLP layers (2 GEMMs, activation,
    all-reduce: 4), 58 MoE layers (router, shared expert's 2 GEMMs and activation, the
    routed experts' 3, dispatch, combine, the all-reduce gathering the rank's tokens: 10).
    Prefill swaps the BMMs for none (absorbed prefill keeps them); naive prefill adds kv_b
    in place of the BMMs. Two-batch overlap launches an MoE layer's projections (4),
    element-wise (6) and MoE kernels (9) once per micro-batch."""
    kw = dict(dp=2, engine=EAGER, weight_dtype="fp8-block")
    c = build_moe_worker_cost("deepseek-v3", "h200-sxm", 8, **kw)
    decode = 61 * 14 + 3 * 4 + 58 * 10
    assert c.launches_per_iteration(True, False) == decode == 1446
    assert c.launches_per_iteration(False, True) == decode  # absorbed prefill: same kernels
    naive = build_moe_worker_cost("deepseek-v3", "h200-sxm", 8, mla_prefill="naive", **kw)
    assert naive.launches_per_iteration(False, True) == decode - 61 * 1
    assert c.launches_per_iteration(True, True) == decode + 61  # two attention kernels
    tbo = build_moe_worker_cost("deepseek-v3", "h200-sxm", 8, two_batch_overlap=True, **kw)
    assert tbo.launches_per_iteration(True, False, split=True) == (
        61 * 14 + 3 * 4 + 58 * (2 * 9 + 4 + 6 + 1)
    )
    # the step at batch 1 is launch-bound: its launches at the dense rate per kernel
    bd = c.breakdown(decode_batch=1, decode_context_tokens=1000)
    host = 1.0 * MS + 5 * US + 10 * US + 61 * 100 * US
    launches = 700 * US * 1446 / DENSE_TP_LAUNCHES
    assert bd.total_s == pytest.approx(bd.lm_head_s + host + launches, rel=1e-12)


def test_dense_shaped_layers_launch_like_the_dense_model():
    """A layer the MoE model costs like a dense one (GQA attention, dense MLP) launches
    what the dense model's layer does: Mixtral with every layer dense would count 14 at
    TP 2 and 12 at TP 1 (the dense model's launch_per_layer_s each); its MoE layers add
    the router and the MoE all-reduce (TP 2: 15) or just the router (TP 1: 13)."""
    tp1 = build_moe_worker_cost("mixtral-8x7b", "h200-sxm", 1, engine=EAGER)
    assert tp1.launches_per_iteration(True, False) == 32 * 13
    bd = tp1.breakdown(decode_batch=1, decode_context_tokens=0)
    host = 1.0 * MS + 5 * US + 10 * US  # no per-layer TP time at TP 1
    launches = 700 * US * 32 * 13 / DENSE_TP1_LAUNCHES
    assert bd.total_s == pytest.approx(bd.lm_head_s + host + launches, rel=1e-12)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_graph_engines_keep_one_decode_line_and_the_fixed_host_time(engine):
    c = _mixtral(engine)
    e = resolve_engine(engine)
    assert not hasattr(c, "decode_item_coeffs")  # the engine's one-line decode path
    bd = c.breakdown(decode_batch=8, decode_context_tokens=8000)
    graph_s = 32 * c.profile.graph_layer_s if e.cuda_graphs else 0.0
    host = (
        e.per_iteration_s + e.per_tp_rank_s + 8 * e.per_seq_s + 8 * e.per_token_s
        + 32 * (e.per_layer_s + e.per_layer_tp_s) + graph_s
    )  # fmt: skip
    assert e.launch_per_layer_s == 0.0
    assert bd.overhead_s == pytest.approx(host, rel=1e-12)
