"""The chunked scheduler's count of iterations the token budget bound
(``num_chunked_steps``, ``num_chunk_budget_full_steps``), against hand counts on tiny
deterministic runs with the constant-cost test double.

Costs: a mixed iteration is one decode step (0.01 s) when any sequence decodes, else the
prefill base (0.1 s); no per-token prefill cost."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.metrics.summary_table import Summary
from disaggsim.run import simulate
from disaggsim.workload.requests import Requests
from tests.conftest import REPO

COST = ConstantCost(prefill_base_s=0.1, decode_base_s=0.01)


def _five() -> Requests:
    """test_engine_exact's requests: (arrival s, prompt, output tokens)."""
    return Requests(
        arrival_s=np.array([0.0, 0.0, 0.05, 1.0, 1.0]),
        prompt_tokens=np.array([100, 200, 300, 400, 10]),
        output_tokens=np.array([3, 5, 1, 4, 2]),
    )


def _counts(requests: Requests, budget: int, seqs: int = 8) -> tuple[int, int]:
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, COST, seqs, budget, "chunked"),))
    c = run_cluster(requests, cfg).counters
    return c["num_chunked_steps"], c["num_chunk_budget_full_steps"]


def test_prompts_that_fit_the_budget_count_no_full_step():
    # budget 10,000: every prompt (at most 400 tokens) prefills whole in one iteration.
    # it1 r0 + r1 (300 tokens); it2 r2 (300, arrived mid-it1, r0 r1 decoding);
    # at 1.0 it3 r3 + r4 (410). Three chunked iterations, none at the budget.
    assert _counts(_five(), 10_000) == (3, 0)


def test_long_prompts_fill_the_budget():
    # budget 250 (test_engine_exact.test_chunked_token_budget's timeline):
    # it1 batch 0, budget 250: r0 100 + r1 150 = 250, r1 has 50 left       -> full
    # it2 batch 1 (r0), budget 249: r1 50 + r2 199 = 249, r2 has 101 left  -> full
    # it3 batch 2, budget 248: r2's last 101 < 248, nothing left           -> not full
    # at 1.0, batch 0: it4 r3 250 of 400 = 250, 150 left                   -> full
    # it5 r3's last 150 + r4 10 = 160 < 250                                 -> not full
    assert _counts(_five(), 250) == (5, 3)


def test_reaching_the_budget_with_nothing_left_is_not_full():
    # budget 300: it1 r0 100 + r1 200 = 300 exactly, both done: no prompt token left.
    # it2 r2 300 of budget 298 (r0 r1 decode): 2 left -> full; it3 r2's last 2 -> not.
    # at 1.0: it4 r3 300 of 400 -> full; it5 r3 100 + r4 10 -> not.
    assert _counts(_five(), 300) == (5, 2)


def test_decode_steps_while_the_batch_alone_fills_the_budget():
    # budget 2 tokens, r0 r1 (prompt 1, 5 tokens) at 0, r2 (prompt 4, 2 tokens) at 1 ms.
    # it1 [0, 0.1): r0 1 + r1 1 = 2, both done (r2 not yet arrived)      -> not full
    # at 0.1 r0 r1 decode (batch 2 = the budget): r2 admitted, no room for a chunk;
    #   4 decode-only steps to 0.14 while r2 waits                        -> 4 full
    # it [0.14, 0.24): r2 2 of 4                                           -> full
    # it [0.24, 0.34): r2's last 2                                         -> not full
    reqs = Requests(
        arrival_s=np.array([0.0, 0.0, 0.001]),
        prompt_tokens=np.array([1, 1, 4]),
        output_tokens=np.array([5, 5, 2]),
    )
    cfg = EngineConfig(pools=(PoolSpec("colocated", 1, COST, 8, 2, "chunked"),))
    raw = run_cluster(reqs, cfg)
    np.testing.assert_allclose(raw.log.finish_at_s[:2], [0.14, 0.14])
    np.testing.assert_allclose(raw.log.prefill_end_at_s[2], 0.34)
    assert (raw.counters["num_chunked_steps"], raw.counters["num_chunk_budget_full_steps"]) == (
        7,
        5,
    )


def test_vllm_and_disaggregated_runs_have_no_chunk_counts():
    vllm = EngineConfig(pools=(PoolSpec("colocated", 1, COST, 8, 10_000, "vllm"),))
    assert "num_chunked_steps" not in run_cluster(_five(), vllm).counters
    disagg = EngineConfig(
        pools=(PoolSpec("prefill", 1, COST, 8, 10_000), PoolSpec("decode", 1, COST, 8, 10_000))
    )
    assert "num_chunk_budget_full_steps" not in run_cluster(_five(), disagg).counters


@pytest.mark.parametrize(
    ("budget", "bound"),
    [(512, True), (16384, False)],
)
def test_summary_reports_the_counts(budget: int, bound: bool):
    # ci/chunked: prompts around 2k tokens (at most 8192), 128 seats: a 512-token budget
    # chunks them, a 16,384-token one never fills (128 decode tokens + one 8192 prompt)
    s: Summary = simulate(
        REPO / "scenarios" / "ci" / "chunked.yaml",
        [f"pool.max_batch_tokens={budget}", "sim.duration_s=30", "sim.warmup_s=5"],
    ).summary
    assert s["num_chunked_steps"] > 0
    assert (s["num_chunk_budget_full_steps"] > 0) is bound
    assert s["num_chunk_budget_full_steps"] <= s["num_chunked_steps"]


def test_summary_leaves_the_counts_out_of_other_runs():
    s = simulate(
        REPO / "scenarios" / "ci" / "chunked.yaml",
        ["pool.scheduler=vllm", "pool.max_batch_tokens=8192", "sim.duration_s=20"],
    ).summary
    assert s.num_chunked_steps is None
    assert "num_chunk_budget_full_steps" not in s.to_dict()


@pytest.mark.parametrize("seed", range(6))
def test_no_full_step_means_a_larger_budget_runs_the_same(seed: int):
    """The count's meaning, as a property: a run that filled its budget in no iteration
    runs every iteration the same under a budget four times larger (the constant-cost
    double's KV does not depend on the budget, as a real worker's activation reserve
    does); a run that filled it does not, on these loads."""
    rng = np.random.default_rng(seed)
    n = 60
    reqs = Requests(
        arrival_s=np.sort(rng.uniform(0.0, 3.0, n)),
        prompt_tokens=rng.integers(1, 400, n),
        output_tokens=rng.integers(1, 40, n),
    )
    cost = ConstantCost(prefill_base_s=0.02, prefill_per_token_s=1e-4, decode_base_s=0.01)

    def run(budget: int):
        cfg = EngineConfig(pools=(PoolSpec("colocated", 1, cost, 16, budget, "chunked"),))
        return run_cluster(reqs, cfg)

    zero = 0
    # 16 seats x the longest prompt (399) + 16 decode tokens: never full by construction;
    # the smaller budgets fill or not as the load has it
    for budget in (450, 1000, 2000, 16 * 399 + 16):
        a = run(budget)
        if a.counters["num_chunk_budget_full_steps"] == 0:
            zero += 1
            b = run(4 * budget)
            np.testing.assert_array_equal(a.log.finish_at_s, b.log.finish_at_s)
            np.testing.assert_array_equal(a.log.first_token_at_s, b.log.first_token_at_s)
            assert a.counters["num_chunked_steps"] == b.counters["num_chunked_steps"]
    assert zero >= 1
    small, larger = run(64), run(256)
    assert small.counters["num_chunk_budget_full_steps"] > 0
    assert not np.array_equal(small.log.finish_at_s, larger.log.finish_at_s)
