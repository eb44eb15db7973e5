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
from disaggsim.plan.analytic import AnalyticGuess, analytic_guess, plan_gpu
from disaggsim.plan.confirm import checked_close_call, confirm_close_call, settle_close_call
from disaggsim.plan.holds import check_as_written
from disaggsim.plan.question import auto_link
from disaggsim.plan.search import (
    Candidate,
    CandidateResult,
    PlanOptions,
    SearchResult,
    rate_budget,
)
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
    auto_fabric: bool = False,
) -> tuple[SearchResult, Advice]:
    """Search the candidates for the scenario's budget (or ``gpus``), in quick mode settle
    a close call at full accuracy (:func:`~disaggsim.plan.confirm.confirm_close_call`),
    measure a close call at full accuracy again averaging more seeds
    (:func:`~disaggsim.plan.confirm.settle_close_call`), check the ones the advisor
    compares as their recommended.yaml would run them
    (:func:`~disaggsim.plan.holds.check_as_written`, unless ``options`` turn it off), and
    advise.

    ``auto_fabric``: the scenario's ``kind: link`` fabric was chosen by a question's
    ``--fabric auto`` rule (:func:`~disaggsim.plan.question.auto_link`: NVLink where
    the budget fits one node), so a target-rate plan applies that rule to the budget it
    sizes, and again to a smaller fleet (:func:`fit_target_rate`)."""
    if isinstance(scenario, LoadedScenario):
        loaded = (
            load_scenario(scenario.raw, overrides, base_dir=scenario.base_dir)
            if overrides
            else scenario
        )
    else:
        loaded = load_scenario(scenario, overrides)
    if auto_fabric and target_rate_per_s is not None and gpus is None:
        opts = options or PlanOptions()
        loaded = with_auto_link(loaded, rate_budget(loaded, target_rate_per_s, opts.max_tp))
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
        res = fit_target_rate(res, executor=executor, progress=progress, auto_fabric=auto_fabric)
    # a gain at full accuracy within a seed's spread of the line: the compared kinds'
    # bests measured again averaging more seeds (then checked as written as any are)
    res = settle_close_call(res, executor=executor, progress=progress)
    if res.options.check_as_written:  # the goodputs compared hold as recommended.yaml runs
        checked = check_as_written(res, executor=executor, progress=progress)
        why = close_after_check(res, checked)
        if why is not None:
            # the check moved a decided quick gain into quick mode's band: settle it at
            # full accuracy as a close call found by the search is (confirmed, then at
            # more seeds if near the line), then check again
            confirmed = confirm_close_call(res, executor=executor, progress=progress, doubt=why)
            if confirmed is not res:
                res = settle_close_call(confirmed, executor=executor, progress=progress)
                checked = check_as_written(res, executor=executor, progress=progress)
        near = checked_close_call(res, checked)
        if near is not None:
            # the check moved a decided full-accuracy gain into the close-call band:
            # settle the compared kinds at more seeds as before a check, then check again
            settled = settle_close_call(res, executor=executor, progress=progress, near=near)
            if settled is not res:
                checked = check_as_written(settled, executor=executor, progress=progress)
        res = checked
    return res, advise(res)


def close_after_check(res: SearchResult, checked: SearchResult) -> str | None:
    """The close call (a doubt, or None) that the check as written made of a quick plan
    the search had decided: the check lowered a goodput compared, and quick mode's gain
    now lies within its error of the threshold (1005-5 of docs/planning.md §7: +20 % or
    more as searched, +17 % as written, answered undecided with nothing measured)."""
    from disaggsim.plan.advisor import _advise, close_gain_doubt

    o = res.options
    if not (o.quick_mode and o.confirm_close) or res.confirmation is not None:
        return None
    if checked.confirmation is not None or not advise(res).decided:
        return None
    if advise(checked).verdict != "undecided":
        return None
    why = close_gain_doubt(_advise(checked))
    return None if why is None else f"{why}, once checked as written"


def scaled_to_rate(c: Candidate, goodput_per_s: float, rate_per_s: float) -> Candidate:
    """Candidate ``c``'s deployment with each pool's workers scaled to serve
    ``rate_per_s`` at the goodput per worker ``c`` was measured at (``goodput_per_s``
    over its own workers; a disaggregated pair keeps its P:D share, each pool rounded
    up, at least one worker each)."""
    n_p = max(1, math.ceil(rate_per_s * c.num_prefill_workers / goodput_per_s))
    if c.kind != "disaggregate":
        return dataclasses.replace(c, num_prefill_workers=n_p)
    n_d = max(1, math.ceil(rate_per_s * c.num_decode_workers / goodput_per_s))
    return dataclasses.replace(c, num_prefill_workers=n_p, num_decode_workers=n_d)


def rate_fleet_gpus(c: Candidate, goodput_per_s: float, rate_per_s: float) -> int:
    """The GPUs of :func:`scaled_to_rate`'s deployment."""
    return scaled_to_rate(c, goodput_per_s, rate_per_s).num_gpus


