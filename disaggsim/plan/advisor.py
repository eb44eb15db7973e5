"""The advisor: a verdict and plain-language reasons from the search's numbers.

The verdict is the kind of the best-ranked candidate, except that disaggregation must
beat the best colocated candidate by at least :data:`MIN_GAIN` (a margin above the
bisection tolerance, 1 %) to be recommended: two pools and a KV fabric are more to run
than one pool, so a tie goes to the simpler deployment. It is not far above run-to-run
noise: one full-accuracy goodput moves by about 2.5-6 % (one sd) with the seed, a ratio
of two by 3.5-9 % (docs/sweeps.md, "How much a goodput moves"), so a margin a few %
either side of the line is a close call another seed could turn.

The reasons name the conditions under which disaggregation pays (docs/design.md, "When
disaggregation should win or lose") and say for each whether it holds here:

- **long prompts**: a mean prompt's prefill (at its TP) is at least
  :data:`LONG_PROMPT_STEPS` decode steps (at the typical batch) long;
- **tight ITL tail**: the ITL target costs a loaded colocated pool at least
  :data:`MIN_GAIN`: the largest step within it that carries decodes and their share of
  prompt tokens serves a colocated GPU that much less than split pools serve per GPU
  (:func:`~disaggsim.plan.analytic.colocated_step_within_itl`); for a largest-gap target
  (``max_gap``) also when a p90 prompt's prefill alone, one unchunked stall, is over it;
- **large fleet**: the budget holds at least :data:`LARGE_FLEET_WORKERS` of the smallest
  workers that fit (fewer than 2: disaggregation cannot exist at all);
- **fast fabric**: the link is NVLink, InfiniBand or RoCE (RDMA), not PCIe; the handoff
  of a mean prompt's KV is quoted against its prefill time;
- **concurrency**: at the best candidate's goodput, Little's law (rate × mean end-to-end
  time) keeps at least :data:`HIGH_CONCURRENCY_PER_WORKER` requests in flight per worker.

Where the requests carry prefix chains (traces with ``hash_ids``, session workloads) a
sixth line, **prefix reuse**, says what share of prompt tokens the prefill pool is
expected to find cached and how that moves the prefill work and the P:D ratio; it holds
(and the reason repeats it) when that share is at least :data:`REUSE_MATTERS`. It is not a
condition for disaggregation: reuse shrinks prefill for both architectures.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from disaggsim.config.bounds import MAX_SEEDS
from disaggsim.config.scenario import Scenario
from disaggsim.costmodel.kv import kv_transfer, link_bandwidth_bytes_per_s
from disaggsim.errors import UserError
from disaggsim.fabric import FabricTopologyConfig, PlacementConfig, build_topology, pool_layouts
from disaggsim.fabric.estimate import estimate_handoff
from disaggsim.plan.analytic import Layout, colocated_step_within_itl, worker_cost
from disaggsim.plan.search import (
    CandidateResult,
    SearchResult,
    colocated_cache_ok,
    pool_limits,
    rank_rows,
    settled_rows,
)
from disaggsim.sweep.goodput import SEED_SPREAD

__all__ = [
    "HIGH_CONCURRENCY_PER_WORKER",
    "QUICK_UNCERTAINTY",
    "LARGE_FLEET_WORKERS",
    "REUSE_MATTERS",
    "LONG_PROMPT_STEPS",
    "MIN_GAIN",
    "SEED_SPREAD",
    "Advice",
    "Condition",
    "QuickMargin",
    "advise",
    "close_call_band",
    "fabric_name",
    "quick_margin",
    "stopped_band",
    "stopped_family_doubt",
]

MIN_GAIN = 0.05
# quick mode's error on a goodput-per-GPU ratio (its 4 % bisection tolerance plus the
# spread of its shorter runs, docs/planning.md): inside MIN_GAIN +- this it says
# "undecided" instead of a verdict
QUICK_UNCERTAINTY = 0.15
LONG_PROMPT_STEPS = 10.0
LARGE_FLEET_WORKERS = 4
HIGH_CONCURRENCY_PER_WORKER = 4.0
REUSE_MATTERS = 0.10  # an expected prefix hit share from which the reason mentions reuse


@dataclass(frozen=True, slots=True)
class Condition:
    name: str  # long_prompts | tight_itl_tail | large_fleet | fast_fabric | concurrency
    # | prefix_reuse (only for workloads with prefix chains; not a disaggregation condition)
    holds: bool
    detail: str


VERDICTS = ("disaggregate", "colocate_chunked", "colocate_vllm", "undecided", "none")


@dataclass(frozen=True, slots=True)
class QuickMargin:
    """What a quick plan's quoted gain is (:func:`quick_margin`): ``uncertainty`` the
    error of quick goodputs on a ratio (:data:`QUICK_UNCERTAINTY`; None where both
    figures compared were measured again at full accuracy), ``stopped`` the families of
    the losing side that quick mode's floor stopped before they settled (their best may
    lie higher, so the margin can be smaller than quoted, never larger by the search)."""

    losing_side: str  # disaggregate | colocate
    uncertainty: float | None
    stopped: tuple[str, ...]

    def note(self) -> str:
        """The clause the reason puts after the margin."""
        side = "disaggregated" if self.losing_side == "disaggregate" else "colocated"
        parts = []
        if self.uncertainty is not None:
            parts.append(f"quick mode's figures, good to about +-{self.uncertainty:.0%}")
        else:
            parts.append("the two figures measured again at full accuracy")
        if self.stopped:
            n = len(self.stopped)
            parts.append(
                f"{'but ' if self.uncertainty is None else ''}quick mode stopped "
                f"{n} {side} famil{'y' if n == 1 else 'ies'} ({', '.join(self.stopped)}) "
                "once behind the best, so that side may serve more and the margin be smaller"
            )
        if self.uncertainty is None and not self.stopped:
            return parts[0]
        return "; ".join(parts) + ": run without --quick for the margin"

    def as_dict(self) -> dict[str, Any]:
        return {
            "measured": "quick" if self.uncertainty is not None else "full_accuracy",
            "uncertainty": self.uncertainty,
            "losing_side": self.losing_side,
            "losing_side_stopped_families": list(self.stopped),
            "note": self.note(),
        }


@dataclass(frozen=True, slots=True)
class Advice:
    """``verdict``: a kind of deployment; ``undecided`` (quick mode could not tell:
    run full mode); ``none`` (no deployment in the budget meets the SLOs at any rate).
    ``recommended`` is the best candidate found (None when none meets the SLOs); a
    runnable scenario is written for it only with a decided verdict."""

    verdict: str  # one of VERDICTS
    reason: str
    recommended: CandidateResult | None
    best_disaggregated: CandidateResult | None
    best_chunked: CandidateResult | None
    best_vllm: CandidateResult | None
    disaggregation_gain: float | None  # best disagg / best colocated goodput per GPU - 1
    conditions: tuple[Condition, ...]
    # a quick plan's quoted gain is quick mode's figure (margin_note says how far to
    # trust it, :func:`quick_margin`); None: full mode, or no gain quoted
    margin: QuickMargin | None = None
    # a full-accuracy gain within this of MIN_GAIN (:func:`close_call_band`); None: not
    # a close call, a quick figure, or no gain quoted
    close_call_band: float | None = None

    @property
    def decided(self) -> bool:
        return self.verdict not in ("undecided", "none")

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "decided": self.decided,
            "reason": self.reason,
            "recommended": self.recommended.as_dict() if self.recommended else None,
            "disaggregation_gain": self.disaggregation_gain,
            # how far a quick plan's gain can be trusted (None: full mode, or no gain)
            "margin": None if self.margin is None else self.margin.as_dict(),
            "close_call_band": self.close_call_band,
            "conditions": [
                {"name": c.name, "holds": c.holds, "detail": c.detail} for c in self.conditions
            ],
        }


def fabric_name(scenario: Scenario) -> str:
    """The scenario's KV link class, or ``topology`` for a ``kind: topology`` fabric."""
    fab = scenario.fabric
    return "topology" if isinstance(fab, FabricTopologyConfig) else fab.link


