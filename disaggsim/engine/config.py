"""What the engine is told: the pools, the policies and the schedules of one run.

Built by :func:`disaggsim.run.engine_config` from a validated scenario (or directly by
tests). Policies and modes are literals checked here, at construction: an unknown value
is a ``ValueError`` before any simulation, so it never reaches the engine (which selects
each policy with one ``match``, :mod:`disaggsim.engine.router`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from disaggsim.costmodel.interface import WorkerCost

if TYPE_CHECKING:
    from disaggsim.engine.prefix import PrefixSetup
    from disaggsim.fabric.topology import Topology

Role = Literal["prefill", "decode", "colocated"]
Scheduler = Literal["vllm", "chunked"]
PrefillPolicy = Literal["round_robin", "least_tokens", "shortest_queue", "cache_aware"]
DecodePolicy = Literal["least_committed_kv", "most_free_kv", "round_robin", "fastest_path"]
FirstTokenFrom = Literal["decode", "prefill"]
KvAdmission = Literal["reserve_full", "on_demand"]
Preemption = Literal["recompute", "swap"]
Backpressure = Literal["none", "kv_aware"]

SwapTime = Callable[[WorkerCost, float, str], float]  # (cost, bytes, "in"|"out") -> s
TransferTime = Callable[[int, int, int], float]  # (nbytes, prefill worker, decode worker) -> s


def _check(name: str, value: object, allowed: Any) -> None:
    options = get_args(allowed)
    if value not in options:
        raise ValueError(f"{name}: {value!r} (allowed: {', '.join(map(str, options))})")


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the engine needs to know about one pool."""

    role: Role
    num_workers: int
    cost: WorkerCost
    max_batch_seqs: int
    max_batch_tokens: int
    scheduler: Scheduler | None = None  # colocated: "vllm" (default) or "chunked"
    max_workers: int | None = None  # autoscaled: workers beyond num_workers start released

    def __post_init__(self) -> None:
        _check("role", self.role, Role)
        if self.scheduler is not None:
            _check("scheduler", self.scheduler, Scheduler)

    @property
    def num_built(self) -> int:
        """Workers the engine builds: every one the pool may have."""
        return max(self.num_workers, self.max_workers or 0)


@dataclass(frozen=True, slots=True)
class WorkerFailureEvent:
    at_s: float
    worker: int  # global worker index (pools in order, workers in order)
    down_s: float  # until it serves again (repair + weights reload)


@dataclass(frozen=True, slots=True)
class LinkWindow:
    """The prefill→decode fabric runs at ``factor`` × its bandwidth (0: outage); on a
    topology fabric only ``links`` (indices into its links) when given."""

    start_s: float
    duration_s: float
    factor: float
    links: tuple[int, ...] | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def _default_swap_time(cost: WorkerCost, nbytes: float, direction: str) -> float:
    return 20e-6 + nbytes / cost.num_gpus / 25e9


# Reply tokens a decode worker is promised for a request whose client set no max_tokens
# (its cap is then the whole context less the prompt): SGLang's decode server reserves
# ``num_reserved_decode_tokens`` per request (python/sglang/srt/server_args.py, default
# 512) beyond its prompt and retracts requests that outgrow it (docs/engine.md).
RESERVED_DECODE_TOKENS = 512


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pools: tuple[PoolSpec, ...]
    prefill_policy: PrefillPolicy = "least_tokens"
    decode_policy: DecodePolicy = "least_committed_kv"
    first_token_from: FirstTokenFrom = "decode"  # disaggregated: who delivers token 1
    block_tokens: int = 16
    kv_admission: KvAdmission = "reserve_full"
    kv_watermark: float = 0.0  # share of a worker's blocks kept free when admitting
    preemption: Preemption = "recompute"
    backpressure: Backpressure = "none"
    # default caps (Requests.max_tokens_default): the reply tokens promised and committed
    reserved_decode_tokens: int = RESERVED_DECODE_TOKENS
    max_queue: int | None = None  # most requests waiting for prefill; more are rejected
    client_timeout_s: float | None = None  # abandon if no first token by then
    worker_failures: tuple[WorkerFailureEvent, ...] = ()
    link_windows: tuple[LinkWindow, ...] = ()
    swap_time: SwapTime = _default_swap_time
    topology: Topology | None = None  # shared links (else the transfer-time function)
    overlap: bool = False  # topology: stream KV layer by layer during the prefill
    num_layers: int = 1  # for the overlap's one-layer delay
    context_tokens: int | None = None  # prompt + max_tokens beyond it: exceeds_context
    autoscalers: tuple[Any, ...] = ()  # (role, disaggsim.autoscale.Autoscaler, cold start s)
    horizon_s: float = float("inf")  # stop here even if requests are still running
    prefix: PrefixSetup | None = None  # prefix caching (docs/prefix-caching.md)

    def __post_init__(self) -> None:
        _check("prefill_policy", self.prefill_policy, PrefillPolicy)
        _check("decode_policy", self.decode_policy, DecodePolicy)
        _check("first_token_from", self.first_token_from, FirstTokenFrom)
        _check("kv_admission", self.kv_admission, KvAdmission)
        _check("preemption", self.preemption, Preemption)
        _check("backpressure", self.backpressure, Backpressure)
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens: {self.block_tokens} (must be >= 1)")
        if self.reserved_decode_tokens < 1:
            raise ValueError(
                f"reserved_decode_tokens: {self.reserved_decode_tokens} (must be >= 1)"
            )
        if self.prefill_policy == "cache_aware" and self.prefix is None:
            raise ValueError("prefill_policy: cache_aware needs prefix caching (a cache: section)")

    @property
    def disaggregated(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)