def fewer_gpus_for_rate(res: SearchResult) -> list[tuple[int, CandidateResult]]:
    """The fleets smaller than the budget that serve ``res.target_rate_per_s``: for each
    candidate of the search (explored rows too: the plan measures the smaller fleet
    again), colocated or disaggregated, the GPUs of its deployment scaled to the rate
    (:func:`rate_fleet_gpus`), fewest first, one per GPU count (its best per GPU); empty
    when none is under the budget. A target-rate budget is sized with at least one worker
    per pool (the analytic fleet of two pools), so a rate one colocated worker serves was
    planned on two (there a disaggregated pair could win per GPU while one GPU serves the
    rate); and a fleet sized on the cost model's capacity can be larger than a
    disaggregated (or colocated) deployment the runs found needs."""
    if res.target_rate_per_s is None:
        return []
    rate = scale_rate(res)
    fits: dict[int, CandidateResult] = {}
    for r in res.ranked:  # best per GPU first: the first row at a GPU count stays
        if r.goodput_per_s > 0:
            gpus = rate_fleet_gpus(r.candidate, r.goodput_per_s, rate)
            if gpus < res.gpu_budget:
                fits.setdefault(gpus, r)
    return sorted(fits.items(), key=lambda t: t[0])


def scale_rate(res: SearchResult) -> float:
    """The rate a fleet for ``res.target_rate_per_s`` is scaled to: with the search's own
    tolerance to spare twice over (a fleet scaled to exactly the rate is measured again
    and bisected to that tolerance, as often under the rate as over)."""
    assert res.target_rate_per_s is not None
    return res.target_rate_per_s * (1.0 + 2.0 * res.options.tol_fraction)


def measure(
    res: SearchResult,
    c: Candidate,
    why: str,
    *,
    executor: Executor | None = None,
    progress=None,
) -> SearchResult:
    """``res`` with candidate ``c`` measured as its search measures a finalist (the final
    stage: from its explored goodput, else bracketed around its family's best), in the
    ranking with a note saying ``why``; ``res`` itself where ``c`` was measured so
    already, is not of a family the search has (its layouts do not fit there), or cannot
    be built."""
    from disaggsim.plan.search import _at_rate, _Evaluator, rank_rows

    seen = next((r for r in res.ranked if r.candidate == c), None)
    if seen is not None and seen.status != "explored":
        return res
    explored = {c: seen.goodput} if seen is not None and seen.goodput is not None else {}
    ev = _Evaluator(
        res.loaded, dict(res.guesses), res.options, executor, progress, "final", explored,
        counter=[res.num_simulations], memo=res.memo,
    )  # fmt: skip
    if not any(ev._family_key(k) == ev._family_key(c) for k in res.guesses):
        return res
    # the family's searches as the evaluator's own: without an explored goodput, c's
    # first bracket is the family's best goodput per GPU scaled to c's GPUs
    ev.results.update(
        {
            r.candidate: r.goodput
            for r in res.ranked
            if r.goodput is not None and ev._family_key(r.candidate) == ev._family_key(c)
        }
    )
    (per_gpu,) = ev([c])
    g = ev.results.get(c)
    if g is None or g is explored.get(c):  # a deployment that cannot be built
        return res
    rate = per_gpu * c.num_gpus
    usd = None
    if res.price_per_gpu_hour is not None and rate > 0:
        out_mean = res.analytic.output_tokens_mean
        usd = res.price_per_gpu_hour * c.num_gpus / 3600.0 / (rate * out_mean) * 1e6
    row = CandidateResult(
        candidate=c, goodput_per_s=rate, goodput_per_gpu_per_s=per_gpu, status=g.status,
        at_rate=_at_rate(g), usd_per_m_output_tokens=usd, goodput=g,
    )  # fmt: skip
    note = f"{c.label} measured as a finalist too: {why}; it serves {rate:.3g} req/s"
    return dataclasses.replace(
        res,
        ranked=rank_rows([*(r for r in res.ranked if r.candidate != c), row]),
        num_simulations=ev.simulations,
        num_stopped_early=res.num_stopped_early + g.num_stopped_early,
        notes=(*res.notes, note),
    )


def finalists_for_rate(
    res: SearchResult,
    sized_on: Candidate | None = None,
    *,
    executor: Executor | None = None,
    progress=None,
) -> SearchResult:
    """``res`` (a target-rate search, ranked by :func:`rank_for_rate`) where its
    recommendation serves the rate; else with more finalists measured until one does or
    none is left: ``sized_on``, the deployment the budget was sized on, then the best
    explored candidate whose explored goodput serves the rate. The search's walk and
    finalists go by goodput per GPU, so a deployment that serves the rate is left out
    where a smaller one of its family ties it per GPU (1P + 1D against 2P + 1D)."""
    rate = res.target_rate_per_s
    assert rate is not None
    asked: set[Candidate] = set()
    for stage in ("sized_on", "explored"):
        rec = advise(res).recommended if res.ranked else None
        if rec is not None and rec.goodput_per_s >= rate:
            return res
        if stage == "sized_on":
            c, why = (
                sized_on,
                (
                    "the deployment this budget was sized on for the target rate, left out of "
                    "the finalists chosen by goodput per GPU"
                ),
            )
        else:
            c = next(
                (
                    r.candidate
                    for r in res.ranked
                    if r.status == "explored"
                    and r.goodput_per_s >= rate
                    and r.candidate not in asked
                ),
                None,
            )
            why = (
                "the best explored deployment serving the target rate, left out of the "
                "finalists chosen by goodput per GPU"
            )
        if c is None:
            continue
        asked.add(c)
        res = rank_for_rate(measure(res, c, why, executor=executor, progress=progress), rate)
    return res


