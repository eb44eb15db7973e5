"""The planner's worker layouts and its prefix-reuse arithmetic (docs/planning.md):

- MoE models: ``plan`` searches EP/DP layouts per pool and unit sizes in nodes
  (issue 17 item 6), end to end on a small question;
- a ``kind: topology`` fabric limits the layouts to what it can place (TP within one
  node, one DP rank), so no candidate fails at run time;
- the analytic first guess and bounds account for the expected prefix hit share of a
  workload that repeats prefixes (issue 16 item 7), and the advisor says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

import numpy as np
import pytest
import yaml

from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.moe import build_cost, valid_layouts
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.metrics.steady import RunLengthRule
from disaggsim.plan.advisor import REUSE_MATTERS, _reuse
from disaggsim.plan.analytic import (
    Layout,
    analytic_guess,
    expected_prefix_hit_share,
    kv_capacity_per_rank,
    prefill_s_per_request,
    sample_lengths,
    sample_requests,
    worker_cost,
)
from disaggsim.plan.question import Question, build_question
from disaggsim.plan.search import (
    Candidate,
    PlanOptions,
    _Evaluator,
    candidate_scenario,
    headline_layouts,
    plan_families,
    tp_options,
    worker_layouts,
)
from tests.conftest import REPO

search_mod = importlib.import_module("disaggsim.plan.search")  # the module, not plan.search()


def _question(model: str, gpus: int, **kw) -> dict:
    q = Question(
        model=model, gpu="h100-sxm", gpus=gpus, isl="2000", osl="200", ttft_ms=2000,
        itl_ms=50, **kw,
    )  # fmt: skip
    return build_question(q)


# ------------------------------------------------------------------ MoE layouts


def test_moe_layouts_span_data_parallel_ranks_and_whole_nodes():
    loaded = load_scenario(_question("qwen3-30b-a3b", 16))
    lengths = sample_lengths(loaded)
    pre, dec, colo = worker_layouts(loaded, 16, lengths, PlanOptions())
    model = loaded.scenario.model
    from disaggsim.catalog import get_model

    spec = get_model(model)
    need = int(np.percentile(lengths[0], 99) + np.percentile(lengths[1], 99))
    for lay in {*pre, *dec, *colo}:
        ep = lay.ep if lay.ep is not None else (lay.gpus if lay.dp > 1 else 1)
        assert (lay.tp, lay.dp, ep) in valid_layouts(spec, lay.gpus, 8)
        cost = build_cost(model, "h100-sxm", lay.tp, dp=lay.dp, ep=lay.ep)
        assert kv_capacity_per_rank(cost) >= need
    # the search is not TP-only: data-parallel attention and units of whole nodes appear
    assert any(lay.dp > 1 for lay in [*pre, *dec])
    assert any(lay.gpus >= 8 for lay in [*pre, *dec])
    assert len(pre) <= PlanOptions().moe_unit_sizes and len({x.gpus for x in pre}) == len(pre)
    assert colo == list(dict.fromkeys([*dec, *pre]))
    # MoE families are not bounded by the separate-phase analytic capacity (a colocated
    # MoE pool beat it by 65 %: docs/planning.md) but by their iteration floor, a true
    # bound (tests/test_moe_bound.py); dense families keep the analytic one
    fams, guesses = plan_families(loaded, 16, PlanOptions(), lengths)
    assert fams and all(0 < f.bound_per_gpu < float("inf") and f.true_bound for f in fams)
    assert any(f.bound_per_gpu > guesses[f.starts[0]].capacity_per_gpu_per_s for f in fams)
    # a dense model keeps the TP ladder (beyond a node too, on a link fabric), the same for
    # every pool
    dense = load_scenario(_question("llama-3-8b", 16))
    d_pre, d_dec, d_colo = worker_layouts(dense, 16, sample_lengths(dense), PlanOptions())
    assert d_pre == d_dec == d_colo == [Layout(tp) for tp in (1, 2, 4, 8, 16)]
    d_fams, _ = plan_families(dense, 16, PlanOptions(), sample_lengths(dense))
    assert all(0 < f.bound_per_gpu < float("inf") and not f.true_bound for f in d_fams)


def test_moe_prefill_layouts_that_prefill_a_prompt_within_the_ttft_target_come_first():
    """DeepSeek-V3 (fp8-block) on 16 H200, 8000-token prompts, TTFT 1 s: by prompt
    tokens per GPU the data-parallel layouts win (tp1 x dp8, tp1 x dp16), but a prompt
    prefills on one rank, 1.25 s alone at tp1 x dp16, over the target at any load; the
    plan kept only those and said 'none' ('a mean prompt's prefill alone (8000 tokens)
    takes 1,250 ms on the fastest worker searched (tp1xdp16)') where tp8 prefills it in
    0.39 s. The prefill layouts kept now prefill a mean prompt alone within half the
    target (tp2 x dp4 takes 0.81 s: a prompt queued behind another would miss)."""
    q = Question(
        model="deepseek-v3", gpu="h200-sxm", gpus=16, isl="8000", osl="500", ttft_ms=1000,
        itl_ms=50, weight_dtype="released",
    )  # fmt: skip
    loaded = load_scenario(build_question(q))
    pre, _, colo = worker_layouts(loaded, 16, sample_lengths(loaded), PlanOptions.quick())
    assert pre and set(pre) <= set(colo)
    for lay in pre:
        cost = build_cost("deepseek-v3", "h200-sxm", lay.tp, dp=lay.dp, ep=lay.ep,
                          weight_dtype="fp8-block")  # fmt: skip
        assert cost.prefill_time_s(1, 8000, 8000 * 8001 / 2.0) <= 0.5, lay.tag
    # the ranking by throughput alone would have kept the data-parallel ones
    from disaggsim.plan.moe_layouts import search_moe_layouts

    by_rate = search_moe_layouts(
        "deepseek-v3", "h200-sxm", "prefill", prompt_tokens=8000, context_tokens=8250,
        sizes=(8, 16), weight_dtype="fp8-block",
    )  # fmt: skip
    assert by_rate.best.tp == 1 and by_rate.best.dp > 1


def test_moe_units_may_span_nodes_on_a_topology_fabric():
    raw = _question("qwen3-30b-a3b", 16)
    raw["fabric"] = {"kind": "topology", "gpus_per_node": 8}
    loaded = load_scenario(raw)
    pre, dec, _ = worker_layouts(loaded, 16, sample_lengths(loaded), PlanOptions())
    assert all(lay.tp <= 8 for lay in [*pre, *dec])
    assert any(lay.dp > 1 for lay in [*pre, *dec])
    ev = _Evaluator(loaded, {}, PlanOptions(), None, None)
    # after the 4-rank prefill unit, the 8-rank decode unit spans both nodes (4 + 4)
    cand = Candidate("disaggregate", 1, 1, 1, 1, prefill_dp=4, decode_dp=8)
    assert ev._fabric_problem(cand) is None


def test_an_moe_candidate_is_a_runnable_scenario_with_its_layout():
    loaded = load_scenario(REPO / "scenarios" / "moe" / "qwen3-235b-disaggregated.yaml")
    cand = Candidate("disaggregate", 1, 4, 1, 1, prefill_dp=2, decode_dp=8, decode_ep=8)
    raw = candidate_scenario(loaded, cand)
    s = load_scenario(raw).scenario
    assert s.num_gpus == cand.num_gpus == 16
    assert (s.prefill_pool.tp, s.prefill_pool.dp, s.prefill_pool.ep) == (4, 2, None)
    assert (s.decode_pool.tp, s.decode_pool.dp, s.decode_pool.ep) == (1, 8, 8)
    # the scenario's batch limits are per DP rank (32768 / 2 tokens, raised to the
    # longest prompt, 32768; 512 / 8 sequences), scaled to each candidate's ranks
    assert s.prefill_pool.max_batch_tokens == 2 * 32768
    assert s.decode_pool.max_batch_seqs == 512
    colo = Candidate("colocate_chunked", 4, 2, chunk_tokens=1024, prefill_dp=2)
    pool = load_scenario(candidate_scenario(loaded, colo)).scenario.pool
    assert (pool.tp, pool.dp, pool.max_batch_tokens, pool.max_batch_seqs) == (2, 2, 2048, 128)
    assert colo.label == "chunked 4 x tp2xdp2 chunk 1024"
    assert cand.label == "disagg 1P x tp4xdp2 + 1D x tp1xdp8 ep8"


def test_moe_plan_end_to_end_searches_layouts(tmp_path):
    """A small MoE question, planned in quick mode with short runs: the families are
    layout pairs (DP/EP among them), every simulated candidate has the GPUs it says, and
    the recommendation is written as a scenario that loads with its layout."""
    from disaggsim.plan import plan
    from disaggsim.plan.report import write_outputs
    from disaggsim.sweep import SerialExecutor

    loaded = load_scenario(_question("qwen3-30b-a3b", 8))
    tiny = RunLengthRule(min_measured_requests=60, service_multiple=1.0)
    opts = dataclasses.replace(PlanOptions.quick(), rule=tiny, explore_rule=tiny, max_waves=1)
    with SerialExecutor() as ex:
        res, advice = plan(loaded, options=opts, executor=ex)
    assert any("dp" in name for name in res.families)
    simulated = [r for r in res.ranked if r.at_rate is not None]
    assert simulated
    for r in simulated:
        assert r.at_rate.num_gpus == r.candidate.num_gpus <= 8
    assert any(r.candidate.prefill_dp > 1 or r.candidate.decode_dp > 1 for r in res.ranked)
    if advice.decided:
        from disaggsim.plan.deploy import unsupported

        write_outputs(res, advice, tmp_path / "out", plots=False)
        rec = load_scenario(tmp_path / "out" / "recommended.yaml").scenario
        assert rec.num_gpus == advice.recommended.candidate.num_gpus
        # SGLang's launch config always; vLLM's and Dynamo's for layouts vLLM expresses
        assert (tmp_path / "out" / "deploy-sglang.sh").is_file()
        written = (tmp_path / "out" / "deploy-vllm.sh").is_file()
        assert written == (unsupported(advice.recommended.candidate) is None)
        assert written == (tmp_path / "out" / "deploy-dynamo.yaml").is_file()


# ------------------------------------------------------------------ topology fabrics


def test_topology_fabric_limits_layouts_to_what_it_places():
    raw = load_scenario(REPO / "scenarios" / "fabric" / "nvlink.yaml").raw
    loaded = load_scenario(raw)
    lengths = sample_lengths(loaded)
    # a link fabric would offer TP 16 and 32 for 32 GPUs (priced hierarchically)
    link = load_scenario({**raw, "fabric": {"link": "infiniband"}})
    assert max(tp_options(link, 32, lengths)) > 8
    assert max(tp_options(loaded, 32, lengths)) == 8
    # a deployment the topology cannot place is evaluated as invalid, not simulated
    small = load_scenario(raw, ["fabric.placement.num_nodes=1"])
    ev = _Evaluator(small, {}, PlanOptions(), None, None)
    too_big = Candidate("disaggregate", 2, 4, 2, 4)  # 16 GPUs on one 8-GPU node
    assert "fabric.placement.num_nodes" in (ev._fabric_problem(too_big) or "")
    assert ev._fabric_problem(Candidate("disaggregate", 1, 4, 1, 4)) is None


# ------------------------------------------------------------------ prefix reuse


def test_prefill_time_with_a_hit_share_by_hand():
    cost = ConstantCost(prefill_base_s=0.01, prefill_per_token_s=1e-5)
    prompts = np.array([1000, 1000, 3000])
    # no reuse: 8 prompts of 1000 per 8192-token batch, 2 of 3000
    t0, k0 = prefill_s_per_request(cost, prompts, 8192)
    assert t0 == pytest.approx(((0.01 + 8000e-5) / 8 * 2 + (0.01 + 6000e-5) / 2) / 3)
    assert k0 == pytest.approx((8 + 8 + 2) / 3)
    # half the tokens cached: 500 and 1500 new tokens -> 16 and 5 prompts per batch
    t, k = prefill_s_per_request(cost, prompts, 8192, hit_share=0.5)
    assert t == pytest.approx(((0.01 + 8000e-5) / 16 * 2 + (0.01 + 7500e-5) / 5) / 3)
    assert k == pytest.approx((16 + 16 + 5) / 3)


def test_reuse_shrinks_prefill_work_and_moves_the_split():
    loaded = load_scenario(REPO / "scenarios" / "advisor" / "long-prompt-infiniband.yaml")
    lengths = sample_lengths(loaded)
    g0 = analytic_guess(loaded, prefill_tp=1, decode_tp=1, gpu_budget=16, lengths=lengths)
    prev = g0
    for share in (0.25, 0.5, 0.75):
        g = analytic_guess(
            loaded, prefill_tp=1, decode_tp=1, gpu_budget=16, lengths=lengths, hit_share=share
        )
        assert g.prefill_gpu_s_per_request < prev.prefill_gpu_s_per_request
        assert g.decode_gpu_s_per_request == pytest.approx(g0.decode_gpu_s_per_request)
        assert g.capacity_per_gpu_per_s > prev.capacity_per_gpu_per_s
        assert g.num_prefill_workers <= prev.num_prefill_workers
        assert g.prefill_gpu_s_no_reuse == pytest.approx(g0.prefill_gpu_s_per_request)
        prev = g
    assert prev.num_prefill_workers < g0.num_prefill_workers
    assert any("prefix reuse" in line for line in prev.arithmetic())
    with pytest.raises(Exception, match="prefix hit share"):
        analytic_guess(loaded, prefill_tp=1, decode_tp=1, gpu_budget=16, hit_share=1.0)


# the planner's prefix-reuse question (benchmarks/plan_reuse.py plans the same file), and
# the same workload without the prefix cache and cache-aware routing
CACHED = yaml.safe_load((REPO / "scenarios" / "prefix" / "chat-sessions.yaml").read_text())
SESSIONS = {k: v for k, v in CACHED.items() if k not in ("router", "cache")}


def test_expected_hit_share_follows_the_scenarios_cache_and_routing():
    from disaggsim.cache.estimate import expected_hit_share

    plain = load_scenario(SESSIONS)
    reqs = sample_requests(plain)
    assert reqs.prefix_chains is not None
    cost = worker_cost(plain, "h100-sxm", 1)
    hbm = cost.kv_capacity_tokens - 16384  # KV capacity less one prefill batch
    # no cache: section, least_tokens routing: each worker sees every n-th request
    share = expected_prefix_hit_share(plain, reqs, num_workers=2, layout=1)
    assert share == expected_hit_share(
        reqs, num_workers=2, capacity_tokens_per_worker=hbm, routing="round_robin"
    )
    # cache-aware routing and 64 GiB of DRAM per node, shared by the node's workers
    cached = load_scenario(CACHED)
    dram = (64 * 2**30) // cost.kv_bytes_per_token
    got = expected_prefix_hit_share(cached, reqs, num_workers=2, layout=1)
    assert got == expected_hit_share(
        reqs, num_workers=2, capacity_tokens_per_worker=hbm + dram // 2, routing="cache_aware"
    )
    assert 0.3 < share <= got <= expected_hit_share(reqs) + 1e-12
    # no prefix chains, no reuse
    other = load_scenario(REPO / "scenarios" / "advisor" / "short-prompt.yaml")
    assert expected_prefix_hit_share(other, sample_requests(other), num_workers=4, layout=1) == 0


def test_families_use_the_hit_share_only_where_the_engine_caches():
    """With a cache: section every family's guess and bound use the expected hit share
    of its prefilling pool and the candidates carry the cache through; where the engine
    cannot cache a colocated pool (swap preemption) colocated families assume no reuse
    and their candidates run without the cache."""
    opts = dataclasses.replace(PlanOptions(), max_tp=2)
    plain_ld, cached_ld = load_scenario(SESSIONS), load_scenario(CACHED)
    swap_ld = load_scenario({**CACHED, "kv": {"preemption": "swap"}})
    reqs = sample_requests(plain_ld)
    lengths = sample_lengths(plain_ld, reqs)
    assert not search_mod.cache_enabled(plain_ld) and search_mod.cache_enabled(cached_ld)
    plain, _ = plan_families(plain_ld, 4, opts, lengths, reqs)
    cached, guesses = plan_families(cached_ld, 4, opts, lengths, reqs)
    swap, _ = plan_families(swap_ld, 4, opts, lengths, reqs)
    assert [f.name for f in plain] == [f.name for f in cached] == [f.name for f in swap]
    for a, b, c in zip(plain, cached, swap, strict=True):
        assert b.bound_per_gpu > a.bound_per_gpu  # fewer prompt tokens to prefill
        if a.kind == "disaggregate":
            assert c.bound_per_gpu == b.bound_per_gpu
        else:
            assert c.bound_per_gpu == a.bound_per_gpu
    assert all(g.prefix_hit_share > 0.3 for g in guesses.values())
    colo = Candidate("colocate_chunked", 4, 1, chunk_tokens=512)
    s = load_scenario(candidate_scenario(cached_ld, colo)).scenario
    assert s.cache == cached_ld.scenario.cache and s.router.prefill_policy == "cache_aware"
    s = load_scenario(candidate_scenario(swap_ld, colo)).scenario
    assert s.cache is None and s.router.prefill_policy != "cache_aware"
    dis = load_scenario(candidate_scenario(swap_ld, Candidate("disaggregate", 2, 1, 2, 1)))
    assert dis.scenario.cache == cached_ld.scenario.cache  # passed through
    assert dis.scenario.router.prefill_policy == "cache_aware"


def test_the_advisor_mentions_reuse_when_it_matters():
    g = types.SimpleNamespace(
        prefix_hit_share=0.4, prefill_gpu_s_no_reuse=0.2, prefill_gpu_s_per_request=0.12,
        decode_gpu_s_per_request=0.1, pd_gpu_ratio=1.2,
    )  # fmt: skip
    kv = types.SimpleNamespace(admission="on_demand", preemption="recompute")
    ld = types.SimpleNamespace(scenario=types.SimpleNamespace(kv=kv))
    res = types.SimpleNamespace(reuse_share_unbounded=0.6, analytic=g, loaded=ld)
    c = _reuse(res)
    assert c is not None and c.holds and c.name == "prefix_reuse"
    assert "40%" in c.detail and "60%" in c.detail and "2.00 -> 1.20" in c.detail

    def with_share(x: float) -> types.SimpleNamespace:
        a = types.SimpleNamespace(**{**vars(g), "prefix_hit_share": x})
        return types.SimpleNamespace(reuse_share_unbounded=0.6, analytic=a, loaded=ld)

    small = _reuse(with_share(REUSE_MATTERS / 2))
    assert small is not None and not small.holds
    off = _reuse(with_share(0.0))
    assert off is not None and not off.holds and "does not cache them" in off.detail
    assert "ran without a prefix cache" not in c.detail
    swap = types.SimpleNamespace(scenario=types.SimpleNamespace(kv=types.SimpleNamespace(
        admission="on_demand", preemption="swap")))  # fmt: skip
    c = _reuse(types.SimpleNamespace(reuse_share_unbounded=0.6, analytic=g, loaded=swap))
    assert c is not None and "colocated candidates ran without a prefix cache" in c.detail
    assert _reuse(types.SimpleNamespace(reuse_share_unbounded=None, analytic=g)) is None


def test_typical_decode_batch_bisection_equals_the_scan():
    """The typical batch is the last batch whose step fits the ITL target: bisection
    (for wide MoE units) gives what scanning from 1 gives."""
    from disaggsim.plan.analytic import typical_decode_batch

    loaded = load_scenario(REPO / "scenarios" / "advisor" / "long-prompt-infiniband.yaml")
    for tp in (1, 2, 4):
        cost = worker_cost(loaded, "h100-sxm", tp)
        for ctx, itl, top in ((2000, 0.05, 256), (12000, 0.05, 256), (500, 0.02, 512)):
            cap = int(cost.kv_capacity_tokens // (ctx + 100))
            scan = 1
            for b in range(1, max(1, min(top, cap)) + 1):
                if cost.decode_time_s(b, int(b * ctx)) > itl:
                    break
                scan = b
            assert typical_decode_batch(cost, ctx, ctx + 100, top, itl) == scan


def test_headline_guess_is_the_best_pair_whose_decode_meets_the_itl():
    """The plan's printed first guess took the smallest fitting TP for both pools: for
    Llama-3.1-70B on 32 H100s at a 30 ms ITL its tp2 decode step at batch 1 already
    missed the target, so the guess read 0.01 req/s per GPU (the simulated best: about
    0.6). It is now the disaggregated family start with the highest analytic capacity."""
    q = Question(
        model="llama-3.1-70b", gpu="h100-sxm", gpus=32, isl="200", osl="2000", ttft_ms=1000,
        itl_ms=30,
    )  # fmt: skip
    loaded = load_scenario(build_question(q))
    lengths = sample_lengths(loaded)
    fams, guesses = plan_families(loaded, 32, PlanOptions.quick(), lengths)
    disagg = {c: g for c, g in guesses.items() if c.kind == "disaggregate"}
    smallest = min(disagg.values(), key=lambda g: (g.prefill_tp + g.decode_tp, g.decode_tp))
    assert (smallest.prefill_tp, smallest.decode_tp) == (2, 2)
    assert smallest.decode_batch == 1 and smallest.decode_step_s > 0.030  # the old headline
    pl, dl = headline_layouts(guesses, Layout(2))
    top = next(g for g in disagg.values() if (g.prefill_layout, g.decode_layout) == (pl, dl))
    assert top.capacity_per_gpu_per_s == max(g.capacity_per_gpu_per_s for g in disagg.values())
    assert top.decode_step_s <= 0.030 and top.decode_batch > 8
    assert top.capacity_per_gpu_per_s > 20 * smallest.capacity_per_gpu_per_s
    assert headline_layouts({}, Layout(4)) == (Layout(4), Layout(4))
