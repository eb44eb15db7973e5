"""The scenario's ``autoscale:`` section: pydantic models validated at the config edge.

One optional section per pool role (``prefill``, ``decode``, ``colocated``), each with
the worker bounds, the control interval, the policy (``target`` or ``slo``) and its
settings, the HPA-style behaviour (stabilisation windows, step limits) shared by both
policies, and the cold-start numbers. ``docs/autoscaling.md`` has the semantics.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from disaggsim.config.bounds import MAX_WORKERS_PER_POOL, ConfigModel

Role = Literal["prefill", "decode", "colocated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "colocated")

Signal = Literal[
    "queue_depth", "queued_prompt_tokens", "batch_occupancy", "kv_util", "ttft_p99", "itl_p99"
]
"""What a ``target`` policy holds at ``target_value``; ``docs/autoscaling.md`` defines
each (per-worker averages for the first four, seconds for the two latencies)."""

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class TargetSettings(ConfigModel):
    """Kubernetes HPA: ``desired = ceil(in_service × signal / target_value)``, unchanged
    while ``|signal / target_value − 1| <= tolerance``."""

    signal: Signal
    target_value: PositiveFloat
    """In the signal's unit: requests or tokens per worker, a share (0..1] for
    ``batch_occupancy``/``kv_util``, seconds for ``ttft_p99``/``itl_p99``."""
    tolerance: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.1


class SloSettings(ConfigModel):
    """Predict TTFT/ITL p99 from the queue, the batch and the cost model, and keep the
    predictions under ``margin × SLO`` (the scenario's ``slo.ttft_ms`` / ``slo.itl_ms``)."""

    margin: Share = 0.8
    max_utilization: Share = 0.8
    """Prefill: arriving prompt tokens per second at most this share of the pool's
    prefill capacity (keeps a queue from building, so the pool can scale down)."""
    max_kv_util: Share = 0.9
    """Decode: KV tokens held (running + waiting) at most this share of the pool's KV."""


class PoolAutoscaleConfig(ConfigModel):
    """Autoscaling of one pool."""

    min_workers: int = Field(ge=1, le=MAX_WORKERS_PER_POOL)
    """At least 1: an empty pool produces no signal to scale up on (no scale to zero)."""
    max_workers: int = Field(ge=1, le=MAX_WORKERS_PER_POOL)
    interval_s: PositiveFloat = 15.0
    """Control period: ``decide`` runs at 0, interval_s, 2 interval_s, ..."""
    policy: Literal["target", "slo"]
    target: TargetSettings | None = None
    """Required for ``policy: target``; ignored by ``slo`` (so a sweep may flip policy)."""
    slo: SloSettings = SloSettings()
    scale_up_stabilization_s: NonNegativeFloat = 0.0
    """Scale up to the smallest recommendation of this trailing window (HPA default 0)."""
    scale_down_stabilization_s: NonNegativeFloat = 300.0
    """Scale down to the largest recommendation of this trailing window (HPA default 300)."""
    max_step_up: int | None = Field(default=None, ge=1, le=MAX_WORKERS_PER_POOL)
    """Most workers added by one decision (default: no limit)."""
    max_step_down: int | None = Field(default=None, ge=1, le=MAX_WORKERS_PER_POOL)
    """Most workers drained by one decision (default: no limit)."""
    provision_s: NonNegativeFloat = 30.0
    """Cold start: seconds from the decision until the weights start loading."""
    weights_load_gb_per_s: PositiveFloat = 5.0
    """Cold start: weight loading bandwidth per GPU, GB/s (GB = 1e9 bytes)."""

    @model_validator(mode="after")
    def _check(self) -> PoolAutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) must be <= max_workers ({self.max_workers})"
            )
        if self.policy == "target" and self.target is None:
            raise ValueError("policy target needs a target section (signal, target_value)")
        return self

    @property
    def weights_load_bytes_per_s(self) -> float:
        return self.weights_load_gb_per_s * 1e9


class AutoscaleConfig(ConfigModel):
    """The ``autoscale:`` section: a pool without an entry keeps its ``num_workers``."""

    prefill: PoolAutoscaleConfig | None = None
    decode: PoolAutoscaleConfig | None = None
    colocated: PoolAutoscaleConfig | None = None

    def for_role(self, role: Role) -> PoolAutoscaleConfig | None:
        return getattr(self, role)


def check_against_pools(
    autoscale: AutoscaleConfig, architecture: str, num_workers: dict[str, int]
) -> None:
    """Cross-checks with the rest of the scenario, for its model validator.

    Parameters
    ----------
    architecture : ``disaggregated`` or ``colocated``.
    num_workers : initial workers by role (``{"prefill": 2, "decode": 4}`` or
        ``{"colocated": 4}``).

    Raises
    ------
    ValueError
        One line naming the field: a section for a pool the architecture does not have,
        or an initial ``num_workers`` outside ``[min_workers, max_workers]``.
    """
    for role in ROLES:
        cfg = autoscale.for_role(role)
        if cfg is None:
            continue
        if role not in num_workers:
            raise ValueError(
                f"autoscale.{role}: architecture {architecture} has no {role} pool "
                f"(its pools: {', '.join(num_workers)})"
            )
        n = num_workers[role]
        if not cfg.min_workers <= n <= cfg.max_workers:
            key = "pool" if role == "colocated" else f"{role}_pool"
            raise ValueError(
                f"{key}.num_workers ({n}) must lie in autoscale.{role} "
                f"[min_workers, max_workers] = [{cfg.min_workers}, {cfg.max_workers}]"
            )