def _mean_handoff(res: SearchResult, tp: int, nbytes: float) -> tuple[str, float, float]:
    """(link, seconds, bytes/s per GPU) of one uncontended handoff of ``nbytes`` between
    a prefill and a decode worker of ``tp`` GPUs each (bytes/s 0: no such link).

    ``kind: link``: the link class at its (or the given) bandwidth, one shard per GPU.
    ``kind: topology``: a prefill and a decode worker placed by the fabric's placement
    policy (an explicit placement names the scenario's own workers, so the pair is packed
    instead), moved by the fabric model (:func:`disaggsim.fabric.estimate.estimate_handoff`);
    the link is the path's link class."""
    fab = res.loaded.scenario.fabric
    if isinstance(fab, FabricTopologyConfig):
        if fab.placement.explicit is not None:
            fab = fab.model_copy(update={"placement": PlacementConfig()})
        layouts = pool_layouts([("prefill", res.gpu, 1, tp), ("decode", res.gpu, 1, tp)])
        try:
            est = estimate_handoff(build_topology(fab, layouts), 0, 1, nbytes)
        except UserError:
            return "topology", 0.0, 0.0
        serial = est.transfer_s - est.latency_s
        return est.link, est.transfer_s, nbytes / serial / tp if serial > 0 else 0.0
    try:
        bw = (
            fab.bandwidth_gb_per_s * 1e9
            if fab.bandwidth_gb_per_s
            else link_bandwidth_bytes_per_s(fab.link, res.gpu)
        )
    except UserError:
        bw = 0.0
    if bw <= 0:
        return fab.link, 0.0, 0.0
    return fab.link, kv_transfer(nbytes / tp, fab.link, bandwidth_bytes_per_s=bw).time_s, bw


def _best(res: SearchResult, kind: str) -> CandidateResult | None:
    """The best candidate of ``kind``: the first ranked of those checked as written, if
    any (the plan checks the best of a kind by the search's goodputs, then any measured
    sibling whose search goodput its check fell under, and ranks them by their checked
    goodputs: plan/holds.py), else the first ranked of those measured again at full
    accuracy (plan/confirm.py: it measures every
    candidate whose quick goodput was above its side's best at full accuracy), else the
    first ranked; of a close call settled at more seeds, among the rows it measured
    (:func:`~disaggsim.plan.search.settled_rows`)."""
    rows = settled_rows(res, [r for r in res.ranked if r.candidate.kind == kind])
    return next(  # the ranking puts the highest checked goodput first (plan/holds.py)
        (r for r in rows if r.as_written is not None),
        next((r for r in rows if r.full_accuracy), rows[0] if rows else None),
    )


