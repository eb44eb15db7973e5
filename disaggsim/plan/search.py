"""Deployments for a GPU budget and their steady-state goodput per GPU, by simulation.

The search space (docs/planning.md, "Search"), all on the scenario's GPU, total GPUs
<= the budget, for each weight dtype asked (the scenario's; FP8 with ``--fp8``):

- **disaggregated**: every pair of TP degrees (prefill, decode) among the valid ones
  within one node whose worker holds a p99 request's KV; any prefill and decode worker
  counts that fit;
- **colocated** ``chunked`` (chunk sizes on :data:`CHUNK_LADDER`) and ``vllm``, every TP
  degree, ``budget // tp`` workers.

:func:`disaggsim.plan.optimise.optimise` walks it: branch and bound over families (TP
pair and dtype; the analytic capacity is each family's optimistic bound), hill climbing
inside a family (worker counts along the full budget, then trimming a pool; chunk size
up and down). Each candidate's goodput is the steady-state goodput
(:func:`disaggsim.sweep.goodput_many`: bracketed, bisected and confirmed at twice the
horizon, each run's length from the workload); the latency columns come from its
confirmation run.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disaggsim.catalog import get_gpu
from disaggsim.config.bounds import MAX_GPUS
from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.errors import UserError
from disaggsim.metrics.steady import RunLengthRule
from disaggsim.metrics.summary_table import Summary
from disaggsim.plan.analytic import (
    AnalyticGuess,
    analytic_guess,
    fitting_tps,
    plan_gpu,
    sample_lengths,
)
from disaggsim.plan.optimise import Family, OptimiseResult, optimise
from disaggsim.sweep.core import Source, source_of
from disaggsim.sweep.executors import Executor
from disaggsim.sweep.goodput import GoodputResult, goodput_many
from disaggsim.validity import largest_prompt_tokens, link_fabric_problem

__all__ = [
    "CHUNK_LADDER",
    "KINDS",
    "Candidate",
    "CandidateResult",
    "PlanOptions",
    "SearchResult",
    "all_candidates",
    "candidate_scenario",
    "plan_families",
    "search",
]

KINDS = ("disaggregate", "colocate_chunked", "colocate_vllm")
DEFAULT_CHUNK_TOKENS = 512  # Sarathi-style chunk budget when the scenario has none
CHUNK_LADDER = (256, 512, 1024, 2048, 4096, 8192)  # chunk sizes the search tries


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
    max_tp: int | None = None  # None: one node's GPUs
    rate_hi_factor: float = 1.5  # first bracket: [lo, hi] x analytic capacity
    rate_lo_factor: float = 0.25
    quick_mode: bool = False

    def with_run_length(
        self, min_requests: int | None, service_multiple: float | None
    ) -> PlanOptions:
        """These options with the run-length rule's floors lowered or raised (``--min-
        requests``, ``--service-multiple``): the confirmed goodputs use them, the
        exploration at most them."""
        rule, explore = self.rule, self.explore_rule
        if min_requests is not None:
            if not min_requests >= 1:
                raise UserError(f"--min-requests {min_requests}: must be an integer >= 1")
            rule = dataclasses.replace(rule, min_measured_requests=min_requests)
            n = min(explore.min_measured_requests, min_requests)
            explore = dataclasses.replace(explore, min_measured_requests=n)
        if service_multiple is not None:
            if not service_multiple > 0:
                raise UserError(f"--service-multiple {service_multiple}: must be > 0")
            rule = dataclasses.replace(
                rule,
                service_multiple=service_multiple,
                warmup_service_multiple=min(rule.warmup_service_multiple, service_multiple),
            )
            m = min(explore.service_multiple, service_multiple)
            explore = dataclasses.replace(
                explore,
                service_multiple=m,
                warmup_service_multiple=min(explore.warmup_service_multiple, m),
            )
        return dataclasses.replace(self, rule=rule, explore_rule=explore)

    @classmethod
    def quick(cls) -> PlanOptions:
        return cls(
            rule=RunLengthRule(min_measured_requests=400, service_multiple=5.0),
            tol_fraction=0.04,
            explore_rule=RunLengthRule(
                min_measured_requests=200, service_multiple=2.0, warmup_service_multiple=1.0
            ),
            explore_tol_fraction=0.06,
            finalist_margin=0.0,
            bound_slack=1.1,
            explore_floor=0.85,
            max_waves=8,
            walk_chunks=True,
            quick_mode=True,
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment. Colocated: ``num_prefill_workers``/``prefill_tp`` are the pool's
    workers and TP; the decode fields are 0."""

    kind: str  # one of KINDS
    num_prefill_workers: int
    prefill_tp: int
    num_decode_workers: int = 0
    decode_tp: int = 0
    chunk_tokens: int | None = None  # colocate_chunked only
    weight_dtype: str | None = None  # None: the scenario's

    @property
    def num_gpus(self) -> int:
        return self.num_prefill_workers * self.prefill_tp + self.num_decode_workers * self.decode_tp

    @property
    def label(self) -> str:
        if self.kind == "disaggregate":
            return (
                f"disagg {self.num_prefill_workers}P x tp{self.prefill_tp} + "
                f"{self.num_decode_workers}D x tp{self.decode_tp}{self._dtype()}"
            )
        sched = "chunked" if self.kind == "colocate_chunked" else "vllm"
        extra = f" chunk {self.chunk_tokens}" if self.chunk_tokens else ""
        return f"{sched} {self.num_prefill_workers} x tp{self.prefill_tp}{extra}{self._dtype()}"

    def _dtype(self) -> str:
        return f" {self.weight_dtype}" if self.weight_dtype else ""

    def deployment(self) -> dict[str, Any]:
        extra = {"weight_dtype": self.weight_dtype} if self.weight_dtype else {}
        if self.kind == "disaggregate":
            return {
                "architecture": "disaggregated",
                "prefill_pool": {"num_workers": self.num_prefill_workers, "tp": self.prefill_tp},
                "decode_pool": {"num_workers": self.num_decode_workers, "tp": self.decode_tp},
                **extra,
            }
        pool: dict[str, Any] = {
            "num_workers": self.num_prefill_workers,
            "tp": self.prefill_tp,
            "scheduler": "chunked" if self.kind == "colocate_chunked" else "vllm",
        }
        if self.chunk_tokens:
            pool["max_batch_tokens"] = self.chunk_tokens
        return {"architecture": "colocated", "pool": pool, **extra}


