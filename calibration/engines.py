"""Serving-engine profiles fitted to public end-to-end measurements; the GPU's graph-replay gap.

An engine's iteration costs its kernels plus host time the GPU waits for
(:mod:`disaggsim.hardware.engines` has the form: per iteration, per extra TP rank, per
sequence, per token, per layer). Kernel times are the hardware profiles' (graph-replayed
kernels); this module fits the overhead parameters of each engine profile to what engines
were measured to take end to end, and writes ``disaggsim/hardware/engines.json``.

Data, each row with its source, configuration and figure:

- ``calibration/engine_data/measurements.csv``: collected from public pages —
  TensorRT-LLM 0.9.0's performance tables (static batches: batch latency = batch × output
  tokens / throughput; batch-1 first-token latency), vLLM's performance-benchmark CI
  latency test (a batch of 8 prompts, 32 in / 128 out) on A100, H100 and H200, vLLM
  ``benchmark_latency`` runs and an FP8 batch posted in vLLM's pull requests and issues (V0
  and V1, H100), Mixtral-8x7B batches (vLLM's CI at TP2 on A100, H100 and H200; vLLM PR 3240,
  TP2 on the A100, batch 1-64: the MoE kernels, :func:`moe_floor_check`), NVIDIA NIM
  1.8.0's concurrency-1 figures (Llama-3.3-70B FP8, TP2 H100),
  SGLang ``bench_latency`` decode steps (Llama-3-8B, H100, batch 1 and 128, TP 1 and 8),
  and Splitwise's measurements of 2023 vLLM (Llama-2-70B on DGX-A100 and DGX-H100, TP
  2/4/8: a second source for ``vllm-eager-2023``, rebuilt from its transcriptions by
  :func:`splitwise_rows`; the DGX-H100 rows fit that host's speed alone, ``host_scale``).
  Column ``split`` marks the rows held out of the fit (every H200 row, NIM, Splitwise's
  DGX-A100 rows, vLLM rows from PRs and issues, every MoE row, SGLang PR 1401);
- DistServe's curves of the 2023 vLLM engine (``kernels/distserve/profiler-a100-80g.vllm
  .json``, OPT-13B/66B on A100, eager PyTorch), evaluated on a grid
  (:func:`whole_step_points`) for ``vllm-eager-2023``; the (model, TP) families
  :data:`EAGER_HOLDOUT` are held out.

How a measurement is predicted (:func:`features`): with the engine overhead set to zero
the step model gives the kernel time of the measured work — a static batch is one
prefill of every prompt then ``osl − 1`` decode steps over the growing context (summed in
closed form from the affine decode step); a first-token latency is one prefill; a
concurrency-1 inter-token latency or a decode step is one decode step at the mean context
``isl + osl / 2``. The overhead is linear in its parameters (iterations, iterations ×
(TP − 1), sequences, tokens, iterations × layers, …), so each engine's parameters are the
non-negative least-squares solution for relative error (:func:`solve`) over its fit rows,
with only the parameters the data can tell apart (:data:`FIT_PARAMS`).

``graph_gap``: what a replayed CUDA graph costs per layer beyond its kernels, estimated
per GPU from the public per-op tables — AIConfigurator times every op as a replayed graph,
Vidur's ``mlp.csv`` as bare kernel durations; for bf16 GEMMs with m ≤ 16 the fit
``graph_replayed = gap + slope × kernel_duration`` gives the per-kernel gap, and
``graph_replay.per_layer_s = ELEMENTWISE_KERNELS_PER_LAYER × max(gap, 0)`` (the
element-wise terms are the ones fitted to kernel durations). About zero on A100 and H100.

Run: ``python -m calibration.engines`` prints every engine's fit and errors;
``python -m calibration.fit_public --engines`` writes ``engines.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear, minimize_scalar

from calibration import public
from calibration.fit import KeptResults, ape, prediction_error
from disaggsim.catalog import GPU_IDS, MODEL_IDS, get_gpu, get_model
from disaggsim.costmodel import ops
from disaggsim.costmodel.moe import build_moe_worker_cost
from disaggsim.costmodel.moe_params import MoeParams, load_moe_params
from disaggsim.costmodel.step import ELEMENTWISE_KERNELS_PER_LAYER, build_worker_cost
from disaggsim.errors import UserError
from disaggsim.hardware.engines import (
    ENGINE_NAMES,
    ENGINES_SCHEMA_VERSION,
    PARAM_KEYS,
    ZERO_ENGINE,
    EngineProfile,
    engines_from_dict,
    load_engines,
    shipped_engines_path,
)
from disaggsim.hardware.profile import HardwareProfile, load_profile
from disaggsim.inputs import regular_file

MS = 1e-3
REPO = Path(__file__).resolve().parents[1]
MEASUREMENTS = REPO / "calibration" / "engine_data" / "measurements.csv"
# how DistServe measured its curves (sources with commits, the profiled grid per family)
HARNESS = REPO / "calibration" / "engine_data" / "distserve_harness.json"
COLUMNS = (
    "source", "url", "version", "engine", "model", "gpu", "tp", "weight_dtype", "kv_dtype",
    "batch", "isl", "osl", "metric", "value_s", "split", "raw", "derivation",
)  # fmt: skip
METRICS = ("batch_latency_s", "ttft_s", "itl_s", "decode_step_s")
FILES = {"distserve": "profiler-a100-80g.distserve.json", "vllm": "profiler-a100-80g.vllm.json"}
EAGER_FILE = "vllm"
EAGER_GPU = "a100-80gb"
EAGER_HOLDOUT = (("opt-66b", 8), ("opt-13b", 4))
PREFILL_BATCHES = (1, 2, 4, 8)
PREFILL_LENGTHS = (64, 128, 256, 512, 1024, 2048)
PREFILL_MAX_TOKENS = 8192
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (64, 256, 512, 1024, 2048)
GRAPH_GAP_MAX_M = 16  # GEMM rows (tokens) used for the graph-gap estimate
# Splitwise (Patel et al., ISCA 2024, arXiv 2311.18677): its characterization runs of 2023
# vLLM (the paper's engine; the simulator's repository does not say, its issue #4 asks) on
# DGX-A100 and DGX-H100, published as splitwise-sim's performance database. Its Llama-2-70B
# rows (TP 2/4/8, output 128 tokens, five runs each) are transcribed per GPU in
# SPLITWISE_FILES: the A100 rows (source ``splitwise-sim``) and, since 2026-12-03, the H100
# rows (``splitwise-sim-h100``: DGX-H100, so H100 SXM; a second GPU and host for the eager
# engine, whose profile is fitted on A100 curves alone). The "h100-80gb-pcap" rows (derived
# from the H100 ones: the same token times, prompt times x 1.3) and BLOOM-176B (not in the
# catalog) are not transcribed.
SPLITWISE_RAW = REPO / "calibration" / "engine_data" / "splitwise_llama2_70b_a100.csv"
SPLITWISE_H100_RAW = REPO / "calibration" / "engine_data" / "splitwise_llama2_70b_h100.csv"
SPLITWISE_SOURCE = "splitwise-sim"
SPLITWISE_H100_SOURCE = "splitwise-sim-h100"
SPLITWISE_URL = (
    "https://github.com/Mutinifni/splitwise-sim/blob/"
    "378088013a54df6f2052c27ff5ae6ea7619c3ecc/data/perf_model.csv"
)
SPLITWISE_VERSION = "vLLM of 2023, eager (Splitwise's characterization runs, DGX-A100)"
# catalog GPU -> (transcription, source name, version text, the file's hardware column,
# split): the A100 rows are held out; the H100 rows fit the one parameter the A100 rows
# cannot tell, the DGX-H100 host's speed (fit_eager; each TP family predicted by a fit
# without it, "refit without each family")
SPLITWISE_FILES = {
    "a100-80gb": (SPLITWISE_RAW, SPLITWISE_SOURCE, SPLITWISE_VERSION, "a100-80gb", "holdout"),
    "h100-sxm": (
        SPLITWISE_H100_RAW,
        SPLITWISE_H100_SOURCE,
        "vLLM of 2023, eager (Splitwise's characterization runs, DGX-H100)",
        "h100-80gb",
        "fit",
    ),
}
# vLLM 0.2's token budget is max(max_model_len, 2560): a batch of at most 2560 prompt tokens
# is one prefill iteration under any configuration; the source ran 8192-token prompts but
# states neither its budget nor how a batch's prompt_time aggregates its requests' TTFTs
# (batches of 8 and 16 x 512 tokens measured 1.07-1.34x a single prompt of the same tokens)
SPLITWISE_PREFILL_MAX_TOKENS = 2560
# decode configurations the source did not serve as one batch, per GPU: e2e_time exceeds
# prompt_time + 127 x token_time (checked by hand on run 1 of every configuration of TP2
# batches 1-64 and TP4 and TP8 batches 16-64 and the longest prompts: the others within
# 0.5%; on the H100 TP2 batch 32 holds, 9,033 against 2,399 + 127 x 52.10 = 9,015 ms)
SPLITWISE_DECODE_EXCLUDED = {
    "a100-80gb": {
        (2, 32): "e2e 18,487 ms against 6,639 + 127 x 72.09 = 15,794 ms (+17%)",
        (2, 64): "e2e 159,758 ms against 802 + 127 x 67.30 = 9,349 ms (17x; its prompt_time, "
        "0.80 s, is below batch 32's 6.6 s)",
    },
    "h100-sxm": {
        (2, 64): "e2e 83,892 ms against 363 + 127 x 42.32 = 5,738 ms (15x; its prompt_time, "
        "0.36 s, is below batch 32's 2.4 s)",
    },
}
# the parameters each engine's data can identify (others stay 0): vLLM's fit rows are
# its CI's batches of 8 (no per-sequence signal; the batch-1 and batch-64 rows of PRs and
# issues are held out); SGLang's fit rows (issue 1008) are batch 1 and 128 at TP1
# and batch 1 at TP8: a per-iteration and a per-sequence cost, no per-TP-rank term (one TP8
# row, which the kernels already meet within 3%)
FIT_PARAMS = {
    "vllm": ("per_iteration_s", "per_tp_rank_s"),
    "sglang": ("per_iteration_s", "per_seq_s"),
    "trtllm": ("per_iteration_s", "per_tp_rank_s", "per_seq_s"),
    "vllm-eager-2023": PARAM_KEYS,
}
# engines that ship their own attention kernels (the rest run FlashAttention-family
# kernels: their framework's fits under auto, step.pick_attention_backends): written into
# engines.json and used for the kernel time of their measurements
ENGINE_ATTENTION = {"trtllm": "trtllm"}
# engines whose FP8 GEMM kernel the hardware profiles fit on its own (``gemm_kernels``):
# SGLang's sgl-kernel FP8 GEMM and vLLM's CUTLASS scaled_mm (calibration/fit_public.py
# fit_tiled_fp8_kernel, TILE_KERNELS); written into engines.json and used for the kernel time
# of their measurements. vllm-eager-2023 (2023 vLLM, before its FP8 kernels) and trtllm keep
# ops.gemm.fp8
ENGINE_FP8_GEMM = {"sglang": "sglang-fp8", "vllm": "vllm-fp8"}
# Decode kernels of the release a source measured, where its grouped (GQA) kernel covered
# only some layouts: query heads per KV head the grouped kernel took; the others ran a
# per-query-head kernel (EngineProfile.grouped_decode_q_per_kv). TensorRT-LLM of April 2024
# (0.9.0; tensorrt_llm 0.10.0.dev2024043000, decoderXQARunner.h ``shouldUse``: single-token
# generation takes XQA only when ``nbQHeadsPerKV`` is 8 or 1, else the masked-MHA kernel,
# one thread block per query head; gpt-attention.md of that release: XQA "only supports a
# limited number of model configurations, such as the LLAMA2 70B model"). So Mistral-7B
# (4 query heads per KV head) decoded per query head; Llama-2-70B (8) and Llama-2-7B (MHA)
# did not. The shipped profiles model current releases (ENGINE_GROUPED_DECODE).
# TensorRT-LLM 0.5 (the H200 launch blog's table) predates XQA altogether (XQA-kernel.md:
# "will be included in the v0.8 releases"): every grouped layout decoded per query head.
RELEASE_GROUPED_DECODE: dict[str, tuple[int, ...]] = {
    "trtllm-0.9.0-perf": (1, 8),
    "trtllm-0.5.0-h200-blog": (),
}
# The shipped engine profiles' coverage (current releases): TensorRT-LLM's JIT XQA
# (decoderXQAImplJIT kernelUtils.cpp supportConfigCommon/QGMMA/HMMA, the 1.x releases whose
# kernels the AIConfigurator tables time) refuses vanilla MHA (one query head per KV head)
# and ``head_grp_size * beam_width > 32``, so those layouts decode on masked MHA
# (fit_public.trtllm_xqa; the profile's ``trtllm-mmha`` fit); vLLM's and SGLang's
# FlashAttention kernels pack any group (None).
ENGINE_GROUPED_DECODE: dict[str, tuple[int, ...]] = {"trtllm": tuple(range(2, 33))}
# an engine's per-query-head decode kernel (a decode-only backend of the hardware profiles)
ENGINE_PER_QUERY_HEAD_BACKEND = {"trtllm": "trtllm-mmha"}
RELEASE_GROUPED_DECODE_SOURCE = (
    "TensorRT-LLM decoderXQARunner.h shouldUse at tensorrt_llm 0.10.0.dev2024043000 "
    "(github.com/WhiteD2125/TensorRT-LLM@6ad7cf1bcc08e31990c62ba929a8e84f35667654, a copy "
    "of NVIDIA/TensorRT-LLM main of 2024-04-30): nbQHeadsPerKV != 8 && != 1 -> no XQA; "
    "0.5 had no XQA (docs/source/blogs/XQA-kernel.md: in the v0.8 releases)"
)
# candidate rates of the per-query-head kernel's KV re-reads (bytes/s, log grid): the fit
# takes the one minimising the relative error of the fit rows it affects
REREAD_GRID_BYTES_PER_S = tuple(float(x) for x in np.logspace(np.log10(2e12), np.log10(2e13), 61))
DESCRIPTIONS = {
    "vllm": "vLLM with CUDA-graph decode (fitted on the V0 engine's CI of 2024; V0 and V1 "
    "runs, an FP8 multi-step batch and Mixtral-8x7B batches from vLLM's CI, PRs and issues "
    "held out): per-iteration scheduling, sampling and input preparation, plus the broadcast "
    "to the other TP ranks",
    "sglang": "SGLang with CUDA-graph decode (fitted on 2024 releases, before the overlap "
    "scheduler): per-iteration host time and per-sequence batch preparation",
    "trtllm": "TensorRT-LLM (C++ runtime): per-iteration host time, per extra TP rank and "
    "per sequence",
    "vllm-eager-2023": "vLLM of 2023 (eager PyTorch, Ray workers): Python per iteration and per "
    "token; per layer the longer of the kernels and their launches from Python (overlapped: "
    "a launch floor), and with TP > 1 a host cost per layer the ranks wait for (the all-reduces)",
}


def graph_gap_rows(data_root: Path, gpu: str) -> pd.DataFrame:
    """bf16 GEMMs timed both ways on ``gpu``: AIConfigurator graph-replayed per-op latency
    (``graph_s``, one row per framework) beside Vidur's kernel duration (``kernel_s``,
    median over Vidur's repeated rows) for the same (m, n, k), m ≤ ``GRAPH_GAP_MAX_M``."""
    aic = public.aic_gemm(data_root, gpu)
    aic = aic[(aic["dtype"] == "bf16") & (aic["m"] <= GRAPH_GAP_MAX_M)]
    vid = public.vidur_mlp(data_root, gpu)
    vid = vid[vid["n"].notna() & (vid["m"] <= GRAPH_GAP_MAX_M)]
    kern = vid.groupby(["op", "model", "tp", "m", "n", "k"], as_index=False)["t_s"].median()
    both = pd.DataFrame(kern).merge(aic, on=["m", "n", "k"])
    if both.empty:
        raise UserError(f"{gpu}: no GEMM shape is in both the AIConfigurator and Vidur tables")
    return both.rename(columns={"t_s_x": "kernel_s", "t_s_y": "graph_s"})[
        ["framework", "model", "op", "tp", "m", "n", "k", "kernel_s", "graph_s"]
    ]


def gap_slope(kernel_s: np.ndarray, graph_s: np.ndarray) -> tuple[float, float]:
    """``graph_s ≈ gap + slope × kernel_s`` (soft-L1 least squares in µs): (gap_s, slope)."""
    x, y = kernel_s * 1e6, graph_s * 1e6
    res = least_squares(lambda p: p[0] + p[1] * x - y, [0.0, 1.0], loss="soft_l1", f_scale=1.0)
    return float(res.x[0]) * 1e-6, float(res.x[1])


def graph_gap(data_root: Path, gpu: str) -> dict[str, Any]:
    """Per-kernel gap of a CUDA-graph replay beyond the kernel's duration (module doc):
    pooled over frameworks, per framework, and held out by framework (the gap of the
    others predicting each framework's graph-replayed times from the kernel durations)."""
    rows = graph_gap_rows(data_root, gpu)
    k, g = rows["kernel_s"].to_numpy(float), rows["graph_s"].to_numpy(float)
    gap, slope = gap_slope(k, g)
    fw = rows["framework"].to_numpy()
    per_fw = {}
    held = np.empty(len(rows))
    for f in sorted(set(fw)):
        test = fw == f
        per_fw[f] = gap_slope(k[test], g[test])[0]
        gap_o, slope_o = gap_slope(k[~test], g[~test])
        held[test] = gap_o + slope_o * k[test]
    return {
        "gap_s": gap,
        "slope": slope,
        "per_framework_gap_s": per_fw,
        "bound_s": max(abs(v) for v in (gap, *per_fw.values())),
        "rows": rows.assign(held_out_graph_s=held),
        "error": {
            **prediction_error(gap + slope * k, held, g, "frameworks").as_dict(),
            "gap_us": round(gap * 1e6, 3),
            "slope": round(slope, 4),
            "per_framework_gap_us": {f: round(v * 1e6, 3) for f, v in per_fw.items()},
            "kernels_per_layer": ELEMENTWISE_KERNELS_PER_LAYER,
            "what": "AIConfigurator graph-replayed bf16 GEMM latency = gap + slope × Vidur "
            f"kernel duration, same (m, n, k), m <= {GRAPH_GAP_MAX_M}; per_layer_s = "
            "kernels_per_layer × max(gap, 0) (calibration/engines.py)",
        },
    }


