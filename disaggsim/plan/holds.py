"""Recommendations that hold as written: the candidates the advisor compares, each run at
the length and seed its recommended.yaml runs (docs/planning.md, "Does a recommendation
hold as written?").

The search's goodputs come from runs whose length follows the workload (a few service
times and loaded residences: docs/metrics.md), and near capacity a queue grows too
slowly for such runs to see. recommended.yaml runs the scenario's own ``sim`` window
(300 s of arrivals for a one-command question) at the goodput, and there the queue
shows: qwen3-30b-a3b on 8 H100, 512/64 tokens, TTFT 3 s, confirmed vllm 4 x tp1xdp2 at
571.5 req/s in a 28.6 s run (attainment 0.936) and met 2.4 % of requests as written.

So before a decided verdict is given, :func:`check_as_written` runs the recommended
candidate and the best of the other side (the best colocated one against a
disaggregated recommendation, and the reverse) as each would be written: the same
scenario, ``sim`` section and seed, the rate rounded as written (:data:`RATE_DIGITS`). A
run that misses steps the rate down at that length (by twice the plan's tolerance, full
mode's where a quick plan's close call was confirmed at full accuracy: plan/confirm.py;
doubling) until one meets, then bisects between the two to the tolerance
(:class:`~disaggsim.sweep.goodput.RateSearch`'s step-down); that rate is the candidate's
goodput. A run that meets the attainment target but whose trend test calls its queue
growing is run once more with a fresh seed, as the goodput search retests such a miss
(docs/metrics.md), and that run decides: near capacity the trend test of one window
shorter than the queue's relaxation time calls a stationary fleet unstable more often
than its alpha, and a verdict compared on one side's false alarm quoted the seed's luck
(llama-3.1-8b on 8 A100, max_gap: disaggregation +15 % where chunked prefill served at
least as much on seeds 0-3; docs/planning.md §7). The verdict is then taken again on the
checked goodputs; where that brings in a kind not yet checked (chunked against vllm), its
best is checked too.

The recommendation's file must meet as ``disaggsim run`` runs it, with its own seed and
no retest: where its goodput was met only by the retest's fresh seed, the file is
written at the highest rate its own seed meets (the same step-down from the goodput,
without the retest: ``CandidateResult.file_check``), and a note gives both rates.

How long the file runs (:func:`written_sim`): the question's window, unless that holds
more than ``PlanOptions.file_requests`` (100,000) requests at the rate; then the window
steady state needs (:func:`needed_window_s`: an overload of the plan's tolerance grows a
backlog that makes most measured requests miss) and at least that many requests. The
check's cost grew with the question's window times the rate (a 300 s file of 700 k
requests at 2,300 req/s on 16 B200); it now grows with the rate times the needed window
(62 s there), and the file still meets exactly as it is checked.

A kind's best is its best checked candidate, and a check never caps or prunes a
candidate it did not run: where a kind's checked best was lowered below the search
goodput of a measured sibling (a finalist, not a screened one), that sibling is checked
too, the highest first, at most :data:`MAX_CHECKS_PER_KIND` candidates of a kind in all;
one still above after that keeps its own search goodput in the ranking and a note names
it. Before, an unchecked sibling was ranked at most at its kind's checked goodput and
never compared: on u7 of docs/planning.md §7 (mistral-7b on 16 A100) chunk 448 was
lowered to 2.101 req/s per GPU while chunked 8 × tp2 chunk 2048, confirmed at 2.198,
was listed under it unchecked, and the verdict quoted its margin against vllm's 2.140.
(Checking every sibling down the list is what the cap had stopped: a quick plan of
mistral-7b on 16 B200, 6000/1000 tokens, checked seven candidates in 27 runs of 300 s,
each lowered by 2-5 %; the bound keeps that to three a kind.) The other candidates keep
the search's goodputs; a note says so. Undecided and ``none`` verdicts recommend nothing
and are not checked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from disaggsim.config.bounds import MAX_REQUESTS, expected_requests
from disaggsim.config.loader import load_scenario
from disaggsim.config.scenario import SimConfig
from disaggsim.metrics.steady import Horizon
from disaggsim.plan.search import (
    CandidateResult,
    PlanOptions,
    SearchResult,
    candidate_scenario,
    rank_rows,
    settled_rows,
)
from disaggsim.sweep.core import source_of
from disaggsim.sweep.executors import Executor
from disaggsim.sweep.goodput import GoodputResult, goodput_many

__all__ = [
    "FILE_MARGIN",
    "MAX_CHECKS_PER_KIND",
    "accuracy_options",
    "RATE_DIGITS",
    "WrittenSim",
    "backlog_slack_s",
    "check_as_written",
    "lowered_note",
    "needed_window_s",
    "own_seed_met",
    "rank_checked",
    "siblings_above",
    "written_horizon",
    "written_rate",
    "written_scenario",
    "written_sim",
]

RATE_DIGITS = 6  # significant digits of the rate recommended.yaml writes
# candidates of one kind the check runs at most: its best, then measured siblings whose
# search goodput per GPU lies above the kind's best checked one (module docstring)
MAX_CHECKS_PER_KIND = 3
# a shortened file's measurement window: this many times the seconds a backlog growing at
# the plan's tolerance takes to delay a request past the SLO (backlog_slack_s)
FILE_MARGIN = 2.0


def accuracy_options(res) -> PlanOptions:
    """The options whose tolerance and run-length rule the compared goodputs were measured
    with: full mode's final stage where a quick plan's close call was measured again
    (plan/confirm.py), else the plan's own. The check as written and the file's window
    use them."""
    conf = getattr(res, "confirmation", None)
    return conf.options if conf is not None else res.options


def written_rate(rate_per_s: float) -> float:
    """The rate as recommended.yaml writes it (:data:`RATE_DIGITS` significant digits)."""
    return float(f"{rate_per_s:.{RATE_DIGITS}g}")


def _ceil4(x: float) -> float:
    """``x`` rounded up to 4 significant digits (a window written short of what it
    needs would not hold the rule)."""
    if not x > 0:
        return 0.0
    e = math.floor(math.log10(x)) - 3
    v = math.ceil(round(x / 10.0**e, 9)) * 10.0**e
    return float(f"{v:.4g}")


def backlog_slack_s(slo, kind: str, output_tokens_mean: float) -> float:
    """How long a request may wait in a growing backlog before it misses the SLO: in
    front of a colocated pool or a prefill pool it waits for its first token (the TTFT
    target); a disaggregated request can also wait after its first token for a decode
    batch, which adds the wait to its largest gap, or its mean gap times (output − 1)
    (the ITL target, or it times the mean output less one)."""
    if kind != "disaggregate":
        return float(slo.ttft_s)
    gaps = 1.0 if slo.itl_statistic == "max_gap" else max(output_tokens_mean - 1.0, 1.0)
    return max(float(slo.ttft_s), slo.itl_s * gaps)


def needed_window_s(res: SearchResult, kind: str) -> tuple[float, float]:
    """The warm-up and measurement window (seconds) a file of a ``kind`` candidate needs
    (docs/planning.md §4, "How long the file runs"). A rate a share ``e`` above what the
    deployment serves grows a backlog whose wait rises by about ``e`` seconds each second
    (fluid limit), so requests arriving ``slack / e`` after it starts miss; over a window
    of :data:`FILE_MARGIN` × ``slack / (attainment × tol)`` an overload of the plan's
    tolerance makes at least half of the measured requests miss (attainment target
    ``attainment`` up to 1). The warm-up is a mean request's longest life within the
    SLO (TTFT target + (mean output − 1) × ITL target): the deployment fills first."""
    slo = res.loaded.scenario.slo
    out = res.analytic.output_tokens_mean
    slack = backlog_slack_s(slo, kind, out)
    tol = accuracy_options(res).tol_fraction
    measure = FILE_MARGIN * slack / (slo.attainment_target * tol)
    warm = slo.ttft_s + max(out - 1.0, 0.0) * slo.itl_s
    return float(warm), float(measure)


@dataclasses.dataclass(frozen=True, slots=True)
class WrittenSim:
    """The ``sim`` section recommended.yaml writes at a rate, and why it is what it is.

    ``bound``: None, the question's own; ``"file_requests"``, shortened where the
    question's window held more than ``PlanOptions.file_requests`` requests at this rate,
    to what :func:`needed_window_s` asks (and no fewer requests than that);
    ``"MAX_REQUESTS"``, shortened further to fit one run's requests (docs/safety.md).
    ``question_s``: the question's ``duration_s``; ``requests``: those expected in the
    file (0 for a trace, counted when read)."""

    sim: dict[str, Any]
    question_s: float
    bound: str | None
    requests: float


def written_sim(res: SearchResult, kind: str, rate_per_s: float) -> WrittenSim:
    """The ``sim`` section recommended.yaml writes for a ``kind`` candidate at
    ``rate_per_s`` (:class:`WrittenSim`): the question's, unless that holds more than
    ``res.options.file_requests`` requests at the rate as written; then the question's
    warm-up share of the longest of: that many requests' arrivals, and the window
    :func:`needed_window_s` asks (its warm-up at least that one's), each rounded up to 4
    digits; never longer than the question's. Past MAX_REQUESTS (a fleet's goodput times
    the window can exceed what one run may hold) both shrink in proportion."""
    loaded = res.loaded
    sim = dict(loaded.raw["sim"])
    d0 = float(sim["duration_s"])
    w0 = float(sim.get("warmup_s", 0.0))
    wl = loaded.scenario.workload
    if not hasattr(wl, "rate_per_s"):
        return WrittenSim(sim, d0, None, 0.0)
    # as the recommendation writes it: one constant rate, rounded as written
    update: dict[str, Any] = {"rate_per_s": written_rate(rate_per_s)}
    update.update({k: None for k in ("rate_schedule", "rate_shape") if k in type(wl).model_fields})
    fixed = wl.model_copy(update=update)
    n0 = expected_requests(fixed, d0)
    bound = None
    if n0 > res.options.file_requests:
        share = w0 / d0
        warm, measure = needed_window_s(res, kind)
        d = max(
            d0 * res.options.file_requests / n0,  # the file's requests (a constant rate)
            measure / (1.0 - share) if share < 1.0 else math.inf,
            warm + measure,
        )
        w = _ceil4(max(share * _ceil4(d), warm))
        d = _ceil4(max(d, w + measure))
        if d < d0:
            sim["duration_s"], sim["warmup_s"], bound = d, w, "file_requests"
    n = expected_requests(fixed, float(sim["duration_s"]))
    if n > MAX_REQUESTS:
        # 0.9: rounding the shortened window to 4 digits must not cross the bound again
        shrink = 0.9 * MAX_REQUESTS / n
        sim["duration_s"] = float(f"{float(sim['duration_s']) * shrink:.4g}")
        sim["warmup_s"] = float(f"{float(sim.get('warmup_s', 0.0)) * shrink:.4g}")
        bound = "MAX_REQUESTS"
        n = expected_requests(fixed, float(sim["duration_s"]))
    return WrittenSim(sim, d0, bound, n)


def written_scenario(
    res: SearchResult, cand, rate_per_s: float, name: str | None = None
) -> dict[str, Any]:
    """The scenario recommended.yaml writes for ``cand`` at ``rate_per_s`` (rounded as
    written): the candidate's scenario at one constant rate with its ``sim`` section of
    :func:`written_sim`."""
    raw = candidate_scenario(res.loaded, cand, name=name)
    wl = dict(raw["workload"])
    wl["rate_per_s"] = written_rate(rate_per_s)
    for key in ("rate_schedule", "rate_shape", "rate_scale"):
        wl.pop(key, None)
    raw["workload"] = wl
    raw["sim"] = written_sim(res, cand.kind, rate_per_s).sim
    return raw


def written_horizon(res: SearchResult, kind: str, rate_per_s: float) -> Horizon:
    """The run recommended.yaml makes for a ``kind`` candidate at ``rate_per_s``, as a
    goodput run's horizon."""
    sim = SimConfig.model_validate(written_sim(res, kind, rate_per_s).sim)
    return Horizon(
        warmup_s=sim.warmup_s,
        measure_s=sim.duration_s - sim.warmup_s,
        drain_s=sim.max_drain_s,
    )


