"""The memory a serving engine holds on each GPU besides weights and KV cache.

A worker's KV capacity is what its share of device memory leaves after the weights and
this reserve (``HBM × gpu_mem_util − weights − reserve``, per GPU). Engines size their KV
pool the same way from a start-up memory profile, and what they hold besides the weights
depends on the engine, the model's shape, the TP degree and the batch limits the engine was
started with. Per GPU::

    reserve = base + comm × [tp > 1]
              + max(forward × T × (2 × hidden + 3 × ffn / tp) × 2 bytes,
                    logits × S × vocab)

- ``base``: the CUDA context, library workspaces and other memory outside PyTorch's
  allocator that the engine counts at TP 1 (vLLM's ``non_torch_memory`` at TP 1);
- ``comm``: what a TP group adds on every GPU — NCCL and custom all-reduce buffers
  (vLLM 0.19 on an H100: ``non_torch_memory`` 0.24-0.46 GiB at TP 1, 2.06-2.21 GiB at
  TP 2-4; one PCIe L40S log of an older vLLM shows 0.30 GiB at TP 2, so over PCIe this
  term overstates: docs/calibration.md);
- the activation peak: the larger of one forward pass over the iteration's token budget
  ``T`` (``max_batch_tokens``: the residual stream and its norm, ``2 × hidden``, and the
  fused gate-up output and the activated MLP intermediate, ``3 × ffn / tp``, 16-bit,
  times ``forward`` for what the engine's allocator holds besides) and the sampler's
  logits for the batch limit ``S`` (``max_batch_seqs``) over the whole vocabulary
  (``logits`` bytes per sequence and vocabulary entry: float32 logits and the sampler's
  copies). vLLM profiles both in one run and reports one peak; its peak is the same at
  TP 1, 2 and 4 for Llama-3.1-8B and Qwen2.5-7B (1.89 and 2.21 GiB), which the sampler's
  full-vocabulary logits explain and an MLP intermediate sharded by TP does not.

The parameters per engine framework (:data:`ENGINE_MEMORY`) are fitted by
``python -m calibration.engine_memory`` on the engines' own start-up logs
(``calibration/engine_data/engine_memory.csv``, provenance beside it), with rows held out;
``docs/calibration.md`` ("The engine memory reserve") has the fit and its errors.

- vLLM (``vllm``, ``vllm-eager-2023``): sizes the KV cache from ``gpu_memory_utilization
  × total − weights − activation peak − non-torch``; CUDA graphs are captured afterwards,
  out of the memory above ``gpu_memory_utilization``, and are not part of the reserve.
- SGLang: its activations and CUDA graphs live outside ``--mem-fraction-static`` (which
  ``gpu_mem_util`` stands for), so its reserve is only what distributed initialisation
  holds (1.96 GiB per GPU at TP 8, 0 at TP 1 in its logs) plus the CUDA context, taken
  from vLLM's TP 1 figure (SGLang's logs do not show it).
- TensorRT-LLM: its execution context (the engine's activation memory, sized at build
  time by ``max_num_tokens``) from its ``[MemUsageChange]`` log lines; the context,
  cuBLAS and NCCL memory from NVIDIA AIConfigurator's system specs. Its decoder and
  runtime buffers (sized by ``max_batch_size`` × ``max_seq_len``) are not in the reserve:
  no public log separates their terms (``docs/calibration.md``).

``activation_reserve_bytes`` given to a cost model (a scenario's
``activation_reserve_gib``) replaces all of this with one number per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from disaggsim.catalog import ModelSpec
from disaggsim.hardware.engines import EngineProfile
from disaggsim.units import GiB

__all__ = [
    "DEFAULT_BATCH_SEQS",
    "DEFAULT_BATCH_TOKENS",
    "ENGINE_MEMORY",
    "EngineMemory",
    "engine_memory",
    "runtime_reserve_bytes",
]

# a pool's batch limits when a cost model is built without them (the scenario's defaults,
# disaggsim.config.scenario.PoolConfig; tests/test_reserve.py checks they agree)
DEFAULT_BATCH_TOKENS = 8192
DEFAULT_BATCH_SEQS = 256
_ACT_BYTES = 2.0  # the forward pass's activations are 16-bit


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """One engine framework's memory-reserve parameters (the module docstring's form)."""

    framework: str
    base_bytes: float  # per GPU, every TP
    comm_bytes: float  # per GPU, added when tp > 1
    forward: float  # bytes held per 16-bit forward element (dimensionless multiple)
    logits_bytes: float  # per sequence of the batch limit and vocabulary entry

    def activation_bytes(
        self, model: ModelSpec, tp: int, max_batch_tokens: int, max_batch_seqs: int
    ) -> float:
        """The activation peak per GPU: the larger of the forward pass over
        ``max_batch_tokens`` tokens and the sampler's logits for ``max_batch_seqs``."""
        per_token = 2.0 * model.hidden + 3.0 * model.ffn / tp
        forward = self.forward * max_batch_tokens * per_token * _ACT_BYTES
        logits = self.logits_bytes * max_batch_seqs * model.vocab
        return max(forward, logits)

    def reserve_bytes(
        self, model: ModelSpec, tp: int, max_batch_tokens: int, max_batch_seqs: int
    ) -> float:
        """Bytes per GPU the engine holds besides weights and KV cache."""
        comm = self.comm_bytes if tp > 1 else 0.0
        act = self.activation_bytes(model, tp, max_batch_tokens, max_batch_seqs)
        return self.base_bytes + comm + act


# Fitted by ``python -m calibration.engine_memory`` (tests/test_reserve.py checks these
# are its output, rounded as written here).
ENGINE_MEMORY: dict[str, EngineMemory] = {
    "vllm": EngineMemory(
        framework="vllm",
        base_bytes=0.3183 * GiB,
        comm_bytes=1.7817 * GiB,
        forward=1.21,
        logits_bytes=15.40,
    ),
    "sglang": EngineMemory(
        framework="sglang",
        base_bytes=0.3183 * GiB,
        comm_bytes=1.9600 * GiB,
        forward=0.0,
        logits_bytes=0.0,
    ),
    "trtllm": EngineMemory(
        framework="trtllm",
        base_bytes=0.5130 * GiB,
        comm_bytes=0.3830 * GiB,
        forward=3.02,
        logits_bytes=0.0,
    ),
}


def engine_memory(engine: EngineProfile) -> EngineMemory:
    """The memory parameters of ``engine``'s framework; an engine of no framework (the
    kernel-only profile calibration uses for step times) takes vLLM's."""
    return ENGINE_MEMORY[engine.framework or "vllm"]


def runtime_reserve_bytes(
    model: ModelSpec,
    tp: int,
    engine: EngineProfile,
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
    max_batch_seqs: int = DEFAULT_BATCH_SEQS,
) -> float:
    """Bytes per GPU ``engine`` holds besides weights and KV cache for ``model`` at TP
    ``tp`` with the given batch limits per engine instance (per DP rank)."""
    return engine_memory(engine).reserve_bytes(model, tp, max_batch_tokens, max_batch_seqs)
