"""Deployments for a GPU budget and their steady-state goodput per GPU, by simulation.

The search space (docs/planning.md, "Search"), all on the scenario's GPU, total GPUs
<= the budget, for each weight dtype asked (the scenario's; FP8 with ``--fp8``):

- **disaggregated**: every pair of TP degrees (prefill, decode) among the valid ones
  within one node whose worker holds a p99 request's KV; any prefill and decode worker
  counts that fit;
- **colocated** ``chunked`` (chunk sizes on :data:`CHUNK_LADDER`) and ``vllm``, every TP
  degree, ``budget // tp`` workers.

:func:`disaggsim.plan.optimise.optimise` walks it: branch and bound over families (TP
pair and dtype; the analytic capacity is each family's optimistic bound, an MoE
family's a true one from its iteration floor, :mod:`disaggsim.plan.moe_bound`), hill climbing
inside a family (worker counts along the full budget, then trimming a pool, then the
balanced splits a bottleneck model fitted to the family's measurements predicts better,
:func:`balanced_splits`; chunk size up and down). Each candidate's goodput is the steady-state goodput
(:func:`disaggsim.sweep.goodput_many`: bracketed, bisected and confirmed at twice the
horizon, each run's length from the workload); the latency columns come from its
confirmation run.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disaggsim.catalog import get_gpu, get_model
from disaggsim.config.bounds import (
    MAX_GPUS,
    MAX_NUMBER,
    MAX_SEEDS,
    MAX_WORKERS_PER_POOL,
)
from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.errors import UserError, given
from disaggsim.metrics.steady import RunLengthRule, check_run_length_flags
from disaggsim.metrics.summary_table import Summary
from disaggsim.plan.analytic import (
    AnalyticGuess,
    Layout,
    PoolLayouts,
    PoolLimits,
    analytic_guess,
    cache_enabled,
    expected_prefix_hit_share,
    fitting_tps,
    loaded_residence_s,
    plan_gpu,
    refusal_note,
    sample_lengths,
    sample_requests,
    smallest_unit,
    worker_cost,
)
from disaggsim.plan.optimise import Family, OptimiseResult, optimise
from disaggsim.sweep.core import Source, source_of
from disaggsim.sweep.executors import Executor
from disaggsim.sweep.goodput import GoodputResult, goodput_many, steady_profile
from disaggsim.units import GiB
from disaggsim.validity import largest_prompt_tokens, link_fabric_problem
from disaggsim.workload.requests import Requests

__all__ = [
    "CHUNK_LADDER",
    "KINDS",
    "Candidate",
    "CandidateResult",
    "Confirmation",
    "SEQS_RAISE",
    "PlanOptions",
    "SearchResult",
    "Settlement",
    "all_candidates",
    "candidate_pools",
    "candidate_row",
    "candidate_scenario",
    "candidate_seqs_ladder",
    "check_settle_seeds",
    "plan_families",
    "pool_limits",
    "raise_caps",
    "rank_rows",
    "resplit",
    "rate_budget",
    "search",
    "seqs_fixed",
    "seqs_ladder",
    "settled_rows",
]

KINDS = ("disaggregate", "colocate_chunked", "colocate_vllm")
DEFAULT_CHUNK_TOKENS = 512  # Sarathi-style chunk budget when the scenario has none
CHUNK_LADDER = (256, 512, 1024, 2048, 4096, 8192)  # chunk sizes the search tries
# the largest decode batch cap tried, times the scenario's (1,024 for its default 256:
# vLLM V1's API server's default on H100)
SEQS_RAISE = 4
# candidates of each kind whose batch cap is raised (raise_caps): its best, and runners-up
# explored within the exploration tolerance of it
RAISE_PER_KIND = 2


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How hard to search. ``quick()`` is the bounded mode for first looks."""

    rule: RunLengthRule = field(default_factory=RunLengthRule)  # confirmed goodputs
    tol_fraction: float = 0.01  # bisection tolerance as a share of the bracket's top
    # the hill climb compares candidates with shorter runs, a coarser tolerance and no
    # confirmation; the best are then searched again with ``rule`` and confirmed
    explore_rule: RunLengthRule = field(
        default_factory=lambda: RunLengthRule(min_measured_requests=400, service_multiple=5.0)
    )
    explore_tol_fraction: float = 0.03
    finalist_margin: float = 0.05  # confirm every candidate explored within this of the best
    seeds: int = 1
    bound_slack: float = 1.25  # prune a family when bound x slack < best found
    explore_floor: float = 0.0  # stop climbing a family below this share of the best
    max_waves: int = 40
    weight_dtypes: tuple[str, ...] = ()  # besides the scenario's (e.g. ("fp8",))
    chunk_ladder: tuple[int, ...] = CHUNK_LADDER
    walk_chunks: bool = False  # False: try every chunk on the ladder; True: climb from one
    # then climb the ladder cut this many times between rungs, from the best rung
    # (chunk_neighbours: the ITL target's edge can lie up to a rung above it)
    chunk_fine_steps: int = 4
    max_tp: int | None = None  # None: no limit beyond the budget and the fabric
    moe_unit_sizes: int = 3  # MoE: unit sizes (best layout of each) kept per role
    rate_hi_factor: float = 1.5  # first bracket: [lo, hi] x analytic capacity
    rate_lo_factor: float = 0.25
    # confirm a finalist's explored goodput at once (twice the final rule's horizon,
    # stepping down if it misses) instead of searching it again with the final rule
    confirm_explored: bool = False
    # a candidate whose family has a goodput brackets it at (1 -+ this) x that goodput
    # per GPU x its GPUs (its neighbours lie within a few % of it)
    relative_bracket: float = 0.3
    # the nearest moves of a family behind the explore floor are screened at its best
    # member's goodput (optimise.py): one run, not a search, for one below it
    screen_nearest: bool = False
    # the candidates the advisor compares are run as their recommended.yaml is written
    # (its sim section and seed) and stepped down until they meet (plan/holds.py)
    check_as_written: bool = True
    # recommended.yaml keeps the question's sim window where that holds at most this many
    # requests at the rate written, else it runs the window steady state needs
    # (plan/holds.py written_sim)
    file_requests: int = 100_000
    quick_mode: bool = False
    # quick mode: where its only doubt is a gain within its error of the threshold, the
    # best ``confirm_per_side`` candidates of each side (disaggregated, colocated) are
    # searched again at full accuracy (``full_rule``, ``full_tol_fraction``: full mode's
    # final stage) and full mode's rule decides (plan/confirm.py)
    confirm_close: bool = False
    confirm_per_side: int = 2
    # at most this many candidates are measured again (the loop that re-measures any
    # whose quick goodput beats its side's best full-accuracy one is otherwise bounded
    # only by the candidates explored); those left over are named, and where one could
    # still flip the verdict it stays undecided (plan/confirm.py)
    confirm_max_candidates: int = 8
    # families left open there are first walked on to this wave limit (full mode's)
    confirm_waves: int = 40
    # families the explore floor does not stop (optimise's ``floor_exempt``): those of a
    # quick verdict's losing side its floor had stopped, walked on (plan/confirm.py)
    floor_exempt: tuple[str, ...] = ()
    full_rule: RunLengthRule = field(default_factory=RunLengthRule)
    full_tol_fraction: float = 0.01
    # the gain a larger batch cap must show there (full mode's explore_tol_fraction)
    full_explore_tol_fraction: float = 0.03
    # a gain measured at full accuracy within the close-call band of the 5 % line
    # (advisor.close_call_band): each compared kind's best is searched again at full
    # accuracy on this many fresh seeds, one search each, and the verdict taken on their
    # means (plan/confirm.py settle_close_call); at most ``seeds``: never
    settle_seeds: int = 4
    # at most this many candidates are measured again there (each compared kind's best,
    # then any of those kinds whose goodput per GPU beats its kind's settled best)
    settle_max_candidates: int = 6

    def with_run_length(
        self, min_requests: int | None, service_multiple: float | None
    ) -> PlanOptions:
        """These options with the run-length rule's floors lowered or raised (``--min-
        requests``, ``--service-multiple``): the confirmed goodputs use them, the
        exploration at most them."""
        rule, explore, full = self.rule, self.explore_rule, self.full_rule
        check_run_length_flags(min_requests, service_multiple)
        if min_requests is not None:
            rule = dataclasses.replace(rule, min_measured_requests=min_requests)
            full = dataclasses.replace(full, min_measured_requests=min_requests)
            n = min(explore.min_measured_requests, min_requests)
            explore = dataclasses.replace(explore, min_measured_requests=n)
        if service_multiple is not None:
            rule = rule.with_service_multiple(service_multiple)
            full = full.with_service_multiple(service_multiple)
            m = min(explore.service_multiple, service_multiple)
            explore = explore.with_service_multiple(m)
        return dataclasses.replace(self, rule=rule, explore_rule=explore, full_rule=full)

    def full_accuracy(self) -> PlanOptions:
        """These options with full mode's final stage: its run-length rule (with the
        ``--min-requests``/``--service-multiple`` given) and bisection tolerance, each
        finalist searched again from its explored goodput and confirmed at twice the
        horizon (not confirmed directly). Full mode's own options are unchanged."""
        return dataclasses.replace(
            self, rule=self.full_rule, tol_fraction=self.full_tol_fraction, confirm_explored=False
        )

    @classmethod
    def quick(cls) -> PlanOptions:
        return cls(
            rule=RunLengthRule(min_measured_requests=400, service_multiple=5.0),
            tol_fraction=0.04,
            explore_rule=RunLengthRule(
                min_measured_requests=200,
                service_multiple=2.0,
                warmup_service_multiple=1.0,
            ),
            explore_tol_fraction=0.06,
            finalist_margin=0.0,
            bound_slack=1.1,
            explore_floor=0.85,
            max_waves=8,
            walk_chunks=True,
            confirm_explored=True,
            relative_bracket=0.12,
            screen_nearest=True,
            quick_mode=True,
            confirm_close=True,
        )


@dataclass(frozen=True, slots=True)
class Candidate(PoolLayouts):
    """One deployment. Colocated: ``num_prefill_workers``/``prefill_tp`` are the pool's
    workers and TP; the decode fields are 0."""

    kind: str  # one of KINDS
    num_prefill_workers: int
    prefill_tp: int
    num_decode_workers: int = 0
    decode_tp: int = 0
    chunk_tokens: int | None = None  # colocate_chunked only
    weight_dtype: str | None = None  # None: the scenario's
    # MoE layouts (docs/costmodel.md): data-parallel ranks per worker and the EP degree
    # (None: the cost model's default); a worker is tp x dp GPUs
    prefill_dp: int = 1
    prefill_ep: int | None = None
    decode_dp: int = 1
    decode_ep: int | None = None
    # the decode (colocated: the pool's) batch cap per data-parallel rank; None: the
    # scenario's (raised where it can matter: raise_caps)
    max_batch_seqs: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "disaggregate":
            return (
                f"disagg {self.num_prefill_workers}P x {self.prefill_layout.tag} + "
                f"{self.num_decode_workers}D x {self.decode_layout.tag}{self._seqs()}"
                f"{self._dtype()}"
            )
        sched = "chunked" if self.kind == "colocate_chunked" else "vllm"
        extra = f" chunk {self.chunk_tokens}" if self.chunk_tokens else ""
        return (
            f"{sched} {self.num_prefill_workers} x {self.prefill_layout.tag}{extra}"
            f"{self._seqs()}{self._dtype()}"
        )

    def _dtype(self) -> str:
        return f" {self.weight_dtype}" if self.weight_dtype else ""

    def _seqs(self) -> str:
        return f" seqs {self.max_batch_seqs}" if self.max_batch_seqs else ""

    def deployment(self) -> dict[str, Any]:
        extra = {"weight_dtype": self.weight_dtype} if self.weight_dtype else {}
        if self.kind == "disaggregate":
            return {
                "architecture": "disaggregated",
                "prefill_pool": {
                    "num_workers": self.num_prefill_workers,
                    **_layout_fields(self.prefill_layout),
                },
                "decode_pool": {
                    "num_workers": self.num_decode_workers,
                    **_layout_fields(self.decode_layout),
                    **self._seqs_field(self.decode_dp),
                },
                **extra,
            }
        pool: dict[str, Any] = {
            "num_workers": self.num_prefill_workers,
            **_layout_fields(self.prefill_layout),
            "scheduler": "chunked" if self.kind == "colocate_chunked" else "vllm",
        }
        if self.chunk_tokens:  # the chunk is per data-parallel rank
            pool["max_batch_tokens"] = self.chunk_tokens * self.prefill_dp
        pool.update(self._seqs_field(self.prefill_dp))
        return {"architecture": "colocated", "pool": pool, **extra}

    def _seqs_field(self, dp: int) -> dict[str, int]:
        """The pool's ``max_batch_seqs`` (over the worker's ``dp`` ranks) where set."""
        return {"max_batch_seqs": self.max_batch_seqs * dp} if self.max_batch_seqs else {}


def _layout_fields(lay: Layout) -> dict[str, int]:
    """A pool's ``tp``, and ``dp``/``ep`` where they differ from the defaults."""
    out = {"tp": lay.tp}
    if lay.dp > 1:
        out["dp"] = lay.dp
    if lay.ep is not None:
        out["ep"] = lay.ep
    return out


