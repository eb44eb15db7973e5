"""Chunk sizes that cannot bind are not simulated (disaggsim/plan/search.py
``chunk_never_bound``, ``_Evaluator._same_runs``; docs/planning.md §2): where no chunked
step of the runs that decided a chunk's goodput (at and below the lowest rate that
missed above it) filled its token budget, a larger chunk with the same KV capacity runs
those rates step for step alike, so its goodput search is the smaller chunk's. The
summaries are set by hand (the count the engine reports,
``Summary.num_chunk_budget_full_steps``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.plan.search import Candidate, PlanOptions, _Evaluator, chunk_never_bound
from disaggsim.sweep.goodput import Evaluation, GoodputResult
from tests.test_plan_confirm import FLEET


def _ev(rate: float, meets: bool, full: int | None, confirm: bool = False) -> Evaluation:
    s = None if full is None else SimpleNamespace(num_chunk_budget_full_steps=full)
    return Evaluation(rate, 1.0 if meets else 0.5, True, meets, 100.0, confirm, summary=s)


def _result(evals, confirmation=None, status="found", rate=10.0) -> GoodputResult:
    return GoodputResult("s", 4, rate, rate / 4, status, 0.9, 0.1, tuple(evals), confirmation)


# a bisection: met at 8, missed at 12, met at 10 (the goodput), missed at 11; confirmed at 10
EVALS = [(8.0, True), (12.0, False), (10.0, True), (11.0, False)]


def _bisection(full_at: dict[float, int], confirm_full: int = 0) -> GoodputResult:
    evals = [_ev(r, m, full_at.get(r, 0)) for r, m in EVALS]
    return _result(evals, _ev(10.0, True, confirm_full, confirm=True))


def test_a_chunk_that_never_filled_cannot_bind():
    assert chunk_never_bound(_bisection({}))
    # a run above the lowest miss (12 > 11) may fill: it decided nothing
    assert chunk_never_bound(_bisection({12.0: 40}))


def test_a_filled_step_in_a_deciding_run_binds():
    assert not chunk_never_bound(_bisection({11.0: 1}))  # the miss above the goodput
    assert not chunk_never_bound(_bisection({8.0: 3}))  # a met run below it
    assert not chunk_never_bound(_bisection({}, confirm_full=2))  # its confirmation


def test_no_count_no_miss_above_or_no_goodput_is_not_evidence():
    evals = [_ev(r, m, 0) for r, m in EVALS]
    evals[2] = _ev(10.0, True, None)  # a summary without the engine's count
    assert not chunk_never_bound(_result(evals))
    met_only = [_ev(8.0, True, 0), _ev(10.0, True, 0)]
    assert not chunk_never_bound(_result(met_only))  # unbounded: nothing missed above
    assert not chunk_never_bound(_result([_ev(8.0, False, 0)], status="unattainable", rate=0.0))


def _chunked(chunk: int, seqs: int | None = None) -> Candidate:
    return Candidate("colocate_chunked", 4, 1, chunk_tokens=chunk, max_batch_seqs=seqs)


def _evaluator() -> _Evaluator:
    return _Evaluator(load_scenario(FLEET), {}, PlanOptions.quick(), None, None, "explore")


def test_a_larger_chunk_of_the_same_pool_and_kv_reuses_the_search():
    ev = _evaluator()
    small, large = _chunked(512), _chunked(1024)
    assert ev.kv_capacity_tokens(small) == ev.kv_capacity_tokens(large)
    ev.results[small] = _bisection({})
    assert ev._same_runs(large) == (small, ev.results[small])
    assert ev._same_runs(small) is None  # never a smaller chunk from a larger one
    # another pool (its batch cap) or a smaller chunk that filled a step: run it
    assert ev._same_runs(_chunked(1024, seqs=512)) is None
    ev.results[small] = _bisection({10.0: 1})
    assert ev._same_runs(large) is None


def test_a_chunk_that_shrinks_the_kv_capacity_is_run():
    """The chunk sizes the engine's activation reserve (max_batch_tokens): at 8192
    tokens the forward pass outgrows the sampler's logits and the KV pool shrinks."""
    ev = _evaluator()
    small, large = _chunked(512), _chunked(65536)
    assert ev.kv_capacity_tokens(large) < ev.kv_capacity_tokens(small)
    ev.results[small] = _bisection({})
    assert ev._same_runs(large) is None


