"""``disaggsim plan``: size the pools for a GPU budget and say whether to disaggregate.

Python API::

    from disaggsim.plan import plan, PlanOptions
    res, advice = plan("scenarios/advisor/long-prompt-infiniband.yaml", options=PlanOptions.quick())
    advice.verdict, advice.reason, res.ranked[0].goodput_per_gpu_per_s

Parts: :mod:`~disaggsim.plan.analytic` (first guess from token histograms),
:mod:`~disaggsim.plan.search` (candidates and goodput by simulation; the search alone
is :func:`disaggsim.plan.search.search`: the package does not re-export it, whose name
would hide the submodule, so that ``import disaggsim.plan.search as S`` gives the module),
:mod:`~disaggsim.plan.advisor` (verdict and reasons), :mod:`~disaggsim.plan.confirm`
(a quick plan's close call measured again at full accuracy), :mod:`~disaggsim.plan.report`
(JSON, table, plot, recommended YAML). Definitions: docs/planning.md.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.errors import UserError
from disaggsim.plan.advisor import Advice, advise
from disaggsim.plan.analytic import AnalyticGuess, analytic_guess
from disaggsim.plan.confirm import confirm_close_call
from disaggsim.plan.holds import check_as_written
from disaggsim.plan.search import Candidate, CandidateResult, PlanOptions, SearchResult
from disaggsim.plan.search import search as _search
from disaggsim.sweep.executors import Executor

__all__ = [
    "Advice",
    "AnalyticGuess",
    "Candidate",
    "CandidateResult",
    "PlanOptions",
    "SearchResult",
    "advise",
    "analytic_guess",
    "plan",
]


def plan(
    scenario: LoadedScenario | str | Path | dict,
    *,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    target_rate_per_s: float | None = None,
    price_per_gpu_hour: float | None = None,
    options: PlanOptions | None = None,
    executor: Executor | None = None,
    progress=None,
) -> tuple[SearchResult, Advice]:
    """Search the candidates for the scenario's budget (or ``gpus``), in quick mode settle
    a close call at full accuracy (:func:`~disaggsim.plan.confirm.confirm_close_call`),
    check the ones the advisor compares as their recommended.yaml would run them
    (:func:`~disaggsim.plan.holds.check_as_written`, unless ``options`` turn it off), and
    advise."""
    if isinstance(scenario, LoadedScenario):
        loaded = (
            load_scenario(scenario.raw, overrides, base_dir=scenario.base_dir)
            if overrides
            else scenario
        )
    else:
        loaded = load_scenario(scenario, overrides)
    res = _search(
        loaded,
        gpus=gpus,
        target_rate_per_s=target_rate_per_s,
        price_per_gpu_hour=price_per_gpu_hour,
        options=options,
        executor=executor,
        progress=progress,
    )
    # a quick plan's close call measured again at full accuracy (none to settle: res)
    res = confirm_close_call(res, executor=executor, progress=progress)
    if target_rate_per_s is not None and gpus is None:
        res = fit_target_rate(res, executor=executor, progress=progress)
    if res.options.check_as_written:  # the goodputs compared hold as recommended.yaml runs
        res = check_as_written(res, executor=executor, progress=progress)
    return res, advise(res)


def fewer_gpus_for_rate(res: SearchResult) -> tuple[int, CandidateResult] | None:
    """The fewest GPUs that serve ``res.target_rate_per_s`` with a colocated candidate's
    workers at the goodput per worker it was measured at (explored rows too: the plan
    measures the smaller fleet again), and that candidate, when fewer than the budget;
    else None. A target-rate budget is sized with at least one worker per pool (the
    analytic fleet of two pools), so a rate one colocated worker serves was planned on
    two: there a disaggregated pair could win per GPU while one GPU serves the rate."""
    rate = res.target_rate_per_s
    if rate is None:
        return None
    fits = [
        (math.ceil(rate * r.candidate.num_prefill_workers / r.goodput_per_s)
         * r.candidate.prefill_layout.gpus, n, r)
        for n, r in enumerate(res.ranked)
        if r.candidate.kind != "disaggregate" and r.goodput_per_s > 0
    ]  # fmt: skip
    if not fits:
        return None
    gpus, _, row = min(fits, key=lambda t: t[:2])
    return (gpus, row) if gpus < res.gpu_budget else None


def fit_target_rate(
    res: SearchResult, *, executor: Executor | None = None, progress=None
) -> SearchResult:
    """A target-rate plan searched again at the fewer GPUs that serve the rate
    (:func:`fewer_gpus_for_rate`), when its best deployment there serves the rate; else
    ``res``. The verdict is then for the fleet the rate needs: at one worker
    disaggregation cannot exist."""
    fewer = fewer_gpus_for_rate(res)
    rate = res.target_rate_per_s
    if fewer is None or rate is None:
        return res
    gpus, row = fewer
    try:
        smaller = _search(
            res.loaded,
            gpus=gpus,
            price_per_gpu_hour=res.price_per_gpu_hour,
            options=res.options,
            executor=executor,
            progress=progress,
            simulations_before=res.num_simulations,
        )
    except UserError:  # the smaller budget refused (a bound): the fleet first sized stands
        return res
    smaller = confirm_close_call(smaller, executor=executor, progress=progress)
    if not smaller.ranked or smaller.ranked[0].goodput_per_s < rate:
        return res
    c = row.candidate
    note = (
        f"sized for {rate:g} req/s: the {res.gpu_budget} GPUs first sized (one worker per "
        f"pool at least) were searched, where {c.label} served "
        f"{row.goodput_per_s / c.num_prefill_workers:.3g} req/s per worker; the plan is "
        f"for the {gpus} GPU{'s that serve' if gpus > 1 else ' that serves'} the rate (the first "
        f"search's {res.num_simulations} simulations counted in)"
    )
    return dataclasses.replace(
        smaller, target_rate_per_s=rate, first_budget=res.gpu_budget, notes=(*smaller.notes, note)
    )