def rank_for_rate(res: SearchResult, rate_per_s: float) -> SearchResult:
    """``res`` with the candidates that serve ``rate_per_s`` ranked before those that do
    not, each group (and the explored rows after the measured ones) in its order: the
    best per GPU of a budget can be a deployment of fewer GPUs serving less than the
    rate (1P + 1D where 2P + 1D serves it), which answers no target-rate question."""
    ranked = sorted(
        res.ranked, key=lambda r: (r.status == "explored", r.goodput_per_s < rate_per_s)
    )
    return dataclasses.replace(res, ranked=tuple(ranked))


# a target-rate plan searches at most this many smaller fleets (fewest GPUs first, each
# after a failed one at least RATE_FLEET_STEP times its GPUs)
MAX_RATE_FLEETS = 3
RATE_FLEET_STEP = 1.15


def with_auto_link(loaded: LoadedScenario, gpus: int) -> LoadedScenario:
    """``loaded`` on the link ``--fabric auto`` picks for a budget of ``gpus``
    (:func:`~disaggsim.plan.question.auto_link`); itself where that is its link already
    or its fabric is not a single ``kind: link``."""
    fabric = loaded.scenario.fabric
    if getattr(fabric, "kind", "link") != "link":
        return loaded
    link = auto_link(plan_gpu(loaded), gpus)
    if link == fabric.link:  # type: ignore[union-attr]
        return loaded
    raw = {**loaded.raw, "fabric": {**loaded.raw.get("fabric", {}), "link": link}}
    return load_scenario(raw, base_dir=loaded.base_dir)


def fit_target_rate(
    res: SearchResult,
    *,
    executor: Executor | None = None,
    progress=None,
    auto_fabric: bool = False,
) -> SearchResult:
    """A target-rate plan searched again at fewer GPUs that serve the rate
    (:func:`fewer_gpus_for_rate`, fewest first, at most :data:`MAX_RATE_FLEETS`, each
    after one that failed at least :data:`RATE_FLEET_STEP` times its GPUs), kept at the
    first whose recommendation (the advisor's, :func:`advise`) serves the rate;
    else ``res``. The verdict is then for the fleet the rate needs: at one worker
    disaggregation cannot exist. ``auto_fabric`` (see :func:`plan`): a smaller fleet is
    searched on the link ``--fabric auto`` picks for it (NVLink once it fits one node)."""
    rate = res.target_rate_per_s
    if rate is None:
        return res
    res = rank_for_rate(res, rate)
    simulations = res.num_simulations
    tried: list[int] = []
    for gpus, row in fewer_gpus_for_rate(res):
        if len(tried) == MAX_RATE_FLEETS:
            break
        if tried and gpus < tried[-1] * RATE_FLEET_STEP:
            continue
        tried.append(gpus)
        before = simulations
        try:
            smaller = _search(
                with_auto_link(res.loaded, gpus) if auto_fabric else res.loaded,
                gpus=gpus,
                price_per_gpu_hour=res.price_per_gpu_hour,
                options=res.options,
                executor=executor,
                progress=progress,
                simulations_before=simulations,
            )
        except UserError:  # the smaller budget refused (a bound): try the next
            continue
        smaller = rank_for_rate(
            confirm_close_call(smaller, executor=executor, progress=progress), rate
        )
        smaller = finalists_for_rate(
            dataclasses.replace(smaller, target_rate_per_s=rate),
            scaled_to_rate(row.candidate, row.goodput_per_s, scale_rate(res)),
            executor=executor,
            progress=progress,
        )
        rec = advise(smaller).recommended if smaller.ranked else None
        simulations = smaller.num_simulations
        if rec is None or rec.goodput_per_s < rate:
            continue
        c = row.candidate
        note = (
            f"sized for {rate:g} req/s: the {res.gpu_budget} GPUs first sized (one worker "
            f"per pool at least) were searched, where {c.label} served "
            f"{row.goodput_per_s:.3g} req/s on {c.num_gpus} GPU{'s' if c.num_gpus > 1 else ''}"
            f"; searched again on {gpus} GPU{'s' if gpus > 1 else ''}, where "
            f"{rec.candidate.label} served {rec.goodput_per_s:.3g} req/s (the earlier "
            f"searches' {before} simulations counted in)"
        )
        return dataclasses.replace(
            smaller,
            target_rate_per_s=rate,
            first_budget=res.gpu_budget,
            notes=(*smaller.notes, note),
        )
    # the smaller fleets searched and not kept are counted in
    res = dataclasses.replace(res, num_simulations=simulations)
    return finalists_for_rate(res, executor=executor, progress=progress)
