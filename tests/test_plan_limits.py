"""The planner's analytic prescreen prices each worker with its candidate pool's limits
(disaggsim/plan/search.py ``pool_limits``, docs/planning.md §1): the engine's memory
reserve grows with ``max_batch_tokens`` and ``max_batch_seqs`` and KV gets what
``gpu_mem_util`` leaves (disaggsim/costmodel/reserve.py), so a prescreen built with the
default limits held another KV capacity than the simulation of the same candidate: on
the long-prompt question at ``gpu_mem_util: 0.5`` its decode batch was 37 where the
candidate's KV holds 15 such requests. The expected capacities are the simulator's own
(``run.build_costs`` of the candidate's scenario)."""

from __future__ import annotations

from pathlib import Path

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.plan.analytic import Layout, sample_lengths, typical_decode_batch, worker_cost
from disaggsim.plan.search import (
    Candidate,
    PlanOptions,
    candidate_scenario,
    plan_families,
    pool_limits,
)
from disaggsim.run import build_costs

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "scenarios" / "advisor" / "long-prompt-infiniband.yaml"

NON_DEFAULT = (
    ["pool.max_batch_seqs=1024", "pool.max_batch_tokens=2048", "pool.gpu_mem_util=0.85"],
    # a budget that holds the raised decode cap below (vLLM refuses fewer batch tokens
    # than sequences, in a decode pool too: such a pool is refused when loaded)
    ["pool.max_batch_seqs=64", "pool.max_batch_tokens=2048", "pool.activation_reserve_gib=3"],
)

# (candidate, its workers: (role for pool_limits, role in the simulation, layout))
CANDIDATES = (
    (
        Candidate("disaggregate", 2, 1, 1, 2),
        (("prefill", "prefill", Layout(1)), ("decode", "decode", Layout(2))),
    ),
    (  # a raised decode batch cap (raise_caps)
        Candidate("disaggregate", 2, 1, 1, 2, max_batch_seqs=2048),
        (("decode", "decode", Layout(2)),),
    ),
    (
        Candidate("colocate_chunked", 4, 2, chunk_tokens=4096),
        (("colocate_chunked", "colocated", Layout(2)),),
    ),
    (Candidate("colocate_vllm", 4, 1), (("colocate_vllm", "colocated", Layout(1)),)),
)


@pytest.mark.parametrize("sets", NON_DEFAULT)
@pytest.mark.parametrize(("cand", "workers"), CANDIDATES, ids=lambda x: getattr(x, "label", ""))
def test_the_prescreens_kv_capacity_is_the_simulators(sets, cand, workers):
    loaded = load_scenario(LONG, sets)
    sim = build_costs(load_scenario(candidate_scenario(loaded, cand)).scenario)
    for role, sim_role, lay in workers:
        lim = pool_limits(loaded, lay, role, chunk=cand.chunk_tokens, seqs=cand.max_batch_seqs)
        cost = worker_cost(loaded, "h100-sxm", lay, limits=lim)
        assert cost.kv_capacity_tokens == sim[sim_role].kv_capacity_tokens, (role, lim)
    # the default-limits worker the prescreen used to build holds another capacity
    role, sim_role, lay = workers[-1]
    default = worker_cost(loaded, "h100-sxm", lay).kv_capacity_tokens
    assert default != sim[sim_role].kv_capacity_tokens


def test_the_guess_sizes_decode_batches_by_the_candidates_kv():
    """Each disaggregated family's analytic guess (plan_families) takes its typical
    decode batch from the KV of the candidate's decode pool, as simulated."""
    loaded = load_scenario(
        LONG, ["pool.max_batch_seqs=1024", "pool.max_batch_tokens=1024", "pool.gpu_mem_util=0.5"]
    )
    _, guesses = plan_families(loaded, 16, PlanOptions.quick(), sample_lengths(loaded))
    checked = 0
    for c, g in guesses.items():
        if c.kind != "disaggregate":
            continue
        kv = build_costs(load_scenario(candidate_scenario(loaded, c)).scenario)["decode"]
        resident = g.prompt_tokens_mean + g.output_tokens_mean
        at_sim = typical_decode_batch(
            kv, g.decode_context_tokens_mean, resident, 1024, loaded.scenario.slo.itl_s
        )
        assert g.decode_batch == at_sim, c.label
        # the KV binds here: fewer requests than the cap of 1024 fit
        assert g.decode_batch <= kv.kv_capacity_tokens // resident < 1024
        checked += 1
    assert checked >= 4


def test_an_moe_workers_limits_scale_with_its_data_parallel_ranks():
    """A tp1 x dp2 MoE worker: the pool's limits per rank times its ranks, as the
    candidate's scenario writes them (a whole-prompt prefill budget of at least the
    longest prompt per rank)."""
    moe = ROOT / "scenarios" / "moe" / "qwen3-235b-colocated.yaml"
    loaded = load_scenario(moe, ["model=qwen3-30b-a3b", "pool.tp=1", "pool.max_batch_seqs=512"])
    lay = Layout(1, 2)
    cands = (
        (Candidate("disaggregate", 1, 1, 1, 1, prefill_dp=2, decode_dp=2), "prefill", "prefill"),
        (Candidate("disaggregate", 1, 1, 1, 1, prefill_dp=2, decode_dp=2), "decode", "decode"),
        (Candidate("colocate_chunked", 1, 1, chunk_tokens=1024, prefill_dp=2), "colocate_chunked",
         "colocated"),
    )  # fmt: skip
    for cand, role, sim_role in cands:
        sim = build_costs(load_scenario(candidate_scenario(loaded, cand)).scenario)
        lim = pool_limits(loaded, lay, role, chunk=cand.chunk_tokens)
        # the scenario's pool is dp 2: 512 over the worker, 256 a rank; a tp1 x dp2 worker 512
        assert lim.max_batch_seqs == 512
        got = worker_cost(loaded, "h100-sxm", lay, limits=lim).kv_capacity_tokens
        assert got == sim[sim_role].kv_capacity_tokens, role
        assert worker_cost(loaded, "h100-sxm", lay).kv_capacity_tokens != got
