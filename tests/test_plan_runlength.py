"""What the planner's goodput runs may be trusted with (docs/planning.md, "Run lengths"):
each run at least a loaded residence long, so a short screening run does not pass a rate
above capacity; quick screening that a lone trend-test false alarm does not send down;
pruning never counts a measurement above its own family's ceiling."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.metrics.steady import RunLengthRule, horizon
from disaggsim.plan.analytic import loaded_residence_s, sample_lengths, sample_requests
from disaggsim.plan.optimise import Family, optimise
from disaggsim.plan.question import Question, build_question
from disaggsim.sweep.executors import SerialExecutor
from disaggsim.sweep.goodput import steady_profile

search = importlib.import_module("disaggsim.plan.search")


# ------------------------------------------------------------------ pruning


def test_a_measurement_above_its_familys_ceiling_prunes_no_family_that_could_win():
    """Quick mode at 64 H100 (long-prompt advisor question) pruned every other
    disaggregated family on one exploration run measured at 2.469 req/s per GPU, 1.11 x
    its own family's bound (2.227); full mode confirmed that family at 2.116 and another
    pruned one at 2.115. A family's members cannot truly reach past its bound x the slack
    (the premise of pruning), so a value above that counts at that ceiling: a family
    whose bound x slack reaches it stays open."""
    values = {"a": 2.6, "b": 2.15, "b+": 2.18}

    def fams() -> list[Family[str]]:
        return [
            Family("A", "x", 2.0, ("a",), lambda c: []),
            Family("B", "x", 2.0, ("b",), lambda c: [["b+"]] if c == "b" else []),
        ]

    got = optimise(fams(), lambda cs: [values[c] for c in cs], bound_slack=1.1)
    assert got.states["B"] != "pruned"
    assert "b+" in got.values  # B climbed on
    # the ceiling is the bound itself for a true (MoE) bound
    capped = [dataclasses.replace(f, true_bound=True) for f in fams()]
    got = optimise(capped, lambda cs: [values[c] for c in cs], bound_slack=1.1)
    assert got.states["B"] != "pruned"


# ------------------------------------------------------------------ run lengths


@pytest.fixture(scope="module")
def moe_question():
    q = Question(
        model="qwen3-30b-a3b", gpu="h100-sxm", gpus=8, isl="2000", osl="200", ttft_ms=2000,
        itl_ms=50.0,
    )  # fmt: skip
    return load_scenario(build_question(q))


def _evaluator(loaded, options, stage="explore"):
    reqs = sample_requests(loaded)
    lengths = sample_lengths(loaded, reqs)
    budget = loaded.scenario.num_gpus
    _, guesses = search.plan_families(loaded, budget, options, lengths, reqs)
    return search._Evaluator(loaded, guesses, options, SerialExecutor(), None, stage)


def test_loaded_residence_by_hand(moe_question):
    slo = moe_question.scenario.slo
    g = search.analytic_guess(
        moe_question, prefill_tp=1, decode_tp=1, gpu_budget=8,
        lengths=sample_lengths(moe_question),
    )  # fmt: skip
    prefill = g.prefill_s_per_request * max(g.prefill_batch_prompts_mean, 1.0)
    steps = g.output_tokens_mean - 1
    assert loaded_residence_s(g, slo) == pytest.approx(prefill + steps * g.decode_step_s)
    # a colocated pool's steps carry prefill work: at capacity they stretch to the target
    assert loaded_residence_s(g, slo, colocated=True) == pytest.approx(prefill + steps * slo.itl_s)
    # never more than a request meeting the SLO may take
    tight = slo.model_copy(update={"ttft_ms": 0.0})
    assert loaded_residence_s(g, tight, colocated=True) <= steps * slo.itl_s + 1e-12


def test_every_run_lasts_a_loaded_residence(moe_question):
    """The quick exploration rule (warm-up 1, window 2 service times: 1.4 and 2.8 s on
    this vllm pool, whose requests stay about 8 s under load) is raised to the residence,
    per family; a rule already that long is left alone."""
    opts = search.PlanOptions.quick()
    ev = _evaluator(moe_question, opts)
    c = search.Candidate("colocate_vllm", 4, 1, prefill_dp=2)
    src = ev.source(c)
    service_s = steady_profile(load_scenario(src.raw, base_dir=src.base_dir)).service_s
    residence_s = loaded_residence_s(ev._guess(c), moe_question.scenario.slo, colocated=True)
    assert residence_s > 3 * service_s  # the case: the old rule was far shorter
    rule = ev.rule_for(c, opts.explore_rule)
    h = horizon(rule, 50.0, service_s, 10.0)
    assert h.warmup_s >= residence_s and h.measure_s >= residence_s
    assert h.warmup_s <= 2**0.25 * residence_s + 1e-9  # rounded up by at most 2^(1/4)
    long = RunLengthRule(service_multiple=100.0, warmup_service_multiple=100.0)
    assert ev.rule_for(c, long) is long


def test_quick_screening_of_a_moe_vllm_pool_is_not_optimistic(moe_question):
    """Screened with the old quick rule this pool passed 229 req/s (28.6 per GPU, 1.23 x
    its true bound) and confirmed at 6.89 per GPU; every screening run now covers a
    loaded residence, and the screened goodput stays within 25 % of a full-rule search
    confirmed at twice the horizon."""
    c = search.Candidate("colocate_vllm", 4, 1, prefill_dp=2)
    explored = _evaluator(moe_question, search.PlanOptions.quick())([c])[0]
    full = _evaluator(moe_question, search.PlanOptions(), stage="final")
    confirmed = full([c])[0]
    assert full.results[c].confirmed
    assert 0 < explored <= 1.25 * confirmed, (explored, confirmed)


def test_quick_screening_of_a_lightly_loaded_pool_is_not_pessimistic():
    """With 200-request runs the trend test at the default alpha (0.01) called a chunked
    pool at a quarter of its capacity unstable (pcie-only advisor, 8 x tp1 chunk 512 at
    1.55 req/s: attainment 1.000, p = 0.004), and a miss at the bottom of the first
    bracket sends it down fourfold: screened at 0.167 per GPU, full mode confirms 0.813.
    The goodput search now retests a run that misses on the trend test alone
    (tests/test_sweep_retest.py); quick mode's workaround, a trend test at alpha 0.001,
    is gone."""
    from tests.conftest import REPO

    loaded = load_scenario(REPO / "scenarios" / "advisor" / "pcie-only.yaml")
    c = search.Candidate("colocate_chunked", 8, 1, chunk_tokens=512)
    explored = _evaluator(loaded, search.PlanOptions.quick())([c])[0]
    assert explored >= 0.7, explored


# ------------------------------------------------------------------ quick confirmation


def test_quick_mode_confirms_an_explored_goodput_without_searching_it_again():
    """Quick mode's final rule lasts about as long as its exploration once both cover a
    loaded residence (64 H100, long prompts: 23 and 26 s of arrivals), so a finalist's
    explored bracket (last rate met, lowest missed above it) is confirmed at once at
    twice the final horizon; full mode searches it again with its longer rule."""
    from disaggsim.sweep.goodput import Evaluation, GoodputResult

    c = search.Candidate("colocate_chunked", 8, 1, chunk_tokens=512)
    evals = tuple(
        Evaluation(rate, 1.0 if ok else 0.5, ok, ok, 10.0)
        for rate, ok in ((2.0, True), (12.0, False), (7.0, False), (4.5, True), (5.75, True))
    )
    seen = GoodputResult("x", 8, 5.75, 5.75 / 8, "found", 0.9, 0.3, evals)

    def bisected(options):
        ev = search._Evaluator.__new__(search._Evaluator)
        ev.options, ev.stage, ev.explored = options, "final", {c: seen}
        return ev._bisected(c)

    assert bisected(search.PlanOptions.quick()) == (5.75, 7.0)
    assert bisected(search.PlanOptions()) is None