def conditions(res: SearchResult, rec: CandidateResult | None = None) -> tuple[Condition, ...]:
    """The conditions for disaggregation (module docstring); the concurrency line is that
    of ``rec``, the recommended deployment (default: the best ranked), so that its
    figures are the recommendation's."""
    g = res.analytic
    pcost = worker_cost(res.loaded, res.gpu, g.prefill_layout)
    p_mean = int(round(g.prompt_tokens_mean))
    p90 = int(round(g.prompt_tokens_p90))
    pre_mean_s = pcost.prefill_time_s(1, p_mean, p_mean * (p_mean + 1) / 2.0)
    pre_p90_s = pcost.prefill_time_s(1, p90, p90 * (p90 + 1) / 2.0)
    steps = pre_mean_s / g.decode_step_s
    out = [
        Condition(
            "long_prompts",
            steps >= LONG_PROMPT_STEPS,
            f"a mean prompt ({p_mean} tokens) takes {pre_mean_s * 1e3:.0f} ms to prefill = "
            f"{steps:.1f} decode steps of {g.decode_step_s * 1e3:.1f} ms "
            f"(long when >= {LONG_PROMPT_STEPS:g})",
        ),
        _tight_itl_tail(res, pre_p90_s),
    ]
    workers = res.gpu_budget // res.min_worker_gpus
    unit = (
        f"tp{res.min_worker_gpus}"
        if g.prefill_dp == 1 and g.decode_dp == 1
        else f"{res.min_worker_gpus} GPUs"
    )
    if workers < 2:
        fleet = (
            f"{res.gpu_budget} GPU{'s hold' if res.gpu_budget > 1 else ' holds'} "
            f"{workers} worker of {unit}: "
            "disaggregation needs at least 2 workers (one per pool) and cannot exist here"
        )
    else:
        fleet = (
            f"{res.gpu_budget} GPUs hold {workers} workers of {unit} "
            f"(large when >= {LARGE_FLEET_WORKERS}: enough to split near the "
            f"{g.pd_gpu_ratio:.2f} P:D ratio)"
        )
    out.append(Condition("large_fleet", workers >= LARGE_FLEET_WORKERS, fleet))
    nbytes = pcost.kv_bytes_per_token * p_mean
    link, time_s, bw = _mean_handoff(res, g.prefill_tp, nbytes)
    if bw > 0:
        fabric = (
            f"{link} at {bw / 1e9:.0f} GB/s per GPU: a mean prompt's KV "
            f"({nbytes / 1e9:.2f} GB) moves in {time_s * 1e3:.1f} ms "
            f"= {time_s / pre_mean_s:.0%} of its prefill"
        )
    else:
        fabric = f"{link} is not available on {res.gpu}"
    out.append(Condition("fast_fabric", link != "pcie" and bw > 0, fabric))
    best = rec if rec is not None else res.ranked[0]
    e2e = None if best.at_rate is None else best.at_rate.e2e_mean_s
    if e2e is not None and best.goodput_per_s > 0:
        n_workers = best.candidate.num_prefill_workers + best.candidate.num_decode_workers
        # a target-rate question serves that rate, not the goodput: in flight at the rate
        # (with the end-to-end time at the goodput, an upper bound at a lower rate)
        target = res.target_rate_per_s
        at_target = target is not None and target < best.goodput_per_s
        rate = target if at_target and target is not None else best.goodput_per_s
        per_worker = rate * float(e2e) / n_workers
        where = (
            f"at most, at the target rate ({float(e2e):.1f} s is the end-to-end time at "
            f"{best.candidate.label}'s goodput, {best.goodput_per_s:.3g} req/s)"
            if at_target
            else f"at {best.candidate.label}'s goodput"
        )
        out.append(
            Condition(
                "concurrency",
                per_worker >= HIGH_CONCURRENCY_PER_WORKER,
                f"{rate:.3g} req/s x {float(e2e):.1f} s end-to-end = "
                f"{per_worker:.1f} requests in flight per worker {where} "
                f"(high when >= {HIGH_CONCURRENCY_PER_WORKER:g})",
            )
        )
    else:
        out.append(
            Condition("concurrency", False, "no candidate met the SLOs at any rate searched")
        )
    reuse = _reuse(res)
    if reuse is not None:
        out.append(reuse)
    return tuple(out)


def _colocated_layouts(res: SearchResult) -> list[Layout]:
    """The worker layouts of the colocated candidates searched (the analytic prefill
    layout where there are none)."""
    lays = [r.candidate.prefill_layout for r in res.ranked if r.candidate.kind != "disaggregate"]
    return list(dict.fromkeys(lays)) or [res.analytic.prefill_layout]


def _tight_itl_tail(res: SearchResult, pre_p90_s: float) -> Condition:
    """Whether the ITL target costs a colocated pool what a second pool would not: the
    largest step within the target that carries decodes and their share of prompt tokens
    (:func:`~disaggsim.plan.analytic.colocated_step_within_itl`, the best of the colocated
    layouts searched) serves a colocated GPU at least :data:`MIN_GAIN` less than split
    pools serve per GPU (the analytic guess: prefill at full batches, decode at the
    typical batch). ``max_gap`` (a request's largest gap) also holds when a p90 prompt's
    prefill alone is over the target (one gap of every reply an unchunked prefill
    stalls). Before, a TPOT target compared one p90 prefill spread over a reply's gaps,
    which never held under load, where a reply's gaps carry many other prompts' prefill:
    llama-3.1-8b on 16 H100, TPOT 30 ms, lognormal 4000-token prompts (docs/planning.md
    §7, 1003-6) disaggregated +33 % with the condition reading 1.2 ms."""
    s = res.loaded.scenario
    g = res.analytic
    itl_s = s.slo.itl_s
    gpu = res.gpu
    best = None
    for lay in _colocated_layouts(res):
        try:  # the KV a chunked pool of that layout holds (its limits size the reserve)
            cost = worker_cost(
                res.loaded, gpu, lay, limits=pool_limits(res.loaded, lay, "colocate_chunked")
            )
        except UserError:
            continue
        pool = s.pool or s.decode_pool
        max_b = pool.max_batch_seqs if pool is not None else 256
        st = colocated_step_within_itl(
            cost, g.prompt_tokens_mean, g.output_tokens_mean, itl_s, max_b
        )
        if best is None or st.capacity_per_gpu_per_s > best[1].capacity_per_gpu_per_s:
            best = (lay, st)
    split = g.capacity_per_gpu_per_s
    stat = s.slo.itl_statistic
    stall = pre_p90_s > itl_s if stat == "max_gap" else False
    head = f"ITL target {itl_s * 1e3:.0f} ms ({stat})"
    if stat == "max_gap":
        head += (
            f" vs a p90 prompt's prefill of {pre_p90_s * 1e3:.0f} ms (one gap of a reply it stalls)"
        )
    if best is None:
        return Condition("tight_itl_tail", stall, head)
    lay, st = best
    if st.decodes == 0:
        return Condition(
            "tight_itl_tail",
            True,
            f"{head}: a colocated {lay.tag} step of one decode and its {st.prompt_tokens} "
            f"prompt tokens takes {st.step_s * 1e3:.1f} ms, over the target",
        )
    colo = st.capacity_per_gpu_per_s
    gain = split / colo - 1.0 if colo > 0 else float("inf")
    return Condition(
        "tight_itl_tail",
        stall or gain >= MIN_GAIN,
        f"{head}: a colocated {lay.tag} step within it carries {st.decodes} decodes and "
        f"{st.prompt_tokens} prompt tokens ({st.step_s * 1e3:.1f} ms), so a colocated GPU "
        f"serves {colo:.3g} req/s against {split:.3g} for split pools (analytic): "
        f"{gain:+.0%} for disaggregation (tight when >= +{MIN_GAIN:.0%})",
    )


