"""Fit the shipped A100-80GB and H100-SXM profiles to public measured kernel tables, and
derive the other catalog GPUs' profiles from them.

Run (from the repo root)::

    python -m calibration.fit_public --data ../shared/data --engines

What is fitted to what (all through the :mod:`disaggsim.costmodel.ops` forms; every
AIConfigurator row is a kernel replayed in a CUDA graph, so no launch time is inside):

- ``gemm.bf16``: AIConfigurator vLLM bf16 rows (``torch.nn.functional.linear``, cuBLAS);
- ``gemm.fp8`` (H100): TensorRT-LLM's FP8 GEMM (cuBLASLt) on its rows. Every framework's
  FP8 row holds an activation-quantisation kernel beside the GEMM; it is costed as the
  step model costs it (one element-wise kernel, 3 bytes per input element) and added to
  every prediction, and TensorRT-LLM's rows also hold a dynamic per-tensor scale (memset
  + amax kernel, fitted beside the GEMM as ``dynamic_scale_s`` / ``dynamic_scale_bw_eff``),
  so the fit is the GEMM alone, its floor cuBLAS's bf16 one (:func:`fit_gemm_fp8`);
- ``attention_backends``: per backend (``vllm-flash``: vLLM's FlashAttention, FA3 on
  Hopper / FA2 on Ampere; ``sglang-flash``: SGLang's; ``trtllm``: TensorRT-LLM's
  attention op) decode attention per KV dtype and prefill attention (bf16 KV, full
  causal); ``ops.decode_attention`` / ``ops.prefill_attention`` (the generic kernel) are
  ``vllm-flash``'s; the step model picks the fastest backend per head layout (``auto``);
- ``elementwise``: Vidur ``mlp.csv`` norm / RoPE / activation / residual-add rows;
- ``allreduce.<n>``: AIConfigurator nccl-tests all_reduce (half) rows per GPU count;
- ``copy.d2d`` / ``gather`` bandwidth from the fitted element-wise bandwidth (a copy reads
  and writes each byte); host and peer copies and the gather's per-block cost are carried
  (no public table measures them as a single copy);
- ``graph_replay.per_layer_s``: :func:`calibration.engines.graph_gap`.

Other GPUs (:func:`prior_from`): h100-pcie and h200-sxm share the H100-SXM kernel
efficiencies (same SM architecture, the model's Hopper rule) with their own datasheet
peaks; b200 (Blackwell) and l40s (Ada, from A100) are priors across architectures. A GPU
with its own measurements (:data:`MEASURED_RUNS`: the H200 run of 2026-11-29) gets them
on top of that profile through :func:`calibration.fit.build_profile`, which fits only
what the timing allows (``docs/calibration.md``); the transferred profile is kept as
``calibration/priors/<gpu>.json``. ``--engines`` refits the serving-engine profiles
(:mod:`calibration.engines`) once the kernels are final.

A shipped profile whose provenance kind is ``measured`` is never overwritten by the
transfer: that GPU's transferred profile goes to ``calibration/priors/<gpu>.json`` and the
measured profile is rebuilt from its raw run on top of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from calibration import allreduce_pcie, public
from calibration.fit import (
    FitError,
    Fitted,
    _params_dict,
    _round,
    allreduce_dict,
    fit_allreduce,
    fit_decode_attention,
    fit_decode_wave,
    fit_elementwise,
    fit_gemm,
    fit_generic,
    fit_prefill_attention,
    held_out_apes,
    restart_on_one_blas_thread,
    shape_family,
)
from disaggsim.catalog import get_gpu
from disaggsim.costmodel import ops
from disaggsim.costmodel.step import FP8_QUANT_BYTES_PER_ELEM
from disaggsim.errors import UserError
from disaggsim.hardware.profile import (
    DECODE_ONLY_BACKENDS,
    DecodeAttentionParams,
    ElementwiseParams,
    GemmParams,
    GemmTileBranch,
    GpuPeaks,
    TiledGemmParams,
    load_profile,
    profile_from_dict,
    shipped_profile_path,
)

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python -m calibration.fit_public --data ../shared/data --engines"
FITTED_GPUS = ("a100-80gb", "h100-sxm")
PRIORS_DIR = Path(__file__).resolve().parent / "priors"
PRIORS = {
    "h100-pcie": "h100-sxm",
    "h200-sxm": "h100-sxm",
    "b200": "h100-sxm",
    "l40s": "a100-80gb",
    "h800-sxm": "h100-sxm",  # the same chip with NVLink cut to 200 GB/s per direction
}
SM_ARCH = {
    "a100-80gb": "ampere",
    "h100-sxm": "hopper",
    "h100-pcie": "hopper",
    "h200-sxm": "hopper",
    "h800-sxm": "hopper",
    "b200": "blackwell",
    "l40s": "ada",
}
MEASURED_RUNS = {"h200-sxm": "calibration/runs/h200-2026-11-29"}
# the rows each GEMM dtype's accuracy target applies to: vLLM's cuBLAS bf16, and for fp8
# SGLang's (its precomputed-scale path)
GEMM_FRAMEWORK = {"bf16": "vllm", "fp8": "sglang"}
# ops.gemm.fp8 is TensorRT-LLM's FP8 GEMM (cuBLASLt through cublas_scaled_mm), fitted on its rows
FP8_FRAMEWORK = "trtllm"
# frameworks whose FP8 GEMM rows quantise their activations dynamically, per tensor: the
# AIConfigurator collector (collector/trtllm/collect_gemm.py) loads TensorRT-LLM's FP8
# Linear without an input_scale, so FP8QDQLinearMethod.apply runs quantize_e4m3_per_tensor
# (a memset, an amax kernel on a 1024 x 1024 grid, then the quantisation) before each GEMM
DYNAMIC_SCALE_FRAMEWORKS = ("trtllm",)
# the framework whose public kernel-table rows each backend is fitted on (the framework that
# ships it: profile.ATTENTION_BACKEND_FRAMEWORKS, tests/test_attention_backend_selection.py)
BACKEND_FRAMEWORKS = {
    "vllm-flash": "vllm",
    "sglang-flash": "sglang",
    "trtllm": "trtllm",
    "trtllm-mmha": "trtllm",
}
# backends whose prefill kernel changes with an FP8 KV cache, fitted per KV dtype: with an
# FP8 KV cache TensorRT-LLM's context FMHA on Hopper runs its FP8 kernel (the public rows
# with bf16 attention and FP8 KV time as the FP8-math rows, within 3% median at every
# prompt length; bf16 KV is 1.04-1.41x slower); vLLM's and SGLang's keep one fit
FP8_KV_PREFILL_BACKENDS = ("trtllm",)
# grouped decode kernels fitted with a group rate (group_bytes_per_s): TensorRT-LLM's XQA
# runs its tensor-core products and softmax for every query head of the group against each
# KV byte; on its large reads (>= 64 MB) the H100 rows reach 2.4-2.7 TB/s at 2 query heads
# per KV head and 1.1-1.4 TB/s (bf16) at 24-32 (python -m calibration.fit_public --data
# ../shared/data --decode-rates h100-sxm, per query heads per KV head)
GROUP_RATE_BACKENDS = ("trtllm",)
# decode kernels fitted with the per-item work's fixed part (per_item_s) and, for XQA, its
# query-head part (per_q_elem_s; ops.decode_item_seconds): TensorRT-LLM's short-context
# decode time follows its work items (one thread block each) and the query heads an XQA
# item carries, not the sequences (tests/test_decode_item_terms.py)
ITEM_TERM_BACKENDS = ("trtllm", "trtllm-mmha")
# decode kernels fitted as multi-block wave kernels (ops.decode_wave_lines: the kernel's
# own split count, whole waves of thread blocks over the SMs): TensorRT-LLM's XQA, on
# GPUs whose SM count is known (NUM_SMS); its item terms above are then unused. Masked
# MHA ("trtllm-mmha") has the form too (choose_per_query_head_decode, `--mmha-split`) but
# ships its line form: its wave lines win on the H100's kernel rows, held out by layout,
# and not on the A100's, and TensorRT-LLM's engine rows score worse with them (their
# large-batch per-token cost, and the host refit it moves; docs/calibration.md)
WAVE_BACKENDS = ("trtllm",)
# line-form decode kernels fitted with a resident-block rate (their shared memory limits the
# blocks resident per SM at long contexts: TensorRT-LLM's masked MHA, ops.mmha_resident_blocks)
OCCUPANCY_BACKENDS = ("trtllm-mmha",)
# TensorRT-LLM's decode kernels: ``trtllm`` is its XQA (grouped) kernel, ``trtllm-mmha`` the
# masked multi-head attention it runs where XQA refuses the layout (trtllm_decode_kernel)
TRTLLM_PER_QUERY_HEAD_BACKEND = "trtllm-mmha"
# Masked MHA with an FP8 KV cache is two compiled kernels: TensorRT-LLM's
# decoderMaskedMultiheadAttentionTemplate.h specialises Launch_bounds_config for an FP8 cache
# at 256 threads per block, head size (Dh_MAX) 64 and 128, no beams, to
# __launch_bounds__(256, 4) (at most 64 registers a thread, "helps increase occupancy"),
# and leaves Dh_MAX 256 (head sizes 129-256) unbounded. The rows show two kernels: at 2
# resident blocks the FP8 rows stream 3.0 x 10^12 query-head elements a second at head dim
# 256 against 2.0-2.2 at 64-128 (bf16: 2.3 at every head dim; `--mmha-element-rates`),
# faster at 256 in every regime. The FP8 masked-MHA fit is the launch-bounded
# kernel's, on its rows (head dims up to this), the kernel every catalog model's layout
# runs (head dims 64 and 128); the rows above are another kernel, not fitted
MMHA_FP8_BOUNDED_MAX_HEAD_DIM = 128
MINOR_KERNELS = ("vllm_flash_attn_fa4", "triton")
GENERIC_BACKEND = "vllm-flash"
AUTO_MAX_APE = 0.15
# decode kernels never in ``attention_auto`` whatever their error: TensorRT-LLM's XQA, which
# takes only 2-32 query heads per KV head and runs beside masked MHA in TensorRT-LLM alone.
# ``attention_auto`` is the pick of a worker whose engine names no framework (the
# kernel-only profile); a serving engine's worker runs its own framework's kernels in both
# phases whatever their speed (step.pick_attention_backends, engines.ENGINE_FRAMEWORKS)
ENGINE_OWN_DECODE_BACKENDS = ("trtllm",)
ATTENTION_FRAMEWORK = "vllm"  # the generic kernel's rows


def peaks_of(gpu: str) -> GpuPeaks:
    g = get_gpu(gpu)
    return GpuPeaks(g.bf16_flop_per_s, g.fp8_flop_per_s, g.hbm_bytes_per_s, g.hbm_bytes)


def _err(e: FitError, source: str) -> dict[str, Any]:
    return {**e.as_dict(), "source": source}


# TensorRT-LLM's XQA takes at most this many query heads per KV head (its jit
# supportConfigQGMMA/HMMA: ``head_grp_size * beam_width > 32`` -> no XQA); larger groups
# decode on masked MHA, one thread block per query head
XQA_MAX_Q_PER_KV = 32
XQA_SOURCE = (
    "TensorRT-LLM decoderXQAImplJIT/kernelUtils.cpp supportConfigCommon, supportConfigHMMA "
    "and supportConfigQGMMA (the 1.x JIT XQA whose kernels the AIConfigurator trtllm 1.3 "
    "tables time): no XQA for vanilla MHA (one query head per KV head: 'for performance "
    "reasons'), for head_grp_size > 32 or for a head size outside 16..256 or not a multiple "
    "of 16; masked MHA (decoderMaskedMultiheadAttention) decodes those"
)


def trtllm_xqa(heads, kv_heads, head_dim) -> np.ndarray:
    """Whether TensorRT-LLM decodes a layout with XQA (else masked MHA), per
    :data:`XQA_SOURCE` (single-token generation, beam 1, RoPE models)."""
    h, kh, d = (np.asarray(x, float) for x in (heads, kv_heads, head_dim))
    g = np.round(h / kh)
    return (g >= 2) & (g <= XQA_MAX_Q_PER_KV) & (d % 16 == 0) & (d >= 16) & (d <= 256)


def _backend_rows(frame: pd.DataFrame, backend: str) -> pd.DataFrame:
    """The rows of one attention backend: its framework, its main kernel only (vLLM's few
    FA4 rows and SGLang's Triton rows are other kernels with too few shapes to fit)."""
    rows = frame[frame["framework"] == BACKEND_FRAMEWORKS[backend]]
    return rows[~rows["kernel"].isin(MINOR_KERNELS)]


def _decode_backend_rows(frame: pd.DataFrame, backend: str) -> pd.DataFrame:
    """:func:`_backend_rows` of a decode table, TensorRT-LLM's split by the kernel it runs
    for each layout: XQA rows for ``trtllm``, masked-MHA rows for ``trtllm-mmha``."""
    rows = _backend_rows(frame, backend)
    if BACKEND_FRAMEWORKS[backend] != "trtllm":
        return rows
    xqa = trtllm_xqa(rows["heads"], rows["kv_heads"], rows["head_dim"])
    return rows[~xqa] if backend == TRTLLM_PER_QUERY_HEAD_BACKEND else rows[xqa]


def decode_backend_of_rows(frame: pd.DataFrame) -> np.ndarray:
    """Per decode row, the backend whose kernel its framework ran (TensorRT-LLM: XQA or
    masked MHA by layout); ``""`` for frameworks without one."""
    inv = {"vllm": "vllm-flash", "sglang": "sglang-flash", "trtllm": "trtllm"}
    out = frame["framework"].map(inv).fillna("").to_numpy(object)
    trt = (frame["framework"] == "trtllm").to_numpy()
    mmha = trt & ~trtllm_xqa(frame["heads"], frame["kv_heads"], frame["head_dim"])
    out[mmha] = TRTLLM_PER_QUERY_HEAD_BACKEND
    return out.astype(str)


# AIConfigurator's TensorRT-LLM decode tables collected before its 1.3.0rc20 collector built
# the KV cache as ``CacheType.SELFKONLY`` (the MLA layout: one K plane, V reading K's
# addresses; ai-dynamo/aiconfigurator issue #1379, fixed in the collector that times 1.3.0rc20
# with ``CacheType.SELF``, the layout serving allocates). XQA loads a tile's V right after its
# K, so every V load hits L2 and the kernel reads half the KV bytes from HBM: the A100's 1.0.0
# table streams up to 1.69 x the HBM's bandwidth of K and V, never 2 x (docs/calibration.md,
# "The A100 TensorRT-LLM table reads K alone"). Masked MHA reads a sequence's K in one pass and
# its V in a second: V finds K in L2 only while the K of the blocks in flight fits there (its
# rows over the HBM's bandwidth are all at <= 256 tokens a sequence), so its rows keep the
# serving frame. Versions (major, minor) before this one are K-only.
KV_SELF_LAYOUT_TRTLLM_VERSION = (1, 3)
XQA_K_ONLY_HBM_SHARE = 0.5  # of the KV bytes a K-only table's XQA rows read from HBM


def _table_version(table: str) -> tuple[int, ...]:
    """The version folder of an AIConfigurator table path (``.../trtllm/1.0.0/x.parquet``) as
    numbers, up to the first part that is not one (``1.3.0rc20`` -> ``(1, 3)``)."""
    out: list[int] = []
    for part in Path(table).parent.name.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def table_hbm_share(rows: pd.DataFrame) -> float:
    """Share of its KV bytes the kernel behind decode-table ``rows`` read from HBM when the
    table was timed: :data:`XQA_K_ONLY_HBM_SHARE` for TensorRT-LLM's XQA rows of a table
    collected with a K-only cache (:data:`KV_SELF_LAYOUT_TRTLLM_VERSION`), else 1 (serving's
    K and V, each read once). ``rows`` must come from one table and one kernel."""
    tables = set(rows["table"])
    if len(tables) != 1:
        raise ValueError(f"decode rows from {len(tables)} tables: predict each table apart")
    table = tables.pop()
    if set(rows["framework"]) != {"trtllm"}:
        return 1.0
    xqa = trtllm_xqa(rows["heads"], rows["kv_heads"], rows["head_dim"])
    if not xqa.any() or _table_version(table) >= KV_SELF_LAYOUT_TRTLLM_VERSION:
        return 1.0
    if not xqa.all():
        raise ValueError("decode rows of XQA and masked MHA: predict each kernel apart")
    return XQA_K_ONLY_HBM_SHARE


def table_peaks(peaks: GpuPeaks, rows: pd.DataFrame) -> GpuPeaks:
    """``peaks`` as the kernel behind decode-table ``rows`` saw them: the HBM's bandwidth
    over the share of the KV bytes it read from HBM (:func:`table_hbm_share`), so a form's
    HBM stream term prices the bytes the table's kernel read while its L2 and per-block
    rates price every byte. A fit to the rows in this frame carries the kernel's HBM
    efficiency as serving reads K and V; predicting the rows takes the same frame."""
    share = table_hbm_share(rows)
    return peaks if share == 1.0 else replace(peaks, hbm_bytes_per_s=peaks.hbm_bytes_per_s / share)


def kv_elem_bytes(dtype: str) -> float:
    """Bytes per cached K or V element of a KV dtype (``"fp8"`` or 16-bit)."""
    return 1.0 if dtype == "fp8" else 2.0


def predict_decode_rows(
    peaks: GpuPeaks, params: DecodeAttentionParams, kv: str, rows: pd.DataFrame
) -> np.ndarray:
    """Seconds :func:`ops.decode_attention_time_s` gives each decode-table row (a frame of
    :func:`public.aic_decode_attention`) of one KV dtype ``kv`` under ``params``: the
    layout's query heads per KV head are the grouped kernels' ``q_per_kv`` and, for a
    per-query-head kernel (``params.reread_bytes_per_s`` > 0: masked MHA), the query heads
    re-reading each KV head; every diagnostic and test that predicts table rows calls this.
    ``peaks`` are the GPU's; the rows are predicted in their table's frame
    (:func:`table_peaks`)."""
    g = (rows["heads"] / rows["kv_heads"]).round().to_numpy(float)
    reread = g if params.per_query_head else 1.0
    return np.asarray(
        ops.decode_attention_time_s(
            table_peaks(peaks, rows), params, rows["batch"].to_numpy(float), rows["context_tokens"].to_numpy(float),
            rows["kv_heads"].to_numpy(float), rows["head_dim"].to_numpy(float),
            kv_elem_bytes(kv), reread, q_per_kv=g,
        ),
        float,
    )  # fmt: skip


def fit_decode_backend(
    peaks: GpuPeaks,
    backend: str,
    dtype: str,
    rows: pd.DataFrame,
    held_out: bool = True,
    num_sms: int = 0,
    occupancy: tuple[float, float] | None = None,
) -> Fitted:
    """One backend's decode attention for one KV dtype (``rows``: its kernel rows, from
    :func:`_decode_backend_rows`), held out by head-layout family unless ``held_out`` is
    False (the parameters are the same either way); a :data:`WAVE_BACKENDS` kernel as a
    multi-block wave kernel on ``num_sms`` SMs when given (> 0); an
    :data:`OCCUPANCY_BACKENDS` line-form kernel with its resident-block rate when
    ``occupancy`` (SMs, shared memory per SM in KiB) is given. ``peaks`` are the GPU's; the
    rows are fitted in their table's frame (:func:`table_peaks`)."""
    peaks = table_peaks(peaks, rows)
    shape = (rows["batch"], rows["context_tokens"], rows["kv_heads"], rows["head_dim"], rows["t_s"])
    q_per_kv = (rows["heads"] / rows["kv_heads"]).round()
    common: dict[str, Any] = {
        "kv_elem_bytes": 1.0 if dtype == "fp8" else 2.0,
        "groups": shape_family(rows["heads"], rows["kv_heads"], rows["head_dim"]),
        "held_out": held_out,
    }
    if backend in WAVE_BACKENDS and num_sms > 0:
        per_qh = backend == TRTLLM_PER_QUERY_HEAD_BACKEND
        return fit_decode_wave(peaks, *shape, q_per_kv, num_sms, per_query_head=per_qh, **common)
    return fit_decode_attention(
        peaks,
        *shape,
        q_per_kv=q_per_kv if backend == TRTLLM_PER_QUERY_HEAD_BACKEND else None,
        # masked MHA splits a sequence only below one wave of items (multi_block_grid_setup)
        # and its occupancy lines change by context interval, which a split-KV kernel's
        # two stream lines cannot follow in the step model: it takes the bandwidth share
        # (monotone, one line; docs/calibration.md, "Decode forms that never fall")
        split_kv=backend != TRTLLM_PER_QUERY_HEAD_BACKEND,
        group_q_per_kv=q_per_kv if backend in GROUP_RATE_BACKENDS else None,
        item_terms=backend in ITEM_TERM_BACKENDS,
        occupancy=occupancy if backend in OCCUPANCY_BACKENDS else None,
        **common,
    )


def mmha_fit_rows(rows: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """The masked-MHA rows of one KV dtype its shipped fit stands on: for an FP8 cache the
    launch-bounded kernel's (head dim up to :data:`MMHA_FP8_BOUNDED_MAX_HEAD_DIM`), else
    all."""
    if dtype != "fp8":
        return rows
    return rows[rows["head_dim"] <= MMHA_FP8_BOUNDED_MAX_HEAD_DIM]


def _round5(x: float | None) -> float | None:
    return None if x is None else round(float(x), 5)


def wave_form_wins(wave: FitError, line: FitError) -> bool:
    """The rule between masked MHA's two forms: the wave lines where their held-out median
    is lower than the line form's and their held-out 90th percentile no higher."""
    w_med, w_p90 = wave.held_out_median_ape, wave.held_out_p90_ape
    l_med, l_p90 = line.held_out_median_ape, line.held_out_p90_ape
    if w_med is None or w_p90 is None or l_med is None or l_p90 is None:
        return False
    return w_med < l_med and w_p90 <= l_p90


def choose_per_query_head_decode(
    peaks: GpuPeaks, dtype: str, rows: pd.DataFrame, num_sms: int
) -> tuple[Fitted, dict[str, Any]]:
    """TensorRT-LLM's masked MHA for one KV dtype, fitted in both forms, held out by
    head-layout family: the wave lines of its multi-block rule (``ops.decode_wave_lines``,
    on ``num_sms`` SMs) and the split-KV line form with its per-query-head re-reads. The
    rule: the wave form where it errs less than the line form in held-out median and no
    more in held-out 90th percentile, else the line form. Returns the chosen fit and the
    figures it was chosen by. A diagnostic (``--mmha-split``): the shipped profiles keep
    the line form (:data:`WAVE_BACKENDS`)."""
    shape = (rows["batch"], rows["context_tokens"], rows["kv_heads"], rows["head_dim"], rows["t_s"])
    q_per_kv = (rows["heads"] / rows["kv_heads"]).round()
    groups = shape_family(rows["heads"], rows["kv_heads"], rows["head_dim"])
    elem = 1.0 if dtype == "fp8" else 2.0
    line = fit_decode_backend(peaks, TRTLLM_PER_QUERY_HEAD_BACKEND, dtype, rows, num_sms=0)
    wave = fit_decode_wave(
        peaks, *shape, q_per_kv, num_sms, elem, groups=groups, per_query_head=True
    )
    le, we = line.error, wave.error
    takes_wave = wave_form_wins(we, le)
    choice = {
        "form": "wave" if takes_wave else "line",
        "rule": "wave where its held-out median is lower and its held-out p90 no higher",
        **{
            f"{name}_held_out_{stat}_ape": _round5(getattr(e, f"held_out_{stat}_ape"))
            for name, e in (("wave", we), ("line", le))
            for stat in ("median", "p90")
        },
    }
    return (wave if takes_wave else line), choice


def fit_attention_backends(
    gpu: str, data_root: Path, peaks: GpuPeaks
) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """Per backend: decode attention per KV dtype and prefill attention (bf16 KV, and FP8
    KV for :data:`FP8_KV_PREFILL_BACKENDS`; full causal), fitted to that framework's kernel
    rows, held out by head-layout family."""
    backends: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    tables: set[str] = set()
    dec_all = public.aic_decode_attention(data_root, gpu)
    pre_all = public.aic_prefill_attention(data_root, gpu)
    for backend in BACKEND_FRAMEWORKS:
        dec = _decode_backend_rows(dec_all, backend)
        if dec.empty:
            continue
        per_qh = backend == TRTLLM_PER_QUERY_HEAD_BACKEND
        kind = {"trtllm": ", XQA layouts", TRTLLM_PER_QUERY_HEAD_BACKEND: ", masked-MHA layouts"}
        sec: dict[str, Any] = {"decode_attention": {}}
        for dtype_key, rows in dec.groupby("dtype"):
            dtype = str(dtype_key)
            bounded = ""
            if per_qh and dtype == "fp8":  # the launch-bounded kernel's rows
                rows = mmha_fit_rows(rows, dtype)
                bounded = (
                    f", head dim <= {MMHA_FP8_BOUNDED_MAX_HEAD_DIM}: its launch-bounded kernel"
                )
            share = table_hbm_share(rows)
            frame = (
                f", fitted in the table's frame: its K-only cache read {share:g} of the KV "
                "bytes from HBM"
                if share < 1.0
                else ""
            )
            source = (
                f"{rows['table'].iloc[0]} ({BACKEND_FRAMEWORKS[backend]}, kv {dtype}"
                f"{kind.get(backend, '')}{bounded}{frame})"
            )
            occ = (float(NUM_SMS[gpu]), float(SMEM_PER_SM_KIB[gpu])) if gpu in NUM_SMS else None
            f = fit_decode_backend(
                peaks, backend, dtype, rows, num_sms=NUM_SMS.get(gpu, 0), occupancy=occ
            )
            errors[f"attention.{backend}.decode.{dtype}"] = _err(f.error, source)
            sec["decode_attention"][dtype] = _params_dict(f.params)
            tables.add(rows["table"].iloc[0])
        if per_qh:  # a decode-only kernel: TensorRT-LLM's prefill is the trtllm backend's
            backends[backend] = sec
            continue
        pre_fw = _backend_rows(pre_all, backend)
        kv_dtypes = ("bf16", "fp8") if backend in FP8_KV_PREFILL_BACKENDS else ("bf16",)
        for kv in kv_dtypes:
            pre = pre_fw[pre_fw["kv_dtype"] == kv]
            if pre.empty:
                continue
            f = fit_prefill_attention(
                peaks,
                pre["num_seqs"],
                pre["new_tokens"],
                pre["pairs"],
                pre["heads"],
                pre["head_dim"],
                pre["t_s"],
                "bf16",
                groups=shape_family(pre["heads"], pre["kv_heads"], pre["head_dim"]),
            )
            sec.setdefault("prefill_attention", {})[kv] = _params_dict(f.params)
            errors[f"attention.{backend}.prefill.{kv}"] = _err(
                f.error,
                f"{pre['table'].iloc[0]} ({BACKEND_FRAMEWORKS[backend]}, {kv} KV, full causal)",
            )
            tables.add(pre["table"].iloc[0])
        backends[backend] = sec
    return backends, errors, tables


def auto_candidates(errors: dict[str, Any], backends: dict[str, Any]) -> dict[str, list[str]]:
    """Backends ``auto`` may pick for a worker whose engine names no framework (the
    kernel-only profile; a serving engine runs its own kernels), per phase: those whose fit
    generalises — held-out median APE within :data:`AUTO_MAX_APE` for every dtype fitted.
    Picking the fastest backend by its fitted model would otherwise reward a fit that
    predicts too fast. XQA (:data:`ENGINE_OWN_DECODE_BACKENDS`) is never a decode candidate."""
    out: dict[str, list[str]] = {}
    for phase, op in (("decode", "decode_attention"), ("prefill", "prefill_attention")):
        names = []
        for name, sec in backends.items():
            if name in DECODE_ONLY_BACKENDS:  # an engine's fallback, never a pick of its own
                continue
            if phase == "decode" and name in ENGINE_OWN_DECODE_BACKENDS:
                continue
            dts = list((sec.get(op) or {}).keys())
            errs = [errors.get(f"attention.{name}.{phase}.{dt}", {}) for dt in dts]
            if dts and all(
                (e.get("held_out_median_ape") or e.get("median_ape", 1.0)) <= AUTO_MAX_APE
                for e in errs
            ):
                names.append(name)
        out[phase] = names
    return out


def quant_s(peaks: GpuPeaks, ew: ElementwiseParams, m, k) -> np.ndarray:
    """Seconds of the activation-quantisation kernel in front of an FP8 GEMM of ``m``
    tokens × ``k`` inputs: an element-wise op reading 2 and writing 1 byte per element
    (``FP8_QUANT_BYTES_PER_ELEM``), as the step model costs it."""
    return ops.elementwise_time_s(
        peaks, ew, FP8_QUANT_BYTES_PER_ELEM * np.asarray(m, float) * np.asarray(k, float)
    )


def fp8_row_s(
    peaks: GpuPeaks, ew: ElementwiseParams, prm: GemmParams, framework: str, m, n, k
) -> np.ndarray:
    """Predicted time of a framework's FP8 GEMM row of the public tables on the smooth
    form ``prm``: the GEMM, its activation-quantisation kernel as the step model costs it,
    and where the framework's rows quantise dynamically (:data:`DYNAMIC_SCALE_FRAMEWORKS`)
    the per-tensor scale (``ops.fp8_dynamic_scale_time_s``)."""
    t = ops.gemm_time_s(peaks, prm, m, n, k, "fp8") + quant_s(peaks, ew, m, k)
    if framework in DYNAMIC_SCALE_FRAMEWORKS:
        t = t + ops.fp8_dynamic_scale_time_s(peaks, prm, m, k)
    return t


def fit_gemm_fp8(
    gemm: pd.DataFrame,
    peaks: GpuPeaks,
    ew: ElementwiseParams,
    launch_s: float,
    held_out: bool = True,
) -> tuple[dict[str, float], dict[str, Any], str, np.ndarray]:
    """``ops.gemm.fp8``: TensorRT-LLM's FP8 GEMM (``cublas_scaled_mm``, cuBLASLt) fitted to
    its rows in ``gemm`` (the public tables, or a subset), with what those rows hold beside
    it costed apart (:func:`fp8_row_s`): the activation-quantisation kernel as the step
    model costs it, and the dynamic per-tensor scale (a fixed time and one read of the bf16
    activations, both fitted). The floor cannot be told from the scale's fixed time on these
    rows (both constant), so it is cuBLAS's bf16 floor (``launch_s``, fitted on vLLM's bf16
    rows): the H200 run times ``torch._scaled_mm`` (cuBLASLt FP8, precomputed scales) and
    ``linear`` (cuBLAS bf16) call by call at the same floor (within 0.5 µs). Until
    2026-12-02 the floor was SGLang's rows' and the scale was not modelled: the amax read
    went into the efficiency (0.71) and the scale's ~7.5 µs out of the prediction
    (TensorRT-LLM's rows 29.3% median APE). Returns the profile entry, its fit error, the
    table and (``held_out``) each row's APE predicted by a refit without its (n, k) family
    (5 folds; else empty)."""
    rows = gemm[(gemm["dtype"] == "fp8") & (gemm["framework"] == FP8_FRAMEWORK)]
    m, n, k, ts = (rows[c].to_numpy(float) for c in ("m", "n", "k", "t_s"))

    def params_of(x) -> GemmParams:
        return GemmParams(
            launch_s, x[0], x[1], x[2], dynamic_scale_s=x[3], dynamic_scale_bw_eff=x[4]
        )

    def model(x, idx):
        return fp8_row_s(peaks, ew, params_of(x), FP8_FRAMEWORK, m[idx], n[idx], k[idx])

    starts = [(0.75, 130.0, 0.8, 7e-6, 0.6), (0.9, 300.0, 0.6, 4e-6, 0.9)]
    lower, upper = (1e-3, 1e-2, 1e-3, 1e-8, 1e-2), (1.0, 1e5, 1.0, 1e-3, 1.0)
    fam = shape_family(rows["n"], rows["k"])
    x, ferr = fit_generic(model, ts, starts, lower, upper, fam, held_out=False)
    held = held_out_apes(model, ts, x, lower, upper, fam)[0] if held_out else np.array([])
    err = {
        **ferr.as_dict(),
        **(
            {
                "held_out_median_ape": round(float(np.median(held)), 5),
                "held_out_mean_ape": round(float(np.mean(held)), 5),
                "held_out_p90_ape": round(float(np.percentile(held, 90)), 5),
                "held_out": "shape families",
            }
            if held_out
            else {}
        ),
        "floor_from": f"cuBLAS bf16 (gemm.bf16 launch_s, {launch_s * 1e6:.3f} us)",
        "quantisation": "one element-wise kernel per GEMM (3 bytes per input element) "
        "added to every prediction, and the rows' dynamic per-tensor scale "
        "(dynamic_scale_s + 2 bytes per input element at dynamic_scale_bw_eff)",
    }
    return _params_dict(params_of(x)), err, str(rows["table"].iloc[0]), held


@dataclass(frozen=True)
class TileKernelSpec:
    """A framework's FP8 GEMM kernel as its source dispatches it, for
    :func:`fit_tiled_fp8_kernel`: the dispatch table (branches in order, ``max_eff`` left
    at 1 for the fit to set), which branches share one fitted efficiency (the same CTA
    tile and schedule: clusters only change how tiles round), and the fit's two starts of
    those efficiencies."""

    name: str
    framework: str
    branches: tuple[GemmTileBranch, ...]
    eff_groups: tuple[int, ...]
    eff_starts: tuple[tuple[float, ...], tuple[float, ...]]
    source: str


def _tile(max_m, tm, tn, cm, cn, **kw) -> GemmTileBranch:
    return GemmTileBranch(
        float("inf") if max_m is None else float(max_m), tm, tn, cm, cn, 1.0, **kw
    )


# SGLang's FP8 GEMM on Hopper, sgl-kernel csrc/gemm/fp8_gemm_kernel.cu
# sm90_fp8_dispatch_shape: (max m, CTA tile m, n, cluster m, n) per branch, m <= 64: 64 x 64
# tiles in 1 x 4 clusters; 65-256: 64 x 64, 1 x 1; 257-1024: 128 x 128, 1 x 1; above: 128 x
# 128, 2 x 1 (every branch 128 deep). Its m = 1 branch (64 x 64, 1 x 8 clusters, a
# non-persistent scheduler) is folded into the m <= 64 one: one token's GEMM streams its
# weights, and 1 x 8 vs 1 x 4 clusters round the tile count of the table's n (multiples of
# 256 but 32..128) identically. One efficiency per tile configuration.
# m 129-256 runs 128 x 128 tiles, as the timed rows show, not the source's 64 x 64: with
# few CTAs (n <= 1024: at most 64 tiles, one wave, so the time is one CTA's) the time at
# fixed k doubles from m = 128 to 129 and stays there to m = 256, level with m 257-512
# (128 x 128 by the table) and with vLLM's 128 x 128 tiles at 129-256, where the source's
# 64 x 64 tiles would give a CTA the same work at m 129-256 as at 65-128
# (few_cta_gemm_times; `--gemm-variants sglang`). Which build or path the public tables
# timed is not recorded; the source's table stays a variant (SGLANG_FP8_SOURCE_TABLE).
SGLANG_FP8_KERNEL = "sglang-fp8"
SGLANG_FP8_SOURCE = (
    "sgl-kernel csrc/gemm/fp8_gemm_kernel.cu sm90_fp8_dispatch_shape (CUTLASS, 128-deep "
    "CTA tiles; its m = 1 branch folded into m <= 64; m 129-256 as 128 x 128 tiles, as the "
    "timed rows show, where the source says 64 x 64)"
)
SGLANG_FP8 = TileKernelSpec(
    SGLANG_FP8_KERNEL,
    "sglang",
    (_tile(64, 64, 64, 1, 4), _tile(128, 64, 64, 1, 1), _tile(256, 128, 128, 1, 1),
     _tile(1024, 128, 128, 1, 1), _tile(None, 128, 128, 2, 1)),
    (0, 1, 2, 2, 3),
    ((0.5, 0.6, 0.7, 0.8), (0.3, 0.4, 0.9, 0.9)),
    SGLANG_FP8_SOURCE,
)  # fmt: skip
# the source's own table (64 x 64 tiles from m = 65 to 256), shipped until 2026-12-01: a
# variant now (tile_form_variants)
SGLANG_FP8_SOURCE_TABLE = replace(
    SGLANG_FP8,
    branches=(_tile(64, 64, 64, 1, 4), _tile(256, 64, 64, 1, 1), _tile(1024, 128, 128, 1, 1),
              _tile(None, 128, 128, 2, 1)),
    eff_groups=(0, 1, 2, 3),
    source="sgl-kernel csrc/gemm/fp8_gemm_kernel.cu sm90_fp8_dispatch_shape as written",
)  # fmt: skip
# vLLM's FP8 GEMM on Hopper (per-tensor scales: cutlass_scaled_mm; FlashInfer's FP8 kernel,
# first in vLLM's list, needs compute capability 10.0), csrc/.../cutlass/c3x/
# scaled_mm_sm90_fp8_dispatch.cuh cutlass_gemm_sm90_fp8_dispatch: m <= 16: the operands
# swapped (the weights as the kernel's m), 64 x 16 x 256 tiles, 1 x 2 clusters for n <= 1280,
# else 1 x 1; 17-64: swapped, 64 x 16 x 256 in 1 x 4 clusters for n <= 1280, else 64 x 64 x
# 256, 1 x 1; 65-128: 64 x 128 x 128, 2 x 1; m >= 8192 and k >= 6144: 256 x 128 x 128, 2 x 1
# (cooperative); else 128 x 128 x 128, 2 x 1 (ping-pong). Efficiencies shared by tile shape
# and schedule: five.
VLLM_FP8_KERNEL = "vllm-fp8"
VLLM_FP8_SOURCE = (
    "vllm csrc cutlass_w8a8 c3x scaled_mm_sm90_fp8_dispatch.cuh cutlass_gemm_sm90_fp8_dispatch "
    "(CUTLASS; operands swapped for m <= 64; one efficiency per tile shape and schedule)"
)
VLLM_FP8 = TileKernelSpec(
    VLLM_FP8_KERNEL,
    "vllm",
    (
        _tile(16, 64, 16, 1, 2, max_n=1280.0, swap_ab=True),
        _tile(16, 64, 16, 1, 1, swap_ab=True),
        _tile(64, 64, 16, 1, 4, max_n=1280.0, swap_ab=True),
        _tile(64, 64, 64, 1, 1, swap_ab=True),
        _tile(128, 64, 128, 2, 1),
        _tile(None, 256, 128, 2, 1, min_m=8192.0, min_k=6144.0),
        _tile(None, 128, 128, 2, 1),
    ),
    (0, 0, 0, 1, 2, 3, 4),
    ((0.4, 0.5, 0.6, 0.7, 0.8), (0.2, 0.4, 0.9, 0.9, 0.9)),
    VLLM_FP8_SOURCE,
)
TILE_KERNELS = (SGLANG_FP8, VLLM_FP8)
# branches of each kernel's table that run CUTLASS's cooperative schedule (both consumer
# warp groups on one tile); the others run ping-pong (one tile per consumer warp group, one
# group's epilogue under the other's mainloop): vLLM's 256 x 128 branch
COOPERATIVE_BRANCHES = {VLLM_FP8_KERNEL: (5,)}
# SMs per GPU, for the tile form's waves: the datasheets' counts (H100 SXM / H200 / H800:
# 132, H100 PCIe: 114)
NUM_SMS = {"a100-80gb": 108, "h100-sxm": 132, "h100-pcie": 114, "h200-sxm": 132, "h800-sxm": 132}
# SMs of every GPU a profile is written for: a wave decode kernel (WAVE_BACKENDS) carried to
# another GPU runs its waves over that GPU's SMs
KERNEL_SMS = {**NUM_SMS, "b200": 148, "l40s": 142}
# shared memory per SM (KiB; datasheets, the CUDA programming guide's per-architecture
# capacity, 1 KiB of it reserved per resident block), for masked MHA's occupancy
# (OCCUPANCY_BACKENDS)
SMEM_PER_SM_KIB = {
    "a100-80gb": 164,
    "h100-sxm": 228,
    "h100-pcie": 228,
    "h200-sxm": 228,
    "h800-sxm": 228,
    "b200": 228,
    "l40s": 100,
}


def tiled_kernel_dict(
    branches: tuple[GemmTileBranch, ...],
    num_sms: int,
    launch_s: float,
    mem_eff: float,
    epi: float,
    source: str,
    l2_bytes_per_s: float = 0.0,
) -> dict[str, Any]:
    """A ``gemm_kernels`` entry (the profile's JSON form) of an FP8 tile-form fit; a
    branch's optional conditions, and the L2 rate, written only where set."""
    out = []
    for b in branches:
        d: dict[str, Any] = {
            "max_m": None if b.max_m == float("inf") else int(b.max_m),
            "tile_m": b.tile_m,
            "tile_n": b.tile_n,
            "cluster_m": b.cluster_m,
            "cluster_n": b.cluster_n,
            "max_eff": _round(b.max_eff),
        }
        if b.max_n < float("inf"):
            d["max_n"] = int(b.max_n)
        d.update({key: int(getattr(b, key)) for key in ("min_m", "min_k") if getattr(b, key)})
        if b.swap_ab:
            d["swap_ab"] = True
        out.append(d)
    return {
        "dtype": "fp8",
        "num_sms": int(num_sms),
        "launch_s": _round(launch_s),
        "mem_eff": _round(mem_eff),
        "epilogue_s_per_elem": _round(epi),
        **({"l2_bytes_per_s": _round(l2_bytes_per_s)} if l2_bytes_per_s > 0 else {}),
        "branches": out,
        "source": source,
    }


def tiled_params(entry: dict[str, Any]) -> TiledGemmParams:
    """The :class:`TiledGemmParams` of a ``gemm_kernels`` entry (its JSON form)."""
    branches = tuple(
        GemmTileBranch(
            float("inf") if b["max_m"] is None else float(b["max_m"]),
            int(b["tile_m"]),
            int(b["tile_n"]),
            int(b["cluster_m"]),
            int(b["cluster_n"]),
            float(b["max_eff"]),
            max_n=float(b.get("max_n") or float("inf")),
            min_m=float(b.get("min_m", 0.0)),
            min_k=float(b.get("min_k", 0.0)),
            swap_ab=bool(b.get("swap_ab", False)),
        )  # fmt: skip
        for b in entry["branches"]
    )
    return TiledGemmParams(
        str(entry["dtype"]), int(entry["num_sms"]), float(entry["launch_s"]),
        float(entry["mem_eff"]), float(entry["epilogue_s_per_elem"]), branches,
        str(entry.get("source", "")), float(entry.get("l2_bytes_per_s", 0.0)),
    )  # fmt: skip


def spec_params(spec: TileKernelSpec, num_sms: int, q) -> TiledGemmParams:
    """The tile-form parameters of ``spec``'s kernel from a fit vector ``q``: the floor
    ``q[0]``, one efficiency per branch group ``q[1 : 1 + ne]``, then the memory efficiency,
    the per-output epilogue time and, where ``q`` holds one more, the L2 rate (``ne`` branch
    groups; without it no L2 bound)."""
    ne = max(spec.eff_groups) + 1
    branches = tuple(
        replace(b, max_eff=float(q[1 + g]))
        for b, g in zip(spec.branches, spec.eff_groups, strict=True)
    )
    l2 = float(q[3 + ne]) if len(q) > 3 + ne else 0.0
    return TiledGemmParams("fp8", num_sms, q[0], q[1 + ne], q[2 + ne], branches, l2_bytes_per_s=l2)


# the L2 rate of a tile-form fit: two starts and the bounds (bytes/s). Hopper's L2 serves
# its SMs at several TB/s (the fitted rates: 6-8 TB/s on the H100); the bounds only keep
# the fit in a physical range
L2_START = (6e12, 1.2e13)
L2_BOUNDS = (1e12, 1e14)


def tile_fit_bounds(spec: TileKernelSpec, l2: bool) -> tuple[list[tuple], tuple, tuple]:
    """Starts, lower and upper bounds of a tile-form fit vector (:func:`spec_params`), with
    the L2 rate last when ``l2``."""
    ne = max(spec.eff_groups) + 1
    e1, e2 = spec.eff_starts
    starts = [(4e-6, *e1, 0.8, 2.4e-10), (2e-6, *e2, 0.6, 2.4e-11)]
    lower = (1e-8,) + (1e-3,) * (ne + 1) + (1e-16,)
    upper = (1e-3,) + (1.0,) * (ne + 1) + (2.5e-8,)
    if l2:
        starts = [(*starts[0], L2_START[0]), (*starts[1], L2_START[1])]
        lower, upper = (*lower, L2_BOUNDS[0]), (*upper, L2_BOUNDS[1])
    return starts, lower, upper


def fit_tiled_fp8_kernel(
    gemm: pd.DataFrame, peaks: GpuPeaks, ew: ElementwiseParams, num_sms: int, spec: TileKernelSpec
) -> tuple[dict[str, Any], dict[str, Any], np.ndarray]:
    """A framework's FP8 GEMM kernel (``gemm_kernels.<spec.name>``) fitted to that
    framework's FP8 rows of the public tables through ``ops.tiled_gemm_time_s`` with its
    dispatch table (``spec``): one efficiency per group of branches, the floor, the memory
    efficiency, a per-output epilogue time and the kernel's L2 rate (the operand-traffic
    bound, :data:`L2_START`); every row holds its activation-quantisation kernel, added as
    the step model costs it. Returns the profile entry, its fit error and each row's APE
    predicted by a refit without its (n, k) family (5 folds)."""
    t = gemm[(gemm["dtype"] == "fp8") & (gemm["framework"] == spec.framework)]
    if t.empty:
        raise UserError(f"no {spec.framework} FP8 GEMM rows in the public tables")
    m, n, k, ts = (t[c].to_numpy(float) for c in ("m", "n", "k", "t_s"))
    extra = quant_s(peaks, ew, m, k)

    def params_of(q) -> TiledGemmParams:
        return spec_params(spec, num_sms, q)

    def model(q, idx):
        return ops.tiled_gemm_time_s(peaks, params_of(q), m[idx], n[idx], k[idx]) + extra[idx]

    starts, lower, upper = tile_fit_bounds(spec, l2=True)
    fam = shape_family(t["n"], t["k"])
    q, ferr = fit_generic(model, ts, starts, lower, upper, fam)
    held, how = held_out_apes(model, ts, q, lower, upper, fam)
    p = params_of(q)
    entry = tiled_kernel_dict(
        p.branches, num_sms, p.launch_s, p.mem_eff, p.epilogue_s_per_elem, spec.source,
        p.l2_bytes_per_s,
    )  # fmt: skip
    err = {
        **ferr.as_dict(),
        "source": f"{t['table'].iloc[0]} ({spec.framework} fp8, every row)",
        "held_out_p90_ape": round(float(np.percentile(held, 90)), 5),
        "quantisation": "one element-wise kernel per GEMM (3 bytes per input element) "
        "added to every prediction",
    }
    return entry, err, held


def fit_sglang_fp8_kernel(
    gemm: pd.DataFrame, peaks: GpuPeaks, ew: ElementwiseParams, num_sms: int
) -> tuple[dict[str, Any], dict[str, Any], np.ndarray]:
    """:func:`fit_tiled_fp8_kernel` of SGLang's kernel (:data:`SGLANG_FP8`)."""
    return fit_tiled_fp8_kernel(gemm, peaks, ew, num_sms, SGLANG_FP8)


def fit_gpu(gpu: str, data_root: Path, base: dict) -> dict[str, Any]:
    """A fitted-public profile dict for ``gpu`` (``base``: the shipped profile, for carried parts)."""
    peaks = peaks_of(gpu)
    ops_out: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    tables: set[str] = set()

    mlp = public.vidur_mlp(data_root, gpu)
    ew_rows = mlp[mlp["op"].isin(public.VIDUR_ELEMENTWISE_OPS)]
    few = fit_elementwise(
        peaks, ew_rows["nbytes"], ew_rows["t_s"], groups=ew_rows["model"].to_numpy()
    )
    ew = few.params

    gemm = public.aic_gemm(data_root, gpu)
    ops_out["gemm"] = {}
    rows = gemm[(gemm["dtype"] == "bf16") & (gemm["framework"] == "vllm")]
    f = fit_gemm(
        peaks,
        rows["m"],
        rows["n"],
        rows["k"],
        rows["t_s"],
        "bf16",
        groups=shape_family(rows["n"], rows["k"]),
    )
    ops_out["gemm"]["bf16"] = _params_dict(f.params)
    errors["gemm.bf16"] = _err(f.error, f"{rows['table'].iloc[0]} (vllm bf16)")
    tables.add(rows["table"].iloc[0])
    if peaks.fp8_flop_per_s > 0 and (gemm["dtype"] == "fp8").any():
        prm8, err8, table8, _ = fit_gemm_fp8(gemm, peaks, ew, f.params.launch_s)
        ops_out["gemm"]["fp8"] = prm8
        errors["gemm.fp8"] = {**err8, "source": f"{table8} (trtllm fp8; floor cuBLAS bf16)"}
        tables.add(table8)
    gemm_kernels: dict[str, Any] = {}
    for spec in TILE_KERNELS:
        if (
            peaks.fp8_flop_per_s > 0
            and ((gemm["dtype"] == "fp8") & (gemm["framework"] == spec.framework)).any()
        ):
            entry, kerr, _ = fit_tiled_fp8_kernel(gemm, peaks, ew, NUM_SMS[gpu], spec)
            gemm_kernels[spec.name] = entry
            errors[f"gemm_kernels.{spec.name}"] = kerr

    backends, berr, btables = fit_attention_backends(gpu, data_root, peaks)
    errors.update(berr)
    tables |= btables
    generic = backends[GENERIC_BACKEND]
    ops_out["decode_attention"] = dict(generic["decode_attention"])
    ops_out["prefill_attention"] = dict(generic["prefill_attention"])

    ops_out["elementwise"] = _params_dict(ew)
    errors["elementwise"] = _err(
        few.error, f"vidur/compute/{public.VIDUR_GPU_DIR[gpu]}/*/mlp.csv (norm, rope, act, add)"
    )
    tables.add(f"vidur/compute/{public.VIDUR_GPU_DIR[gpu]}/*/mlp.csv")
    ew_bw = peaks.hbm_bytes_per_s * ew.bw_eff

    ar = public.aic_allreduce(data_root, gpu)
    ops_out["allreduce"] = {}
    for n_key, rows in ar.groupby("num_gpus"):
        n = int(cast(float, n_key))
        fa = fit_allreduce(rows["nbytes"], rows["t_s"], n)
        ops_out["allreduce"][str(n)] = allreduce_dict(fa.params)
        errors[f"allreduce.{n}"] = _err(fa.error, f"{rows['table'].iloc[0]} (all_reduce, half)")
        tables.add(rows["table"].iloc[0])

    copies = {k: dict(v) for k, v in base["ops"]["copy"].items()}
    copies["d2d"] = {
        "latency_s": copies["d2d"]["latency_s"],
        "bw_bytes_per_s": _round(ew_bw / 2.0),
        "per_block_s": 0.0,
    }
    copies["gather"] = {**copies["gather"], "bw_bytes_per_s": _round(ew_bw / 2.0)}
    ops_out["copy"] = copies

    return {
        "schema_version": 1,
        "gpu": gpu,
        "peaks": {
            "bf16_flop_per_s": peaks.bf16_flop_per_s,
            "fp8_flop_per_s": peaks.fp8_flop_per_s,
            "hbm_bytes_per_s": peaks.hbm_bytes_per_s,
            "hbm_bytes": peaks.hbm_bytes,
        },
        "ops": ops_out,
        "attention_backends": backends,
        "attention_auto": auto_candidates(errors, backends),
        "gemm_kernels": gemm_kernels,
        "graph_replay": dict(base.get("graph_replay") or {"per_layer_s": 0.0}),
        "fit_error": errors,
        "provenance": {
            "kind": "fitted-public",
            "source": "calibration/fit_public.py fitted the disaggsim.costmodel.ops forms to "
            "public measured kernel tables (log-space least squares); peaks are datasheet "
            "values from the GPU catalog",
            "tables": sorted(tables),
            "source_commit": {
                "aiconfigurator": public.source_commit(data_root, "aiconfigurator"),
                "vidur": public.source_commit(data_root, "vidur"),
            },
            "frameworks": {
                "gemm.bf16": "vllm",
                "gemm.fp8": f"{FP8_FRAMEWORK} (cuBLASLt; floor cuBLAS bf16's, vllm)",
                **{
                    f"gemm_kernels.{spec.name}": f"{spec.framework} (every fp8 row, its "
                    "dispatch table)"
                    for spec in TILE_KERNELS
                },
                "attention_backends": dict(BACKEND_FRAMEWORKS),
                "ops.decode_attention/prefill_attention": GENERIC_BACKEND,
                "trtllm decode split": f"trtllm: XQA layouts, {TRTLLM_PER_QUERY_HEAD_BACKEND}: "
                f"the others ({XQA_SOURCE})",
            },
            "carried": [
                "copy.h2d_pinned",
                "copy.d2h_pinned",
                "copy.p2p",
                "copy.d2d.latency_s",
                "copy.gather.latency_s",
                "copy.gather.per_block_s",
            ],
            "carried_from": "the profile shipped before this fit (no public table measures these)",
            "derived": "copy.d2d and copy.gather bandwidth = fitted element-wise bandwidth / 2 "
            "(read + write)",
            "command": COMMAND,
        },
    }


def _scale(value: float, num: float, den: float) -> float:
    return _round(value * num / den) if den > 0 else value


def prior_from(gpu: str, source_gpu: str, source: dict) -> dict[str, Any]:
    """Datasheet peaks of ``gpu`` with efficiencies transferred from ``source`` (a profile dict).

    Within one SM architecture (:data:`SM_ARCH`) this is the model's rule, not a guess:
    GPUs of the same architecture run the same kernels, so they share every efficiency
    and floor and differ by their datasheet peaks (FLOP/s, HBM bandwidth and size). Across
    architectures it is a prior, said so in the provenance."""
    tgt, src = get_gpu(gpu), get_gpu(source_gpu)
    ops_in = source["ops"]
    ops_out: dict[str, Any] = json.loads(json.dumps(ops_in))
    if tgt.fp8_flop_per_s <= 0:
        ops_out["gemm"].pop("fp8", None)

    def link(g) -> float:
        return g.nvlink_bytes_per_s if g.nvlink_bytes_per_s > 0 else g.pcie_bytes_per_s

    if tgt.nvlink_bytes_per_s > 0:
        for n, prm in ops_out["allreduce"].items():
            for key in ("bus_bw_bytes_per_s", "ll_bus_bw_bytes_per_s"):
                if key in prm:
                    prm[key] = _scale(ops_in["allreduce"][n][key], link(tgt), link(src))
    else:  # an NCCL ring over PCIe, fitted on public nccl-tests tables (not an NVLink's)
        ops_out["allreduce"] = allreduce_pcie.profile_section(gpu)
    hbm_ratio = (tgt.hbm_bytes_per_s, src.hbm_bytes_per_s)
    for kind in ("d2d", "gather"):
        ops_out["copy"][kind]["bw_bytes_per_s"] = _scale(
            ops_in["copy"][kind]["bw_bytes_per_s"], *hbm_ratio
        )
    for kind in ("h2d_pinned", "d2h_pinned"):
        ops_out["copy"][kind]["bw_bytes_per_s"] = _scale(
            ops_in["copy"][kind]["bw_bytes_per_s"], tgt.pcie_bytes_per_s, src.pcie_bytes_per_s
        )
    ops_out["copy"]["p2p"]["bw_bytes_per_s"] = _scale(
        ops_in["copy"]["p2p"]["bw_bytes_per_s"], link(tgt), link(src)
    )
    same_arch = SM_ARCH[gpu] == SM_ARCH[source_gpu]
    # a kernel's dispatch table is its architecture's (sgl-kernel's sm90 path): carried to
    # GPUs of the same architecture with their own SM count, dropped across architectures;
    # its L2 rate scales with the clock, the ratio of FP8 peak per SM (the same L2 at
    # another clock: H100 PCIe 0.885 of the SXM's)
    clock = (
        (tgt.fp8_flop_per_s / NUM_SMS[gpu]) / (src.fp8_flop_per_s / NUM_SMS[source_gpu])
        if same_arch and tgt.fp8_flop_per_s > 0
        else 1.0
    )
    gemm_kernels = {
        name: {
            **sec,
            "num_sms": NUM_SMS[gpu],
            **(
                {"l2_bytes_per_s": _round(sec["l2_bytes_per_s"] * clock)}
                if "l2_bytes_per_s" in sec
                else {}
            ),
        }
        for name, sec in (source.get("gemm_kernels") or {}).items()
        if same_arch and tgt.fp8_flop_per_s > 0
    }
    backends_out = json.loads(json.dumps(source.get("attention_backends", {})))
    for sec in backends_out.values():  # a wave decode kernel's waves run over this GPU's SMs
        for prm in (sec.get("decode_attention") or {}).values():
            if prm.get("wave_sms", 0) > 0:
                prm["wave_sms"] = float(KERNEL_SMS[gpu])
            if prm.get("block_bytes_per_s", 0) > 0:  # masked MHA's blocks on this GPU's SMs
                prm["occupancy_sms"] = float(KERNEL_SMS[gpu])
                prm["smem_per_sm_kib"] = float(SMEM_PER_SM_KIB[gpu])
    rule = (
        f"same SM architecture as {source_gpu} ({SM_ARCH[gpu]}): shares its kernel "
        "efficiencies and floors, differs by datasheet peaks"
        if same_arch
        else f"PRIOR across architectures ({SM_ARCH[source_gpu]} -> {SM_ARCH[gpu]}): "
        f"{source_gpu}'s efficiencies are a guess for this GPU's kernels"
    )
    return {
        "schema_version": 1,
        "gpu": gpu,
        "peaks": {
            "bf16_flop_per_s": tgt.bf16_flop_per_s,
            "fp8_flop_per_s": tgt.fp8_flop_per_s,
            "hbm_bytes_per_s": tgt.hbm_bytes_per_s,
            "hbm_bytes": tgt.hbm_bytes,
        },
        "ops": ops_out,
        "attention_backends": backends_out,
        "attention_auto": json.loads(json.dumps(source.get("attention_auto", {}))),
        "gemm_kernels": json.loads(json.dumps(gemm_kernels)),
        "graph_replay": dict(source.get("graph_replay") or {"per_layer_s": 0.0}),
        "fit_error": {},
        "provenance": {
            "kind": "prior",
            "source": f"not measured on {gpu}: datasheet peaks from the GPU catalog with the "
            f"efficiency parameters (GEMM, attention backends, element-wise, floors) of the "
            f"{source_gpu} profile ({source['provenance']['kind']}); {rule}; "
            + (
                "all-reduce and p2p bandwidth scaled by the NVLink / "
                f"{'NVLink' if src.nvlink_bytes_per_s > 0 else 'PCIe'} bandwidth ratio"
                if tgt.nvlink_bytes_per_s > 0
                else f"all-reduce from {allreduce_pcie.SOURCE}, p2p bandwidth "
                f"scaled by the PCIe / {'NVLink' if src.nvlink_bytes_per_s > 0 else 'PCIe'} "
                "bandwidth ratio"
            )
            + ", d2d/gather by the HBM ratio, host copies by the PCIe ratio",
            "transferred_from": source_gpu,
            "sm_arch": SM_ARCH[gpu],
            "same_sm_arch_as_source": same_arch,
            "gemm_kernels": (
                f"{', '.join(gemm_kernels)} from {source_gpu} with this GPU's SM count "
                f"({NUM_SMS[gpu]}) and the L2 rate times its clock ratio ({clock:.3f}: FP8 "
                "peak per SM)"
                if gemm_kernels
                else "none (a kernel's dispatch table is its SM architecture's)"
            ),
            "command": COMMAND,
        },
    }


def write_profile(prof: dict, path: Path) -> None:
    from disaggsim.output import PROFILE_OWNED, write_file

    profile_from_dict(prof, str(path))
    text = json.dumps(prof, indent=2) + "\n"
    write_file(path, lambda tmp: tmp.write_text(text), "--out", PROFILE_OWNED, "profile")


def is_measured(path: Path) -> bool:
    """Whether the profile file at ``path`` was measured on its GPU (never overwritten here)."""
    if not path.is_file():
        return False
    try:
        return (json.loads(path.read_text()).get("provenance") or {}).get("kind") == "measured"
    except json.JSONDecodeError:
        return False


def destination(gpu: str, out_dir: str | None) -> Path:
    """Where this script writes ``gpu``'s fitted or prior profile: the shipped file (or
    ``out_dir``), except when that file is a measured profile — then the profile goes to
    ``calibration/priors/`` (or ``out_dir/priors/``), the base ``calibrate fit`` carries
    unmeasured parts from."""
    ship = shipped_profile_path(gpu)
    target = (Path(out_dir) / ship.name) if out_dir else ship
    if is_measured(target) or is_measured(ship):
        return ((Path(out_dir) / "priors") if out_dir else PRIORS_DIR) / ship.name
    return target


def _print_errors(prof: dict) -> None:
    for op, e in prof["fit_error"].items():
        if not isinstance(e, dict) or "median_ape" not in e:
            continue
        ho = e.get("held_out_median_ape")
        print(
            f"  {op:34s} n={e['n']:6d} median {100 * e['median_ape']:5.1f}% "
            f"mean {100 * e['mean_ape']:5.1f}%"
            + (f" held-out median {100 * ho:5.1f}% ({e['held_out']})" if ho is not None else "")
        )


DECODE_RATE_MIN_BYTES = 5e8  # reads this large are stream-bound on every kernel


def decode_rates(data_root: Path, gpu: str) -> pd.DataFrame:
    """Median KV bandwidth (TB/s of KV bytes as stored: 1 per FP8 element, 2 per bf16) of
    the public decode-attention rows reading at least :data:`DECODE_RATE_MIN_BYTES`, per
    framework, KV dtype and head dim (columns), with the row counts beside."""
    d = public.aic_decode_attention(data_root, gpu)
    elem = np.where(d["dtype"] == "fp8", 1.0, 2.0)
    nbytes = 2.0 * d["context_tokens"] * d["kv_heads"] * d["head_dim"] * elem
    big = d.assign(tb_per_s=nbytes / d["t_s"] / 1e12)[nbytes >= DECODE_RATE_MIN_BYTES]
    keys = ["framework", "dtype", "head_dim"]
    g = big.groupby(keys)["tb_per_s"].agg(["median", "size"]).round(2)
    return pd.DataFrame(g.unstack("head_dim"))


def decode_rates_by_group(data_root: Path, gpu: str) -> pd.DataFrame:
    """As :func:`decode_rates`, per framework and KV dtype (rows) and query heads per KV
    head (columns): whether a kernel's rate depends on how many query heads share a KV
    head (work per query head) or not (work per KV element)."""
    d = public.aic_decode_attention(data_root, gpu)
    elem = np.where(d["dtype"] == "fp8", 1.0, 2.0)
    nbytes = 2.0 * d["context_tokens"] * d["kv_heads"] * d["head_dim"] * elem
    big = d.assign(
        tb_per_s=nbytes / d["t_s"] / 1e12, q_per_kv=(d["heads"] / d["kv_heads"]).round()
    )[nbytes >= DECODE_RATE_MIN_BYTES]
    g = big.groupby(["framework", "dtype", "head_dim", "q_per_kv"])["tb_per_s"].median()
    return pd.DataFrame(g.round(2).unstack("q_per_kv"))


def decode_fp8_over_bf16(data_root: Path, gpu: str) -> pd.DataFrame:
    """Per framework and head dim: the median time of a decode-attention row with FP8 KV over
    the same shape (batch, context, heads, KV heads) with bf16 KV, over shapes whose FP8
    read is at least :data:`DECODE_RATE_MIN_BYTES` (0.5 if the FP8 kernel streamed its
    half-size KV at the bf16 kernel's rate), with the shape counts."""
    d = public.aic_decode_attention(data_root, gpu)
    key = ["framework", "batch", "context_tokens", "heads", "kv_heads", "head_dim"]
    t = d.groupby([*key, "dtype"])["t_s"].median().unstack("dtype")
    if "fp8" not in t.columns or "bf16" not in t.columns:
        raise UserError(f"{gpu}: no decode-attention shape timed with both bf16 and FP8 KV")
    t = t.dropna(subset=["fp8", "bf16"]).reset_index()
    nbytes = 2.0 * t["context_tokens"] * t["kv_heads"] * t["head_dim"]
    big = t[nbytes >= DECODE_RATE_MIN_BYTES].assign(fp8_over_bf16=lambda x: x["fp8"] / x["bf16"])
    g = big.groupby(["framework", "head_dim"])["fp8_over_bf16"].agg(["median", "size"])
    return pd.DataFrame(g.round(3).unstack("head_dim"))


DECODE_SIZE_BUCKETS_MB = (0.0, 1.0, 10.0, 100.0, 500.0, np.inf)


def decode_fp8_ratio_by_size(data_root: Path, gpu: str, framework: str = "vllm") -> pd.DataFrame:
    """``framework``'s decode-attention rows against the shipped profile's fit of its
    kernel: the median measured / predicted time per KV dtype, head dim (rows) and KV bytes
    read (columns, MB), with the kernel the table names for the rows (``kernel``): whether a
    head dim's error is a per-byte rate (growing with the read) or a per-call cost (largest
    on small reads)."""
    from disaggsim.hardware.profile import load_profile

    prof = load_profile(gpu)
    d = public.aic_decode_attention(data_root, gpu)
    d = d[(d["framework"] == framework) & ~d["kernel"].isin(MINOR_KERNELS)]
    backend = {"vllm": "vllm-flash", "sglang": "sglang-flash"}.get(framework, framework)
    frames = []
    for dt, t in d.groupby("dtype", sort=True):
        elem = kv_elem_bytes(str(dt))
        pred = predict_decode_rows(
            prof.peaks, prof.decode_attention_for(backend, str(dt)), str(dt), t
        )
        kv_mb = 2.0 * t["context_tokens"] * t["kv_heads"] * t["head_dim"] * elem / 1e6
        frames.append(
            t.assign(
                ratio=t["t_s"].to_numpy(float) / pred,
                mb_read=pd.cut(kv_mb, list(DECODE_SIZE_BUCKETS_MB)),
            )
        )
    x = pd.concat(frames)
    keys = ["dtype", "head_dim"]
    out = x.groupby([*keys, "mb_read"], observed=True)["ratio"].median().round(3).unstack("mb_read")
    kernels = x.groupby(keys)["kernel"].agg(lambda k: ",".join(sorted(set(map(str, k)))))
    return out.assign(kernel=kernels)


# KV bytes read (MB) either side of the H100's 50 MB L2, for decode_rates_by_size (the
# tables' reads are powers of two: 8, 16, 32 | 64, 128, ... MB)
L2_SIZE_BUCKETS_MB = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, np.inf)


def decode_rates_by_size(data_root: Path, gpu: str, framework: str = "vllm") -> pd.DataFrame:
    """``framework``'s decode-attention rows (its main kernel): the median KV bandwidth
    reached (TB/s) per KV dtype and head dim (rows) and KV bytes read (columns, MB, buckets
    either side of the L2 size): whether a head dim's slow per-byte rate starts where the
    read outgrows the L2 (a cache-size regime) or holds below it too."""
    d = public.aic_decode_attention(data_root, gpu)
    d = d[(d["framework"] == framework) & ~d["kernel"].isin(MINOR_KERNELS)]
    elem = np.where(d["dtype"] == "fp8", 1.0, 2.0)
    kv = 2.0 * d["context_tokens"] * d["kv_heads"] * d["head_dim"] * elem
    x = d.assign(tb_per_s=kv / d["t_s"] / 1e12, mb_read=pd.cut(kv / 1e6, list(L2_SIZE_BUCKETS_MB)))
    g = x.groupby(["dtype", "head_dim", "mb_read"], observed=True)["tb_per_s"].median()
    return g.round(2).unstack("mb_read")


PER_QUERY_HEAD_MIN_BYTES = 2e9  # query-head bytes (KV bytes x group) of a row compared


def decode_rates_by_context(data_root: Path, gpu: str) -> pd.DataFrame:
    """Median KV bytes per second of the bf16 decode rows per kernel (``vllm-flash``,
    ``sglang-flash``, and ``trtllm-mmha`` on vanilla MHA, where it reads each KV head once),
    by bytes read and tokens per sequence (≤ 2048, 2049-8192, > 8192): whether a few long
    sequences, split over thread blocks, stream as fast as many short ones of the same size."""
    d = public.aic_decode_attention(data_root, gpu)
    d = d[(~d["kernel"].isin(MINOR_KERNELS)) & (d["dtype"] == "bf16")]
    frames = []
    for be in ("vllm-flash", "sglang-flash", TRTLLM_PER_QUERY_HEAD_BACKEND):
        t = _decode_backend_rows(d, be)
        if be == TRTLLM_PER_QUERY_HEAD_BACKEND:
            t = t[(t["heads"] / t["kv_heads"]).round() == 1]
        kv = 2.0 * t["context_tokens"] * t["kv_heads"] * t["head_dim"] * 2.0
        per_seq = (t["context_tokens"] / t["batch"]).to_numpy()
        ctx = np.select([per_seq <= 2048, per_seq <= 8192], ["<= 2048", "2049-8192"], "> 8192")
        frames.append(
            t.assign(
                kernel=be,
                tokens_per_seq=ctx,
                mb_read=pd.cut(kv / 1e6, [0, 10, 40, 160, 640, np.inf]),
                tb_per_s=kv / t["t_s"] / 1e12,
            )
        )
    x = pd.concat(frames)
    keys = ["kernel", "mb_read", "tokens_per_seq"]
    return x.groupby(keys, observed=True)["tb_per_s"].median().round(2).unstack("tokens_per_seq")


# the context split of the extrapolation check (validate.py): fit on short, test on long
CONTEXT_FIT_MAX_TOKENS = 2048
CONTEXT_TEST_MIN_TOKENS = 8192  # exclusive


def refit_decode_predict(
    peaks: GpuPeaks, backend: str, fit_rows: pd.DataFrame, test_rows: pd.DataFrame,
    split_kv: bool = True, num_sms: int = 0,
) -> np.ndarray:  # fmt: skip
    """Refit one decode backend's bf16 form on ``fit_rows`` and predict ``test_rows``
    (the extrapolation check of ``calibrate validate``: a per-query-head kernel fitted with
    its group sizes, a wave kernel as one on ``num_sms`` SMs, as :func:`fit_decode_backend`).
    ``split_kv`` False refits the bandwidth-share form the split-KV form replaced (few work
    items get a share of the bandwidth)."""
    if backend in WAVE_BACKENDS and num_sms > 0 and split_kv:
        w = fit_decode_backend(peaks, backend, "bf16", fit_rows, held_out=False, num_sms=num_sms)
        return predict_decode_rows(peaks, w.params, "bf16", test_rows)
    per_qh = backend == TRTLLM_PER_QUERY_HEAD_BACKEND
    group = backend in GROUP_RATE_BACKENDS
    tr, te = fit_rows, test_rows
    g_tr = (tr["heads"] / tr["kv_heads"]).round()
    f = fit_decode_attention(
        table_peaks(peaks, tr), tr["batch"], tr["context_tokens"], tr["kv_heads"],
        tr["head_dim"], tr["t_s"],
        held_out=False, q_per_kv=g_tr if per_qh else None, split_kv=split_kv,
        group_q_per_kv=g_tr if group else None, item_terms=backend in ITEM_TERM_BACKENDS,
    )  # fmt: skip
    return predict_decode_rows(peaks, f.params, "bf16", te)


CONTEXT_RATIO_FORMS = (("split-KV (shipped)", True), ("bandwidth share", False))


def context_extrapolation_ratios(
    data_root: Path, gpu: str, backends: tuple[str, ...] = tuple(BACKEND_FRAMEWORKS)
) -> pd.DataFrame:
    """Each bf16 decode backend refitted on rows of at most
    :data:`CONTEXT_FIT_MAX_TOKENS` tokens per sequence and tested on rows of more than
    :data:`CONTEXT_TEST_MIN_TOKENS` (``calibrate validate``'s extrapolation row), under
    the shipped split-KV form and the bandwidth-share form it replaced: the median
    measured / predicted time of the test rows per batch and per KV-head count (over 1:
    predicted too fast), and the median APE of all of them. Columns: kernel, form, by
    (``all``, ``batch`` or ``kv_heads``), value, n, median_ratio, median_ape."""
    pk = peaks_of(gpu)
    d = public.aic_decode_attention(data_root, gpu)
    d = d[(~d["kernel"].isin(MINOR_KERNELS)) & (d["dtype"] == "bf16")]
    rows = []
    for backend in backends:
        t = _decode_backend_rows(d, backend)
        per_seq = (t["context_tokens"] / t["batch"]).to_numpy()
        tr = t[per_seq <= CONTEXT_FIT_MAX_TOKENS]
        te = t[per_seq > CONTEXT_TEST_MIN_TOKENS]
        if tr.empty or te.empty:
            continue
        for form, split_kv in CONTEXT_RATIO_FORMS:
            pred = refit_decode_predict(pk, backend, tr, te, split_kv, NUM_SMS.get(gpu, 0))
            ratio = te["t_s"].to_numpy(float) / pred
            x = te.assign(ratio=ratio, ape=np.abs(1.0 / ratio - 1.0))
            groups = [("all", "", x)]
            for by in ("batch", "kv_heads"):
                groups += [
                    (by, f"{float(cast(float, v)):.0f}", g) for v, g in x.groupby(by, sort=True)
                ]
            rows += [
                {
                    "kernel": backend,
                    "form": form,
                    "by": by,
                    "value": v,
                    "n": len(g),
                    "median_ratio": round(float(g["ratio"].median()), 2),
                    "median_ape": round(float(g["ape"].median()), 3),
                }
                for by, v, g in groups
            ]
    return pd.DataFrame(rows)


def per_query_head_rates(data_root: Path, gpu: str) -> pd.DataFrame:
    """TensorRT-LLM's decode rows beyond its XQA (more than :data:`XQA_MAX_Q_PER_KV` query
    heads per KV head), which run one thread block per query head: the median rate of
    query-head bytes (KV bytes × query heads per KV head, as stored) and of query-head
    elements, per KV dtype, head dim and group size, over reads of at least
    :data:`PER_QUERY_HEAD_MIN_BYTES` query-head bytes."""
    d = public.aic_decode_attention(data_root, gpu)
    d = d[d["framework"] == "trtllm"]
    g = (d["heads"] / d["kv_heads"]).round()
    elem = np.where(d["dtype"] == "fp8", 1.0, 2.0)
    q_bytes = 2.0 * d["context_tokens"] * d["heads"] * d["head_dim"] * elem
    sel = (g > XQA_MAX_Q_PER_KV) & (q_bytes >= PER_QUERY_HEAD_MIN_BYTES)
    x = d[sel].assign(
        q_per_kv=g[sel],
        q_tb_per_s=q_bytes[sel] / d["t_s"][sel] / 1e12,
        q_t_elem_per_s=q_bytes[sel] / elem[sel.to_numpy()] / d["t_s"][sel] / 1e12,
    )
    keys = ["dtype", "head_dim", "q_per_kv"]
    return pd.DataFrame(x.groupby(keys)[["q_tb_per_s", "q_t_elem_per_s"]].median().round(2))


# m classes of :func:`gemm_ratios`: below and inside the ranges where GEMM kernels switch
# tile configurations, and m one past a multiple of 256 (one more row of tiles)
GEMM_M_CLASSES = (
    ("m <= 64", lambda m: m <= 64),
    ("65-128", lambda m: (m > 64) & (m <= 128)),
    ("129-256", lambda m: (m > 128) & (m <= 256)),
    ("> 256, multiple of 256", lambda m: (m > 256) & (m % 256 == 0)),
    ("> 256, multiple of 256 + 1", lambda m: (m > 256) & (m % 256 == 1)),
)


def gemm_ratios(data_root: Path, gpu: str, dtype: str = "fp8") -> pd.DataFrame:
    """Median measured / predicted time of the public ``dtype`` GEMM rows with the shipped
    profile (FP8 with its quantisation kernel), per framework (columns) and m class
    (:data:`GEMM_M_CLASSES`, rows): where the smooth GEMM form errs by shape."""
    prof = load_profile(gpu)
    g = public.aic_gemm(data_root, gpu)
    g = g[g["dtype"] == dtype]
    prm = prof.gemm_params(dtype)
    pred = ops.gemm_time_s(prof.peaks, prm, g["m"], g["n"], g["k"], dtype)
    if dtype == "fp8":  # with its quantisation kernel, and TensorRT-LLM's dynamic scale
        pred = pred + quant_s(prof.peaks, prof.elementwise, g["m"], g["k"])
        dyn = g["framework"].isin(DYNAMIC_SCALE_FRAMEWORKS).to_numpy()
        scale = ops.fp8_dynamic_scale_time_s(prof.peaks, prm, g["m"], g["k"])
        pred = pred + np.where(dyn, scale, 0.0)
    g = g.assign(ratio=g["t_s"].to_numpy(float) / pred)
    m = g["m"].to_numpy(float)
    out = {}
    for name, sel in GEMM_M_CLASSES:
        out[name] = g[sel(m)].groupby("framework")["ratio"].median()
    return pd.DataFrame(out).T.round(2)


# SGLang's FP8 GEMM on Hopper (sgl-kernel csrc/gemm/fp8_gemm_kernel.cu
# sm90_fp8_dispatch_shape): 64 x 64 x 128 CTA tiles for m <= 256, 128 x 128 x 128 above
SGLANG_FP8_SMALL_TILE_MAX_M = 256
H100_SMS = 132


def gemm_tile_fit(data_root: Path, gpu: str = "h100-sxm") -> pd.DataFrame:
    """SGLang's FP8 GEMM rows (with their quantisation kernel) under three forms: a tile
    form with two tile shapes (64 x 64 up to m = 256, 128 x 128 above; each GEMM whole
    waves of its CTA tiles over the SMs, one efficiency per tile shape, against the memory
    bound; a diagnostic, not shipped), the whole dispatch table (the shipped
    ``gemm_kernels.sglang-fp8``, :func:`fit_sglang_fp8_kernel`) and the smooth GEMM form
    refitted to the same rows; APE by m range, and each fit held out by (n, k) family."""
    pk = peaks_of(gpu)
    ew = load_profile(gpu).elementwise
    g = public.aic_gemm(data_root, gpu)
    t = g[(g["framework"] == "sglang") & (g["dtype"] == "fp8")]
    m, n, k, ts = (t[c].to_numpy(float) for c in ("m", "n", "k", "t_s"))
    extra = quant_s(pk, ew, m, k)
    small = m <= SGLANG_FP8_SMALL_TILE_MAX_M
    tile = np.where(small, 64.0, 128.0)
    waves = np.ceil(np.ceil(m / tile) * np.ceil(n / tile) / H100_SMS)

    def model(p, idx):
        launch, eff_small, eff_big, mem_eff = p
        eff = np.where(small[idx], eff_small, eff_big)
        per_tile = 2.0 * tile[idx] ** 2 * k[idx] / (pk.fp8_flop_per_s / H100_SMS * eff)
        mem = ops.gemm_bytes(m[idx], n[idx], k[idx], 1.0) / (pk.hbm_bytes_per_s * mem_eff)
        return launch + np.maximum(waves[idx] * per_tile, mem) + extra[idx]

    fam = shape_family(t["n"], t["k"])
    p, err = fit_generic(
        model, ts, [(4e-6, 0.5, 0.7, 0.8), (2e-6, 0.3, 0.9, 0.6)], (1e-8,) + (1e-3,) * 3,
        (1e-3, 1.0, 1.0, 1.0), fam,
    )  # fmt: skip
    # the whole dispatch table: the shipped kernel's form (fit_sglang_fp8_kernel)
    entry, kerr, _ = fit_sglang_fp8_kernel(g, pk, ew, NUM_SMS[gpu])
    dispatch_pred = ops.tiled_gemm_time_s(pk, tiled_params(entry), m, n, k) + extra
    err4 = FitError(
        kerr["median_ape"], kerr["mean_ape"], kerr["p90_ape"], kerr["n"],
        kerr["held_out_median_ape"], kerr["held_out_mean_ape"], kerr["held_out"],
    )  # fmt: skip
    smooth = fit_gemm(pk, m, n, k, ts, "fp8", groups=fam, extra_s=extra)
    fits = {
        "tile form": (model(p, np.arange(len(ts))), err),
        "dispatch table": (dispatch_pred, err4),
        "smooth form": (ops.gemm_time_s(pk, smooth.params, m, n, k, "fp8") + extra, smooth.error),
    }
    rows = []
    for name, (pred, e) in fits.items():
        a = np.abs(pred / ts - 1.0)
        for label, lo, hi in (
            ("all", 0, np.inf),
            ("<= 64", 0, 64),
            ("65-128", 64, 128),
            ("129-256", 128, 256),
            ("257-1024", 256, 1024),
            ("> 1024", 1024, np.inf),
        ):
            sel = (m > lo) & (m <= hi)
            rows.append(
                {
                    "form": name,
                    "m": label,
                    "n": int(sel.sum()),
                    "median_ape": round(float(np.median(a[sel])), 3),
                    "p90_ape": round(float(np.percentile(a[sel], 90)), 3),
                    "held_out_median_ape": round(float(e.held_out_median_ape or np.nan), 3),
                }
            )
    return pd.DataFrame(rows)


# tables a framework's own FP8 kernel is compared with (tile_form_variants): SGLang's source
# table (64 x 64 tiles up to m = 256, SGLANG_FP8_SOURCE_TABLE); vLLM's table before the
# swapped small-m configs and the 256 x 128 branch (64 x 64 tiles in 1 x 8 clusters up to
# m = 64)
VLLM_FP8_EARLIER = replace(
    VLLM_FP8,
    branches=(_tile(64, 64, 64, 1, 8), _tile(128, 64, 128, 2, 1), _tile(None, 128, 128, 2, 1)),
    eff_groups=(0, 1, 2),
    eff_starts=((0.5, 0.7, 0.8), (0.3, 0.9, 0.9)),
)
TILE_VARIANT_TABLES = {
    "sglang": (SGLANG_FP8, SGLANG_FP8_SOURCE_TABLE, "table: the source's (64 x 64 to m 256)"),
    "vllm": (VLLM_FP8, VLLM_FP8_EARLIER, "table: vLLM's earlier one"),
}


FEW_CTA_MAX_N = 1024  # n at most this: <= 16 64-wide N tiles, <= 64 CTAs up to m = 256
FEW_CTA_M = (64, 65, 128, 129, 192, 193, 256, 257, 512)


def few_cta_gemm_times(data_root: Path, gpu: str = "h100-sxm") -> pd.DataFrame:
    """FP8 GEMM rows with few CTAs (n <= :data:`FEW_CTA_MAX_N`: at most 64 CTAs up to
    m = 256 under either framework's tiles, one wave of the SMs), so a row's time is one
    CTA's: per framework and k, the median time (µs) over those n at each m of
    :data:`FEW_CTA_M`. Where a CTA's tile changes with m, the time steps; the source's table
    gives SGLang 64-row tiles from m = 65 to 256 (no step at 129), vLLM 128-row tiles from
    129."""
    g = public.aic_gemm(data_root, gpu)
    t = g[(g["dtype"] == "fp8") & (g["n"] <= FEW_CTA_MAX_N) & g["m"].isin(FEW_CTA_M)]
    t = t[t["framework"].isin(["sglang", "vllm"]) & (t["k"] >= 16384)]
    if t.empty:
        raise UserError(f"{gpu}: no FP8 GEMM rows with n <= {FEW_CTA_MAX_N} and k >= 16384")
    out = t.assign(t_us=t["t_s"] * 1e6).pivot_table(
        index=["framework", "k"], columns="m", values="t_us", aggfunc="median"
    )
    out.columns = [f"m={int(c)}" for c in out.columns]
    return out.round(1)


def tile_form_variant_apes(
    gemm: pd.DataFrame,
    peaks: GpuPeaks,
    ew: ElementwiseParams,
    num_sms: int,
    spec: TileKernelSpec,
    term: str = "",
    l2: bool = True,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """APEs of ``spec``'s framework's FP8 rows under its tile form (with the L2
    operand-traffic bound as shipped, or without it: ``l2`` False) plus one optional term
    (``term``): ``"quant"``, the activation-quantisation kernel's time times a fitted
    factor (the framework's own quantisation kernel against the element-wise fit), or
    ``"pingpong"``, each SM's epilogue paid once instead of once per wave on the ping-pong
    branches (one consumer warp group's epilogue under the other's mainloop;
    :data:`COOPERATIVE_BRANCHES` keep it per wave). In sample and held out by (n, k)
    family, and the fitted L2 rate (NaN without one) and extra parameter (NaN without
    one)."""
    t = gemm[(gemm["dtype"] == "fp8") & (gemm["framework"] == spec.framework)]
    m, n, k, ts = (t[c].to_numpy(float) for c in ("m", "n", "k", "t_s"))
    quant = quant_s(peaks, ew, m, k)
    ne = max(spec.eff_groups) + 1
    nq = ne + 3 + (1 if l2 else 0)  # the tile form's parameters, the L2 rate last

    def params_of(q) -> TiledGemmParams:
        return spec_params(spec, num_sms, q[:nq])

    p1 = params_of([1.0] * (ne + 3))
    tiles, tm, tn, cm, cn = ops.tiled_gemm_grid(p1, m, n, k)
    l2_bytes = ops.tiled_gemm_l2_bytes(tiles, tm, tn, cm, cn, k, 1.0)
    br = np.array([p1.branches.index(p1.branch(*x)) for x in zip(m, n, k, strict=True)])
    coop = np.isin(br, COOPERATIVE_BRANCHES.get(spec.name, ()))
    waves = np.ceil(tiles / num_sms)
    area = tm * tn
    per_sm = peaks.flop_per_s("fp8") / num_sms
    mem_bytes = ops.gemm_bytes(m, n, k, 1.0)

    def model(q, idx):
        p = params_of(q)
        if term == "pingpong":  # the epilogue once per SM, not per wave, on ping-pong branches
            eff = np.array([b.max_eff for b in p.branches])[br[idx]]
            main = 2.0 * area[idx] * k[idx] / (per_sm * eff)
            epi = p.epilogue_s_per_elem * area[idx]
            w = waves[idx]
            compute = np.where(coop[idx], w * (main + epi), w * main + epi)
            mem = mem_bytes[idx] / (peaks.hbm_bytes_per_s * p.mem_eff)
            bound = np.maximum(compute, mem)
            if p.l2_bytes_per_s > 0.0:
                bound = np.maximum(bound, l2_bytes[idx] / p.l2_bytes_per_s)
            s = p.launch_s + bound
        else:
            s = ops.tiled_gemm_time_s(peaks, p, m[idx], n[idx], k[idx])
        return s + quant[idx] * (q[-1] if term == "quant" else 1.0)

    starts, lower, upper = tile_fit_bounds(spec, l2)
    extra = {"quant": (1.0, 1.5, 0.2, 5.0)}.get(term)
    if extra:
        starts = [(*starts[0], extra[0]), (*starts[1], extra[1])]
        lower, upper = (*lower, extra[2]), (*upper, extra[3])
    fam = shape_family(t["n"], t["k"])
    q, _ = fit_generic(model, ts, starts, lower, upper, fam, held_out=False)
    held, _ = held_out_apes(model, ts, q, lower, upper, fam)
    a = np.abs(model(q, np.arange(len(ts))) / ts - 1.0)
    rate = float(q[nq - 1]) if l2 else float("nan")
    return a, held, rate, float(q[-1]) if extra else float("nan")


def tile_form_variants(data_root: Path, framework: str, gpu: str = "h100-sxm") -> pd.DataFrame:
    """A framework's FP8 GEMM rows under its shipped tile form (``sglang`` or ``vllm``:
    with the L2 operand-traffic bound) and four variants, each refitted and held out by
    (n, k) family: without the L2 bound (the form shipped until 2026-12-02), a fitted
    quantisation-kernel factor, the ping-pong epilogue paid once per SM, and another
    dispatch table (:data:`TILE_VARIANT_TABLES`). The fitted L2 rate of each (TB/s)."""
    pk = peaks_of(gpu)
    ew = load_profile(gpu).elementwise
    g = public.aic_gemm(data_root, gpu)
    shipped, other, other_name = TILE_VARIANT_TABLES[framework]
    m = g[(g["dtype"] == "fp8") & (g["framework"] == framework)]["m"].to_numpy(float)
    mid = (m > 128) & (m <= 256)
    rows = []
    for name, spec, term, l2 in (
        ("shipped (with the L2 bound)", shipped, "", True),
        ("without the L2 bound", shipped, "", False),
        ("+ quantisation factor", shipped, "quant", True),
        ("ping-pong: epilogue once per SM", shipped, "pingpong", True),
        (other_name, other, "", True),
    ):
        a, held, rate, x = tile_form_variant_apes(g, pk, ew, NUM_SMS[gpu], spec, term, l2)
        rows.append(
            {
                "form": name,
                "median_ape": round(float(np.median(a)), 4),
                "mean_ape": round(float(np.mean(a)), 4),
                "p90_ape": round(float(np.percentile(a, 90)), 4),
                "m 129-256": round(float(np.median(a[mid])), 4),
                "held_out_median": round(float(np.median(held)), 4),
                "held_out_mean": round(float(np.mean(held)), 4),
                "held_out_p90": round(float(np.percentile(held, 90)), 4),
                "L2 TB/s": round(rate / 1e12, 2) if l2 else "",
                "fitted": "" if term != "quant" else f"factor {x:.2f}",
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


# TensorRT-LLM's XQA multi-block rule (decoderXQAImplCommon.h computeMultiBlockCount,
# decoderXQAConstants.h): kMinHistoryTokensPerBlock, kTargetWaveFactor; SMs per GPU
XQA_MIN_TOKENS_PER_BLOCK = 128
XQA_TARGET_WAVES = 8
SMS = {"h100-sxm": 132, "a100-80gb": 108}


def xqa_blocks_per_sequence(per_seq_tokens, items, sms: int) -> np.ndarray:
    """Thread blocks XQA's multi-block mode gives each (sequence, KV head) item: one per 128
    cached tokens, at most ``round(sqrt(8 × that))``, cut so that ``items × blocks`` stays
    within 8 waves of the SMs, at least 1 (its workspace cap is not modelled)."""
    m0 = np.floor(np.asarray(per_seq_tokens, float) / XQA_MIN_TOKENS_PER_BLOCK)
    m = np.maximum(np.minimum(m0, np.round(np.sqrt(8.0 * m0))), 1.0)
    adj = np.asarray(items, float) * m / (sms * XQA_TARGET_WAVES)
    return np.maximum(np.where(adj > 1.0, np.floor(m / adj), m), 1.0)


def xqa_split_fit(data_root: Path, gpu: str = "h100-sxm") -> pd.DataFrame:
    """A diagnostic, not shipped: TensorRT-LLM's XQA decode rows (bf16 KV) under the shipped
    split-KV shortfall form (few items pay a fill time, never more than the share's loss;
    the FlashAttention fits' form, XQA's own is the wave form) and under XQA's own
    multi-block count (the
    bandwidth share over ``items × blocks`` thread blocks, blocks from the context per
    sequence: :func:`xqa_blocks_per_sequence`), in sample and fitted on ≤ 2048 tokens per
    sequence, tested on > 8192. The second is not affine in the context at a fixed batch."""
    d = public.aic_decode_attention(data_root, gpu)
    d = _decode_backend_rows(d[d["dtype"] == "bf16"], "trtllm")
    pk = table_peaks(peaks_of(gpu), d)  # the table's frame: fitted and predicted in it
    b, c, kh, hd, ts = (
        d[x].to_numpy(float) for x in ("batch", "context_tokens", "kv_heads", "head_dim", "t_s")
    )
    blocks = xqa_blocks_per_sequence(c / b, b * kh, SMS[gpu])

    def count_form(p, idx):
        floor, per_seq, bw, per_elem, half, multi = p
        work = b[idx] * kh[idx] * blocks[idx]
        stream = 2.0 * c[idx] * kh[idx] * hd[idx] * 2.0 / (pk.hbm_bytes_per_s * bw)
        stream = stream * (work + half) / work
        items = per_elem * b[idx] * kh[idx] * hd[idx]
        fixed = floor + multi * ((b[idx] > 1) & (kh[idx] > 1)) + per_seq * b[idx]
        return fixed + np.maximum(items, stream)

    starts = [(8e-6, 1e-8, 0.7, 1e-10, 10.0, 1e-6), (3e-6, 1e-9, 0.9, 1e-11, 100.0, 1e-7)]
    lo, hi = (1e-8, 1e-13, 1e-4, 1e-15, 1e-4, 1e-12), (1e-2, 1e-3, 1.0, 1e-5, 1e4, 1e-3)
    every = np.arange(len(ts))
    short, long_ = every[c / b <= 2048], every[c / b > 8192]
    rows = []
    for name in ("split-KV shortfall (shipped FlashAttention form)", "XQA multi-block count"):
        for label, train, test in (("in sample", every, every), ("≤ 2048 → > 8192", short, long_)):
            if name.startswith("XQA"):
                p, _ = fit_generic(count_form, ts[train], starts, lo, hi, held_out=False)
                pred = count_form(p, test)
            else:
                f = fit_decode_attention(
                    pk, b[train], c[train], kh[train], hd[train], ts[train],
                    held_out=False, split_kv=True,
                )  # fmt: skip
                pred = ops.decode_attention_time_s(
                    pk, f.params, b[test], c[test], kh[test], hd[test]
                )
            a = np.abs(pred / ts[test] - 1.0)
            rows.append(
                {
                    "form": name,
                    "rows": label,
                    "n": len(test),
                    "median_ape": round(float(np.median(a)), 3),
                    "p90_ape": round(float(np.percentile(a, 90)), 3),
                }
            )
    return pd.DataFrame(rows)


def mmha_split_counts(batch, heads, per_seq_tokens, head_dim, sms: int) -> np.ndarray:
    """Thread blocks masked MHA's multi-block mode gives each (sequence, query head) item of
    a batch of ``batch`` sequences with ``heads`` query heads
    (``ops.mmha_blocks_per_sequence``): at most one wave of the SMs, at least one KV loop
    per block."""
    items = np.asarray(batch, float) * np.asarray(heads, float)
    return ops.mmha_blocks_per_sequence(per_seq_tokens, items, head_dim, sms)


def mmha_wave_form_s(
    p, batch, heads, kv_heads, head_dim, per_seq_tokens, splits, hbm, sms, kv_elem
):
    """A masked-MHA decode kernel as waves of thread blocks (a diagnostic form, not the
    step model's): ``B x H x s`` blocks over ``sms`` SMs in ``W`` full waves and a partial
    one of ``r``; each block pays ``cta_s`` and streams ``(L + 1) / s`` tokens of ``2 x D x
    kv_elem`` bytes, in a full wave at the longer of its HBM share (the ``g`` query heads of
    a KV head read it once from HBM) and its share of the L2 re-read rate, in the partial
    one at least at its own rate ``cta_bytes_per_s``; a split item pays a reduction
    (``split_s + split_elem_s x s x D``). ``p``: (floor_s, bw_eff, cta_s, cta_bytes_per_s,
    reread_bytes_per_s, split_s, split_elem_s)."""
    floor, bw_eff, cta_s, cta_rate, reread, split_s, split_elem = p
    b, h, kh, d, s = (np.asarray(x, float) for x in (batch, heads, kv_heads, head_dim, splits))
    g = h / kh
    n = b * h * s
    full = np.floor(n / sms)
    rest = n - full * sms
    part = (rest > 0.0).astype(float)
    bw = hbm * bw_eff
    per_tok = 2.0 * d * kv_elem
    full_tok = per_tok * sms * np.maximum(1.0 / (g * bw), 1.0 / reread)
    rest_tok = per_tok * np.maximum(np.maximum(1.0 / cta_rate, rest / (g * bw)), rest / reread)
    tokens = (np.asarray(per_seq_tokens, float) + 1.0) / s
    split = (s > 1.0) * (split_s + split_elem * s * d)
    return floor + (full + part) * cta_s + split + tokens * (full * full_tok + part * rest_tok)


def mmha_split_fit(
    data_root: Path, gpu: str = "h100-sxm"
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A diagnostic: TensorRT-LLM's masked-MHA decode rows (``trtllm-mmha``, each KV dtype)
    under the line form (split-KV with per-query-head re-reads), under the wave form of its
    own multi-block count (:func:`mmha_split_counts`, :func:`mmha_wave_form_s`: not a form
    the step model can take, whose decode step is the smallest of a few lines in the
    context) and under the step model's per-query-head wave lines
    (``ops.decode_wave_lines``: the smallest over split counts 1, 2, 4, ... up to one
    wave, ``calibration.fit.fit_decode_wave``), each fitted and held out by head-layout
    family, and which of the step model's two forms :func:`wave_form_wins` picks
    (``rule_picks``). Returns the errors, the line form's median measured/predicted per
    split count and tokens per sequence (the residual the rule explains) and the wave
    lines' per work items over the SMs and tokens per sequence."""
    pk = peaks_of(gpu)
    sms = NUM_SMS[gpu]
    dec = public.aic_decode_attention(data_root, gpu)
    rows, resid, wave_resid = [], [], []
    share = pk.hbm_bytes_per_s / sms
    starts = [
        (5e-6, 0.8, 3e-6, 2.0 * share, 5.0 * pk.hbm_bytes_per_s, 3e-6, 1e-11),
        (3e-6, 0.9, 1e-6, share, 2.0 * pk.hbm_bytes_per_s, 1e-6, 1e-12),
    ]
    lo = (1e-8, 1e-3, 1e-10, 0.05 * share, 0.2 * pk.hbm_bytes_per_s, 1e-10, 1e-16)
    hi = (1e-3, 1.0, 1e-3, pk.hbm_bytes_per_s, 100.0 * pk.hbm_bytes_per_s, 1e-3, 1e-6)
    hbm = pk.hbm_bytes_per_s
    for dtype in sorted(set(dec["dtype"])):
        d = _decode_backend_rows(dec[dec["dtype"] == dtype], TRTLLM_PER_QUERY_HEAD_BACKEND)
        if d.empty:
            continue
        elem = 1.0 if dtype == "fp8" else 2.0
        b, h, kh, hd, c, ts = (
            d[x].to_numpy(float)
            for x in ("batch", "heads", "kv_heads", "head_dim", "context_tokens", "t_s")
        )
        per_seq = c / b
        g = np.round(h / kh)
        fam = shape_family(d["heads"], d["kv_heads"], d["head_dim"])
        # the line form (split-KV with per-query-head re-reads), fitted here: the form the
        # profiles shipped before the wave lines, and where the rule keeps it
        line = fit_decode_backend(pk, TRTLLM_PER_QUERY_HEAD_BACKEND, dtype, d, num_sms=0)
        pred = predict_decode_rows(pk, line.params, dtype, d)
        splits = mmha_split_counts(b, h, per_seq, hd, sms)
        x = (b, h, kh, hd, per_seq)

        def rule(p, idx, x=x, s=splits, elem=elem):
            return mmha_wave_form_s(p, *(v[idx] for v in x), s[idx], hbm, sms, elem)

        _, rule_err = fit_generic(rule, ts, starts, lo, hi, fam, held_out=True)
        # the form the step model takes (ops.decode_wave_lines): the smallest of the lines
        # of split counts 1, 2, 4, ... cut to one wave, fitted as calibration.fit would
        fit_lines = fit_decode_wave(
            pk, b, c, kh, hd, ts, g, sms, elem, groups=fam, per_query_head=True
        )
        pick = "wave lines" if wave_form_wins(fit_lines.error, line.error) else "line form"
        for name, ferr in (
            ("line form", line.error),
            ("wave form, the rule's split", rule_err),
            ("wave lines (step model), smallest split", fit_lines.error),
        ):
            rows.append(
                {
                    "kv": dtype,
                    "form": name,
                    "n": ferr.n,
                    "median_ape": round(ferr.median_ape, 3),
                    "p90_ape": round(ferr.p90_ape, 3),
                    "held_out_median_ape": round(float(ferr.held_out_median_ape or 0.0), 3),
                    "held_out_p90_ape": round(float(ferr.held_out_p90_ape or 0.0), 3),
                    "rule_picks": pick,
                }
            )
        lb = pd.cut(
            per_seq, [0, 128, 512, 2048, 8192, np.inf],
            labels=["<=128", "129-512", "513-2048", "2049-8192", ">8192"],
        )  # fmt: skip
        sb = pd.cut(splits, [0, 1, 3, 9, np.inf], labels=["1", "2-3", "4-9", ">9"])
        r = pd.DataFrame({"kv": dtype, "splits": sb, "tokens_per_seq": lb, "ratio": ts / pred})
        resid.append(
            r.pivot_table(
                index=["kv", "splits"], columns="tokens_per_seq", values="ratio", aggfunc="median"
            ).round(2)
        )
        # the wave lines' own residual by items (B x H) over the SMs
        wave = predict_decode_rows(pk, fit_lines.params, dtype, d)
        ib = pd.cut(b * h / sms, [0, 1, 4, np.inf], labels=["<=1", "1-4", ">4"])
        w = pd.DataFrame({"kv": dtype, "items/SMs": ib, "tokens_per_seq": lb, "ratio": ts / wave})
        wave_resid.append(
            w.pivot_table(
                index=["kv", "items/SMs"], columns="tokens_per_seq", values="ratio",
                aggfunc="median", observed=False,
            ).round(2)
        )  # fmt: skip
    return pd.DataFrame(rows), pd.concat(resid), pd.concat(wave_resid)


def mmha_occupancy_ratios(data_root: Path, gpu: str) -> pd.DataFrame:
    """A diagnostic (``--mmha-occupancy``): TensorRT-LLM's masked-MHA decode rows, median
    measured / predicted by the shipped profile's line form with its occupancy term
    (``with_term``) and without it (``block_bytes_per_s`` 0: ``line_form``), and the median
    APE of each, by the 256-thread blocks resident per SM at the rows' tokens per sequence
    (``ops.mmha_resident_blocks``) and whether the rows have ``4 × SMs`` items or more (the
    untuned launch the bound applies to), per KV dtype."""
    prof = load_profile(gpu)
    rows = _decode_backend_rows(public.aic_decode_attention(data_root, gpu), "trtllm-mmha")
    out = []
    for kv, r in rows.groupby("dtype"):
        p = prof.decode_attention_for(TRTLLM_PER_QUERY_HEAD_BACKEND, str(kv))
        hist = r["context_tokens"] / r["batch"] - 1.0
        frame = pd.DataFrame(
            {
                "kv": kv,
                "untuned": r["batch"] * r["heads"] >= ops.MMHA_UNTUNED_BLOCKS_PER_SM * NUM_SMS[gpu],
                "resident": ops.mmha_resident_blocks(hist, SMEM_PER_SM_KIB[gpu]),
            }
        )
        for name, params in (("with_term", p), ("line_form", replace(p, block_bytes_per_s=0.0))):
            t = predict_decode_rows(prof.peaks, params, str(kv), r)
            frame[f"ratio_{name}"] = r["t_s"].to_numpy() / t
            frame[f"ape_{name}"] = np.abs(t / r["t_s"].to_numpy() - 1.0)
        out.append(frame)
    return (
        pd.concat(out)
        .groupby(["kv", "untuned", "resident"])
        .agg(
            n=("resident", "size"),
            ratio_line_form=("ratio_line_form", "median"),
            ratio_with_term=("ratio_with_term", "median"),
            ape_line_form=("ape_line_form", "median"),
            ape_with_term=("ape_with_term", "median"),
        )
        .round(3)
    )


def mmha_occupancy_held_out(data_root: Path, gpu: str) -> pd.DataFrame:
    """A diagnostic (``--mmha-occupancy``): the masked-MHA rows with 1 or 2 resident blocks
    per SM over ``4 × SMs`` items or more (where the term binds), median / p90 APE of each head-layout family's rows
    predicted by the line form refitted without that family, with and without the
    occupancy term (minutes: one refit per family and form), per KV dtype."""
    peaks = peaks_of(gpu)
    rows = _decode_backend_rows(public.aic_decode_attention(data_root, gpu), "trtllm-mmha")
    occ = (float(NUM_SMS[gpu]), float(SMEM_PER_SM_KIB[gpu]))
    out = []
    for kv, r in rows.groupby("dtype"):
        r = mmha_fit_rows(r, str(kv))  # the rows the shipped fit stands on
        hist = r["context_tokens"] / r["batch"] - 1.0
        bounded = np.asarray(
            (r["batch"] * r["heads"] >= ops.MMHA_UNTUNED_BLOCKS_PER_SM * NUM_SMS[gpu])
            & (ops.mmha_resident_blocks(hist, SMEM_PER_SM_KIB[gpu]) <= 2)
        )
        fam = shape_family(r["heads"], r["kv_heads"], r["head_dim"])
        for name, term in (("line_form", None), ("with_term", occ)):
            apes: list[float] = []
            for f in sorted(set(fam[bounded])):
                test = fam == f
                fit = fit_decode_backend(
                    peaks, TRTLLM_PER_QUERY_HEAD_BACKEND, str(kv), r[~test], held_out=False,
                    occupancy=term,
                )  # fmt: skip
                sel = test & bounded
                t = predict_decode_rows(peaks, fit.params, str(kv), r[sel])
                apes.extend(np.abs(t / r["t_s"][sel].to_numpy() - 1.0).tolist())
            a = np.asarray(apes)
            out.append(
                {
                    "kv": kv,
                    "form": name,
                    "rows": len(a),
                    "held_out_median_ape": round(float(np.median(a)), 4),
                    "held_out_p90_ape": round(float(np.quantile(a, 0.9)), 4),
                }
            )
    return pd.DataFrame(out)


def mmha_element_rates(data_root: Path, gpu: str) -> pd.DataFrame:
    """A diagnostic (``--mmha-element-rates``): TensorRT-LLM's masked-MHA decode rows over
    ``4 × SMs`` items or more (the untuned 256-thread launch) at 2,048 cached tokens a
    sequence or more, by resident blocks per SM, KV dtype, head dim and whether the layout
    re-reads its KV head from L2 (more than one query head per KV head): the rows, median
    measured / predicted by the shipped line form, and the median rate in query-head
    elements per second (each of the ``g`` query heads of a KV head reads each of its
    elements once: ``2 × C × kv_heads × head_dim × g / t``). An FP8 cache at head dim 64
    or 128 is a launch-bounded kernel (:data:`MMHA_FP8_BOUNDED_MAX_HEAD_DIM`)."""
    prof = load_profile(gpu)
    rows = _decode_backend_rows(public.aic_decode_attention(data_root, gpu), "trtllm-mmha")
    out = []
    for kv, r in rows.groupby("dtype"):
        p = prof.decode_attention_for(TRTLLM_PER_QUERY_HEAD_BACKEND, str(kv))
        g = (r["heads"] / r["kv_heads"]).round()
        hist = r["context_tokens"] / r["batch"] - 1.0
        t = predict_decode_rows(prof.peaks, p, str(kv), r)
        frame = pd.DataFrame(
            {
                "resident": ops.mmha_resident_blocks(hist, SMEM_PER_SM_KIB[gpu]),
                "kv": kv,
                "head_dim": r["head_dim"].astype(int),
                "l2_reread": g > 1,
                "ratio": r["t_s"].to_numpy() / t,
                "q_elem_per_s": 2.0
                * r["context_tokens"]
                * r["kv_heads"]
                * r["head_dim"]
                * g
                / r["t_s"],
            }
        )
        keep = (r["batch"] * r["heads"] >= ops.MMHA_UNTUNED_BLOCKS_PER_SM * NUM_SMS[gpu]) & (
            hist >= 2047
        )
        out.append(frame[keep.to_numpy()])
    frame = pd.concat(out)
    return (
        frame.groupby(["resident", "l2_reread", "kv", "head_dim"])
        .agg(
            rows=("ratio", "size"),
            ratio=("ratio", "median"),
            tera_q_elem_per_s=("q_elem_per_s", lambda x: float(np.median(x)) / 1e12),
        )
        .round(3)
    )


def xqa_fallback_ratios(data_root: Path, gpu: str) -> pd.DataFrame:
    """A diagnostic (``--xqa-fallback``): TensorRT-LLM's XQA decode rows split by its
    ``mayHavePerfGain`` rule (decoderXQAImplJIT.cpp: XQA only where ``kv_heads × batch ×
    max(1, history // 128) × 4 >= SMs``, multi-block mode on; else masked MHA), median
    measured / predicted by the shipped XQA fit and by the masked-MHA fit (per query head,
    its own re-read rate), and the median APE of each, by KV dtype and head dim: where the
    rule refuses XQA, the rows would follow the masked-MHA fit if TensorRT-LLM fell back."""
    prof = load_profile(gpu)
    rows = _decode_backend_rows(public.aic_decode_attention(data_root, gpu), "trtllm")
    out = []
    for kv, r in rows.groupby("dtype"):
        hist = (r["context_tokens"] / r["batch"] - 1.0).round()
        frame = pd.DataFrame(
            {
                "kv": kv,
                "head_dim": r["head_dim"].astype(int),
                "xqa_by_rule": r["kv_heads"] * r["batch"] * np.maximum(1.0, hist // 128) * 4
                >= NUM_SMS[gpu],
            }
        )
        for name, backend in (("xqa", "trtllm"), ("mmha", TRTLLM_PER_QUERY_HEAD_BACKEND)):
            t = predict_decode_rows(
                prof.peaks, prof.decode_attention_for(backend, str(kv)), str(kv), r
            )
            frame[f"ratio_{name}"] = r["t_s"].to_numpy() / t
            frame[f"ape_{name}"] = np.abs(t / r["t_s"].to_numpy() - 1.0)
        out.append(frame)
    return (
        pd.concat(out)
        .groupby(["kv", "head_dim", "xqa_by_rule"])
        .agg(
            rows=("ratio_xqa", "size"),
            ratio_xqa=("ratio_xqa", "median"),
            ratio_mmha=("ratio_mmha", "median"),
            ape_xqa=("ape_xqa", "median"),
            ape_mmha=("ape_mmha", "median"),
        )
        .round(3)
    )


def trtllm_layout_rows(data_root: Path, gpu: str, heads: int, kv_heads: int, head_dim: int):
    """A diagnostic (``--trtllm-layout``): every TensorRT-LLM decode row of one per-GPU head
    layout, with the kernel TensorRT-LLM runs for it (:func:`trtllm_xqa`) and the shipped
    fit's prediction: KV dtype, batch, cached tokens per sequence, measured and predicted
    microseconds, measured / predicted."""
    prof = load_profile(gpu)
    frame = public.aic_decode_attention(data_root, gpu)
    xqa = bool(trtllm_xqa(heads, kv_heads, head_dim))
    backend = "trtllm" if xqa else TRTLLM_PER_QUERY_HEAD_BACKEND
    rows = _decode_backend_rows(frame, backend)
    r = rows[
        (rows["heads"] == heads) & (rows["kv_heads"] == kv_heads) & (rows["head_dim"] == head_dim)
    ]
    out = []
    for kv, k in r.groupby("dtype"):
        t = predict_decode_rows(prof.peaks, prof.decode_attention_for(backend, str(kv)), str(kv), k)
        out.append(
            pd.DataFrame(
                {
                    "kernel": backend,
                    "kv": kv,
                    "batch": k["batch"].astype(int),
                    "tokens_per_seq": (k["context_tokens"] / k["batch"]).round().astype(int),
                    "measured_us": (1e6 * k["t_s"]).round(1),
                    "predicted_us": (1e6 * t).round(1),
                    "measured_over_predicted": (k["t_s"].to_numpy() / t).round(3),
                }
            )
        )
    if not out:
        return pd.DataFrame()
    return pd.concat(out).sort_values(["kv", "batch", "tokens_per_seq"])


def decode_rows_over_roofline(data_root: Path, gpu: str) -> pd.DataFrame:
    """A diagnostic (``--decode-roofline``): TensorRT-LLM's decode rows (XQA and masked MHA)
    per KV dtype, those reading 64 MB of KV or more, and how many of them stream the KV
    faster than the GPU's HBM (``2 × C × kv_heads × head_dim × bytes / t`` over the datasheet
    bandwidth): rows no kernel reading its KV from HBM can give, which a bandwidth-bound form
    cannot fit. With the shipped fit's median / p90 APE over every row and without those,
    and how many of the rows beyond its 90th percentile they are; and the same count and
    largest share for the bytes the table's kernel read from HBM (``as_timed``: the share
    :func:`table_hbm_share` of them): no XQA row exceeds it; the A100's masked-MHA rows over
    it (50) all hold at most 256 tokens a sequence, where its second pass finds K in L2."""
    prof = load_profile(gpu)
    hbm = prof.peaks.hbm_bytes_per_s
    frame = public.aic_decode_attention(data_root, gpu)
    out = []
    for backend in ("trtllm", TRTLLM_PER_QUERY_HEAD_BACKEND):
        for kv, r in _decode_backend_rows(frame, backend).groupby("dtype"):
            elem = kv_elem_bytes(str(kv))
            t = predict_decode_rows(
                prof.peaks, prof.decode_attention_for(backend, str(kv)), str(kv), r
            )
            ape = np.abs(t / r["t_s"].to_numpy() - 1.0)
            kv_bytes = (2.0 * r["context_tokens"] * r["kv_heads"] * r["head_dim"] * elem).to_numpy()
            share = kv_bytes / r["t_s"].to_numpy() / hbm
            big = kv_bytes >= 64e6
            over = big & (share > 1.0)
            timed = share * table_hbm_share(r)
            top = ape >= np.quantile(ape, 0.9)
            out.append(
                {
                    "kernel": backend,
                    "kv": kv,
                    "rows": len(r),
                    "rows_64MB_or_more": int(big.sum()),
                    "over_hbm": int(over.sum()),
                    "max_share_of_hbm": round(float(share[big].max()), 3),
                    "ape_median_p90": f"{np.median(ape):.3f} / {np.quantile(ape, 0.9):.3f}",
                    "without_over_hbm": f"{np.median(ape[~over]):.3f} / "
                    f"{np.quantile(ape[~over], 0.9):.3f}",
                    "over_hbm_beyond_p90": f"{int((top & over).sum())} of {int(top.sum())}",
                    "over_hbm_as_timed": int((big & (timed > 1.0)).sum()),
                    "max_share_as_timed": round(float(timed[big].max()), 3),
                }
            )
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.fit_public", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--data",
        default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"),
        help="public data root holding kernels/ (default ../shared/data from the repo root)",
    )
    p.add_argument("--out-dir", help="write profiles here instead of disaggsim/hardware/profiles/")
    p.add_argument(
        "--engines",
        action="store_true",
        help="also fit the serving-engine profiles (calibration/engines.py) to the public "
        "end-to-end measurements and write disaggsim/hardware/engines.json",
    )
    p.add_argument(
        "--decode-rates",
        metavar="GPU",
        choices=sorted(public.AIC_GPU_DIR),
        help="only print the KV bandwidth decode-attention kernels reach on large reads, "
        "per framework, KV dtype and head dim (fits and writes nothing)",
    )
    p.add_argument(
        "--decode-context-rates",
        metavar="GPU",
        choices=sorted(public.AIC_GPU_DIR),
        help="only print the median KV bandwidth of the bf16 decode rows per kernel, by MB "
        "read and tokens per sequence (fits and writes nothing)",
    )
    p.add_argument(
        "--context-ratios",
        metavar="GPU",
        choices=sorted(public.AIC_GPU_DIR),
        help="only print each bf16 decode kernel refitted on <= 2048 tokens per sequence "
        "and tested on > 8192, split-KV and bandwidth-share forms: median measured/predicted "
        "per batch and per KV-head count (fits and writes nothing shipped)",
    )
    p.add_argument(
        "--gemm-ratios",
        metavar="GPU",
        choices=sorted(public.AIC_GPU_DIR),
        help="only print the median measured/predicted time of the public FP8 GEMM rows "
        "with the shipped profile, per framework and m class (fits and writes nothing)",
    )
    p.add_argument(
        "--gemm-tiles",
        metavar="GPU",
        choices=["h100-sxm"],
        help="only print SGLang's FP8 GEMM rows fitted by a tile form from its dispatch "
        "table beside the smooth form (a diagnostic: fits and writes nothing shipped)",
    )
    p.add_argument(
        "--gemm-variants",
        metavar="FRAMEWORK",
        choices=sorted(TILE_VARIANT_TABLES),
        help="only print a framework's H100 FP8 GEMM rows under its shipped tile form and "
        "three variants (L2 operand traffic, a quantisation factor, another dispatch table), "
        "in sample and held out by (n, k) family (minutes; fits and writes nothing shipped)",
    )
    p.add_argument(
        "--xqa-split",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print TensorRT-LLM's XQA decode rows under the split-KV shortfall form and "
        "under XQA's own multi-block count, in sample and fitted on short contexts (a "
        "diagnostic: fits and writes nothing shipped)",
    )
    p.add_argument(
        "--mmha-split",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print TensorRT-LLM's masked-MHA decode rows under the line form, the wave "
        "form of its own multi-block count and the step model's wave lines, held out by "
        "head-layout family, and their residuals (a diagnostic: writes nothing)",
    )
    p.add_argument(
        "--mmha-occupancy",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print TensorRT-LLM's masked-MHA decode rows, measured / predicted with and "
        "without the shipped occupancy term, by resident blocks per SM, and the rows it bounds "
        "held out by head-layout family with and without it (minutes; a diagnostic: writes "
        "nothing)",
    )
    p.add_argument(
        "--mmha-element-rates",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print TensorRT-LLM's masked-MHA decode rows over 4 x SMs items at >= 2,048 "
        "tokens per sequence, measured / predicted and query-head elements per second, by "
        "resident blocks, KV dtype and head dim (a diagnostic: writes nothing)",
    )
    p.add_argument(
        "--xqa-fallback",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print TensorRT-LLM's XQA decode rows split by its mayHavePerfGain rule, "
        "measured / predicted by the XQA and the masked-MHA fits (a diagnostic: writes "
        "nothing)",
    )
    p.add_argument(
        "--trtllm-layout",
        nargs=4,
        metavar=("GPU", "HEADS", "KV_HEADS", "HEAD_DIM"),
        help="only print TensorRT-LLM's decode rows of one per-GPU head layout with the shipped "
        "fit's prediction (a diagnostic: writes nothing)",
    )
    p.add_argument(
        "--decode-roofline",
        metavar="GPU",
        choices=sorted(SMS),
        help="only print how many of TensorRT-LLM's decode rows reading >= 64 MB of KV stream "
        "it faster than the GPU's HBM (a diagnostic: writes nothing)",
    )
    args = p.parse_args(argv)
    if args.decode_roofline:
        print(
            decode_rows_over_roofline(Path(args.data), args.decode_roofline).to_string(index=False)
        )
        return 0
    if args.trtllm_layout:
        gpu, h, kh, d = args.trtllm_layout
        if gpu not in SMS:
            p.error(f"--trtllm-layout: GPU {gpu!r} has no kernel tables (one of {sorted(SMS)})")
        try:
            layout = (int(h), int(kh), int(d))
        except ValueError:
            p.error("--trtllm-layout: HEADS, KV_HEADS and HEAD_DIM are whole numbers")
        print(trtllm_layout_rows(Path(args.data), gpu, *layout).to_string(index=False))
        return 0
    if args.mmha_element_rates:
        print(mmha_element_rates(Path(args.data), args.mmha_element_rates).to_string())
        return 0
    if args.xqa_fallback:
        print(xqa_fallback_ratios(Path(args.data), args.xqa_fallback).to_string())
        return 0
    if args.mmha_occupancy:
        print(mmha_occupancy_ratios(Path(args.data), args.mmha_occupancy).to_string())
        print("\nrows with 1-2 resident blocks over 4 x SMs items, held out by head-layout family:")
        print(mmha_occupancy_held_out(Path(args.data), args.mmha_occupancy).to_string(index=False))
        return 0
    if args.gemm_variants:
        print(tile_form_variants(Path(args.data), args.gemm_variants).to_string(index=False))
        print(
            f"\nmedian time (us) of the FP8 rows with n <= {FEW_CTA_MAX_N} (few CTAs, one wave: "
            "one CTA's time), k >= 16384:"
        )
        print(few_cta_gemm_times(Path(args.data)).to_string())
        return 0
    if args.xqa_split:
        print(xqa_split_fit(Path(args.data), args.xqa_split).to_string(index=False))
        return 0
    if args.mmha_split:
        errs, resid, wave_resid = mmha_split_fit(Path(args.data), args.mmha_split)
        print(errs.to_string(index=False))
        print("\nline form, median measured/predicted by split count and tokens per sequence:")
        print(resid.to_string())
        print("\nwave lines, median measured/predicted by work items (B x H) over the SMs:")
        print(wave_resid.to_string())
        return 0
    if args.gemm_tiles:
        try:
            print(gemm_tile_fit(Path(args.data), args.gemm_tiles).to_string(index=False))
        except UserError as e:
            print(f"fit_public: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.decode_rates:
        try:
            rates = decode_rates(Path(args.data), args.decode_rates)
            by_group = decode_rates_by_group(Path(args.data), args.decode_rates)
            per_qh = per_query_head_rates(Path(args.data), args.decode_rates)
            fp8_ratio = decode_fp8_over_bf16(Path(args.data), args.decode_rates)
            by_size = decode_fp8_ratio_by_size(Path(args.data), args.decode_rates)
            l2 = decode_rates_by_size(Path(args.data), args.decode_rates)
        except UserError as e:
            print(f"fit_public: error: {e}", file=sys.stderr)
            return 2
        print(rates.to_string())
        print("\nper query heads per KV head (columns):")
        print(by_group.to_string())
        print(
            "\nFP8-KV time over bf16-KV time on the same shapes (FP8 reads >= "
            f"{DECODE_RATE_MIN_BYTES / 1e6:.0f} MB; 0.5 = the bf16 rate on half the bytes):"
        )
        print(fp8_ratio.to_string())
        print(
            f"\ntrtllm rows beyond XQA (> {XQA_MAX_Q_PER_KV} query heads per KV head: one "
            "thread block per query head), query-head bytes and elements per second:"
        )
        print(per_qh.to_string() if not per_qh.empty else "(none)")
        print(
            "\nvllm rows, measured / predicted by the shipped profile (median), by KV bytes "
            "read (MB, columns):"
        )
        print(by_size.to_string())
        print(
            "\nvllm rows, median KV bandwidth (TB/s) by KV bytes read (MB, columns; the H100's L2 "
            "holds 50 MB):"
        )
        print(l2.to_string())
        return 0
    if args.decode_context_rates:
        try:
            print(decode_rates_by_context(Path(args.data), args.decode_context_rates).to_string())
        except UserError as e:
            print(f"fit_public: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.context_ratios:
        try:
            t = context_extrapolation_ratios(Path(args.data), args.context_ratios)
        except UserError as e:
            print(f"fit_public: error: {e}", file=sys.stderr)
            return 2
        print(t.to_string(index=False))
        return 0
    if args.gemm_ratios:
        try:
            ratios = gemm_ratios(Path(args.data), args.gemm_ratios)
        except UserError as e:
            print(f"fit_public: error: {e}", file=sys.stderr)
            return 2
        print(ratios.to_string())
        return 0
    from calibration import engines
    from calibration.fit import build_profile
    from calibration.rawio import read_raw

    try:
        data = Path(args.data)
        public.kernels_dir(data)
        fitted = {}
        for gpu in FITTED_GPUS:
            out = destination(gpu, args.out_dir)
            base_path = out if out.is_file() else shipped_profile_path(gpu)
            base = json.loads(base_path.read_text())
            prof = engines.graphs_into(fit_gpu(gpu, data, base), data, gpu)
            write_profile(prof, out)
            fitted[gpu] = prof
            print(f"wrote {out}")
            _print_errors(prof)
        for gpu, src in PRIORS.items():
            out = destination(gpu, args.out_dir)
            prior = prior_from(gpu, src, fitted[src])
            write_profile(prior, out)
            print(f"wrote {out} (from {src}: {prior['provenance']['source'].split(';')[1]})")
            if gpu in MEASURED_RUNS:  # the GPU's own measurements on top of its prior
                raw_dir = REPO / MEASURED_RUNS[gpu]
                ship = (
                    Path(args.out_dir) if args.out_dir else shipped_profile_path(gpu).parent
                ) / (shipped_profile_path(gpu).name)
                prof = build_profile(gpu, read_raw(raw_dir), prior, MEASURED_RUNS[gpu], _rel(out))
                write_profile(prof, ship)
                print(f"wrote {ship} (measured parts from {MEASURED_RUNS[gpu]} over {_rel(out)})")
                _print_errors(prof)
        if args.engines:
            path = engines.write_engines(data, args.out_dir)
            print(f"wrote {path}")
    except UserError as e:
        print(f"fit_public: error: {e}", file=sys.stderr)
        return 2
    return 0


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    restart_on_one_blas_thread("calibration.fit_public")
    sys.exit(main())
