"""Serving-engine profiles: the CPU and launch time a forward pass costs beyond its kernels.

A serving engine's iteration takes its kernels' time plus time the GPU waits for the host:
scheduling, input preparation, sampling and detokenisation, the broadcast of the step's
inputs to the other TP ranks and, for engines that launch kernels one by one from Python,
a launch cost per layer. Kernels themselves are the hardware profile's business (timed
as replayed CUDA graphs); this module owns the rest. One iteration's overhead is::

    per_iteration_s + per_tp_rank_s × (tp − 1)
      + per_seq_s × sequences + per_token_s × tokens
      + num_layers × (per_layer_s + per_layer_tp_s × [tp > 1])

``sequences`` are the sequences that emit a token this iteration and ``tokens`` the tokens
it processes (prefill plus one per decoding sequence).

An eager engine launches its kernels one by one from Python, asynchronously: the GPU runs
a layer's kernels while the host launches the next ones, so per layer the iteration takes
the longer of the layer's kernels and their launches. ``launch_per_layer_s`` is that
launch time; the iteration's layers then take ``max(kernels of the layers, num_layers ×
launch_per_layer_s)`` (the LM head and the overhead above outside the max), and the host
time not hidden behind the kernels shows in the overhead part of a step's breakdown. It is
constant in the context, so a decode step is the longer of the kernels' lines and one
constant line: still at most two lines affine in the context (``docs/costmodel.md``,
"Launch-bound eager engines"). 0 (the default, and every CUDA-graph engine): no floor.

Host speed: the host terms above (every one, the launch floor included) are the host
time of the machines the profile was fitted on. Where another machine's host is measured
to run them at another speed, ``host_scale`` maps that GPU's catalog id (the machine it
sits in) to the factor its host time takes (``vllm-eager-2023``: fitted on DGX-A100 hosts,
scaled on the DGX-H100's from Splitwise's runs of the same engine there; absent: 1, the
fit's own host). The GPU's CUDA-graph replay gap is the GPU's, not the host's, and is not
scaled.

Decode attention over grouped-query layouts: a grouped kernel (FlashAttention's packed
GQA, TensorRT-LLM's XQA) reads each KV head once for all the query heads that share it.
An engine release whose grouped kernel covers only some group sizes
(``grouped_decode_q_per_kv``: the query heads per KV head it covers; absent: every layout)
runs the others on a per-query-head kernel (TensorRT-LLM's masked MHA), whose query heads
each read their KV head: the group's re-reads hit L2, so the kernel's KV stream becomes
the longer of the KV bytes from HBM and ``group × KV bytes`` at
``per_query_head_kv_bytes_per_s`` (``docs/costmodel.md``). Where the hardware profile
fits that per-query-head kernel on its own (``per_query_head_decode_backend``: TensorRT-LLM's
masked MHA, ``trtllm-mmha``, a decode-only backend), the engine's own decode kernel for
those layouts is that fit — work items per query head, its own re-read rate unless the
engine gives one — instead of the grouped kernel's fit. A worker with ``attention_backend:
auto`` runs its engine's own attention kernels, in prefill and decode alike: the kernel the
engine profile names (``attention_backend``: TensorRT-LLM's ``trtllm``) wherever the
hardware profile fits it, else the fitted kernels of the engine's framework
(:data:`ENGINE_FRAMEWORKS`: vLLM's ``vllm-flash``, SGLang's ``sglang-flash``), else the
profile's generic kernel; never another framework's kernel because its fit is faster. The overhead does not depend on the
context tokens (the launch floor is one line constant in it), so a decode step stays the
longer of at most two lines affine in the context (``docs/costmodel.md``).

GEMM kernels: an engine whose FP8 GEMM kernel the hardware profile fits on its own names it
(``fp8_gemm_kernel``: SGLang's ``sglang-fp8``, sgl-kernel's CUTLASS FP8 GEMM with its tile
dispatch table; vLLM's ``vllm-fp8``, its CUTLASS ``scaled_mm`` dispatch); its FP8 GEMMs then
run that fit wherever the hardware profile has it
(``HardwareProfile.gemm_kernels``), else the profile's ``ops.gemm.fp8``. ``null`` (absent in
an older file): ``ops.gemm.fp8``, the behaviour before the field existed.

Profiles ship in ``engines.json`` beside this module, fitted by ``calibration/engines.py``
to public end-to-end measurements (``calibration/engine_data/measurements.csv``). Names
(:data:`ENGINE_NAMES`): ``vllm`` (vLLM V1, CUDA-graph decode), ``sglang``, ``trtllm``
(TensorRT-LLM), ``vllm-eager-2023`` (vLLM of 2023, eager PyTorch). The older names
``cuda-graphs`` and ``eager`` are aliases of ``vllm`` and ``vllm-eager-2023``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from disaggsim.catalog import GPU_IDS
from disaggsim.hardware.profile import ATTENTION_CHOICES, DECODE_ONLY_BACKENDS, GEMM_KERNELS

ENGINE_NAMES = ("vllm", "sglang", "trtllm", "vllm-eager-2023")
# the framework whose kernels each engine runs (the one engine -> framework map of the
# package): ``attention_backend: auto`` takes only that framework's attention kernels
# (:data:`~disaggsim.hardware.profile.ATTENTION_BACKEND_FRAMEWORKS`), the MoE model its
# expert kernels (:data:`~disaggsim.costmodel.moe_params.ENGINE_EXPERT_KERNELS`); the
# kernel-only profile (:data:`ZERO_ENGINE`) names none
ENGINE_FRAMEWORKS = {
    "vllm": "vllm",
    "vllm-eager-2023": "vllm",
    "sglang": "sglang",
    "trtllm": "trtllm",
}
ENGINE_ALIASES = {"cuda-graphs": "vllm", "eager": "vllm-eager-2023"}
ENGINE_CHOICES = ENGINE_NAMES + tuple(ENGINE_ALIASES)
ENGINES_SCHEMA_VERSION = 1
PARAM_KEYS = (
    "per_iteration_s",
    "per_tp_rank_s",
    "per_seq_s",
    "per_token_s",
    "per_layer_s",
    "per_layer_tp_s",
)


class EngineProfileError(ValueError):
    """The engine-profile file is missing or malformed; the message names file and field."""


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Overhead parameters of one serving engine (seconds; see the module docstring)."""

    name: str
    per_iteration_s: float = 0.0
    per_tp_rank_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    per_layer_s: float = 0.0
    per_layer_tp_s: float = 0.0
    # host time launching one layer's kernels, overlapped with them (eager engines; 0: none)
    launch_per_layer_s: float = 0.0
    cuda_graphs: bool = True  # decode replays CUDA graphs (adds the GPU's graph_layer_s)
    attention_backend: str = "auto"  # the engine's own attention kernel, where a profile fits it
    # query heads per KV head the grouped decode kernel covers (None: every layout); the
    # others run per query head, re-reading the shared KV at per_query_head_kv_bytes_per_s
    grouped_decode_q_per_kv: tuple[int, ...] | None = None
    per_query_head_kv_bytes_per_s: float = 0.0
    # the engine's per-query-head decode kernel (a decode-only attention backend of the
    # hardware profile) for the layouts its grouped kernel does not take; None: none named
    per_query_head_decode_backend: str | None = None
    # the engine's FP8 GEMM kernel (a ``gemm_kernels`` fit of the hardware profile), used
    # where the profile fits it; None: the profile's ops.gemm.fp8
    fp8_gemm_kernel: str | None = None
    # (GPU id, factor) pairs: the host time of that GPU's machine over the fit's (module
    # docstring, "Host speed"); a GPU not listed: 1
    host_scale: tuple[tuple[str, float], ...] = ()
    description: str = ""
    fit_error: dict[str, Any] = field(default_factory=dict)

    def host_scale_for(self, gpu: str) -> float:
        """The factor of every host term on ``gpu``'s machine (1 where none is fitted)."""
        return dict(self.host_scale).get(gpu, 1.0)

    def fixed_s(self, tp: int, num_layers: int) -> float:
        """The part of one iteration's overhead that depends on neither batch nor tokens."""
        return (
            self.per_iteration_s
            + self.per_tp_rank_s * (tp - 1)
            + num_layers * (self.per_layer_s + (self.per_layer_tp_s if tp > 1 else 0.0))
        )

    def overhead_s(self, tp: int, num_layers: int, seqs: float, tokens: float) -> float:
        """Seconds of one iteration's overhead over ``seqs`` sequences and ``tokens`` tokens."""
        return self.fixed_s(tp, num_layers) + self.per_seq_s * seqs + self.per_token_s * tokens

    @property
    def framework(self) -> str | None:
        """The framework whose kernels this engine runs (:data:`ENGINE_FRAMEWORKS`); None
        for the kernel-only profile."""
        return ENGINE_FRAMEWORKS.get(self.name)

    def grouped_decode_covers(self, q_per_kv: int) -> bool:
        """Whether the engine's grouped decode kernel takes ``q_per_kv`` query heads per KV
        head (always, when the engine limits none)."""
        return self.grouped_decode_q_per_kv is None or q_per_kv in self.grouped_decode_q_per_kv

    def decode_reread_group(self, q_per_kv: int) -> int:
        """How many times a decode step reads each KV head: 1 when the engine's grouped
        kernel covers ``q_per_kv`` query heads per KV head (or the layout is not grouped),
        else ``q_per_kv`` (a per-query-head kernel: every query head reads its KV head)."""
        if q_per_kv <= 1 or self.grouped_decode_q_per_kv is None:
            return 1
        return 1 if q_per_kv in self.grouped_decode_q_per_kv else q_per_kv