def _reuse(res: SearchResult) -> Condition | None:
    """The prefix-reuse line (None when the requests carry no prefix chains)."""
    allowed = res.reuse_share_unbounded
    if allowed is None:
        return None
    g = res.analytic
    share = g.prefix_hit_share
    if share <= 0:
        return Condition(
            "prefix_reuse",
            False,
            f"the requests repeat prefixes ({allowed:.0%} of prompt tokens an unbounded "
            "cache would hold), but this scenario does not cache them (no cache: section), "
            "so the plan assumes every prompt token is prefilled",
        )
    pre0 = g.prefill_gpu_s_no_reuse
    ratio0 = pre0 / g.decode_gpu_s_per_request
    return Condition(
        "prefix_reuse",
        share >= REUSE_MATTERS,
        f"an expected {share:.0%} of prompt tokens are cached in the prefill pool "
        f"({allowed:.0%} with an unbounded cache): prefill {pre0 * 1e3:.1f} -> "
        f"{g.prefill_gpu_s_per_request * 1e3:.1f} GPU-ms per request, P:D GPU ratio "
        f"{ratio0:.2f} -> {g.pd_gpu_ratio:.2f} (matters when >= {REUSE_MATTERS:.0%})"
        + (
            ""
            if colocated_cache_ok(res.loaded)
            else "; colocated candidates ran without a prefix cache (the simulator caches "
            "colocated pools only with kv.admission on_demand and kv.preemption recompute), "
            "which favours disaggregation here"
        ),
    )


def why_none(res: SearchResult) -> str:
    """Why nothing met the SLOs, where one request alone already misses a target on
    every worker layout searched: a decode step of batch 1 at the mean context over the
    ITL target, or a mean prompt's prefill over the TTFT target (the fastest layout's
    figure, quoted); else the generic advice, with those figures."""
    from disaggsim.plan.search import _with_dtype

    s = res.loaded.scenario
    g = res.analytic
    ctx = max(1, int(round(g.decode_context_tokens_mean)))
    p = max(1, int(round(g.prompt_tokens_mean)))
    pre: set = set()
    dec: set = set()
    for r in res.ranked:
        c = r.candidate
        pre.add((c.weight_dtype, c.prefill_layout))
        dec.add((c.weight_dtype, c.decode_layout if c.kind == "disaggregate" else c.prefill_layout))
    costs = {
        key: worker_cost(_with_dtype(res.loaded, key[0]), res.gpu, key[1]) for key in pre | dec
    }
    step_s, step_lay = min(
        ((costs[k].decode_time_s(1, ctx), k[1]) for k in dec),
        key=lambda t: t[0],
        default=(0.0, None),
    )
    fill_s, fill_lay = min(
        ((costs[k].prefill_time_s(1, p, p * (p + 1) / 2.0), k[1]) for k in pre),
        key=lambda t: t[0],
        default=(0.0, None),
    )
    itl_s, ttft_s = s.slo.itl_s, s.slo.ttft_s
    out = []
    if step_lay is not None and step_s > itl_s:
        out.append(
            f"a decode step of one request alone ({ctx} tokens of context) takes "
            f"{_ms(step_s)} ms on the fastest worker searched ({step_lay.tag}), over the "
            f"ITL target of {_ms(itl_s)} ms"
        )
    if fill_lay is not None and fill_s > ttft_s and g.prefix_hit_share <= 0:
        out.append(
            f"a mean prompt's prefill alone ({p} tokens) takes {_ms(fill_s)} ms on the "
            f"fastest worker searched ({fill_lay.tag}), over the TTFT target of "
            f"{_ms(ttft_s)} ms"
        )
    if out:
        return (
            f"{'; '.join(out)}: relax {'that target' if len(out) == 1 else 'those targets'}, "
            "or use a faster GPU, smaller weights (weight_dtype) or shorter requests"
        )
    alone = (
        f" (one request alone fits them: the fastest decode step {_ms(step_s)} ms "
        f"against the ITL target of {_ms(itl_s)} ms, a mean prompt's prefill "
        f"{_ms(fill_s)} ms against the TTFT target of {_ms(ttft_s)} ms)"
        if step_lay is not None and fill_lay is not None
        else ""
    )
    return f"relax the SLO targets or change the model or GPU{alone}"


def _ms(seconds: float) -> str:
    """Milliseconds as a reason quotes them: ``57.1``, ``921``, ``2,000``."""
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.0f}%"