@dataclass(frozen=True, slots=True)
class CandidateResult:
    candidate: Candidate
    goodput_per_s: float  # 0 when the SLO is unattainable
    goodput_per_gpu_per_s: float
    status: str  # found | refined | unattainable | unbounded (sweep.goodput.GoodputResult)
    at_rate: Summary | None = None  # the confirmation run (else the search's) at the goodput
    usd_per_m_output_tokens: float | None = None
    goodput: GoodputResult | None = None  # the search behind it (evaluations, confirmation)

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
        }


def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


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
    converged: bool = True  # every family settled or pruned (no wave limit hit)
    num_simulations: int = 0


def _pool_base(pool) -> dict[str, Any]:
    d = pool.model_dump(mode="json", exclude_none=True)
    d.pop("scheduler", None)
    return d


def candidate_scenario(loaded: LoadedScenario, cand: Candidate, name: str | None = None) -> dict:
    """The scenario mapping of ``cand``: the original with its pools replaced (the other
    pool settings carried over) and worker failures dropped (they name workers of the
    original pools)."""
    s = loaded.scenario
    raw = copy.deepcopy(loaded.raw)
    for key in ("pool", "prefill_pool", "decode_pool"):
        raw.pop(key, None)
    if isinstance(raw.get("failures"), dict):
        raw["failures"] = {
            k: v for k, v in raw["failures"].items() if k not in ("workers", "random", "links")
        }
    pre = _pool_base(s.prefill_pool or s.pool)
    dec = _pool_base(s.decode_pool or s.pool)
    if s.architecture == "colocated":
        assert s.pool is not None
        # the colocated budget is a chunk; the prefill pool batches whole prompts
        pre["max_batch_tokens"] = max(s.pool.max_batch_tokens, 8192)
    # a whole-prompt prefill needs a budget of at least the longest prompt (validity.py)
    pre["max_batch_tokens"] = max(pre["max_batch_tokens"], largest_prompt_tokens(loaded) or 0)
    dep = cand.deployment()
    raw["architecture"] = dep["architecture"]
    if cand.weight_dtype:
        raw["weight_dtype"] = cand.weight_dtype
    if cand.kind == "disaggregate":
        raw["prefill_pool"] = {**pre, **dep["prefill_pool"]}
        raw["decode_pool"] = {**dec, **dep["decode_pool"]}
    else:
        base = _pool_base(s.pool) if s.pool is not None else dict(dec)
        if cand.kind == "colocate_vllm":
            base["max_batch_tokens"] = pre["max_batch_tokens"]
        raw["pool"] = {**base, **dep["pool"]}
    if name is not None:
        raw["name"] = name
    return raw


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


