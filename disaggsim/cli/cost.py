"""``disaggsim cost``: one step's or one operator's time as JSON.

Owns the cost-query commands::

    disaggsim cost prefill --model M --gpu G --tp N --batch B --prompt-tokens P
    disaggsim cost decode  --model M --gpu G --tp N --batch B --context-tokens C
        MoE / MLA models also take the worker's layout, --dp N (attention data-parallel
        ranks), --ep N (expert parallelism), --gpus N (per worker, = tp x dp), and the
        MoE options --redundant-experts, --routing, --power-law-alpha,
        --imbalance-factor, --all-to-all, --two-batch-overlap, --mla-prefill; --batch then
        counts sequences over the whole worker. --gpus-per-node N: the cluster's node
        (NVLink domain) size, as a topology fabric's gpus_per_node (default: the
        catalog's); it decides whether a TP group's all-reduce stays in one node
    disaggsim cost kv      --model M --tokens T [--kv-dtype fp8] [--link pcie] [--gpu G]
                           [--prefill-s S] [--overlap] [--path same-node|cross-node-rdma|
                           cross-node-staged] [--tp N] [--host-staging pageable]
                           [--nic-gbit-per-s R]
    disaggsim cost op gemm --gpu G --m M --n N --k K [--dtype bf16|fp8]
    disaggsim cost op decode-attention  --gpu G --batch B --context-tokens C --heads H
                                        --kv-heads KH --head-dim D [--kv-dtype]
    disaggsim cost op prefill-attention --gpu G --batch B --prompt-tokens P --heads H
                                        --kv-heads KH --head-dim D

Each prints one JSON object. With ``--input FILE.csv`` (one query per row, columns named
like the flags without dashes, hyphens as underscores) it prints one JSON object per line
in row order; flags given on the command line fill columns the file lacks. Token counts
are per sequence (``--prompt-tokens``, ``--context-tokens``); times are seconds, sizes
bytes, bandwidths bytes/s.

``cost kv`` without ``--path`` uses one link class (``size/bw + latency``); with
``--path`` it places a prefill and a decode worker of ``--tp`` GPUs each (in one node, or
on two nodes with or without GPUDirect RDMA) and moves the KV through the fabric model
(docs/fabric.md), reporting the path's links, hops and shards. ``exposed_s`` is the part
of the transfer after a prefill of ``--prefill-s`` seconds ends (streamed layer by layer
with ``--overlap``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from disaggsim.catalog import GPU_IDS, MODEL_IDS, dtype_bytes, get_gpu, get_model, id_hint
from disaggsim.config.bounds import (
    MAX_BATCH_SEQS,
    MAX_DP,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_NUMBER,
    MAX_TOKENS,
    MAX_TP,
)
from disaggsim.config.loader import closest_hint
from disaggsim.costmodel import ops
from disaggsim.costmodel.kv import LINK_CLASSES, kv_transfer
from disaggsim.costmodel.mla import MLA_PREFILL_FORMS
from disaggsim.costmodel.moe import (
    A2A_CHOICES,
    ROUTINGS,
    WEIGHT_FORMATS,
    MoeWorkerCost,
    build_cost,
)
from disaggsim.costmodel.step import KV_DTYPES
from disaggsim.errors import UserError
from disaggsim.fabric import exposed_time_s
from disaggsim.fabric.estimate import PAIR_PATHS, estimate_handoff, pair_topology
from disaggsim.hardware.engines import ENGINE_CHOICES
from disaggsim.hardware.profile import (
    ATTENTION_CHOICES,
    HardwareProfile,
    ProfileError,
    load_profile,
)

__all__ = ["add_parser", "run_queries"]


@dataclass(frozen=True, slots=True)
class Field:
    """One query input: a flag ``--name-with-hyphens`` and a CSV column ``name``."""

    name: str
    kind: str  # "int" (>= minimum), "float" (>= minimum), "bool", "str", or "choice"
    help: str
    required: bool = True
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float = 1
    maximum: float = MAX_TOKENS  # ints: a token count, a shape or a batch (docs/safety.md)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _int(name: str, help: str, minimum: int = 1, maximum: int = MAX_TOKENS) -> Field:
    return Field(name, "int", help, minimum=minimum, maximum=maximum)


def _float(name: str, help: str, minimum: float = 0.0) -> Field:
    # the scenario loader's bound on any real number (a ratio of 1e300 gave time_s inf)
    return Field(name, "float", help, required=False, minimum=minimum, maximum=MAX_NUMBER)


def _choice(name: str, choices: tuple[str, ...], help: str, default: str | None = None) -> Field:
    return Field(name, "choice", help, default is None, default, choices)


MODEL = _choice("model", MODEL_IDS, "model id")
GPU = _choice("gpu", GPU_IDS, "GPU id")
TP = Field(
    "tp",
    "int",
    "tensor-parallel degree (GPUs per worker; per DP rank with --dp)",
    False,
    maximum=MAX_TP,
)
BATCH = _int("batch", "sequences in the batch (over the whole worker)", maximum=MAX_BATCH_SEQS)
PROMPT_TOKENS = _int(
    "prompt_tokens", "prompt tokens of each sequence (per sequence, not the batch's)"
)
CONTEXT_TOKENS = _int(
    "context_tokens",
    "cached tokens per sequence, not the batch's total (that is batch x this; the "
    "output's per_context_token_s and knee_context_tokens count the total)",
    0,
)
LAYOUT = (
    Field(
        "dp", "int", "attention data-parallel ranks per worker (MoE models)", False, maximum=MAX_DP
    ),
    Field(
        "ep",
        "int",
        "expert-parallel degree, GPUs (default: all GPUs when dp > 1, else 1)",
        False,
        maximum=MAX_TP * MAX_DP,
    ),
    Field("gpus", "int", "GPUs per worker (= tp x dp)", False, maximum=MAX_TP * MAX_DP),
    Field(
        "gpus_per_node",
        "int",
        "GPUs per node (NVLink domain), as a topology fabric's gpus_per_node; decides "
        "in-node vs hierarchical all-reduce and an MoE unit's nodes (default: the catalog's)",
        False,
        maximum=MAX_GPUS_PER_NODE,
    ),
)
# MoE options: passed to the cost model only when given (a dense model refuses them)
MOE_OPTS = (
    Field(
        "redundant_experts",
        "int",
        "EPLB redundant expert slots (a count)",
        False,
        minimum=0,
        maximum=MAX_GPUS,  # as a scenario's moe.redundant_experts
    ),
    Field("routing", "choice", "token spread over experts", False, None, ROUTINGS),
    _float("power_law_alpha", "power-law exponent with --routing power_law (no unit)", 1e-9),
    _float("imbalance_factor", "busiest EP rank's load over the mean (a ratio, >= 1)", 1.0),
    Field("all_to_all", "choice", "DeepEP mode", False, None, A2A_CHOICES),
    Field("two_batch_overlap", "bool", "overlap all-to-all with compute", False),
    Field("mla_prefill", "choice", "MLA prefill form", False, None, MLA_PREFILL_FORMS),
)
WORKER_OPTS = (
    _choice("weight_dtype", WEIGHT_FORMATS, "weight dtype", "bf16"),
    _choice("kv_dtype", KV_DTYPES, "KV-cache dtype", "bf16"),
    _choice("engine", ENGINE_CHOICES, "serving-engine profile (overheads)", "vllm"),
    _choice("attention_backend", ATTENTION_CHOICES, "attention kernel", "auto"),
)
WORKER_KEYS = ("model", "gpu", "tp", "weight_dtype", "kv_dtype", "engine", "attention_backend")
PROFILE = Field("profile", "str", "hardware profile JSON (default: the shipped one)", False)
SHAPE = (
    _int("heads", "query heads (on this GPU, a count)"),
    _int("kv_heads", "KV heads (on this GPU, a count)"),
    _int("head_dim", "head dimension (elements per head)"),
)


def _profile(values: dict[str, Any], gpu_id: str, cache: dict) -> HardwareProfile:
    key = ("profile", values.get("profile"), gpu_id)
    if key not in cache:
        path = values.get("profile")
        # a profile file is checked against --gpu: one fitted on another GPU was used
        # with this GPU's catalog figures, silently
        cache[key] = load_profile(gpu_id, path=path)
    return cache[key]


def _layout(v: dict[str, Any]) -> tuple[int, int]:
    """``(tp, dp)`` from ``--tp``, ``--dp`` and ``--gpus`` (gpus = tp × dp)."""
    tp, dp, gpus = v.get("tp"), v.get("dp"), v.get("gpus")
    if gpus is None:
        if tp is None:
            raise UserError("missing --tp (or --gpus)")
        return tp, dp or 1
    if tp is None and dp is None:
        return gpus, 1
    if tp is None:
        assert dp is not None
        tp, rest = divmod(gpus, dp)
        if rest:
            raise UserError(f"--gpus: {gpus} is not a multiple of --dp {dp}")
        return tp, dp
    dp_of = dp or gpus // tp
    if tp * dp_of != gpus:
        raise UserError(
            f"--gpus: {gpus} GPUs per worker must equal tp x dp (--tp {tp}"
            + (f" x --dp {dp}" if dp else "")
            + f"; allowed: {tp * (dp or max(gpus // tp, 1))})"
        )
    return tp, dp_of


def _worker(values: dict[str, Any], cache: dict) -> Any:
    tp, dp = _layout(values)
    values["tp"], values["dp"] = tp, dp
    moe = {f.name: values[f.name] for f in MOE_OPTS if values.get(f.name) is not None}
    key = tuple(
        values[k]
        for k in ("model", "gpu", "weight_dtype", "kv_dtype", "engine", "attention_backend")
    )
    key += (tp, dp, values.get("ep"), tuple(sorted(moe.items())), values.get("profile"))
    key += (values.get("gpus_per_node"),)
    if key not in cache:
        cache[key] = build_cost(
            values["model"],
            values["gpu"],
            tp,
            dp=dp,
            ep=values.get("ep"),
            moe=moe,
            weight_dtype=values["weight_dtype"],
            kv_dtype=values["kv_dtype"],
            engine=values["engine"],
            profile=_profile(values, values["gpu"], cache),
            attention_backend=values["attention_backend"],
            gpus_per_node=values.get("gpus_per_node"),
        )
    return cache[key]


def _worker_inputs(v: dict[str, Any], cost: Any) -> dict[str, Any]:
    out = {k: v[k] for k in WORKER_KEYS}
    if not isinstance(cost, MoeWorkerCost):
        out["attention_kernels"] = {"decode": cost.decode_backend, "prefill": cost.prefill_backend}
        # the engine's own GEMM kernel where the profile fits it (e.g. sglang-fp8), else "generic"
        out["gemm_kernel"] = cost.gemm_kernel
    out["profile_kind"] = cost.profile.provenance.get("kind")
    if isinstance(cost, MoeWorkerCost):
        lo = cost.layout
        out.update(dp=lo.dp, ep=lo.ep, gpus=lo.gpus, moe_tp=lo.moe_tp)
        out["layout"] = {
            "nodes": cost.nodes,
            "local_experts": cost.local_experts,
            "redundant_experts": lo.redundant_experts,
            "routing": lo.routing,
            "imbalance_factor": lo.imbalance_factor,
            "all_to_all": cost.uses_all_to_all and lo.all_to_all,
            "two_batch_overlap": lo.two_batch_overlap,
            "weight_format": cost.weight_format,
            "moe_params_kind": cost.params.provenance.get("kind"),
            "moe_params_from": cost.params.transferred_from or cost.gpu.id,
        }
    else:
        out["tp_layout"] = cost.tp_layout.as_dict()  # in one node, or hierarchical
    return out


def _moe_parts(cost: Any, bd: Any) -> dict[str, Any]:
    """The MoE, MLA and all-to-all parts of a breakdown (MoE workers only)."""
    if not isinstance(cost, MoeWorkerCost):
        return {}
    out: dict[str, Any] = {
        "moe_s": bd.router_s + bd.shared_expert_s + bd.expert_gemm_s,
        "all_to_all_s": bd.dispatch_s + bd.combine_s + bd.overlap_s,
        "weights_bytes_per_gpu_by_part": cost.weights_breakdown_bytes_per_gpu(),
        "kv_capacity_tokens_per_rank": cost.kv_capacity_tokens_per_rank,
    }
    if cost.model.mla is not None:
        out["mla_s"] = bd.attention_gemm_s + bd.attention_s
    return out


def _prefill(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    cost = _worker(v, cache)
    b, p = v["batch"], v["prompt_tokens"]
    new_tokens = b * p
    pairs = b * p * (p + 1) / 2  # causal query-key pairs of b whole prompts
    bd = cost.breakdown(prefill_seqs=b, prefill_tokens=new_tokens, prefill_attn_pairs=pairs)
    return {
        "command": "prefill",
        **_worker_inputs(v, cost),
        "batch": b,
        "prompt_tokens": p,
        "time_s": cost.prefill_time_s(b, new_tokens, pairs),
        "breakdown": bd.as_dict(),
        **_moe_parts(cost, bd),
        "tokens_per_s": new_tokens / bd.total_s,
    }


def _decode(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    cost = _worker(v, cache)
    b, c = v["batch"], v["context_tokens"]
    bd = cost.breakdown(decode_batch=b, decode_context_tokens=b * c)
    base_s, per_token_s = cost.decode_coeffs(b)
    return {
        "command": "decode",
        **_worker_inputs(v, cost),
        "batch": b,
        "context_tokens": c,
        "time_s": cost.decode_time_s(b, b * c),
        "breakdown": bd.as_dict(),
        **_moe_parts(cost, bd),
        "base_s": base_s,
        "per_context_token_s": per_token_s,
        **_item_line(cost, b),
        **_min_lines(cost, b),
        "kv_capacity_tokens": cost.kv_capacity_tokens,
        "kv_tokens_used": b * c,
        "weights_bytes_per_gpu": cost.weights_bytes_per_gpu,
    }


def _item_line(cost: Any, b: int) -> dict[str, Any]:
    """A worker's second decode line and knee (docs/costmodel.md): the item-bound line,
    which for an engine with a launch floor (``launch_per_layer_s``, e.g.
    ``vllm-eager-2023``) is the longer of the item work and the launches. Dense workers
    always have it; MoE workers only under a launch floor (with CUDA graphs their decode
    is one line, and the output has no ``item_bound_*`` fields)."""
    if not hasattr(cost, "decode_item_coeffs"):
        return {}
    item_base_s, item_per_token_s = cost.decode_item_coeffs(b)
    return {
        "item_bound_base_s": item_base_s,
        "item_bound_per_context_token_s": item_per_token_s,
        "knee_context_tokens": cost.decode_knee_tokens(b),
    }


def _min_lines(cost: Any, b: int) -> dict[str, Any]:
    """How ``time_s`` is made of the printed lines (``step_form``; each line ``base +
    per_context_token × C`` with C = batch × context_tokens), and a multi-block wave decode
    kernel's other lines (``min_lines``: TensorRT-LLM's XQA, or its masked MHA where the
    profile fits it as one; one per split count its rule takes; ``base_s`` /
    ``per_context_token_s`` is then its most-split line only): the
    step is the smallest of the kernel lines, or the item-bound line where that is larger
    (``interface.decode_step_time_s``). A kernel whose stream line changes with the tokens
    per sequence (TensorRT-LLM's masked MHA: its resident blocks per SM) also lists
    ``interval_lines``: from ``from_context_tokens`` (C, all sequences of equal length) on,
    the stream line is that one (``base_s`` / ``per_context_token_s``: the line below the
    first); the kernel sizes it by the batch's longest sequence, so ``longest_lines`` gives
    the same lines from ``from_longest_history_tokens`` (the longest sequence's cached
    tokens) on, for a batch of mixed lengths."""
    alts = getattr(cost, "decode_min_coeffs", None)
    lines = tuple(alts(b)) if alts is not None else ()
    spans_of = getattr(cost, "decode_interval_coeffs", None)
    spans = tuple(spans_of(b)) if spans_of is not None else ()
    stream = "min(stream, min_lines)" if lines else "stream"
    if spans:
        stream = "stream of the interval holding C"
    item = hasattr(cost, "decode_item_coeffs")
    out: dict[str, Any] = {"step_form": f"max(item_bound, {stream})" if item else stream}
    if lines:
        out["min_lines"] = [{"base_s": b0, "per_context_token_s": k0} for b0, k0 in lines]
    if spans:
        out["interval_lines"] = [
            {"from_context_tokens": c0, "base_s": b0, "per_context_token_s": k0}
            for c0, (b0, k0) in spans
        ]
    longest_of = getattr(cost, "decode_longest_coeffs", None)
    if spans and longest_of is not None:
        out["longest_lines"] = [
            {"from_longest_history_tokens": h0, "base_s": b0, "per_context_token_s": k0}
            for h0, (b0, k0) in longest_of(b)
        ]
    return out


KV_PATHS = PAIR_PATHS


def _kv(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    model = get_model(v["model"])
    per_token = model.kv_bytes_per_token(v["kv_dtype"])
    nbytes = model.kv_bytes(v["tokens"], v["kv_dtype"])  # windowed layers keep <= window
    prefill_s = v.get("prefill_s") or 0.0
    overlap = bool(v.get("overlap"))
    if v.get("path") is not None:
        fab = _kv_fabric(v, nbytes, prefill_s, model.num_layers, overlap)
    else:
        xfer = kv_transfer(nbytes, v["link"], gpu=v.get("gpu"))
        serial = xfer.time_s - xfer.latency_s
        fab = {
            "link": xfer.link,
            "transfer_s": xfer.time_s,
            "bandwidth_bytes_per_s": xfer.bandwidth_bytes_per_s,
            "latency_s": xfer.latency_s,
            "exposed_s": exposed_time_s(
                serial, prefill_s, model.num_layers, overlap, latency_s=xfer.latency_s
            ),
            "path": None,
        }
    return {
        "command": "kv",
        "model": model.id,
        "tokens": v["tokens"],
        "kv_dtype": v["kv_dtype"],
        "link": fab.pop("link"),
        "gpu": v.get("gpu"),
        "bytes_per_token": per_token,
        "kv_cache": _kv_cache_shape(model),
        "bytes": nbytes,
        "gib": nbytes / 2**30,
        "transfer_s": fab["transfer_s"],
        "time_s": fab["transfer_s"],
        "bandwidth_bytes_per_s": fab.pop("bandwidth_bytes_per_s"),
        "latency_s": fab["latency_s"],
        "breakdown": {
            "latency_s": fab["latency_s"],
            "serialization_s": fab["transfer_s"] - fab["latency_s"],
        },
        "prefill_s": prefill_s,
        "overlap": overlap,
        "num_layers": model.num_layers,
        **{k: fab[k] for k in fab if k not in ("transfer_s", "latency_s")},
    }


def _kv_cache_shape(model: Any) -> dict[str, Any]:
    """What one token's KV is: MLA's latent, or K and V per KV head; windowed layers."""
    if model.mla is not None:
        shape: dict[str, Any] = {
            "kind": "mla",
            "values_per_token_per_layer": model.mla.cache_elems_per_token,
            "kv_lora_rank": model.mla.kv_lora_rank,
            "qk_rope_head_dim": model.mla.qk_rope_head_dim,
        }
    else:
        shape = {
            "kind": "gqa" if model.num_kv_heads < model.num_heads else "mha",
            "values_per_token_per_layer": model.kv_elems_per_token_per_layer(),
        }
    shape["layers"] = model.num_layers
    w = model.attention_window
    if w is not None:
        shape["window"] = {"kind": w.kind, "tokens": w.tokens, "layers": w.num_layers}
    return shape


def _kv_fabric(
    v: dict[str, Any], nbytes: int, prefill_s: float, num_layers: int, overlap: bool
) -> dict[str, Any]:
    """One transfer between a prefill and a decode worker placed as ``v["path"]`` says,
    moved by the fabric's flow network (:mod:`disaggsim.fabric.estimate`)."""
    tp = v.get("tp") or 1
    where = v["path"]
    try:
        topo = pair_topology(
            where,
            v.get("gpu"),
            tp,
            nic_gbit_per_s=v.get("nic_gbit_per_s"),
            host_staging=v.get("host_staging") or "pinned",
            label="--path",
        )
    except UserError as e:
        raise UserError(f"--path {where} with --tp {tp}: {e}") from None
    est = estimate_handoff(
        topo, 0, 1, nbytes, prefill_s=prefill_s, num_layers=num_layers, overlap=overlap
    )
    return {
        "link": est.link,
        "transfer_s": est.transfer_s,
        "bandwidth_bytes_per_s": est.bandwidth_bytes_per_s,
        "latency_s": est.latency_s,
        "exposed_s": est.exposed_s,
        "path": est.path.kind,
        "path_links": list(est.path_links),
        "hops": est.path.num_hops,
        "num_shards": est.path.num_shards,
        "tp": tp,
    }


def _gemm(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    gpu = get_gpu(v["gpu"])
    prof = _profile(v, gpu.id, cache)
    dtype = "fp8" if v["dtype"] == "fp8" else "bf16"
    if dtype == "fp8" and prof.peaks.fp8_flop_per_s <= 0:
        raise UserError(f"{gpu.id} has no FP8 tensor cores: dtype fp8 (allowed: bf16, fp16)")
    p = prof.gemm_params(dtype)
    m, n, k = v["m"], v["n"], v["k"]
    elem = 1.0 if dtype == "fp8" else 2.0
    eff_c = float(ops.gemm_compute_eff(p, m, n, k))
    compute_s = float(ops.gemm_flop(m, n, k)) / (prof.peaks.flop_per_s(dtype) * eff_c)
    memory_s = float(ops.gemm_bytes(m, n, k, elem)) / (prof.peaks.hbm_bytes_per_s * p.mem_eff)
    compute_bound = compute_s >= memory_s
    return {
        "command": "op gemm",
        "gpu": gpu.id,
        "m": m,
        "n": n,
        "k": k,
        "dtype": v["dtype"],
        "profile_kind": prof.provenance.get("kind"),
        "time_s": float(ops.gemm_time_s(prof.peaks, p, m, n, k, dtype)),
        "bound": "compute" if compute_bound else "memory",
        "efficiency": eff_c if compute_bound else p.mem_eff,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "launch_s": p.launch_s,
        "flop": float(ops.gemm_flop(m, n, k)),
        "bytes": float(ops.gemm_bytes(m, n, k, elem)),
    }


def _check_heads(v: dict[str, Any]) -> None:
    if v["heads"] % v["kv_heads"]:
        raise UserError(f"kv_heads ({v['kv_heads']}) must divide heads ({v['heads']})")


def _decode_attention(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    """One decode-attention kernel, with the terms ``ops.decode_attention_time_s`` adds
    (``time_form``): ``fixed_s`` (the floor, ``multi_floor_s`` on the multi-sequence GQA
    path, and ``per_seq_s`` per sequence), ``items_s`` (per work item) and ``stream_s``
    (the KV bytes at the kernel's bandwidth share) plus ``shortfall_s`` (a split-KV
    kernel's few-item loss, ``ops.decode_split_shortfall_s``), overlapped by ``overlap``. A
    multi-block wave kernel's time is the smallest of its lines, printed as
    ``wave_lines`` instead of the terms."""
    _check_heads(v)
    gpu = get_gpu(v["gpu"])
    prof = _profile(v, gpu.id, cache)
    p = prof.decode_attention_params(v["kv_dtype"])
    b, c, kh, d = v["batch"], v["context_tokens"], v["kv_heads"], v["head_dim"]
    elem = float(dtype_bytes(v["kv_dtype"]))
    kv_read = 2.0 * b * c * kh * d * elem
    share = float(ops.decode_attention_bw_scale(p, b, kh))
    # query heads per KV head: a grouped kernel's group rate and query-head work; a kernel
    # fitted per query head (reread_bytes_per_s > 0) reads each KV head once per query
    # head, as the step model runs it (costmodel/step.py)
    q = float(v["heads"] // kh)
    group = q if p.per_query_head else 1.0
    time_s = float(
        ops.decode_attention_time_s(
            prof.peaks, p, b, b * c, kh, d, elem, reread_group=group, q_per_kv=q
        )
    )
    out: dict[str, Any] = {
        "command": "op decode-attention",
        "gpu": gpu.id,
        "batch": b,
        "context_tokens": c,
        "heads": v["heads"],
        "kv_heads": kh,
        "head_dim": d,
        "kv_dtype": v["kv_dtype"],
        "q_per_kv": q,
        "reread_group": group,
        "profile_kind": prof.provenance.get("kind"),
        "time_s": time_s,
        "bound": "memory",
        "bytes": kv_read,
        "roofline_s": kv_read / prof.peaks.hbm_bytes_per_s,
    }
    if p.wave_sms > 0.0:
        _, base, per = ops.decode_wave_lines(prof.peaks, p, b, kh, d, elem, q)
        out["time_form"] = "min(wave_lines)"
        out["wave_lines"] = [
            {"base_s": float(b0), "per_context_token_s": float(k0)}
            for b0, k0 in zip(base.ravel(), per.ravel(), strict=True)
        ]
    else:
        work = ops.decode_work_heads(p, kh, group)
        stream_s = kv_read * float(
            ops.decode_stream_seconds_per_byte(prof.peaks, p, b, kh, group, 0.0, q)
        )
        if p.block_bytes_per_s > 0.0:  # masked MHA's resident blocks, as the kernel
            hist = c - 1.0  # equal lengths: each sequence's cached tokens before this step
            occ = float(ops.mmha_occupancy_seconds_per_byte(p, hist, b * work, group))
            stream_s = max(stream_s, kv_read * occ)
        out.update(
            time_form="fixed_s + max(items_s, stream_s + shortfall_s) + (1 - overlap) "
            "* min(items_s, stream_s + shortfall_s)",
            fixed_s=float(ops.decode_attention_floor_s(p, b, kh)) + p.per_seq_s * b,
            items_s=float(ops.decode_item_seconds(p, b, work, kh, d, q)),
            stream_s=stream_s,
            shortfall_s=float(ops.decode_split_shortfall_s(p, stream_s, b, work)),
            overlap=p.overlap,
            efficiency=kv_read / (prof.peaks.hbm_bytes_per_s * stream_s) if stream_s else None,
        )
    out.update(
        floor_s=p.floor_s,
        multi_floor_s=p.multi_floor_s,
        per_seq_s=p.per_seq_s,
        per_seq_kv_elem_s=p.per_seq_kv_elem_s,
        bw_eff=p.bw_eff,
        parallel_share=share,
        par_half_sat=p.par_half_sat,
        split_fill_s=p.split_fill_s,
    )
    return out


def _prefill_attention(v: dict[str, Any], cache: dict) -> dict[str, Any]:
    _check_heads(v)
    gpu = get_gpu(v["gpu"])
    prof = _profile(v, gpu.id, cache)
    p = prof.prefill_attention_params("bf16")
    b, length = v["batch"], v["prompt_tokens"]
    pairs = float(b * ops.causal_pairs(length))
    flop = float(ops.prefill_attention_flop(pairs, v["heads"], v["head_dim"]))
    return {
        "command": "op prefill-attention",
        "gpu": gpu.id,
        "batch": b,
        "prompt_tokens": length,
        "heads": v["heads"],
        "kv_heads": v["kv_heads"],
        "head_dim": v["head_dim"],
        "profile_kind": prof.provenance.get("kind"),
        "time_s": float(
            ops.prefill_attention_time_s(
                prof.peaks, p, b, b * length, pairs, v["heads"], v["head_dim"]
            )
        ),
        "bound": "compute",
        "efficiency": p.max_eff * length / (length + p.half_sat),
        "floor_s": p.floor_s,
        "flop": flop,
    }


Query = Callable[[dict[str, Any], dict], dict[str, Any]]
COMMANDS: dict[str, tuple[str, tuple[Field, ...], Query]] = {
    "prefill": (
        "time of one prefill batch of equal prompts",
        (MODEL, GPU, TP, BATCH, PROMPT_TOKENS) + LAYOUT + WORKER_OPTS + MOE_OPTS + (PROFILE,),
        _prefill,
    ),
    "decode": (
        "time of one decode step",
        (MODEL, GPU, TP, BATCH, CONTEXT_TOKENS) + LAYOUT + WORKER_OPTS + MOE_OPTS + (PROFILE,),
        _decode,
    ),
    "kv": (
        "KV-cache bytes of a prompt and its transfer time over a link",
        (
            MODEL,
            _int("tokens", "tokens of context of one request (its KV is sized for these)", 0),
            _choice("kv_dtype", KV_DTYPES, "KV-cache dtype", "bf16"),
            _choice("link", LINK_CLASSES, "link class (without --path)", "nvlink"),
            Field("gpu", "choice", "GPU whose links to use", False, None, GPU_IDS),
            _float("prefill_s", "prefill duration producing the KV, s (for exposed_s)"),
            Field("overlap", "bool", "stream KV layer by layer during the prefill", False, False),
            Field("path", "choice", "place the workers: fabric model", False, None, KV_PATHS),
            Field("tp", "int", "GPUs per worker (tensor-parallel degree), with --path", False, 1),
            _choice("host_staging", ("pinned", "pageable"), "staged host memory", "pinned"),
            _float("nic_gbit_per_s", "NIC Gb/s (1e9 bit/s) per NIC, with --path", 1e-9),
        ),
        _kv,
    ),
    "op gemm": (
        "one (m x k) @ (k x n) GEMM",
        (GPU, _int("m", "rows (tokens)"), _int("n", "output features"), _int("k", "input features"))
        + (_choice("dtype", ("bf16", "fp16", "fp8"), "GEMM dtype", "bf16"), PROFILE),
        _gemm,
    ),
    "op decode-attention": (
        "one decode-attention kernel",
        (GPU, BATCH, CONTEXT_TOKENS)
        + SHAPE
        + (_choice("kv_dtype", KV_DTYPES, "KV-cache dtype", "bf16"), PROFILE),
        _decode_attention,
    ),
    "op prefill-attention": (
        "one causal prefill-attention kernel",
        (GPU, BATCH, PROMPT_TOKENS) + SHAPE + (PROFILE,),
        _prefill_attention,
    ),
}


def _convert(f: Field, raw: str) -> Any:
    """``raw`` as ``f``'s type; a ValueError's message says what was expected."""
    raw = raw.strip()
    if f.kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if value < f.minimum:
            raise ValueError(f"must be >= {f.minimum}, got {value}")
        if value > f.maximum:
            shown = f"{value:.3g}" if value < 10**300 else f"a {len(str(value))}-digit number"
            raise ValueError(f"must be <= {f.maximum:,.0f} (docs/safety.md), got {shown}")
        return value
    if f.kind == "float":
        try:
            number = float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if not number >= f.minimum or number == float("inf"):
            raise ValueError(f"must be a finite number >= {f.minimum:g}, got {raw}")
        if number > f.maximum:
            raise ValueError(f"must be <= {f.maximum:g} (docs/safety.md), got {raw}")
        return number
    if f.kind == "bool":
        low = raw.lower()
        if low not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return low in ("true", "on", "1", "yes")
    if f.choices and raw not in f.choices:
        if f.name in ("model", "gpu"):
            hint = id_hint(f.name, raw)
        else:
            hint = closest_hint(raw, list(f.choices))
        raise ValueError(f"unknown value {raw!r} (allowed: {', '.join(f.choices)}){hint}")
    return raw


def _resolve(
    fields: tuple[Field, ...], flags: dict[str, str | None], row: dict[str, str] | None, where: str
) -> dict[str, Any]:
    """Typed values of one query: the CSV row's cell, else the flag, else the default."""
    values: dict[str, Any] = {}
    for f in fields:
        raw = row.get(f.name) if row is not None else None
        source = f"column {f.name}"
        if raw is None or raw.strip() == "":
            raw = flags.get(f.name)
            source = f.flag
        if isinstance(raw, bool):
            values[f.name] = raw
            continue
        if raw is None:
            if f.required:
                missing = (
                    f"missing column {f.name} (or flag {f.flag})"
                    if row is not None
                    else f"missing {f.flag}"
                )
                raise UserError(f"{where}{missing}")
            values[f.name] = f.default
            continue
        try:
            values[f.name] = _convert(f, raw)
        except ValueError as e:
            raise UserError(f"{where}{source}: {e}") from None
    return values


def prefixed(command: str, message: str) -> str:
    """``message`` starting with ``cost <command>: `` as every ``cost`` error does (the
    cost model's own errors, a profile's, the CSV's ``FILE: line N: ...``), once."""
    head = f"cost {command}: "
    return message if message.startswith(head) else head + message


def _as_flag(fields: tuple[Field, ...], message: str) -> str:
    """``message`` naming its input by flag where it starts with the field's name (the
    cost model names a field ``attention_backend: ...``; on the command line it was
    given as ``--attention-backend``)."""
    head, sep, rest = message.partition(": ")
    for f in fields:
        if sep and head == f.name:
            return f"{f.flag}: {rest}"
    return message


def run_queries(command: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Answer ``command`` for the flags in ``args`` or for every row of ``args.input``."""
    _, fields, query = COMMANDS[command]
    flags = {f.name: getattr(args, f.name, None) for f in fields}
    cache: dict = {}
    path = getattr(args, "input", None)
    if path is None:
        values = _resolve(fields, flags, None, f"cost {command}: ")
        try:
            return [query(values, cache)]
        except UserError as e:
            raise UserError(_as_flag(fields, str(e))) from None
    from disaggsim.inputs import regular_file

    if os.path.exists(path):  # a named pipe or a device would block; open() names the rest
        regular_file(path, UserError, "query table")
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames
            if not header:
                raise UserError(
                    f"{path}: empty file: expected a header row with columns such as {', '.join(f.name for f in fields)}"
                )
            names = {f.name for f in fields}
            unknown = [c for c in header if c.strip() not in names]
            if unknown:
                raise UserError(
                    f"{path}: line 1: unknown column {unknown[0]!r} "
                    f"(allowed: {', '.join(f.name for f in fields)})"
                )
            out = []
            for row in reader:
                where = f"{path}: line {reader.line_num}: "
                if None in row:
                    raise UserError(f"{where}more cells than header columns")
                clean = {k.strip(): v for k, v in row.items() if v is not None}
                values = _resolve(fields, flags, clean, where)
                try:
                    out.append(query(values, cache))
                except UserError as e:
                    raise UserError(f"{where}{e}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV file ({e})") from None
    return out


def _run(command: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            answers = run_queries(command, args)
        except (UserError, ProfileError) as e:
            raise UserError(prefixed(command, str(e))) from None
        for obj in answers:
            sys.stdout.write(json.dumps(obj) + "\n")
        return 0

    return run


def _add_command(sub: Any, name: str, command: str) -> None:
    help_text, fields, _ = COMMANDS[command]
    p = sub.add_parser(name, help=help_text, description=help_text + ". Prints JSON.")
    for f in fields:
        if f.kind == "bool":
            p.add_argument(
                f.flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f.help,
            )
            continue
        extra = f" (one of: {', '.join(f.choices)})" if f.choices else ""
        default = f"; default {f.default}" if f.default is not None else ""
        p.add_argument(f.flag, dest=f.name, metavar=f.name.upper(), help=f.help + extra + default)
    p.add_argument(
        "--input",
        metavar="FILE.csv",
        help="one query per row; columns named like the flags without dashes "
        f"({', '.join(f.name for f in fields)}); prints one JSON object per line",
    )
    p.set_defaults(func=_run(command))


def add_parser(subparsers: Any) -> None:
    """Register ``disaggsim cost`` and its subcommands on ``subparsers``."""
    p = subparsers.add_parser(
        "cost",
        help="one step's or one operator's time as JSON",
        description="Query the roofline cost model: step times, KV transfers, single operators.",
    )
    sub = p.add_subparsers(dest="cost_command", required=True, metavar="{prefill,decode,kv,op}")
    for name in ("prefill", "decode", "kv"):
        _add_command(sub, name, name)
    op = sub.add_parser("op", help="one operator's time", description="Time of one GPU operator.")
    op_sub = op.add_subparsers(dest="op_command", required=True)
    for name in ("gemm", "decode-attention", "prefill-attention"):
        _add_command(op_sub, name, "op " + name)