def advise(res: SearchResult) -> Advice:
    """The verdict for a finished search (see the module docstring for the rule)."""
    adv = _advise(res)
    if not res.ranked or res.ranked[0].goodput_per_s <= 0:
        lowest = min(
            (
                r.goodput.unattainable_below_per_s
                for r in res.ranked
                if r.goodput is not None and r.goodput.unattainable_below_per_s is not None
            ),
            default=None,
        )
        at = f" (missed even at {lowest:.3g} req/s)" if lowest is not None else ""
        return dataclasses.replace(
            adv,
            verdict="none",
            recommended=None,
            reason=(
                f"no deployment of {res.gpu_budget} x {res.gpu} searched meets the SLOs at any "
                f"rate{at}: {why_none(res)}"
            ),
        )
    if res.options.quick_mode:
        conf = res.confirmation
        if conf is not None:
            # the figures compared were measured again at full accuracy (plan/confirm.py):
            # full mode's rule decides; only a doubt those runs cannot remove stays
            why = (
                open_family_doubt(res, adv)
                or stopped_family_doubt(res, adv)
                or left_over_doubt(res, adv)
            )
            if why is None:
                rivals = left_over_rivals(res, adv)
                tail = f"; {rivals}" if rivals else ""
                return dataclasses.replace(adv, reason=f"{adv.reason}; {conf.sentence()}{tail}")
            return dataclasses.replace(
                adv,
                verdict="undecided",
                reason=(
                    f"undecided: quick mode cannot tell ({why}); {conf.sentence()}, which "
                    f"cannot settle that; run without --quick. Best found so far: {adv.reason}"
                ),
            )
        why = _quick_doubt(res, adv)
        if why is None:
            return adv
        return dataclasses.replace(
            adv,
            verdict="undecided",
            reason=(
                f"undecided: quick mode cannot tell ({why}); run without --quick. "
                f"Best found so far: {adv.reason}"
            ),
        )
    return adv


def _quick_doubt(res: SearchResult, adv: Advice) -> str | None:
    """Why quick mode's verdict cannot be trusted, or None: :func:`close_gain_doubt`,
    :func:`open_family_doubt` and :func:`stopped_family_doubt`, each that applies."""
    why = [
        d
        for d in (
            close_gain_doubt(adv),
            open_family_doubt(res, adv),
            stopped_family_doubt(res, adv),
        )
        if d is not None
    ]
    return "; and ".join(why) or None


def stopped_band(res: SearchResult) -> float:
    """How far from :data:`MIN_GAIN` a quick gain can lie and still be turned by the
    losing side's families its floor stopped: the figures' own error
    (:data:`QUICK_UNCERTAINTY`) plus the share behind the best at which the floor stops a
    family (``1 - explore_floor``, 15 %), 30 % in quick mode."""
    return QUICK_UNCERTAINTY + max(0.0, 1.0 - res.options.explore_floor)


def stopped_families_in_doubt(res: SearchResult, adv: Advice) -> tuple[str, ...]:
    """The losing side's families that quick mode's floor stopped while they could turn
    its verdict (docs/planning.md §3, "Quick margins"): a stopped family's best can only
    be higher than found, so one is in doubt where the gain its best found gives against
    the winning side's best lies within :func:`stopped_band` of :data:`MIN_GAIN`, and its
    ceiling (its bound x the slack pruning allows) reaches the line. Judged on the
    search's goodputs, those the floor stopped it on (the check as written can lower a
    recommendation's later, plan/holds.py, and must not turn a judged doubt). Empty
    outside quick mode, where no gain is quoted, or where none is stopped."""
    qm = adv.margin
    dis = adv.best_disaggregated
    if adv.disaggregation_gain is None or qm is None or not qm.stopped or dis is None:
        return ()
    if not res.options.quick_mode:
        return ()
    band = stopped_band(res)
    dis_best = _searched(dis)
    colo = max(
        (_searched(r) for r in (adv.best_chunked, adv.best_vllm) if r is not None), default=0
    )
    if not (dis_best > 0 and colo > 0):
        return ()
    found: dict[str, float] = {}
    for r in res.ranked:
        name = res.family_of.get(r.candidate)
        if name is not None:
            found[name] = max(found.get(name, 0.0), _searched(r))
    out = []
    for name in qm.stopped:
        ceiling = res.family_bounds.get(name, 0.0) * res.options.bound_slack
        if qm.losing_side == "disaggregate":
            # where no member of it is ranked, the side's best (no lower than its own)
            fam_gain = found.get(name, dis_best) / colo - 1
            doubt = fam_gain > MIN_GAIN - band and ceiling >= colo * (1 + MIN_GAIN)
        else:
            best = found.get(name, colo)
            fam_gain = dis_best / best - 1 if best > 0 else float("inf")
            doubt = fam_gain < MIN_GAIN + band and ceiling * (1 + MIN_GAIN) >= dis_best
        if doubt:
            out.append(name)
    return tuple(out)


def _searched(r: CandidateResult) -> float:
    """A candidate's goodput per GPU as its search measured it (before any lowering by
    the check as written)."""
    g = r.goodput
    if g is not None and math.isfinite(g.per_gpu_per_s):
        return float(g.per_gpu_per_s)
    return r.goodput_per_gpu_per_s


def stopped_family_doubt(res: SearchResult, adv: Advice) -> str | None:
    """Doubt (or None): :func:`stopped_families_in_doubt`. Walking those families on
    (plan/confirm.py) removes it; without that walk the plan stays undecided."""
    names = stopped_families_in_doubt(res, adv)
    if not names or adv.disaggregation_gain is None:
        return None
    n = len(names)
    return (
        f"disaggregation's gain of {adv.disaggregation_gain:+.0%} goodput per GPU lies "
        f"within {stopped_band(res):.0%} of the {MIN_GAIN:.0%} needed for a second pool "
        f"while its floor stopped {n} famil{'y' if n == 1 else 'ies'} of the losing side "
        f"({', '.join(names)}) that could still reach it"
    )


def close_gain_doubt(adv: Advice) -> str | None:
    """Doubt (or None): disaggregation's gain is within :data:`QUICK_UNCERTAINTY` of
    :data:`MIN_GAIN`. Measuring the candidates compared again at full accuracy
    (plan/confirm.py) removes it."""
    gain = adv.disaggregation_gain
    if gain is not None and abs(gain - MIN_GAIN) < QUICK_UNCERTAINTY:
        return (
            f"disaggregation's gain of {gain:+.0%} goodput per GPU lies within its "
            f"+-{QUICK_UNCERTAINTY:.0%} error of the {MIN_GAIN:.0%} needed for a second pool"
        )
    return None