def _fake_runs(monkeypatch, full_steps: int) -> list:
    """Every deployment meets up to a fixed rate per GPU whatever its chunk (chunked 8,
    disaggregated 5, vllm 3); chunked runs report ``full_steps`` budget-filled steps."""
    import sys

    from tests.plan_fakes import summary

    caps = {"disaggregated": 5.0, "colocated-chunked": 8.0, "colocated-vllm": 3.0}
    runs: list = []

    def fake_run(task):
        sc = load_scenario(task.raw).scenario
        runs.append(sc)
        arch = sc.architecture + (f"-{sc.pool.scheduler}" if sc.pool is not None else "")
        ok = sc.workload.rate_per_s / sc.num_gpus <= caps[arch]
        extra = {}
        if arch == "colocated-chunked":
            extra = {"num_chunked_steps": 100, "num_chunk_budget_full_steps": full_steps}
        return summary(slo_attainment=1.0 if ok else 0.5, stability_p_value=1.0, **extra)

    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    return runs


def test_a_plan_whose_chunks_never_fill_runs_no_larger_chunk(monkeypatch):
    """The same stubbed question twice: where every chunked step left its budget
    unfilled, the walk's larger chunks take the scenario's chunk's search (no run of a
    chunk above it, a note names them) and the answer is the one where every chunk is
    run (a step filled: no chunk skipped)."""
    from disaggsim.plan import plan
    from disaggsim.sweep import SerialExecutor
    from tests.test_plan_confirm import OPTS

    opts = dataclasses.replace(OPTS, check_as_written=False)
    own = 512  # the scenario's chunk, where quick mode's walk starts
    fleet = {**FLEET, "pool": {**FLEET["pool"], "max_batch_tokens": own}}
    runs = _fake_runs(monkeypatch, full_steps=1)
    res_all, adv_all = plan(fleet, options=opts, executor=SerialExecutor())
    chunks_all = {
        sc.pool.max_batch_tokens
        for sc in runs
        if sc.pool is not None and sc.pool.scheduler == "chunked"
    }
    runs = _fake_runs(monkeypatch, full_steps=0)
    res, adv = plan(fleet, options=opts, executor=SerialExecutor())
    chunks = {
        sc.pool.max_batch_tokens
        for sc in runs
        if sc.pool is not None and sc.pool.scheduler == "chunked"
    }
    assert max(chunks_all) > own and max(chunks) == own
    assert res.num_simulations < res_all.num_simulations
    assert adv.verdict == adv_all.verdict == "colocate_chunked"
    assert adv.recommended.goodput_per_gpu_per_s == pytest.approx(
        adv_all.recommended.goodput_per_gpu_per_s, rel=0.05
    )
    note = next(n for n in res.notes if "not simulated" in n)
    assert "chunked 4 x tp1 chunk 1024 as chunk 256" in note  # the final stage's donor


def test_no_chunk_under_the_batch_cap_is_run(monkeypatch):
    """vLLM refuses max_num_batched_tokens < max_num_seqs: with the scenario's cap at 512
    sequences, quick mode's walk down the ladder from chunk 512 (256, 384, 448) and the
    cap raises (seqs 1024 at chunk 512) build pools no engine launches. None is run; each
    counts as serving nothing, as a deployment the fabric cannot place does."""
    from disaggsim.plan import plan
    from disaggsim.sweep import SerialExecutor
    from tests.test_plan_confirm import OPTS

    fleet = {**FLEET, "pool": {**FLEET["pool"], "max_batch_tokens": 512, "max_batch_seqs": 512}}
    runs = _fake_runs(monkeypatch, full_steps=1)
    res, adv = plan(fleet, options=dataclasses.replace(OPTS, check_as_written=False),
                    executor=SerialExecutor())  # fmt: skip
    pools = [p for sc in runs for p in (sc.pool, sc.prefill_pool, sc.decode_pool) if p is not None]
    assert pools and all(p.max_batch_tokens >= p.max_batch_seqs for p in pools)
    assert all(
        r.candidate.chunk_tokens is None or r.candidate.chunk_tokens >= 512 for r in res.ranked
    )
    assert adv.verdict == "colocate_chunked"