def tp_options(
    loaded: LoadedScenario, gpu_budget: int, lengths, max_tp: int | None = None
) -> list[int]:
    """TP degrees a worker may use: valid for the model, up to the budget and ``max_tp``,
    holding a p99 request's KV. Beyond one node's NVLink domain a TP group's all-reduce is
    priced hierarchically (:mod:`disaggsim.costmodel.tp_layout`), so such degrees are
    candidates too; the analytic bound prunes them where they cannot win."""
    gpu = plan_gpu(loaded)
    top = min(gpu_budget, max_tp or gpu_budget)
    return fitting_tps(loaded, gpu, top, _p99_kv_tokens(lengths))


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

    def fits(n_p: int, n_d: int) -> bool:
        return n_p >= 1 and n_d >= 1 and n_p * c.prefill_tp + n_d * c.decode_tp <= budget

    def at(pairs) -> list[Candidate]:
        return [
            dataclasses.replace(c, num_prefill_workers=p, num_decode_workers=d)
            for p, d in dict.fromkeys(pairs)
            if fits(p, d) and (p, d) != (n_p0, n_d0)
        ]

    line = [(n_p, (budget - n_p * c.prefill_tp) // c.decode_tp) for n_p in (n_p0 - 1, n_p0 + 1)]
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


def chunk_neighbours(c: Candidate, ladder: tuple[int, ...]) -> list[list[Candidate]]:
    """The next smaller and larger chunk on the ladder (the candidate's own chunk may be
    off the ladder: then its nearest rungs on each side)."""
    assert c.chunk_tokens is not None
    below = [x for x in ladder if x < c.chunk_tokens]
    above = [x for x in ladder if x > c.chunk_tokens]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return [[dataclasses.replace(c, chunk_tokens=x) for x in picks]]


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
) -> tuple[list[Family[Candidate]], dict[Candidate, AnalyticGuess]]:
    """The families of the search space and the analytic guess behind each start."""
    fams: list[Family[Candidate]] = []
    guesses: dict[Candidate, AnalyticGuess] = {}
    for dtype in _dtypes(loaded, options):
        try:
            ld = _with_dtype(loaded, dtype)
            tps = tp_options(ld, gpu_budget, lengths, options.max_tp)
        except UserError:
            continue  # e.g. FP8 weights on a GPU without FP8
        tag = f" {dtype}" if dtype else ""
        for tp_p in tps:
            for tp_d in tps:
                if tp_p + tp_d > gpu_budget:
                    continue
                g = analytic_guess(
                    ld, prefill_tp=tp_p, decode_tp=tp_d, gpu_budget=gpu_budget, lengths=lengths
                )
                start = Candidate(
                    "disaggregate",
                    g.num_prefill_workers,
                    tp_p,
                    g.num_decode_workers,
                    tp_d,
                    weight_dtype=dtype,
                )
                guesses[start] = g
                fams.append(
                    Family(
                        name=f"disagg tp{tp_p}/tp{tp_d}{tag}",
                        kind="disaggregate",
                        bound_per_gpu=g.capacity_per_gpu_per_s,
                        starts=(start,),
                        neighbours=lambda c: disagg_neighbours(c, gpu_budget),
                    )
                )
        for tp in tps:
            g = analytic_guess(ld, prefill_tp=tp, decode_tp=tp, gpu_budget=2 * tp, lengths=lengths)
            n = gpu_budget // tp
            ladder = options.chunk_ladder
            chunked = tuple(
                Candidate("colocate_chunked", n, tp, chunk_tokens=ch, weight_dtype=dtype)
                for ch in chunk_starts(_own_chunk(loaded), options)
            )
            vllm = Candidate("colocate_vllm", n, tp, weight_dtype=dtype)
            for c in (*chunked, vllm):
                guesses[c] = g
            fams.append(
                Family(
                    name=f"chunked tp{tp}{tag}",
                    kind="colocate_chunked",
                    bound_per_gpu=g.capacity_per_gpu_per_s,
                    starts=chunked,
                    neighbours=functools.partial(chunk_neighbours, ladder=ladder),
                )
            )
            fams.append(
                Family(
                    name=f"vllm tp{tp}{tag}",
                    kind="colocate_vllm",
                    bound_per_gpu=g.capacity_per_gpu_per_s,
                    starts=(vllm,),
                    neighbours=lambda c: [],
                )
            )
    return fams, guesses


def all_candidates(
    gpu_budget: int,
    tps: list[int],
    chunks: tuple[int, ...],
    dtypes: tuple[str | None, ...] = (None,),
) -> list[Candidate]:
    """Every deployment of the search space a user could write by hand: any worker
    counts that fit the budget (colocated ones too), every TP pair and chunk (the
    exhaustive baseline the planner is tested against)."""
    out = []
    for dt in dtypes:
        for tp_p in tps:
            for tp_d in tps:
                for n_p in range(1, gpu_budget // tp_p + 1):
                    for n_d in range(1, (gpu_budget - n_p * tp_p) // tp_d + 1):
                        out.append(Candidate("disaggregate", n_p, tp_p, n_d, tp_d, weight_dtype=dt))
        for tp in tps:
            for n in range(1, gpu_budget // tp + 1):
                out += [
                    Candidate("colocate_chunked", n, tp, chunk_tokens=ch, weight_dtype=dt)
                    for ch in chunks
                ]
                out.append(Candidate("colocate_vllm", n, tp, weight_dtype=dt))
    return out


# ------------------------------------------------------------------ evaluation


class _Evaluator:
    """Steady-state goodput of candidates, one lock-step ``goodput_many`` per call.

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
    ) -> None:
        self.loaded = loaded
        self.guesses = guesses
        self.options = options
        self.executor = executor
        self.progress = progress
        self.stage = stage
        self.explored = explored or {}
        self.results: dict[Candidate, GoodputResult] = {}
        self.invalid: dict[Candidate, str] = {}  # deployments the fabric cannot join
        self.label = str(loaded.path) if loaded.path else "<scenario>"
        self.counter = counter if counter is not None else [0]  # simulations, all stages

    @property
    def simulations(self) -> int:
        return self.counter[0]

    def _family_key(self, c: Candidate) -> tuple:
        return (c.kind, c.prefill_tp, c.decode_tp, c.weight_dtype)

    def _bracket(self, c: Candidate) -> tuple[float, float]:
        o = self.options
        seen = self.explored.get(c)
        if seen is not None and seen.rate_per_s > 0:
            return 0.8 * seen.rate_per_s, 1.15 * seen.rate_per_s
        rel = [
            r.per_gpu_per_s
            for k, r in self.results.items()
            if self._family_key(k) == self._family_key(c) and r.per_gpu_per_s > 0
        ]
        if rel:
            centre = max(rel) * c.num_gpus
            return 0.7 * centre, 1.3 * centre
        g = self.guesses.get(c) or next(
            v for k, v in self.guesses.items() if self._family_key(k) == self._family_key(c)
        )
        cap = g.capacity_per_gpu_per_s * c.num_gpus
        return o.rate_lo_factor * cap, o.rate_hi_factor * cap

    def source(self, c: Candidate) -> Source:
        raw = candidate_scenario(self.loaded, c, name=f"{self.loaded.scenario.name}-{_slug(c)}")
        try:
            cl = load_scenario(raw, base_dir=self.loaded.base_dir)
        except UserError as e:
            raise UserError(f"{self.label}: candidate {c.label}: {e}") from None
        return source_of(cl, self.label)

    def _fabric_problem(self, c: Candidate) -> str | None:
        """Why ``c`` cannot be built on the scenario's fabric (NVLink beyond one node)."""
        if c not in self.invalid and c.kind == "disaggregate":
            raw = candidate_scenario(self.loaded, c)
            problem = link_fabric_problem(
                load_scenario(raw, base_dir=self.loaded.base_dir).scenario
            )
            if problem is not None:
                self.invalid[c] = problem
        return self.invalid.get(c)

    def __call__(self, cands: list[Candidate]) -> list[float]:
        valid = [c for c in cands if self._fabric_problem(c) is None]
        got = dict(zip(valid, self._evaluate(valid), strict=True)) if valid else {}
        return [got.get(c, 0.0) for c in cands]  # a deployment that cannot exist serves 0

    def _evaluate(self, cands: list[Candidate]) -> list[float]:
        o = self.options
        explore = self.stage == "explore"
        brackets = [self._bracket(c) for c in cands]
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
            tol_fraction=o.explore_tol_fraction if explore else o.tol_fraction,
            seeds=o.seeds,
            rule=o.explore_rule if explore else o.rule,
            confirm=not explore,
            executor=self.executor,
            progress=on_progress,
        )
        self.counter[0] += done[0]
        out = []
        for c, r in zip(cands, results, strict=True):
            self.results[c] = r
            out.append(r.per_gpu_per_s if math.isfinite(r.per_gpu_per_s) else 0.0)
        return out


def _per_gpu(r: GoodputResult) -> float:
    return r.per_gpu_per_s if math.isfinite(r.per_gpu_per_s) else 0.0


def finalists(
    explored: dict[Candidate, GoodputResult],
    confirmed: dict[Candidate, GoodputResult],
    margin: float,
) -> list[Candidate]:
    """Explored candidates still to confirm: the best of each kind, and every one whose
    explored goodput per GPU is within ``margin`` of the best goodput known (confirmed
    ones count with their confirmed value), so no unconfirmed candidate can outrank the
    recommendation by more than the margin."""
    out: list[Candidate] = []
    best_of_kind: dict[str, Candidate] = {}
    for c, r in explored.items():
        k = c.kind
        if k not in best_of_kind or _per_gpu(r) > _per_gpu(explored[best_of_kind[k]]):
            best_of_kind[k] = c
    known = [_per_gpu(r) for c, r in confirmed.items()]
    known += [_per_gpu(r) for c, r in explored.items() if c not in confirmed]
    top = max(known, default=0.0)
    for c, r in explored.items():
        if c in confirmed or _per_gpu(r) <= 0:
            continue
        if c in best_of_kind.values() or _per_gpu(r) >= (1 - margin) * top:
            out.append(c)
    return out


# ------------------------------------------------------------------ search


def search(
    loaded: LoadedScenario,
    *,
    gpus: int | None = None,
    target_rate_per_s: float | None = None,
    price_per_gpu_hour: float | None = None,
    options: PlanOptions | None = None,
    executor: Executor | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the deployments for the budget and rank them by steady-state goodput per
    GPU.

    With ``target_rate_per_s`` and no ``gpus``, the budget is the analytic fleet for
    that rate (at the smallest fitting TPs)."""
    opts = options or PlanOptions()
    if target_rate_per_s is not None and not target_rate_per_s > 0:
        raise UserError(f"--target-rate {target_rate_per_s}: must be > 0 req/s")
    if target_rate_per_s is not None and not math.isfinite(target_rate_per_s):
        raise UserError(f"--target-rate {target_rate_per_s}: must be a finite rate")
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise UserError(f"--price-per-gpu-hour {price_per_gpu_hour}: must be > 0")
    s = loaded.scenario
    lengths = sample_lengths(loaded)
    gpu = plan_gpu(loaded)
    if gpus is None and target_rate_per_s is not None:
        node = get_gpu(gpu).gpus_per_node
        tps0 = fitting_tps(loaded, gpu, node, _p99_kv_tokens(lengths))
        if not tps0:
            raise UserError(f"plan: no TP on one node of {gpu} fits {s.model}")
        budget = analytic_guess(
            loaded,
            prefill_tp=tps0[0],
            decode_tp=tps0[0],
            target_rate_per_s=target_rate_per_s,
            lengths=lengths,
        ).num_gpus
    else:
        budget = budget_of(loaded, gpus)
    if budget > MAX_GPUS:  # before any candidate is enumerated (docs/safety.md)
        where = f"--gpus {gpus}" if gpus is not None else f"--target-rate {target_rate_per_s:g}"
        raise UserError(
            f"{where}: a budget of {budget:,} GPUs, more than the {MAX_GPUS:,} a plan may size"
        )
    tps = tp_options(loaded, budget, lengths, opts.max_tp)
    if not tps:
        tps_all = fitting_tps(
            loaded, gpu, max(get_gpu(gpu).gpus_per_node, budget), _p99_kv_tokens(lengths)
        )
        need = f"tp {tps_all[0]}" if tps_all else "more GPU memory than any TP on one node gives"
        raise UserError(
            f"plan: a budget of {budget} x {gpu} is smaller than one worker that fits "
            f"{s.model} with room for a p99 request's KV ({_p99_kv_tokens(lengths)} tokens): "
            f"it needs {need}"
        )
    guess = analytic_guess(
        loaded,
        prefill_tp=tps[0],
        decode_tp=tps[0],
        lengths=lengths,
        **(
            {"target_rate_per_s": target_rate_per_s}
            if target_rate_per_s is not None
            else {"gpu_budget": max(budget, 2 * tps[0])}
        ),
    )
    fams, guesses = plan_families(loaded, budget, opts, lengths)
    counter = [0]
    explorer = _Evaluator(loaded, guesses, opts, executor, progress, "explore", counter=counter)
    found: OptimiseResult[Candidate] = optimise(
        fams,
        explorer,
        bound_slack=opts.bound_slack,
        explore_floor=opts.explore_floor,
        max_waves=opts.max_waves,
        min_gain=opts.explore_tol_fraction,
    )
    final = _Evaluator(
        loaded, guesses, opts, executor, progress, "final", explorer.results, counter
    )
    while todo := finalists(explorer.results, final.results, opts.finalist_margin):
        final(todo)
    out_mean = float(lengths[1].mean())
    rows = []
    for c, explored in explorer.results.items():
        r = final.results.get(c, explored)
        rate = r.rate_per_s if math.isfinite(r.rate_per_s) else 0.0
        usd = None
        if price_per_gpu_hour is not None and rate > 0:
            usd = price_per_gpu_hour * c.num_gpus / 3600.0 / (rate * out_mean) * 1e6
        rows.append(
            CandidateResult(
                candidate=c,
                goodput_per_s=rate,
                goodput_per_gpu_per_s=rate / c.num_gpus,
                status=r.status if c in final.results else "explored",
                at_rate=_at_rate(r),
                usd_per_m_output_tokens=usd,
                goodput=r,
            )
        )
    order = {k: n for n, k in enumerate(("colocate_chunked", "colocate_vllm", "disaggregate"))}
    # confirmed candidates first (the ranking the advisor reads), then the explored rest
    rows.sort(
        key=lambda x: (
            x.status == "explored",
            -x.goodput_per_gpu_per_s,
            order[x.candidate.kind],
            x.candidate.num_gpus,
        )
    )
    cap = guess.capacity_per_gpu_per_s * budget
    return SearchResult(
        loaded=loaded,
        gpu=gpu,
        gpu_budget=budget,
        analytic=guess,
        ranked=tuple(rows),
        rate_lo_per_s=opts.rate_lo_factor * cap,
        rate_hi_per_s=opts.rate_hi_factor * cap,
        min_worker_gpus=tps[0],
        options=opts,
        families=found.states,
        family_kinds={f.name: f.kind for f in fams},
        family_bounds={f.name: f.bound_per_gpu for f in fams},
        converged=found.converged,
        num_simulations=counter[0],
    )


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