@dataclass(frozen=True, slots=True)
class CandidateResult:
    candidate: Candidate
    goodput_per_s: float  # 0 when the SLO is unattainable
    goodput_per_gpu_per_s: float
    status: str  # found | refined | unattainable | unbounded (sweep.goodput.GoodputResult)
    at_rate: Summary | None = None  # the confirmation run (else the search's) at the goodput
    usd_per_m_output_tokens: float | None = None
    goodput: GoodputResult | None = None  # the search behind it (evaluations, confirmation)
    # the check at the length and seed its recommended.yaml runs (plan/holds.py): then
    # ``goodput_per_s`` is the rate it met there (a trend-only miss retested with a
    # fresh seed, as the search retests) and ``at_rate`` that run
    as_written: GoodputResult | None = None
    # the recommendation's file (plan/holds.py): the highest rate the file's own seed
    # meets as written, searched down from ``goodput_per_s`` where that rate was met only
    # by a retest's fresh seed (None: the file's seed met it; the file runs that rate)
    file_check: GoodputResult | None = None
    # measured again at full accuracy after a close quick result (plan/confirm.py): the
    # goodput and ``goodput`` are that search's
    full_accuracy: bool = False

    @property
    def file_rate_per_s(self) -> float:
        """The rate recommended.yaml writes: the goodput, or where its own seed met only a
        lower rate as written, that rate (``file_check``)."""
        if self.file_check is None:
            return self.goodput_per_s
        r = self.file_check.rate_per_s
        return r if math.isfinite(r) else 0.0

    def as_dict(self) -> dict[str, Any]:
        a = self.at_rate
        conf = self.goodput.confirmation if self.goodput is not None else None
        return {
            "label": self.candidate.label,
            "kind": self.candidate.kind,
            "num_gpus": self.candidate.num_gpus,
            "deployment": self.candidate.deployment(),
            "goodput_per_s": self.goodput_per_s,
            "goodput_per_gpu": self.goodput_per_gpu_per_s,
            "status": self.status,
            "confirmed": self.goodput.confirmed if self.goodput is not None else False,
            "confirm_rate_per_s": _f(None if conf is None else conf.rate_per_s),
            "confirm_attainment": _f(None if conf is None else conf.attainment),
            "confirm_duration_s": _f(None if conf is None else conf.duration_s),
            "ttft_p99_s": None if a is None else _f(a.ttft_p99_s),
            "itl_p99_s": None if a is None else _f(a.itl_p99_s),
            "slo_attainment": None if a is None else _f(a.slo_attainment),
            "usd_per_m_output_tokens": self.usd_per_m_output_tokens,
            "full_accuracy": self.full_accuracy,
            "as_written": _as_written_dict(self),
        }


def _as_written_dict(r: CandidateResult) -> dict[str, Any] | None:
    """The check as written (plan/holds.py): ``met`` at the search's goodput, ``lowered``
    to a rate it met, or ``missed`` at every rate tried; the rate it started from, the
    run length and the runs."""
    g = r.as_written
    if g is None:
        return None
    first = g.evaluations[0] if g.evaluations else None
    status = {"found": "met", "refined": "lowered"}.get(g.status, "missed")
    f = r.file_check
    return {
        "status": status,
        "from_rate_per_s": _f(None if first is None else first.rate_per_s),
        "rate_per_s": r.goodput_per_s,
        "duration_s": _f(None if first is None else first.duration_s),
        "num_runs": g.num_runs + (0 if f is None else f.num_runs),
        # trend-only misses that a run with a fresh seed decided (the search's retest)
        "num_retests": g.num_retests,
        # the rate recommended.yaml writes: met by the file's own seed (holds.py)
        "file_rate_per_s": r.file_rate_per_s,
    }


def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A quick plan's close call measured again at full accuracy (plan/confirm.py):
    ``doubt`` is quick mode's reason, ``quick_gain`` its disaggregation gain;
    ``remeasured`` the candidates with their quick and full-accuracy goodputs per GPU,
    in the order they were searched; ``options`` full mode's final stage as run."""

    doubt: str
    quick_gain: float | None
    remeasured: tuple[tuple[Candidate, float, float], ...]  # (candidate, quick, full)
    num_simulations: int
    options: PlanOptions
    # families the wave limit had left open, walked on with quick mode's runs first, and
    # the simulations that took
    walked_on: tuple[str, ...] = ()
    walk_simulations: int = 0
    # candidates whose quick goodput per GPU still beat their side's best full-accuracy
    # one when ``options.confirm_max_candidates`` were measured: (candidate, quick)
    left_over: tuple[tuple[Candidate, float], ...] = ()
    # deployments first measured here, at full accuracy, by raising the batch cap (and
    # re-splitting) of each kind's best (plan/confirm.py): (candidate, full)
    climbed: tuple[tuple[Candidate, float], ...] = ()

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return tuple(c for c, _, _ in self.remeasured)

    def settings(self) -> str:
        r = self.options.rule
        return (
            f"full mode's {self.options.tol_fraction:.0%} bisection, runs of >= "
            f"{r.min_measured_requests} requests and {r.service_multiple:g} service times, "
            f"confirmed at {r.confirm_factor:g}x the horizon"
        )

    def sentence(self) -> str:
        """One clause for the advisor's reason."""
        what = ", ".join(f"{c.label} {q:.3f} -> {f:.3f}" for c, q, f in self.remeasured)
        fams = f"famil{'y' if len(self.walked_on) == 1 else 'ies'} {', '.join(self.walked_on)}"
        if not self.walked_on:
            walk = ""
        elif self.walk_simulations > 0:
            walk = (
                f"{fams} left open by the wave limit or stopped by the floor walked on first "
                f"({self.walk_simulations} simulations), then "
            )
        else:  # a walk that reached nothing new: say so, never that it walked on
            walk = (
                f"walking {fams} left open by the wave limit or stopped by the floor on "
                "added no simulation (every deployment it reached had been run), then "
            )
        left = (
            f"; the cap of {self.options.confirm_max_candidates} left "
            + ", ".join(f"{c.label} (quick {q:.3f})" for c, q in self.left_over)
            + " unmeasured, above its side's best at full accuracy"
            if self.left_over
            else ""
        )
        climbed = (
            "; batch caps raised at full accuracy: "
            + ", ".join(f"{c.label} {f:.3f}" for c, f in self.climbed)
            if self.climbed
            else ""
        )
        return (
            f"confirmed at full accuracy: quick mode's gain lay within its error of the "
            f"threshold, so {walk}{len(self.remeasured)} candidates were searched again "
            f"with {self.settings()} ({what} req/s per GPU{climbed}; "
            f"{self.num_simulations} simulations){left}"
        )

    def as_dict(self) -> dict[str, Any]:
        r = self.options.rule
        return {
            "at_full_accuracy": True,
            "doubt": self.doubt,
            "quick_gain": self.quick_gain,
            "remeasured": [
                {
                    "label": c.label,
                    "kind": c.kind,
                    "quick_goodput_per_gpu": q,
                    "goodput_per_gpu": f,
                }
                for c, q, f in self.remeasured
            ],
            "num_simulations": self.num_simulations,
            "walked_on": list(self.walked_on),
            "walk_simulations": self.walk_simulations,
            "max_candidates": self.options.confirm_max_candidates,
            "left_over": [
                {"label": c.label, "quick_goodput_per_gpu": q} for c, q in self.left_over
            ],
            "climbed": [
                {"label": c.label, "kind": c.kind, "goodput_per_gpu": f} for c, f in self.climbed
            ],
            "tol_fraction": self.options.tol_fraction,
            "min_measured_requests": r.min_measured_requests,
            "service_multiple": r.service_multiple,
            "confirm_factor": r.confirm_factor,
        }


@dataclass(frozen=True, slots=True)
class Settlement:
    """A close call at full accuracy measured again averaging more seeds (plan/confirm.py
    :func:`~disaggsim.plan.confirm.settle_close_call`): ``gain`` the disaggregation gain
    it settled, within ``band`` (one sd of a margin's seed spread at the plan's seeds) of
    the 5 % line; ``remeasured`` the candidates with their goodputs per GPU as compared
    and as measured again (the mean over ``seeds_run``), in the order searched;
    ``options`` each search's own (full accuracy); ``left_over`` candidates the cap left
    unmeasured whose goodput per GPU beat their kind's best measured again."""

    gain: float
    band: float
    seeds_before: int
    remeasured: tuple[tuple[Candidate, float, float], ...]  # (candidate, before, after)
    num_simulations: int
    options: PlanOptions
    left_over: tuple[tuple[Candidate, float], ...] = ()
    # each remeasured candidate's goodput per GPU on each of ``seeds_run`` (one search a
    # seed; ``remeasured``'s "after" is their mean)
    per_seed: tuple[tuple[float, ...], ...] = ()
    seeds_run: tuple[int, ...] = ()
    # one sd of the settled margin from its own seeds (plan/confirm.py own_band; None:
    # not measurable), the close-call band the advisor then quotes
    own_band: float | None = None
    # the close call was the check as written's (plan/confirm.py checked_close_call):
    # ``gain`` and ``band`` are the checked figures'
    after_check: bool = False

    @property
    def seeds(self) -> int:
        """The seeds the settled figures average (one search each)."""
        return len(self.seeds_run)

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return tuple(c for c, _, _ in self.remeasured)

    def sentence(self) -> str:
        """One clause for the advisor's reason."""
        what = ", ".join(f"{c.label} {b:.3f} -> {a:.3f}" for c, b, a in self.remeasured)
        left = (
            "; the cap left "
            + ", ".join(f"{c.label} ({f:.3f})" for c, f in self.left_over)
            + " unmeasured, above its kind's best measured again"
            if self.left_over
            else ""
        )
        sign = "+" if self.gain >= 0 else "-"
        return (
            f"measured again averaging {self.seeds} fresh seeds: the gain at {self.seeds_before} "
            f"seed{'s' if self.seeds_before > 1 else ''} ({sign}{abs(self.gain):.1%}"
            f"{', once checked as written' if self.after_check else ''}) lay "
            f"within {self.band:.1%} of the line ({what} req/s per GPU; "
            f"{self.num_simulations} simulations){left}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "seeds_before": self.seeds_before,
            "gain_before": self.gain,
            "band_before": self.band,
            "remeasured": [
                {
                    "label": c.label,
                    "kind": c.kind,
                    "goodput_per_gpu_before": b,
                    "goodput_per_gpu": a,
                    "goodput_per_gpu_per_seed": list(p),
                }
                for (c, b, a), p in zip(
                    self.remeasured,
                    self.per_seed or ((),) * len(self.remeasured),
                    strict=True,
                )
            ],
            "seeds_run": list(self.seeds_run),
            "own_band": self.own_band,
            "after_check": self.after_check,
            "left_over": [{"label": c.label, "goodput_per_gpu": f} for c, f in self.left_over],
            "num_simulations": self.num_simulations,
            "tol_fraction": self.options.tol_fraction,
            "min_measured_requests": self.options.rule.min_measured_requests,
        }


@dataclass(frozen=True, slots=True)
class SearchResult:
    loaded: LoadedScenario
    gpu: str
    gpu_budget: int
    analytic: AnalyticGuess
    ranked: tuple[CandidateResult, ...]  # best first
    rate_lo_per_s: float  # the analytic guess's first bracket for the whole budget
    rate_hi_per_s: float
    min_worker_gpus: int  # GPUs of the smallest worker that fits
    options: PlanOptions
    families: dict[str, str] = field(default_factory=dict)  # name -> settled|pruned|stopped|open
    family_kinds: dict[str, str] = field(default_factory=dict)  # name -> kind
    family_bounds: dict[str, float] = field(default_factory=dict)  # name -> bound per GPU
    # candidate -> its family's name, every candidate the walk evaluated (not the cap
    # raises, plan/search.py raise_caps, made after it)
    family_of: dict[Candidate, str] = field(default_factory=dict, repr=False, compare=False)
    converged: bool = True  # every family settled or pruned (no wave limit hit)
    num_simulations: int = 0
    # simulations ended early as certain misses (docs/sweeps.md, "Goodput": early stop)
    num_stopped_early: int = 0
    # share of prompt tokens an unbounded prefix cache would find (None: the requests
    # carry no prefix chains), whether or not the scenario caches them
    reuse_share_unbounded: float | None = None
    # what the ranking does not say: candidates whose goodput runs a scenario bound cut
    # short (MAX_REQUESTS: a huge fleet's rates; GoodputResult.notes)
    notes: tuple[str, ...] = ()
    # nearest moves of a family behind the explore floor that missed at its best member's
    # goodput (one run each; optimise.py, "screened"): not measured, not in ``ranked``
    num_screened_out: int = 0
    # runs of the candidates checked as written (plan/holds.py), in ``num_simulations`` too
    num_as_written_runs: int = 0
    # a quick plan's close call measured again at full accuracy (plan/confirm.py)
    confirmation: Confirmation | None = None
    # a close call at full accuracy measured again averaging more seeds (plan/confirm.py)
    settlement: Settlement | None = None
    # the analytic guess behind each family's start (run lengths of later searches)
    guesses: Mapping[Candidate, AnalyticGuess] = field(default_factory=dict, repr=False)
    # every goodput search run, by (stage, options but the wave limit, candidate, screen):
    # what a search of the same question with more waves reuses (search's ``memo``)
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    # the same search again with other options (``options=``, ``executor=``,
    # ``progress=``), reusing ``memo``, its simulations counted after these; None for a
    # result built by hand
    rerun: Callable[..., SearchResult] | None = field(default=None, repr=False, compare=False)
    # the rate the question asked to serve (--target-rate), None for a budget question
    target_rate_per_s: float | None = None
    price_per_gpu_hour: float | None = None  # --price-per-gpu-hour (None: not asked)
    # a target-rate plan searched again at fewer GPUs (plan.fit_target_rate): the budget
    # first sized (one worker per pool at least), else None
    first_budget: int | None = None


