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

from pathlib import Path

from disaggsim.config.loader import LoadedScenario, load_scenario
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
    if res.options.check_as_written:  # the goodputs compared hold as recommended.yaml runs
        res = check_as_written(res, executor=executor, progress=progress)
    return res, advise(res)
