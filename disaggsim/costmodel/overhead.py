"""A serving engine's time in one iteration beyond the kernels: one set of rules for the
dense (:mod:`disaggsim.costmodel.step`) and the MoE (:mod:`disaggsim.costmodel.moe`)
cost models. The engine profile (:mod:`disaggsim.hardware.engines`) gives the numbers.

- Host time: ``fixed_s + per_seq_s × sequences + per_token_s × tokens``, where
  ``fixed_s`` is the engine's per-iteration, per-TP-rank and per-layer time
  (:meth:`EngineProfile.fixed_s`) plus, for an engine that replays CUDA graphs, the GPU's
  ``graph_replay.per_layer_s`` per layer; ``sequences`` emit a token this iteration and
  ``tokens`` are the tokens it processes (for an MoE worker: its busiest DP rank's).
- Launches (an eager engine, ``launch_per_layer_s`` > 0): the host launches each layer's
  kernels from Python while the GPU runs the ones before, so the layers take the longer
  of their kernels and their launches, :func:`unhidden_launches_s` of which shows as
  overhead. ``launch_per_layer_s`` is the launch time of one dense layer's kernels as
  the dense model costs them (:func:`dense_layer_launches`), so a dense model's layers
  launch in ``num_layers × launch_per_layer_s`` (the rule the engine profile was fitted
  with), and a layer of another structure at the same rate per kernel:
  ``launch_per_layer_s × its kernels / dense_layer_launches`` (an MoE layer's router,
  expert GEMMs and all-to-all count, :meth:`MoeWorkerCost.launches_per_iteration`).
"""

from __future__ import annotations

from dataclasses import dataclass

from disaggsim.hardware.engines import EngineProfile
from disaggsim.hardware.profile import HardwareProfile

__all__ = [
    "DENSE_LAYER_GEMMS",
    "ELEMENTWISE_KERNELS_PER_LAYER",
    "StepOverhead",
    "dense_layer_launches",
    "step_overhead",
    "unhidden_launches_s",
]

# a dense layer's GEMMs: QKV, O, MLP up (+gate), down
DENSE_LAYER_GEMMS = 4
# launches per dense layer in step.py's ew_layer: two norms, rope, KV write, activation,
# two residual adds
ELEMENTWISE_KERNELS_PER_LAYER = 7


def dense_layer_launches(tp: int, attention_kernels: int) -> int:
    """Kernels one 16-bit dense layer launches as :mod:`disaggsim.costmodel.step` costs
    them: its four GEMMs, ``attention_kernels`` attention kernels (one in a decode or a
    prefill iteration, two in a mixed one), seven element-wise kernels and, with
    ``tp`` > 1, two all-reduces. What an eager engine's ``launch_per_layer_s`` launches
    (``vllm-eager-2023`` was fitted to dense OPT-13B and OPT-66B at TP 1-4 and checked on
    Llama-2-70B at TP 2-8: 12 kernels a layer at TP 1, 14 above, one launch time each)."""
    return (
        DENSE_LAYER_GEMMS + attention_kernels + ELEMENTWISE_KERNELS_PER_LAYER + (2 if tp > 1 else 0)
    )


@dataclass(frozen=True, slots=True)
class StepOverhead:
    """One worker's engine overhead parameters (seconds; module docstring)."""

    fixed_s: float
    per_seq_s: float
    per_token_s: float
    launch_per_layer_s: float

    def host_s(self, seqs: float, tokens: float) -> float:
        """Host time of an iteration over ``seqs`` sequences and ``tokens`` tokens."""
        return self.fixed_s + self.per_seq_s * seqs + self.per_token_s * tokens


def step_overhead(
    engine: EngineProfile, profile: HardwareProfile, tp: int, num_layers: int
) -> StepOverhead:
    """The overhead of a worker of ``num_layers`` layers at attention TP ``tp``: the
    engine's host terms at the speed of ``profile``'s GPU's host (``host_scale``), plus
    the GPU's own graph-replay gap."""
    graph_s = profile.graph_layer_s * num_layers if engine.cuda_graphs else 0.0
    host = engine.host_scale_for(profile.gpu)
    return StepOverhead(
        fixed_s=host * engine.fixed_s(tp, num_layers) + graph_s,
        per_seq_s=host * engine.per_seq_s,
        per_token_s=host * engine.per_token_s,
        launch_per_layer_s=host * engine.launch_per_layer_s,
    )


def unhidden_launches_s(launches_s: float, kernels_s: float) -> float:
    """The launches' time the layers' kernels do not hide (the layers take the longer of
    the two)."""
    return max(launches_s - kernels_s, 0.0)
