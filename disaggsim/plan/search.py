"""Candidate deployments for a GPU budget and their goodput per GPU, by simulation.

Candidates (all on the scenario's GPU, total GPUs <= the budget):

- **disaggregated**: prefill workers × decode workers × TP per pool, TPs from the valid
  degrees that hold at least one p99 request's KV, and worker splits nearest the
  analytic P:D ratio (the analytic split and its neighbours), at most
  ``max_disaggregated`` of them, closest to the analytic ratio first;
- **colocated** ``vllm`` and ``chunked`` with the budget's GPUs as ``budget // tp``
  workers of each TP option (chunked with each of ``chunk_tokens``).

Goodput of each is DistServe's (:func:`disaggsim.sweep.goodput_many`, bisection over
``workload.rate_per_s`` in lock-step, every round one batch on the executor); then one
more round simulates each candidate at its goodput rate for the latency columns.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from disaggsim.catalog import get_gpu
from disaggsim.config.bounds import MAX_GPUS
from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import Summary
from disaggsim.plan.analytic import (
    AnalyticGuess,
    analytic_guess,
    fitting_tps,
    plan_gpu,
    sample_lengths,
    split_budget,
)
from disaggsim.sweep.core import PointTask, Source, goodput_many, run_point, source_of
from disaggsim.sweep.executors import Executor
from disaggsim.sweep.grid import override_text
from disaggsim.validity import largest_prompt_tokens

__all__ = [
    "KINDS",
    "Candidate",
    "CandidateResult",
    "PlanOptions",
    "SearchResult",
    "candidate_scenario",
    "enumerate_candidates",
    "search",
]

KINDS = ("disaggregate", "colocate_chunked", "colocate_vllm")
DEFAULT_CHUNK_TOKENS = 512  # Sarathi-style chunk budget when the scenario has none


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How hard to search. ``quick()`` is the bounded mode for tests and first looks."""

    duration_s: float | None = None  # None: the scenario's sim.duration_s
    warmup_s: float | None = None
    max_drain_s: float = 60.0  # a run stops at most this long after arrivals end
    tp_options: int = 2  # smallest fitting TPs tried per pool
    splits_around: int = 2  # prefill worker counts analytic ± this
    max_disaggregated: int = 12
    chunk_tokens: tuple[int, ...] = (256, 2048)  # tried besides the scenario's (or 512)
    tol_fraction: float = 0.01  # bisection tolerance as a share of rate_hi
    rate_hi_factor: float = 1.5  # rate_hi = factor × analytic capacity of the budget
    seeds: int = 1

    @classmethod
    def quick(cls) -> PlanOptions:
        return cls(
            duration_s=60.0,
            warmup_s=10.0,
            max_drain_s=30.0,
            tp_options=1,
            splits_around=1,
            max_disaggregated=3,
            chunk_tokens=(),
            tol_fraction=0.04,
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

    @property
    def num_gpus(self) -> int:
        return self.num_prefill_workers * self.prefill_tp + self.num_decode_workers * self.decode_tp

    @property
    def label(self) -> str:
        if self.kind == "disaggregate":
            return (
                f"disagg {self.num_prefill_workers}P x tp{self.prefill_tp} + "
                f"{self.num_decode_workers}D x tp{self.decode_tp}"
            )
        sched = "chunked" if self.kind == "colocate_chunked" else "vllm"
        extra = f" chunk {self.chunk_tokens}" if self.chunk_tokens else ""
        return f"{sched} {self.num_prefill_workers} x tp{self.prefill_tp}{extra}"

    def deployment(self) -> dict[str, Any]:
        if self.kind == "disaggregate":
            return {
                "architecture": "disaggregated",
                "prefill_pool": {"num_workers": self.num_prefill_workers, "tp": self.prefill_tp},
                "decode_pool": {"num_workers": self.num_decode_workers, "tp": self.decode_tp},
            }
        pool: dict[str, Any] = {
            "num_workers": self.num_prefill_workers,
            "tp": self.prefill_tp,
            "scheduler": "chunked" if self.kind == "colocate_chunked" else "vllm",
        }
        if self.chunk_tokens:
            pool["max_batch_tokens"] = self.chunk_tokens
        return {"architecture": "colocated", "pool": pool}


@dataclass(frozen=True, slots=True)
class CandidateResult:
    candidate: Candidate
    goodput_per_s: float  # 0 when below range
    goodput_per_gpu_per_s: float
    status: str  # found | above_range | below_range
    at_rate: Summary | None = None  # the run at the goodput rate (None if none)
    usd_per_m_output_tokens: float | None = None

    def as_dict(self) -> dict[str, Any]:
        a = self.at_rate
        return {
            "label": self.candidate.label,
            "kind": self.candidate.kind,
            "num_gpus": self.candidate.num_gpus,
            "deployment": self.candidate.deployment(),
            "goodput_per_s": self.goodput_per_s,
            "goodput_per_gpu": self.goodput_per_gpu_per_s,
            "status": self.status,
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
    rate_lo_per_s: float
    rate_hi_per_s: float
    min_worker_gpus: int  # GPUs of the smallest worker that fits
    options: PlanOptions


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


def enumerate_candidates(
    loaded: LoadedScenario,
    gpu_budget: int,
    options: PlanOptions,
    lengths: tuple[np.ndarray, np.ndarray],
) -> tuple[list[Candidate], AnalyticGuess, list[int]]:
    """(candidates, the analytic guess at the smallest TPs, the TP options)."""
    s = loaded.scenario
    gpu = plan_gpu(loaded)
    prompts, outputs = lengths
    min_kv = int(np.percentile(prompts, 99) + np.percentile(outputs, 99))
    node = get_gpu(gpu).gpus_per_node
    tps_all = fitting_tps(loaded, gpu, max(node, gpu_budget), min_kv)
    tps = [t for t in tps_all if t <= min(gpu_budget, node)][: options.tp_options]
    if not tps:
        need = f"tp {tps_all[0]}" if tps_all else "more GPU memory than any TP on one node gives"
        raise UserError(
            f"plan: a budget of {gpu_budget} x {gpu} is smaller than one worker that fits "
            f"{s.model} with room for a p99 request's KV ({min_kv} tokens): it needs {need}"
        )
    guess0 = analytic_guess(
        loaded,
        prefill_tp=tps[0],
        decode_tp=tps[0],
        gpu_budget=max(gpu_budget, 2 * tps[0]),
        lengths=lengths,
    )
    disagg: list[tuple[float, Candidate]] = []
    for tp_p in tps:
        for tp_d in tps:
            if tp_p + tp_d > gpu_budget:
                continue
            g = analytic_guess(
                loaded, prefill_tp=tp_p, decode_tp=tp_d, gpu_budget=gpu_budget, lengths=lengths
            )
            n_p0, _ = split_budget(gpu_budget, g.prefill_share, tp_p, tp_d)
            for dn in range(-options.splits_around, options.splits_around + 1):
                n_p = n_p0 + dn
                if n_p < 1:
                    continue
                n_d = (gpu_budget - n_p * tp_p) // tp_d
                if n_d < 1:
                    continue
                share = n_p * tp_p / (n_p * tp_p + n_d * tp_d)
                c = Candidate("disaggregate", n_p, tp_p, n_d, tp_d)
                disagg.append((abs(share - g.prefill_share) + 0.01 * (tp_p + tp_d), c))
    seen: set[Candidate] = set()
    out: list[Candidate] = []
    for _, c in sorted(disagg, key=lambda x: (x[0], x[1].num_prefill_workers)):
        if c not in seen and len(out) < options.max_disaggregated:
            seen.add(c)
            out.append(c)
    own = (
        s.pool.max_batch_tokens
        if s.pool is not None and s.pool.scheduler == "chunked"
        else DEFAULT_CHUNK_TOKENS
    )
    chunks = sorted({own, *options.chunk_tokens})
    for tp in tps:
        n = gpu_budget // tp
        for ch in chunks:
            out.append(Candidate("colocate_chunked", n, tp, chunk_tokens=ch))
        out.append(Candidate("colocate_vllm", n, tp))
    return out, guess0, tps


def _sim_overrides(loaded: LoadedScenario, options: PlanOptions) -> list[str]:
    sim = loaded.scenario.sim
    dur = options.duration_s if options.duration_s is not None else sim.duration_s
    warm = options.warmup_s if options.warmup_s is not None else min(sim.warmup_s, 0.2 * dur)
    return [
        override_text("sim.duration_s", dur),
        override_text("sim.warmup_s", warm),
        override_text("sim.max_drain_s", min(sim.max_drain_s, options.max_drain_s)),
    ]


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
    """Enumerate candidates for the budget, bisect each one's goodput, rank them.

    With ``target_rate_per_s`` and no ``gpus``, the budget is the analytic fleet for
    that rate (at the smallest fitting TPs)."""
    opts = options or PlanOptions()
    label = str(loaded.path) if loaded.path else "<scenario>"
    if target_rate_per_s is not None and not target_rate_per_s > 0:
        raise UserError(f"--target-rate {target_rate_per_s}: must be > 0 req/s")
    if target_rate_per_s is not None and not math.isfinite(target_rate_per_s):
        raise UserError(f"--target-rate {target_rate_per_s}: must be a finite rate")
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise UserError(f"--price-per-gpu-hour {price_per_gpu_hour}: must be > 0")
    lengths = sample_lengths(loaded)
    if gpus is None and target_rate_per_s is not None:
        gpu = plan_gpu(loaded)
        prompts, outputs = lengths
        min_kv = int(np.percentile(prompts, 99) + np.percentile(outputs, 99))
        tps = fitting_tps(loaded, gpu, get_gpu(gpu).gpus_per_node, min_kv)
        if not tps:
            raise UserError(f"plan: no TP on one node of {gpu} fits {loaded.scenario.model}")
        g = analytic_guess(
            loaded,
            prefill_tp=tps[0],
            decode_tp=tps[0],
            target_rate_per_s=target_rate_per_s,
            lengths=lengths,
        )
        budget = g.num_gpus
    else:
        budget = budget_of(loaded, gpus)
    if budget > MAX_GPUS:  # before any candidate is enumerated (docs/safety.md)
        where = f"--gpus {gpus}" if gpus is not None else f"--target-rate {target_rate_per_s:g}"
        raise UserError(
            f"{where}: a budget of {budget:,} GPUs, more than the {MAX_GPUS:,} a plan may size"
        )
    cands, guess, tps = enumerate_candidates(loaded, budget, opts, lengths)
    if target_rate_per_s is not None:
        guess = analytic_guess(
            loaded,
            prefill_tp=tps[0],
            decode_tp=tps[0],
            target_rate_per_s=target_rate_per_s,
            lengths=lengths,
        )
    rate_hi = opts.rate_hi_factor * guess.capacity_per_gpu_per_s * budget
    rate_lo = rate_hi / 200.0
    sim = _sim_overrides(loaded, opts)
    sources: list[Source] = []
    for c in cands:
        raw = candidate_scenario(loaded, c, name=f"{loaded.scenario.name}-{_slug(c)}")
        try:
            cl = load_scenario(raw, sim, base_dir=loaded.base_dir)
        except UserError as e:
            raise UserError(f"{label}: candidate {c.label}: {e}") from None
        sources.append(source_of(cl, label))
    results = goodput_many(
        sources,
        rate_lo,
        rate_hi,
        tol_per_s=opts.tol_fraction * rate_hi,
        seeds=opts.seeds,
        executor=executor,
        progress=progress,
    )
    # one more round: each candidate at its goodput rate, for the latency columns
    idx = [i for i, r in enumerate(results) if r.status != "below_range"]
    tasks = []
    for i in idx:
        src = sources[i]
        raw = load_scenario(
            src.raw,
            [override_text("workload.rate_per_s", results[i].rate_per_s)],
            base_dir=src.base_dir,
        ).raw
        tasks.append(PointTask(raw=raw, base_dir=str(src.base_dir)))
    if executor is not None:
        summaries = executor.map(run_point, tasks)
    else:
        summaries = [run_point(t) for t in tasks]
    at_rate = dict(zip(idx, summaries, strict=True))
    out_mean = float(lengths[1].mean())
    rows = []
    for i, (c, r) in enumerate(zip(cands, results, strict=True)):
        rate = 0.0 if r.status == "below_range" else r.rate_per_s
        usd = None
        if price_per_gpu_hour is not None and rate > 0:
            usd = price_per_gpu_hour * c.num_gpus / 3600.0 / (rate * out_mean) * 1e6
        rows.append(
            CandidateResult(
                candidate=c,
                goodput_per_s=rate,
                goodput_per_gpu_per_s=rate / c.num_gpus,
                status=r.status,
                at_rate=at_rate.get(i),
                usd_per_m_output_tokens=usd,
            )
        )
    order = {k: n for n, k in enumerate(("colocate_chunked", "colocate_vllm", "disaggregate"))}
    rows.sort(
        key=lambda x: (-x.goodput_per_gpu_per_s, order[x.candidate.kind], x.candidate.num_gpus)
    )
    return SearchResult(
        loaded=loaded,
        gpu=plan_gpu(loaded),
        gpu_budget=budget,
        analytic=guess,
        ranked=tuple(rows),
        rate_lo_per_s=rate_lo,
        rate_hi_per_s=rate_hi,
        min_worker_gpus=tps[0],
        options=opts,
    )


def _slug(c: Candidate) -> str:
    if c.kind == "disaggregate":
        return f"disagg-{c.num_prefill_workers}p{c.prefill_tp}-{c.num_decode_workers}d{c.decode_tp}"
    sched = "chunked" if c.kind == "colocate_chunked" else "vllm"
    return f"{sched}-{c.num_prefill_workers}x{c.prefill_tp}" + (
        f"-c{c.chunk_tokens}" if c.chunk_tokens else ""
    )
