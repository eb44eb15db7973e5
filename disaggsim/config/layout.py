"""The MoE serving options of a pool (``moe:`` in a pool of the scenario YAML).

The parallel layout itself is three pool keys, ``tp`` (attention TP per data-parallel
rank), ``dp`` (attention data-parallel ranks; a worker has ``tp × dp`` GPUs) and ``ep``
(expert parallelism); this section holds the rest. Checked against the model when the
pool's cost model is built (:func:`disaggsim.costmodel.moe.build_cost`): an MoE option on
a dense model, or an ``ep`` that does not divide the GPUs or the experts, is a one-line
error naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from disaggsim.config.bounds import MAX_GPUS, ConfigModel


class MoeOptions(ConfigModel):
    redundant_experts: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GPUS,
        description="EPLB: extra expert slots placed by load (DeepSeek: 32); default no EPLB",
    )
    routing: Literal["balanced", "power_law"] = Field(
        default="balanced", description="token spread over experts (as AIConfigurator's tables)"
    )
    power_law_alpha: float = Field(default=1.01, gt=0.0)
    imbalance_factor: float = Field(
        default=1.0, ge=1.0, description="busiest EP rank's load over the mean, on top of routing"
    )
    all_to_all: Literal["auto", "normal", "low_latency"] = Field(
        default="auto", description="DeepEP mode; auto: low_latency for decode-only iterations"
    )
    two_batch_overlap: bool = Field(
        default=False, description="two micro-batches: one's all-to-all under the other's compute"
    )
    mla_prefill: Literal["absorbed", "naive"] = "absorbed"
