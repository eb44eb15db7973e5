"""The analytic first guess of ``disaggsim plan``: GPU-seconds per request in each phase.

From the scenario's own token histograms (its requests, generated exactly as a run
would) and the roofline cost model of one worker per pool:

- **prefill GPU-s per request** = mean over requests of the time of a prefill batch that
  fills the prefill token budget with prompts of that length (``k = max(1, budget // L)``
  prompts of ``L`` tokens: ``prefill_time_s(k, k·L, k·L(L+1)/2) / k``) × prefill TP;
- **decode GPU-s per request** = mean output tokens × the per-sequence share of one
  decode step at the *typical batch* ``B`` (``decode_time(B, B·C) / B``, ``C`` = mean
  prompt + half the mean output: the mean context over a generation) × decode TP, where
  ``B`` is the largest batch up to ``max_batch_seqs`` whose step time stays under the
  ITL target and whose KV (``B × (mean prompt + mean output)`` tokens) fits the worker.

A worker is a :class:`Layout`: attention TP per data-parallel rank, DP ranks and the EP
degree of an MoE model (dense models: TP only); its GPUs count in the GPU-seconds. With
an expected **prefix hit share** ``s`` (:func:`expected_prefix_hit_share`: a workload
whose requests carry prefix chains, on a scenario that caches them) a prompt of ``L``
tokens prefills ``(1 − s) L`` new tokens after ``s L`` cached ones; decode and the
handoff (the whole KV crosses) do not change.

The P:D GPU ratio is the ratio of the two; worker counts follow for a GPU budget (split
in that ratio) or for a target rate (enough GPU-seconds per second in each pool at
:data:`TARGET_UTILISATION`). Capacity per GPU = 1 / (prefill + decode GPU-s per request):
the rate a perfectly packed fleet could sustain, used as the search's upper bracket.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from disaggsim.catalog import get_model
from disaggsim.config.loader import LoadedScenario
from disaggsim.costmodel.reserve import DEFAULT_BATCH_SEQS, DEFAULT_BATCH_TOKENS
from disaggsim.costmodel.step import RooflineWorkerCost, valid_tps
from disaggsim.errors import UserError
from disaggsim.run import make_requests
from disaggsim.units import GiB
from disaggsim.workload.requests import Requests

__all__ = [
    "TARGET_UTILISATION",
    "AnalyticGuess",
    "ColocatedStep",
    "Layout",
    "PoolLimits",
    "analytic_guess",
    "cache_enabled",
    "colocated_step_within_itl",
    "expected_prefix_hit_share",
    "fitting_tps",
    "loaded_residence_s",
    "longest_colocated_step_s",
    "sample_requests",
    "worker_cost",
]

TARGET_UTILISATION = 0.7  # a pool sized for a target rate runs at most this busy
MAX_SAMPLE_REQUESTS = 4000  # the histograms are means: a few thousand requests suffice
DEFAULT_PREFILL_BUDGET_TOKENS = 8192
DEFAULT_MAX_BATCH_SEQS = 256


@dataclass(frozen=True, slots=True)
class Layout:
    """One worker's parallel layout: attention ``tp`` per data-parallel rank, ``dp``
    ranks, experts over ``ep`` GPUs (None: the cost model's default, docs/costmodel.md).
    A dense worker is ``Layout(tp)``."""

    tp: int
    dp: int = 1
    ep: int | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def tag(self) -> str:
        """``tp4``, ``tp1xdp8 ep8``, ``tp8 ep8``."""
        out = f"tp{self.tp}" + (f"xdp{self.dp}" if self.dp > 1 else "")
        return out + (f" ep{self.ep}" if self.ep is not None and self.ep > 1 else "")


class PoolLayouts:
    """The prefill and decode worker layouts of a deployment held as flat fields
    (:class:`AnalyticGuess`, ``search.Candidate``). Colocated: the prefill fields are the
    pool's and there are no decode workers."""

    __slots__ = ()

    num_prefill_workers: int
    prefill_tp: int
    prefill_dp: int
    prefill_ep: int | None
    num_decode_workers: int
    decode_tp: int
    decode_dp: int
    decode_ep: int | None

    @property
    def prefill_layout(self) -> Layout:
        """The prefill (colocated: the pool's) worker layout."""
        return Layout(self.prefill_tp, self.prefill_dp, self.prefill_ep)

    @property
    def decode_layout(self) -> Layout:
        return Layout(self.decode_tp, self.decode_dp, self.decode_ep)

    @property
    def num_gpus(self) -> int:
        return (
            self.num_prefill_workers * self.prefill_layout.gpus
            + self.num_decode_workers * self.decode_layout.gpus
        )


@dataclass(frozen=True, slots=True)
class AnalyticGuess(PoolLayouts):
    """The first guess and the numbers it came from (seconds, tokens, GPUs)."""

    num_requests_sampled: int
    prompt_tokens_mean: float
    prompt_tokens_p90: float
    output_tokens_mean: float
    prefill_tp: int
    decode_tp: int
    prefill_budget_tokens: int
    prefill_batch_prompts_mean: float  # prompts per prefill batch, mean over requests
    prefill_s_per_request: float  # worker-seconds (one TP group) per request
    prefill_gpu_s_per_request: float
    decode_batch: int  # the typical decode batch B
    decode_context_tokens_mean: float  # C, per sequence
    decode_step_s: float  # one step at (B, B·C)
    decode_gpu_s_per_request: float
    pd_gpu_ratio: float  # prefill GPU-s / decode GPU-s per request
    prefill_share: float  # prefill GPU-s / (prefill + decode GPU-s)
    gpu_budget: int | None
    target_rate_per_s: float | None
    num_prefill_workers: int
    num_decode_workers: int
    capacity_per_gpu_per_s: float  # 1 / (prefill + decode GPU-s per request)
    prefill_dp: int = 1  # data-parallel ranks per worker (MoE layouts)
    prefill_ep: int | None = None
    decode_dp: int = 1
    decode_ep: int | None = None
    prefix_hit_share: float = 0.0  # expected share of prompt tokens found cached
    prefill_gpu_s_no_reuse: float = float("nan")  # prefill GPU-s per request at share 0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["num_gpus"] = self.num_gpus
        return d

    def arithmetic(self) -> list[str]:
        """The guess as lines of arithmetic, for the terminal."""
        pl, dl = self.prefill_layout, self.decode_layout
        p = pl.tag if pl.dp > 1 or pl.ep else str(pl.tp)
        d = dl.tag if dl.dp > 1 or dl.ep else str(dl.tp)
        p_gpus = f"tp {p}" if pl.gpus == pl.tp else f"{pl.gpus} GPUs ({p})"
        d_gpus = f"tp {d}" if dl.gpus == dl.tp else f"{dl.gpus} GPUs ({d})"
        lines = [
            f"histograms: {self.num_requests_sampled} requests, prompt mean "
            f"{self.prompt_tokens_mean:.0f} tokens (p90 {self.prompt_tokens_p90:.0f}), "
            f"output mean {self.output_tokens_mean:.0f} tokens",
        ]
        if self.prefix_hit_share > 0:
            lines.append(
                f"prefix reuse: an expected {self.prefix_hit_share:.1%} of prompt tokens are "
                f"cached, so a prompt prefills {1 - self.prefix_hit_share:.1%} of its tokens "
                f"(prefill {self.prefill_gpu_s_no_reuse * 1e3:.1f} GPU-ms per request "
                "without reuse)"
            )
        lines += [
            f"prefill: {self.prefill_batch_prompts_mean:.1f} prompts per "
            f"{self.prefill_budget_tokens}-token batch -> {self.prefill_s_per_request * 1e3:.1f} ms "
            f"per request x {p_gpus} = {self.prefill_gpu_s_per_request * 1e3:.1f} GPU-ms",
            f"decode: batch {self.decode_batch} x {self.decode_context_tokens_mean:.0f} context "
            f"tokens -> step {self.decode_step_s * 1e3:.2f} ms; "
            f"{self.output_tokens_mean:.0f} tokens x {self.decode_step_s * 1e3:.2f} ms / "
            f"{self.decode_batch} x {d_gpus} = {self.decode_gpu_s_per_request * 1e3:.1f} GPU-ms",
            f"P:D GPU ratio = {self.prefill_gpu_s_per_request * 1e3:.1f} / "
            f"{self.decode_gpu_s_per_request * 1e3:.1f} = {self.pd_gpu_ratio:.2f} "
            f"(prefill share {self.prefill_share:.0%})",
        ]
        if self.target_rate_per_s is not None:
            lines.append(
                f"for {self.target_rate_per_s:g} req/s at {TARGET_UTILISATION:.0%} utilisation: "
                f"prefill {self.num_prefill_workers} x {pl.tag}, decode "
                f"{self.num_decode_workers} x {dl.tag} ({self.num_gpus} GPUs)"
            )
        else:
            lines.append(
                f"for {self.gpu_budget} GPUs: prefill {self.num_prefill_workers} x {pl.tag}, "
                f"decode {self.num_decode_workers} x {dl.tag} ({self.num_gpus} GPUs)"
            )
        lines.append(
            f"capacity if perfectly packed: 1 / ({self.prefill_gpu_s_per_request * 1e3:.1f} + "
            f"{self.decode_gpu_s_per_request * 1e3:.1f}) GPU-ms = "
            f"{self.capacity_per_gpu_per_s:.2f} req/s per GPU"
        )
        return lines


def loaded_residence_s(g: AnalyticGuess, slo, colocated: bool = False) -> float:
    """Seconds a mean request spends in a loaded deployment of the guess's layouts: its
    prefill batch (``k`` prompts of ``prefill_s_per_request`` each), then (mean output −
    1) decode steps, each the typical batch's step (disaggregated) or the ITL target (a
    colocated pool: its steps carry prefill work, and at capacity they stretch to the
    target, but never past the longest step the pool makes: a full prefill batch beside
    the typical decode batch, :func:`longest_colocated_step_s`); at most what the SLO lets
    a request that meets it take (TTFT target + (mean output − 1) × ITL target). So an
    SLO looser than the workload can reach binds nothing here: the residence is the
    workload's own, never the SLO's (a 1e12 ms ITL target made every run 1e9 s long). A
    goodput run shorter than this measures a system that has not filled
    (docs/planning.md, "Run lengths")."""
    decode_steps = max(g.output_tokens_mean - 1.0, 0.0)
    prefill_s = g.prefill_s_per_request * max(g.prefill_batch_prompts_mean, 1.0)
    ceiling_s = longest_colocated_step_s(g) if colocated else g.decode_step_s
    step_s = min(ceiling_s, slo.itl_s)
    return min(prefill_s + decode_steps * step_s, slo.ttft_s + decode_steps * slo.itl_s)


def longest_colocated_step_s(g: AnalyticGuess) -> float:
    """The longest step a colocated pool of the guess's layout makes at its limits: a
    whole prefill batch of its token budget (``k`` prompts of ``prefill_s_per_request``)
    carried beside the typical decode batch's step. A colocated step at capacity
    stretches to the ITL target only up to this."""
    return g.decode_step_s + g.prefill_s_per_request * max(g.prefill_batch_prompts_mean, 1.0)


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """The settings of a worker's pool that size the engine's memory reserve, and so its
    KV capacity (:mod:`disaggsim.costmodel.reserve`): the whole worker's batch limits
    (over its data-parallel ranks), ``gpu_mem_util`` and a fixed reserve per GPU (None:
    the engine's). The defaults are a pool's defaults (``PoolConfig``)."""

    max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch_seqs: int = DEFAULT_BATCH_SEQS
    gpu_mem_util: float = 0.9
    activation_reserve_gib: float | None = None

    @classmethod
    def of(cls, pool: Mapping[str, Any] | Any) -> PoolLimits:
        """A pool's limits: a pool mapping as a scenario writes it, or a ``PoolConfig``."""
        get = pool.get if isinstance(pool, Mapping) else lambda k, d=None: getattr(pool, k, d)
        return cls(
            max_batch_tokens=int(get("max_batch_tokens", DEFAULT_BATCH_TOKENS)),
            max_batch_seqs=int(get("max_batch_seqs", DEFAULT_BATCH_SEQS)),
            gpu_mem_util=float(get("gpu_mem_util", 0.9)),
            activation_reserve_gib=get("activation_reserve_gib", None),
        )


def worker_cost(
    loaded: LoadedScenario,
    gpu: str,
    tp: int | Layout,
    gpu_mem_util: float = 0.9,
    limits: PoolLimits | None = None,
):
    """The cost model of one worker of the scenario's model on ``gpu``: ``tp`` GPUs (a
    dense roofline), or a :class:`Layout` (MoE: its DP ranks and EP degree, with the MoE
    options of the scenario's pools); the same ``build_cost`` the simulator runs. Its
    KV capacity is the simulator's for a pool of ``limits`` (``gpu_mem_util`` is theirs
    then); without them, for a pool of the default batch limits at ``gpu_mem_util``."""
    from disaggsim.costmodel.moe import build_cost

    s = loaded.scenario
    lay = tp if isinstance(tp, Layout) else Layout(tp)
    lim = limits if limits is not None else PoolLimits(gpu_mem_util=gpu_mem_util)
    return build_cost(
        s.model,
        gpu,
        lay.tp,
        dp=lay.dp,
        ep=lay.ep,
        moe=moe_options(loaded),
        weight_dtype=s.weight_dtype,
        kv_dtype=s.kv_dtype,
        engine=s.engine,
        attention_backend=s.attention_backend,
        gpu_mem_util=lim.gpu_mem_util,
        max_seqs=lim.max_batch_seqs,
        max_batch_tokens=lim.max_batch_tokens,
        activation_reserve_bytes=(
            None if lim.activation_reserve_gib is None else lim.activation_reserve_gib * GiB
        ),
        gpus_per_node=getattr(s.fabric, "gpus_per_node", None),  # a topology's node size
    )


def moe_options(loaded: LoadedScenario) -> dict | None:
    """The MoE options (``moe:``) of the scenario's decode (or colocated) pool, else its
    prefill pool's; None for none. Options at their defaults are left out, as the simulator
    does (disaggsim/run.py): a written scenario.yaml spells every default out, and a dense
    pool's spelt-out defaults must not read as MoE options (they were refused inside the
    TP search and reported as 'no worker fits')."""
    s = loaded.scenario
    for pool in (s.decode_pool or s.pool, s.prefill_pool):
        if pool is not None and pool.moe is not None:
            return pool.moe.model_dump(exclude_defaults=True)
    return None


def kv_capacity_per_rank(cost) -> int:
    """KV tokens one sequence can use: a DP rank's capacity (a request lives on one
    rank), else the worker's."""
    return int(getattr(cost, "kv_capacity_tokens_per_rank", cost.kv_capacity_tokens))


def fitting_tps(
    loaded: LoadedScenario,
    gpu: str,
    max_tp: int,
    min_kv_tokens: int,
    gpu_mem_util: float = 0.9,
    refusals: dict[str, str] | None = None,
    limits: Callable[[Layout], PoolLimits] | None = None,
) -> list[int]:
    """Valid TP degrees up to ``max_tp`` whose worker holds at least ``min_kv_tokens`` of KV;
    ``refusals`` (when given) collects why a worker could not be built at all, by layout
    (:func:`refusal_note`); ``limits``: the pool limits of a worker of each layout (its KV
    capacity depends on them), else the defaults at ``gpu_mem_util``."""
    out = []
    for tp in valid_tps(get_model(loaded.scenario.model), max_tp):
        lim = None if limits is None else limits(Layout(tp))
        try:
            cost = worker_cost(loaded, gpu, tp, gpu_mem_util, lim)
        except UserError as err:
            if refusals is not None:
                refusals[f"tp {tp}"] = str(err)
            continue
        if cost.kv_capacity_tokens >= min_kv_tokens:
            out.append(tp)
    return out


def refusal_note(refusals: dict[str, str]) -> str:
    """`` (no worker could be built; at LAYOUT: WHY)`` for the last (largest) layout tried,
    so a plan that finds no worker says why the cost model refused it (memory, or another
    reason a message of 'does not fit' alone would hide); ``""`` when none was refused."""
    if not refusals:
        return ""
    layout = list(refusals)[-1]
    return f" (no worker could be built; at {layout}: {refusals[layout]})"


def smallest_unit(
    loaded: LoadedScenario,
    gpu: str,
    min_kv_tokens: int,
    gpu_mem_util: float = 0.9,
    refusals: dict[str, str] | None = None,
    max_tp: int | None = None,
    limits: Callable[[Layout], PoolLimits] | None = None,
) -> Layout | None:
    """The worker of fewest GPUs whose every rank holds ``min_kv_tokens`` of KV (None:
    none does): plain TP first at each size; for an MoE/MLA model also ``tp x dp``
    (attention TP within one node, experts over all the worker's GPUs), which is how a
    model too large for any TP group of one node fits (DeepSeek-V3 in bf16 on H200s:
    tp 8 x dp 2). ``max_tp``: no TP group larger (a ``kind: topology`` fabric keeps each
    one inside a node). ``limits``: as :func:`fitting_tps`."""
    from disaggsim.catalog import get_gpu
    from disaggsim.config.bounds import MAX_GPUS

    m = get_model(loaded.scenario.model)
    tps = valid_tps(m) if max_tp is None else valid_tps(m, max_tp)
    units = [Layout(tp) for tp in tps]
    if m.moe is not None or m.mla is not None:
        node = get_gpu(gpu).gpus_per_node
        units += [
            Layout(tp, dp)
            for tp in tps
            if tp <= node
            for dp in (2, 4, 8, 16, 32, 64, 128)
            if tp * dp <= MAX_GPUS
        ]
    for lay in sorted(units, key=lambda u: (u.gpus, u.dp)):
        try:
            lim = None if limits is None else limits(lay)
            cost = worker_cost(loaded, gpu, lay, gpu_mem_util, lim)
        except UserError as err:
            if refusals is not None:
                refusals[f"tp {lay.tp}" + (f" x dp {lay.dp}" if lay.dp > 1 else "")] = str(err)
            continue
        if kv_capacity_per_rank(cost) >= min_kv_tokens:
            return lay
    return None


def sample_requests(loaded: LoadedScenario) -> Requests:
    """The scenario's requests as a run generates them (all of them: the prefix hit share
    needs the whole sequence of prefix chains)."""
    reqs = make_requests(loaded)
    if len(reqs) == 0:
        s = loaded.scenario
        where = str(loaded.path) if loaded.path else "plan question"
        rate = getattr(s.workload, "rate_per_s", None)
        at = f" at workload.rate_per_s {rate:g} req/s" if rate is not None else ""
        raise UserError(
            f"{where}: workload: no requests in sim.duration_s {s.sim.duration_s:g} s{at}, "
            "and the plan samples its lengths from them: raise workload.rate_per_s or "
            "sim.duration_s (the rate the plan searches is its own)"
        )
    return reqs


def sample_lengths(
    loaded: LoadedScenario, requests: Requests | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output token arrays of the scenario's requests (at most
    :data:`MAX_SAMPLE_REQUESTS`, the first ones)."""
    reqs = requests if requests is not None else sample_requests(loaded)
    n = min(len(reqs), MAX_SAMPLE_REQUESTS)
    return (
        np.asarray(reqs.prompt_tokens[:n], dtype=np.int64),
        np.asarray(reqs.output_tokens[:n], dtype=np.int64),
    )


def cache_enabled(loaded: LoadedScenario) -> bool:
    """Whether the simulation reuses cached prefixes: the scenario has a ``cache:``
    section (docs/prefix-caching.md; the engine caches on the prefill workers of a
    disaggregated deployment)."""
    return getattr(loaded.scenario, "cache", None) is not None


def expected_prefix_hit_share(
    loaded: LoadedScenario,
    requests: Requests,
    *,
    num_workers: int,
    layout: Layout | int,
    gpu: str | None = None,
    limits: PoolLimits | None = None,
) -> float:
    """The share of prompt tokens a prefilling pool of ``num_workers`` workers of
    ``layout`` finds cached (:func:`disaggsim.cache.estimate.expected_hit_share`): 0
    when the requests carry no prefix chains.

    Each worker keeps for prefixes its KV capacity less one full prefill batch of the
    running prompts (its ``max_batch_tokens``), plus its share of its node's DRAM tier
    and of the remote store when the scenario's ``cache:`` has them (an unbounded remote
    store: no limit). The routing is the scenario's: ``cache_aware`` (the pool's caches
    add up) when ``router.prefill_policy`` is ``cache_aware``, else each worker sees every
    ``n``-th request (``round_robin``); the cache policy is ``cache.policy`` (radix when
    the scenario has no ``cache:``). ``limits``: the prefilling pool's (its KV capacity and
    token budget), else the scenario's prefill (or colocated) pool's."""
    from disaggsim.cache.estimate import expected_hit_share
    from disaggsim.cache.worker import stored_bytes_per_token
    from disaggsim.catalog import get_gpu

    if requests.prefix_chains is None:
        return 0.0
    s = loaded.scenario
    pool = s.prefill_pool or s.pool
    assert pool is not None
    gpu = gpu or plan_gpu(loaded)
    lay = layout if isinstance(layout, Layout) else Layout(layout)
    lim = limits if limits is not None else PoolLimits.of(pool)
    cost = worker_cost(loaded, gpu, lay, limits=lim)
    room: int | None = max(int(cost.kv_capacity_tokens) - int(lim.max_batch_tokens), 0)
    cache = getattr(s, "cache", None)
    n = max(1, num_workers)
    if cache is not None and room is not None:
        # what a stored block spends per token, as the engine sizes its tiers
        per_token = stored_bytes_per_token(cost, requests.prefix_chains.block_tokens)
        dram = cache.dram_tokens(per_token)
        if dram is not None:  # a node's DRAM is shared by the workers on it
            per_node = max(1, get_gpu(gpu).gpus_per_node // lay.gpus)
            room += dram // min(per_node, n)
        if cache.has_remote:
            remote = cache.remote_tokens(per_token)
            room = None if remote is None else room + remote // n
    policy: Literal["lru", "radix"] = "lru" if getattr(cache, "policy", None) == "lru" else "radix"
    routing: Literal["cache_aware", "round_robin"] = (
        "cache_aware" if s.router.prefill_policy == "cache_aware" else "round_robin"
    )
    return expected_hit_share(
        requests,
        num_workers=n,
        capacity_tokens_per_worker=room,
        routing=routing,
        policy=policy,
    )


def prefill_s_per_request(
    cost: RooflineWorkerCost,
    prompts: np.ndarray,
    budget_tokens: int,
    hit_share: float = 0.0,
) -> tuple[float, float]:
    """(mean worker-seconds per request, mean prompts per batch) when every prompt is
    prefilled in a batch of ``max(1, budget // N)`` prompts of its own length ``L``,
    ``N = L − c`` new tokens after ``c = round(hit_share × L)`` cached ones (attention
    over the cached part still counts: ``N·c + N(N+1)/2`` query-key pairs)."""
    lengths, counts = np.unique(prompts, return_counts=True)
    total_s = 0.0
    total_k = 0.0
    for length, count in zip(lengths.tolist(), counts.tolist(), strict=True):
        cached = min(int(round(hit_share * length)), length - 1)
        new = length - cached
        k = max(1, budget_tokens // new)
        pairs = new * cached + new * (new + 1) / 2.0
        t = cost.prefill_time_s(k, k * new, k * pairs, k * cached)
        total_s += count * t / k
        total_k += count * k
    n = float(counts.sum())
    return total_s / n, total_k / n


def typical_decode_batch(
    cost: RooflineWorkerCost,
    context_tokens: float,
    resident_tokens: float,
    max_batch: int,
    itl_s: float,
) -> int:
    """Largest batch <= ``max_batch`` whose step stays under ``itl_s`` and whose KV
    (``resident_tokens`` per sequence) fits the worker; at least 1."""
    kv_cap = int(cost.kv_capacity_tokens // max(resident_tokens, 1.0))
    top = max(1, min(max_batch, kv_cap))

    def fits(b: int) -> bool:
        return cost.decode_time_s(b, int(b * context_tokens)) <= itl_s

    # the step time grows with the batch: bisect for the last batch that fits (a wide
    # MoE decode unit allows thousands of sequences)
    if not fits(1):
        return 1
    lo, hi = 1, top
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class ColocatedStep:
    """The largest colocated step within the ITL target that carries prefill and decode
    in the workload's proportion (:func:`colocated_step_within_itl`)."""

    decodes: int  # decode sequences in the step (0: not even one fits)
    prompt_tokens: int  # prompt tokens prefilled in the same step
    step_s: float  # its time
    capacity_per_gpu_per_s: float  # requests per second per GPU at that step (0: none)


def colocated_step_within_itl(
    cost: RooflineWorkerCost,
    prompt_tokens_mean: float,
    output_tokens_mean: float,
    itl_s: float,
    max_batch: int,
) -> ColocatedStep:
    """What a colocated worker serves when every step stays within the ITL target.

    Loaded, a colocated worker runs prompts and replies side by side: each step carries
    ``B`` decodes and, to keep up, the prompt tokens of the requests those decodes
    finish, ``B × prompt / output`` (chunked prefill cuts prompts to that; a whole
    prompt in one step is a longer step still). The ITL target bounds that step, and so
    ``B``: the worker serves ``B / (output × step)`` requests per second, largest at the
    largest ``B`` whose step fits (a bigger step reads the weights once for more
    tokens), within ``max_batch`` and the KV the worker holds. A chunk is priced at a
    mean prompt's middle (its attention reads the half before it). Against what split
    pools serve per GPU (prefill at full batches, decode at the typical batch), the
    shortfall is what the ITL target costs a colocated pool (docs/planning.md §3)."""
    p, o = float(prompt_tokens_mean), max(float(output_tokens_mean), 1.0)
    ctx = p + 0.5 * o

    def step_s(b: int) -> tuple[float, int]:
        c = max(1, int(round(b * p / o)))
        off = max(p - c, 0.0) / 2.0
        pairs = c * off + c * (c + 1) / 2.0
        return cost.mixed_time_s(b, int(b * ctx), 1, c, pairs, int(off)), c

    kv_cap = int(cost.kv_capacity_tokens // max(p + o, 1.0))
    top = max(1, min(int(max_batch), kv_cap))
    if step_s(1)[0] > itl_s:
        t, c = step_s(1)
        return ColocatedStep(0, c, t, 0.0)
    lo, hi = 1, top
    if step_s(hi)[0] <= itl_s:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_s(mid)[0] <= itl_s:
            lo = mid
        else:
            hi = mid
    t, c = step_s(lo)
    return ColocatedStep(lo, c, t, lo / (o * t) / cost.num_gpus)


def analytic_guess(
    loaded: LoadedScenario,
    *,
    prefill_tp: int | Layout,
    decode_tp: int | Layout,
    gpu_budget: int | None = None,
    target_rate_per_s: float | None = None,
    prefill_budget_tokens: int | None = None,
    max_batch_seqs: int | None = None,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
    hit_share: float = 0.0,
    memo: dict | None = None,
    prefill_limits: PoolLimits | None = None,
    decode_limits: PoolLimits | None = None,
) -> AnalyticGuess:
    """The P:D ratio and worker counts from the token histograms and the cost model.

    Give ``gpu_budget`` (split the GPUs in the ratio, at least one worker each) or
    ``target_rate_per_s`` (size each pool for that rate). Pools use the scenario's GPU
    (its decode pool's, or its colocated pool's) with TPs ``prefill_tp``/``decode_tp``
    (or :class:`Layout` s: their GPUs count). ``hit_share``: the expected share of prompt
    tokens found in a prefix cache (:func:`expected_prefix_hit_share`), in [0, 1).
    ``memo``: a dict kept by a caller that guesses many pairs of layouts for the same
    scenario and ``lengths``: the prefill side (a loop over every prompt length) is
    computed once per prefill layout, token budget and hit share (the same values).
    ``prefill_limits``/``decode_limits``: the pools' limits that size each worker's KV
    capacity (the decode batch must fit it; :class:`PoolLimits`), else the scenario's
    pools' with the token budget and batch limit above.
    """
    if (gpu_budget is None) == (target_rate_per_s is None):
        raise UserError("plan: give a GPU budget or a target rate (exactly one)")
    if not 0.0 <= hit_share < 1.0:
        raise UserError(f"plan: prefix hit share {hit_share}: must be in [0, 1)")
    s = loaded.scenario
    gpu = plan_gpu(loaded)
    pl = prefill_tp if isinstance(prefill_tp, Layout) else Layout(prefill_tp)
    dl = decode_tp if isinstance(decode_tp, Layout) else Layout(decode_tp)
    prompts, outputs = lengths if lengths is not None else sample_lengths(loaded)
    pre_pool = s.prefill_pool or s.pool
    dec_pool = s.decode_pool or s.pool
    assert pre_pool is not None and dec_pool is not None
    budget_tokens = prefill_budget_tokens or (
        pre_pool.max_batch_tokens
        if s.architecture == "disaggregated"
        else max(pre_pool.max_batch_tokens, DEFAULT_PREFILL_BUDGET_TOKENS)
    )
    max_b = max_batch_seqs or dec_pool.max_batch_seqs

    pre_lim = prefill_limits or dataclasses.replace(
        PoolLimits.of(pre_pool), max_batch_tokens=int(budget_tokens)
    )
    dec_lim = decode_limits or dataclasses.replace(PoolLimits.of(dec_pool), max_batch_seqs=max_b)
    key = (pl, budget_tokens, hit_share, pre_lim)
    if memo is not None and key in memo:
        pre_s, k_mean, pre_s0 = memo[key]
    else:
        pcost = worker_cost(loaded, gpu, pl, limits=pre_lim)
        pre_s, k_mean = prefill_s_per_request(pcost, prompts, budget_tokens, hit_share)
        pre_s0 = pre_s
        if hit_share != 0:
            pre_s0 = prefill_s_per_request(pcost, prompts, budget_tokens)[0]
        if memo is not None:
            memo[key] = (pre_s, k_mean, pre_s0)
    dcost = worker_cost(loaded, gpu, dl, limits=dec_lim)
    p_mean, o_mean = float(prompts.mean()), float(outputs.mean())
    ctx = p_mean + 0.5 * o_mean
    b = typical_decode_batch(dcost, ctx, p_mean + o_mean, max_b, s.slo.itl_s)
    step = dcost.decode_time_s(b, int(b * ctx))
    pre_gpu = pre_s * pl.gpus
    dec_gpu = o_mean * step / b * dl.gpus
    ratio = pre_gpu / dec_gpu
    share = pre_gpu / (pre_gpu + dec_gpu)

    if gpu_budget is not None:
        n_p, n_d = split_budget(gpu_budget, share, pl.gpus, dl.gpus)
    else:
        assert target_rate_per_s is not None
        n_p = max(1, math.ceil(target_rate_per_s * pre_gpu / pl.gpus / TARGET_UTILISATION))
        n_d = max(1, math.ceil(target_rate_per_s * dec_gpu / dl.gpus / TARGET_UTILISATION))
    return AnalyticGuess(
        num_requests_sampled=len(prompts),
        prompt_tokens_mean=p_mean,
        prompt_tokens_p90=float(np.percentile(prompts, 90)),
        output_tokens_mean=o_mean,
        prefill_tp=pl.tp,
        decode_tp=dl.tp,
        prefill_budget_tokens=int(budget_tokens),
        prefill_batch_prompts_mean=k_mean,
        prefill_s_per_request=pre_s,
        prefill_gpu_s_per_request=pre_gpu,
        decode_batch=b,
        decode_context_tokens_mean=ctx,
        decode_step_s=step,
        decode_gpu_s_per_request=dec_gpu,
        pd_gpu_ratio=ratio,
        prefill_share=share,
        gpu_budget=gpu_budget,
        target_rate_per_s=target_rate_per_s,
        num_prefill_workers=n_p,
        num_decode_workers=n_d,
        capacity_per_gpu_per_s=1.0 / (pre_gpu + dec_gpu),
        prefill_dp=pl.dp,
        prefill_ep=pl.ep,
        decode_dp=dl.dp,
        decode_ep=dl.ep,
        prefix_hit_share=hit_share,
        prefill_gpu_s_no_reuse=pre_s0 * pl.gpus,
    )


def split_budget(
    gpus: int, prefill_share: float, prefill_tp: int, decode_tp: int
) -> tuple[int, int]:
    """Prefill and decode workers for ``gpus`` GPUs nearest to ``prefill_share`` of them on
    prefill, at least one worker each, every GPU that fits a decode worker used."""
    if gpus < prefill_tp + decode_tp:
        raise UserError(
            f"plan: {gpus} GPUs cannot hold a tp{prefill_tp} prefill worker and a tp{decode_tp} "
            "decode worker"
        )
    best: tuple[float, int, int] | None = None
    for n_p in range(1, (gpus - decode_tp) // prefill_tp + 1):
        n_d = (gpus - n_p * prefill_tp) // decode_tp
        share = n_p * prefill_tp / (n_p * prefill_tp + n_d * decode_tp)
        key = (abs(share - prefill_share), n_p, n_d)
        if best is None or key < best:
            best = key
    assert best is not None
    return best[1], best[2]


def plan_gpu(loaded: LoadedScenario) -> str:
    """The GPU the plan uses: the scenario's decode pool's (or its colocated pool's)."""
    s = loaded.scenario
    pool = s.decode_pool or s.pool
    assert pool is not None
    return pool.gpu