ZERO_ENGINE = EngineProfile(name="none", description="no overhead (kernels only)")


def canonical_engine(name: str) -> str:
    """``name`` with the old aliases resolved; a one-line error for unknown names."""
    if name in ENGINE_ALIASES:
        return ENGINE_ALIASES[name]
    if name not in ENGINE_NAMES:
        raise EngineProfileError(
            f"unknown engine {name!r} (allowed: {', '.join(ENGINE_CHOICES)}; "
            f"{', '.join(f'{a} = {b}' for a, b in ENGINE_ALIASES.items())})"
        )
    return name


def shipped_engines_path() -> Path:
    return Path(str(resources.files("disaggsim.hardware") / "engines.json"))


def engines_from_dict(raw: Any, path: str = "<engines>") -> dict[str, EngineProfile]:
    """Validate a parsed engine-profile file: every error names the file and the field."""
    if not isinstance(raw, dict):
        raise EngineProfileError(f"{path}: expected a JSON object at top level")
    if raw.get("schema_version") != ENGINES_SCHEMA_VERSION:
        raise EngineProfileError(
            f"{path}: schema_version: expected {ENGINES_SCHEMA_VERSION}, "
            f"got {raw.get('schema_version')!r}"
        )
    engines = raw.get("engines")
    if not isinstance(engines, dict):
        raise EngineProfileError(f"{path}: engines: missing or not an object")
    out = {}
    for name, prm in engines.items():
        if name not in ENGINE_NAMES:
            raise EngineProfileError(
                f"{path}: engines.{name}: unknown engine (allowed: {', '.join(ENGINE_NAMES)})"
            )
        if not isinstance(prm, dict):
            raise EngineProfileError(f"{path}: engines.{name}: not an object")
        kw: dict[str, float] = {}
        for key in PARAM_KEYS:
            v = prm.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise EngineProfileError(
                    f"{path}: engines.{name}.{key}: expected a number >= 0, got {v!r}"
                )
            kw[key] = float(v)
        launch = prm.get("launch_per_layer_s", 0.0)
        if isinstance(launch, bool) or not isinstance(launch, (int, float)) or launch < 0:
            raise EngineProfileError(
                f"{path}: engines.{name}.launch_per_layer_s: expected a number >= 0, got {launch!r}"
            )
        extra = (
            "launch_per_layer_s",
            "cuda_graphs",
            "attention_backend",
            "grouped_decode_q_per_kv",
            "per_query_head_kv_bytes_per_s",
            "per_query_head_decode_backend",
            "fp8_gemm_kernel",
            "host_scale",
            "description",
            "fit_error",
        )
        unknown = sorted(set(prm) - set(PARAM_KEYS) - set(extra))
        if unknown:
            raise EngineProfileError(
                f"{path}: engines.{name}.{unknown[0]}: unknown key "
                f"(allowed: {', '.join((*PARAM_KEYS, *extra))})"
            )
        graphs = prm.get("cuda_graphs", True)
        if not isinstance(graphs, bool):
            raise EngineProfileError(
                f"{path}: engines.{name}.cuda_graphs: expected true or false, got {graphs!r}"
            )
        attn = prm.get("attention_backend", "auto")
        if attn not in ATTENTION_CHOICES:
            raise EngineProfileError(
                f"{path}: engines.{name}.attention_backend: {attn!r} "
                f"(allowed: {', '.join(ATTENTION_CHOICES)})"
            )
        grouped = prm.get("grouped_decode_q_per_kv")
        if grouped is not None and (
            not isinstance(grouped, list)
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grouped)
        ):
            raise EngineProfileError(
                f"{path}: engines.{name}.grouped_decode_q_per_kv: expected null or a list of "
                f"integers >= 1 (query heads per KV head), got {grouped!r}"
            )
        reread = prm.get("per_query_head_kv_bytes_per_s", 0.0)
        if isinstance(reread, bool) or not isinstance(reread, (int, float)) or reread < 0:
            raise EngineProfileError(
                f"{path}: engines.{name}.per_query_head_kv_bytes_per_s: expected a number "
                f">= 0, got {reread!r}"
            )
        fallback = prm.get("per_query_head_decode_backend")
        if fallback is not None and fallback not in DECODE_ONLY_BACKENDS:
            raise EngineProfileError(
                f"{path}: engines.{name}.per_query_head_decode_backend: {fallback!r} "
                f"(allowed: null, {', '.join(DECODE_ONLY_BACKENDS)})"
            )
        fp8_gemm = prm.get("fp8_gemm_kernel")
        fp8_kernels = [k for k, dt in GEMM_KERNELS.items() if dt == "fp8"]
        if fp8_gemm is not None and fp8_gemm not in fp8_kernels:
            raise EngineProfileError(
                f"{path}: engines.{name}.fp8_gemm_kernel: {fp8_gemm!r} "
                f"(allowed: null, {', '.join(fp8_kernels)})"
            )
        host = prm.get("host_scale") or {}
        if not isinstance(host, dict):
            raise EngineProfileError(
                f"{path}: engines.{name}.host_scale: expected an object of GPU id -> factor, "
                f"got {host!r}"
            )
        for gpu, v in host.items():
            if gpu not in GPU_IDS:
                raise EngineProfileError(
                    f"{path}: engines.{name}.host_scale.{gpu}: unknown GPU "
                    f"(allowed: {', '.join(GPU_IDS)})"
                )
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise EngineProfileError(
                    f"{path}: engines.{name}.host_scale.{gpu}: expected a number > 0, got {v!r}"
                )
        if grouped is not None and reread <= 0 and fallback is None:
            raise EngineProfileError(
                f"{path}: engines.{name}.per_query_head_kv_bytes_per_s: must be > 0 when "
                "grouped_decode_q_per_kv limits the grouped kernel and no "
                "per_query_head_decode_backend is named"
            )
        out[name] = EngineProfile(
            name=name,
            launch_per_layer_s=float(launch),
            cuda_graphs=graphs,
            attention_backend=attn,
            grouped_decode_q_per_kv=None if grouped is None else tuple(grouped),
            per_query_head_kv_bytes_per_s=float(reread),
            per_query_head_decode_backend=fallback,
            fp8_gemm_kernel=fp8_gemm,
            host_scale=tuple(sorted((str(g), float(v)) for g, v in host.items())),
            description=str(prm.get("description", "")),
            fit_error=dict(prm.get("fit_error") or {}),
            **kw,
        )
    missing = [n for n in ENGINE_NAMES if n not in out]
    if missing:
        raise EngineProfileError(f"{path}: engines.{missing[0]}: missing")
    return out


def load_engines(path: str | Path | None = None) -> dict[str, EngineProfile]:
    """The engine profiles in ``path`` (default: the shipped ``engines.json``)."""
    p = shipped_engines_path() if path is None else Path(path)
    if not p.is_file():
        raise EngineProfileError(f"{p}: engine-profile file not found")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise EngineProfileError(f"{p}: line {e.lineno}: not valid JSON ({e.msg})") from None
    return engines_from_dict(raw, str(p))


def get_engine(name: str, path: str | Path | None = None) -> EngineProfile:
    """The profile of engine ``name`` (aliases allowed)."""
    return load_engines(path)[canonical_engine(name)]


def resolve_engine(engine: str | EngineProfile) -> EngineProfile:
    """``engine`` as a profile: a name (aliases allowed) is looked up in the shipped file;
    an unknown name is a one-line :class:`~disaggsim.errors.UserError`."""
    from disaggsim.errors import UserError

    if isinstance(engine, EngineProfile):
        return engine
    try:
        return get_engine(engine)
    except EngineProfileError as e:
        raise UserError(str(e)) from None
