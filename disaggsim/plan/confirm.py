"""A quick plan's close call, settled at full accuracy (docs/planning.md §2, "Close calls").

Quick mode measures goodputs with a 4 % bisection and short runs; on a ratio of two
goodputs its error is about ±15 % (:data:`~disaggsim.plan.advisor.QUICK_UNCERTAINTY`),
so a disaggregation gain within that of the 5 % threshold cannot decide the verdict.
Rather than answer ``undecided`` and send the user to rerun the whole search without
``--quick``, :func:`confirm_close_call` measures again only what that verdict compares:

1. **which**: on each side (disaggregated; colocated, chunked and vllm together) the
   ``PlanOptions.confirm_per_side`` (2) best candidates by quick goodput per GPU;
2. **how**: full mode's final stage (:meth:`PlanOptions.full_accuracy`): each searched
   again from [0.8, 1.15] × its quick goodput with full mode's run-length rule (≥ 1,000
   requests and 10 service times, each raised to a loaded residence) and 1 % bisection,
   then confirmed at twice that horizon;
3. **until**: any other candidate of a side whose quick goodput beats that side's best
   full-accuracy goodput is measured too (the loop of full mode's
   :func:`~disaggsim.plan.search.finalists`), so each side's best is a candidate
   measured at full accuracy — at most ``PlanOptions.confirm_max_candidates`` (8) in
   all. Where the cap cuts the list, it cuts by :func:`stake`: first measured are those
   whose quick goodput could change the verdict, then those that could change the
   recommendation (a sibling chunk or split of the winning kind), then the rest, each
   group by quick goodput. Those left over are kept in the confirmation
   (``left_over``); where one could still change the verdict by its quick goodput (the
   losing side, or chunked against vllm), or is the recommendation itself, the plan
   stays ``undecided`` (:func:`~disaggsim.plan.advisor.left_over_doubt`), and one that
   could serve more than the recommendation is named in the reason
   (:func:`~disaggsim.plan.advisor.left_over_rivals`).

4. **batch caps**: each kind's best at full accuracy then climbs its batch-cap ladder as
   full mode's search does (:func:`~disaggsim.plan.search.raise_caps`: a larger cap
   kept where it gains more than full mode's exploration tolerance, each larger cap
   re-split along the budget, :func:`~disaggsim.plan.search.resplit`). Quick mode's walk
   drops a larger cap that gains less than its own tolerance (6 %, its bisection's
   grain), so it can stop at a cap and split full mode climbs past (llama-3-8b on 4
   B200, 100/50 tokens: quick mode stopped at 1P + 1D x tp1 with 512 sequences, full
   mode reached 2P + 2D with 1,024, docs/planning.md §2). These deployments are ranked
   with the rest (``Confirmation.climbed``), outside the cap of 8.

Then full mode's rule decides (5 %, no band), on those figures. What the confirmation
cannot remove is a family the wave limit left open whose bound could still beat the
winner (:func:`~disaggsim.plan.advisor.open_family_doubt`): its members were never
searched. With that doubt the plan stays ``undecided`` and no confirmation is run
first; after a confirmation it is asked again against the confirmed verdict.

Before any of that, families of the losing side that quick mode's floor **stopped**
(once 15 % behind the best) are walked on where they could turn the verdict
(:func:`~disaggsim.plan.advisor.stopped_families_in_doubt`: the gain within
:func:`~disaggsim.plan.advisor.stopped_band`, 30 %, of the 5 % line on the side those
families can move it, and a family's ceiling reaching the line): the search is run again
with them exempt from the floor (``PlanOptions.floor_exempt``) and full mode's wave
limit, reusing the first search's runs, so it runs only what the floor had cut. A best
found there decides at quick accuracy, or, still within the close band, is measured
again as above. A stopped family's best can only be higher than found, so a quick
verdict with such a family close to the line could be the wrong side (llama-3.1-8b on 4
H200, lognormal prompts: quick mode decided at -22 % with disaggregated 2P + 1D never
tried; full mode's margin is -6 %).

The result keeps quick mode's options (``quick: true``) and carries a
:class:`~disaggsim.plan.search.Confirmation`; the check as written
(:mod:`disaggsim.plan.holds`) then runs at full mode's tolerance, so recommended.yaml's
rate comes from the confirmed figures, checked as full mode checks them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable

from disaggsim.config.bounds import MAX_SEED
from disaggsim.config.loader import load_scenario
from disaggsim.plan.analytic import sample_lengths, sample_requests
from disaggsim.plan.holds import accuracy_options, at_rate_row, rank_checked, remeasured_row
from disaggsim.plan.search import (
    Candidate,
    CandidateResult,
    Confirmation,
    PlanOptions,
    SearchResult,
    Settlement,
    _Evaluator,
    _per_gpu,
    candidate_row,
    raise_caps,
    rank_rows,
)
from disaggsim.sweep.executors import Executor

__all__ = ["confirm_close_call", "settle_close_call", "settle_seeds", "side", "stake"]


def side(kind: str) -> str:
    """``disaggregate`` or ``colocate``: the two sides a verdict weighs."""
    return "disaggregate" if kind == "disaggregate" else "colocate"


def confirm_close_call(
    res: SearchResult,
    *,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
    doubt: str | None = None,
) -> SearchResult:
    """``res`` with its close call measured again at full accuracy (module docstring),
    or ``res`` itself where there is none to settle: not quick mode, confirmation off,
    a decided quick verdict, or a doubt other than the close gain alone. ``doubt``: a
    close call found after the search (the check as written moved the gain into quick
    mode's band, plan.plan), measured again as one although ``res`` is decided."""
    from disaggsim.plan.advisor import (
        _advise,
        advise,
        close_gain_doubt,
        open_family_doubt,
        stopped_families_in_doubt,
    )

    o = res.options
    if not (o.quick_mode and o.confirm_close) or res.confirmation is not None:
        return res
    adv = _advise(res)
    if doubt is not None:
        stopped: tuple[str, ...] = ()
    else:
        if advise(res).verdict != "undecided":
            return res
        doubt = close_gain_doubt(adv)
        stopped = stopped_families_in_doubt(res, adv)
    if doubt is None and not stopped:
        return res  # an open family alone: no re-measurement settles it
    walked: tuple[str, ...] = ()
    walk_sims = 0
    if stopped or open_family_doubt(res, adv) is not None:
        # families of the losing side the floor stopped, or the wave limit left open,
        # could still turn the verdict: walk them on (quick mode's runs, the stopped ones
        # exempt from the floor, full mode's wave limit) before measuring again
        waves = max(o.confirm_waves, o.max_waves)
        if res.rerun is None:
            return res
        before = res.num_simulations
        exempt = tuple(o.floor_exempt)
        for _ in range(len(res.families) + 1):
            if open_family_doubt(res, adv) is None and not stopped:
                break
            if res.rerun is None or (not stopped and res.options.max_waves >= waves):
                break  # open at full mode's wave limit: nothing more to walk
            exempt = (*exempt, *(n for n in stopped if n not in exempt))
            walked = (
                *walked,
                *(
                    n
                    for n, state in res.families.items()
                    if (state == "open" or n in stopped) and n not in walked
                ),
            )
            res = res.rerun(
                options=dataclasses.replace(o, max_waves=waves, floor_exempt=exempt),
                executor=executor,
                progress=progress,
            )
            adv = _advise(res)
            stopped = tuple(n for n in stopped_families_in_doubt(res, adv) if n not in exempt)
        if not walked:
            return res
        walk_sims = res.num_simulations - before
        note = _walk_note(walked, o, waves, walk_sims, exempt, res.families)
        res = dataclasses.replace(res, notes=(*res.notes, note))
        if advise(res).verdict != "undecided":
            return res  # decided at quick accuracy once the families were walked on
        adv = _advise(res)
        doubt = close_gain_doubt(adv)
        if doubt is None or open_family_doubt(res, adv) is not None:
            return res
    if doubt is None:
        return res  # only stopped families, and none could be walked on
    sides: dict[str, list[CandidateResult]] = {}
    for r in res.ranked:  # best first by quick goodput; ties in the ranking's order
        if r.goodput_per_gpu_per_s > 0:
            sides.setdefault(side(r.candidate.kind), []).append(r)
    for rows in sides.values():
        rows.sort(key=lambda r: -r.goodput_per_gpu_per_s)
    todo = [r.candidate for rows in sides.values() for r in rows[: o.confirm_per_side]]
    quick_per_gpu = {r.candidate: r.goodput_per_gpu_per_s for r in res.ranked}
    full = o.full_accuracy()
    counter = [res.num_simulations]
    explored = {r.candidate: r.goodput for r in res.ranked if r.goodput is not None}
    ev = _Evaluator(
        res.loaded, dict(res.guesses), full, executor, progress, "final", explored, counter
    )

    def more(order: list) -> list:
        todo = []
        for rows in sides.values():
            top = max(
                (_per_gpu(ev.results[r.candidate]) for r in rows if r.candidate in ev.results),
                default=0.0,
            )
            todo += [
                r.candidate
                for r in rows
                if r.candidate not in order and r.goodput_per_gpu_per_s > top
            ]
        # where the cap cuts the list, those that can change the answer first (the
        # verdict, then the recommendation), then the highest quick goodputs
        best = _kind_bests(order, ev.results)
        return sorted(todo, key=lambda c: (stake(c, quick_per_gpu[c], best), -quick_per_gpu[c]))

    order, left = measure_until(ev, todo, o.confirm_max_candidates, more)
    # each kind's best at full accuracy climbs its batch-cap ladder, re-split at each
    # larger cap (search.raise_caps): quick mode's tolerance cannot resolve a larger
    # cap's gain, so its walk dropped what full mode's keeps (module docstring, 4.)
    quick = {r.candidate: r for r in res.ranked}
    lengths = sample_lengths(res.loaded, sample_requests(res.loaded))
    gain = o.full_explore_tol_fraction
    raise_caps(ev, res.loaded, lengths, gain, res.gpu_budget, per_kind=1)
    climbed = [c for c in ev.results if c not in quick]
    rows = remeasured_rows(res, ev.results)
    out_mean = float(lengths[1].mean())
    rows += [
        candidate_row(
            c, ev.results[c], ev.results[c].status, out_mean, res.price_per_gpu_hour,
            full_accuracy=True,
        )
        for c in climbed
    ]  # fmt: skip
    ran = counter[0] - res.num_simulations
    conf = Confirmation(
        doubt=doubt,
        walked_on=walked,
        walk_simulations=walk_sims,
        quick_gain=adv.disaggregation_gain,
        remeasured=tuple(
            (c, quick[c].goodput_per_gpu_per_s, _per_gpu(ev.results[c]) if c in ev.results else 0.0)
            for c in order
        ),
        num_simulations=ran,
        options=full,
        left_over=tuple((c, quick_per_gpu[c]) for c in left),
        climbed=tuple((c, _per_gpu(ev.results[c])) for c in climbed),
    )
    return dataclasses.replace(
        res,
        ranked=rank_rows(rows),
        confirmation=conf,
        num_simulations=counter[0],
        num_stopped_early=res.num_stopped_early
        + sum(g.num_stopped_early for g in ev.results.values()),
    )


def measure_until(
    ev: Callable[[list], object], todo: list, cap: int, more: Callable[[list], list]
) -> tuple[list, list]:
    """Measure ``todo`` with ``ev`` (it measures a list of candidates), then what ``more``
    asks next of the candidates measured so far, until it asks nothing or ``cap`` are
    measured: (the candidates measured, in order; those the cap left over)."""
    order: list = []
    left: list = []
    while todo:
        room = cap - len(order)
        todo, left = todo[: max(room, 0)], todo[max(room, 0) :]
        if not todo:
            break
        ev(todo)
        order += todo
        todo = more(order)
    return order, left


def remeasured_rows(res: SearchResult, results: dict) -> list[CandidateResult]:
    """``res``'s ranked rows, each one ``results`` holds taking that search's goodput (a
    measurement at full accuracy: plan/confirm.py)."""
    rows = []
    for r in res.ranked:
        g = results.get(r.candidate)
        rows.append(
            r if g is None else remeasured_row(r, g, status=g.status, goodput=g, full_accuracy=True)
        )
    return rows


# the one-sided confidence a settled margin's own band is an upper bound at
OWN_BAND_CONFIDENCE = 0.9


def own_band(dis: tuple[float, ...], colo: tuple[float, ...], floor: float) -> float | None:
    """One sd of a settled margin from its own seeds: the two sides' goodputs per GPU on
    the same seeds (``dis``, ``colo``) are paired (each seed's arrivals are the same for
    both), so the sd of the per-seed log ratios, at its :data:`OWN_BAND_CONFIDENCE` upper
    confidence bound (chi-square, n - 1 degrees of freedom: 2.27 x the sample sd at 4
    seeds), over sqrt(n) is the sd of the mean's ratio; at least ``floor`` / sqrt(n) (the
    bisection's grain: equal figures on every seed are equal only to it). None where a
    side has a seed without a goodput or there are fewer than 2 seeds."""
    from scipy.special import chdtri  # (scipy.stats costs seconds to import)

    n = len(dis)
    if n < 2 or len(colo) != n or min(*dis, *colo) <= 0:
        return None
    logs = [math.log(d / c) for d, c in zip(dis, colo, strict=True)]
    upper = statistics.stdev(logs) * math.sqrt((n - 1) / chdtri(n - 1, OWN_BAND_CONFIDENCE))
    return max(upper, floor) / math.sqrt(n)


def _kind_bests(measured: list, results: dict) -> dict[str, float]:
    """Each kind's best goodput per GPU among the candidates measured at full accuracy."""
    best: dict[str, float] = {}
    for c in measured:
        if c in results:
            best[c.kind] = max(best.get(c.kind, 0.0), _per_gpu(results[c]))
    return best


def _winner(best: dict[str, float]) -> str:
    """The verdict full mode's rule gives on each kind's best goodput per GPU (``best``):
    disaggregate at >= 5 % over the best colocated kind, else that kind (ties to
    chunked)."""
    from disaggsim.plan.advisor import MIN_GAIN

    dis = best.get("disaggregate", 0.0)
    chunked, vllm = best.get("colocate_chunked", 0.0), best.get("colocate_vllm", 0.0)
    if dis > 0 and dis >= max(chunked, vllm) * (1 + MIN_GAIN):
        return "disaggregate"
    return "colocate_chunked" if chunked >= vllm else "colocate_vllm"


def stake(c: Candidate, quick: float, best: dict[str, float]) -> int:
    """What measuring ``c`` at full accuracy could change, were its goodput per GPU its
    quick one (``quick``), against each kind's best measured so far (``best``): 0 the
    verdict (the side, or chunked against vllm), 1 the recommendation (a better member
    of the winning kind: another chunk or split), 2 neither (a gain the reason quotes).
    The confirmation's cap cuts the candidates of least stake first: a sibling chunk of
    the winning family outranks a losing split that cannot overturn the verdict."""
    now = _winner(best)
    if _winner({**best, c.kind: max(best.get(c.kind, 0.0), quick)}) != now:
        return 0
    return 1 if c.kind == now and quick > best.get(now, 0.0) else 2


def _walk_note(
    walked: tuple[str, ...],
    o: PlanOptions,
    waves: int,
    sims: int,
    exempt: tuple[str, ...],
    states: dict[str, str] | None = None,
) -> str:
    """The note on the walk: what it walked on and the simulations that took; where it
    took none, that nothing was added and why (every deployment it reached had been run,
    so the families' figures are the search's), never that it walked on."""
    floor = f", the floor stopping none of {', '.join(exempt)}" if exempt else ""
    head = (
        f"quick mode's gain was near enough the threshold for famil"
        f"{'y' if len(walked) == 1 else 'ies'} {', '.join(walked)}, left open by its "
        f"{o.max_waves}-wave limit or stopped by its floor, to turn it"
    )
    if sims > 0:
        return (
            f"{head}: walked on with quick mode's runs to full mode's {waves}-wave "
            f"limit{floor} ({sims} simulations)"
        )
    now = ", ".join(f"{n} {states[n]}" for n in walked if states and n in states)
    return (
        f"{head}; walking on with quick mode's runs to full mode's {waves}-wave limit"
        f"{floor} added no simulation: every deployment it reached had been run already "
        f"(or cannot be built), so the figures are the search's" + (f" ({now})" if now else "")
    )


def settle_seeds(res: SearchResult) -> list[int]:
    """The seeds a close call is settled on (:func:`settle_close_call`), one search each:
    ``PlanOptions.settle_seeds`` of them after those the plan's searches ran (each
    search averaging the plan's ``seeds`` from its own), so that none is theirs; below
    them for a scenario seed near the top of its range
    (:data:`~disaggsim.config.bounds.MAX_SEED`)."""
    s, o = res.loaded.scenario.seed, res.options
    step = o.seeds
    if s + step * o.settle_seeds <= MAX_SEED:
        return [s + step * (k + 1) for k in range(o.settle_seeds)]
    return [s - step * (k + 1) for k in range(o.settle_seeds)]


def checked_close_call(res: SearchResult, checked: SearchResult) -> tuple[float, float] | None:
    """The full-accuracy close call, (gain, band), that the check as written made of a
    plan not settled before it (``res``, checked: ``checked``): the check lowers the
    goodputs compared to rates their files meet, which can move a gain outside the
    close-call band into it (+15 % searched, +12 % as written at one seed). None where
    ``res`` was settled or ``checked`` is no decided close call (whether ``res`` can be
    settled is :func:`settle_close_call`'s to say)."""
    from disaggsim.plan.advisor import _advise, advise

    if res.settlement is not None or not advise(checked).decided:
        return None
    adv = _advise(checked)
    if adv.close_call_band is None or adv.disaggregation_gain is None:
        return None
    return adv.disaggregation_gain, adv.close_call_band


def settle_close_call(
    res: SearchResult,
    *,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
    near: tuple[float, float] | None = None,
) -> SearchResult:
    """``res`` with a close call at full accuracy measured again on
    ``PlanOptions.settle_seeds`` fresh seeds (docs/planning.md §3, "Close calls at full
    accuracy are settled at more seeds"), or ``res`` itself where there is none: no gain
    quoted within the close-call band of the 5 % line
    (:func:`~disaggsim.plan.advisor.close_call_band`: one sd of a margin's seed spread,
    9 % at one seed), settling off, or the plan's own searches already averaging as many
    seeds.

    A full-accuracy goodput moves 2.5-6 % (one sd) with the seed, a ratio of two up to
    9 % (docs/sweeps.md, "How much a goodput moves"), so a gain of +9 % can be -1 % on
    another seed. Each kind's best the verdict weighs (disaggregated, chunked, vllm) is
    searched again with the same options as before, once on each of ``settle_seeds``
    fresh seeds (:func:`settle_seeds`: none the plan's own, whose luck made these
    candidates the best of their kinds), bracketed around its goodput as searched, and
    takes the mean of those goodputs: the plan's own estimator, averaged, so that a ratio
    of two such means moves SEED_SPREAD / sqrt(N), as the band assumes. (One search
    averaging the attainment over N seeds is not that: a rate meets there only when every
    seed's run is stable, which acts like a minimum over the seeds where queue growth sets
    the goodput: docs/sweeps.md.) Then any other measured candidate of those kinds whose
    goodput per GPU beats its kind's best so measured is settled too, at most
    ``PlanOptions.settle_max_candidates`` in all (those the cap leaves over are named).
    (The weaker colocated kind's best is measured only where it lies within the band of
    the stronger's.) Each row takes its mean goodput (its ``goodput`` the first seed's
    search), and the advisor compares, of each kind measured, those rows alone
    (:func:`~disaggsim.plan.search.settled_rows`). The plan settles before it checks the
    compared candidates as written (plan.plan), so recommended.yaml still meets as
    written, and the verdict is the advisor's on the checked figures; the band is quoted
    at the new seeds. The check runs each file once on its own seed, so a settled figure
    it lowers is again one seed's (the file's).

    ``near``: the (gain, band) of a close call the check as written made of ``res``'s
    gain (:func:`checked_close_call`); ``res`` is settled on it, as the plan was
    before its check, and checked again by the caller."""
    from disaggsim.plan.advisor import _advise, _best, advise

    o = res.options
    if o.settle_seeds <= o.seeds or res.settlement is not None or not advise(res).decided:
        return res  # an undecided plan's doubt is not the seed's (plan/advisor.py)
    adv = _advise(res)
    gain, band = near or (adv.disaggregation_gain, adv.close_call_band)
    if band is None or gain is None:
        return res
    opts = accuracy_options(res)
    counter = [res.num_simulations]
    searched = {r.candidate: r.goodput for r in res.ranked if r.goodput is not None}
    seeds = settle_seeds(res)
    evs = [
        _Evaluator(
            load_scenario({**res.loaded.raw, "seed": seed}, base_dir=res.loaded.base_dir),
            dict(res.guesses), opts, executor, progress, "final", searched, counter,
        )
        for seed in seeds
    ]  # fmt: skip
    before = {r.candidate: r.goodput_per_gpu_per_s for r in res.ranked}
    measured = [r for r in res.ranked if r.status != "explored" and r.goodput_per_s > 0]
    bests = [
        b
        for b in (_best(res, k) for k in ("disaggregate", "colocate_chunked", "colocate_vllm"))
        if b is not None and b.status != "explored" and b.goodput_per_s > 0
    ]
    # the colocated kinds' bests both where the weaker lies within the band of the
    # stronger (another seed could swap them), else the stronger alone
    colo = max(
        (b.goodput_per_gpu_per_s for b in bests if b.candidate.kind != "disaggregate"),
        default=0.0,
    )
    todo = [
        b.candidate
        for b in bests
        if b.candidate.kind == "disaggregate" or b.goodput_per_gpu_per_s >= colo * (1 - band)
    ]
    per_seed: dict[Candidate, tuple[float, ...]] = {}  # goodput per GPU on each seed

    def measure(cands: list) -> None:
        for ev in evs:
            ev(cands)
        for c in cands:
            if c in evs[0].results:  # (one that cannot be built serves 0: not a row)
                per_seed[c] = tuple(_per_gpu(ev.results[c]) for ev in evs)

    def mean(c: Candidate) -> float:
        return sum(per_seed[c]) / len(per_seed[c])

    def more(order: list) -> list:
        # a measured sibling above its kind's best as settled: the verdict would take it
        # on one seed's figure (the winner's curse the settling removes)
        best: dict[str, float] = {}
        for c in order:
            if c in per_seed:
                best[c.kind] = max(best.get(c.kind, 0.0), mean(c))
        return sorted(
            (
                r.candidate
                for r in measured
                if r.candidate not in order
                and r.candidate.kind in best
                and r.goodput_per_gpu_per_s > best[r.candidate.kind]
            ),
            key=lambda c: -before[c],
        )

    order, left = measure_until(measure, todo, o.settle_max_candidates, more)
    # the margin's own spread: the paired per-seed ratio of each side's settled best
    sides: dict[str, Candidate] = {}
    for c in order:
        if c in per_seed:
            k = side(c.kind)
            if k not in sides or mean(c) > mean(sides[k]):
                sides[k] = c
    own = (
        own_band(per_seed[sides["disaggregate"]], per_seed[sides["colocate"]], opts.tol_fraction)
        if len(sides) == 2
        else None
    )
    rows = [
        at_rate_row(r, mean(r.candidate) * r.candidate.num_gpus) if r.candidate in per_seed else r
        for r in remeasured_rows(res, {c: evs[0].results[c] for c in per_seed})
    ]
    settlement = Settlement(
        gain=gain,
        band=band,
        seeds_before=o.seeds,
        remeasured=tuple((c, before[c], mean(c) if c in per_seed else 0.0) for c in order),
        num_simulations=counter[0] - res.num_simulations,
        options=opts,
        left_over=tuple((c, before[c]) for c in left),
        per_seed=tuple(per_seed.get(c, ()) for c in order),
        seeds_run=tuple(seeds),
        own_band=own,
        after_check=near is not None,
    )
    return dataclasses.replace(
        res,
        ranked=rank_checked(rows, res.target_rate_per_s),
        settlement=settlement,
        num_simulations=counter[0],
        num_stopped_early=res.num_stopped_early
        + sum(g.num_stopped_early for ev in evs for g in ev.results.values()),
    )