def _rival(rec: CandidateResult, advice) -> CandidateResult | None:
    """The best candidate of the other side: colocated against a disaggregated
    recommendation (the better of chunked and vllm), disaggregated against a colocated
    one."""
    if rec.candidate.kind == "disaggregate":
        colo = [r for r in (advice.best_chunked, advice.best_vllm) if r is not None]
        return max(colo, key=lambda r: r.goodput_per_gpu_per_s, default=None)
    return advice.best_disaggregated


def _written_searches(
    res: SearchResult,
    rows: list[CandidateResult],
    *,
    retest: bool,
    executor: Executor | None,
    progress: Callable[[int, int], None] | None,
) -> list[GoodputResult]:
    """Each row's goodput searched as its recommended.yaml would run (module docstring),
    down from the row's goodput as written; ``retest``: a trend-only miss is run again
    with a fresh seed, as the search does (the goodputs compared), or stands (the file's
    own seed decides: the rate it is written at)."""
    o = accuracy_options(res)
    start = res.num_simulations

    def on_progress(d: int, t: int) -> None:
        if progress is not None:
            progress(start + d, start + t)

    name = f"{res.loaded.scenario.name}-plan"
    sources = []
    for r in rows:
        raw = written_scenario(res, r.candidate, r.goodput_per_s, name=name)
        sources.append(source_of(load_scenario(raw, base_dir=res.loaded.base_dir), name))
    brackets = []
    for r in rows:
        lo = written_rate(r.goodput_per_s)
        brackets.append((lo, lo * (1.0 + o.tol_fraction)))
    return goodput_many(
        sources,
        brackets[0][0],
        brackets[0][1],
        brackets=brackets,
        bisected=[True] * len(rows),
        long_horizons=[functools.partial(written_horizon, res, r.candidate.kind) for r in rows],
        rate_digits=RATE_DIGITS,
        tol_fraction=o.tol_fraction,
        seeds=1,  # the file runs its own seed once
        rule=o.rule,
        retest=retest,
        executor=executor,
        progress=on_progress,
    )


