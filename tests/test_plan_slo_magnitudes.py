"""A plan finishes at any SLO (docs/planning.md, "Run lengths"): the planner's run lengths
come from the workload, and an SLO looser than anything the workload reaches binds
nothing; one tighter than a lone request's prefill or decode step gives ``none``.

Before: ``--ttft-ms 1e12 --itl-ms 1e12`` never finished. A colocated pool's loaded
residence took its steps at the ITL target (1e9 s), every run's warm-up and window
were raised to it, and the first run asked for MAX_REQUESTS (2,000,000) requests.

The plans here count what they simulate (every run's requests, through
``run.make_requests``) against a budget fixed before they ran, never wall time: the
same question at TTFT 2 s / ITL 50 ms simulates about 200 k requests in all, its largest
run 12 k (1 GPU: 84 k and 6 k; measured with this change)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from disaggsim import run
from disaggsim.config.loader import load_scenario
from disaggsim.plan import PlanOptions, plan
from disaggsim.plan.analytic import loaded_residence_s, sample_lengths
from disaggsim.plan.question import Question, build_question
from disaggsim.plan.search import analytic_guess
from disaggsim.sweep.executors import SerialExecutor

# every run of a plan below holds at most this many requests, and a plan all its runs at
# most TOTAL_REQUESTS: the code before asked 2,000,000 of its first run
RUN_REQUESTS = 50_000
TOTAL_REQUESTS = 1_000_000
# an 8B model's weights (16 GB in bf16) read once per step from at most 2 x 3.35 TB/s
# of H100 HBM: no prefill or decode step of these questions takes under 2 ms
LONE_STEP_FLOOR_MS = 2.0
# SLO targets from here up bind nothing on these questions (a request lives well under
# a second; an overloaded 20 s run queues for seconds, not 1,000)
LOOSE_MS = 1e6

magnitudes = st.integers(-6, 12).map(lambda e: float(10.0**e))


def _question(gpus: int, ttft_ms: float, itl_ms: float):
    q = Question(
        model="llama-3.1-8b", gpu="h100-sxm", gpus=gpus, isl="128", osl="16",
        ttft_ms=ttft_ms, itl_ms=itl_ms,
    )  # fmt: skip
    # a 20 s question window keeps the check as written's file runs small
    return load_scenario(build_question(q), ["sim.duration_s=20", "sim.warmup_s=2"])


@dataclasses.dataclass
class _Budget:
    runs: list[int] = dataclasses.field(default_factory=list)


@pytest.fixture
def budget(monkeypatch):
    """Counts every run's requests; a run past RUN_REQUESTS, or a plan past
    TOTAL_REQUESTS, fails at once (the code before would have run for hours)."""
    made = _Budget()
    original = run.make_requests

    def counted(loaded, replication: int = 0):
        reqs = original(loaded, replication)
        made.runs.append(len(reqs))
        assert len(reqs) <= RUN_REQUESTS, f"one run of {len(reqs)} requests"
        assert sum(made.runs) <= TOTAL_REQUESTS, f"{sum(made.runs)} requests simulated"
        return reqs

    monkeypatch.setattr(run, "make_requests", counted)
    return made


def _plan(loaded):
    return plan(loaded, options=PlanOptions.quick(), executor=SerialExecutor())


@pytest.fixture(scope="module")
def two_gpus():
    loaded = _question(2, 2000.0, 50.0)
    g = analytic_guess(
        loaded, prefill_tp=1, decode_tp=1, gpu_budget=2, lengths=sample_lengths(loaded)
    )
    return loaded, g


@settings(max_examples=40, deadline=None)
@given(ttft_ms=magnitudes, itl_ms=magnitudes, colocated=st.booleans())
def test_a_loaded_residence_is_the_workloads_at_any_slo(two_gpus, ttft_ms, itl_ms, colocated):
    """The loaded residence that every planner run lasts (docs/planning.md, "Run
    lengths") is at most what 17 steps of 0.5 s take: by the roofline an 8B model's
    whole 8,192-token prefill batch is 1.3e14 FLOP, 0.14 s at H100's 989 TFLOP/s, and a
    decode step of this short context is tens of ms (128 prompt + 16 output tokens: one
    prefill batch, 15 decode steps). It never grows with the SLO: at most the residence
    of a looser one, the same for every SLO that binds nothing."""
    loaded, g = two_gpus
    slo = loaded.scenario.slo.model_copy(update={"ttft_ms": ttft_ms, "itl_ms": itl_ms})
    loose = slo.model_copy(update={"ttft_ms": 1e12, "itl_ms": 1e12})
    got = loaded_residence_s(g, slo, colocated)
    assert 0 <= got <= loaded_residence_s(g, loose, colocated) <= 17 * 0.5
    if min(ttft_ms, itl_ms) >= LOOSE_MS:
        assert got == loaded_residence_s(g, loose, colocated)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ttft_ms=magnitudes, itl_ms=magnitudes)
@example(ttft_ms=1e12, itl_ms=1e12)
@example(ttft_ms=1e-6, itl_ms=1e-6)
@example(ttft_ms=1e-6, itl_ms=1e12)
@example(ttft_ms=1e12, itl_ms=1e-6)
def test_a_plan_finishes_within_a_budget_at_any_slo(budget, ttft_ms, itl_ms):
    """Each draw plans one GPU's question (SLO targets 1e-6..1e12 ms) within the budget
    of simulated requests; a target under a lone step (the roofline floor above) gives
    ``none``, a loose one a verdict."""
    budget.runs.clear()  # one budget per draw (the fixture is made once per test)
    res, advice = _plan(_question(1, ttft_ms, itl_ms))
    assert budget.runs and res.num_simulations > 0
    if min(ttft_ms, itl_ms) < LONE_STEP_FLOOR_MS:
        assert advice.verdict == "none"
    if min(ttft_ms, itl_ms) >= LOOSE_MS:
        assert advice.verdict not in ("none", "undecided")
        assert advice.recommended is not None and advice.recommended.goodput_per_s > 0


def test_an_slo_that_binds_nothing_plans_as_any_other_that_binds_nothing(budget):
    """On 2 GPUs (disaggregated and colocated candidates), TTFT and ITL targets of 1e6
    and of 1e12 ms both bind nothing: the same runs, the same ranking, the same verdict
    (the plan is the workload's alone), each within the budget."""
    loose, looser = _plan(_question(2, LOOSE_MS, LOOSE_MS)), None
    runs = list(budget.runs)
    budget.runs.clear()
    looser = _plan(_question(2, 1e12, 1e12))
    assert budget.runs == runs
    (a, advice_a), (b, advice_b) = loose, looser
    assert advice_a.verdict == advice_b.verdict != "none"
    assert [(r.candidate, r.goodput_per_s) for r in a.ranked] == [
        (r.candidate, r.goodput_per_s) for r in b.ranked
    ]