def graphs_into(prof_dict: dict[str, Any], data_root: Path, gpu: str) -> dict[str, Any]:
    """``prof_dict`` with ``graph_replay.per_layer_s`` from :func:`graph_gap`."""
    gg = graph_gap(data_root, gpu)
    out = json.loads(json.dumps(prof_dict))
    per_layer = ELEMENTWISE_KERNELS_PER_LAYER * max(gg["gap_s"], 0.0)
    out["graph_replay"] = {"per_layer_s": float(f"{per_layer:.5g}")}
    out["fit_error"]["graph_replay"] = gg["error"]
    prov = out["provenance"]
    prov["carried"] = [c for c in prov.get("carried", []) if c != "graph_replay"]
    prov["graphs_from"] = (
        f"graph_replay.per_layer_s = {ELEMENTWISE_KERNELS_PER_LAYER} element-wise "
        f"kernels x max(gap, 0), gap {gg['gap_s'] * 1e6:.2f} us per kernel from {gpu}'s "
        "AIConfigurator graph-replayed GEMMs against Vidur kernel durations "
        "(calibration/engines.py graph_gap)"
    )
    return out


def _distserve_dir(data_root: Path) -> Path:
    d = public.kernels_dir(data_root) / "distserve"
    if not d.is_dir():
        raise UserError(f"{d}: DistServe profiles not found")
    return d


def load_curves(data_root: Path, which: str) -> dict[str, Any]:
    path = _distserve_dir(data_root) / FILES[which]
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read DistServe profile ({e})") from None


def kv_capacity_tokens(data_root: Path) -> dict[tuple[str, int], int]:
    """DistServe's KV-cache token capacity per (model id, tp) at pp = 1."""
    path = _distserve_dir(data_root) / "max_num_tokens.csv"
    df = pd.read_csv(regular_file(path, UserError, "DistServe table"))
    df = df[df["pp"] == 1]
    return {
        (str(m).split("/")[-1], int(tp)): int(n)
        for m, tp, n in zip(df["model"], df["tp"], df["max_num_tokens"], strict=True)
    }


def whole_step_points(data_root: Path, which: str) -> pd.DataFrame:
    """The curves of one DistServe file evaluated on the grid: one row per step."""
    curves = load_curves(data_root, which)
    cap = kv_capacity_tokens(data_root)
    rows = []
    for hf_id, by_tp in curves.items():
        model = hf_id.split("/")[-1]
        for tp_s, c in by_tp.items():
            tp = int(tp_s)
            a, b, q = c["prefill"]
            for batch in PREFILL_BATCHES:
                for length in PREFILL_LENGTHS:
                    if batch * length > PREFILL_MAX_TOKENS:
                        continue
                    s1, s2 = batch * length, batch * length**2
                    rows.append((model, tp, "prefill", batch, length, (a + b * s1 + q * s2) * MS))
            threshold = c["decoding_large_small_bs_threshold"]
            for batch in DECODE_BATCHES:
                a, b, q = c["decoding_smallbs"] if batch <= threshold else c["decoding_largebs"]
                for ctx in DECODE_CONTEXTS:
                    if batch * ctx > cap.get((model, tp), 0):
                        continue
                    rows.append(
                        (model, tp, "decode", batch, ctx, (a + b * batch * ctx + q * batch) * MS)
                    )
    return pd.DataFrame(rows, columns=["model", "tp", "kind", "batch", "tokens", "t_s"])