def open_family_doubt(res: SearchResult, adv: Advice) -> str | None:
    """Doubt (or None): a family of the losing side was left open by the wave limit
    while its bound could still beat the winner. No re-measurement of the candidates
    found removes it (the family's members were never searched)."""
    winner = "disaggregate" if adv.verdict == "disaggregate" else "colocate"
    best = adv.recommended.goodput_per_gpu_per_s if adv.recommended else 0.0
    for name, state in res.families.items():
        kind = res.family_kinds.get(name, "")
        losing = (kind == "disaggregate") != (winner == "disaggregate")
        bound = res.family_bounds.get(name, 0.0) * res.options.bound_slack
        if state == "open" and losing and bound > best * (1 - QUICK_UNCERTAINTY):
            return (
                f"its bounded search stopped with family {name} unsettled, whose bound "
                f"({bound:.3g} req/s per GPU) could still beat the best ({best:.3g})"
            )
    return None


def left_over_doubt(res: SearchResult, adv: Advice) -> str | None:
    """Doubt (or None): the confirmation's cap (``PlanOptions.confirm_max_candidates``)
    left a candidate unmeasured that would change the verdict under full mode's rule
    were its quick goodput per GPU its full-accuracy one — a candidate of the losing
    side, or of the other colocated kind (chunked against vllm) — or left the
    recommendation itself at its quick figure."""
    conf = res.confirmation
    if conf is None or not conf.left_over:
        return None
    rec = adv.recommended.candidate if adv.recommended is not None else None
    for c, quick in conf.left_over:
        if c == rec:
            return (
                f"the confirmation measured at most {conf.options.confirm_max_candidates} "
                f"candidates and left the recommendation {c.label} at its quick goodput "
                f"({quick:.3g} req/s per GPU)"
            )
        if _advise(_taken_as_measured(res, c)).verdict != adv.verdict:
            return (
                f"the confirmation measured at most {conf.options.confirm_max_candidates} "
                f"candidates and left {c.label} unmeasured, whose quick goodput "
                f"({quick:.3g} req/s per GPU) would change the verdict"
            )
    return None


def _taken_as_measured(res: SearchResult, c: Any) -> SearchResult:
    """``res`` with candidate ``c``'s row counted as its kind's best is counted (found,
    measured at full accuracy, and checked as written where that best was), at its
    quick goodput: would it be the kind's best, and would that change the verdict?"""
    best = _best(res, c.kind)
    rows = [
        dataclasses.replace(
            r,
            status="found",
            full_accuracy=True,
            as_written=best.as_written if best is not None else None,
        )
        if r.candidate == c
        else r
        for r in res.ranked
    ]
    return dataclasses.replace(res, ranked=rank_rows(rows))


def left_over_rivals(res: SearchResult, adv: Advice) -> str | None:
    """A clause (or None) naming the candidates of the recommendation's kind that the
    confirmation's cap left unmeasured although their quick goodput per GPU beats the
    recommendation's: the verdict stands, but another chunk or split may serve more."""
    conf, rec = res.confirmation, adv.recommended
    if conf is None or rec is None:
        return None
    # its full-accuracy goodput, before any lowering by the check as written (a file's
    # window: not the rule the quick goodputs compared come from)
    full = next((f for c, _, f in conf.remeasured if c == rec.candidate), rec.goodput_per_gpu_per_s)
    rivals = [(c, q) for c, q in conf.left_over if c.kind == rec.candidate.kind and q > full]
    if not rivals:
        return None
    return (
        "the recommendation is the best of its kind measured at full accuracy; "
        + ", ".join(f"{c.label} (quick {q:.3f})" for c, q in rivals)
        + f", left unmeasured by the cap, may serve more than its {full:.3f} req/s per GPU"
    )


def quick_margin(
    res: SearchResult, dis: CandidateResult, colo: CandidateResult, dis_wins: bool
) -> QuickMargin | None:
    """What a quick plan's gain of ``dis`` over ``colo`` is (None outside quick mode).
    Quick mode stops a family once its best is behind the best found (its explore floor,
    docs/planning.md §2), so the losing side's best found can lie well under its best:
    on llama-3.1-8b over 4 H200 (lognormal 4000-token prompts) quick mode quoted
    disaggregation -22 % where full mode and the exhaustive search measure -6 %, its
    tp1/tp1 family stopped at 3P + 1D with 2P + 1D untried. The gain is then quoted with
    its error and the families stopped (docs/planning.md §3, "Quick margins")."""
    if not res.options.quick_mode:
        return None
    from disaggsim.plan.confirm import side

    losing = "colocate" if dis_wins else "disaggregate"
    stopped = tuple(
        name
        for name, state in res.families.items()
        if state == "stopped" and side(res.family_kinds.get(name, "")) == losing
    )
    measured = dis.full_accuracy and colo.full_accuracy
    return QuickMargin(losing, None if measured else QUICK_UNCERTAINTY, stopped)


def binding_target(r: CandidateResult, res: SearchResult) -> str | None:
    """The SLO target candidate ``r``'s run at its goodput (``at_rate``) is nearest: at
    the goodput about the attainment target's share of requests meets the SLO, so the
    target whose p90 sits nearer (or past) its bound is the likelier to hold it (the
    stability test may hold it first). None without a run or for ``max_gap`` (its
    per-request p90 is not summarised)."""
    a = r.at_rate
    slo = res.loaded.scenario.slo
    if a is None or slo.itl_statistic != "tpot":
        return None
    ttft, itl = float(a.ttft_p90_s), float(a.tpot_p90_s)
    if not (ttft > 0 or itl > 0):
        return None
    if ttft / slo.ttft_s >= itl / slo.itl_s:
        return f"TTFT target (p90 {_ms(ttft)} ms against {_ms(slo.ttft_s)} ms)"
    return f"ITL target (TPOT p90 {_ms(itl)} ms against {_ms(slo.itl_s)} ms)"


