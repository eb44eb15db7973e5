"""The scenario: pydantic models for one simulation's YAML, validated at the edge.

Everything is frozen and ``extra="forbid"``, so a misspelt key is an error naming it.
Human-scale keys (``_ms``, ``_gb_per_s``, ``_us``) are converted to SI by properties;
the engine only sees SI values. Pluggable parts are chosen by a literal ``kind``-like
field and built by one explicit function elsewhere (no registries).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from disaggsim.autoscale import AutoscaleConfig, check_against_pools
from disaggsim.autoscale.config import Role
from disaggsim.cache.config import CacheConfig
from disaggsim.config.bounds import (
    MAX_BATCH_SEQS,
    MAX_BATCH_TOKENS,
    MAX_DP,
    MAX_DURATION_S,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_PREFILL_ITERATIONS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_TP,
    MAX_WORKERS_PER_POOL,
    ConfigModel,
    expected_requests,
    fmt,
    mean_length,
)
from disaggsim.config.layout import MoeOptions
from disaggsim.fabric.config import FabricTopologyConfig
from disaggsim.workload import WorkloadConfig

LinkKind = Literal["nvlink", "infiniband", "roce", "pcie"]
DType = Literal["bf16", "fp16", "fp8"]
# MoE/MLA models also take fp8-block, mxfp4, nvfp4 and released (disaggsim.costmodel.moe)
WeightDType = Literal["bf16", "fp16", "fp8", "fp8-block", "mxfp4", "nvfp4", "released"]
# serving-engine profiles (disaggsim/hardware/engines.py); cuda-graphs = vllm and
# eager = vllm-eager-2023 are the older names
Engine = Literal["vllm", "sglang", "trtllm", "vllm-eager-2023", "cuda-graphs", "eager"]
# attention kernels (disaggsim/hardware/profile.py ATTENTION_CHOICES); auto: the serving
# engine's own kernels where the GPU's profile fits them, else the generic fit
# (costmodel/step.py pick_attention_backends)
AttentionBackend = Literal[
    "auto",
    "vllm-flash",
    "sglang-flash",
    "trtllm",
    "sdpa-flash",
    "sdpa-cudnn",
    "sdpa-efficient",
    "flex",
]


class PoolConfig(ConfigModel):
    """A pool of identical workers; a worker is a TP group holding one copy of the weights."""

    gpu: str = Field(description="GPU id from the catalog, e.g. h100-sxm")
    num_workers: int = Field(ge=1, le=MAX_WORKERS_PER_POOL)
    tp: int = Field(
        default=1,
        ge=1,
        le=MAX_TP,
        description="tensor-parallel degree (GPUs per worker, per DP rank with dp)",
    )
    max_batch_seqs: int = Field(
        default=256, ge=1, le=MAX_BATCH_SEQS, description="most sequences in one batch"
    )
    max_batch_tokens: int = Field(
        default=8192,
        ge=1,
        le=MAX_BATCH_TOKENS,
        description="prefill token budget per iteration (chunked: the whole iteration's budget); "
        "a whole-prompt prefill (disaggregated prefill pool, colocated vllm) needs it >= the "
        "longest prompt (disaggsim/validity.py)",
    )
    gpu_mem_util: float = Field(default=0.9, gt=0.0, le=1.0)
    activation_reserve_gib: float | None = Field(
        default=None,
        ge=0.0,
        le=1024.0,
        description="GiB (2**30 bytes) per GPU the engine holds besides weights and KV cache "
        "(activations, workspaces, communication buffers); null: the engine's own reserve "
        "for the model, tp and batch limits (disaggsim/costmodel/reserve.py)",
    )
    scheduler: Literal["vllm", "chunked"] | None = Field(
        default=None, description="colocated pools only: vllm or chunked"
    )
    # MoE layout (docs/costmodel.md): a worker is tp x dp GPUs, experts over ep of them
    dp: int = Field(
        default=1, ge=1, le=MAX_DP, description="attention data-parallel ranks per worker"
    )
    ep: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS,
        description="expert parallelism (default: all GPUs when dp > 1, else 1)",
    )
    moe: MoeOptions | None = None

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.dp


class FabricConfig(ConfigModel):
    """The link between prefill and decode pools (one class for all pairs, no contention:
    each handoff takes size / bandwidth + latency). ``kind: topology`` instead describes
    nodes, NVLink, NICs and placement with shared links (disaggsim.fabric)."""

    kind: Literal["link"] = "link"
    link: LinkKind = Field(
        default="nvlink",
        description="nvlink only when both pools are one GPU type in one node "
        "(disaggsim/validity.py); across nodes infiniband or roce",
    )
    bandwidth_gb_per_s: float | None = Field(
        default=None, gt=0.0, description="per-direction GB/s per GPU; default from the GPU spec"
    )
    latency_us: float | None = Field(default=None, ge=0.0)


def _fabric_kind(v: Any) -> str:
    return v.get("kind", "link") if isinstance(v, dict) else getattr(v, "kind", "link")


FabricSection = Annotated[
    Annotated[FabricConfig, Tag("link")] | Annotated[FabricTopologyConfig, Tag("topology")],
    Discriminator(_fabric_kind),
]


class RouterConfig(ConfigModel):
    prefill_policy: Literal["round_robin", "least_tokens", "shortest_queue", "cache_aware"] = Field(
        default="least_tokens",
        description="cache_aware (with a cache: section): Dynamo's KV-router cost, cached "
        "prefix overlap against queued and active tokens (docs/prefix-caching.md)",
    )
    decode_policy: Literal["least_committed_kv", "most_free_kv", "round_robin", "fastest_path"] = (
        Field(
            default="least_committed_kv",
            description="least_committed_kv: the least KV committed (prompt + max_tokens of the "
            "sequences held) among decode workers with a free batch seat; fastest_path (topology "
            "fabric): prefer the decode worker reached over the fastest, least congested path, "
            "then the most free KV (docs/engine.md, decode routing)",
        )
    )
    backpressure: Literal["kv_aware", "none"] = Field(
        default="kv_aware",
        description="kv_aware: hold requests at the router while no single decode worker can "
        "promise room for their full KV (prompt + max_tokens); none: prefill anyway "
        "(finished prefills then wait holding their KV)",
    )
    reserved_decode_tokens: int = Field(
        default=512,
        ge=1,
        le=MAX_TOKENS,
        description="for requests whose clients set no max_tokens (cap: the model's context "
        "less the prompt): the reply tokens kv_aware promises on a decode worker and "
        "least_committed_kv counts, prompt + min(cap, this); a longer reply grows on demand "
        "(SGLang's num_reserved_decode_tokens, 512; docs/engine.md)",
    )
    max_queue: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS,
        description="most requests waiting for prefill; more are rejected",
    )
    client_timeout_s: float | None = Field(
        default=None, gt=0.0, description="a request with no first token by then is abandoned"
    )


class KvConfig(ConfigModel):
    """Paged KV memory on every worker."""

    block_tokens: int = Field(default=16, description="tokens per KV block: a power of two, 1-256")
    admission: Literal["on_demand", "reserve_full"] = Field(
        default="on_demand",
        description="on_demand: blocks for the current context, sequences grow and may be "
        "preempted (vLLM); reserve_full: blocks for prompt + output at admission, no preemption",
    )
    watermark: float = Field(
        default=0.01, ge=0.0, lt=1.0, description="share of blocks kept free when admitting"
    )
    preemption: Literal["recompute", "swap"] = "recompute"

    @field_validator("block_tokens")
    @classmethod
    def _block_power_of_two(cls, b: int) -> int:
        if b < 1 or b > 256 or b & (b - 1):
            raise ValueError(f"must be a power of two from 1 to 256 (1, 2, 4, ..., 256), got {b}")
        return b


class WorkerFailureConfig(ConfigModel):
    at_s: float = Field(ge=0.0)
    worker: str = Field(pattern=r"^(prefill|decode|colocated):[0-9]+$", description="e.g. decode:0")
    repair_s: float = Field(default=0.0, ge=0.0, description="added to the restart delay")


class RandomFailureConfig(ConfigModel):
    pool: Literal["prefill", "decode", "colocated"]
    mtbf_s: float = Field(gt=0.0, description="mean time between failures of each worker")
    mttr_s: float = Field(gt=0.0, description="mean repair time before the restart")


class LinkFailureConfig(ConfigModel):
    start_s: float = Field(ge=0.0)
    duration_s: float = Field(gt=0.0)
    factor: float = Field(default=0.0, ge=0.0, lt=1.0, description="bandwidth share; 0 = outage")
    links: list[str] | None = Field(
        default=None,
        min_length=1,
        description="fabric kind topology: link ids or shell patterns (e.g. n1.nic0.*); "
        "default every link",
    )


class FailuresConfig(ConfigModel):
    workers: list[WorkerFailureConfig] = []
    random: list[RandomFailureConfig] = []
    links: list[LinkFailureConfig] = []
    provision_s: float = Field(default=30.0, ge=0.0, description="restart: before weights load")
    weights_load_gb_per_s: float = Field(default=5.0, gt=0.0, description="per GPU, GB = 1e9 B")


class SloConfig(ConfigModel):
    """Per-request targets; a request attains the SLO when it meets both."""

    ttft_ms: float = Field(gt=0.0)
    itl_ms: float = Field(gt=0.0)
    itl_statistic: Literal["tpot", "max_gap"] = Field(
        default="tpot",
        description="per-request statistic held against itl_ms: mean gap (TPOT) or largest gap",
    )
    percentile: float = Field(
        default=99.0, gt=0.0, le=100.0, description="fleet percentile at which targets are quoted"
    )
    attainment_target: float = Field(default=0.9, gt=0.0, le=1.0)

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms * 1e-3

    @property
    def itl_s(self) -> float:
        return self.itl_ms * 1e-3


class SimConfig(ConfigModel):
    duration_s: float = Field(
        gt=0.0, le=MAX_DURATION_S, description="requests arrive in [0, duration_s)"
    )
    warmup_s: float = Field(
        default=0.0, ge=0.0, description="arrivals before this are not measured"
    )
    max_drain_s: float = Field(
        default=3600.0,
        ge=0.0,
        le=MAX_DURATION_S,
        description="after duration_s, stop at the latest this much later",
    )

    @model_validator(mode="after")
    def _warmup_inside(self) -> SimConfig:
        if self.warmup_s >= self.duration_s:
            raise ValueError(
                f"warmup_s ({self.warmup_s}) must be smaller than duration_s ({self.duration_s})"
            )
        return self


def _check_budget_holds_batch(key: str, pool: PoolConfig) -> None:
    """``max_batch_tokens >= max_batch_seqs``, as vLLM's SchedulerConfig requires of every
    instance (``max_num_batched_tokens >= max_num_seqs``): an iteration carries at least one
    token per running sequence. A colocated or prefill pool schedules its prompts within the
    budget (a chunked pool of 16-token chunks and 256 sequences was simulated as if it could
    be deployed; a prefill pool's batch of more prompts than tokens likewise); a decode pool's
    step carries one token per running sequence, up to ``max_batch_seqs``, while its
    ``max_batch_tokens`` sizes the engine's activation memory for a forward pass of that
    many tokens (disaggsim/costmodel/reserve.py): a full batch would not fit the reserve."""
    if pool.max_batch_tokens >= pool.max_batch_seqs:
        return
    why = (
        "each running sequence takes a token of an iteration's budget"
        if key != "decode_pool"
        else "a decode step of max_batch_seqs sequences forwards that many tokens, and "
        "max_batch_tokens sizes the engine's activation memory for its forward pass"
    )
    raise ValueError(
        f"{key}.max_batch_tokens: {pool.max_batch_tokens} is below {key}.max_batch_seqs "
        f"({pool.max_batch_seqs}), which vLLM refuses (max_num_batched_tokens must be >= "
        f"max_num_seqs: {why}); raise max_batch_tokens or lower max_batch_seqs"
    )


class Scenario(ConfigModel):
    name: str = Field(
        default="scenario",
        max_length=100,
        description="names the default result folder results/<name>: letters, digits, "
        "'.', '_', '-', starting with a letter or digit",
    )
    description: str = ""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    model: str
    weight_dtype: WeightDType = "bf16"
    kv_dtype: DType = "bf16"
    engine: Engine = "vllm"
    attention_backend: AttentionBackend = "auto"
    architecture: Literal["disaggregated", "colocated"]
    prefill_pool: PoolConfig | None = None
    decode_pool: PoolConfig | None = None
    pool: PoolConfig | None = None
    first_token_from: Literal["decode", "prefill"] = Field(
        default="decode",
        description="disaggregated: first token reaches the client after the KV handoff "
        "(decode) or straight from the prefill worker (prefill)",
    )
    fabric: FabricSection = FabricConfig()
    router: RouterConfig = RouterConfig()
    kv: KvConfig = KvConfig()
    failures: FailuresConfig = FailuresConfig()
    autoscale: AutoscaleConfig = AutoscaleConfig()
    cache: CacheConfig | None = Field(
        default=None,
        description="prefix caching: policy, KV tiers below HBM, cache-aware routing "
        "weight (docs/prefix-caching.md); absent: no prefix cache",
    )
    slo: SloConfig
    workload: WorkloadConfig
    sim: SimConfig

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(
                f"{name!r} is not a folder name (letters, digits, '.', '_', '-', starting "
                "with a letter or digit; it names results/<name>)"
            )
        return name

    @model_validator(mode="before")
    @classmethod
    def _pool_keys_match_architecture(cls, data: Any) -> Any:
        """The pool sections of the other architecture are named before their own fields
        are checked (``--set pool.num_workers=3`` on a disaggregated scenario was
        reported as ``pool.gpu: required key is missing``)."""
        if isinstance(data, dict):
            arch = data.get("architecture")
            split = [k for k in ("prefill_pool", "decode_pool") if data.get(k) is not None]
            if arch == "disaggregated" and data.get("pool") is not None:
                verb = "takes" if len(split) == 2 else "needs"
                raise ValueError(
                    f"architecture disaggregated {verb} prefill_pool/decode_pool, not pool"
                )
            if arch == "colocated" and split:
                verb = "takes" if data.get("pool") is not None else "needs"
                raise ValueError(
                    f"architecture colocated {verb} pool, not prefill_pool/decode_pool"
                )
        return data

    @model_validator(mode="after")
    def _pools_match_architecture(self) -> Scenario:
        if self.architecture == "disaggregated":
            if self.prefill_pool is None or self.decode_pool is None:
                raise ValueError("architecture disaggregated needs prefill_pool and decode_pool")
            for key, p in (("prefill_pool", self.prefill_pool), ("decode_pool", self.decode_pool)):
                if p.scheduler is not None:
                    raise ValueError(f"{key}.scheduler is only for colocated pools")
            _check_budget_holds_batch("prefill_pool", self.prefill_pool)
            _check_budget_holds_batch("decode_pool", self.decode_pool)
        else:
            if self.pool is None:
                raise ValueError("architecture colocated needs pool")
            if self.pool.scheduler is None:
                raise ValueError(
                    "pool.scheduler is required for colocated pools (allowed: vllm, chunked)"
                )
            _check_budget_holds_batch("pool", self.pool)
        if self.cache is not None and self.architecture == "colocated":
            if self.kv.admission != "on_demand" or self.kv.preemption != "recompute":
                raise ValueError(
                    "cache: prefix caching on a colocated pool needs kv.admission on_demand "
                    "and kv.preemption recompute (got "
                    f"{self.kv.admission}, {self.kv.preemption})"
                )
        if self.router.prefill_policy == "cache_aware" and self.cache is None:
            raise ValueError(
                "router.prefill_policy: cache_aware needs a cache: section (prefix caching)"
            )
        self._check_failure_targets()
        check_against_pools(
            self.autoscale, self.architecture, {r: p.num_workers for r, p in self.pools.items()}
        )
        self._check_sizes()
        return self

    def _check_sizes(self) -> None:
        """Bounds that involve several fields (docs/safety.md): GPUs, expected requests,
        random failures and autoscaler decisions of the run."""
        max_gpus = 0
        for role, p in self.pools.items():
            auto = self.autoscale.for_role(role)
            max_gpus += max(p.num_workers, auto.max_workers if auto else 0) * p.gpus_per_worker
        if max_gpus > MAX_GPUS:
            raise ValueError(
                f"pools: {max_gpus:,} GPUs (num_workers or autoscale max_workers × tp × dp, summed "
                f"over pools), more than the {fmt(MAX_GPUS)} allowed (docs/safety.md)"
            )
        expected = expected_requests(self.workload, self.sim.duration_s)
        if expected > MAX_REQUESTS:
            raise ValueError(
                f"workload: about {expected:.3g} requests expected (rate × sim.duration_s), "
                f"more than the {fmt(MAX_REQUESTS)} allowed in one run (lower the rate or "
                "the duration, or set workload.num_requests; docs/safety.md)"
            )
        self._check_prefill_iterations(expected)
        for i, r in enumerate(self.failures.random):
            pool = self.pools.get(r.pool)
            auto = self.autoscale.for_role(r.pool)
            n = max(pool.num_workers if pool else 0, auto.max_workers if auto else 0)
            events = n * self.sim.duration_s / (r.mtbf_s + r.mttr_s)
            if events > MAX_EVENTS:
                raise ValueError(
                    f"failures.random.{i}: about {events:.3g} failures expected "
                    f"({n} workers × sim.duration_s / (mtbf_s + mttr_s)), more than the "
                    f"{fmt(MAX_EVENTS)} allowed (docs/safety.md)"
                )
        horizon_s = self.sim.duration_s + self.sim.max_drain_s
        for role in self.pools:
            auto = self.autoscale.for_role(role)
            if auto is not None and horizon_s / auto.interval_s > MAX_EVENTS:
                raise ValueError(
                    f"autoscale.{role}.interval_s: {horizon_s / auto.interval_s:.3g} decisions "
                    f"over sim.duration_s + sim.max_drain_s, more than the {fmt(MAX_EVENTS)} "
                    "allowed (docs/safety.md)"
                )

    def _check_prefill_iterations(self, expected: float) -> None:
        """A colocated chunked pool prefills a prompt in chunks of ``max_batch_tokens``, one
        iteration each: the run needs at least expected requests × mean prompt / chunk
        iterations (a lower bound: decode tokens share the budget)."""
        prompts = getattr(self.workload, "prompt_tokens", None)
        pool = self.pools.get("colocated")
        if prompts is None or pool is None or pool.scheduler != "chunked" or expected <= 0:
            return
        mean_prompt = mean_length(prompts)
        iterations = expected * mean_prompt / pool.max_batch_tokens
        if iterations > MAX_PREFILL_ITERATIONS:
            hours = iterations / 25_000 / 3600
            raise ValueError(
                f"pool.max_batch_tokens: {pool.max_batch_tokens} gives about {iterations:.3g} "
                f"prefill iterations (about {expected:.3g} requests × {mean_prompt:,.0f} mean "
                f"prompt tokens / {pool.max_batch_tokens}), more than the "
                f"{MAX_PREFILL_ITERATIONS:.0e} one run may take (about {hours:,.0f} hours at "
                "25,000 a second): raise pool.max_batch_tokens, or lower workload.rate_per_s, "
                "sim.duration_s or workload.num_requests (docs/safety.md)"
            )

    def _check_failure_targets(self) -> None:
        pools = self.pools
        allowed = [f"{role}:0..{p.num_workers - 1}" for role, p in pools.items()]
        for i, f in enumerate(self.failures.workers):
            role, _, idx = f.worker.partition(":")
            if role not in pools or int(idx) >= pools[role].num_workers:
                raise ValueError(
                    f"failures.workers.{i}.worker: no worker {f.worker!r} (allowed: {', '.join(allowed)})"
                )
        for i, r in enumerate(self.failures.random):
            if r.pool not in pools:
                raise ValueError(
                    f"failures.random.{i}.pool: no {r.pool!r} pool here (allowed: {', '.join(pools)})"
                )
        if self.failures.links and self.architecture != "disaggregated":
            raise ValueError("failures.links: link failures need architecture disaggregated")
        for i, w in enumerate(self.failures.links):
            if w.links is not None and getattr(self.fabric, "kind", "link") != "topology":
                raise ValueError(
                    f"failures.links.{i}.links: naming links needs fabric kind topology "
                    "(kind link has one link class)"
                )

    @property
    def pools(self) -> dict[Role, PoolConfig]:
        """Pools by role: ``prefill``/``decode`` or ``colocated``."""
        if self.architecture == "disaggregated":
            assert self.prefill_pool is not None and self.decode_pool is not None
            return {"prefill": self.prefill_pool, "decode": self.decode_pool}
        assert self.pool is not None
        return {"colocated": self.pool}

    @property
    def num_gpus(self) -> int:
        return sum(p.num_workers * p.gpus_per_worker for p in self.pools.values())