def read_measurements(path: Path = MEASUREMENTS) -> pd.DataFrame:
    """The collected end-to-end measurements, checked: known engines, models, GPUs and
    metrics, positive values. A bad row is a one-line error naming the file and line."""
    try:
        df = pd.read_csv(
            regular_file(path, UserError, "measurements CSV"),
            dtype={"raw": str, "derivation": str, "version": str},
        )
    except (OSError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column {missing[0]} (expected {', '.join(COLUMNS)})")
    checks = (
        ("engine", ENGINE_NAMES),
        ("model", MODEL_IDS),
        ("gpu", GPU_IDS),
        ("metric", METRICS),
        ("split", ("fit", "holdout")),
        ("weight_dtype", ("bf16", "fp16", "fp8")),
        ("kv_dtype", ("bf16", "fp16", "fp8")),
    )
    for i, r in enumerate(df.to_dict("records")):
        line = i + 2
        for col, allowed in checks:
            if r[col] not in allowed:
                raise UserError(
                    f"{path}: line {line}: {col} {r[col]!r} (allowed: {', '.join(allowed)})"
                )
        if not float(r["value_s"]) > 0:
            raise UserError(f"{path}: line {line}: value_s must be > 0, got {r['value_s']!r}")
        if r["metric"] == "itl_s" and int(r["batch"]) != 1:
            raise UserError(f"{path}: line {line}: itl_s rows must be concurrency (batch) 1")
    return df


LMDEPLOY_RAW = REPO / "calibration" / "engine_data" / "lmdeploy_turbomind_a100.csv"


def lmdeploy_rows(path: Path = LMDEPLOY_RAW) -> pd.DataFrame:
    """LMDeploy's TurboMind static-inference table (A100-80G, FP16; ``profile_generation``:
    ``batch`` request threads, each prompt ``isl`` tokens, ``osl`` generated, throughput =
    generated tokens / total time) as batch latencies: ``batch × osl / out_tok_per_s`` (one
    batch, every request the same length). Kept apart from :data:`MEASUREMENTS`: no
    ``lmdeploy`` engine profile exists (:func:`lmdeploy_check` says why). The rows are the
    table's clean ones: batch 1 (one request at a time), and at batch 16-64 the 1-token
    prompts (decode alone) and the 128-token prompts with 2,048 generated tokens (the
    staggered first tokens, ``ftl_max_s``, under 2% of the batch)."""
    try:
        df = pd.read_csv(regular_file(path, UserError, "LMDeploy table CSV"))
    except (OSError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    return df.assign(
        engine="lmdeploy",
        metric="batch_latency_s",
        split="holdout",
        value_s=df["batch"] * df["osl"] / df["out_tok_per_s"],
        derivation="batch x osl / out_tok_per_s",
    )


def lmdeploy_check(path: Path = LMDEPLOY_RAW) -> pd.DataFrame:
    """Each LMDeploy row against the step model's kernels alone (the generic ``auto``
    kernels: no TurboMind kernel is fitted), with the host time per iteration it leaves
    over them (``implied_host_ms``; negative: the kernels alone are already slower than the
    measurement, which no engine overhead ≥ 0 can fit)."""
    pts = lmdeploy_rows(path)
    f = features(pts)
    return f.assign(
        kernels_over_measured=f["kernels_s"] / f["value_s"],
        implied_host_ms=1e3 * (f["value_s"] - f["kernels_s"]) / f["x_per_iteration_s"],
    )


def splitwise_rows(gpu: str = "a100-80gb", path: Path | None = None) -> pd.DataFrame:
    """Splitwise's measurements of 2023 vLLM (Llama-2-70B on ``gpu``'s DGX, TP 2/4/8) as
    rows of ``measurements.csv`` (:data:`COLUMNS`): a second source for
    ``vllm-eager-2023``, independent of DistServe's curves (another harness, another host,
    another model; on the H100 another GPU and host). The A100 rows are held out of the
    fit; the H100 rows fit only that host's speed (:data:`SPLITWISE_FILES`). ``path`` (default: ``gpu``'s
    file in :data:`SPLITWISE_FILES`) is the Llama-2-70B rows of that GPU in splitwise-sim's
    ``data/perf_model.csv`` (:data:`SPLITWISE_URL`; transcribed run by run, times in ms).
    Per (TP, batch, prompt) configuration, output 128 tokens, five runs each: the median
    ``prompt_time`` is a first-token latency (``ttft_s``: one prefill of the batch's
    prompts) where that is one iteration whatever the engine's token budget (a single
    prompt, or at most :data:`SPLITWISE_PREFILL_MAX_TOKENS` tokens); the median
    ``token_time`` (the mean time between the 128 output tokens; the source's ``e2e_time``
    is ``prompt_time`` + 127 × ``token_time``) is one decode step at the batch and the
    mean context ``isl + 64`` (``decode_step_s``), except the configurations of
    :data:`SPLITWISE_DECODE_EXCLUDED`."""
    if gpu not in SPLITWISE_FILES:
        raise UserError(f"Splitwise GPU {gpu!r} (allowed: {', '.join(SPLITWISE_FILES)})")
    default_path, source, version, hardware, split = SPLITWISE_FILES[gpu]
    path = default_path if path is None else path
    excluded = SPLITWISE_DECODE_EXCLUDED[gpu]
    try:
        raw = pd.read_csv(regular_file(path, UserError, "Splitwise CSV"))
    except (OSError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    for col, want in (("hardware", hardware), ("model", "llama2-70b")):
        bad = raw[raw[col] != want] if col in raw.columns else raw
        if len(bad):
            raise UserError(f"{path}: column {col} must be {want!r} on every line")
    rows = []
    keys = ["tensor_parallel", "batch_size", "prompt_size", "token_size"]
    for key, g in raw.groupby(keys, sort=False):
        tp, b, isl, osl = (int(v) for v in cast(tuple, key))
        base = {
            "source": source,
            "url": SPLITWISE_URL,
            "version": version,
            "engine": "vllm-eager-2023",
            "model": "llama-2-70b",
            "gpu": gpu,
            "tp": tp,
            "weight_dtype": "fp16",
            "kv_dtype": "fp16",
            "batch": b,
            "isl": isl,
            "osl": osl,
            "split": split,
        }
        runs = f"{len(g)} runs"
        if b == 1 or b * isl <= SPLITWISE_PREFILL_MAX_TOKENS:
            v = g["prompt_time"].to_numpy(float)
            rows.append(
                {
                    **base,
                    "metric": "ttft_s",
                    "value_s": float(f"{np.median(v) * MS:.6g}"),
                    "raw": f"prompt_time ms, {runs}: " + " ".join(f"{x:g}" for x in v),
                    "derivation": "median of the runs; one prefill of batch x isl tokens "
                    f"(a single prompt or at most {SPLITWISE_PREFILL_MAX_TOKENS} tokens: one "
                    "iteration under any 2023-vLLM token budget)",
                }
            )
        if (tp, b) not in excluded:
            v = g["token_time"].to_numpy(float)
            rows.append(
                {
                    **base,
                    "metric": "decode_step_s",
                    "value_s": float(f"{np.median(v) * MS:.6g}"),
                    "raw": f"token_time ms, {runs}: " + " ".join(f"{x:g}" for x in v),
                    "derivation": "median of the runs of the mean time between output tokens "
                    f"= one decode step at batch {b}, mean context isl + osl/2",
                }
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def eager_points(data_root: Path, which: str = EAGER_FILE) -> pd.DataFrame:
    """DistServe's 2023-vLLM curves as measurements of ``vllm-eager-2023`` (A100, bf16).
    ``which="distserve"``: the curves of DistServe's own C++ engine on the same GPUs and
    harness, in the same frame (engine column ``vllm-eager-2023`` so that :func:`features`
    costs their kernels the same way: no CUDA graphs); only for :func:`same_box_comparison`."""
    pts = whole_step_points(data_root, which)
    held = {(m, tp) for m, tp in EAGER_HOLDOUT}
    return pd.DataFrame(
        {
            "source": f"distserve-{which}",
            "url": f"kernels/distserve/{FILES[which]}",
            "version": (
                "vLLM of late 2023 (DistServe's profile of it)"
                if which == EAGER_FILE
                else "DistServe's engine (SwiftTransformer, C++)"
            ),
            "engine": "vllm-eager-2023",
            "model": pts["model"],
            "gpu": EAGER_GPU,
            "tp": pts["tp"].astype(int),
            "weight_dtype": "bf16",
            "kv_dtype": "bf16",
            "batch": pts["batch"].astype(int),
            "isl": np.where(pts["kind"] == "prefill", pts["tokens"], pts["tokens"]),
            "osl": 0,
            "metric": np.where(pts["kind"] == "prefill", "prefill_step_s", "decode_ctx_step_s"),
            "value_s": pts["t_s"],
            "split": [
                "holdout" if (m, int(t)) in held else "fit"
                for m, t in zip(pts["model"], pts["tp"], strict=True)
            ],
            "raw": "",
            "derivation": "DistServe's fitted curve evaluated on the grid (calibration/engines.py)",
        }
    )


def all_points(data_root: Path | None, path: Path = MEASUREMENTS) -> pd.DataFrame:
    """The measurements CSV plus, when the public data is there, the 2023-vLLM curves."""
    frames = [read_measurements(path)]
    if data_root is not None and (public.kernels_dir(data_root) / "distserve").is_dir():
        frames.append(eager_points(data_root))
    return pd.concat(frames, ignore_index=True)


def shipped_reread_bytes_per_s() -> dict[str, float]:
    """Each engine's per-query-head KV re-read rate in the shipped ``engines.json``."""
    return {n: e.per_query_head_kv_bytes_per_s for n, e in load_engines().items()}


def kernel_engine(engine: str, source: str, reread_bytes_per_s: float) -> EngineProfile:
    """The zero-overhead engine profile the kernels of one measurement run with: the
    engine's own attention kernel, and the decode-kernel coverage of the release the source
    measured (:data:`RELEASE_GROUPED_DECODE`)."""
    grouped = RELEASE_GROUPED_DECODE.get(source)
    return replace(
        ZERO_ENGINE,
        name=engine,
        attention_backend=ENGINE_ATTENTION.get(engine, "auto"),
        fp8_gemm_kernel=ENGINE_FP8_GEMM.get(engine),
        grouped_decode_q_per_kv=grouped,
        per_query_head_kv_bytes_per_s=reread_bytes_per_s if grouped is not None else 0.0,
        per_query_head_decode_backend=ENGINE_PER_QUERY_HEAD_BACKEND.get(engine),
    )


def per_query_head_rows(points: pd.DataFrame) -> np.ndarray:
    """Rows whose release decoded their layout with a per-query-head kernel."""
    out = np.zeros(len(points), bool)
    for i, r in enumerate(points.to_dict("records")):
        grouped = RELEASE_GROUPED_DECODE.get(str(r["source"]))
        if grouped is None:
            continue
        spec = get_model(str(r["model"]))
        tp = int(r["tp"])
        hq, hkv = spec.num_heads // tp, max(spec.num_kv_heads // tp, 1)
        out[i] = (
            replace(ZERO_ENGINE, grouped_decode_q_per_kv=grouped).decode_reread_group(hq // hkv) > 1
        )
    return out


def features(
    points: pd.DataFrame,
    profiles: dict[str, HardwareProfile] | None = None,
    reread_bytes_per_s: dict[str, float] | None = None,
    moe_params: Callable[[str], MoeParams] | None = None,
) -> pd.DataFrame:
    """Per point: kernel-only seconds of the measured work (``kernels_s``) and the columns of
    the overhead's design matrix (one per :data:`PARAM_KEYS`), from the step model with the
    GPU's hardware profile (``profiles`` or the shipped one) and, for a release whose
    grouped decode kernel did not cover the layout, the engine's per-query-head re-read rate
    (``reread_bytes_per_s`` per engine, default the shipped ones). ``moe_params`` (GPU id →
    parameters) replaces the shipped MoE kernel parameters of MoE models (a diagnostic:
    :func:`moe_floor_check`)."""
    profiles = dict(profiles or {})
    reread = shipped_reread_bytes_per_s() if reread_bytes_per_s is None else reread_bytes_per_s
    workers: dict[tuple, Any] = {}
    out = np.zeros((len(points), 1 + len(PARAM_KEYS)))
    for i, r in enumerate(points.to_dict("records")):
        gpu = str(r["gpu"])
        if gpu not in profiles:
            profiles[gpu] = load_profile(gpu)
        prof = profiles[gpu]
        eng = kernel_engine(str(r["engine"]), str(r["source"]), reread.get(str(r["engine"]), 0.0))
        key = (
            r["model"], gpu, int(r["tp"]), r["weight_dtype"], r["kv_dtype"],
            eng.attention_backend, eng.grouped_decode_q_per_kv, eng.per_query_head_kv_bytes_per_s,
            eng.fp8_gemm_kernel, eng.name,
        )  # fmt: skip
        if (
            key not in workers
            and moe_params is not None
            and not get_model(str(r["model"])).is_dense
        ):
            workers[key] = build_moe_worker_cost(
                str(r["model"]),
                gpu,
                int(r["tp"]),
                weight_dtype=str(r["weight_dtype"]),
                kv_dtype=str(r["kv_dtype"]),
                engine=eng,
                profile=prof,
                gpu_mem_util=1.0,
                activation_reserve_bytes=0.0,
                moe_params=moe_params(gpu),
            )
        if key not in workers:
            workers[key] = build_worker_cost(
                str(r["model"]),
                gpu,
                int(r["tp"]),
                weight_dtype=str(r["weight_dtype"]),
                kv_dtype=str(r["kv_dtype"]),
                engine=eng,
                profile=prof,
                gpu_mem_util=1.0,
                activation_reserve_bytes=0.0,
            )
        w = workers[key]
        b, isl, osl = int(r["batch"]), int(r["isl"]), int(r["osl"])
        metric = r["metric"]
        if metric == "batch_latency_s":
            kern = w.prefill_time_s(b, b * isl, b * isl * (isl + 1) / 2.0)
            n = osl - 1
            base, per_tok = w.decode_coeffs(b)
            kern += n * base + per_tok * b * (n * isl + n * (n + 1) / 2.0)
            iters, seqs, toks = osl, b * osl, b * isl + b * n
        elif metric in ("ttft_s", "prefill_step_s"):
            kern = w.prefill_time_s(b, b * isl, b * isl * (isl + 1) / 2.0)
            iters, seqs, toks = 1, b, b * isl
        elif metric in ("itl_s", "decode_step_s"):
            kern = w.decode_time_s(b, int(b * (isl + osl / 2.0)))
            iters, seqs, toks = 1, b, b
        elif metric == "decode_ctx_step_s":  # DistServe: context per sequence in isl
            kern = w.decode_time_s(b, b * isl)
            iters, seqs, toks = 1, b, b
        else:  # pragma: no cover - read_measurements checks metrics
            raise UserError(f"unknown metric {metric!r}")
        tp, layers = int(r["tp"]), w.model.num_layers
        graph = prof.graph_layer_s * layers * iters  # every fitted engine replays graphs or none
        out[i, 0] = kern
        out[i, 1:] = (
            iters,
            iters * (tp - 1),
            seqs,
            toks,
            iters * layers,
            iters * layers * (tp > 1),
        )
        if r["engine"] != "vllm-eager-2023":
            out[i, 0] += graph
    return points.assign(
        kernels_s=out[:, 0], **{f"x_{k}": out[:, j + 1] for j, k in enumerate(PARAM_KEYS)}
    )


def solve(kern: np.ndarray, x: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """Non-negative parameters minimising the relative error of ``kern + x @ theta``."""
    a = x / meas[:, None]
    res = lsq_linear(a, 1.0 - kern / meas, bounds=(0.0, np.inf))
    return np.asarray(res.x, float)


def _solve_cost(
    kern: np.ndarray, x: np.ndarray, meas: np.ndarray, sel: np.ndarray
) -> tuple[np.ndarray, float]:
    """:func:`solve` over the rows ``sel`` and its summed squared relative error there."""
    theta = solve(kern[sel], x[sel], meas[sel])
    r = (kern[sel] + x[sel] @ theta) / meas[sel] - 1.0
    return theta, float(r @ r)


def reread_variants(
    points: pd.DataFrame,
    feat: pd.DataFrame,
    engine: str,
    profiles: dict[str, HardwareProfile] | None = None,
) -> dict[float, pd.DataFrame] | None:
    """``engine``'s rows of ``feat`` with the kernel time recomputed at every rate of
    :data:`REREAD_GRID_BYTES_PER_S` (None when no row of it decoded per query head)."""
    mine = (points["engine"] == engine).to_numpy()
    pts = points[mine].reset_index(drop=True)
    base = feat[mine].reset_index(drop=True)
    hit = per_query_head_rows(pts)
    if not hit.any():
        return None
    out = {}
    for rate in REREAD_GRID_BYTES_PER_S:
        f = features(pts[hit], profiles, {engine: rate})
        v = base.copy()
        v.loc[hit, "kernels_s"] = f["kernels_s"].to_numpy(float)
        out[rate] = v
    return out


# fit_engine's results by a digest of what they are computed from. One process asks for
# the same fits several times (`python -m calibration.engines --eager-forms` fits every
# engine three times, the engine tests a dozen; about 6.5 s a time on a 2-core box, 2026-12-05),
# and a fit is a pure function of its rows. Keyed by content, not by the data folder: rows
# read from other files or priced with another profile are another key.
_FITTED = KeptResults(limit=16)


def _frame_digest(h: Any, frame: pd.DataFrame) -> None:
    h.update(repr([(str(c), str(t)) for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())


def _fit_key(feat: pd.DataFrame, engine: str, variants: dict[float, pd.DataFrame] | None) -> bytes:
    h = hashlib.sha256(engine.encode())
    _frame_digest(h, feat)
    for rate, v in (variants or {}).items():
        h.update(repr(float(rate)).encode())
        _frame_digest(h, v)
    return h.digest()


def fit_engine(
    feat: pd.DataFrame, engine: str, variants: dict[float, pd.DataFrame] | None = None
) -> dict[str, Any]:
    """One engine's fitted :class:`EngineProfile` and its errors (:func:`fit_engine_linear`;
    ``vllm-eager-2023``: :func:`fit_eager`, its launches overlapped with the kernels).
    Fitted once per process for the same rows: a copy of the kept result after."""

    def fit() -> dict[str, Any]:
        if engine == EAGER_ENGINE:
            return fit_eager(feat[feat["engine"] == engine].reset_index(drop=True))
        return fit_engine_linear(feat, engine, variants)

    return _FITTED.get(_fit_key(feat, engine, variants), fit)


def held_out_by_family(
    rows: pd.DataFrame,
    fit: np.ndarray,
    pred: np.ndarray,
    refit: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """Each row's prediction by a fit without its family (source, model, GPU, TP):
    ``refit(train)`` fits on the rows of ``train`` and predicts every row. A family with no
    fit rows keeps ``pred`` (the fit is already without it); a family holding every fit row
    gets NaN (nothing left to fit on)."""
    fam = (
        rows["source"] + "|" + rows["model"] + "|" + rows["gpu"] + "|" + rows["tp"].astype(str)
    ).to_numpy()
    lofo = np.empty(len(rows))
    for f in np.unique(fam):
        test = fam == f
        train = fit & ~test
        if not (fit & test).any():
            lofo[test] = pred[test]
        elif not train.any():
            lofo[test] = np.nan
        else:
            lofo[test] = refit(train)[test]
    return lofo


def fit_engine_linear(
    feat: pd.DataFrame, engine: str, variants: dict[float, pd.DataFrame] | None = None
) -> dict[str, Any]:
    """One engine's overheads linear in their parameters and its errors: all rows, fit rows,
    held-out rows, held out by family (source, model, GPU, TP: refit without it), and the
    kernels alone. With ``variants`` (:func:`reread_variants`) the per-query-head re-read
    rate is fitted too: the grid rate whose overhead fit has the least relative error over
    the fit rows (and, for each family held out, over the rows left)."""
    rows = feat[feat["engine"] == engine].reset_index(drop=True)
    names = FIT_PARAMS[engine]
    cols = [f"x_{k}" for k in names]
    meas = rows["value_s"].to_numpy(float)
    x = rows[cols].to_numpy(float)
    fit = (rows["split"] == "fit").to_numpy()
    kerns: dict[float | None, np.ndarray] = (
        {None: rows["kernels_s"].to_numpy(float)}
        if variants is None
        else {rate: v["kernels_s"].to_numpy(float) for rate, v in variants.items()}
    )

    def best(sel: np.ndarray) -> tuple[float | None, np.ndarray]:
        scored = [(_solve_cost(k, x, meas, sel), rate) for rate, k in kerns.items()]
        (theta, _), rate = min(scored, key=lambda t: t[0][1])
        return rate, theta

    def refit(train: np.ndarray) -> np.ndarray:
        rate_o, theta_o = best(train)
        return kerns[rate_o] + x @ theta_o

    rate, theta = best(fit)
    kern = kerns[rate]
    pred = kern + x @ theta
    lofo = held_out_by_family(rows, fit, pred, refit)
    a = ape(pred, meas)
    # below a nanosecond a parameter is the solver's zero, not a measured cost
    params = {
        k: (float(f"{v:.5g}") if v >= 1e-9 else 0.0) for k, v in zip(names, theta, strict=True)
    }
    error = _fit_errors(rows, a, fit, ape(lofo, meas), ape(kern, meas))
    if rate is not None:
        params["per_query_head_kv_bytes_per_s"] = float(f"{rate:.4g}")
        error["per_query_head_decode"] = (
            f"{int(per_query_head_rows(rows).sum())} rows decoded per query head "
            f"({RELEASE_GROUPED_DECODE_SOURCE}); re-read rate fitted on a log grid "
            f"{REREAD_GRID_BYTES_PER_S[0] / 1e12:.0f}-{REREAD_GRID_BYTES_PER_S[-1] / 1e12:.0f} "
            "TB/s with the overheads, refitted for every family held out"
        )
    return {
        "engine": engine,
        "params": params,
        "rows": rows.assign(
            kernels_s=kern, pred_s=pred, lofo_pred_s=lofo, ape=a, kernels_ape=ape(kern, meas)
        ),
        "error": error,
    }


def _fit_errors(
    rows: pd.DataFrame, a: np.ndarray, fit: np.ndarray, lofo_ape: np.ndarray, kern_ape: np.ndarray
) -> dict[str, Any]:
    """An engine fit's ``fit_error`` record: median and p90 APE over all rows, the fit rows,
    the held-out rows, each family refitted without it, and the kernels alone."""

    def stats(sel: np.ndarray, values: np.ndarray) -> dict[str, Any]:
        sel = sel & ~np.isnan(values)
        if not sel.any():
            return {"n": 0}
        v = values[sel]
        return {
            "n": int(sel.sum()),
            "median_ape": round(float(np.median(v)), 5),
            "p90_ape": round(float(np.percentile(v, 90)), 5),
        }

    every = np.ones(len(rows), bool)
    return {
        "all": stats(every, a),
        "fit": stats(fit, a),
        "holdout": stats(~fit, a),
        "held_out_by_family": stats(every, lofo_ape),
        "kernels_only": stats(every, kern_ape),
        "sources": sorted(set(rows["source"])),
    }


def no_small_m_floor(gpu: str) -> MoeParams:
    """The shipped MoE kernel parameters of ``gpu`` with the grouped GEMM's small-m compute
    floor removed (``half_sat`` → 0: every routed expert runs at ``max_eff`` of peak FLOPs
    or streams its weights at ``mem_eff`` of HBM, whichever is longer). Not shipped: a
    diagnostic of :func:`moe_floor_check`."""
    p = load_moe_params(gpu)
    gg = {k: replace(v, half_sat=0.0) for k, v in p.grouped_gemm.items()}
    fws = {
        fw: {k: replace(v, half_sat=0.0) for k, v in sets.items()}
        for fw, sets in p.grouped_gemm_frameworks.items()
    }
    return replace(p, grouped_gemm=gg, grouped_gemm_frameworks=fws)


def uncarried(gpu: str) -> MoeParams:
    """The shipped MoE kernel parameters of ``gpu`` used as fitted on the H100, without
    :func:`disaggsim.costmodel.moe.carry_half_sat` (the grouped GEMM's ``half_sat`` not
    scaled by the machine balance): the rule before the carry. Not shipped: a diagnostic
    of :func:`moe_floor_check`."""
    return replace(load_moe_params(gpu), transferred_from="")


def moe_floor_check(path: Path = MEASUREMENTS) -> pd.DataFrame:
    """The ``vllm`` rows of MoE models (all held out): measured over predicted with the
    shipped profiles, with the H100's grouped-GEMM parameters used uncarried
    (:func:`uncarried`), and with the grouped GEMM's small-m compute floor removed
    (:func:`no_small_m_floor`), the shipped ``vllm`` overheads on each. The floor,
    ``FLOP / (peak × max_eff × t / (t + half_sat))`` at ``t`` tokens per touched expert,
    is a budget of about ``half_sat`` tokens of FLOPs per expert, fitted on the H100
    (``disaggsim/hardware/moe/h100_sxm.json``). Used unscaled on the A100 (a third of the
    FLOPs, 0.61x the bandwidth) and the H200 (the same FLOPs, 1.43x the bandwidth) it is
    longer than the weight read there; the shipped rule scales ``half_sat`` by the machine
    balance (docs/calibration.md, "MoE kernels on other GPUs")."""
    pts = read_measurements(path)
    pts = pts[pts["engine"] == "vllm"].reset_index(drop=True)
    moe = np.array([not get_model(str(m)).is_dense for m in pts["model"]])
    pts = pts[moe].reset_index(drop=True)
    eng = load_engines()["vllm"]
    theta = np.array([getattr(eng, k) for k in PARAM_KEYS])
    cols = [f"x_{k}" for k in PARAM_KEYS]
    out = pts[["source", "model", "gpu", "tp", "batch", "isl", "osl", "split", "value_s"]].copy()
    for name, mp in MOE_CHECK_VARIANTS:
        f = features(pts, moe_params=mp)
        out[f"kernels_{name}_s"] = f["kernels_s"].to_numpy(float)
        out[f"pred_{name}_s"] = f["kernels_s"].to_numpy(float) + f[cols].to_numpy(float) @ theta
        out[f"measured_over_{name}"] = out["value_s"] / out[f"pred_{name}_s"]
    return out


# moe_floor_check's columns: the shipped rule, the H100 fit uncarried, no small-m floor
MOE_CHECK_VARIANTS = (("shipped", None), ("uncarried", uncarried), ("no_floor", no_small_m_floor))


EAGER_ENGINE = "vllm-eager-2023"
# the 2023 engine's kernels without its host time (its framework's attention kernels:
# engines.ENGINE_FRAMEWORKS), as features() costs its rows
EAGER_KERNELS = replace(ZERO_ENGINE, name=EAGER_ENGINE)
# the form vllm-eager-2023 ships (eager_forms' names), and the engine-profile field each of
# its parameters is
EAGER_SHIPPED_FORM = "overlap"
# the rule among equal-cost fits of a launch floor no fit row binds (_floor_rule)
EAGER_UNBOUND_FLOOR = "sup"
EAGER_UNBOUND_FLOOR_RULES = ("sup", "zero")
# the range a machine's host speed factor is searched in (host time over the fit host's)
HOST_SCALE_BOUNDS = (0.1, 3.0)
EAGER_PROFILE_FIELDS = {
    "per_iteration_s": "per_iteration_s",
    "per_token_s": "per_token_s",
    "launch_per_layer_s": "launch_per_layer_s",
    "sync_per_layer_tp_s": "per_layer_tp_s",
}


def fit_eager(
    rows: pd.DataFrame,
    profile: HardwareProfile | None = None,
    unbound: str = EAGER_UNBOUND_FLOOR,
    kernels: EngineProfile = EAGER_KERNELS,
) -> dict[str, Any]:
    """``vllm-eager-2023``'s fit (the rows of :func:`features` for it): the overlap form of
    :func:`eager_forms` — per layer the longer of the kernels and the host's launches, plus
    per iteration, per token and, with TP > 1, per layer — fitted by least squares of the
    relative error on the fit rows, as :func:`fit_engine_linear` reports a linear fit (each
    (source, model, GPU, TP) family refitted without it). ``params`` are engine-profile
    fields (:data:`EAGER_PROFILE_FIELDS`); the step model runs them as fitted
    (:func:`step_model_pred`). ``unbound``: the rule for a launch floor no fit row binds
    (:func:`_floor_rule`; it decides only refits without a family). ``kernels``: the
    zero-overhead engine profile the rows' kernels run with (a diagnostic may give another
    decode kernel coverage: :func:`eager_per_query_head_check`)."""
    form = EAGER_SHIPPED_FORM
    p = eager_parts(REPO, profile, rows[list(COLUMNS)], kernels)
    d = _form_inputs(p)
    meas = d["meas"]
    fit = (rows["split"] == "fit").to_numpy()
    gpus = rows["gpu"].astype(str).to_numpy()

    def fitted(train: np.ndarray) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        # the host terms on the fit host's rows, then each other machine's host speed
        th = _fit_eager_form(form, d, train & (gpus == EAGER_GPU), unbound)
        sc = _fit_host_scales(form, th, d, gpus, train)
        host = np.array([sc.get(g, 1.0) for g in gpus])
        return th, sc, _eager_host_pred(form, th, d, host)

    theta, scales, pred = fitted(fit)
    lofo = held_out_by_family(rows, fit, pred, lambda train: fitted(train)[2])
    kern = rows["kernels_s"].to_numpy(float)
    a = ape(pred, meas)
    params = dict.fromkeys(PARAM_KEYS, 0.0)
    for name, v in zip(_EAGER_FORM_PARAMS[form], theta, strict=True):
        params[EAGER_PROFILE_FIELDS[name]] = float(f"{v:.5g}") if v >= 1e-9 else 0.0
    return {
        "engine": EAGER_ENGINE,
        "params": params,
        "host_scale": {g: float(f"{v:.5g}") for g, v in sorted(scales.items())},
        "rows": rows.assign(
            kernels_s=kern, pred_s=pred, lofo_pred_s=lofo, ape=a, kernels_ape=ape(kern, meas)
        ),
        "error": _fit_errors(rows, a, fit, ape(lofo, meas), ape(kern, meas)),
    }


def step_model_pred(
    points: pd.DataFrame,
    engine: EngineProfile,
    profiles: dict[str, HardwareProfile] | None = None,
    reread_bytes_per_s: float | None = None,
) -> np.ndarray:
    """Each point predicted by the step model itself with ``engine``'s overheads (the
    kernels as :func:`features` runs them: the release's decode kernels, ``engine``'s
    re-read rate unless ``reread_bytes_per_s`` is given): what a simulation of the
    measured work takes. A static batch sums its decode steps one by one."""
    profiles = dict(profiles or {})
    rate = (
        engine.per_query_head_kv_bytes_per_s if reread_bytes_per_s is None else reread_bytes_per_s
    )
    workers: dict[tuple, Any] = {}
    out = np.zeros(len(points))
    overheads = {k: getattr(engine, k) for k in (*PARAM_KEYS, "launch_per_layer_s")}
    for i, r in enumerate(points.to_dict("records")):
        gpu = str(r["gpu"])
        if gpu not in profiles:
            profiles[gpu] = load_profile(gpu)
        key = (str(r["model"]), gpu, int(r["tp"]), str(r["weight_dtype"]), str(r["kv_dtype"]),
               str(r["source"]))  # fmt: skip
        if key not in workers:
            eng = replace(
                kernel_engine(str(r["engine"]), key[5], rate),
                name=engine.name,
                cuda_graphs=engine.cuda_graphs,
                host_scale=engine.host_scale,
                **overheads,
            )
            workers[key] = build_worker_cost(
                key[0], gpu, key[2], weight_dtype=key[3], kv_dtype=key[4], engine=eng,
                profile=profiles[gpu], gpu_mem_util=1.0, activation_reserve_bytes=0.0,
            )  # fmt: skip
        w = workers[key]
        b, isl, osl = int(r["batch"]), int(r["isl"]), int(r["osl"])
        metric = r["metric"]
        if metric in ("batch_latency_s", "ttft_s", "prefill_step_s"):
            t = w.prefill_time_s(b, b * isl, b * isl * (isl + 1) / 2.0)
            if metric == "batch_latency_s":
                t += sum(w.decode_time_s(b, b * (isl + j)) for j in range(1, osl))
        elif metric in ("itl_s", "decode_step_s"):
            t = w.decode_time_s(b, int(b * (isl + osl / 2.0)))
        else:  # decode_ctx_step_s: DistServe's context per sequence in isl
            t = w.decode_time_s(b, b * isl)
        out[i] = t
    return out


def fit_all(data_root: Path | None, profiles: dict[str, HardwareProfile] | None = None):
    """Every engine's fit (:func:`fit_engine`) on :func:`all_points`, the per-query-head
    re-read rate included where a release decoded some layout per query head."""
    points = all_points(data_root)
    feat = features(points, profiles)
    return {
        e: fit_engine(feat, e, reread_variants(points, feat, e, profiles)) for e in ENGINE_NAMES
    }


def engines_dict(fits: dict[str, Any]) -> dict[str, Any]:
    """The ``engines.json`` document from :func:`fit_all`'s result."""
    engines: dict[str, Any] = {}
    for name in ENGINE_NAMES:
        f = fits[name]
        engines[name] = {
            **{k: f["params"].get(k, 0.0) for k in (*PARAM_KEYS, "launch_per_layer_s")},
            "cuda_graphs": name != "vllm-eager-2023",
            "attention_backend": ENGINE_ATTENTION.get(name, "auto"),
            # the shipped profiles model current releases (ENGINE_GROUPED_DECODE)
            "grouped_decode_q_per_kv": (
                list(ENGINE_GROUPED_DECODE[name]) if name in ENGINE_GROUPED_DECODE else None
            ),
            "per_query_head_kv_bytes_per_s": f["params"].get("per_query_head_kv_bytes_per_s", 0.0),
            "per_query_head_decode_backend": ENGINE_PER_QUERY_HEAD_BACKEND.get(name),
            "fp8_gemm_kernel": ENGINE_FP8_GEMM.get(name),
            "host_scale": f.get("host_scale", {}),
            "description": DESCRIPTIONS[name],
            "fit_error": f["error"],
        }
    doc = {
        "schema_version": ENGINES_SCHEMA_VERSION,
        "engines": engines,
        "provenance": {
            "source": "calibration/engines.py: non-negative least squares (relative error) of "
            "the overhead parameters over public end-to-end measurements (vllm-eager-2023: "
            "its launch floor, a max over kernels and launches, by bounded least squares, "
            "fit_eager), kernels from the shipped hardware profiles",
            "data": "calibration/engine_data/measurements.csv; kernels/distserve/"
            f"{FILES[EAGER_FILE]} (vllm-eager-2023)",
            "command": "python -m calibration.fit_public --data ../shared/data --engines",
        },
    }
    engines_from_dict(doc, "<engines being written>")
    return doc


def write_engines(data_root: Path | None, out_dir: str | None = None) -> Path:
    doc = engines_dict(fit_all(data_root))
    path = (Path(out_dir) / "engines.json") if out_dir else shipped_engines_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# --- vllm-eager-2023: which overhead structure the 2023 curves support -----------------
# Two structures of an eager engine's host time, each fitted to the same fit rows and
# scored like the shipped fit (all rows, fit, held out, refit without each family):
#   additive — the shipped form until 2026-12-02: kernels + per iteration + per token + per
#              layer with TP > 1;
#   overlap  — an eager engine launches kernels asynchronously, so per layer the GPU waits
#              for the longer of its kernels and the host's launches, plus a non-overlapped
#              per-layer cost with TP > 1 (the ranks meet at every all-reduce):
#              per_iteration + per_token × tokens + layers × (max(kernels per layer,
#              launch per layer) + sync per layer × [tp > 1]) + LM head.
# The overlap form is a max over kernels and host time: at fixed batch a decode step is the
# longer of the kernels' line in the context and the launches' constant line, which the
# engine's two decode lines take (WorkerCost.decode_item_coeffs). It ships since
# 2026-12-02 (fit_eager, EAGER_SHIPPED_FORM); the additive form is the earlier shipped one.
EAGER_FORMS = ("additive", "overlap")
EAGER_FORM_STARTS = 8  # deterministic multi-start of the non-smooth overlap fit
# the overlap form with the prefill kernels scaled by (1 + s): the one form found that fits
# every DistServe family within the p90 target in sample (not one of EAGER_FORMS' defaults)
EAGER_OVERLAP_PREFILL = "overlap-prefill"
# the overlap form with the per-layer sync hidden behind the kernels too (per layer the
# longer of the kernels and launch + sync): the form Splitwise's measurements point to
# (second_source_check), not one of EAGER_FORMS' defaults
EAGER_OVERLAP_HIDDEN = "overlap-hidden"
_EAGER_FORM_PARAMS = {
    "additive": ("per_iteration_s", "per_token_s", "per_layer_tp_s"),
    "overlap": ("per_iteration_s", "per_token_s", "launch_per_layer_s", "sync_per_layer_tp_s"),
    EAGER_OVERLAP_PREFILL: (
        "per_iteration_s", "per_token_s", "launch_per_layer_s", "sync_per_layer_tp_s",
        "prefill_kernel_scale",
    ),
    EAGER_OVERLAP_HIDDEN: (
        "per_iteration_s", "per_token_s", "launch_per_layer_s", "sync_per_layer_tp_s",
    ),
}  # fmt: skip
# starting scale of each parameter (seconds; the prefill scale a fraction)
_EAGER_FORM_X0 = np.array([1e-2, 1e-4, 6e-4, 6e-4, 0.6])


PREFILL_METRICS = ("prefill_step_s", "ttft_s")  # one prefill step (plus its iteration)


def eager_parts(
    data_root: Path,
    profile: HardwareProfile | None = None,
    points: pd.DataFrame | None = None,
    kernels: EngineProfile = EAGER_KERNELS,
) -> pd.DataFrame:
    """DistServe's 2023-vLLM points (or ``points``: rows of the ``vllm-eager-2023`` frame,
    e.g. Splitwise's) with the kernel time split into the per-layer part (GEMMs, attention,
    element-wise, all-reduce: ``layer_kernels_s``, all layers; each part apart in
    ``gemm_s``, ``attention_s``, ``elementwise_s``, ``allreduce_s``) and the rest
    (``lm_head_s``), from the step model with no engine overhead; ``hidden`` is the
    model's hidden size. A decode row's context per sequence is ``isl`` for DistServe's
    steps and the mean ``isl + osl / 2`` for a mean time between tokens, as
    :func:`features` costs them. ``kernels``: the zero-overhead engine profile the kernels
    run with (default the 2023 engine's, :data:`EAGER_KERNELS`)."""
    pts = (eager_points(data_root) if points is None else points).reset_index(drop=True)
    # each row on its own GPU's profile (``profile`` stands for the A100's, where DistServe's
    # curves were measured): Splitwise measured the engine on DGX-H100 as well
    profs: dict[str, HardwareProfile] = {EAGER_GPU: profile} if profile is not None else {}
    workers: dict[tuple[str, str, int, str, str], Any] = {}
    out = np.zeros((len(pts), 9))
    for i, r in enumerate(pts.to_dict("records")):
        gpu = str(r.get("gpu", EAGER_GPU))
        key = (gpu, str(r["model"]), int(r["tp"]), str(r["weight_dtype"]), str(r["kv_dtype"]))
        if key not in workers:
            if gpu not in profs:
                profs[gpu] = load_profile(gpu)
            workers[key] = build_worker_cost(
                key[1], gpu, key[2], weight_dtype=key[3], kv_dtype=key[4], engine=kernels,
                profile=profs[gpu], gpu_mem_util=1.0, activation_reserve_bytes=0.0,
            )  # fmt: skip
        w = workers[key]
        b, n = int(r["batch"]), int(r["isl"])
        if r["metric"] in PREFILL_METRICS:
            bd = w.breakdown(
                prefill_seqs=b, prefill_tokens=b * n, prefill_attn_pairs=b * n * (n + 1) / 2
            )
            tokens = b * n
        else:
            ctx = b * n if r["metric"] == "decode_ctx_step_s" else int(b * (n + r["osl"] / 2.0))
            bd = w.breakdown(decode_batch=b, decode_context_tokens=ctx)
            tokens = b
        layer = bd.gemm_s + bd.attention_s + bd.elementwise_s + bd.allreduce_s
        out[i] = (
            layer, bd.lm_head_s, tokens, w.model.num_layers, bd.gemm_s, bd.attention_s,
            bd.elementwise_s, bd.allreduce_s, w.model.hidden,
        )  # fmt: skip
    return pts.assign(
        layer_kernels_s=out[:, 0], lm_head_s=out[:, 1], tokens=out[:, 2], num_layers=out[:, 3],
        gemm_s=out[:, 4], attention_s=out[:, 5], elementwise_s=out[:, 6], allreduce_s=out[:, 7],
        hidden=out[:, 8],
    )  # fmt: skip


def _eager_form_pred(form: str, theta: np.ndarray, d: dict[str, np.ndarray]) -> np.ndarray:
    layers, multi = d["layers"], d["multi"]
    if form == "additive":
        per_iter, per_token, per_layer_tp = theta
        return (
            d["layer_k"] + d["lm"] + per_iter + per_token * d["tokens"]
            + layers * per_layer_tp * multi
        )  # fmt: skip
    per_iter, per_token, launch, sync = theta[:4]
    if form == EAGER_OVERLAP_HIDDEN:
        return (
            per_iter + per_token * d["tokens"] + d["lm"]
            + layers * np.maximum(d["layer_k"] / layers, launch + sync * multi)
        )  # fmt: skip
    layer_k = d["layer_k"] * (1.0 + theta[4] * d["pre"]) if len(theta) > 4 else d["layer_k"]
    return (
        per_iter + per_token * d["tokens"] + d["lm"]
        + layers * (np.maximum(layer_k / layers, launch) + sync * multi)
    )  # fmt: skip


def _eager_host_pred(
    form: str, theta: np.ndarray, d: dict[str, np.ndarray], host: np.ndarray
) -> np.ndarray:
    """:func:`_eager_form_pred` with every host term of each row times ``host`` (per row:
    the speed of that row's machine's host over the fit host's, 1 on the fit host)."""
    return _eager_form_pred(form, np.asarray(theta, float)[:, None] * host[None, :], d)


def _fit_host_scales(
    form: str, theta: np.ndarray, d: dict[str, np.ndarray], gpus: np.ndarray, train: np.ndarray
) -> dict[str, float]:
    """Per GPU other than :data:`EAGER_GPU` with ``train`` rows, the one factor of the host
    terms ``theta`` (fitted on the fit host) that minimises those rows' squared relative
    error: the speed of that machine's host (a bounded scalar search, deterministic)."""
    out: dict[str, float] = {}
    for g in sorted(set(gpus[train]) - {EAGER_GPU}):
        sel = train & (gpus == g)

        def cost(x: float, sel: np.ndarray = sel) -> float:
            r = _eager_form_pred(form, theta * x, d)[sel] / d["meas"][sel] - 1.0
            return float(np.sum(r * r))

        res = minimize_scalar(
            cost, bounds=HOST_SCALE_BOUNDS, method="bounded", options={"xatol": 1e-7}
        )
        out[g] = float(res.x)
    return out


def _form_inputs(p: pd.DataFrame) -> dict[str, np.ndarray]:
    """The arrays :func:`_eager_form_pred` reads, from :func:`eager_parts`' frame."""
    return {
        "layer_k": p["layer_kernels_s"].to_numpy(float),
        "lm": p["lm_head_s"].to_numpy(float),
        "tokens": p["tokens"].to_numpy(float),
        "layers": p["num_layers"].to_numpy(float),
        "multi": (p["tp"].to_numpy(int) > 1).astype(float),
        "meas": p["value_s"].to_numpy(float),
        "pre": p["metric"].isin(PREFILL_METRICS).to_numpy(float),
    }


def _fit_eager_form(
    form: str, d: dict[str, np.ndarray], sel: np.ndarray, unbound: str = EAGER_UNBOUND_FLOOR
) -> np.ndarray:
    """``form``'s parameters fitted to the rows of ``sel`` (least squares of the relative
    error, :data:`EAGER_FORM_STARTS` deterministic starts, the cheapest kept); a launch
    floor that no row of ``sel`` binds is set by the rule ``unbound`` (:func:`_floor_rule`)."""
    meas = d["meas"]
    n = len(_EAGER_FORM_PARAMS[form])
    # parameters in units of 1e-4 s (the prefill scale in units of 0.1)
    unit = np.array([1e-4, 1e-4, 1e-4, 1e-4, 0.1])[:n]
    starts = np.random.default_rng(0).uniform(0.0, 1.0, (EAGER_FORM_STARTS, n))
    best = None
    for s in starts:
        x0 = s * _EAGER_FORM_X0[:n]
        res = least_squares(
            lambda t: _eager_form_pred(form, t * unit, d)[sel] / meas[sel] - 1.0,
            x0 / unit,
            bounds=(0.0, np.inf),
        )
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return _floor_rule(form, np.asarray(best.x, float) * unit, d, sel, unbound)


def _floor_headroom(form: str, theta: np.ndarray, d: dict[str, np.ndarray]) -> np.ndarray:
    """Per row, the largest launch per layer that leaves the row's prediction as it is
    (the floor at most the layer's kernels, less the per-layer sync where the form hides
    the sync behind them too)."""
    per_layer = d["layer_k"] / d["layers"]
    if form == EAGER_OVERLAP_PREFILL:
        per_layer = per_layer * (1.0 + theta[4] * d["pre"])
    if form == EAGER_OVERLAP_HIDDEN:
        per_layer = per_layer - theta[3] * d["multi"]
    return per_layer


def _floor_rule(
    form: str, theta: np.ndarray, d: dict[str, np.ndarray], sel: np.ndarray, rule: str
) -> np.ndarray:
    """The launch floor of a fit whose floor binds none of the fit rows (``sel``): every
    launch from 0 to the smallest row headroom (:func:`_floor_headroom`) then predicts the
    fit rows alike, so the fit's cost is the same for all of them and the solver's pick is
    arbitrary (it turns on cost differences beyond the sixth decimal). ``rule`` picks one:
    ``sup``, the largest floor the fit rows allow (the shipped rule: an eager engine has a
    floor, and rows that do not bind it bound it only from above); ``zero``, no floor.
    Other fits are returned as they are."""
    if form == "additive":
        return theta
    if rule not in EAGER_UNBOUND_FLOOR_RULES:
        raise ValueError(f"unbound floor rule {rule!r} (allowed: {EAGER_UNBOUND_FLOOR_RULES})")
    head = _floor_headroom(form, theta, d)[sel]
    # the floor binds a fit row (beyond the solver's rounding, 1e-6): identified
    if (theta[2] > head * (1.0 + 1e-6)).any():
        return theta
    out = theta.copy()
    out[2] = max(float(head.min()), 0.0) if rule == "sup" else 0.0
    return out


def eager_forms(
    data_root: Path,
    profile: HardwareProfile | None = None,
    forms: tuple[str, ...] = EAGER_FORMS,
) -> dict[str, Any]:
    """Each of ``forms`` (:data:`EAGER_FORMS`, or :data:`EAGER_OVERLAP_PREFILL`) fitted to
    the ``vllm-eager-2023`` fit rows: its parameters (seconds; the prefill scale a
    fraction), per-row APE (``ape``; ``lofo_ape`` from a refit without the row's (model, TP)
    family) and their summaries (all rows, fit, held out, refit without each family), as
    :func:`fit_engine` reports the shipped fit, plus the form fitted to every family
    (``every_ape`` and its summary ``every_family_in_sample``)."""
    p = eager_parts(data_root, profile)
    d = _form_inputs(p)
    fit = (p["split"] == "fit").to_numpy()
    fam = (p["model"] + "|" + p["tp"].astype(str)).to_numpy()
    out: dict[str, Any] = {}
    for form in forms:
        theta = _fit_eager_form(form, d, fit)
        a = ape(_eager_form_pred(form, theta, d), d["meas"])
        lofo = np.empty(len(p))
        for f in np.unique(fam):
            test = fam == f
            t_o = _fit_eager_form(form, d, fit & ~test)
            lofo[test] = ape(_eager_form_pred(form, t_o, d), d["meas"])[test]
        names = _EAGER_FORM_PARAMS[form]
        # every family fitted, the held-out ones included: what the form reaches at all
        every_ape = ape(
            _eager_form_pred(form, _fit_eager_form(form, d, np.ones(len(p), bool)), d), d["meas"]
        )
        out[form] = {
            "params": dict(zip(names, (float(f"{v:.4g}") for v in theta), strict=True)),
            "ape": a,
            "lofo_ape": lofo,
            "fit_rows": fit,
            **{
                part: _stats(a[sel] if part != "held_out_by_family" else lofo[sel])
                for part, sel in (
                    ("all", np.ones(len(p), bool)),
                    ("fit", fit),
                    ("holdout", ~fit),
                    ("held_out_by_family", np.ones(len(p), bool)),
                )
            },
            "every_ape": every_ape,
            "every_family_in_sample": _stats(every_ape),
        }
    return out


def splitwise_points(path: Path = MEASUREMENTS) -> pd.DataFrame:
    """The Splitwise rows of the measurements (:func:`splitwise_rows`), as read."""
    df = read_measurements(path)
    return df[df["source"] == SPLITWISE_SOURCE].reset_index(drop=True)


SECOND_SOURCE_TPS = (2, 4, 8)


def splitwise_batch1(data_root: Path | None) -> pd.DataFrame:
    """Splitwise's batch-1 rows (decode steps after each prompt length, the first token of
    each prompt) with the kernel time and the shipped profile's prediction, in ms: where
    2023 vLLM's host time shows (the step minus its kernels)."""
    r = fit_all(data_root)["vllm-eager-2023"]["rows"]
    r = r[(r["source"] == SPLITWISE_SOURCE) & (r["batch"] == 1)]
    out = r[["tp", "metric", "isl"]].assign(
        measured_ms=r["value_s"] * 1e3,
        kernels_ms=r["kernels_s"] * 1e3,
        shipped_ms=r["pred_s"] * 1e3,
        measured_minus_kernels_ms=(r["value_s"] - r["kernels_s"]) * 1e3,
    )
    return out.sort_values(["metric", "tp", "isl"]).reset_index(drop=True)


def second_source_check(
    data_root: Path,
    profile: HardwareProfile | None = None,
    forms: tuple[str, ...] = (*EAGER_FORMS, EAGER_OVERLAP_HIDDEN),
) -> list[dict[str, Any]]:
    """Splitwise's 2023-vLLM measurements (:func:`splitwise_rows`) as a held-out check of
    each eager form (:data:`EAGER_FORMS` and :data:`EAGER_OVERLAP_HIDDEN`): first fitted on DistServe's fit families alone
    (the additive form's fit is the shipped one) and scored on every Splitwise row, per TP
    and phase; then fitted on DistServe's fit families plus Splitwise's rows of all but one
    TP and scored on that TP's rows (and on DistServe's held-out families). One record per
    (form, what it was fitted on, rows scored): ``n``, ``median_ape``, ``p90_ape``, the
    per-row ``ape`` and the fitted ``params`` (seconds)."""
    ds = eager_points(data_root)
    sw = splitwise_points()
    if sw.empty:
        raise UserError(f"{MEASUREMENTS}: no {SPLITWISE_SOURCE} rows")
    pts = pd.concat([ds, sw], ignore_index=True)
    p = eager_parts(data_root, profile, pts)
    d = _form_inputs(p)
    is_sw = (p["source"] == SPLITWISE_SOURCE).to_numpy()
    fit_ds = ~is_sw & (p["split"] == "fit").to_numpy()
    held_ds = ~is_sw & ~fit_ds
    tp = p["tp"].to_numpy(int)
    pre = d["pre"].astype(bool)
    out: list[dict[str, Any]] = []

    def record(form: str, fitted: str, rows: str, sel: np.ndarray, a: np.ndarray, th) -> None:
        out.append(
            {
                "form": form,
                "fitted_on": fitted,
                "rows": rows,
                **_stats(a[sel]),
                "ape": a[sel],
                "params": dict(zip(_EAGER_FORM_PARAMS[form], (float(v) for v in th), strict=True)),
            }
        )

    for form in forms:
        th = _fit_eager_form(form, d, fit_ds)
        a = ape(_eager_form_pred(form, th, d), d["meas"])
        fitted = "DistServe fit families"
        record(form, fitted, "DistServe, all rows", ~is_sw, a, th)
        record(form, fitted, "DistServe held-out families", held_ds, a, th)
        record(form, fitted, "Splitwise, all rows (held out)", is_sw, a, th)
        for t in SECOND_SOURCE_TPS:
            for phase, ph in (("prefill", pre), ("decode", ~pre)):
                record(form, fitted, f"Splitwise TP{t} {phase} (held out)", is_sw & (tp == t) & ph, a, th)  # fmt: skip
        for t in SECOND_SOURCE_TPS:
            th2 = _fit_eager_form(form, d, fit_ds | (is_sw & (tp != t)))
            a2 = ape(_eager_form_pred(form, th2, d), d["meas"])
            fitted = f"DistServe fit families + Splitwise without TP{t}"
            record(form, fitted, f"Splitwise TP{t} (held out)", is_sw & (tp == t), a2, th2)
            record(form, fitted, "DistServe held-out families", held_ds, a2, th2)
    return out


HOST_SCALE_GRID = tuple(float(x) for x in np.round(np.arange(0.30, 1.301, 0.01), 2))


def eager_host_check(data_root: Path | None) -> dict[str, Any]:
    """Why ``vllm-eager-2023``'s host terms, fitted on DGX-A100 rows alone, miss Splitwise's
    DGX-H100 rows, and what one host speed does (the shipped ``host_scale`` is fitted by
    :func:`fit_eager`; this is the check behind it). Three numbers: the same configuration
    measured on both DGXs (``ratio``: H100 over A100 per matched row, by phase, TP and
    batch), the A100-fitted terms' error on each GPU's rows as they are (``shipped``: no
    host factor), and the error with every host term scaled by the grid value with the
    least median error on the H100 rows (in sample: whether one host speed explains it)."""
    fit = fit_all(data_root)[EAGER_ENGINE]
    names = _EAGER_FORM_PARAMS[EAGER_SHIPPED_FORM]
    theta = np.array([fit["params"][EAGER_PROFILE_FIELDS[k]] for k in names])
    df = read_measurements()
    sw = df[df["source"].isin([SPLITWISE_SOURCE, SPLITWISE_H100_SOURCE])].reset_index(drop=True)
    d = _form_inputs(eager_parts(REPO, None, sw))
    h100 = (sw["source"] == SPLITWISE_H100_SOURCE).to_numpy()

    def stats(scale: float, sel: np.ndarray) -> tuple[float, float]:
        a = ape(_eager_form_pred(EAGER_SHIPPED_FORM, theta * scale, d), d["meas"])[sel]
        return float(np.median(a)), float(np.percentile(a, 90))

    best = min(HOST_SCALE_GRID, key=lambda s: stats(s, h100)[0])
    key = ["metric", "tp", "batch", "isl"]
    m = sw.pivot_table(index=key, columns="gpu", values="value_s").dropna().reset_index()
    m["ratio"] = m["h100-sxm"] / m["a100-80gb"]
    return {
        "ratio": m,
        "shipped": {"a100-80gb": stats(1.0, ~h100), "h100-sxm": stats(1.0, h100)},
        "host_scale": best,
        "scaled_h100": stats(best, h100),
    }


# decode batch bands of eager_regimes (a prefill row's band is its batch of prompts')
EAGER_REGIME_BATCHES = ((1, 8), (16, 64), (65, 256))
# APE above which a row counts against the p90 target (docs/validation.md: p90 <= 15%)
EAGER_REGIME_MISS = 0.15


def eager_regimes(
    rows: pd.DataFrame, by: tuple[str, ...] = ("source", "model", "tp")
) -> pd.DataFrame:
    """The rows of :func:`fit_eager` (``rows``: measurements with ``pred_s``) split by regime:
    ``by`` plus the phase (``prefill``: one prefill step or a first-token latency;
    ``decode``) and the batch band (:data:`EAGER_REGIME_BATCHES`). Per group the row count,
    measured / predicted (median, min, max), median and p90 APE and how many rows err more
    than :data:`EAGER_REGIME_MISS`: where the form misses and in which direction."""
    r = rows.reset_index(drop=True)
    b = r["batch"].to_numpy(int)
    band = np.full(len(r), "", dtype=object)
    for lo, hi in EAGER_REGIME_BATCHES:
        band[(b >= lo) & (b <= hi)] = f"{lo}-{hi}"
    out = r.assign(
        phase=np.where(r["metric"].isin(PREFILL_METRICS), "prefill", "decode"),
        batches=band,
        ratio=r["value_s"] / r["pred_s"],
        ape=ape(r["pred_s"].to_numpy(float), r["value_s"].to_numpy(float)),
    )
    g = out.groupby([*by, "phase", "batches"], sort=True)
    return g.agg(
        n=("ratio", "size"),
        measured_over_predicted=("ratio", "median"),
        lowest=("ratio", "min"),
        highest=("ratio", "max"),
        median_ape=("ape", "median"),
        p90_ape=("ape", lambda a: float(np.percentile(a, 90))),
        above_miss=("ape", lambda a: int((a > EAGER_REGIME_MISS).sum())),
    ).reset_index()


# the columns that make one configuration measured at several TPs (the TP curves of one
# source, model, metric and workload)
TP_CURVE_KEYS = ("source", "gpu", "model", "metric", "batch", "isl", "osl")


def tp_consistency(rows: pd.DataFrame) -> pd.DataFrame:
    """Whether a configuration's times at three TPs ``a < b < c`` (``rows``: measurements
    with ``value_s`` and ``pred_s``, one row per TP of a :data:`TP_CURVE_KEYS` group) can come
    from one engine whose time is sharded work over TP plus the rest:
    ``T(tp) = A / tp + B(tp)`` with ``A >= 0`` and ``B`` non-negative and non-decreasing in
    TP (host time, replicated element-wise work, launch costs stay; all-reduce steps grow).
    Then ``A <= a T(a)`` and ``B(c) >= B(b) = T(b) - A / b``, so
    ``T(c) >= T(b) - a T(a) (1 / b - 1 / c)``: ``bound_s``. Per triple the bound and
    ``ratio`` = T(c) / bound (below 1: the three curves contradict every such decomposition,
    whatever its kernels, so no form of that kind fits all three), measured and predicted
    (``pred_ratio``; the step model is of that kind). What it assumes: GEMM and attention
    efficiencies no better at a smaller per-GPU share, and no cost that falls with TP but
    not as 1 / TP (memory pressure easing with more GPUs would be one)."""
    out = []
    keys = list(TP_CURVE_KEYS)
    for key, g in rows.groupby(keys, sort=True):
        tps = g["tp"].to_numpy(int)
        t = dict(zip(tps, g["value_s"].to_numpy(float), strict=True))
        p = dict(zip(tps, g["pred_s"].to_numpy(float), strict=True))
        order = sorted(t)
        for i, a in enumerate(order):
            for j in range(i + 1, len(order)):
                for c in order[j + 1 :]:
                    b = order[j]
                    span = a * (1.0 / b - 1.0 / c)
                    bound = t[b] - t[a] * span
                    pred_bound = p[b] - p[a] * span
                    out.append(
                        {
                            **dict(zip(keys, cast(tuple, key), strict=True)),
                            "tp_a": a,
                            "tp_b": b,
                            "tp_c": c,
                            "tc_s": t[c],
                            "bound_s": bound,
                            "ratio": t[c] / bound,
                            "pred_ratio": p[c] / pred_bound,
                        }
                    )
    return pd.DataFrame(out)


def tp_inconsistent_rows(rows: pd.DataFrame, triples: pd.DataFrame) -> np.ndarray:
    """Per row of ``rows``, whether it is one of the three TPs of a triple of ``triples``
    (:func:`tp_consistency`) whose ratio is below 1."""
    bad = triples[triples["ratio"] < 1.0]
    keys = list(TP_CURVE_KEYS)
    marks = set()
    for r in bad.to_dict("records"):
        base = tuple(r[k] for k in keys)
        marks |= {(*base, int(r[f"tp_{x}"])) for x in "abc"}
    own = zip(*(rows[k].to_numpy() for k in keys), rows["tp"].to_numpy(int), strict=True)
    return np.array([tuple(v) in marks for v in own], dtype=bool)


def splitwise_run_spread(gpu: str) -> pd.DataFrame:
    """Per TP and prompt length, the spread of Splitwise's five single-prompt
    ``prompt_time`` runs on ``gpu``'s DGX: (max - min) / median, from the transcription
    (:data:`SPLITWISE_FILES`). Kernel times repeat to about 1 %; a wider spread is time
    that varies from run to run (host, allocator, synchronisation)."""
    if gpu not in SPLITWISE_FILES:
        raise UserError(f"Splitwise GPU {gpu!r} (allowed: {', '.join(SPLITWISE_FILES)})")
    path = SPLITWISE_FILES[gpu][0]
    try:
        raw = pd.read_csv(regular_file(path, UserError, "Splitwise CSV"))
    except (OSError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    one = raw[raw["batch_size"] == 1]
    g = one.groupby(["tensor_parallel", "prompt_size"])["prompt_time"]
    spread = (g.max() - g.min()) / g.median()
    return (
        spread.rename("run_spread")
        .reset_index()
        .rename(columns={"tensor_parallel": "tp", "prompt_size": "isl"})
    )


# the TP pair whose single-prompt times split a first-token latency into a sharded and an
# unsharded part (:func:`splitwise_tp_split`); TP 8 is left to check the split
SPLITWISE_SPLIT_TPS = (2, 4)


def splitwise_tp_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Splitwise's single-prompt first-token latencies (``rows``: ``vllm-eager-2023`` rows
    with ``pred_s``, e.g. :func:`fit_all`'s; both DGXs) per GPU and prompt length, split by
    the TP-2 and TP-4 times ``T2``, ``T4`` into a part that shrinks as 1 / TP
    (``sharded_ms`` = 4 (T2 - T4), the time at TP 1) and a part that does not
    (``unsharded_ms`` = 2 T4 - T2), measured and predicted (``pred_``); ``tp8_from_split_ms``
    is what the measured split gives at TP 8 (sharded / 8 + unsharded), beside the TP-8
    measurement. GEMMs and attention shard with TP; host time does not, nor do the
    all-reduces (their bytes a GPU stay, their ring steps grow from TP 2 to 4), nor
    replicated element-wise work. The split places a miss in one of the two parts; it does
    not name its cause. In ms, and µs per prompt token for the unsharded part."""
    r = rows[
        rows["source"].isin((SPLITWISE_SOURCE, SPLITWISE_H100_SOURCE))
        & (rows["metric"] == "ttft_s")
        & (rows["batch"] == 1)
    ]
    lo, hi = SPLITWISE_SPLIT_TPS
    out = []
    for key, g in r.groupby(["gpu", "isl"], sort=True):
        gpu, isl = str(cast(tuple, key)[0]), int(cast(tuple, key)[1])
        tps = g["tp"].to_numpy(int)
        meas = dict(zip(tps, 1e3 * g["value_s"].to_numpy(float), strict=True))
        pred = dict(zip(tps, 1e3 * g["pred_s"].to_numpy(float), strict=True))
        if not {lo, hi, 8} <= set(meas):
            continue
        t = {k: float(meas[k]) for k in (lo, hi, 8)}
        p = {k: float(pred[k]) for k in (lo, hi)}
        # T(tp) = A / tp + B through the two TPs
        a = (t[lo] - t[hi]) * lo * hi / (hi - lo)
        b = t[hi] - a / hi
        pa = (p[lo] - p[hi]) * lo * hi / (hi - lo)
        pb = p[hi] - pa / hi
        out.append(
            {
                "gpu": gpu,
                "isl": isl,
                "tp2_ms": t[lo],
                "tp4_ms": t[hi],
                "tp8_ms": t[8],
                "sharded_ms": a,
                "unsharded_ms": b,
                "unsharded_us_per_token": 1e3 * b / isl,
                "tp8_from_split_ms": a / 8 + b,
                "pred_sharded_ms": pa,
                "pred_unsharded_ms": pb,
                "pred_unsharded_us_per_token": 1e3 * pb / isl,
            }
        )
    return pd.DataFrame(out)


# re-read rates (bytes/s) of 2023 PagedAttention's per-query-head KV reads the check tries:
# about the A100's HBM peak, TensorRT-LLM's fitted masked-MHA rate (4.65 TB/s) and a rate
# at which the re-reads cost almost nothing
EAGER_PER_QUERY_HEAD_RATES = (2e12, 4.65e12, 2e13)
EAGER_PER_QUERY_HEAD_SOURCE = (
    "vLLM 0.2.x csrc/attention/attention_kernels.cu paged_attention_kernel: grid (num_heads, "
    "num_seqs), head_idx = blockIdx.x, kv_head_idx = head_mapping[head_idx] (one thread "
    "block per query head, reading its KV head); vllm/model_executor/layers/attention.py "
    "passes head_mapping to paged_attention_v1/v2"
)


def eager_per_query_head_check(
    data_root: Path | None, rates: tuple[float, ...] = EAGER_PER_QUERY_HEAD_RATES
) -> pd.DataFrame:
    """A diagnostic, not shipped: 2023 vLLM's PagedAttention decoded a grouped (GQA) layout
    per query head (:data:`EAGER_PER_QUERY_HEAD_SOURCE`), while the shipped fit runs the
    grouped FlashAttention decode fit. Only Splitwise's Llama-2-70B (8 query heads per KV
    head) is grouped here; OPT (DistServe) is MHA, so the A100 host terms, fitted on
    DistServe's rows, cannot move. Per ``rates`` entry (and the shipped kernels, rate 0):
    :func:`fit_eager` with every grouped layout decoded per query head at that re-read rate
    (TensorRT-LLM's form: ``EngineProfile.per_query_head_kv_bytes_per_s``), the DGX-H100 host
    factor it fits, and median / p90 APE per source, over all rows and the held-out rows."""
    pts = all_points(data_root)
    rows = features(pts[pts["engine"] == EAGER_ENGINE].reset_index(drop=True))
    out = []
    for rate in (0.0, *rates):
        kern = (
            EAGER_KERNELS
            if rate == 0.0
            else replace(
                EAGER_KERNELS, grouped_decode_q_per_kv=(), per_query_head_kv_bytes_per_s=rate
            )
        )
        fe = fit_eager(rows, kernels=kern)
        r = fe["rows"]
        a = r["ape"].to_numpy(float)
        parts = {
            "all": np.ones(len(r), bool),
            "held out": (r["split"] != "fit").to_numpy(),
            **{s: (r["source"] == s).to_numpy() for s in sorted(r["source"].unique())},
        }
        for part, sel in parts.items():
            out.append(
                {
                    "reread_tb_per_s": rate / 1e12,
                    "h100_host_scale": fe["host_scale"].get("h100-sxm", float("nan")),
                    "rows": part,
                    "n": int(sel.sum()),
                    "median_ape": float(np.median(a[sel])),
                    "p90_ape": float(np.percentile(a[sel], 90)),
                }
            )
    return pd.DataFrame(out)


# SGLang's Triton fused_moe picks its tile config from a file per (local experts E, shard
# width N, GPU, dtype) when one ships, else a default config (fused_moe_triton_config.py
# get_moe_configs / get_default_config: bf16 64 x 64 x 32 tiles, 16 x 32 x 64 at M <= E).
# Since 0.5 it searches every triton_* config directory newest first when the running
# Triton's has none, so an older Triton's tuned file is used. For Mixtral-8x7B at TP2 on
# the H100 (E=8, N=7168) SGLang ships configs/triton_3_2_0/ (PR #6974) and triton_3_3_1/
# (PR #6958) "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"; AIConfigurator's SGLang
# collector (collector/sglang/collect_moe.py) looks the config up the same way
# (get_moe_configs with E = the rank's local experts), so its 0.5.14 table ran the tuned
# file where one ships and the default config elsewhere.
SGLANG_MOE_SHAPE = {"hidden_size": 4096, "inter_size": 14336, "num_experts": 8, "topk": 2}
SGLANG_MOE_WIDE_TOKENS = 16384


def sglang_moe_configs(data_root: Path) -> pd.DataFrame:
    """SGLang 0.5.14's Mixtral-8x7B rows of AIConfigurator's H100 ``moe_perf`` table, per
    (moe TP, EP): the rank's config key (local experts E, shard width N), the expert GEMMs'
    FLOP rate at :data:`SGLANG_MOE_WIDE_TOKENS` tokens (balanced routing) beside vLLM
    0.24's and TensorRT-LLM's on the same point, and the shipped ``sglang`` bf16 fit's
    prediction over the measurement (median, tokens > 1024). Which rows ran a tuned tile
    config shows in the rate: a diagnostic of the SGLang fit, nothing fitted."""
    from calibration import fit_moe

    moe = fit_moe.moe_rows(data_root, ("vllm", "sglang", "trtllm"))
    sel = moe["distribution"] == "balanced"
    for col, v in SGLANG_MOE_SHAPE.items():
        sel &= moe[col] == v
    d = moe[sel & (moe["dtype"] == "bf16")].copy()
    params = load_moe_params("h100-sxm")
    d["pred_s"] = 0.0
    for fw in ("sglang", "vllm", "trtllm"):
        for tuned in (False, True):  # a row that ran a shipped tile config: the tuned set
            f = ((d["fw"] == fw) & (d["tuned_tiles"] == tuned)).to_numpy()
            if f.any():
                d.loc[f, "pred_s"] = fit_moe._gg(params.gemm("bf16", fw, tuned=tuned), d[f])
    flop = 2.0 * d["tokens_gpu"] * d["hidden_size"] * d["width"] * 3.0
    d["tflop_per_s"] = flop / d["meas_s"] / 1e12
    wide = d[d["num_tokens"] == SGLANG_MOE_WIDE_TOKENS]
    rate = wide.pivot_table(
        index=["moe_tp_size", "moe_ep_size"], columns="fw", values="tflop_per_s"
    )
    sg = d[(d["fw"] == "sglang") & (d["num_tokens"] > 1024)]
    over = (sg["pred_s"] / sg["meas_s"]).groupby([sg["moe_tp_size"], sg["moe_ep_size"]]).median()
    out = rate.rename(columns=lambda c: f"{c}_tflop_per_s").assign(
        sglang_pred_over_measured_gt1024=over
    )
    out = out.reset_index()
    out.insert(2, "E", SGLANG_MOE_SHAPE["num_experts"] // out["moe_ep_size"])
    out.insert(3, "N", SGLANG_MOE_SHAPE["inter_size"] // out["moe_tp_size"])
    return out


# DeepGEMM's README (github.com/deepseek-ai/DeepGEMM, the release of February 2025, section
# "Performance", "Normal GEMMs for dense models"): its FP8 GEMM (1 x 128 activation and
# 128 x 128 weight scales, bf16 output) on an H800 with NVCC 12.8, per (m, n, k) the
# TFLOPS, the memory bandwidth it reached ((m k + k n + 2 m n) bytes over the time) and the
# speedup over DeepSeek's CUTLASS 3.6 kernel. The one public kernel timing of an H800 found:
# the H800 profile carries the H100 SXM's GEMM efficiencies (same die, same HBM3 at
# 3.35 TB/s; NVLink cut to 400 GB/s), and the memory-bound rows check that carry.
DEEPGEMM_H800 = REPO / "calibration" / "engine_data" / "deepgemm_h800_fp8.csv"
DEEPGEMM_H800_URL = "https://github.com/deepseek-ai/DeepGEMM (README.md, February 2025)"
DEEPGEMM_STREAM_M = 128  # rows with m at most this stream the weights (decode-sized)


def h800_gemm_check(path: Path = DEEPGEMM_H800) -> pd.DataFrame:
    """DeepGEMM's H800 FP8 GEMM times (:data:`DEEPGEMM_H800`) against the shipped H800
    profile's FP8 GEMM (``ops.gemm_time_s``, the efficiencies carried from the H100 SXM):
    per row the measured time (2 m n k / TFLOPS), the prediction, their ratio and the share
    of the H800's HBM peak the measured run streamed. Nothing is fitted."""
    try:
        t = pd.read_csv(regular_file(path, UserError, "DeepGEMM CSV"))
    except (OSError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    prof = load_profile("h800-sxm")
    m, n, k = (t[c].to_numpy(float) for c in ("m", "n", "k"))
    meas = 2.0 * m * n * k / (t["tflops"].to_numpy(float) * 1e12)
    pred = ops.gemm_time_s(prof.peaks, prof.gemm_params("fp8"), m, n, k, "fp8")
    streamed = (m * k + k * n + 2.0 * m * n) / meas / prof.peaks.hbm_bytes_per_s
    return t.assign(
        measured_us=meas * 1e6,
        predicted_us=pred * 1e6,
        measured_over_predicted=meas / pred,
        streamed_of_peak=streamed,
    )


# --- vllm-eager-2023: the structure of the prefill residual (2026-12-02, fourth session) -----
# Terms with a physical meaning added to the shipped overlap form, each scored on both
# sources (eager_prefill_screen). Host terms are seconds per unit; kernel terms a fraction
# of a kernel part added inside the per-layer max (a slower kernel).
PREFILL_SCREEN_TERMS = {
    "per token": "host time per token (prompt tokens and decode sequences: the shipped term)",
    "per sequence": "host time per sequence the step samples (decode batch, prefill prompts)",
    "per prompt token": "host time per prompt token (input preparation, detokenisation)",
    "all-reduce x s": "every all-reduce slower than nccl-tests by a fraction",
    "prefill biased GEMMs x s": "prefill GEMMs with a bias (QKV and up, column-parallel) slower "
    "by a fraction: only OPT has them here",
    "per context block x tp": "the step's block tables (one int per 16 context tokens of every "
    "sequence) pickled into every Ray worker's call: host time per block and rank",
    "per token / tp": "per-token work each rank does on its own shard (shrinks with TP), beside "
    "the shared per-token time the driver spends once",
}
PREFILL_SCREEN_FORMS = (
    ("per token",),
    ("per sequence", "per prompt token"),
    ("per token", "all-reduce x s"),
    ("per sequence", "per prompt token", "all-reduce x s"),
    ("per sequence", "all-reduce x s", "prefill biased GEMMs x s"),
    ("per token", "per context block x tp"),
    ("per token", "per token / tp"),
    ("per token / tp",),
)
BLOCK_TOKENS = 16  # vLLM 0.2's default KV block size (DistServe's fork keeps it)
# DistServe's C++ engine's prefill all-reduces against nccl-tests' (cxx_prefill_allreduce):
# fixed, not fitted, in the screen's "all-reduce x 1.49 (C++ engine)" rows
_SCREEN_X0 = {
    "per token": 1e-4,
    "per sequence": 1e-4,
    "per prompt token": 1e-4,
    "per context block x tp": 1e-6,
    "per token / tp": 1e-4,
}


def _biased_gemm_s(points: pd.DataFrame, profile: HardwareProfile | None = None) -> np.ndarray:
    """Per point, the kernel time of the GEMMs that carry a bias in a TP engine's GEMM call
    (the column-parallel QKV and up projections of a model with linear biases; the
    row-parallel ones add their bias after the all-reduce), all layers; 0 without biases."""
    prof = profile or load_profile(EAGER_GPU)
    out = np.zeros(len(points))
    workers: dict[tuple[str, int], Any] = {}
    for i, r in enumerate(points.to_dict("records")):
        key = (str(r["model"]), int(r["tp"]))
        if key not in workers:
            workers[key] = build_worker_cost(
                key[0], EAGER_GPU, key[1], weight_dtype="bf16", kv_dtype="bf16",
                engine=EAGER_KERNELS, profile=prof, gpu_mem_util=1.0, activation_reserve_bytes=0.0,
            )  # fmt: skip
        w = workers[key]
        if not w.model.linear_bias:
            continue
        m = float(r["batch"] * r["isl"] if r["metric"] in PREFILL_METRICS else r["batch"])
        t = w.gemm_layer_times_s(m)
        out[i] = w.model.num_layers * (t[0] + t[2])
    return out


def cxx_prefill_allreduce(
    data_root: Path, profile: HardwareProfile | None = None
) -> dict[str, Any]:
    """DistServe's C++ engine's prefill steps (same A100s and harness as the 2023-vLLM
    curves; no Python on its path) fitted as the kernel model plus a fraction ``s`` of its
    all-reduce time plus a constant per step ``c`` (non-negative least squares of the
    relative error): how much slower than nccl-tests the all-reduces of prefill activations
    ran on that box. Also the same fit of Splitwise's first-token latencies of up to 2,048
    prompt tokens (2023 vLLM on another DGX-A100) with the shipped per-iteration time
    instead of ``c``. Returns the fitted values and the APE before and after, per family."""
    out: dict[str, Any] = {}
    pts = eager_points(data_root, "distserve")
    p = eager_parts(data_root, profile, pts)
    pre = p["metric"].isin(PREFILL_METRICS).to_numpy()
    q = p[pre].reset_index(drop=True)
    kern = (q["layer_kernels_s"] + q["lm_head_s"]).to_numpy(float)
    meas = q["value_s"].to_numpy(float)
    x = np.c_[q["allreduce_s"].to_numpy(float), np.ones(len(q))]
    theta = solve(kern, x, meas)
    a0, a1 = ape(kern, meas), ape(kern + x @ theta, meas)
    fam = (q["model"] + " TP" + q["tp"].astype(str)).to_numpy()
    lofo, factors = np.empty(len(q)), []
    for f in np.unique(fam):  # each family predicted by a fit without it
        t = fam == f
        th = solve(kern[~t], x[~t], meas[~t])
        lofo[t] = ape(kern + x @ th, meas)[t]
        factors.append(1.0 + float(th[0]))
    out["cxx"] = {
        "allreduce_scale": 1.0 + float(theta[0]),
        "per_step_s": float(theta[1]),
        **_before_after(a0, a1, fam),
        "held_out_by_family": _stats(lofo),
        "held_out_by_family_ape": lofo,
        "allreduce_scale_without_each_family": (min(factors), max(factors)),
    }
    sw = splitwise_points()
    sw = sw[sw["metric"].isin(PREFILL_METRICS) & (sw["batch"] * sw["isl"] <= 2048)]
    p = eager_parts(data_root, profile, sw.reset_index(drop=True))
    kern = (p["layer_kernels_s"] + p["lm_head_s"]).to_numpy(float)
    meas = p["value_s"].to_numpy(float)
    it = load_engines()[EAGER_ENGINE].per_iteration_s
    x = p[["allreduce_s"]].to_numpy(float)
    theta = solve(kern + it, x, meas)
    a0, a1 = ape(kern + it, meas), ape(kern + it + x @ theta, meas)
    fam = ("TP" + p["tp"].astype(str)).to_numpy()
    out["splitwise"] = {"allreduce_scale": 1.0 + float(theta[0]), **_before_after(a0, a1, fam)}
    return out


def _screen_pred(
    terms: tuple[str, ...], th: np.ndarray, d: dict[str, np.ndarray], ar_fixed: float
) -> np.ndarray:
    """The shipped overlap form (per iteration, launch floor, per-layer sync: ``th[:3]``)
    with ``terms`` (:data:`PREFILL_SCREEN_TERMS`, parameters ``th[3:]``) and the
    all-reduces scaled by ``1 + ar_fixed`` (a fixed fraction)."""
    per_iter, launch, sync = th[:3]
    layers = d["layers"]
    lk = d["layer_k"] + ar_fixed * d["ar"]
    host = per_iter + d["lm"]
    for t, v in zip(terms, th[3:], strict=True):
        if t == "per token":
            host = host + v * d["tokens"]
        elif t == "per sequence":
            host = host + v * d["seqs"]
        elif t == "per prompt token":
            host = host + v * d["tokens"] * d["pre"]
        elif t == "all-reduce x s":
            lk = lk + v * d["ar"]
        elif t == "prefill biased GEMMs x s":
            lk = lk + v * d["bgemm"] * d["pre"]
        elif t == "per context block x tp":
            host = host + v * d["blocks_tp"]
        elif t == "per token / tp":
            host = host + v * d["tokens_per_rank"]
        else:
            raise KeyError(t)
    return host + layers * (np.maximum(lk / layers, launch) + sync * d["multi"])


def _screen_fit(
    terms: tuple[str, ...], d: dict[str, np.ndarray], sel: np.ndarray, ar_fixed: float
) -> np.ndarray:
    unit = np.array([1e-3, 1e-4, 1e-4, *(_SCREEN_X0.get(t, 1.0) for t in terms)])
    starts = np.random.default_rng(0).uniform(0.0, 1.0, (EAGER_FORM_STARTS, len(unit)))
    scale0 = np.array([10.0, 6.0, 6.0, *([1.0] * len(terms))])
    best = None
    for s0 in starts:
        res = least_squares(
            lambda t: _screen_pred(terms, t * unit, d, ar_fixed)[sel] / d["meas"][sel] - 1.0,
            s0 * scale0,
            bounds=(0.0, np.inf),
        )
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return np.asarray(best.x, float) * unit


def eager_prefill_screen(
    data_root: Path, profile: HardwareProfile | None = None, cxx_allreduce: float | None = None
) -> pd.DataFrame:
    """A diagnostic, not shipped: the shipped overlap form with the terms of
    :data:`PREFILL_SCREEN_FORMS` (each a cost with a physical meaning,
    :data:`PREFILL_SCREEN_TERMS`) in place of its per-token host time, and the shipped
    form with every all-reduce at the C++ engine's measured factor (``cxx_allreduce``,
    :func:`cxx_prefill_allreduce`, fixed), each fitted on DistServe's fit families and
    scored on both sources: every row, DistServe's fit rows, its held-out families,
    Splitwise (held out), DistServe with each family refitted without it, and DistServe's
    every family fitted in sample. One row per form with median / p90 APE and the fitted
    values (``params``: seconds, or a fraction)."""
    ds = eager_points(data_root)
    pts = pd.concat([ds, splitwise_points()], ignore_index=True)
    p = eager_parts(data_root, profile, pts)
    d = _form_inputs(p)
    pre = d["pre"].astype(bool)
    d["ar"] = p["allreduce_s"].to_numpy(float)
    d["seqs"] = np.where(pre, p["batch"].to_numpy(float), d["tokens"])
    d["bgemm"] = _biased_gemm_s(p, profile)
    # context per sequence: the prompt (prefill), DistServe's decode context (isl), or
    # Splitwise's mean decode context (isl + osl / 2)
    isl, osl = p["isl"].to_numpy(float), p["osl"].to_numpy(float)
    ctx = np.where(pre | (p["metric"] == "decode_ctx_step_s").to_numpy(), isl, isl + osl / 2.0)
    blocks = p["batch"].to_numpy(float) * np.ceil(ctx / BLOCK_TOKENS)
    d["blocks_tp"] = blocks * p["tp"].to_numpy(float)
    d["tokens_per_rank"] = d["tokens"] / p["tp"].to_numpy(float)
    is_sw = (p["source"] == SPLITWISE_SOURCE).to_numpy()
    fit = ~is_sw & (p["split"] == "fit").to_numpy()
    fam = (p["model"] + "|" + p["tp"].astype(str)).to_numpy()
    if cxx_allreduce is None:
        cxx_allreduce = cxx_prefill_allreduce(data_root, profile)["cxx"]["allreduce_scale"]
    forms = [(f, 0.0) for f in PREFILL_SCREEN_FORMS] + [(("per token",), cxx_allreduce - 1.0)]
    rows = []
    for terms, fixed in forms:
        th = _screen_fit(terms, d, fit, fixed)
        a = ape(_screen_pred(terms, th, d, fixed), d["meas"])
        lofo = np.empty(len(a))
        for f in np.unique(fam[~is_sw]):
            t = fam == f
            if (fit & t).any():
                lofo[t] = ape(_screen_pred(terms, _screen_fit(terms, d, fit & ~t, fixed), d, fixed), d["meas"])[t]  # fmt: skip
            else:
                lofo[t] = a[t]
        every = ape(_screen_pred(terms, _screen_fit(terms, d, ~is_sw, fixed), d, fixed), d["meas"])
        name = " + ".join(terms) + (
            f", all-reduce x {cxx_allreduce:.2f} (C++ engine)" if fixed else ""
        )
        names = ("per_iteration_s", "launch_per_layer_s", "sync_per_layer_tp_s", *terms)
        rows.append(
            {
                "form": name,
                "shipped": terms == ("per token",) and not fixed,
                "all": _stats(a),
                "distserve_fit": _stats(a[fit]),
                "distserve_held_out": _stats(a[~is_sw & ~fit]),
                "splitwise_held_out": _stats(a[is_sw]),
                "distserve_by_family": _stats(lofo[~is_sw]),
                "distserve_every_family_in_sample": _stats(every[~is_sw]),
                "params": {k: float(f"{v:.4g}") for k, v in zip(names, th, strict=True)},
                "ape": a,
                "lofo_ape": np.where(is_sw, np.nan, lofo),
                "every_ape": np.where(is_sw, np.nan, every),
                "splitwise_rows": is_sw,
                "fit_rows": fit,
            }
        )
    return pd.DataFrame(rows)


def _before_after(a0: np.ndarray, a1: np.ndarray, fam: np.ndarray) -> dict[str, Any]:
    """Errors of the kernels alone (``a0``) and with a fitted term (``a1``): both rows'
    statistics, the errors themselves and each family's pair of medians."""
    return {
        "kernels_only": _stats(a0),
        "fitted": _stats(a1),
        "kernels_ape": a0,
        "fitted_ape": a1,
        "by_family": {
            f: (float(np.median(a0[fam == f])), float(np.median(a1[fam == f])))
            for f in sorted(set(fam))
        },
    }


def _stats(v: np.ndarray) -> dict[str, Any]:
    return {
        "n": int(len(v)),
        "median_ape": round(float(np.median(v)), 4),
        "p90_ape": round(float(np.percentile(v, 90)), 4),
    }


def curve_checks(data_root: Path, peak_hbm_bytes_per_s: float) -> pd.DataFrame:
    """Physical consistency of DistServe's 2023-vLLM curves, per (model, TP): the KV
    bandwidth the small-batch decode curve implies (its per-context-token slope against
    the KV bytes per token on one GPU; it cannot exceed the HBM peak), and the quadratic
    prefill coefficient × TP (attention FLOPs per GPU fall as 1/TP, so this should not
    change with TP for one model)."""
    curves = load_curves(data_root, EAGER_FILE)
    rows = []
    for hf_id, by_tp in curves.items():
        model = hf_id.split("/")[-1]
        spec = get_model(model)
        for tp_s, c in by_tp.items():
            tp = int(tp_s)
            kv_per_token_gpu = (
                2 * spec.num_layers * max(spec.num_kv_heads // tp, 1) * spec.head_dim * 2
            )
            slope_s = c["decoding_smallbs"][1] * MS  # seconds per context token (batch × ctx)
            rows.append(
                (
                    model,
                    tp,
                    kv_per_token_gpu / slope_s / 1e12,
                    kv_per_token_gpu / slope_s / peak_hbm_bytes_per_s,
                    c["prefill"][2] * MS * tp * 1e9,
                )
            )
    return pd.DataFrame(
        rows,
        columns=["model", "tp", "decode_kv_tb_per_s", "of_hbm_peak", "prefill_quad_ns_x_tp"],
    )


def floor_curve_slopes(data_root: Path, profile: HardwareProfile | None = None) -> pd.DataFrame:
    """:func:`curve_checks`' decode slope, but of the shipped step model: its
    ``vllm-eager-2023`` decode steps on DistServe's profiled grid (batches below the
    small-batch threshold, 95, times every profiled input length; the harness file) fitted
    with DistServe's own small-batch form ``a + b × Σ context + c × batch`` by least squares
    of the relative error, as DistServe fitted its measurements; per (model, TP) the KV
    bandwidth that slope implies, beside the curve's. A launch floor flattens the steps in
    the context where the kernels are short, so the fitted slope can imply more than the HBM
    peak with every kernel within it."""
    h = harness()["profiled_grid"]
    checks = curve_checks(data_root, get_gpu(EAGER_GPU).hbm_bytes_per_s)
    eng = load_engines()[EAGER_ENGINE]
    prof = profile or load_profile(EAGER_GPU)
    peak = get_gpu(EAGER_GPU).hbm_bytes_per_s
    out = []
    for r in checks.to_dict("records"):
        model, tp = str(r["model"]), int(r["tp"])
        w = build_worker_cost(
            model, EAGER_GPU, tp, engine=eng, profile=prof, gpu_mem_util=1.0,
            activation_reserve_bytes=0.0,
        )  # fmt: skip
        x, y = [], []
        for b in (int(v) for v in h["batch"] if int(v) < 95):
            for n in (int(v) for v in h["input_len"]):
                x.append((1.0, float(b * n), float(b)))
                y.append(w.decode_time_s(b, b * n))
        xa, ya = np.array(x), np.array(y)
        slope = float(lsq_linear(xa / ya[:, None], np.ones(len(ya))).x[1])
        spec = get_model(model)
        kv = 2 * spec.num_layers * max(spec.num_kv_heads // tp, 1) * spec.head_dim * 2
        out.append(
            (model, tp, float(r["decode_kv_tb_per_s"]), float(r["of_hbm_peak"]),
             kv / slope / 1e12, kv / slope / peak)
        )  # fmt: skip
    return pd.DataFrame(
        out,
        columns=[
            "model", "tp", "curve_kv_tb_per_s", "curve_of_peak", "model_kv_tb_per_s",
            "model_of_peak",
        ],
    )  # fmt: skip


EAGER_SECOND_FORMS = ("additive", "overlap", EAGER_OVERLAP_HIDDEN, EAGER_OVERLAP_PREFILL)


def eager_every_row_in_sample(data_root: Path) -> dict[str, np.ndarray]:
    """Each eager form (:data:`EAGER_SECOND_FORMS`) fitted to every ``vllm-eager-2023`` row
    of both A100 sources (DistServe and Splitwise's DGX-A100: one host), nothing held out:
    per form the rows' APE in sample — what the form can reach on these data at all,
    extrapolation aside. Not shipped."""
    pts = all_points(data_root)
    rows = pts[(pts["engine"] == EAGER_ENGINE) & (pts["gpu"] == EAGER_GPU)].reset_index(drop=True)
    d = _form_inputs(eager_parts(data_root, None, rows))
    every = np.ones(len(rows), bool)
    return {
        form: ape(_eager_form_pred(form, _fit_eager_form(form, d, every), d), d["meas"])
        for form in EAGER_SECOND_FORMS
    }


def eager_fit_every_family(data_root: Path) -> dict[str, Any]:
    """The shipped (additive) ``vllm-eager-2023`` form fitted to every DistServe family,
    the held-out ones included (:func:`fit_engine` with every row a fit row): what the form
    can reach on these curves at all, extrapolation aside. Not shipped."""
    pts = eager_points(data_root).assign(split="fit")
    return fit_engine_linear(features(pts), "vllm-eager-2023")


def harness(path: Path = HARNESS) -> dict[str, Any]:
    """DistServe's measurement harness, read from its repository (``distserve_harness.json``:
    sources with commits, the profiled grid and each family's token limit)."""
    try:
        doc = json.loads(path.read_text())
        limits = {(str(r["model"]), int(r["tp"])): int(r["limit"]) for r in doc["token_limits"]}
        grid = doc["profiled_grid"]
        batches, lengths = [int(b) for b in grid["batch"]], [int(n) for n in grid["input_len"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: cannot read the DistServe harness ({e})") from None
    return {**doc, "limits": limits, "max_batch": max(batches), "max_len": max(lengths)}


def in_profiled_domain(points: pd.DataFrame, h: dict[str, Any] | None = None) -> np.ndarray:
    """Per DistServe point (:func:`eager_points`): whether DistServe profiled its family at
    that size — batch and prompt length within the grid and ``batch × ceil16(length)`` within
    the family's token limit (:func:`harness`; a family absent from the published grid, OPT-66B
    TP8, counts as outside). Outside, the curve is an extrapolation of its own fit."""
    h = h or harness()
    out = np.zeros(len(points), bool)
    for i, r in enumerate(points.to_dict("records")):
        lim = h["limits"].get((str(r["model"]), int(r["tp"])))
        b, n = int(r["batch"]), int(r["isl"])
        out[i] = (
            lim is not None
            and b <= h["max_batch"]
            and n <= h["max_len"]
            and b * (-(-n // 16) * 16) <= lim
        )
    return out


SAME_BOX_PREFILL = (4, 2048)  # batch × prompt length (8192 tokens): in every family's grid
SAME_BOX_DECODE = (1, 64)  # batch × context: the smallest decode step


def same_box_comparison(data_root: Path, profile: HardwareProfile | None = None) -> pd.DataFrame:
    """DistServe's curves of 2023 vLLM beside those of DistServe's own C++ engine — the same
    A100s, harness, models and TPs — per (model, TP): each engine's median measured /
    kernel-model time over the grid (prefill and decode steps; kernels from the shipped
    profile with no engine overhead), and vLLM's excess over the C++ engine at
    :data:`SAME_BOX_PREFILL` per prompt token and at :data:`SAME_BOX_DECODE` (straight from
    the two curves). Host time the vLLM driver spends per prompt token (detokenising the
    prompt: ``distserve_harness.json``) is the same for every model and TP; kernel time is
    not."""
    frames = {}
    for which in (EAGER_FILE, "distserve"):
        pts = eager_points(data_root, which)
        f = features(pts, {EAGER_GPU: profile} if profile is not None else None)
        frames[which] = f.assign(ratio=f["value_s"] / f["kernels_s"])
    key = ["model", "tp", "metric", "batch", "isl"]
    both = frames[EAGER_FILE].merge(frames["distserve"], on=key, suffixes=("_v", "_d"))
    rows = []
    pb, pl = SAME_BOX_PREFILL
    db, dc = SAME_BOX_DECODE
    limits = harness()["limits"]
    for fam, g in both.groupby(["model", "tp"], sort=True):
        model, tp = str(fam[0]), int(cast(tuple, fam)[1])
        pre = (g["metric"] == "prefill_step_s").to_numpy()

        def at(metric: str, b: int, n: int, g: pd.DataFrame = g) -> pd.Series:
            hit = g[(g["metric"] == metric) & (g["batch"] == b) & (g["isl"] == n)]
            return hit.iloc[0]

        p, d = at("prefill_step_s", pb, pl), at("decode_ctx_step_s", db, dc)
        rows.append(
            {
                "model": model,
                "tp": tp,
                "cxx_prefill_x_kernels": float(np.median(g["ratio_d"][pre])),
                "cxx_decode_x_kernels": float(np.median(g["ratio_d"][~pre])),
                "vllm_prefill_x_kernels": float(np.median(g["ratio_v"][pre])),
                "vllm_decode_x_kernels": float(np.median(g["ratio_v"][~pre])),
                "vllm_minus_cxx_prefill_us_per_token": (p["value_s_v"] - p["value_s_d"])
                / (pb * pl)
                * 1e6,
                "vllm_minus_cxx_decode_b1_ms": (d["value_s_v"] - d["value_s_d"]) * 1e3,
                "in_published_grid": (model, tp) in limits,
            }
        )
    return pd.DataFrame(rows)


def cxx_engine_kernel_ape(data_root: Path) -> pd.DataFrame:
    """DistServe's C++ engine's curves (same A100s and harness as the 2023-vLLM ones) against
    the kernel model with no engine overhead: the points with their APE (``ape``)."""
    f = features(eager_points(data_root, "distserve"))
    return f.assign(ape=ape(f["kernels_s"].to_numpy(float), f["value_s"].to_numpy(float)))


def eager_prefill_scale(data_root: Path) -> dict[str, Any]:
    """The shipped (additive) ``vllm-eager-2023`` form plus one more non-negative parameter:
    a fraction of the prefill kernel time added (``prefill_kernel_scale``; vLLM 2023's prefill
    runs 1.4-1.8× the kernel model where DistServe's C++ engine on the same GPUs runs
    1.04-1.21×, :func:`same_box_comparison`). Fitted by :func:`solve` on the fit rows, scored
    like the shipped fit (all rows, fit, held out, each family refitted without it). Measured,
    not shipped: the cause of the slower prefill kernels is not identified."""
    return prefill_scale_fit(features(eager_points(data_root)))


def prefill_scale_fit(rows: pd.DataFrame) -> dict[str, Any]:
    """:func:`eager_prefill_scale` on a :func:`features` frame (one engine's rows, with
    ``split``, ``metric``, ``model`` and ``tp``)."""
    names = [*PARAM_KEYS, "prefill_kernel_scale"]
    kern = rows["kernels_s"].to_numpy(float)
    pre = (rows["metric"] == "prefill_step_s").to_numpy()
    x = np.c_[rows[[f"x_{k}" for k in PARAM_KEYS]].to_numpy(float), kern * pre]
    meas = rows["value_s"].to_numpy(float)
    fit = (rows["split"] == "fit").to_numpy()
    fam = (rows["model"] + "|" + rows["tp"].astype(str)).to_numpy()
    theta = solve(kern[fit], x[fit], meas[fit])
    a = ape(kern + x @ theta, meas)
    lofo = np.empty(len(rows))
    for f in np.unique(fam):
        test = fam == f
        t_o = solve(kern[fit & ~test], x[fit & ~test], meas[fit & ~test])
        lofo[test] = ape(kern + x @ t_o, meas)[test]
    return {
        "params": dict(zip(names, (float(f"{v:.4g}") for v in theta), strict=True)),
        "rows": rows,
        "ape": a,
        "lofo_ape": lofo,
        "fit_rows": fit,
        "prefill_rows": pre,
        **{
            part: (
                _stats(a[sel] if part != "held_out_by_family" else lofo[sel])
                if sel.any()
                else {"n": 0}
            )
            for part, sel in (
                ("all", np.ones(len(rows), bool)),
                ("fit", fit),
                ("holdout", ~fit),
                ("held_out_by_family", np.ones(len(rows), bool)),
            )
        },
    }


# a per-all-reduce cost growing with TP (tp_allreduce_term): its dependence on TP
AR_TP_FORMS = {"(tp - 1)": lambda tp: tp - 1.0, "log2(tp)": np.log2}


def tp_allreduce_term(data_root: Path) -> pd.DataFrame:
    """A diagnostic, not shipped: a cost per all-reduce beyond the all-reduce model (nccl-tests),
    ``c × g(tp)`` for each :data:`AR_TP_FORMS` (two all-reduces per layer and iteration),
    fitted on DistServe's C++ engine (no Python: its excess over the kernel model grows
    with TP, :func:`same_box_comparison`) over its fit families (:data:`EAGER_HOLDOUT`
    held out; the term alone, non-negative least squares of the relative error), then
    carried to 2023 vLLM on the same A100s: kernels plus that cost, the additive overhead
    form refitted on the fit families. Also vLLM's own fit of ``c`` beside the six
    overheads. Median / p90 APE: the C++ engine's curves (all, held-out families), vLLM's
    (all, held-out rows, refit without each family)."""
    hold = set(EAGER_HOLDOUT)
    frames = {w: features(eager_points(data_root, w)) for w in ("distserve", EAGER_FILE)}
    cxx, v = frames["distserve"], frames[EAGER_FILE]

    def ars(f: pd.DataFrame, g) -> np.ndarray:
        return 2.0 * f["x_per_layer_s"].to_numpy(float) * g(f["tp"].to_numpy(float))

    kc, mc = cxx["kernels_s"].to_numpy(float), cxx["value_s"].to_numpy(float)
    fit_c = np.array(
        [(m, int(t)) not in hold for m, t in zip(cxx["model"], cxx["tp"], strict=True)]
    )
    kv, mv = v["kernels_s"].to_numpy(float), v["value_s"].to_numpy(float)
    x = v[[f"x_{k}" for k in PARAM_KEYS]].to_numpy(float)
    fit = (v["split"] == "fit").to_numpy()
    fam = (v["model"] + "|" + v["tp"].astype(str)).to_numpy()

    def vllm_parts(kern: np.ndarray, xs: np.ndarray) -> dict[str, float]:
        a = ape(kern + xs @ solve(kern[fit], xs[fit], mv[fit]), mv)
        lofo = np.empty(len(a))
        for f in np.unique(fam):
            t, tr = fam == f, fit & (fam != f)
            lofo[t] = ape(kern + xs @ solve(kern[tr], xs[tr], mv[tr]), mv)[t]
        return {
            "vllm_all": float(np.median(a)), "vllm_all_p90": float(np.percentile(a, 90)),
            "vllm_held_out": float(np.median(a[~fit])),
            "vllm_held_out_p90": float(np.percentile(a[~fit], 90)),
            "vllm_by_family_p90": float(np.percentile(lofo, 90)),
        }  # fmt: skip

    a0 = ape(kc, mc)
    rows = [
        {
            "form": "none (additive form)", "c_us": 0.0,
            "cxx_all": float(np.median(a0)), "cxx_held_out": float(np.median(a0[~fit_c])),
            "cxx_held_out_p90": float(np.percentile(a0[~fit_c], 90)),
            **vllm_parts(kv, x),
        }
    ]  # fmt: skip
    for name, g in AR_TP_FORMS.items():
        xc = ars(cxx, g)[:, None]
        c = float(solve(kc[fit_c], xc[fit_c], mc[fit_c])[0])
        ac = ape(kc + c * xc[:, 0], mc)
        rows.append(
            {
                "form": f"C++-fitted c x {name}", "c_us": c * 1e6,
                "cxx_all": float(np.median(ac)), "cxx_held_out": float(np.median(ac[~fit_c])),
                "cxx_held_out_p90": float(np.percentile(ac[~fit_c], 90)),
                **vllm_parts(kv + c * ars(v, g), x),
            }
        )  # fmt: skip
        xo = np.c_[x, ars(v, g)]
        own = float(solve(kv[fit], xo[fit], mv[fit])[-1])
        rows.append(
            {"form": f"vLLM's own c x {name}", "c_us": own * 1e6, **vllm_parts(kv, xo)}
        )  # fmt: skip
    return pd.DataFrame(rows)


# Costs of the measured 2023 stack the additive form lacks (eager_term_screen): each one
# column added to the shipped overheads, with the mechanism it stands for. The Ray fan-out
# is in the fork's LLMEngine._run_workers_in_batch (interestingLSY/vllm@2257483b,
# vllm/engine/llm_engine.py): one ``worker.execute_method.remote`` per worker with the step's
# arguments, then ``ray.get`` of every worker's output.
EAGER_TERMS: dict[str, str] = {
    "seqs x tp": "Ray fan-out: the step's sequence metadata pickled for every worker and "
    "every worker's sampler output returned",
    "tokens x tp": "the same for the prompt token ids in the metadata",
    "layers x (tp - 1)": "per-layer all-reduce synchronisation growing with the ranks",
    "layers x log2(tp)": "the same, growing as a tree",
    "decode attention x s": "2023 PagedAttention decode kernels slower than the FlashAttention fit",
    "all-reduce x s": "eager torch.distributed NCCL all-reduces slower than nccl-tests",
    "element-wise x s": "eager unfused element-wise kernels (LayerNorm, ReLU, residual "
    "adds) slower than the fit",
    "prefill kernels x s": "slower prefill kernels (cause not identified)",
    "tokens x layers x hidden": "per-token work every rank repeats, not sharded by TP",
}
EAGER_MODEL_SPLIT = ("opt-66b", "opt-13b")  # fit on the first model's fit rows, test the second


def _eager_term_columns(p: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each :data:`EAGER_TERMS` column for the :func:`eager_parts` frame ``p`` (seconds per
    unit of its parameter: a host time per unit, or a fraction of a kernel part)."""
    tp = p["tp"].to_numpy(float)
    layers, tokens = p["num_layers"].to_numpy(float), p["tokens"].to_numpy(float)
    pre = (p["metric"] == "prefill_step_s").to_numpy()
    return {
        "seqs x tp": p["batch"].to_numpy(float) * tp,
        "tokens x tp": tokens * tp,
        "layers x (tp - 1)": layers * (tp - 1.0),
        "layers x log2(tp)": layers * np.log2(tp),
        "decode attention x s": np.where(pre, 0.0, p["attention_s"].to_numpy(float)),
        "all-reduce x s": p["allreduce_s"].to_numpy(float),
        "element-wise x s": p["elementwise_s"].to_numpy(float),
        "prefill kernels x s": np.where(
            pre, p["layer_kernels_s"].to_numpy(float) + p["lm_head_s"].to_numpy(float), 0.0
        ),
        "tokens x layers x hidden": tokens * layers * p["hidden"].to_numpy(float),
    }


def eager_term_screen(data_root: Path, profile: HardwareProfile | None = None) -> pd.DataFrame:
    """A diagnostic, not shipped: each :data:`EAGER_TERMS` cost added, one at a time, to the
    additive ``vllm-eager-2023`` overheads (the shipped form until 2026-12-02; row
    ``additive``; non-negative least squares of the relative
    error, :func:`solve`), then all of them at once. Per form: the new term's fitted value
    (``coef``: seconds per unit, or a fraction of the kernel part), median / p90 APE over
    all rows and the held-out families (fitted on the fit families), p90 with each family
    refitted without it, p90 on OPT-13B fitted on OPT-66B's fit families alone
    (:data:`EAGER_MODEL_SPLIT`), and the in-sample p90 when every family is fitted (what the
    form can reach on these curves at all)."""
    p = eager_parts(data_root, profile)
    f = features(eager_points(data_root), {EAGER_GPU: profile} if profile is not None else None)
    kern = f["kernels_s"].to_numpy(float)
    base = f[[f"x_{k}" for k in PARAM_KEYS]].to_numpy(float)
    meas = f["value_s"].to_numpy(float)
    fit = (f["split"] == "fit").to_numpy()
    fam = (f["model"] + "|" + f["tp"].astype(str)).to_numpy()
    model = f["model"].to_numpy()
    train_m, test_m = EAGER_MODEL_SPLIT
    cols = _eager_term_columns(p)
    every = np.ones(len(f), bool)

    def score(name: str, x: np.ndarray, n_new: int) -> dict[str, Any]:
        theta = solve(kern[fit], x[fit], meas[fit])
        a = ape(kern + x @ theta, meas)
        lofo = np.empty(len(a))
        for fa in np.unique(fam):
            t, tr = fam == fa, fit & (fam != fa)
            lofo[t] = ape(kern + x @ solve(kern[tr], x[tr], meas[tr]), meas)[t]
        tr = fit & (model == train_m)
        cross = ape(kern + x @ solve(kern[tr], x[tr], meas[tr]), meas)[model == test_m]
        ins = ape(kern + x @ solve(kern, x, meas), meas)
        return {
            "form": name,
            # below a picosecond (per unit) or 1e-12 (a fraction) the solver's zero
            "coef": (float(theta[-1]) if theta[-1] >= 1e-12 else 0.0) if n_new else float("nan"),
            "all": float(np.median(a)), "all_p90": float(np.percentile(a, 90)),
            "held_out": float(np.median(a[~fit])),
            "held_out_p90": float(np.percentile(a[~fit], 90)),
            "by_family_p90": float(np.percentile(lofo, 90)),
            f"{test_m}_from_{train_m}_p90": float(np.percentile(cross, 90)),
            "every_family_in_sample_p90": float(np.percentile(ins[every], 90)),
        }  # fmt: skip

    rows = [score("additive", base, 0)]
    for name, col in cols.items():
        rows.append(score(f"+ {name}", np.c_[base, col], 1))
    rows.append(score("+ every term", np.c_[base, np.column_stack(list(cols.values()))], 0))
    return pd.DataFrame(rows)


def eager_p90_points(data_root: Path) -> pd.DataFrame:
    """Where the shipped ``vllm-eager-2023`` profile's p90 comes from: the DistServe points at
    or above the all-rows 90th-percentile APE, grouped by (model, TP, phase, batch range),
    with their count, how many lie in DistServe's profiled grid (:func:`in_profiled_domain`)
    and the range of measured / predicted."""
    r = fit_all(data_root)["vllm-eager-2023"]["rows"]
    r = r[r["source"] == f"distserve-{EAGER_FILE}"].reset_index(drop=True)
    a = r["ape"].to_numpy(float)
    top = r[a >= np.percentile(a, 90)].copy()
    top["inside"] = in_profiled_domain(top)
    top["phase"] = np.where(top["metric"] == "prefill_step_s", "prefill", "decode")
    top["ratio"] = top["value_s"] / top["pred_s"]
    b = top["batch"].to_numpy(int)
    top["batches"] = np.where(b <= 8, "1-8", np.where(b <= 64, "16-64", "128-256"))
    top["tokens"] = top["batch"] * top["isl"]
    g = top.groupby(["model", "tp", "phase", "batches"], sort=True)
    return g.agg(
        n=("ratio", "size"),
        in_grid=("inside", "sum"),
        min_tokens=("tokens", "min"),
        max_tokens=("tokens", "max"),
        measured_over_predicted_min=("ratio", "min"),
        measured_over_predicted_max=("ratio", "max"),
    ).reset_index()


def print_eager_forms(data_root: Path) -> int:
    """``--eager-forms``: :func:`eager_forms` and :func:`curve_checks`, printed."""
    try:
        forms = eager_forms(data_root, forms=(*EAGER_FORMS, EAGER_OVERLAP_PREFILL))
        checks = curve_checks(data_root, get_gpu(EAGER_GPU).hbm_bytes_per_s)
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    for form, f in forms.items():
        prm = ", ".join(
            f"{k} {v:.3f}" if k == "prefill_kernel_scale" else f"{k} {v * 1e6:.1f} us"
            for k, v in f["params"].items()
        )
        print(f"vllm-eager-2023 {form}: {prm}")
        _print_parts(f)
    try:
        second = second_source_check(data_root)
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    print(
        "Second source, Splitwise's 2023-vLLM measurements (Llama-2-70B, DGX-A100, TP 2/4/8; "
        "calibration/engine_data/splitwise_llama2_70b_a100.csv), each form fitted as named "
        "(not shipped; the additive form on DistServe's fit families is the shipped fit):"
    )
    for r in second:
        prm = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in r["params"].items())
        print(
            f"  {r['form']:14s} {r['fitted_on']:48s} {r['rows']:34s} n={r['n']:4d} "
            f"median APE {100 * r['median_ape']:5.1f}% p90 {100 * r['p90_ape']:5.1f}%  [{prm}]"
        )
    print("Splitwise's batch-1 rows (ms): measured, kernels alone, the shipped profile")
    print(splitwise_batch1(data_root).round(1).to_string(index=False))
    every = eager_fit_every_family(data_root)
    st = every["error"]["all"]
    print(
        f"vllm-eager-2023 additive, fitted to every family (not shipped): n={st['n']} "
        f"median APE {100 * st['median_ape']:.1f}% p90 {100 * st['p90_ape']:.1f}%"
    )
    print("DistServe 2023-vLLM curves, per (model, TP):")
    print(checks.round(3).to_string(index=False))
    print(
        "The shipped step model (launch floor) on DistServe's profiled grid, fitted with "
        "DistServe's small-batch decode form: the KV bandwidth its slope implies, beside the "
        "curve's:"
    )
    print(floor_curve_slopes(data_root).round(3).to_string(index=False))
    print("Each form fitted to every vllm-eager-2023 row of both sources (in sample):")
    for form, a in eager_every_row_in_sample(data_root).items():
        print(
            f"  {form:16s} n={len(a):4d} median APE {100 * np.median(a):5.1f}% "
            f"p90 {100 * np.percentile(a, 90):5.1f}%"
        )
    try:
        box = same_box_comparison(data_root)
        scale = eager_prefill_scale(data_root)
        pts = eager_points(data_root)
        inside = in_profiled_domain(pts)
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    print(
        "Same A100s and harness: DistServe's C++ engine and 2023 vLLM against the kernel "
        "model (median measured / kernels), and vLLM minus the C++ engine at "
        f"{SAME_BOX_PREFILL[0]} x {SAME_BOX_PREFILL[1]} prompt tokens and at decode batch "
        f"{SAME_BOX_DECODE[0]}, context {SAME_BOX_DECODE[1]}:"
    )
    print(box.round(3).to_string(index=False))
    prm = ", ".join(
        f"{k} {v:.3f}" if k == "prefill_kernel_scale" else f"{k} {v * 1e6:.1f} us"
        for k, v in scale["params"].items()
    )
    print(f"vllm-eager-2023 additive + prefill kernel scale (not shipped): {prm}")
    _print_parts(scale)
    try:
        ar = tp_allreduce_term(data_root)
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    print(
        "A per-all-reduce cost c x g(tp) (not shipped): fitted on the C++ engine's fit "
        "families, carried to 2023 vLLM (overheads refitted); median / p90 APE:"
    )
    print(ar.round(4).to_string(index=False))
    try:
        top = eager_p90_points(data_root)
        screen = eager_term_screen(data_root)
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    print(
        "Where the shipped profile's p90 comes from: points at or above the all-rows p90 APE, "
        "by (model, TP, phase, batch range); tokens = batch x prompt or context length:"
    )
    print(top.round(3).to_string(index=False))
    print(
        "Costs of the 2023 stack added to the additive form, one at a time, then all (not "
        "shipped); coef in seconds per unit or a fraction of the kernel part; APE median / p90:"
    )
    for name, what in EAGER_TERMS.items():
        print(f"  {name}: {what}")
    print(
        screen.round(4)
        .assign(coef=[f"{c:.3g}" if c == c else "" for c in screen["coef"]])
        .to_string(index=False)
    )
    print(
        f"DistServe points outside the profiled grid (distserve_harness.json): "
        f"{int((~inside).sum())} of {len(pts)} (OPT-66B TP8, absent from the published grid, "
        f"counted as outside: {int(((pts['model'] == 'opt-66b') & (pts['tp'] == 8)).sum())})"
    )
    print_prefill_structure(data_root)
    return 0


def print_prefill_structure(data_root: Path) -> None:
    """The prefill residual's structure (``--eager-forms``, last tables): the all-reduce
    factor of DistServe's C++ engine and of Splitwise's 2023 vLLM, and the screen of
    :func:`eager_prefill_screen`."""
    ar = cxx_prefill_allreduce(data_root)
    for key, who in (("cxx", "DistServe's C++ engine, prefill steps"),
                     ("splitwise", "Splitwise's 2023 vLLM, prefills of <= 2,048 tokens")):  # fmt: skip
        r = ar[key]
        extra = f", plus {r['per_step_s'] * 1e3:.2f} ms a step" if "per_step_s" in r else ""
        print(
            f"{who}: all-reduces x {r['allreduce_scale']:.3f} of nccl-tests' time{extra}; "
            f"median / p90 APE {r['kernels_only']['median_ape']:.1%} / "
            f"{r['kernels_only']['p90_ape']:.1%} -> {r['fitted']['median_ape']:.1%} / "
            f"{r['fitted']['p90_ape']:.1%}; per family (median, before -> after): "
            + ", ".join(f"{f} {b:.1%} -> {a:.1%}" for f, (b, a) in r["by_family"].items())
        )
        if "held_out_by_family" in r:
            lo, hi = r["allreduce_scale_without_each_family"]
            print(
                f"  each family predicted by a fit without it: all-reduces x {lo:.2f}-{hi:.2f}, "
                f"median / p90 APE {r['held_out_by_family']['median_ape']:.1%} / "
                f"{r['held_out_by_family']['p90_ape']:.1%}"
            )
    print(
        "The shipped overlap form with costs of a physical meaning in place of its per-token "
        "host time, fitted on DistServe's fit families (median / p90 APE):"
    )
    for name, what in PREFILL_SCREEN_TERMS.items():
        print(f"  {name}: {what}")
    df = eager_prefill_screen(data_root, cxx_allreduce=ar["cxx"]["allreduce_scale"])
    cols = ("all", "distserve_fit", "distserve_held_out", "splitwise_held_out",
            "distserve_by_family", "distserve_every_family_in_sample")  # fmt: skip
    table = pd.DataFrame(
        {
            "form": df["form"],
            **{c: [f"{v['median_ape']:.1%} / {v['p90_ape']:.1%}" for v in df[c]] for c in cols},
        }
    )
    print(table.to_string(index=False))
    for form, params in zip(df["form"], df["params"], strict=True):
        print(f"  {form}: " + ", ".join(f"{k} {v:.4g}" for k, v in params.items()))


def _print_parts(form: dict) -> None:
    """One line per error part of an eager form (all rows, fit, hold-out, held out by
    family, and every family fitted in sample where the form has it): count, median and
    90th-percentile absolute percentage error."""
    for part in ("all", "fit", "holdout", "held_out_by_family", "every_family_in_sample"):
        if part not in form:
            continue
        st = form[part]
        print(
            f"  {part:20s} n={st['n']:4d} median APE {100 * st['median_ape']:5.1f}% "
            f"p90 {100 * st['p90_ape']:5.1f}%"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.engines", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    p.add_argument(
        "--eager-forms",
        action="store_true",
        help="only the vllm-eager-2023 structure check: additive vs overlapped host time, "
        "and the physical consistency of DistServe's curves",
    )
    p.add_argument(
        "--rows",
        metavar="ENGINE",
        choices=ENGINE_NAMES,
        help="every measurement of ENGINE with the shipped-form fit's prediction",
    )
    p.add_argument(
        "--moe-check",
        action="store_true",
        help="the vllm MoE rows with the shipped profiles, with the H100's grouped-GEMM "
        "parameters uncarried and with their small-m compute floor removed (diagnostics)",
    )
    p.add_argument(
        "--sglang-moe-configs",
        action="store_true",
        help="SGLang 0.5.14's Mixtral-8x7B MoE rows per (TP, EP): which ran a tuned tile "
        "config (diagnostic of the sglang grouped-GEMM fit)",
    )
    p.add_argument(
        "--h800-gemm",
        action="store_true",
        help="DeepGEMM's H800 FP8 GEMM table against the H800 profile's FP8 GEMM (the "
        "efficiencies it carries from the H100 SXM)",
    )
    p.add_argument(
        "--host-check",
        action="store_true",
        help="vllm-eager-2023 on Splitwise's DGX-H100 rows: the same runs on both DGXs, the "
        "A100-fitted host terms as they are and times one host-speed factor",
    )
    p.add_argument(
        "--eager-regimes",
        action="store_true",
        help="vllm-eager-2023's shipped fit split by regime (source, model, TP, phase, batch) "
        "and the 2023 PagedAttention per-query-head decode check (diagnostics)",
    )
    p.add_argument(
        "--tp-consistency",
        action="store_true",
        help="vllm-eager-2023: which configurations' times at three TPs contradict every "
        "sharded-plus-rest decomposition (no such form fits them), and the missed rows among them",
    )
    p.add_argument(
        "--splitwise-tp-split",
        action="store_true",
        help="Splitwise's single-prompt first-token latencies split by TP 2 and 4 into a "
        "sharded and an unsharded part, measured and predicted, with the runs' spread",
    )
    p.add_argument(
        "--lmdeploy-check",
        action="store_true",
        help="LMDeploy TurboMind's A100 table against the step model's kernels alone "
        "(why there is no lmdeploy profile)",
    )
    args = p.parse_args(argv)
    if args.h800_gemm:
        try:
            t = h800_gemm_check()
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        print(t.round(3).to_string(index=False))
        mem = t[t["m"] <= DEEPGEMM_STREAM_M]
        r = mem["measured_over_predicted"]
        mem_eff = load_profile("h800-sxm").gemm_params("fp8").mem_eff
        print(
            f"m <= {DEEPGEMM_STREAM_M}: measured / predicted median {r.median():.3f} "
            f"({r.min():.3f}-{r.max():.3f}); best stream {mem['streamed_of_peak'].max():.3f} "
            f"of peak against the carried fp8 mem_eff {mem_eff:.3f}"
        )
        return 0
    if args.sglang_moe_configs:
        try:
            t = sglang_moe_configs(Path(args.data))
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        print(t.round(3).to_string(index=False))
        return 0
    if args.host_check:
        try:
            hc = eager_host_check(Path(args.data))
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        r = hc["ratio"]
        floor = (r["metric"] == "decode_step_s") & (r["batch"] <= 8)
        print("Splitwise, same configuration on DGX-H100 over DGX-A100 (measured):")
        print(r.round(4).to_string(index=False))
        q = r.loc[floor, "ratio"]
        print(f"decode steps, batch <= 8: n={len(q)} median {q.median():.3f} ({q.min():.3f}-{q.max():.3f})")  # fmt: skip
        for gpu, (med, p90) in hc["shipped"].items():
            print(
                f"A100-fitted host terms, {gpu} rows: median APE {100 * med:.1f}% p90 {100 * p90:.1f}%"
            )
        med, p90 = hc["scaled_h100"]
        print(
            f"host terms x {hc['host_scale']:.2f} (least median error on the H100 rows, in "
            f"sample): median APE {100 * med:.1f}% p90 {100 * p90:.1f}%"
        )
        return 0
    if args.lmdeploy_check:
        try:
            t = lmdeploy_check()
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        cols = ["model", "tp", "batch", "isl", "osl", "value_s", "kernels_s"]
        print(
            t[cols + ["kernels_over_measured", "implied_host_ms"]].round(4).to_string(index=False)
        )
        for m, g in t.groupby("model"):
            k = g["kernels_over_measured"].to_numpy(float)
            print(
                f"{m}: kernels alone / measured {k.min():.3f}-{k.max():.3f}, median {np.median(k):.3f}"
            )
        return 0
    if args.tp_consistency:
        try:
            rows = fit_all(Path(args.data))[EAGER_ENGINE]["rows"].reset_index(drop=True)
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        tri = tp_consistency(rows)
        low = tri[tri["ratio"] < 1.0]
        print(
            f"vllm-eager-2023: {len(tri)} TP triples of one configuration, {len(low)} below the "
            f"bound T(c) >= T(b) - a T(a) (1/b - 1/c); predicted: "
            f"{int((tri['pred_ratio'] < 1.0).sum())} below"
        )
        grp = ["source", "model", "metric", "tp_a", "tp_b", "tp_c"]
        print(
            low.groupby(grp)
            .agg(n=("ratio", "size"), lowest=("ratio", "min"), median=("ratio", "median"))
            .round(3)
            .to_string()
        )
        inc = tp_inconsistent_rows(rows, tri)
        row_ape = ape(rows["pred_s"].to_numpy(float), rows["value_s"].to_numpy(float))
        miss = row_ape > EAGER_REGIME_MISS
        print(
            f"rows in such a triple: {int(inc.sum())}; of the {int(miss.sum())} rows erring "
            f"more than {EAGER_REGIME_MISS:.0%}: {int((inc & miss).sum())}"
        )
        by = rows.assign(
            phase=np.where(rows["metric"].isin(PREFILL_METRICS), "prefill", "decode"),
            missed=miss,
            missed_in_triple=inc & miss,
        )
        t = by.groupby(["source", "model", "tp", "phase"])[["missed", "missed_in_triple"]].sum()
        print(t[t["missed"] > 0].to_string())
        rest = row_ape[~inc]
        print(
            f"the other {len(rest)} rows: median APE {100 * np.median(rest):.1f}% "
            f"p90 {100 * np.percentile(rest, 90):.1f}%"
        )
        return 0
    if args.splitwise_tp_split:
        try:
            rows = fit_all(Path(args.data))[EAGER_ENGINE]["rows"]
            split = splitwise_tp_split(rows)
            spread = pd.concat(
                [splitwise_run_spread(g).assign(gpu=g) for g in SPLITWISE_FILES], ignore_index=True
            )
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        print("Splitwise single prompts, T(tp) = sharded / tp + unsharded through TP 2 and 4 (ms):")
        print(split.round(1).to_string(index=False))
        wide = spread.pivot_table(index=["gpu", "isl"], columns="tp", values="run_spread")
        print("spread of the five runs, (max - min) / median, per TP:")
        print((100 * wide).round(1).to_string())
        return 0
    if args.eager_regimes:
        try:
            pts = all_points(Path(args.data))
            rows = fit_eager(features(pts[pts["engine"] == EAGER_ENGINE].reset_index(drop=True)))
            reg = eager_regimes(rows["rows"])
            pqh = eager_per_query_head_check(Path(args.data))
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        print("vllm-eager-2023, shipped fit, by regime (ratio = measured / predicted):")
        print(reg.round(3).to_string(index=False))
        print(
            f"2023 PagedAttention per query head ({EAGER_PER_QUERY_HEAD_SOURCE}); rate 0 = shipped:"
        )
        print(pqh.round(4).to_string(index=False))
        return 0
    if args.eager_forms:
        return print_eager_forms(Path(args.data))
    if args.moe_check:
        try:
            t = moe_floor_check()
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        print(t.round(4).to_string(index=False))
        for name, _ in MOE_CHECK_VARIANTS:
            a = np.abs(t[f"measured_over_{name}"].to_numpy(float) ** -1 - 1.0)
            print(
                f"{name}: n={len(a)} median APE {100 * np.median(a):.1f}% "
                f"p90 {100 * np.percentile(a, 90):.1f}%"
            )
        return 0
    if args.rows:
        try:
            r = fit_all(Path(args.data))[args.rows]["rows"]
        except UserError as err:
            print(f"engines: error: {err}", file=sys.stderr)
            return 2
        cols = ["source", "model", "gpu", "tp", "weight_dtype", "batch", "isl", "osl", "metric"]
        out = r[cols + ["split"]].assign(
            measured_s=r["value_s"],
            predicted_s=r["pred_s"],
            measured_over_predicted=r["value_s"] / r["pred_s"],
            # what the measurement leaves for host time per iteration over the kernels alone
            implied_host_ms=1e3 * (r["value_s"] - r["kernels_s"]) / r["x_per_iteration_s"],
        )
        print(out.sort_values("measured_over_predicted").round(4).to_string(index=False))
        return 0
    try:
        fits = fit_all(Path(args.data))
        for name, f in fits.items():
            e = f["error"]
            prm = ", ".join(
                f"{k} {v / 1e12:.2f} TB/s"
                if k.endswith("_bytes_per_s")
                else f"{k} {v * 1e6:.2f} us"
                for k, v in f["params"].items()
            )
            print(f"{name}: {prm}")
            for part in ("all", "fit", "holdout", "held_out_by_family", "kernels_only"):
                st = e[part]
                if st["n"]:
                    print(
                        f"  {part:20s} n={st['n']:4d} median APE {100 * st['median_ape']:5.1f}% "
                        f"p90 {100 * st['p90_ape']:5.1f}%"
                    )
        for gpu in public.AIC_GPU_DIR:
            gg = graph_gap(Path(args.data), gpu)
            print(
                f"{gpu}: CUDA-graph gap {1e6 * gg['gap_s']:+.2f} us per kernel (slope "
                f"{gg['slope']:.3f}) -> graph_replay.per_layer_s "
                f"{1e6 * ELEMENTWISE_KERNELS_PER_LAYER * max(gg['gap_s'], 0.0):.2f} us"
            )
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