def _pool_base(pool) -> dict[str, Any]:
    """A pool's settings without its layout; its batch limits per data-parallel rank
    (``max_batch_tokens``, ``max_batch_seqs`` are over the whole worker; ceil)."""
    d = pool.model_dump(mode="json", exclude_none=True)
    for key in ("scheduler", "dp", "ep"):
        d.pop(key, None)
    dp = pool.dp
    if dp > 1:
        d["max_batch_tokens"] = -(-d["max_batch_tokens"] // dp)
        d["max_batch_seqs"] = -(-d["max_batch_seqs"] // dp)
    return d


def _per_worker(base: dict[str, Any], lay: Layout) -> dict[str, Any]:
    """Per-rank batch limits of ``base`` scaled to the ``lay.dp`` ranks of a worker."""
    if lay.dp == 1:
        return base
    return {
        **base,
        "max_batch_tokens": base["max_batch_tokens"] * lay.dp,
        "max_batch_seqs": base["max_batch_seqs"] * lay.dp,
    }


def candidate_scenario(loaded: LoadedScenario, cand: Candidate, name: str | None = None) -> dict:
    """The scenario mapping of ``cand``: the original with its pools replaced (the other
    pool settings carried over: the ``cache:`` section and the router too), and worker
    failures and the ``autoscale:`` section dropped (they name the original pools; a
    candidate is a fixed deployment). A colocated candidate
    runs without the prefix cache (and the ``cache_aware`` router it needs) only where
    the engine cannot cache a colocated pool: ``kv.admission`` other than ``on_demand``
    or ``kv.preemption`` other than ``recompute`` (docs/prefix-caching.md)."""
    raw = copy.deepcopy(loaded.raw)
    for key in ("pool", "prefill_pool", "decode_pool"):
        raw.pop(key, None)
    if cand.kind != "disaggregate" and "cache" in raw and not colocated_cache_ok(loaded):
        raw.pop("cache")
        router = raw.get("router")
        if isinstance(router, dict) and router.get("prefill_policy") == "cache_aware":
            raw["router"] = {k: v for k, v in router.items() if k != "prefill_policy"}
    if isinstance(raw.get("failures"), dict):
        raw["failures"] = {
            k: v for k, v in raw["failures"].items() if k not in ("workers", "random", "links")
        }
    raw.pop("autoscale", None)
    dep = cand.deployment()
    raw["architecture"] = dep["architecture"]
    if cand.weight_dtype:
        raw["weight_dtype"] = cand.weight_dtype
    raw.update(candidate_pools(loaded, cand))
    if name is not None:
        raw["name"] = name
    return raw


def candidate_pools(loaded: LoadedScenario, cand: Candidate) -> dict[str, dict]:
    """The pools of ``cand``'s scenario (:func:`candidate_scenario`), by key
    (``prefill_pool`` and ``decode_pool``, or ``pool``): the scenario's pool settings
    per data-parallel rank scaled to the candidate's layouts, with its deployment."""
    s = loaded.scenario
    pre = _pool_base(s.prefill_pool or s.pool)
    dec = _pool_base(s.decode_pool or s.pool)
    if s.architecture == "colocated":
        assert s.pool is not None
        # the colocated budget is a chunk; the prefill pool batches whole prompts
        pre["max_batch_tokens"] = max(s.pool.max_batch_tokens, 8192)
    # a whole-prompt prefill needs a budget of at least the longest prompt (validity.py)
    pre["max_batch_tokens"] = max(pre["max_batch_tokens"], largest_prompt_tokens(loaded) or 0)
    dep = cand.deployment()
    if cand.kind == "disaggregate":
        decode = {**_per_worker(dec, cand.decode_layout), **dep["decode_pool"]}
        # a decode step forwards one token per running sequence: vLLM refuses a budget
        # below the batch cap, so a raised cap raises the decode pool's budget with it
        # (inherited from a colocated chunk it would stay below, and the candidate lost)
        decode["max_batch_tokens"] = max(decode["max_batch_tokens"], decode["max_batch_seqs"])
        return {
            "prefill_pool": {**_per_worker(pre, cand.prefill_layout), **dep["prefill_pool"]},
            "decode_pool": decode,
        }
    base = _pool_base(s.pool) if s.pool is not None else dict(dec)
    if cand.kind == "colocate_vllm":
        base["max_batch_tokens"] = pre["max_batch_tokens"]
    return {"pool": {**_per_worker(base, cand.prefill_layout), **dep["pool"]}}


def pool_limits(
    loaded: LoadedScenario,
    lay: Layout,
    role: str,
    *,
    chunk: int | None = None,
    seqs: int | None = None,
) -> PoolLimits:
    """The limits (:class:`~disaggsim.plan.analytic.PoolLimits`) of a candidate's worker
    of layout ``lay`` in ``role``: ``prefill`` or ``decode`` (a disaggregated pool),
    ``colocate_chunked`` (at ``chunk``, else the scenario's own) or ``colocate_vllm``;
    ``seqs`` a raised batch cap per rank (:func:`raise_caps`). They are what the candidate's
    scenario gives the pool (:func:`candidate_pools`), so the analytic KV capacity of the
    worker is the simulator's."""
    if role in ("prefill", "decode"):
        cand = Candidate("disaggregate", 1, lay.tp, 1, lay.tp, prefill_dp=lay.dp,
                         prefill_ep=lay.ep, decode_dp=lay.dp, decode_ep=lay.ep,
                         max_batch_seqs=seqs)  # fmt: skip
        pool = candidate_pools(loaded, cand)[f"{role}_pool"]
    else:
        if role == "colocate_chunked" and chunk is None:
            chunk = _own_chunk(loaded)
        cand = Candidate(role, 1, lay.tp, prefill_dp=lay.dp, prefill_ep=lay.ep,
                         chunk_tokens=chunk if role == "colocate_chunked" else None,
                         max_batch_seqs=seqs)  # fmt: skip
        pool = candidate_pools(loaded, cand)["pool"]
    return PoolLimits.of(pool)


def colocated_cache_ok(loaded: LoadedScenario) -> bool:
    """Whether the engine caches prefixes on a colocated pool of this scenario's KV
    settings (on-demand admission and recompute preemption)."""
    kv = loaded.scenario.kv
    return kv.admission == "on_demand" and kv.preemption == "recompute"


def budget_of(loaded: LoadedScenario, gpus: int | None) -> int:
    b = loaded.scenario.num_gpus if gpus is None else gpus
    if b < 1:
        raise UserError(f"--gpus {b}: must be >= 1")
    return b


# ------------------------------------------------------------------ the space


def _p99_kv_tokens(lengths: tuple[np.ndarray, np.ndarray]) -> int:
    prompts, outputs = lengths
    return int(np.percentile(prompts, 99) + np.percentile(outputs, 99))


def _with_dtype(loaded: LoadedScenario, dtype: str | None) -> LoadedScenario:
    if dtype is None or dtype == loaded.scenario.weight_dtype:
        return loaded
    raw = {**loaded.raw, "weight_dtype": dtype}
    return load_scenario(raw, base_dir=loaded.base_dir)


def no_worker_fits(
    loaded: LoadedScenario,
    gpu: str,
    budget: int | None,
    need_tokens: int,
    max_tp: int | None = None,
    moe_why: Mapping[str, str] | None = None,
) -> str:
    """Why no worker within ``budget`` (None: of any size) holds a p99 request's KV
    (``need_tokens``), and fixes the plan can act on: the smallest worker that does, as
    a budget (``--gpus``), where the scenario's fabric can place it (a ``kind:
    topology`` fabric keeps a TP group inside one node: TP beyond it is no fix there);
    FP8 weights where they fit; else the cost model's reason for the largest worker
    tried (:func:`~disaggsim.plan.analytic.refusal_note`), alone where it is not memory.
    ``moe_why``: the MoE layout search's reason per role (:func:`worker_layouts`), for
    a worker that fits but that search kept for no pool."""
    s = loaded.scenario
    fab_tp = fabric_max_tp(loaded)
    top = min(fab_tp, max_tp or fab_tp)
    room = f"with room for a p99 request's KV ({need_tokens} tokens)"
    refusals: dict[str, str] = {}
    unit = smallest_unit(loaded, gpu, need_tokens, refusals=refusals, max_tp=top)
    fp8 = None
    if s.weight_dtype != "fp8":
        try:
            fp8 = smallest_unit(_with_dtype(loaded, "fp8"), gpu, need_tokens, max_tp=top)
        except UserError:  # no FP8 weights for this model or GPU
            fp8 = None
    fp8_fix = ""
    if fp8 is not None and (unit is None or fp8.gpus < unit.gpus):
        more = (
            f" with --gpus {fp8.gpus} or more" if budget is not None and fp8.gpus > budget else ""
        )
        fp8_fix = (
            "use fp8 weights (weight_dtype: fp8, or --weight-dtype fp8: they fit "
            f"{_unit_name(fp8)}{more})"
        )
    if unit is not None:
        node = get_gpu(gpu).gpus_per_node
        nodes = -(-unit.gpus // node)
        what = _unit_name(unit)
        across = f", {nodes} nodes of {node}" if nodes > 1 else ""
        if budget is not None and unit.gpus > budget:
            return (
                f"plan: a budget of {budget} x {gpu} is smaller than one worker that fits "
                f"{s.model} {room}: it needs {what} ({unit.gpus} GPUs{across}): plan with "
                f"--gpus {unit.gpus} or more" + (f"; or {fp8_fix}" if fp8_fix else "")
            )
        why = "; ".join(f"the {role} pool: {r}" for role, r in (moe_why or {}).items())
        return (
            f"plan: {s.model} fits {what} on {gpu} {room}, but the MoE layout search kept "
            f"no worker for {why or 'a pool'}"
        )
    where = (
        f"within a budget of {budget} x {gpu}" if budget is not None else f"of any size on {gpu}"
    )
    head = f"plan: no worker {where} fits {s.model} {room}"
    if top < MAX_GPUS:  # TP limited by the fabric (or the options): would a larger TP fit?
        limit = (
            "the fabric (kind: topology) keeps each worker's TP group inside one node of "
            f"{top} GPUs"
            if top == fab_tp
            else f"TP at most {top}"
        )
        head += f" where {limit}"
        wider = smallest_unit(loaded, gpu, need_tokens)
        if wider is not None and top == fab_tp:
            head += (
                f"; tp {wider.tp} ({wider.gpus} GPUs) would fit across nodes (a fabric of "
                "kind: link prices TP beyond a node, docs/validity.md)"
            )
    if refusals and "does not fit" not in refusals[list(refusals)[-1]]:
        return head + refusal_note(refusals)  # not memory: the reason is what to fix
    if not fp8_fix:  # the cost model's reason for the largest worker tried
        head += refusal_note(refusals)
    fixes = [f for f in (fp8_fix, "use a GPU with more memory or shorter requests") if f]
    return f"{head}: {'; or '.join(fixes)}"


def _unit_name(lay: Layout) -> str:
    return f"tp {lay.tp}" + (f" x dp {lay.dp}" if lay.dp > 1 else "")


def tp_options(
    loaded: LoadedScenario, gpu_budget: int, lengths, max_tp: int | None = None
) -> list[int]:
    """TP degrees a worker may use: valid for the model, up to the budget and ``max_tp``,
    holding a p99 request's KV. Beyond one node's NVLink domain a TP group's all-reduce is
    priced hierarchically (:mod:`disaggsim.costmodel.tp_layout`), so such degrees are
    candidates too; the analytic bound prunes them where they cannot win."""
    gpu = plan_gpu(loaded)
    top = min(gpu_budget, max_tp or gpu_budget, fabric_max_tp(loaded))
    # a decode (colocated: the pool's) worker holds the whole request, with its pool's
    # limits (they size its memory reserve)
    return fitting_tps(loaded, gpu, top, _p99_kv_tokens(lengths), limits=_decode_limits(loaded))


def _decode_limits(loaded: LoadedScenario):
    """Layout -> the limits of a candidate's decode worker of that layout."""
    return lambda lay: pool_limits(loaded, lay, "decode")


def fabric_max_tp(loaded: LoadedScenario) -> int:
    """The largest TP group the scenario's fabric can hold: a ``kind: topology`` fabric
    places each worker inside one node (its ``gpus_per_node``, else the catalog's), a
    ``kind: link`` fabric prices TP beyond a node hierarchically (no limit here)."""
    from disaggsim.fabric import FabricTopologyConfig

    fab = loaded.scenario.fabric
    if not isinstance(fab, FabricTopologyConfig):
        return MAX_GPUS
    return fab.gpus_per_node or get_gpu(plan_gpu(loaded)).gpus_per_node


def _dtypes(loaded: LoadedScenario, options: PlanOptions) -> list[str | None]:
    """None (the scenario's weight dtype), then each extra one asked for."""
    out: list[str | None] = [None]
    for d in options.weight_dtypes:
        if d != loaded.scenario.weight_dtype and d not in out:
            out.append(d)
    return out


def _own_chunk(loaded: LoadedScenario) -> int:
    s = loaded.scenario
    if s.pool is not None and s.pool.scheduler == "chunked":
        return s.pool.max_batch_tokens
    return DEFAULT_CHUNK_TOKENS


def disagg_neighbours(c: Candidate, budget: int) -> list[list[Candidate]]:
    """Worker-count moves of a disaggregated candidate, in tiers: (1) along the full
    budget, one prefill worker more or fewer and decode filling the rest; (2) one worker
    more or fewer in one pool; (3) one worker fewer in a pool with the other scaled to
    keep the P:D ratio, and one more or fewer in both (a budget that cannot be split in
    the ratio can lose to a smaller deployment that can)."""
    n_p0, n_d0 = c.num_prefill_workers, c.num_decode_workers

    g_p, g_d = c.prefill_layout.gpus, c.decode_layout.gpus

    def fits(n_p: int, n_d: int) -> bool:
        return n_p >= 1 and n_d >= 1 and n_p * g_p + n_d * g_d <= budget

    def at(pairs) -> list[Candidate]:
        return [
            dataclasses.replace(c, num_prefill_workers=p, num_decode_workers=d)
            for p, d in dict.fromkeys(pairs)
            if fits(p, d) and (p, d) != (n_p0, n_d0)
        ]

    line = [(n_p, (budget - n_p * g_p) // g_d) for n_p in (n_p0 - 1, n_p0 + 1)]
    single = [(n_p0 + dp, n_d0) for dp in (-1, 1)] + [(n_p0, n_d0 + dd) for dd in (-1, 1)]
    ratio = []
    if n_p0 > 1:
        x = n_d0 * (n_p0 - 1) / n_p0
        ratio += [(n_p0 - 1, math.floor(x)), (n_p0 - 1, math.ceil(x))]
    if n_d0 > 1:
        x = n_p0 * (n_d0 - 1) / n_d0
        ratio += [(math.floor(x), n_d0 - 1), (math.ceil(x), n_d0 - 1)]
    both = [(n_p0 + dp, n_d0 + dd) for dp in (-1, 1) for dd in (-1, 1)]
    tiers = [at(line), at(single), at(ratio + both)]
    seen: set[Candidate] = set()
    out = []
    for tier in tiers:
        fresh = [x for x in tier if x not in seen]
        seen.update(fresh)
        out.append(fresh)
    return out


def disagg_family(
    name: str,
    bound_per_gpu: float,
    start: Candidate,
    budget: int,
    *,
    tolerance: float = 0.0,
    true_bound: bool = False,
) -> Family[Candidate]:
    """A disaggregated family (one pair of worker layouts): it climbs from ``start`` by
    the worker-count moves of :func:`disagg_neighbours`, then tries the splits that
    :func:`balanced_splits` predicts better than its best (``tolerance``: the share
    within which a goodput is measured)."""
    return Family(
        name=name,
        kind="disaggregate",
        bound_per_gpu=bound_per_gpu,
        starts=(start,),
        neighbours=lambda c: disagg_neighbours(c, budget),
        true_bound=true_bound,
        predict=lambda c, seen: balanced_splits(c, seen, budget, tolerance),
        floor_at_nearest=True,  # the analytic split can be off: +-1 prefill worker first
    )


def balanced_splits(
    best: Candidate, measured: Mapping[Candidate, float], budget: int, tolerance: float = 0.0
) -> dict[Candidate, float]:
    """Predicted goodput per GPU of the best-balanced splits of ``best``'s layouts (one or
    two at every decode worker count the budget holds), from a bottleneck model fitted to
    the family's measured members (candidate -> goodput per GPU).

    **Model.** A split of ``P`` prefill and ``D`` decode workers serves what its slower
    pool does, ``min(P p, D d)`` for per-worker rates ``p`` and ``d``. Every member bounds
    each rate from below (``p >= goodput / P``); the largest such quotient is the
    estimate, exact once some member was limited by that pool. A member was limited by
    prefill when one with the same decode workers and more prefill workers served more,
    by more than the ``tolerance`` (decode likewise: compared at the same size of the
    other pool, the test holds when per-worker rates grow with a pool's size). A rate no
    member was limited by may be higher than its estimate: it is doubled (when neither
    was shown, each in turn, the better prediction kept), so the splits that would show
    it are predicted better and get tried; each try is limited by that pool (the rate is
    then known) or raises the estimate.

    **Splits.** For a fixed ``D`` the predicted goodput per GPU rises with ``P`` while
    prefill limits and falls after: the best ``P`` is the floor or the ceiling of the
    balance ``D d / p`` (or the most the budget leaves). So the family's optimum under the
    model, a split of the whole budget or a smaller one whose counts are closer to the
    ratio, is among these.

    **Pooling.** The model leaves out that a pool's per-worker rate grows with its size
    (more workers share the bursts): it predicts a smaller split than the measured ones
    above what it serves (the cost is an evaluation) and a larger one below. A split of
    more GPUs than ``best`` is therefore predicted ``1 + tolerance`` times the model's
    value: the optimiser, which tries a prediction that beats the best by more than the
    tolerance, tries a larger split predicted better at all."""
    g_p, g_d = best.prefill_layout.gpus, best.decode_layout.gpus
    served = [
        (m.num_prefill_workers, m.num_decode_workers, v * m.num_gpus)
        for m, v in measured.items()
        if v > 0
    ]
    if not served:
        return {}
    p = max(s / n_p for n_p, _, s in served)
    d = max(s / n_d for _, n_d, s in served)
    slack = 1 + max(tolerance, 1e-9)  # on an exact landscape: rounding only
    p_shown = any(
        a_d == b_d and a_p < b_p and a * slack < b
        for a_p, a_d, a in served
        for b_p, b_d, b in served
    )
    d_shown = any(
        a_p == b_p and a_d < b_d and a * slack < b
        for a_p, a_d, a in served
        for b_p, b_d, b in served
    )
    rates = [(p if p_shown else 2 * p, d)] if d_shown else [(p, 2 * d)]
    if not (p_shown or d_shown):
        rates.append((2 * p, d))
    out: dict[Candidate, float] = {}
    for rate_p, rate_d in rates:
        for n_d in range(1, (budget - g_p) // g_d + 1):
            most = (budget - n_d * g_d) // g_p
            balance = n_d * rate_d / rate_p
            for n_p in dict.fromkeys(
                min(max(x, 1), most) for x in (math.floor(balance), math.ceil(balance))
            ):
                c = dataclasses.replace(best, num_prefill_workers=n_p, num_decode_workers=n_d)
                v = min(n_p * rate_p, n_d * rate_d) / c.num_gpus
                if c.num_gpus > best.num_gpus:
                    v *= 1 + tolerance
                out[c] = max(out.get(c, 0.0), v)
    return out


def fine_chunks(ladder: tuple[int, ...], steps: int) -> tuple[int, ...]:
    """The ladder with each gap between neighbouring rungs cut into ``steps`` equal
    parts (1: the ladder itself), rounded down to whole tokens."""
    rungs = sorted(set(ladder))
    fine = set(rungs)
    for a, b in zip(rungs, rungs[1:], strict=False):
        fine.update(a + (b - a) * k // steps for k in range(1, max(steps, 1)))
    return tuple(sorted(fine))


def chunk_levels(fine_steps: int) -> tuple[int, ...]:
    """The cuts of the ladder :func:`chunk_neighbours` climbs, coarsest first: 1 (the
    ladder), 2, 4 ... up to ``fine_steps``."""
    levels, k = [1], 2
    while k <= fine_steps:
        levels.append(k)
        k *= 2
    return tuple(levels)


def chunk_neighbours(
    c: Candidate, ladder: tuple[int, ...], fine_steps: int = 1
) -> list[list[Candidate]]:
    """The next smaller and larger chunk on the ladder (the candidate's own chunk may be
    off the ladder: then its nearest rungs on each side); with ``fine_steps`` > 1, more
    tiers, each tried once the one before is: the next smaller and larger chunk on the
    ladder cut in 2, then in 4 ... up to ``fine_steps`` between rungs
    (:func:`fine_chunks`), so the climb halves its step where the ladder's rungs stop
    gaining. Goodput rises with the chunk until the steps that carry one break the ITL
    target and falls there at once: the ladder's doubling can leave the best rung up to
    twice below that edge (docs/planning.md §2, "Chunks between the rungs")."""
    assert c.chunk_tokens is not None
    tiers = []
    for k in chunk_levels(fine_steps):
        rungs = fine_chunks(ladder, k)
        below = [x for x in rungs if x < c.chunk_tokens]
        above = [x for x in rungs if x > c.chunk_tokens]
        picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
        tiers.append([dataclasses.replace(c, chunk_tokens=x) for x in picks])
    return tiers


def chunk_starts(own: int, options: PlanOptions) -> tuple[int, ...]:
    """Chunk sizes a chunked family starts from: its own only when walking (quick mode),
    else its own and every rung of the ladder (goodput need not be unimodal in chunk)."""
    if options.walk_chunks:
        return (own,)
    return tuple(sorted({own, *options.chunk_ladder}))


def plan_families(
    loaded: LoadedScenario,
    gpu_budget: int,
    options: PlanOptions,
    lengths: tuple[np.ndarray, np.ndarray],
    requests: Requests | None = None,
) -> tuple[list[Family[Candidate]], dict[Candidate, AnalyticGuess]]:
    """The families of the search space and the analytic guess behind each start.

    Worker layouts come from :func:`worker_layouts` (TP degrees; for an MoE model also
    EP/DP layouts and unit sizes in nodes). With ``requests`` whose prompts carry prefix
    chains, on a scenario that caches them (:func:`~disaggsim.plan.analytic.cache_enabled`),
    each family's guess and bound use the expected prefix hit share of its prefill pool."""
    fams: list[Family[Candidate]] = []
    guesses: dict[Candidate, AnalyticGuess] = {}
    reuse = requests is not None and requests.prefix_chains is not None and cache_enabled(loaded)
    for dtype in _dtypes(loaded, options):
        try:
            ld = _with_dtype(loaded, dtype)
            pre_lays, dec_lays, colo_lays = worker_layouts(ld, gpu_budget, lengths, options)
        except UserError:
            continue  # e.g. FP8 weights on a GPU without FP8
        tag = f" {dtype}" if dtype else ""
        moe = get_model(ld.scenario.model).moe is not None
        moe_bound = _MoeBounds(ld, lengths, options, requests if reuse else None) if moe else None
        memo: dict = {}  # prefill sides of the guesses (analytic_guess): ld and lengths fixed

        def bound(g: AnalyticGuess, pl: Layout, dl: Layout | None = None, mb=moe_bound) -> float:
            """The family's optimistic goodput per GPU. Dense: the analytic capacity
            (simulated goodputs stayed within 5 % of it on the advisor scenarios, inside
            the pruning slack). MoE: the separate-phase capacity is no bound there (a
            colocated pool's mixed iterations share the expert weights between decode and
            prefill tokens: 65 % above it), so the bound of plan/moe_bound.py, from the
            floor of every iteration (``dl`` None: a colocated family of ``pl``)."""
            if mb is None:
                return g.capacity_per_gpu_per_s
            return mb.colocated(pl) if dl is None else mb.disaggregated(pl, dl)

        @functools.cache
        def share(lay: Layout, n: int, ld: LoadedScenario = ld, colocated: bool = False) -> float:
            if not reuse or (colocated and not colocated_cache_ok(ld)):
                return 0.0  # no cache, or a colocated pool the engine cannot cache
            assert requests is not None
            lim = pool_limits(ld, lay, "colocate_chunked" if colocated else "prefill")
            return expected_prefix_hit_share(ld, requests, num_workers=n, layout=lay, limits=lim)

        def guess(
            pl: Layout,
            dl: Layout,
            budget: int,
            ld: LoadedScenario = ld,
            colocated: int = 0,
            memo: dict = memo,
        ) -> AnalyticGuess:
            """``colocated``: the pool's workers (0: a disaggregated guess); each
            worker's KV capacity is that of the candidates' pools (a colocated guess:
            the chunked pool at the scenario's chunk)."""
            tokens, seqs = _batch_limits(ld, pl, dl, colocated > 0)
            lims = (
                (pool_limits(ld, pl, "colocate_chunked"),) * 2
                if colocated
                else (pool_limits(ld, pl, "prefill"), pool_limits(ld, dl, "decode"))
            )
            g = analytic_guess(
                ld, prefill_tp=pl, decode_tp=dl, gpu_budget=budget, lengths=lengths,
                prefill_budget_tokens=tokens, max_batch_seqs=seqs, memo=memo,
                prefill_limits=lims[0], decode_limits=lims[1],
            )  # fmt: skip
            s = share(pl, colocated or g.num_prefill_workers, colocated=colocated > 0)
            if s <= 0:
                return g
            return analytic_guess(
                ld, prefill_tp=pl, decode_tp=dl, gpu_budget=budget, lengths=lengths,
                prefill_budget_tokens=tokens, max_batch_seqs=seqs, hit_share=s, memo=memo,
                prefill_limits=lims[0], decode_limits=lims[1],
            )  # fmt: skip

        for pl in pre_lays:
            for dl in dec_lays:
                if pl.gpus + dl.gpus > gpu_budget:
                    continue
                g = guess(pl, dl, gpu_budget)
                start = _disagg(g.num_prefill_workers, pl, g.num_decode_workers, dl, dtype)
                guesses[start] = g
                fams.append(
                    disagg_family(
                        f"disagg {pl.tag}/{dl.tag}{tag}",
                        bound(g, pl, dl),
                        start,
                        gpu_budget,
                        tolerance=options.explore_tol_fraction,
                        true_bound=moe,
                    )
                )
        for lay in colo_lays:
            n = gpu_budget // lay.gpus
            if n < 1:
                continue
            # per-GPU capacity does not depend on the split (a 1 + 1 guess); the hit
            # share depends on the pool's n workers, which all prefill
            g = guess(lay, lay, 2 * lay.gpus, colocated=n)
            ladder = options.chunk_ladder
            chunked = tuple(
                _colo("colocate_chunked", n, lay, dtype, ch)
                for ch in chunk_starts(_own_chunk(loaded), options)
            )
            vllm = _colo("colocate_vllm", n, lay, dtype)
            for c in (*chunked, vllm):
                guesses[c] = g
            fams.append(
                Family(
                    name=f"chunked {lay.tag}{tag}",
                    kind="colocate_chunked",
                    bound_per_gpu=bound(g, lay),
                    starts=chunked,
                    neighbours=functools.partial(
                        chunk_neighbours, ladder=ladder, fine_steps=options.chunk_fine_steps
                    ),
                    true_bound=moe,
                    # the start chunk is the scenario's, not a guess: a chunked family
                    # is judged at its best chunk's nearest moves (qwen3-30b-a3b on 4
                    # H100, 2000/200 tokens: chunked tp2 served 4.8 req/s per GPU at
                    # chunk 512 and 12.0 at 8192, the best colocated deployment)
                    floor_at_nearest=True,
                    floor_at_nearest_always=True,
                    floor_tiers=len(chunk_levels(options.chunk_fine_steps)),
                    coarse_tiers=1,
                )
            )
            fams.append(
                Family(
                    name=f"vllm {lay.tag}{tag}",
                    kind="colocate_vllm",
                    bound_per_gpu=bound(g, lay),
                    starts=(vllm,),
                    neighbours=lambda c: [],
                    true_bound=moe,
                )
            )
    return fams, guesses


class _MoeBounds:
    """Goodput-per-GPU bounds of MoE families (:mod:`disaggsim.plan.moe_bound`) with the
    batch limits :func:`candidate_scenario` gives the candidates' pools."""

    def __init__(
        self,
        loaded: LoadedScenario,
        lengths: tuple[np.ndarray, np.ndarray],
        options: PlanOptions,
        requests: Requests | None,
    ) -> None:
        from disaggsim.plan.moe_bound import request_work

        s = loaded.scenario
        self.loaded = loaded
        self.gpu = plan_gpu(loaded)
        share = _unbounded_share(requests) if requests is not None else None
        self.work = request_work(*lengths, max_hit_share=share or 0.0)
        pre = _pool_base(s.prefill_pool or s.pool)
        dec = _pool_base(s.decode_pool or s.pool)
        tokens = pre["max_batch_tokens"]
        if s.architecture == "colocated":
            tokens = max(tokens, 8192)
        # per data-parallel rank, as candidate_scenario scales them
        self.prefill_tokens = max(tokens, largest_prompt_tokens(loaded) or 0)
        self.seqs = int(dec["max_batch_seqs"])
        chunks = (_own_chunk(loaded), *options.chunk_ladder)
        self.colocated_tokens = max(self.prefill_tokens, *chunks)  # vllm's budget or a chunk
        self._costs: dict[tuple[Layout, str], Any] = {}

    def _cost(self, lay: Layout, role: str):
        """A worker of ``lay`` in ``role`` with its candidate pool's limits."""
        if (lay, role) not in self._costs:
            lim = pool_limits(self.loaded, lay, role)
            self._costs[lay, role] = worker_cost(self.loaded, self.gpu, lay, limits=lim)
        return self._costs[lay, role]

    def disaggregated(self, pl: Layout, dl: Layout) -> float:
        from disaggsim.plan.moe_bound import decode_batch_limit, disaggregated_bound_per_gpu

        try:
            pc, dc = self._cost(pl, "prefill"), self._cost(dl, "decode")
        except UserError:
            return math.inf
        if not hasattr(pc, "iteration_floor") or not hasattr(dc, "iteration_floor"):
            return math.inf
        seqs = decode_batch_limit(self.seqs * dl.dp, dc.kv_capacity_tokens, self.work)
        return disaggregated_bound_per_gpu(
            pc.iteration_floor(), pl.gpus, self.prefill_tokens * pl.dp,
            dc.iteration_floor(), dl.gpus, seqs, self.work,
        )  # fmt: skip

    def colocated(self, lay: Layout) -> float:
        from disaggsim.plan.moe_bound import colocated_bound_per_gpu

        try:
            cost = self._cost(lay, "colocate_chunked")
        except UserError:
            return math.inf
        if not hasattr(cost, "iteration_floor"):
            return math.inf
        tokens = lay.dp * (self.seqs + self.colocated_tokens)
        return colocated_bound_per_gpu(cost.iteration_floor(), lay.gpus, tokens, self.work)


def headline_layouts(
    guesses: Mapping[Candidate, AnalyticGuess], fallback: Layout
) -> tuple[Layout, Layout]:
    """The prefill and decode layouts of the plan's headline guess (dense models): of
    the disaggregated families' starts with the scenario's weights, the one with the
    highest analytic capacity per GPU; ``fallback`` for both pools when there is none
    (a budget too small to split)."""
    pairs = [g for c, g in guesses.items() if c.kind == "disaggregate" and c.weight_dtype is None]
    if not pairs:
        return fallback, fallback
    top = max(pairs, key=lambda g: g.capacity_per_gpu_per_s)
    return top.prefill_layout, top.decode_layout


def _disagg(n_p: int, pl: Layout, n_d: int, dl: Layout, dtype: str | None) -> Candidate:
    return Candidate(
        "disaggregate", n_p, pl.tp, n_d, dl.tp, weight_dtype=dtype,
        prefill_dp=pl.dp, prefill_ep=pl.ep, decode_dp=dl.dp, decode_ep=dl.ep,
    )  # fmt: skip


def _colo(kind: str, n: int, lay: Layout, dtype: str | None, chunk: int | None = None):
    return Candidate(
        kind, n, lay.tp, chunk_tokens=chunk, weight_dtype=dtype,
        prefill_dp=lay.dp, prefill_ep=lay.ep,
    )  # fmt: skip


def _batch_limits(
    loaded: LoadedScenario, pl: Layout, dl: Layout, colocated: bool = False
) -> tuple[int | None, int | None]:
    """The analytic guess's prefill token budget and decode batch limit for workers of
    these layouts: the scenario's limits per data-parallel rank, times the ranks (what
    :func:`candidate_scenario` gives the candidate's pools). None (the scenario's own)
    for single-rank layouts."""
    if pl.dp == 1 and dl.dp == 1:
        return None, None
    s = loaded.scenario
    pre = _pool_base(s.prefill_pool or s.pool)
    dec = _pool_base(s.decode_pool or s.pool)
    tokens = pre["max_batch_tokens"]
    if s.architecture == "colocated" or colocated:
        tokens = max(tokens, 8192)
    tokens = max(tokens, largest_prompt_tokens(loaded) or 0)
    return tokens * pl.dp, dec["max_batch_seqs"] * dl.dp


def worker_layouts(
    loaded: LoadedScenario,
    gpu_budget: int,
    lengths: tuple[np.ndarray, np.ndarray],
    options: PlanOptions,
    moe_why: dict[str, str] | None = None,
) -> tuple[list[Layout], list[Layout], list[Layout]]:
    """Worker layouts the search tries for (prefill, decode, colocated) pools.

    Dense models: every TP degree of :func:`tp_options`, for every pool. MoE models
    also spread attention over data-parallel ranks and experts over EP ranks, in units
    of 1–4 GPUs or whole nodes (:func:`disaggsim.plan.moe_layouts.search_moe_layouts`
    ranks every valid ``(tp, dp, ep)`` per unit size by tokens per second per GPU in
    each role); each role keeps the best layout of each of its
    ``options.moe_unit_sizes`` best unit sizes, colocated pools the union of both
    roles' layouts. Layouts hold a p99 request's KV on one DP rank; on a ``kind:
    topology`` fabric each rank's TP group fits one of its nodes (a unit of several
    ranks may span nodes, the fewest it can: docs/fabric.md). A role for which the MoE
    search keeps no layout falls back to the plain TP layouts; ``moe_why`` (when given)
    gets that role's reason (:func:`_moe_layouts`)."""
    tps = tp_options(loaded, gpu_budget, lengths, options.max_tp)
    dense = [Layout(tp) for tp in tps]
    if get_model(loaded.scenario.model).moe is None:
        return dense, dense, dense
    why: dict[str, str] = {}
    pre = _moe_layouts(loaded, gpu_budget, lengths, options, "prefill", why) or dense
    dec = _moe_layouts(loaded, gpu_budget, lengths, options, "decode", why) or dense
    if moe_why is not None:
        moe_why.update(why)
    colo = list(dict.fromkeys([*dec, *pre]))
    return pre, dec, colo


def _moe_layouts(
    loaded: LoadedScenario,
    gpu_budget: int,
    lengths: tuple[np.ndarray, np.ndarray],
    options: PlanOptions,
    role: str,
    why: dict[str, str] | None = None,
) -> list[Layout]:
    """The best MoE layout of each of the ``options.moe_unit_sizes`` best unit sizes for
    ``role`` (:func:`worker_layouts`); when it keeps none, ``why[role]`` says why: the
    reason for the largest layout left out (the cost model refused it, no batch met the
    ITL target, its KV holds no p99 request, or its TP group exceeds the fabric's)."""
    from disaggsim.costmodel.moe import build_cost
    from disaggsim.plan.analytic import kv_capacity_per_rank, moe_options
    from disaggsim.plan.moe_layouts import search_moe_layouts, unit_sizes

    s = loaded.scenario
    gpu = plan_gpu(loaded)
    # the node size of the fabric's placement (a topology's gpus_per_node), else the catalog's
    gpn = getattr(s.fabric, "gpus_per_node", None) or get_gpu(gpu).gpus_per_node
    rank_tp = fabric_max_tp(loaded)  # a TP group's GPUs share a node on a topology
    sizes = tuple(g for g in unit_sizes(gpn, max(1, gpu_budget // gpn)) if g <= gpu_budget)
    prompts, outputs = lengths
    p_mean, o_mean = float(prompts.mean()), float(outputs.mean())
    pool = s.prefill_pool or s.pool
    assert pool is not None
    per_rank_tokens = max(_pool_base(pool)["max_batch_tokens"], int(p_mean))
    moe = moe_options(loaded)
    found = search_moe_layouts(
        s.model, gpu, role,
        prompt_tokens=max(1, int(p_mean)),
        context_tokens=max(1, int(p_mean + 0.5 * o_mean)),
        itl_s=s.slo.itl_s,
        tokens_per_rank=per_rank_tokens,
        sizes=sizes,
        weight_dtype=s.weight_dtype,
        kv_dtype=s.kv_dtype,
        moe=moe,
        gpus_per_node=gpn,
        ttft_s=s.slo.ttft_s,
    )  # fmt: skip
    need = _p99_kv_tokens(lengths)
    left_out: dict[str, str] = dict(found.skipped)  # layout -> why it was left out
    best: dict[int, Layout] = {}  # unit size -> its best layout (estimates are best first)
    for e in found.estimates:
        key = f"{e.gpus} GPUs tp{e.tp} dp{e.dp} ep{e.ep}"
        if e.gpus in best:
            continue
        if e.tp > rank_tp:
            left_out[key] = f"tp {e.tp} exceeds the fabric's node of {rank_tp} GPUs"
            continue
        if options.max_tp is not None and e.tp > options.max_tp:
            left_out[key] = f"tp {e.tp} exceeds the search's limit of {options.max_tp}"
            continue
        default_ep = e.gpus if e.dp > 1 else 1
        lay = Layout(e.tp, e.dp, None if e.ep == default_ep else e.ep)
        # the KV capacity of the role's pool (its limits size the memory reserve)
        lim = pool_limits(loaded, lay, role)
        try:
            cost = build_cost(
                s.model, gpu, lay.tp, dp=lay.dp, ep=lay.ep, moe=moe,
                weight_dtype=s.weight_dtype, kv_dtype=s.kv_dtype, engine=s.engine,
                gpus_per_node=gpn, gpu_mem_util=lim.gpu_mem_util,
                max_seqs=lim.max_batch_seqs, max_batch_tokens=lim.max_batch_tokens,
                activation_reserve_bytes=(
                    None if lim.activation_reserve_gib is None
                    else lim.activation_reserve_gib * GiB
                ),
            )  # fmt: skip
        except UserError as err:
            left_out[key] = str(err)
            continue
        if kv_capacity_per_rank(cost) >= need:
            best[e.gpus] = lay
        else:
            left_out[key] = (
                f"a rank's KV holds {kv_capacity_per_rank(cost)} tokens, under a p99 "
                f"request's {need}"
            )
    if not best and why is not None:
        if left_out:
            # a layout that could be built says more than one refused for memory (the
            # ITL target or KV rule it out, not the memory of a layout too small): the
            # largest such layout's reason, else the largest refused one's
            def weight(k: str) -> tuple[bool, int]:
                return ("does not fit" not in left_out[k], int(k.split()[0]))

            key = max(left_out, key=weight)
            why[role] = f"no MoE layout kept (at {key}: {left_out[key]})"
        else:
            why[role] = f"no MoE layout of at most {gpu_budget} GPUs"
    # the unit sizes whose layout prefills a prompt alone within half the TTFT target first
    ranked = sorted(
        best.values(), key=lambda lay: (_slow_for_ttft(found, lay), -_rate_of(found, lay))
    )
    return ranked[: options.moe_unit_sizes]


def _estimate_of(found, lay: Layout):
    return next(
        (e for e in found.estimates if (e.gpus, e.tp, e.dp) == (lay.gpus, lay.tp, lay.dp)), None
    )


def _rate_of(found, lay: Layout) -> float:
    e = _estimate_of(found, lay)
    return 0.0 if e is None else float(e.tokens_per_s_per_gpu)


def _slow_for_ttft(found, lay: Layout) -> bool:
    e = _estimate_of(found, lay)
    return e is not None and e.slow_for_ttft


def all_candidates(
    gpu_budget: int,
    tps: list[int] | list[Layout],
    chunks: tuple[int, ...],
    dtypes: tuple[str | None, ...] = (None,),
) -> list[Candidate]:
    """Every deployment of the search space a user could write by hand: any worker
    counts that fit the budget (colocated ones too), every pair of layouts (TP degrees,
    or MoE :class:`Layout` s) and chunk (the exhaustive baseline the planner is tested
    against)."""
    lays = [t if isinstance(t, Layout) else Layout(t) for t in tps]
    out = []
    for dt in dtypes:
        for pl in lays:
            for dl in lays:
                for n_p in range(1, gpu_budget // pl.gpus + 1):
                    for n_d in range(1, (gpu_budget - n_p * pl.gpus) // dl.gpus + 1):
                        out.append(_disagg(n_p, pl, n_d, dl, dt))
        for lay in lays:
            for n in range(1, gpu_budget // lay.gpus + 1):
                out += [_colo("colocate_chunked", n, lay, dt, ch) for ch in chunks]
                out.append(_colo("colocate_vllm", n, lay, dt))
    return out


# ------------------------------------------------------------------ evaluation


class _Evaluator:
    """Steady-state goodput of candidates, one ``goodput_many`` per call.

    ``stage="explore"``: the exploration rule and tolerance, no confirmation run (the
    hill climb compares candidates); each candidate's first bracket is its analytic
    capacity, or, once a relative of it has a goodput, that goodput scaled to its GPUs.
    ``stage="final"``: the full rule and tolerance with the confirmation at twice the
    horizon, bracketed around the candidate's explored goodput."""

    def __init__(
        self,
        loaded: LoadedScenario,
        guesses: dict[Candidate, AnalyticGuess],
        options: PlanOptions,
        executor: Executor | None,
        progress: Callable[[int, int], None] | None,
        stage: str = "final",
        explored: dict[Candidate, GoodputResult] | None = None,
        counter: list[int] | None = None,
        memo: dict | None = None,
    ) -> None:
        self.loaded = loaded
        self.guesses = guesses
        self.options = options
        self.executor = executor
        self.progress = progress
        self.stage = stage
        self.explored = explored or {}
        self.results: dict[Candidate, GoodputResult] = {}
        self.invalid: dict[Candidate, str] = {}  # deployments that cannot be built
        self.label = str(loaded.path) if loaded.path else "<scenario>"
        self.counter = counter if counter is not None else [0]  # simulations, all stages
        # (stage, candidate, screen) -> its search, of this plan and of earlier searches
        # of the same question (search's ``memo``): asked again, it is not run again
        self.memo = memo if memo is not None else {}
        # what a search depends on of the options: all but the wave limit and the
        # families exempt from the floor (a search with more waves, or one that walks a
        # stopped family on, replays these searches up to where it goes further)
        self._memo_options = dataclasses.replace(options, max_waves=0, floor_exempt=())
        self._residence: dict[tuple, float] = {}  # family -> residence in service times
        # chunked candidates not simulated: a smaller chunk's search, whose runs never
        # filled their token budget, is theirs (:meth:`_same_runs`): candidate -> donor
        self.same_runs: dict[Candidate, Candidate] = {}
        self._kv_tokens: dict[Candidate, int] = {}

    @property
    def simulations(self) -> int:
        return self.counter[0]

    def _family_key(self, c: Candidate) -> tuple:
        return (c.kind, c.prefill_layout, c.decode_layout, c.weight_dtype)

    def _guess(self, c: Candidate) -> AnalyticGuess:
        return self.guesses.get(c) or next(
            v for k, v in self.guesses.items() if self._family_key(k) == self._family_key(c)
        )

    def residence_multiple(self, c: Candidate) -> float:
        """The loaded residence of a mean request in ``c``'s family
        (:func:`~disaggsim.plan.analytic.loaded_residence_s`) in service times of ``c``
        (the run-length rule's unit, :func:`~disaggsim.sweep.goodput.steady_profile`),
        rounded up to a power of 2^(1/4) so that a few rules serve every family."""
        key = self._family_key(c)
        if key not in self._residence:
            src = self.source(c)
            service_s = steady_profile(load_scenario(src.raw, base_dir=src.base_dir)).service_s
            g = self._guess(c)
            residence_s = loaded_residence_s(g, self.loaded.scenario.slo, c.kind != "disaggregate")
            m = residence_s / service_s if service_s > 0 else 0.0
            self._residence[key] = 2 ** (math.ceil(4 * math.log2(m)) / 4) if m > 1 else 1.0
        return self._residence[key]

    def rule_for(self, c: Candidate, rule: RunLengthRule) -> RunLengthRule:
        """``rule`` with its warm-up and its measurement window each at least the loaded
        residence of a mean request in ``c``. A shorter run measures requests that spend
        much of their lives after arrivals have stopped, in an emptying system (decode
        batches free of new prompts), and ends before the deployment has filled (decode
        KV, batch slots): rates above capacity meet the SLO there (docs/planning.md,
        "Run lengths")."""
        m = self.residence_multiple(c)
        if m <= rule.warmup_service_multiple and m <= rule.service_multiple:
            return rule
        return dataclasses.replace(
            rule,
            warmup_service_multiple=max(rule.warmup_service_multiple, m),
            service_multiple=max(rule.service_multiple, m),
        )

    def _bracket(self, c: Candidate) -> tuple[float, float]:
        o = self.options
        seen = self.explored.get(c)
        if seen is not None and seen.rate_per_s > 0:
            return 0.8 * seen.rate_per_s, 1.15 * seen.rate_per_s
        centre = self._relative_centre(c)
        if centre is not None:
            return (1 - o.relative_bracket) * centre, (1 + o.relative_bracket) * centre
        cap = self._guess(c).capacity_per_gpu_per_s * c.num_gpus
        return o.rate_lo_factor * cap, o.rate_hi_factor * cap

    def _relative_centre(self, c: Candidate) -> float | None:
        """The best goodput per GPU of ``c``'s family so far, scaled to ``c``'s GPUs
        (None: none yet)."""
        rel = [
            r.per_gpu_per_s
            for k, r in self.results.items()
            if self._family_key(k) == self._family_key(c) and r.per_gpu_per_s > 0
        ]
        return max(rel) * c.num_gpus if rel else None

    def _bisected(self, c: Candidate) -> tuple[float, float] | None:
        """The explored search's last met and missed rates of ``c``, when the options
        confirm explored goodputs directly (``confirm_explored``: quick mode, whose final
        rule is about as long as its exploration's once both last a loaded residence)."""
        seen = self.explored.get(c)
        if self.stage != "final" or not self.options.confirm_explored or seen is None:
            return None
        lo = seen.rate_per_s
        if not (lo > 0 and math.isfinite(lo)):
            return None
        missed = [e.rate_per_s for e in seen.evaluations if not e.meets and e.rate_per_s > lo]
        return (lo, min(missed)) if missed else None

    def source(self, c: Candidate) -> Source:
        raw = candidate_scenario(self.loaded, c, name=f"{self.loaded.scenario.name}-{_slug(c)}")
        try:
            cl = load_scenario(raw, base_dir=self.loaded.base_dir)
        except UserError as e:
            raise UserError(f"{self.label}: candidate {c.label}: {e}") from None
        return source_of(cl, self.label)

    def _fabric_problem(self, c: Candidate) -> str | None:
        """Why ``c`` cannot be built: a pool whose token budget is under its batch cap
        (vLLM refuses it: a chunk under a raised ``max_batch_seqs``), a pool of more
        workers than a scenario may hold (a
        budget over 1,024 GPUs in small workers: docs/safety.md), or, on the scenario's
        fabric, NVLink beyond one node (``kind: link``) or workers a ``kind: topology``
        fabric cannot place."""
        most = max(c.num_prefill_workers, c.num_decode_workers)
        if c not in self.invalid:
            # vLLM refuses a scheduler whose token budget is under its batch cap
            # (max_num_batched_tokens < max_num_seqs): a chunk of the ladder under a
            # (raised) cap is a deployment no engine launches
            for key, pool in candidate_pools(self.loaded, c).items():
                lim = PoolLimits.of(pool)
                if lim.max_batch_tokens < lim.max_batch_seqs:
                    self.invalid[c] = (
                        f"{key}: max_batch_tokens {lim.max_batch_tokens} under max_batch_seqs "
                        f"{lim.max_batch_seqs} (vLLM refuses max_num_batched_tokens < "
                        "max_num_seqs)"
                    )
                    break
        if c not in self.invalid and most > MAX_WORKERS_PER_POOL:
            self.invalid[c] = (
                f"a pool of {most:,} workers, more than the {MAX_WORKERS_PER_POOL:,} a "
                "scenario may hold (docs/safety.md)"
            )
        if c not in self.invalid and c.kind == "disaggregate":
            from disaggsim.run import build_topology

            raw = candidate_scenario(self.loaded, c)
            cs = load_scenario(raw, base_dir=self.loaded.base_dir).scenario
            problem = link_fabric_problem(cs)
            if problem is None:
                try:
                    build_topology(cs, self.label)
                except UserError as e:
                    problem = str(e)
            if problem is not None:
                self.invalid[c] = problem
        return self.invalid.get(c)

    def _same_runs(self, c: Candidate) -> tuple[Candidate, GoodputResult] | None:
        """A smaller chunk of ``c``'s pool searched in this stage whose search is ``c``'s
        (docs/planning.md §2, "Chunk sizes that cannot bind"), with its result, or None.
        Where no chunked step of the runs that decided its goodput (the runs at or below
        the lowest rate that missed above it, its confirmation and retests included)
        filled its token budget with prompt tokens left waiting
        (``Summary.num_chunk_budget_full_steps`` 0), a pool of a larger chunk and the
        same KV capacity runs those rates step for step alike: it meets where that one
        met and misses where it missed, so its goodput is the same. One seed only (the
        summaries are the first seed's)."""
        if c.kind != "colocate_chunked" or c.chunk_tokens is None or self.options.seeds != 1:
            return None
        for d, r in self.results.items():
            if not _smaller_chunk(d, c) or d in self.same_runs:
                continue
            seen = self.explored.get(d)
            if self._bisected(d) is not None and seen is not None:
                # a finalist confirmed at once (quick mode): its bisection is the
                # exploration's, its confirmation this stage's
                r = dataclasses.replace(r, evaluations=(*seen.evaluations, *r.evaluations))
            if not chunk_never_bound(r):
                continue
            if self.kv_capacity_tokens(d) == self.kv_capacity_tokens(c):
                return d, r
        return None

    def kv_capacity_tokens(self, c: Candidate) -> int:
        """A colocated candidate's worker KV capacity (tokens) as the simulator sizes it:
        ``max_batch_tokens`` (the chunk) sizes the engine's activation reserve."""
        if c not in self._kv_tokens:
            lay = c.prefill_layout
            lim = pool_limits(self.loaded, lay, c.kind, chunk=c.chunk_tokens, seqs=c.max_batch_seqs)
            loaded = _with_dtype(self.loaded, c.weight_dtype)
            cost = worker_cost(loaded, plan_gpu(loaded), lay, limits=lim)
            self._kv_tokens[c] = int(cost.kv_capacity_tokens)
        return self._kv_tokens[c]

    def __call__(
        self, cands: list[Candidate], screens: Mapping[Candidate, float] | None = None
    ) -> list[float]:
        valid = [c for c in cands if self._fabric_problem(c) is None]
        got = dict(zip(valid, self._evaluate(valid, screens or {}), strict=True)) if valid else {}
        return [got.get(c, 0.0) for c in cands]  # a deployment that cannot exist serves 0

    def _screen_bracket(self, c: Candidate, per_gpu: float) -> tuple[float, float]:
        """A screened candidate's first bracket: from the goodput per GPU it must reach
        (its ``rate_lo``, run alone first: a miss ends the search), to the top of its
        usual bracket (or the tolerance above, if that is lower)."""
        lo = per_gpu * c.num_gpus
        return lo, max(self._bracket(c)[1], lo * (1 + self.options.explore_tol_fraction))

    def _evaluate(self, cands: list[Candidate], screens: Mapping[Candidate, float]) -> list[float]:
        """One search over every candidate, each with its own run-length rule
        (:meth:`rule_for`); a candidate's next runs start as soon as its last are back.
        A screened one (``screens``: the goodput per GPU it must reach) first runs at that
        value alone and stops there if it misses (status ``below``: not measured, 0).
        A search already in :attr:`memo` (the same stage, options but for the wave limit,
        candidate and screen) is taken
        from there: its bracket came from the same results (a search replayed from its
        start asks each in the same state), so it is the search this call would run."""

        def key(c: Candidate) -> tuple:
            return (self.stage, self._memo_options, c, screens.get(c))

        pending = [c for c in dict.fromkeys(cands) if key(c) not in self.memo]
        while pending:
            # the final stage runs a chunked pool's smaller chunks first, so that a larger
            # one whose runs they show cannot differ is not run (:meth:`_same_runs`); the
            # exploration runs a wave side by side (its ladder's rungs at once in full
            # mode) and skips against the waves before it only
            now = pending
            if self.stage == "final":
                now = [c for c in pending if not any(_smaller_chunk(d, c) for d in pending)]
            pending = [c for c in pending if c not in now]
            new = []
            for c in now:
                donor = self._same_runs(c)
                if donor is None:
                    new.append(c)
                    continue
                d, r = donor
                self.memo[key(c)] = dataclasses.replace(r, scenario=f"{r.scenario} (as {c.label})")
                self.memo[("same runs", *key(c))] = d
                self.same_runs[c] = d
            if new:
                for c, r in zip(new, self._run(new, screens), strict=True):
                    self.memo[key(c)] = r
            for c in now:
                self.results[c] = self.memo[key(c)]
        out = []
        for c in cands:
            if ("same runs", *key(c)) in self.memo:
                self.same_runs[c] = self.memo[("same runs", *key(c))]
            r = self.memo[key(c)]
            self.results[c] = r
            out.append(r.per_gpu_per_s if math.isfinite(r.per_gpu_per_s) else 0.0)
        return out

    def _run(
        self, cands: list[Candidate], screens: Mapping[Candidate, float]
    ) -> list[GoodputResult]:
        """The goodput searches of ``cands`` (:meth:`_evaluate`), side by side."""
        o = self.options
        explore = self.stage == "explore"
        base = o.explore_rule if explore else o.rule
        rules = [self.rule_for(c, base) for c in cands]
        bisected = [self._bisected(c) for c in cands]
        brackets = [
            b or (self._screen_bracket(c, screens[c]) if c in screens else self._bracket(c))
            for b, c in zip(bisected, cands, strict=True)
        ]
        done = [0]
        start = self.counter[0]

        def on_progress(d: int, t: int) -> None:
            done[0] = d
            if self.progress is not None:
                self.progress(start + d, start + t)

        results = goodput_many(
            [self.source(c) for c in cands],
            brackets[0][0],
            brackets[0][1],
            brackets=brackets,
            bisected=[b is not None for b in bisected],
            screens=[c in screens and b is None for b, c in zip(bisected, cands, strict=True)],
            tol_fraction=o.explore_tol_fraction if explore else o.tol_fraction,
            seeds=o.seeds,
            rules=rules,
            confirm=not explore,
            executor=self.executor,
            progress=on_progress,
        )
        self.counter[0] += done[0]
        return results


def _per_gpu(r: GoodputResult) -> float:
    return r.per_gpu_per_s if math.isfinite(r.per_gpu_per_s) else 0.0


def finalists(
    explored: dict[Candidate, GoodputResult],
    confirmed: dict[Candidate, GoodputResult],
    margin: float,
) -> list[Candidate]:
    """Explored candidates still to confirm: in each kind, the best unconfirmed one when
    its explored goodput per GPU beats every confirmed one of its kind (so the best of
    each kind the advisor compares is a confirmed one, even after a confirmation lowered
    the first pick), and every one within ``margin`` of the best goodput known
    (confirmed ones count with their confirmed value), so no unconfirmed candidate can
    outrank the recommendation by more than the margin."""
    out: list[Candidate] = []
    best_confirmed: dict[str, float] = {}
    for c, r in confirmed.items():
        best_confirmed[c.kind] = max(best_confirmed.get(c.kind, 0.0), _per_gpu(r))
    best_open: dict[str, Candidate] = {}
    for c, r in explored.items():
        if c in confirmed or _per_gpu(r) <= 0:
            continue
        k = c.kind
        if k not in best_open or _per_gpu(r) > _per_gpu(explored[best_open[k]]):
            best_open[k] = c
    known = [_per_gpu(r) for c, r in confirmed.items()]
    known += [_per_gpu(r) for c, r in explored.items() if c not in confirmed]
    top = max(known, default=0.0)
    for c, r in explored.items():
        if c in confirmed or _per_gpu(r) <= 0:
            continue
        leads_kind = best_open.get(c.kind) == c and _per_gpu(r) > best_confirmed.get(c.kind, 0.0)
        if leads_kind or _per_gpu(r) >= (1 - margin) * top:
            out.append(c)
    return out


# ------------------------------------------------------------------ batch caps


def seqs_fixed(loaded: LoadedScenario) -> bool:
    """Whether the scenario sets the decode batch cap itself (its decode pool's, else
    its pool's ``max_batch_seqs``): then every candidate keeps it, as an engine setting
    the user chose."""
    raw = loaded.raw
    pool = raw.get("decode_pool") or raw.get("pool") or {}
    return isinstance(pool, dict) and "max_batch_seqs" in pool


def seqs_ladder(own: int, batch: int) -> tuple[int | None, ...]:
    """Decode batch caps per data-parallel rank to try: the scenario's ``own`` (None),
    then doublings up to the first at or above ``batch`` (the analytic typical batch
    with a cap of :data:`SEQS_RAISE` × ``own``: the largest within the ITL target and the
    KV), at most :data:`SEQS_RAISE` × ``own``. Just ``(None,)`` where ``batch`` fits
    ``own``: there the cap cannot bind."""
    rungs: list[int | None] = [None]
    cap = own
    while cap < batch and cap < SEQS_RAISE * own:
        cap *= 2
        rungs.append(cap)
    return tuple(rungs)


def own_seqs(loaded: LoadedScenario) -> int:
    """The scenario's decode batch cap per data-parallel rank."""
    s = loaded.scenario
    return int(_pool_base(s.decode_pool or s.pool)["max_batch_seqs"])


def candidate_seqs_ladder(
    loaded: LoadedScenario, c: Candidate, lengths: tuple[np.ndarray, np.ndarray]
) -> tuple[int | None, ...]:
    """:func:`seqs_ladder` for ``c``'s decode (colocated: its pool's) layout: the analytic
    typical batch of §1 (docs/planning.md) at :data:`SEQS_RAISE` times the scenario's cap."""
    ld = _with_dtype(loaded, c.weight_dtype)
    own = own_seqs(ld)
    dl = c.decode_layout if c.kind == "disaggregate" else c.prefill_layout
    pl = c.prefill_layout
    top = SEQS_RAISE * own
    if c.kind == "disaggregate":
        pre_lim = pool_limits(ld, pl, "prefill")
        dec_lim = pool_limits(ld, dl, "decode", seqs=top)
    else:
        pre_lim = dec_lim = pool_limits(ld, pl, c.kind, chunk=c.chunk_tokens, seqs=top)
    g = analytic_guess(
        ld, prefill_tp=pl, decode_tp=dl, gpu_budget=pl.gpus + dl.gpus, lengths=lengths,
        max_batch_seqs=top * dl.dp, prefill_limits=pre_lim, decode_limits=dec_lim,
    )  # fmt: skip
    return seqs_ladder(own, -(-g.decode_batch // dl.dp))


def raise_caps(
    explorer: _Evaluator,
    loaded: LoadedScenario,
    lengths: tuple[np.ndarray, np.ndarray],
    min_gain: float,
    budget: int,
    per_kind: int = RAISE_PER_KIND,
) -> None:
    """After the walk (at the scenario's cap), each kind's best explored candidate, and
    its runners-up explored within ``min_gain`` of it (``per_kind`` in all, best
    first), try the next larger decode batch cap on their ladders
    (:func:`candidate_seqs_ladder`), side by side, each climbing while its larger cap
    gains more than ``min_gain`` over its own smaller one (a cap that does not is left
    out of the ranking, measured but not better): at most ``log2(SEQS_RAISE)``
    explorations a climber, none where the analytic batch fits the scenario's cap, the
    scenario sets it (:func:`seqs_fixed`) or the model is MoE (whose true bound is
    computed at the scenario's cap). A disaggregated climber compares, at each larger
    cap, the split of its layouts that serves most there (:func:`resplit`), and climbs
    on from that split. A runner-up within the tolerance is a tie at the
    scenario's cap, and a larger cap can part them: llama-3-8b on 4 B200, 100/50 tokens
    (docs/planning.md §7, q8), full mode raised 1P x tp2 + 2D x tp1 to 399 req/s per
    GPU and never 1P + 1D x tp1, 497 at the larger cap."""
    if seqs_fixed(loaded) or get_model(loaded.scenario.model).moe is not None:
        return
    climbing: dict[Candidate, tuple[Candidate, tuple[int | None, ...]]] = {}  # start -> now
    for kind in KINDS:
        rows = sorted(
            (
                (c, _per_gpu(r))
                for c, r in explorer.results.items()
                if c.kind == kind and r.status != "below"
            ),
            key=lambda x: -x[1],
        )
        if not rows or not rows[0][1] > 0:
            continue
        top = rows[0][1]
        for c, v in rows[:per_kind]:
            if v * (1 + min_gain) < top:
                break
            ladder = candidate_seqs_ladder(loaded, c, lengths)
            if len(ladder) > 1:
                climbing[c] = (c, ladder)
    while True:
        step = {}
        for start, (c, ladder) in climbing.items():
            i = ladder.index(c.max_batch_seqs) + 1
            if i < len(ladder):
                step[start] = dataclasses.replace(c, max_batch_seqs=ladder[i])
        if not step:
            return
        had = set(explorer.results)
        got = explorer(list(step.values()))
        gained = {}
        for (start, c), v in zip(step.items(), got, strict=True):
            base = _per_gpu(explorer.results[climbing[start][0]])
            best, tried = resplit(explorer, c, budget, min_gain) if v > 0 else (c, [c])
            won = explorer.results.get(best)
            if won is not None and _per_gpu(won) > base * (1 + min_gain):
                gained[start] = (best, climbing[start][1])
            for x in tried:
                r = explorer.results.get(x)
                if x not in had and r is not None and not _per_gpu(r) > base * (1 + min_gain):
                    # no gain past the tolerance: the cap does not matter here, and a
                    # bisection's noise must not put a larger cap in the recommendation
                    explorer.results.pop(x)
        climbing = gained


def resplit(
    explorer: _Evaluator, c: Candidate, budget: int, min_gain: float
) -> tuple[Candidate, list[Candidate]]:
    """The split of ``c``'s worker layouts that serves most per GPU at ``c``'s (raised)
    batch cap, and the candidates measured to find it (``c`` first): it climbs from ``c``
    by every tier of :func:`disagg_neighbours` (one prefill worker more or fewer along the
    whole budget, one worker more or fewer in a pool, the ratio moves) while a move gains
    more than ``min_gain``. The first tier alone missed the best split: llama-3.1-8b on 16
    B200, 100/50 tokens (docs/planning.md §7), 3P + 4D x tp1 climbed to 512 sequences and
    its line moves (2P + 14D, 4P + 12D) are decode-heavy, while 6P + 6D at 1,024 serves
    9 % more than the best colocated candidate; full mode said colocate (-9 %). A larger cap can reorder the splits the walk compared at the scenario's
    cap: a pool's per-worker rate grows with its size near saturation, so splits of one
    P:D ratio do not gain alike from more sequences (llama-3-8b on 4 B200, 100/50
    tokens, docs/planning.md §2: at 512 sequences 1P + 1D x tp1 and 2P + 2D tie; at
    1,024 the single prefill worker saturates and gains nothing, the pair serves 12 %
    more). Colocated candidates are returned as they are (their split is the budget)."""
    tried = [c]
    if c.kind != "disaggregate" or c not in explorer.results:
        return c, tried
    best, top = c, _per_gpu(explorer.results[c])
    moved = True
    while moved:
        moved = False
        # every tier: at a raised cap the best P:D ratio moves, and the full-budget line
        # alone leads a split smaller than the budget only to decode-heavy ones
        tier = [x for t in disagg_neighbours(best, budget) for x in t]
        fresh = [x for x in tier if x not in explorer.results and x not in tried]
        if fresh:
            explorer(fresh)
            tried += fresh
        for x in tier:
            r = explorer.results.get(x)
            if r is not None and r.status != "below" and _per_gpu(r) > top * (1 + min_gain):
                best, top, moved = x, _per_gpu(r), True
    return best, tried


# ------------------------------------------------------------------ search


def rate_budget(
    loaded: LoadedScenario,
    target_rate_per_s: float,
    max_tp: int | None = None,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> int:
    """The GPU budget a target-rate plan first searches: the analytic fleet for the rate
    (:func:`~disaggsim.plan.analytic.analytic_guess`, two pools of at least one worker
    each) at the smallest worker that fits (plain TP, or for an MoE model tp x dp ranks,
    :func:`~disaggsim.plan.analytic.smallest_unit`) and that the fabric can place (a
    ``kind: topology`` fabric keeps TP inside a node: a budget sized with a worker it
    cannot place would be refused as a budget never asked for)."""
    if lengths is None:
        lengths = sample_lengths(loaded, sample_requests(loaded))
    gpu = plan_gpu(loaded)
    top = min(fabric_max_tp(loaded), max_tp or MAX_GPUS)
    unit = smallest_unit(
        loaded, gpu, _p99_kv_tokens(lengths), max_tp=top, limits=_decode_limits(loaded)
    )
    if unit is None:
        raise UserError(no_worker_fits(loaded, gpu, None, _p99_kv_tokens(lengths)))
    return analytic_guess(
        loaded,
        prefill_tp=unit,
        decode_tp=unit,
        target_rate_per_s=target_rate_per_s,
        lengths=lengths,
        prefill_limits=pool_limits(loaded, unit, "prefill"),
        decode_limits=pool_limits(loaded, unit, "decode"),
    ).num_gpus


def check_settle_seeds(seeds: object) -> None:
    """``PlanOptions.settle_seeds`` (``--settle-seeds``) an integer from 0 (never settle)
    to MAX_SEEDS, named as the user gave it."""
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 0 <= seeds <= MAX_SEEDS:
        where = given("--settle-seeds", "settle_seeds", seeds)
        raise UserError(f"{where}: must be an integer from 0 (never) to {MAX_SEEDS:,}")


def search(
    loaded: LoadedScenario,
    *,
    gpus: int | None = None,
    target_rate_per_s: float | None = None,
    price_per_gpu_hour: float | None = None,
    options: PlanOptions | None = None,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
    memo: dict | None = None,
    simulations_before: int = 0,
) -> SearchResult:
    """Search the deployments for the budget and rank them by steady-state goodput per
    GPU.

    ``memo``: the goodput searches of an earlier search of the same question (its
    ``SearchResult.memo``), reused wherever this one asks the same search in the same
    stage (no simulation): a search with the same options but more waves replays the
    earlier one's waves and runs only what follows (plan/confirm.py); the result is that
    of a search from scratch. ``simulations_before`` counts its simulations in.

    With ``target_rate_per_s`` and no ``gpus``, the budget is the analytic fleet for
    that rate (at the smallest worker that fits: plain TP, or for an MoE
    model tp x dp ranks, :func:`~disaggsim.plan.analytic.smallest_unit`)."""
    opts = options or PlanOptions()
    if target_rate_per_s is not None and not 0 < target_rate_per_s <= MAX_NUMBER:
        raise UserError(
            f"--target-rate {target_rate_per_s:g}: must be a finite rate > 0 and at most "
            f"{MAX_NUMBER:g} req/s"
        )
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour <= MAX_NUMBER:
        raise UserError(
            f"--price-per-gpu-hour {price_per_gpu_hour:g}: must be a number > 0 and at most "
            f"{MAX_NUMBER:g} ($ per GPU-hour)"
        )
    check_settle_seeds(opts.settle_seeds)
    s = loaded.scenario
    requests = sample_requests(loaded)
    lengths = sample_lengths(loaded, requests)
    gpu = plan_gpu(loaded)
    if gpus is None and target_rate_per_s is not None:
        budget = rate_budget(loaded, target_rate_per_s, opts.max_tp, lengths)
    else:
        budget = budget_of(loaded, gpus)
    if budget > MAX_GPUS:  # before any candidate is enumerated (docs/safety.md)
        if gpus is not None:
            raise UserError(
                f"--gpus {gpus}: a budget of {budget:,} GPUs, more than the {MAX_GPUS:,} a "
                f"plan may size: allowed: 1 to {MAX_GPUS:,}"
            )
        if target_rate_per_s is None:
            raise UserError(
                f"{loaded.path or 'plan question'}: the pools' budget of {budget:,} GPUs is "
                f"more than the {MAX_GPUS:,} a plan may size: give --gpus N, at most "
                f"{MAX_GPUS:,}"
            )
        # the analytic fleet grows in proportion to the rate: the largest rate it sizes
        # within MAX_GPUS, rounded down (a 1e300 req/s rate printed a 300-digit budget)
        top = target_rate_per_s * MAX_GPUS / budget
        top = float(f"{top * (1 - 5e-3):.2g}")
        size = f"{budget:,}" if budget < 1e9 else f"{budget:.3g}"
        raise UserError(
            f"--target-rate {target_rate_per_s:g}: sizes a budget of {size} GPUs, more "
            f"than the {MAX_GPUS:,} a plan may size: allowed: > 0 and up to about {top:g} "
            "req/s here"
        )
    tps = tp_options(loaded, budget, lengths, opts.max_tp)
    is_moe = get_model(s.model).moe is not None
    # an MoE model may fit only as data-parallel attention ranks with experts over all
    # the worker's GPUs (DeepSeek-V3 in bf16 on 16 H200s: tp 8 x dp 2), not as plain TP
    moe_why: dict[str, str] = {}  # role -> why no MoE layout was found for it
    pre_lays, dec_lays, colo_lays = (
        worker_layouts(loaded, budget, lengths, opts, moe_why) if tps or is_moe else ([], [], [])
    )
    if not tps and not (is_moe and pre_lays and dec_lays):
        raise UserError(
            no_worker_fits(loaded, gpu, budget, _p99_kv_tokens(lengths), opts.max_tp, moe_why)
        )
    fams, guesses = plan_families(loaded, budget, opts, lengths, requests)
    # the headline guess (printed, and what the advisor's conditions read): dense, the
    # disaggregated pair of layouts of the scenario's weights with the highest analytic
    # capacity per GPU (the smallest TP's decode step can miss the ITL target at batch 1:
    # 70B on H100 tp2 at a 30 ms target); MoE: the best-ranked layouts of each role that
    # fit the budget together
    if not is_moe:
        pl, dl = headline_layouts(guesses, Layout(tps[0]))
    else:
        pl, dl = next(
            ((a, b) for a in pre_lays for b in dec_lays if a.gpus + b.gpus <= budget),
            (pre_lays[0], dec_lays[0]),
        )
    reuse = requests.prefix_chains is not None and cache_enabled(loaded)
    sized = (
        {"target_rate_per_s": target_rate_per_s}
        if target_rate_per_s is not None
        else {"gpu_budget": max(budget, pl.gpus + dl.gpus)}
    )
    tokens, seqs = _batch_limits(loaded, pl, dl)
    pre_lim, dec_lim = pool_limits(loaded, pl, "prefill"), pool_limits(loaded, dl, "decode")
    guess = analytic_guess(
        loaded, prefill_tp=pl, decode_tp=dl, lengths=lengths, prefill_budget_tokens=tokens,
        max_batch_seqs=seqs, prefill_limits=pre_lim, decode_limits=dec_lim, **sized,
    )  # fmt: skip
    if reuse:
        share = expected_prefix_hit_share(
            loaded, requests, num_workers=guess.num_prefill_workers, layout=pl, limits=pre_lim
        )
        guess = analytic_guess(
            loaded, prefill_tp=pl, decode_tp=dl, lengths=lengths, prefill_budget_tokens=tokens,
            max_batch_seqs=seqs, hit_share=share, prefill_limits=pre_lim, decode_limits=dec_lim,
            **sized,
        )  # fmt: skip
    counter = [simulations_before]
    memo = {} if memo is None else memo
    explorer = _Evaluator(
        loaded, guesses, opts, executor, progress, "explore", counter=counter, memo=memo
    )
    found: OptimiseResult[Candidate] = optimise(
        fams,
        explorer,
        bound_slack=opts.bound_slack,
        explore_floor=opts.explore_floor,
        max_waves=opts.max_waves,
        min_gain=opts.explore_tol_fraction,
        screen=opts.screen_nearest,
        floor_exempt=opts.floor_exempt,
    )
    raise_caps(explorer, loaded, lengths, opts.explore_tol_fraction, budget)
    final = _Evaluator(
        loaded, guesses, opts, executor, progress, "final", explorer.results, counter, memo
    )
    while todo := finalists(explorer.results, final.results, opts.finalist_margin):
        final(todo)
    out_mean = float(lengths[1].mean())
    rows = []
    for c, explored in explorer.results.items():
        if explored.status == "below":  # screened out: not measured (optimise.py)
            continue
        r = final.results.get(c, explored)
        status = r.status if c in final.results else "explored"
        rows.append(candidate_row(c, r, status, out_mean, price_per_gpu_hour))
    cap = guess.capacity_per_gpu_per_s * budget
    return SearchResult(
        loaded=loaded,
        gpu=gpu,
        gpu_budget=budget,
        analytic=guess,
        ranked=rank_rows(rows),
        rate_lo_per_s=opts.rate_lo_factor * cap,
        rate_hi_per_s=opts.rate_hi_factor * cap,
        min_worker_gpus=min(lay.gpus for lay in (*pre_lays, *dec_lays, *colo_lays)),
        reuse_share_unbounded=_unbounded_share(requests),
        options=opts,
        families=found.states,
        family_kinds={f.name: f.kind for f in fams},
        family_bounds={f.name: f.bound_per_gpu for f in fams},
        family_of=dict(found.family_of),
        converged=found.converged,
        num_simulations=counter[0],
        num_stopped_early=sum(
            r.num_stopped_early for ev in (explorer, final) for r in ev.results.values()
        ),
        notes=dropped_failures_note(loaded)
        + tuple(
            f"the {role} pool: {why}; it was searched with plain TP workers only"
            for role, why in moe_why.items()
        )
        + _cap_note(loaded, requests)
        + _shortened_note([r for ev in (explorer, final) for r in ev.results.values()])
        + _same_runs_note(
            {**explorer.same_runs, **final.same_runs}, {**explorer.results, **final.results}
        ),
        num_screened_out=sum(r.status == "below" for r in explorer.results.values()),
        guesses=guesses,
        memo=memo,
        target_rate_per_s=target_rate_per_s,
        price_per_gpu_hour=price_per_gpu_hour,
        rerun=functools.partial(
            search,
            loaded,
            gpus=gpus,
            target_rate_per_s=target_rate_per_s,
            price_per_gpu_hour=price_per_gpu_hour,
            memo=memo,
            simulations_before=counter[0],
        ),
    )


def candidate_row(
    c: Candidate,
    r: GoodputResult,
    status: str,
    out_mean_tokens: float,
    price_per_gpu_hour: float | None,
    **fields: Any,
) -> CandidateResult:
    """The ranking's row of candidate ``c`` measured by ``r`` (``status``: its search's, or
    ``explored``), with its $ per million output tokens where a price was given."""
    rate = r.rate_per_s if math.isfinite(r.rate_per_s) else 0.0
    usd = None
    if price_per_gpu_hour is not None and rate > 0:
        usd = price_per_gpu_hour * c.num_gpus / 3600.0 / (rate * out_mean_tokens) * 1e6
    return CandidateResult(
        candidate=c,
        goodput_per_s=rate,
        goodput_per_gpu_per_s=rate / c.num_gpus,
        status=status,
        at_rate=_at_rate(r),
        usd_per_m_output_tokens=usd,
        goodput=r,
        **fields,
    )


def settled_rows(res: SearchResult, rows: list[CandidateResult]) -> list[CandidateResult]:
    """``rows`` as the advisor compares them: where a close call was settled at more
    seeds (plan/confirm.py settle_close_call), of each kind it measured, its rows alone
    (the others' goodputs are the plan's seeds', the luck the settling took out; any the
    settling's cap left over above them is named in its clause); else all."""
    st = res.settlement
    if st is None:
        return rows
    kinds = {c.kind for c in st.candidates}
    return [r for r in rows if r.candidate.kind not in kinds or r.candidate in st.candidates]


def rank_rows(rows: list[CandidateResult]) -> tuple[CandidateResult, ...]:
    """Confirmed candidates first (the ranking the advisor reads), then the explored
    rest; by goodput per GPU, ties to chunked, then vllm, then fewer GPUs."""
    order = {k: n for n, k in enumerate(("colocate_chunked", "colocate_vllm", "disaggregate"))}
    return tuple(
        sorted(
            rows,
            key=lambda x: (
                x.status == "explored",
                -x.goodput_per_gpu_per_s,
                order[x.candidate.kind],
                x.candidate.num_gpus,
            ),
        )
    )


def dropped_failures_note(loaded: LoadedScenario) -> tuple[str, ...]:
    """One line when the scenario has failures or autoscaled pools, which every candidate
    leaves out (:func:`candidate_scenario`: the candidates' pools are not the scenario's),
    else none."""
    f = loaded.scenario.failures
    dropped = [
        f"failures.{key} ({len(items)} {'entry' if len(items) == 1 else 'entries'})"
        for key, items in (("workers", f.workers), ("random", f.random), ("links", f.links))
        if items
    ]
    a = loaded.scenario.autoscale
    scaled = [r for r in ("prefill", "decode", "colocated") if getattr(a, r) is not None]
    if scaled:
        dropped.append(f"autoscale ({', '.join(scaled)})")
    if not dropped:
        return ()
    return (
        f"planned without the scenario's {', '.join(dropped)}: every candidate has pools "
        "of its own; add them to the recommended scenario and run it to see their effect",
    )


def _cap_note(loaded: LoadedScenario, requests: Requests) -> tuple[str, ...]:
    """One line when the workload's requests have no ``max_tokens``: every candidate then
    plans on the default cap, the model's context less the prompt (disaggsim.cap_notes)."""
    from disaggsim.cap_notes import default_caps, plan_cap_note

    if not default_caps(loaded.scenario, requests):
        return ()
    return (plan_cap_note(loaded.scenario),)


def _shortened_note(results: list[GoodputResult]) -> tuple[str, ...]:
    """One line when some goodput runs were shortened to fit a scenario bound (a fleet
    whose rates times the run-length rule's window pass MAX_REQUESTS), else none."""
    short = [e for r in results for e in r.shortened]
    if not short:
        return ()
    runs = sum(e.num_runs for e in short)
    total = sum(r.num_runs for r in results)
    lo = min(e.window_shrink for e in short)
    bounds = " and ".join(sorted({str(e.window_bound) for e in short}))
    return (
        f"{runs} of {total} goodput runs shortened to fit {bounds} (docs/safety.md): their "
        f"warm-up and window down to {lo:.2g} of the run-length rule's, so those goodputs "
        "rest on fewer service times than the rule asks",
    )


def _smaller_chunk(d: Candidate, c: Candidate) -> bool:
    """Whether ``d`` is ``c``'s chunked pool at a smaller chunk."""
    return (
        c.kind == d.kind == "colocate_chunked"
        and c.chunk_tokens is not None
        and d.chunk_tokens is not None
        and d.chunk_tokens < c.chunk_tokens
        and dataclasses.replace(d, chunk_tokens=c.chunk_tokens) == c
    )


def chunk_never_bound(r: GoodputResult) -> bool:
    """Whether no chunked step of the runs that decided goodput ``r`` filled its token
    budget (``Summary.num_chunk_budget_full_steps`` 0 on every run at or below the
    lowest rate that missed above the goodput: its confirmation and retests included).
    False where any of them has no such count (a run evaluated without simulating, a
    summary from before the engine counted it), where the goodput was not bisected
    between a met and a missed rate, or where nothing missed above it."""
    lo = r.rate_per_s
    if r.status not in ("found", "refined") or not (lo > 0 and math.isfinite(lo)):
        return False
    runs = [*r.evaluations, *([r.confirmation] if r.confirmation is not None else [])]
    runs += [e.retest for e in runs if e.retest is not None]
    missed = [e.rate_per_s for e in runs if not e.meets and e.rate_per_s > lo]
    if not missed:
        return False
    top = min(missed)
    for e in runs:
        if e.rate_per_s > top:
            continue
        full = (
            None if e.summary is None else getattr(e.summary, "num_chunk_budget_full_steps", None)
        )
        if full is None or full != 0:
            return False
    return True


def _same_runs_note(
    same: Mapping[Candidate, Candidate], results: Mapping[Candidate, GoodputResult]
) -> tuple[str, ...]:
    """One line naming the chunk sizes not simulated (:meth:`_Evaluator._same_runs`)."""
    if not same:
        return ()
    parts = [
        f"{c.label} as chunk {d.chunk_tokens}"
        for c, d in sorted(same.items(), key=lambda t: (t[0].label, t[0].chunk_tokens or 0))
    ]
    return (
        f"{len(same)} chunk size{'s' if len(same) > 1 else ''} not simulated: "
        + ", ".join(parts)
        + " (no step of the smaller chunk's runs at its goodput or the rate that missed "
        "above it filled its token budget, and the KV capacity is the same, so the larger "
        "chunk runs those rates alike: docs/planning.md §2)",
    )


def _unbounded_share(requests: Requests) -> float | None:
    """What the workload's prefix chains allow at most (an unbounded shared cache)."""
    from disaggsim.cache.estimate import expected_hit_share

    if requests.prefix_chains is None:
        return None
    return expected_hit_share(requests)


def _at_rate(r: GoodputResult) -> Summary | None:
    """The summary behind the goodput: the confirmation run, else the search's run at
    that rate (None when there is none)."""
    if r.confirmed and r.confirmation is not None:
        return r.confirmation.summary
    for e in reversed(r.evaluations):
        if e.rate_per_s == r.rate_per_s and e.meets:
            return e.summary
    return None


def _slug(c: Candidate) -> str:
    dt = f"-{c.weight_dtype}" if c.weight_dtype else ""
    if c.kind == "disaggregate":
        return (
            f"disagg-{c.num_prefill_workers}p{c.prefill_tp}-{c.num_decode_workers}d{c.decode_tp}"
            + dt
        )
    sched = "chunked" if c.kind == "colocate_chunked" else "vllm"
    return (
        f"{sched}-{c.num_prefill_workers}x{c.prefill_tp}"
        + (f"-c{c.chunk_tokens}" if c.chunk_tokens else "")
        + dt
    )