def _above_checked(res: SearchResult) -> dict[str, list[CandidateResult]]:
    """Per kind with a checked candidate: its measured (not only screened), unchecked
    candidates whose search goodput per GPU lies above the kind's best checked one,
    highest first (for a target rate, among those that serve it)."""
    rows = list(res.ranked)
    rate = res.target_rate_per_s
    if rate is not None and any(r.as_written and r.goodput_per_s >= rate for r in rows):
        # a target rate's contenders serve it (a smaller deployment's goodput per GPU can
        # tie or beat theirs: plan.rank_for_rate)
        rows = [r for r in rows if r.goodput_per_s >= rate]
    top: dict[str, float] = {}
    for r in rows:
        if r.as_written is not None:
            k = r.candidate.kind
            top[k] = max(top.get(k, 0.0), r.goodput_per_gpu_per_s)
    out: dict[str, list[CandidateResult]] = {}
    for r in settled_rows(res, rows):  # a settled close call compares its own rows
        k = r.candidate.kind
        if (
            k in top
            and r.as_written is None
            and r.status != "explored"
            and r.goodput_per_gpu_per_s > top[k]
        ):
            out.setdefault(k, []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: -r.goodput_per_gpu_per_s)
    return out


def siblings_above(res: SearchResult) -> list[CandidateResult]:
    """The candidates the check runs next (module docstring): of each kind, the highest
    measured sibling whose search goodput per GPU lies above the kind's best checked
    one, while the kind has fewer than :data:`MAX_CHECKS_PER_KIND` checked."""
    checked: dict[str, int] = {}
    for r in res.ranked:
        if r.as_written is not None:
            checked[r.candidate.kind] = checked.get(r.candidate.kind, 0) + 1
    return [rows[0] for k, rows in _above_checked(res).items() if checked[k] < MAX_CHECKS_PER_KIND]