def _unexplained_clause(
    res: SearchResult, winner: CandidateResult, loser: CandidateResult | None, how: str
) -> str:
    """What the measured runs say where the conditions do not explain the verdict
    (``how``: why they do not): the target each side's best is nearest at its goodput."""
    parts = []
    for r in (loser, winner):
        b = None if r is None else binding_target(r, res)
        if r is not None and b is not None:
            parts.append(f"{r.candidate.label} at its goodput is nearest its {b}")
    return f"; {how}: the runs decide ({'; '.join(parts)})" if parts else f"; {how}"


def _target_rate_clause(res: SearchResult, rec: CandidateResult | None) -> str:
    """What the reason adds for a target-rate question: the fleet was sized again at
    fewer GPUs (plan.fit_target_rate), or the recommendation serves less than the rate."""
    target = res.target_rate_per_s
    if target is None or rec is None:
        return ""
    if rec.goodput_per_s < target:
        return (
            f"; it serves {rec.goodput_per_s:.3g} req/s, under the target rate of {target:g}: "
            "ask for more GPUs with --gpus"
        )
    if res.first_budget is not None:
        # the recommendation's GPUs: a smaller budget's best can use fewer than it holds
        n = rec.candidate.num_gpus
        return (
            f"; sized for the target rate of {target:g} req/s: {n} "
            f"GPU{'s serve' if n > 1 else ' serves'} it, fewer than the "
            f"{res.first_budget} first sized with one worker per pool"
        )
    return ""


def _rate_margin(
    target: float | None, winner: CandidateResult, loser: CandidateResult, loser_name: str
) -> str:
    """Why a target-rate verdict went to ``winner``: it serves the rate, ``loser`` (the
    best of ``loser_name``'s side) does not on the GPUs searched."""
    return (
        f"it serves the target rate of {target:g} req/s ({winner.goodput_per_s:.3g} req/s) "
        f"where the best of {loser_name} does not ({loser.goodput_per_s:.3g} req/s)"
    )


def _advise(res: SearchResult) -> Advice:
    dis = _best(res, "disaggregate")
    chk = _best(res, "colocate_chunked")
    vll = _best(res, "colocate_vllm")
    colo = [r for r in (chk, vll) if r is not None]
    target = res.target_rate_per_s

    def serves(r: CandidateResult) -> bool:
        return target is None or r.goodput_per_s >= target

    # a target-rate question is answered only by a deployment that serves the rate (the
    # best per GPU can be one that does not: 1P + 1D where chunked prefill on the budget
    # serves it); then ties to a candidate measured at full accuracy (plan/confirm.py),
    # then to chunked
    best_colo = max(colo, key=lambda r: (serves(r), r.goodput_per_gpu_per_s, r.full_accuracy))
    # one side serves the rate and the other does not: that decides, not goodput per GPU
    by_rate = dis is not None and serves(dis) != serves(best_colo)
    gain = None
    if dis is not None and best_colo.goodput_per_gpu_per_s > 0:
        gain = dis.goodput_per_gpu_per_s / best_colo.goodput_per_gpu_per_s - 1.0
    if dis is not None and dis.goodput_per_gpu_per_s > 0 and best_colo.goodput_per_gpu_per_s == 0:
        gain = float("inf")
    if by_rate:
        wins = dis is not None and serves(dis)
    else:
        wins = dis is not None and gain is not None and gain >= MIN_GAIN
    # the figures the conditions quote of a deployment are the recommendation's
    conds = conditions(res, dis if wins else best_colo)
    pd_conds = [c for c in conds if c.name != "prefix_reuse"]  # the disaggregation ones
    held = [c.name.replace("_", " ") for c in pd_conds if c.holds]
    missing = [c for c in pd_conds if not c.holds]
    reuse = next((c for c in conds if c.name == "prefix_reuse" and c.holds), None)

    colo_name = "chunked prefill" if best_colo is chk else "vllm continuous batching"
    qm: QuickMargin | None = None  # set where a gain per GPU is quoted
    band: float | None = None  # set where a full-accuracy gain is a close call
    colo_verdict = "colocate_chunked" if best_colo is chk else "colocate_vllm"
    if dis is None:
        reason = f"use {colo_name} on one pool: " + next(
            c.detail for c in conds if c.name == "large_fleet"
        )
        verdict, rec = colo_verdict, best_colo
    elif wins:
        # the margin that decides is over the best colocated candidate; chunked
        # prefill's is quoted too when vllm is the better colocated one
        quoted = not by_rate and gain is not None and gain != float("inf")
        qm = quick_margin(res, dis, best_colo, True) if quoted else None
        band = close_call_band(res, qm, gain if quoted else None)
        margin = (
            _rate_margin(target, dis, best_colo, colo_name)
            if by_rate
            else f"+{_pct(gain)} goodput per GPU over {colo_name}"
            if gain is not None and gain != float("inf")
            else f"meets the SLOs where {colo_name} does not at any rate searched"
        )
        if (
            not by_rate
            and best_colo is not chk
            and chk is not None
            and chk.goodput_per_gpu_per_s > 0
        ):
            margin += (
                f" (+{_pct(dis.goodput_per_gpu_per_s / chk.goodput_per_gpu_per_s - 1.0)} "
                "over chunked prefill)"
            )
        reason = (
            f"disaggregate: {margin} "
            f"({dis.candidate.label}: {dis.goodput_per_gpu_per_s:.3f} vs "
            f"{best_colo.candidate.label}: {best_colo.goodput_per_gpu_per_s:.3f} req/s per GPU"
            f"{_note(qm)}{_settled(res)}{_close_call(band, seeds_of(res), _own(res), res.settlement is not None)})"
            + (f"; holds: {', '.join(held)}" if held else "")
            + (
                f"; does not hold: {', '.join(c.name.replace('_', ' ') for c in missing)}"
                if missing
                else ""
            )
        )
        tight = next((c for c in pd_conds if c.name == "tight_itl_tail"), None)
        if not any(c.holds for c in pd_conds if c.name in ("long_prompts", "tight_itl_tail")):
            reason += _unexplained_clause(
                res, dis, best_colo, "neither long prompts nor a tight ITL tail explain it"
            )
        elif tight is not None and tight.holds:
            # the figures a user checks: what the ITL target leaves a colocated step
            reason += f"; {tight.detail}"
        verdict, rec = "disaggregate", dis
    else:
        if by_rate:
            loss = _rate_margin(target, best_colo, dis, "disaggregation")
        elif gain is None or dis.goodput_per_gpu_per_s == 0:
            loss = "disaggregation meets the SLOs at no rate searched"
        elif gain < 0:
            qm = quick_margin(res, dis, best_colo, False)
            loss = f"disaggregation loses {_pct(gain)} goodput per GPU here"
        else:
            qm = quick_margin(res, dis, best_colo, False)
            loss = (
                f"disaggregation gains only {_pct(gain)} goodput per GPU here "
                f"(under the {_pct(MIN_GAIN)} worth a second pool)"
            )
        why = "; ".join(f"not {c.name.replace('_', ' ')}: {c.detail}" for c in missing)
        quoted = not by_rate and gain is not None and dis.goodput_per_gpu_per_s > 0
        band = close_call_band(res, qm, gain if quoted else None)
        reason = (
            f"use {colo_name} on one pool: {loss} "
            f"({dis.candidate.label}: {dis.goodput_per_gpu_per_s:.3f} vs "
            f"{best_colo.candidate.label}: {best_colo.goodput_per_gpu_per_s:.3f} req/s per GPU"
            f"{_note(qm)}{_settled(res)}{_close_call(band, seeds_of(res), _own(res), res.settlement is not None)})"
            + (f" because {why}" if why else "")
            + (f"; holds: {', '.join(held)}" if held else "")
        )
        if not missing and dis.goodput_per_gpu_per_s > 0:
            reason += _unexplained_clause(
                res, best_colo, dis, "every condition for disaggregation holds, yet it does not win"
            )
        verdict, rec = colo_verdict, best_colo
    if reuse is not None:
        reason += f"; prefix reuse: {reuse.detail}"
    reason += _target_rate_clause(res, rec)
    return Advice(
        verdict=verdict,
        reason=reason,
        recommended=rec,
        best_disaggregated=dis,
        best_chunked=chk,
        best_vllm=vll,
        # decided by the target rate: the gain per GPU did not decide, none is quoted
        disaggregation_gain=None if by_rate or gain is None or gain == float("inf") else gain,
        conditions=conds,
        margin=qm,
        close_call_band=band,
    )


