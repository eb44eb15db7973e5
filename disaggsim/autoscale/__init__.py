"""Autoscaling: the ``autoscale:`` config, the per-pool controller, cold start and the
pure helpers behind the scaling summary keys. No simpy: the engine calls in."""

from disaggsim.autoscale.config import (
    AutoscaleConfig,
    PoolAutoscaleConfig,
    SloSettings,
    TargetSettings,
    check_against_pools,
)
from disaggsim.autoscale.inputs import cold_start_s, decode_step_fn, prefill_tokens_per_s
from disaggsim.autoscale.policy import Autoscaler, Decision, PoolSignals, signal_value
from disaggsim.autoscale.summary import choose_to_drain, gpu_hours, time_average

__all__ = [
    "AutoscaleConfig",
    "Autoscaler",
    "Decision",
    "PoolAutoscaleConfig",
    "PoolSignals",
    "SloSettings",
    "TargetSettings",
    "check_against_pools",
    "choose_to_drain",
    "cold_start_s",
    "decode_step_fn",
    "gpu_hours",
    "prefill_tokens_per_s",
    "signal_value",
    "time_average",
]