def own_seed_met(g: GoodputResult) -> bool:
    """Whether the run that backs ``g``'s goodput met with its own seed (not only by a
    retest's fresh seed after a trend-only miss)."""
    c = g.confirmation
    return c is not None and c.meets and c.retest is None


def check_as_written(
    res: SearchResult,
    *,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """``res`` with the candidates the advisor compares checked as written (module
    docstring): their goodputs lowered to rates their recommended.yaml meets, a trend-only
    miss retested with a fresh seed as the search retests (so both sides are compared on
    goodputs measured by one rule), their latencies those of that run,
    ``CandidateResult.as_written`` the check's search; the ranking sorted again. Repeats
    with the advice on the new ranking until every candidate it compares is checked. Then
    the recommendation's file: where its goodput was met only by a retest, the highest
    rate its own seed meets as written (``CandidateResult.file_check``, the rate
    recommended.yaml writes); where none is met, the recommendation serves nothing as
    written and the verdict is taken again."""
    from disaggsim.plan.advisor import advise

    while True:
        advice = advise(res)
        rec = advice.recommended
        if not advice.decided or rec is None or not rec.goodput_per_s > 0:
            return _others_note(res)
        todo = [
            r
            for r in (rec, _rival(rec, advice))
            if r is not None and r.goodput_per_s > 0 and r.as_written is None
        ]
        if not todo:  # each kind's best checked: a sibling its check fell under, next
            todo = siblings_above(res)
        if todo:
            checks = _written_searches(res, todo, retest=True, executor=executor, progress=progress)
            res = _with_checks(res, dict(zip([r.candidate for r in todo], checks, strict=True)))
            continue
        if rec.as_written is None or rec.file_check is not None or own_seed_met(rec.as_written):
            return _others_note(res)
        (f,) = _written_searches(res, [rec], retest=False, executor=executor, progress=progress)
        res = _with_file_check(res, rec, f)


def _with_file_check(res: SearchResult, rec: CandidateResult, f: GoodputResult) -> SearchResult:
    """``res`` with the recommendation's file searched on its own seed (``f``): the row
    keeps the goodput compared and takes the file's run as its latencies; a note says
    both rates. Where the file's seed met no rate, the row serves nothing as written."""
    rate = f.rate_per_s if math.isfinite(f.rate_per_s) else 0.0
    c = rec.as_written.confirmation if rec.as_written is not None else None
    p = "" if c is None or not math.isfinite(c.p_value) else f", p = {c.p_value:.2g}"
    head = (
        f"{rec.candidate.label}: its goodput of {rec.goodput_per_s:.6g} req/s, compared in "
        f"the verdict, was met as written by a run with a fresh seed after the file's own "
        f"seed ({res.loaded.scenario.seed}) flagged a growing queue with the attainment "
        f"met{p} (the search's retest of a trend-only miss)"
    )
    if rate > 0:
        row = dataclasses.replace(
            rec,
            file_check=f,
            at_rate=f.confirmation.summary if f.confirmation is not None else rec.at_rate,
        )
        note = f"{head}; recommended.yaml is written at {rate:.6g} req/s, the highest rate its seed meets"
    else:
        row = remeasured_row(rec, f, as_written=rec.as_written, file_check=f)
        note = f"{head}; its seed met no rate tried, down to {f.unattainable_below_per_s:.3g} req/s"
    rows = [row if r is rec else r for r in res.ranked]
    return dataclasses.replace(
        res,
        ranked=rank_checked(rows, res.target_rate_per_s),
        num_simulations=res.num_simulations + f.num_runs,
        num_as_written_runs=res.num_as_written_runs + f.num_runs,
        notes=(*res.notes, note),
    )


def _with_checks(res: SearchResult, checks: dict[Any, GoodputResult]) -> SearchResult:
    """``res`` with each checked candidate's goodput, latencies and cost from its check,
    and a note for each one its check lowered."""
    rows, notes = [], []
    for r in res.ranked:
        g = checks.get(r.candidate)
        if g is None:
            rows.append(r)
            continue
        rows.append(remeasured_row(r, g, as_written=g))
        if g.status != "found":
            notes.append(lowered_note(res, r, g))
    checked = sum(g.num_runs for g in checks.values())
    return dataclasses.replace(
        res,
        ranked=rank_checked(rows, res.target_rate_per_s),
        num_simulations=res.num_simulations + checked,
        num_as_written_runs=res.num_as_written_runs + checked,
        notes=res.notes + tuple(notes),
    )


def remeasured_row(r: CandidateResult, g: GoodputResult, **fields: Any) -> CandidateResult:
    """Row ``r`` with the goodput ``g`` measured again (its rate, per GPU, the rate its
    confirmation ran at, $ per million output tokens scaled to the new rate) and ``fields``
    (which measurement it was: ``as_written`` or the close-call confirmation's)."""
    rate = g.rate_per_s if math.isfinite(g.rate_per_s) else 0.0
    at = g.confirmation.summary if g.confirmed and g.confirmation is not None else None
    return at_rate_row(r, rate, at_rate=at, **fields)


def at_rate_row(r: CandidateResult, rate_per_s: float, **fields: Any) -> CandidateResult:
    """Row ``r`` at goodput ``rate_per_s``: per GPU and $ per million output tokens scaled
    to it (None where it serves nothing), and ``fields``."""
    usd = r.usd_per_m_output_tokens
    if usd is not None:
        usd = usd * r.goodput_per_s / rate_per_s if rate_per_s > 0 else None
    return dataclasses.replace(
        r,
        goodput_per_s=rate_per_s,
        goodput_per_gpu_per_s=rate_per_s / r.candidate.num_gpus,
        usd_per_m_output_tokens=usd,
        **fields,
    )


def rank_checked(
    rows: list[CandidateResult], target_rate_per_s: float | None = None
) -> tuple[CandidateResult, ...]:
    """:func:`~disaggsim.plan.search.rank_rows`, a checked candidate before an unchecked
    one of the same goodput; for a target rate, those that serve it first
    (:func:`~disaggsim.plan.rank_for_rate`). No unchecked candidate is ranked below its
    own goodput: the check runs siblings whose search goodput lies above their kind's
    checked one (:func:`siblings_above`) rather than cap them at it (module docstring)."""
    first = {r.candidate: n for n, r in enumerate(rank_rows(rows))}

    def key(r: CandidateResult) -> tuple:
        return (
            r.status == "explored",
            target_rate_per_s is not None and r.goodput_per_s < target_rate_per_s,
            -r.goodput_per_gpu_per_s,
            r.as_written is None,
            first[r.candidate],
        )

    return tuple(sorted(rows, key=key))


def _others_note(res: SearchResult) -> SearchResult:
    """``res`` with one more note where some candidates were checked and others were
    not: the others' goodputs are the search's, and what the checked ones kept of theirs."""
    searched = [(r, r.goodput.rate_per_s) for r in res.ranked if r.as_written and r.goodput]
    others = [r for r in res.ranked if r.as_written is None and r.goodput_per_s > 0]
    if not searched or not others:
        return res
    above = [r for rows in _above_checked(res).values() for r in rows]
    if above:  # past MAX_CHECKS_PER_KIND: said, not capped
        res = dataclasses.replace(
            res,
            notes=(
                *res.notes,
                f"the check as written ran at most {MAX_CHECKS_PER_KIND} candidates of a kind: "
                + ", ".join(f"{r.candidate.label} ({r.goodput_per_gpu_per_s:.4g})" for r in above)
                + " measured above their kind's best checked goodput per GPU and were not "
                "run as written; the verdict compares the checked ones",
            ),
        )
    kept = [r.goodput_per_s / rate for r, rate in searched if rate > 0]
    lo, hi = min(kept, default=0.0), max(kept, default=0.0)
    share = f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}-{hi:.0%}"
    note = (
        "only the candidates the verdict compares were run as their recommended.yaml "
        "would be (search: as written); the other rows' goodputs are the search's, from "
        f"shorter runs: the checked ones met {share} of theirs as written"
    )
    return dataclasses.replace(res, notes=(*res.notes, note))


def lowered_note(res: SearchResult, r: CandidateResult, g: GoodputResult) -> str:
    """One line: ``r`` missed as written at its search's goodput, and what it met."""
    first = g.evaluations[0]
    s = first.summary
    how = (
        "stopped once it certainly missed"
        if first.num_stopped_early
        else (
            f"attainment {first.attainment:.3f}"
            + ("" if first.stable else ", queue growing")
            + (f", TTFT p99 {s.ttft_p99_s:.3g} s" if s is not None else "")
        )
    )
    sim = written_horizon(res, r.candidate.kind, first.rate_per_s)
    head = (
        f"{r.candidate.label} missed as written ({sim.duration_s:g} s of arrivals, "
        f"seed {res.loaded.scenario.seed}) at its search's goodput {first.rate_per_s:.6g} req/s "
        f"({how})"
    )
    if g.rate_per_s > 0:
        return f"{head}: its goodput is {g.rate_per_s:.6g} req/s, the highest rate met there"
    return f"{head} and at every rate tried down to {g.unattainable_below_per_s:.3g} req/s"