def _note(qm: QuickMargin | None) -> str:
    """``; NOTE`` after the figures of a quick plan's quoted gain, else nothing."""
    return "" if qm is None else f"; {qm.note()}"


def close_call_band(res: SearchResult, qm: QuickMargin | None, gain: float | None) -> float | None:
    """How near the :data:`MIN_GAIN` line a gain measured at full accuracy (full mode,
    or a quick plan's two figures measured again) lies within one sd of its seed spread,
    :data:`SEED_SPREAD` / sqrt(seeds); None for a quick figure (its own ±15 % says more),
    a gain not quoted, or one farther from the line."""
    if gain is None or not math.isfinite(gain):
        return None
    if res.options.quick_mode and (qm is None or qm.uncertainty is not None):
        return None
    st = res.settlement
    if st is not None and st.own_band is not None:
        band = st.own_band  # the margin's own spread over its settled seeds
    else:
        band = SEED_SPREAD / math.sqrt(seeds_of(res))
    return band if abs(gain - MIN_GAIN) < band else None


def seeds_of(res: SearchResult) -> int:
    """The seeds the compared goodputs average: a settled close call's
    (plan/confirm.py settle_close_call), else the plan's."""
    return res.settlement.seeds if res.settlement is not None else res.options.seeds


def _own(res: SearchResult) -> bool:
    """Whether the close-call band is the settled margin's own (plan/confirm.py)."""
    return res.settlement is not None and res.settlement.own_band is not None


def _settled(res: SearchResult) -> str:
    """``; measured again averaging N seeds: ...`` after the figures of a settled close
    call, else nothing."""
    return "" if res.settlement is None else f"; {res.settlement.sentence()}"


def _close_call(band: float | None, seeds: int, own: bool = False, settled: bool = False) -> str:
    """``; a close call: ...`` after the figures of a full-accuracy gain near the line;
    ``own``: the band is the settled margin's own spread (plan/confirm.py own_band);
    ``settled``: the figures are a settled close call's (the hint says "again")."""
    if band is None:
        return ""
    if own:
        return (
            f"; a close call: within {band:.1%} of the {MIN_GAIN:.0%} line, one sd of this "
            f"margin over its {seeds} settled seeds (a 90% upper bound), so another seed "
            "could turn it" + _more_seeds(seeds, settled)
        )
    return (
        f"; a close call: within {band:.1%} of the {MIN_GAIN:.0%} line, one sd of a margin's "
        f"seed spread at {seeds} seed{'s' if seeds > 1 else ''} (docs/sweeps.md), so another "
        "seed could turn it" + _more_seeds(seeds, settled)
    )


def _more_seeds(seeds: int, settled: bool) -> str:
    """What narrows a close call at ``seeds`` seeds by about half: settling the compared
    candidates on four times as many seeds (``--settle-seeds``: the mean of one search a
    seed, plan/confirm.py settle_close_call), "again" where they were settled already;
    nothing past MAX_SEEDS. (Not ``--seeds``: one search averaging the attainment over
    seeds acts like the worst seed where the trend test binds, and need not narrow at
    all: docs/sweeps.md.)"""
    if 4 * seeds > MAX_SEEDS:
        return ""
    return f"; --settle-seeds {4 * seeds} narrows that by about half{' again' if settled else ''}"
