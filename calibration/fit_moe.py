"""Fit and validate the MoE, MLA and expert-parallel all-to-all operators against the
public H100 tables (NVIDIA AIConfigurator's collected database in ``../shared/data``).

``python -m calibration.fit_moe [--data ../shared/data] [--out FILE]`` fits the parameters
of :mod:`disaggsim.costmodel.moe_params` and writes ``disaggsim/hardware/moe/h100_sxm.json``
with each fit's error, in sample and held out by shape family. The formulas fitted are
exactly the ones the step model sums (``grouped_gemm_time_s``, ``all_to_all_time_s`` and
``all_to_all_volume_bytes`` in :mod:`disaggsim.costmodel.moe`, ``mla_decode_attention_s``
and ``mla_prefill_attention_s`` in :mod:`disaggsim.costmodel.mla`).

What each fit uses (the reference rows; the rest are reported beside them):

- grouped expert GEMM: TensorRT-LLM 1.3.0rc20 ``moe_perf`` (CUTLASS; the one framework
  whose balanced rows scale as 1 / EP), balanced rows less the cells its collector ran on
  another shape's tuning (``untuned_cells``), one parameter set per weight
  dtype (bf16, fp8, fp8-block, mxfp4 = w4a16), held out by model shape (hidden / expert
  width / experts / top-k): the reference set (``grouped_gemm``); and, the same way, vLLM
  0.24.0's and SGLang 0.5.14's own kernels from their ``moe_perf`` tables
  (``grouped_gemm_frameworks``; SGLang's FlashInfer CUTLASS rows, which it runs only for
  the 512-expert top-22 shapes, are reported, not fitted), the kernel a worker of that
  engine runs (``moe_params.ENGINE_EXPERT_KERNELS``); SGLang's Triton rows as two sets, the
  rows that ran a shipped tuned tile config (``grouped_gemm_tuned``, the files of
  ``hardware/moe/sglang_triton_configs.csv``) and those on its default tiles;
- MLA decode: TensorRT-LLM ``generation_mla_perf`` (absorbed FlashMLA), per KV dtype,
  held out by local head count;
- MLA prefill: SGLang ``context_mla_perf`` for the absorbed form (FA3 over the latent),
  TensorRT-LLM for the naive MHA form, bf16 KV rows, held out by local head count;
- DeepEP dispatch and combine, per mode: SGLang 0.5.12 (one node, many shapes) and
  0.5.6.post2 (DeepSeek shape, 1-8 nodes) tables, the best SM setting per point, held
  out by (nodes, hidden size).

:func:`validation_markdown` renders the section ``docs/validation.md`` carries (the
shipped parameters against every table row, by source and bucket).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.fit import (
    FitError,
    KeptResults,
    by_rows,
    fit_generic,
    restart_on_one_blas_thread,
    shape_family,
)
from disaggsim.costmodel.mla import mla_decode_attention_s, mla_prefill_attention_s
from disaggsim.costmodel.moe import (
    all_to_all_time_s,
    all_to_all_volume_bytes,
    grouped_gemm_time_s,
    power_law_imbalance,
)
from disaggsim.costmodel.moe_params import (
    SGLANG_DEVICE_NAMES,
    TUNED_TILE_FRAMEWORKS,
    AllToAllParams,
    GroupedGemmParams,
    MlaDecodeParams,
    MlaPrefillParams,
    MoeParams,
    load_moe_params,
    moe_params_from_dict,
    moe_params_path,
    sglang_tuned_configs,
)
from disaggsim.errors import UserError
from disaggsim.inputs import read_regular, regular_file
from disaggsim.output import json_owned, write_file

GPU = "h100-sxm"
BF16_PEAK, FP8_PEAK, HBM, NVLINK, NIC = 989e12, 1979e12, 3.35e12, 450e9, 50e9
GPUS_PER_NODE = 8
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8-block", "w4a16_mxfp4": "mxfp4"}
PEAK = {"bf16": BF16_PEAK, "fp8": FP8_PEAK, "fp8-block": FP8_PEAK, "mxfp4": BF16_PEAK}
ELEM = {"bf16": 2.0, "fp8": 1.0, "fp8-block": 1.0 + 4.0 / 16384, "mxfp4": 4.25 / 8}
REF_MOE = "trtllm"
COMMAND = "python -m calibration.fit_moe --data ../shared/data"
# the other frameworks whose own MoE kernels are fitted (``grouped_gemm_frameworks``)
GEMM_FRAMEWORKS = ("vllm", "sglang")
# kernels a framework runs only for a few shapes, not its MoE kernel: reported, not fitted
# (SGLang's FlashInfer CUTLASS, taken for the 512-expert top-22 shapes; vLLM's and SGLang's
# Marlin w4a16 MXFP4 rows, one Kimi-K3 shape (3584/3072/896/16) with an approximated
# activation ("situ_as_silu"): the catalog's MXFP4 experts are gpt-oss's, which both run
# on their Triton MXFP4 kernels, the rest of those tables' w4a16_mxfp4 rows)
NOT_FITTED_KERNELS = (
    "sglang_flashinfer_cutlass_moe",
    "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu",
    "sglang_marlin_moe_situ_as_silu",
)
GG_KEYS = (
    "launch_s",
    "max_eff",
    "half_sat",
    "mem_eff",
    "width_half_sat",
    "token_eff",
    "expert_s",
    "tile_m_tokens",
    "tile_n",
    "tile_overhead_k",
)


def _aic(data: Path) -> Path:
    return Path(data) / "kernels" / "aiconfigurator" / "h100_sxm"


def _read(path: Path) -> pd.DataFrame:
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path}: public table not found (needs ../shared/data)")
    return pd.read_parquet(regular_file(path, UserError, "public table"))


@cache
def _imbalance(tokens: int, experts: int, topk: int, ep: int, alpha: float) -> float:
    return power_law_imbalance(tokens, experts, topk, ep, alpha)


def _alpha(dist: str) -> float | None:
    if dist in ("balanced", "uniform"):
        return None
    return float(dist.removeprefix("power_law_"))


# --- rows ------------------------------------------------------------------------------


MOE_PERF_VERSIONS = (("vllm", "0.24.0"), ("sglang", "0.5.14"), ("trtllm", "1.3.0rc20"))


def _moe_tables(data: Path, frameworks: tuple[str, ...]) -> list[tuple[Path, str, str]]:
    """(file, framework, source) of each table :func:`moe_rows` reads for ``frameworks``:
    the moe_perf tables, and with sglang SGLang's WideEP tables."""
    base = _aic(data) / "moe"
    tables = [(base / fw / ver / "moe_perf.parquet", fw, f"{fw} {ver} moe_perf")
              for fw, ver in MOE_PERF_VERSIONS if fw in frameworks]  # fmt: skip
    if "sglang" in frameworks:
        tables += [(base / "sglang" / "0.5.10" / f"wideep_{phase}_moe_perf.parquet",
                    "sglang-wideep", f"sglang 0.5.10 wideep_{phase}")
                   for phase in ("context", "generation")]  # fmt: skip
    return tables


# moe_rows's tables by what they were read from: the files (path, size, modification time)
# and the tuned-config list. Reading and marking TensorRT-LLM's untuned cells takes 7-11 s
# (2026-12-05, 2-core box), and a process asks for them again (the tests, the validation
# doc's checks).
_MOE_ROWS = KeptResults(limit=3)


def moe_rows(
    data: Path, frameworks: tuple[str, ...] = ("vllm", "sglang", "trtllm")
) -> pd.DataFrame:
    """Every moe_perf row of ``frameworks`` (vllm, sglang, trtllm) and, with sglang,
    SGLang's WideEP rows, with the inputs of ``grouped_gemm_time_s`` for the timed (most
    loaded) GPU. Read once per process for the same files: a copy of the kept table after."""
    try:
        stats = [(str(p.resolve()), p.stat()) for p, _, _ in _moe_tables(data, frameworks)]
        key: tuple | None = (
            tuple(sorted(set(frameworks))),
            tuple((p, st.st_size, st.st_mtime_ns, st.st_ino) for p, st in stats),
            sglang_tuned_configs(),
        )
    except OSError:  # a table missing or unreadable: read as ever, for its one-line error
        key = None
    return _MOE_ROWS.get(key, lambda: _read_moe_rows(data, frameworks))


def _read_moe_rows(data: Path, frameworks: tuple[str, ...]) -> pd.DataFrame:
    frames = []
    for path, fw, source in _moe_tables(data, frameworks):
        d = _read(path)
        gated: bool | pd.Series
        if fw == "sglang-wideep":  # every WideEP row: one dtype, gated experts
            d = d.copy()
            gated = True
        else:
            d = d[d.moe_dtype.isin(DTYPES)].copy()
            gated = ~d.kernel_source.astype(str).str.contains("nongated")
        d["source"] = source
        d["fw"] = fw
        d["gated"] = gated
        frames.append(d)
    d = pd.concat(frames, ignore_index=True)
    d["dtype"] = d.moe_dtype.map(DTYPES)
    d["distribution"] = d.distribution.astype(str).replace({"uniform": "balanced"})
    key = ["num_tokens", "num_experts", "topk", "moe_ep_size", "distribution"]
    uniq = d[key].drop_duplicates()
    uniq["imbalance"] = [
        1.0
        if _alpha(dist) is None
        else _imbalance(int(t), int(e), int(k), int(ep), float(_alpha(dist) or 0))
        for t, e, k, ep, dist in uniq.itertuples(index=False)
    ]
    d = d.merge(uniq, on=key, how="left")
    f = d.imbalance.to_numpy()
    d["tokens_gpu"] = d.num_tokens * d.topk / d.moe_ep_size * f
    d["touched"] = np.minimum(d.num_experts / d.moe_ep_size, d.tokens_gpu)
    d["width"] = d.inter_size / d.moe_tp_size
    # tokens the GPU permutes in and reduces out: moe_perf gives every GPU the layer's
    # tokens; WideEP dispatches to a rank only the tokens routed to it (DeepEP)
    wide = (d.fw == "sglang-wideep").to_numpy()
    d["layer_tokens"] = np.where(
        wide, np.minimum(d.num_tokens, d.tokens_gpu), d.num_tokens.astype(float)
    )
    d["peak"] = d.dtype.map(PEAK)
    d["elem"] = d.dtype.map(ELEM)
    d["meas_s"] = d.latency * 1e-3
    d["family"] = shape_family(d.hidden_size, d.inter_size, d.num_experts, d.topk)
    d = d.reset_index(drop=True)
    d["tuned_tiles"] = tuned_tile_rows(d)
    d["untuned"] = False
    ref = (d.fw == REF_MOE).to_numpy()
    if ref.any():
        d.loc[ref, "untuned"] = untuned_cells(d[ref])
    return d


# --- SGLang's Triton fused_moe: shipped tuned tile configs or default tiles ---------------
#
# SGLang's fused_moe_triton takes its tiles from a config file named by the rank's local
# experts E, the expert shard width N, the GPU and the dtype where one ships (searching every
# configs/triton_* folder, newest first), else its default tiles (get_default_config; bf16
# 64 x 64 x 32). AIConfigurator's SGLang collector looks the file up the same way, so its
# table holds both; hardware/moe/sglang_triton_configs.csv lists the files (with provenance)
# and the two are fitted as separate parameter sets (grouped_gemm_frameworks.sglang: default
# tiles; grouped_gemm_tuned.sglang: tuned).

TRITON_KERNEL = "sglang_fused_moe_triton"


def tuned_tile_rows(d: pd.DataFrame) -> np.ndarray:
    """Per moe_perf row: whether SGLang's Triton kernel ran a shipped tuned tile config
    (``moe_params.has_tuned_config`` keys on the timed H100)."""
    listed = sglang_tuned_configs()
    dev = SGLANG_DEVICE_NAMES[GPU]
    triton = d.fw.isin(TUNED_TILE_FRAMEWORKS) & (d.kernel_source.astype(str) == TRITON_KERNEL)
    keys = zip(d.num_experts // d.moe_ep_size, d.inter_size // d.moe_tp_size, d.dtype,
               strict=True)  # fmt: skip
    return triton.to_numpy() & np.array([(int(e), int(n), dev, dt) in listed for e, n, dt in keys])


# --- TensorRT-LLM cells the collector ran untuned ----------------------------------------
#
# AIConfigurator's TensorRT-LLM collector (collector/trtllm/collect_moe.py, run_moe_torch;
# ai-dynamo/aiconfigurator 006afd78) autotunes a cell's MoE kernels only when no tuning
# cache file exists whose name starts with f"{moe_dtype}_{hidden}_{inter // moe_tp}_"
# f"{experts // moe_ep}" (a glob with a trailing *): if one exists it loads it and skips
# tuning (w4a16_mxfp4 takes neither: its Triton kernel is not tuned through that cache).
# The name leaves out top-k and the model's expert count, so a cell whose key another
# model's cell wrote first (Llama-4 Scout's 16 experts at EP 1 and Maverick's 128 at EP 8
# both write "bfloat16_5120_8192_16") or whose key is a proper prefix of another cell's
# ("..._1" matches "..._16", "..._128") can run on tactics tuned for other shapes.
# Where that bit, the whole cell measures 2-5x slower than a cell of the same shape with
# more work per GPU (wider experts or more of them) at every token count; no cell with a
# key of its own does (python -m calibration.fit_moe --untuned).

TUNING_CACHE_EXEMPT = ("w4a16_mxfp4",)
# a cell this much slower than one of the same shape with at least its work per GPU (the
# median over their common token counts) ran slower than its own work allows
SLOWER_THAN_MORE_WORK = 1.25
CELL = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size",
        "moe_ep_size"]  # fmt: skip


def tuning_cache_shared(d: pd.DataFrame) -> np.ndarray:
    """Per row of a TensorRT-LLM moe_perf table: whether the collector's tuning-cache key
    of its cell (see above) is another cell's too, or a proper prefix of another cell's."""
    cells = d[CELL].drop_duplicates()
    key = (
        cells.moe_dtype.astype(str) + "_" + cells.hidden_size.astype(int).astype(str) + "_"
        + (cells.inter_size // cells.moe_tp_size).astype(int).astype(str) + "_"
        + (cells.num_experts // cells.moe_ep_size).astype(int).astype(str)
    )  # fmt: skip
    keys = key.to_numpy()
    shared = np.zeros(len(cells), bool)
    for i, k in enumerate(keys):
        if str(cells.moe_dtype.iloc[i]) not in TUNING_CACHE_EXEMPT:
            # another cell with this key (another model's: one model's cells have keys
            # of their own) or with a longer key that starts with it
            shared[i] = sum(o.startswith(k) for o in keys) > 1
    cells = cells.assign(shared=shared)
    return d[CELL].merge(cells, on=CELL, how="left").shared.to_numpy(bool)


def slower_than_more_work(d: pd.DataFrame) -> np.ndarray:
    """Per row of a TensorRT-LLM moe_perf table: whether its cell (shape, dtype, TP, EP;
    per routing distribution) measured more than :data:`SLOWER_THAN_MORE_WORK` times as
    long as a cell of the same shape, dtype and distribution with ``moe_tp' <= moe_tp``
    and ``moe_ep' <= moe_ep`` (experts as wide or wider, as many or more of them, as many
    or more tokens routed to it): the median over their common token counts."""
    out = np.zeros(len(d), bool)
    shape = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "distribution"]
    for _, s in d.groupby(shape, sort=False):
        piv = s.pivot_table(
            index=["moe_tp_size", "moe_ep_size"], columns="num_tokens", values="meas_s"
        )
        tp = piv.index.get_level_values(0).to_numpy()
        ep = piv.index.get_level_values(1).to_numpy()
        vals = piv.to_numpy()
        slow = set()
        for i in range(len(piv)):
            more = (tp <= tp[i]) & (ep <= ep[i])
            more[i] = False
            if more.any():
                ratio = np.nanmedian(vals[i] / vals[more], axis=1)
                if np.nanmax(ratio) > SLOWER_THAN_MORE_WORK:
                    slow.add((tp[i], ep[i]))
        if slow:
            cell = zip(s.moe_tp_size, s.moe_ep_size, strict=True)
            out[d.index.get_indexer(s.index[[c in slow for c in cell]])] = True
    return out


def untuned_summary(data: Path) -> pd.DataFrame:
    """Per weight dtype and routing distribution of TensorRT-LLM's moe_perf table: its
    cells (shape, TP, EP), those whose tuning-cache key the collector shares
    (:func:`tuning_cache_shared`), those slower than a cell with more work
    (:func:`slower_than_more_work`), both (:func:`untuned_cells`: not fitted), and the rows
    left out. Printed by ``python -m calibration.fit_moe --untuned``."""
    d = moe_rows(data, (REF_MOE,))
    d["shared"] = tuning_cache_shared(d)
    d["slower"] = slower_than_more_work(d)
    rows = []
    for (dt, dist), s in d.groupby(["dtype", "distribution"], sort=True):
        c = s.groupby(CELL)[["shared", "slower"]].first()
        rows.append({"dtype": dt, "distribution": dist, "cells": len(c),
                     "key_shared": int(c.shared.sum()), "slower_than_more_work":
                     int(c.slower.sum()), "own_key_and_slower": int((c.slower & ~c.shared).sum()),
                     "untuned_cells": int((c.slower & c.shared).sum()),
                     "untuned_rows": int(s.untuned.sum()), "rows": len(s)})  # fmt: skip
    return pd.DataFrame(rows)


def untuned_cells(d: pd.DataFrame) -> np.ndarray:
    """Rows of a TensorRT-LLM moe_perf table whose cell the collector may have run on
    another shape's tuning (:func:`tuning_cache_shared`) and which measured slower than a
    cell with more work (:func:`slower_than_more_work`): not fitted, reported apart."""
    return tuning_cache_shared(d) & slower_than_more_work(d)


# the float columns of moe_rows that grouped_gemm_time_s reads, in its order
GG_INPUTS = ("peak", "tokens_gpu", "touched", "hidden_size", "width", "elem", "layer_tokens")


# rows as _gg_of reads them: their number and, per kind present (gated or not), the rows'
# positions, the kind and the GG_INPUTS columns
GgRows = tuple[int, tuple[tuple[np.ndarray, bool, tuple[np.ndarray, ...]], ...]]


def _gg_inputs(d: pd.DataFrame) -> GgRows:
    """The rows of ``d`` as :func:`_gg_of` reads them: their number and, per kind (gated
    or not) present, the rows' positions and :data:`GG_INPUTS` columns as float arrays. A
    fit reads them once, not at every parameter vector it tries (pandas column access
    took twice the model's own time in the MoE refit)."""
    # column by column: selecting rows of the frame (its text columns too) took ~20x the
    # model's own time in a fit
    gated_rows = d.gated.to_numpy(bool)
    cols = [d[k].to_numpy(float) for k in GG_INPUTS]
    parts = []
    for gated in (True, False):
        sel = gated_rows == gated
        if sel.any():
            parts.append((sel, gated, tuple(c[sel] for c in cols)))
    return len(d), tuple(parts)


def _gg_of(p: GroupedGemmParams, inputs: GgRows) -> np.ndarray:
    """:func:`_gg` of rows read by :func:`_gg_inputs`."""
    n, parts = inputs
    out = np.empty(n)
    for sel, gated, (peak, tokens_gpu, touched, hidden, width, elem, layer_tokens) in parts:
        out[sel] = grouped_gemm_time_s(
            p, peak, HBM, tokens_gpu, touched, hidden, width, elem, gated, layer_tokens
        )
    return out


def _gg(p: GroupedGemmParams, d: pd.DataFrame) -> np.ndarray:
    """Grouped-GEMM seconds of the rows ``d`` with parameters ``p``."""
    return _gg_of(p, _gg_inputs(d))


def mla_rows(data: Path, phase: str) -> pd.DataFrame:
    frames = []
    for fw, ver in (("trtllm", "1.3.0rc20"), ("sglang", "0.5.14"), ("vllm", "0.14.0")):
        d = _read(_aic(data) / "mla" / fw / ver / f"{phase}_mla_perf.parquet").copy()
        d["fw"] = fw
        d["source"] = f"{fw} {ver} {phase}_mla"
        frames.append(d)
    d = pd.concat(frames, ignore_index=True)
    d["kv"] = np.where(d.kv_cache_dtype.astype(str) == "fp8", "fp8", "bf16")
    d["kv_elem"] = np.where(d.kv == "fp8", 1.0, 2.0)
    d["meas_s"] = d.latency * 1e-3
    d["family"] = d.num_heads.astype(int).astype(str)
    if phase == "generation":
        d["ctx"] = d.batch_size * (d.step + 1)
    else:
        d["tokens"] = d.batch_size * d.isl
        d["pairs"] = d.batch_size * d.isl * (d.isl + 1) / 2.0
    return d.reset_index(drop=True)


def _mla_dec(p: MlaDecodeParams, d: pd.DataFrame) -> np.ndarray:
    h = d.num_heads.to_numpy(float)
    return np.asarray(
        mla_decode_attention_s(
            p,
            BF16_PEAK,
            HBM,
            d.batch_size.to_numpy(float),
            d.ctx.to_numpy(float),
            h,
            576.0 * d.kv_elem.to_numpy(float),
            2.0 * h * 1088.0,
        )
    )


def _mla_pre(p: MlaPrefillParams, d: pd.DataFrame, form: str) -> np.ndarray:
    h = d.num_heads.to_numpy(float)
    flop_pair = 2.0 * h * (1088.0 if form == "absorbed" else 320.0)
    return np.asarray(
        mla_prefill_attention_s(
            p,
            BF16_PEAK,
            d.batch_size.to_numpy(float),
            d.tokens.to_numpy(float),
            d.pairs.to_numpy(float),
            flop_pair,
        )
    )


def deepep_rows(data: Path) -> pd.DataFrame:
    """DeepEP dispatch and combine (seconds) per mode and phase; normal mode at its best
    SM setting per point."""
    base = _aic(data) / "comm" / "sglang"
    out = []
    for ver in ("0.5.12", "0.5.6.post2"):
        d = _read(base / ver / "wideep_deepep_normal_perf.parquet")
        keys = ["node_num", "hidden_size", "num_token", "num_topk", "num_experts"]
        for phase in ("dispatch", "combine"):
            g = pd.DataFrame(d.groupby(keys, as_index=False)[f"{phase}_transmit_us"].min())
            g = g.rename(columns={f"{phase}_transmit_us": "us"})
            g["mode"], g["phase"], g["source"] = "normal", phase, f"sglang {ver} deepep normal"
            out.append(g)
        d = _read(base / ver / "wideep_deepep_ll_perf.parquet")
        for phase in ("dispatch", "combine"):
            g = pd.DataFrame(d[keys + [f"{phase}_avg_t_us"]])
            g = g.rename(columns={f"{phase}_avg_t_us": "us"}).assign(
                mode="low_latency", phase=phase, source=f"sglang {ver} deepep ll"
            )
            out.append(g)
    d = pd.concat(out, ignore_index=True)
    d["meas_s"] = d.us * 1e-6
    d["ep"] = d.node_num * GPUS_PER_NODE
    d["payload"] = np.where(
        d.phase == "dispatch", d.hidden_size * (1.0 + 4.0 / 128.0), 2.0 * d.hidden_size
    )
    nv, rd = [], []
    for t, pl, k, ep, mode in zip(d.num_token, d.payload, d.num_topk, d.ep, d["mode"], strict=True):
        a, b = all_to_all_volume_bytes(float(t), float(pl), int(k), int(ep), GPUS_PER_NODE, mode)
        nv.append(float(a))
        rd.append(float(b))
    d["nv_bytes"] = np.array(nv)
    d["rdma_bytes"] = np.array(rd)
    d["family"] = shape_family(d.node_num, d.hidden_size)
    return d.reset_index(drop=True)


def _a2a(p: AllToAllParams, d: pd.DataFrame) -> np.ndarray:
    return np.asarray(
        all_to_all_time_s(
            p,
            d.nv_bytes.to_numpy(float),
            d.rdma_bytes.to_numpy(float),
            d.node_num.to_numpy(float),
            NVLINK,
            NIC,
        )
    )


# --- fits ------------------------------------------------------------------------------


def fitted_rows(moe: pd.DataFrame, fw: str, dt: str, tuned: bool = False) -> pd.DataFrame:
    """The rows of :func:`moe_rows` that ``fw``'s ``dt`` grouped-GEMM set is fitted to: its
    balanced rows, less the kernels of :data:`NOT_FITTED_KERNELS` and the TensorRT-LLM
    cells its collector ran untuned (:func:`untuned_cells`); of SGLang's Triton kernel the
    rows that ran a shipped tuned tile config (``tuned``) or its default tiles
    (:func:`tuned_tile_rows`)."""
    d = moe[(moe.fw == fw) & (moe.distribution == "balanced") & (moe.dtype == dt)]
    d = d[~d.kernel_source.astype(str).isin(NOT_FITTED_KERNELS) & ~d.untuned]
    return d[d.tuned_tiles == tuned].reset_index(drop=True)


# a tuned-tile set is fitted where its rows hold at least this many (shape, TP, EP) cells
MIN_TUNED_CELLS = 2


# --- the grouped-GEMM fit, determined -----------------------------------------------------
#
# A parameter the fitted rows cannot determine lands wherever the solver stops, which
# follows its starting point and the CPU's rounding (TensorRT-LLM's mxfp4 expert_s 4.8e-7
# on one CPU, 4.0e-8 on another; SGLang's bf16 mem_eff 1.0 or 0.81 from two starts). Each
# such direction is held at a stated value, the rest refitted and then solved to tight
# tolerances, so a refit from another start or on another CPU gives the same parameters:
#
# - mem_eff (the weight stream's share of the HBM peak): held at 1.0 where the weight
#   stream is the longer term of no fitted row at the fit (the rows bound it from below
#   only: any value above where it would bind fits them alike);
# - width_half_sat and expert_s (the narrow-shard and per-expert terms): left out (0) where
#   the fit without the term is as good, its in-sample median and 90th-percentile APE
#   within TERM_EARNS of the fit with every term (the rows do not tell the term's size).
# The rules are applied until none holds another parameter (leaving a term out can leave
# the weight stream binding no row).

# The saturation is the smaller of a token and a width term, so the objective has kinks
# where rows change which binds, and a solver can stop at one: the fit starts from a grid
# of (half_sat, width_half_sat) pairs (and, for the tile form, of tile_overhead_k) and
# solves the best on to tight tolerances. A start's value of a parameter its form holds
# (TILE_FORM, SATURATION_FORM) is not used.
GG_STARTS = (
    (3e-5, 0.9, 64.0, 0.8, 500.0, 0.5, 2e-7, 64.0, 128.0, 300.0),
    (1e-5, 0.5, 128.0, 0.6, 2000.0, 0.2, 1e-6, 64.0, 128.0, 30.0),
    *(
        (2e-5, 0.7, hs, 0.9, whs, 0.3, 1e-7, 64.0, 128.0, whs / 3.0)
        for hs in (16.0, 128.0)
        for whs in (30.0, 3000.0)
    ),  # fmt: skip
)
GG_LOWER = (1e-6, 0.05, 0.5, 0.05, 1.0, 0.01, 1e-10, 1.0, 1.0, 1.0)
GG_UPPER = (5e-4, 1.0, 4096.0, 1.0, 1e5, 1.0, 1e-4, 4096.0, 4096.0, 1e5)
# an optional term stays where it lowers the in-sample median or p90 APE by more than this
TERM_EARNS = 0.001
# what a held parameter is held at (the term left out, or the weight stream at the peak)
HELD_VALUE = {"mem_eff": 1.0, "width_half_sat": 0.0, "expert_s": 0.0, "tile_overhead_k": 0.0}

# The compute term's form, by the rows' kernel (moe.grouped_gemm_time_s). Rows that ran
# SGLang's shipped tuned Triton configs are timed by their tiles
# (moe.grouped_gemm_tile_compute_s): the configs give the tile, 64 x 128 (BLOCK_SIZE_M x
# BLOCK_SIZE_N) at 32-1,024 tokens per expert in both the E=8,N=7168 and E=128,N=768 H100
# files (triton_3_3_1 / triton_3_2_0), 128 x 256 above; the smaller is taken, as
# tokens per expert sit below 1,024 in all but Mixtral's largest rows. Every other set
# keeps the saturation form (its tiles are not known: CUTLASS's are chosen at run time,
# SGLang's default and vLLM's mixed). Measured on the tuned bf16 rows (fit_error, held
# out by shape family, median): tile form 3.2 %, saturation form 3.3 %; Mixtral-8x7B TP2
# at 16,384 tokens measured over predicted 1.13 against 1.29; held out by shard width,
# width_split_check.
TILE_M_TOKENS, TILE_N = 64.0, 128.0
TILE_FORM = {"half_sat": 0.0, "width_half_sat": 0.0, "tile_m_tokens": TILE_M_TOKENS,
             "tile_n": TILE_N}  # fmt: skip
SATURATION_FORM = {"tile_m_tokens": 0.0, "tile_n": 0.0, "tile_overhead_k": 0.0}


def gemm_form(d: pd.DataFrame) -> dict[str, float]:
    """The parameters the compute form of rows ``d`` fixes: :data:`TILE_FORM` where every
    row ran a shipped tuned tile config, else :data:`SATURATION_FORM`."""
    tuned = d.tuned_tiles.to_numpy(bool)
    return TILE_FORM if len(tuned) and tuned.all() else SATURATION_FORM


def gemm_keys(form: dict[str, float]) -> tuple[str, ...]:
    """The keys a set of ``form`` writes: every key but the ones its form leaves out
    (``half_sat`` stays: the file requires it)."""
    absent = {k for k, v in form.items() if v == 0.0 and k != "half_sat"}
    return tuple(k for k in GG_KEYS if k not in absent)


F_SCALE = 0.05  # the soft-L1 loss's scale in log time (about 5 %)


def _solve(d: pd.DataFrame, held: dict[str, float], starts) -> np.ndarray:
    """Least squares over log-parameters (soft L1, as ``calibration.fit``) of the free
    grouped-GEMM parameters, ``held`` fixed: best of ``starts``, then solved again from
    the best to tight tolerances so the stopping point does not depend on the start."""
    from scipy.optimize import least_squares

    free = [i for i, k in enumerate(GG_KEYS) if k not in held]
    lo, hi = np.log(np.array(GG_LOWER)[free]), np.log(np.array(GG_UPPER)[free])
    logm = np.log(d.meas_s.to_numpy(float))
    base = np.array([held.get(k, 0.0) for k in GG_KEYS])
    rows = _gg_inputs(d)

    def full(theta: np.ndarray) -> np.ndarray:
        x = base.copy()
        x[free] = np.exp(theta)
        return x

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(_gg_of(GroupedGemmParams(*full(theta)), rows), 1e-15)) - logm

    kw = {"loss": "soft_l1", "f_scale": F_SCALE, "x_scale": 1.0}
    best = None
    for x0 in starts:
        t0 = np.clip(np.log(np.asarray(x0, float)[free]), lo + 1e-9, hi - 1e-9)
        r = least_squares(resid, t0, bounds=(lo, hi), max_nfev=400, **kw)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    r = least_squares(
        resid, best.x, bounds=(lo, hi), ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=1000, **kw
    )
    return full(_polish(resid, r.x, lo, hi, F_SCALE))


def _polish(resid, theta: np.ndarray, lo: np.ndarray, hi: np.ndarray, f_scale: float):
    """``theta`` moved downhill on the same soft-L1 cost by a derivative-free search.

    The model's kinks (the saturation's min of a token and a width term, the max of the
    compute and weight-stream terms) can stop the trust-region solver where its local
    model sees no descent, at a point that follows its start: SGLang's tuned bf16 rows
    (513 rows, 19 cells) stopped at half_sat 138.0 from the grid and 134.6 from moved
    starts, costs 0.60512 and 0.60509. A Nelder-Mead search from either stop reaches the
    same parameters (to the file's 5 significant digits; tests/test_moe_fit_determined.py);
    where the solver stopped at a smooth minimum it stays there."""
    from scipy.optimize import minimize

    def cost(t: np.ndarray) -> float:
        z = (resid(t) / f_scale) ** 2
        return float(np.sum(np.sqrt(1.0 + z) - 1.0))

    # log-parameters to 1e-7 (the file keeps 5 significant digits); at most 3,000 costs
    opts = {"xatol": 1e-7, "fatol": 1e-12, "maxiter": 3000, "maxfev": 3000}
    res = minimize(cost, theta, method="Nelder-Mead", bounds=list(zip(lo, hi, strict=True)),
                   options={**opts, "adaptive": True})  # fmt: skip
    return res.x if res.fun <= cost(theta) else theta


def _apes(d: pd.DataFrame, x: np.ndarray) -> tuple[float, float]:
    a = np.abs(_gg(GroupedGemmParams(*x), d) / d.meas_s.to_numpy(float) - 1.0)
    return float(np.median(a)), float(np.percentile(a, 90))


def _weight_stream_binds(d: pd.DataFrame, x: np.ndarray) -> bool:
    """Whether the weight stream (the ``mem_eff`` term) is the longer term of any row."""
    p = GroupedGemmParams(*x)
    as_peak = _gg(replace(p, mem_eff=1.0), d)
    return bool(
        np.any(_gg(replace(p, mem_eff=p.mem_eff * (1.0 - 1e-6)), d) > as_peak * (1.0 + 1e-12))
    )


def fit_grouped_gemm(
    d: pd.DataFrame,
    starts=GG_STARTS,
    held_out: bool = True,
    form: dict[str, float] | None = None,
) -> tuple[np.ndarray, FitError, dict[str, float]]:
    """The grouped-GEMM parameters of rows ``d`` (``GG_KEYS`` order), their errors (held
    out by shape family) and the parameters held by the rules above (name -> value); the
    compute form the rows' kernel takes (:func:`gemm_form`) unless ``form`` is given."""
    form = gemm_form(d) if form is None else form
    held: dict[str, float] = {}  # held by the rules (the form's parameters apart)
    x = _solve(d, form, starts)
    med, p90 = _apes(d, x)  # the fit with every term: what a left-out term may not worsen
    changed = True
    while changed:  # until no rule holds another parameter (a refit can unbind one)
        changed = False
        if "mem_eff" not in held and not _weight_stream_binds(d, x):
            held["mem_eff"] = HELD_VALUE["mem_eff"]
            x, changed = _solve(d, {**form, **held}, [x]), True
        for k in ("width_half_sat", "expert_s", "tile_overhead_k"):
            if k in held or k in form:
                continue
            trial = {**held, k: HELD_VALUE[k]}
            y = _solve(d, {**form, **trial}, [x])
            m2, p2 = _apes(d, y)
            if m2 <= med + TERM_EARNS and p2 <= p90 + TERM_EARNS:
                held, x, changed = trial, y, True
    free = [i for i, k in enumerate(GG_KEYS) if k not in held and k not in form]

    inputs = d[["gated", *GG_INPUTS]]  # the rows the held-out refits select: inputs only
    rows = by_rows(lambda idx: _gg_inputs(inputs.iloc[idx]))  # each fold's, read once

    def model(theta, idx):
        y = x.copy()
        y[free] = theta
        return _gg_of(GroupedGemmParams(*y), rows(idx))

    # the errors (and the held-out refits, each from the determined parameters)
    _, err = fit_generic(
        model,
        d.meas_s.to_numpy(),
        starts=[[float(x[i]) for i in free]],
        lower=[GG_LOWER[i] for i in free],
        upper=[GG_UPPER[i] for i in free],
        groups=d.family.to_numpy(),
        held_out=held_out,
    )
    return x, _with_in_sample(err, d, x), held


def _with_in_sample(err: FitError, d: pd.DataFrame, x: np.ndarray) -> FitError:
    """``err`` with its in-sample figures those of the determined parameters ``x``."""
    a = np.abs(_gg(GroupedGemmParams(*x), d) / d.meas_s.to_numpy(float) - 1.0)
    return replace(
        err,
        median_ape=float(np.median(a)),
        mean_ape=float(np.mean(a)),
        p90_ape=float(np.percentile(a, 90)),
    )


def fit_all(data: Path) -> tuple[dict, dict]:
    """Fitted parameters (the JSON sections) and their errors."""
    params: dict = {
        "grouped_gemm": {},
        "grouped_gemm_frameworks": {},
        "grouped_gemm_tuned": {},
        "mla_decode": {},
        "mla_prefill": {},
        "all_to_all": {},
    }
    errors: dict[str, dict] = {}
    moe = moe_rows(data, (REF_MOE, *GEMM_FRAMEWORKS))
    gemm_sets = [(fw, dt, False) for fw in (REF_MOE, *GEMM_FRAMEWORKS)
                 for dt in ("bf16", "fp8", "fp8-block", "mxfp4")]  # fmt: skip
    gemm_sets += [(fw, dt, True) for fw in TUNED_TILE_FRAMEWORKS
                  for dt in ("bf16", "fp8", "fp8-block")]  # fmt: skip
    for fw, dt, tuned in gemm_sets:
        sets = params["grouped_gemm"]
        if tuned:
            sets = params["grouped_gemm_tuned"].setdefault(fw, {})
        elif fw != REF_MOE:
            sets = params["grouped_gemm_frameworks"].setdefault(fw, {})
        d = fitted_rows(moe, fw, dt, tuned)
        if d.empty or (tuned and len(d[CELL].drop_duplicates()) < MIN_TUNED_CELLS):
            continue

        x, err, held = fit_grouped_gemm(d)
        keys = gemm_keys(gemm_form(d))
        sets[dt] = _pdict(keys, [x[GG_KEYS.index(k)] for k in keys])
        key = f"grouped_gemm.{dt}" if fw == REF_MOE else f"grouped_gemm.{fw}.{dt}"
        kernels = ", ".join(sorted(set(d.kernel_source.astype(str))))
        tiles = ""
        if fw in TUNED_TILE_FRAMEWORKS and dt != "mxfp4":
            key += ".tuned" if tuned else ""
            tiles = ", shipped tuned tile configs" if tuned else ", default tiles"
        errors[key] = _err(err, f"{fw} moe_perf balanced ({kernels}{tiles})")
        if held:
            errors[key]["held"] = held
    params["grouped_gemm_tuned"] = {k: v for k, v in params["grouped_gemm_tuned"].items() if v}
    if not params["grouped_gemm_tuned"]:
        del params["grouped_gemm_tuned"]
    gen = mla_rows(data, "generation")
    for kv in ("bf16", "fp8"):
        d = gen[(gen.fw == "trtllm") & (gen.kv == kv)].reset_index(drop=True)

        def model(x, idx, d=d):
            return _mla_dec(MlaDecodeParams(*x), d.iloc[idx])

        x, err = fit_generic(
            model,
            d.meas_s.to_numpy(),
            starts=[[1.5e-5, 1e-7, 0.85, 0.6], [3e-5, 1e-6, 0.7, 0.4]],
            lower=[1e-7, 1e-10, 0.05, 0.05],
            upper=[5e-4, 1e-4, 1.0, 1.0],
            groups=d.family.to_numpy(),
        )
        params["mla_decode"][kv] = _pdict(("floor_s", "per_seq_s", "bw_eff", "compute_eff"), x)
        errors[f"mla_decode.{kv}"] = _err(err, "trtllm generation_mla")
    ctx = mla_rows(data, "context")
    for form, fw in (("absorbed", "sglang"), ("naive", "trtllm")):
        d = ctx[(ctx.fw == fw) & (ctx.kv == "bf16")].reset_index(drop=True)

        def pre_model(x, idx, d=d, form=form):
            return _mla_pre(MlaPrefillParams(*x), d.iloc[idx], form)

        x, err = fit_generic(
            pre_model,
            d.meas_s.to_numpy(),
            starts=[[1.5e-5, 0.6, 1000.0], [5e-5, 0.4, 300.0]],
            lower=[1e-7, 0.05, 1.0],
            upper=[5e-3, 1.0, 1e5],
            groups=d.family.to_numpy(),
        )
        params["mla_prefill"][form] = _pdict(("floor_s", "max_eff", "half_sat"), x)
        errors[f"mla_prefill.{form}"] = _err(err, f"{fw} context_mla bf16 KV")
    a2a = deepep_rows(data)
    for mode in ("normal", "low_latency"):
        params["all_to_all"][mode] = {}
        for phase in ("dispatch", "combine"):
            d = a2a[(a2a["mode"] == mode) & (a2a.phase == phase)].reset_index(drop=True)

            def model(x, idx, d=d):
                return _a2a(AllToAllParams(*x), d.iloc[idx])

            x, err = fit_generic(
                model,
                d.meas_s.to_numpy(),
                starts=[[2e-5, 2e-5, 0.6, 0.7], [1e-5, 1e-4, 0.3, 0.4]],
                lower=[1e-7, 1e-8, 0.01, 0.01],
                upper=[1e-3, 1e-3, 1.0, 1.0],
                groups=d.family.to_numpy(),
            )
            params["all_to_all"][mode][phase] = _pdict(
                ("latency_s", "rdma_latency_s", "nvlink_eff", "rdma_eff"), x
            )
            errors[f"all_to_all.{mode}.{phase}"] = _err(err, f"sglang deepep {mode}")
    return params, errors


def _pdict(keys: tuple[str, ...], x) -> dict[str, float]:
    return {k: float(f"{float(v):.5g}") for k, v in zip(keys, x, strict=True)}


def _err(err: FitError, rows: str) -> dict:
    out = err.as_dict()
    out["rows"] = rows
    return out


# A MoE parameter file this module wrote (the only kind it replaces).
MOE_OWNED = json_owned("schema_version", "gpu", "fit_error", "provenance")


def profile_dict(params: dict, errors: dict, data: Path) -> dict:
    path = Path(data) / "kernels" / "aiconfigurator" / "SOURCE_COMMIT"
    commit = read_regular(path, UserError, 4096, "source commit file").decode().strip()
    return {
        "schema_version": 1,
        "gpu": GPU,
        **params,
        "fit_error": errors,
        "provenance": {
            "kind": "fitted-public",
            "source": "NVIDIA AIConfigurator H100 tables (ai-dynamo/aiconfigurator "
            f"{commit[:12]}): TensorRT-LLM moe_perf (balanced), TensorRT-LLM/SGLang MLA "
            "context and generation, SGLang DeepEP normal and low-latency (1-8 nodes); "
            "vLLM and SGLang moe_perf (balanced) for their own grouped-GEMM kernels",
            "command": COMMAND,
        },
    }


# --- validation ------------------------------------------------------------------------


def _stats(pred: np.ndarray, meas: np.ndarray) -> tuple[int, float, float, float]:
    a = np.abs(pred - meas) / meas
    return len(a), float(np.median(a)), float(np.mean(a)), float(np.percentile(a, 90))


def validation_rows(data: Path, params: MoeParams) -> list[tuple]:
    """(op, rows, bucket, n, median, mean, p90) of the parameters against every row."""
    out: list[tuple] = []
    moe = moe_rows(data)
    moe["kernel_source"] = moe.kernel_source.astype(str)
    kernels: dict[tuple[str, str], int] = {}
    for (src, dt), d in moe.groupby(["source", "dtype"]):
        kernels[(str(src), str(dt))] = d.kernel_source.nunique()
    for (src, dt, kern, dist, untuned, tuned), d in moe.groupby(
        ["source", "dtype", "kernel_source", "distribution", "untuned", "tuned_tiles"], sort=True
    ):
        fw = str(d.fw.iloc[0]).removesuffix("-wideep")
        pred = _gg(params.gemm(str(dt), fw, bool(tuned)), d)
        label = f"{src} {dt}"
        if kernels[(str(src), str(dt))] > 1:  # name the kernel where the table mixes several
            label += f" {kern}" + (" (not fitted)" if kern in NOT_FITTED_KERNELS else "")
        if tuned:
            label += " shipped tuned tiles"
        if untuned:
            label += " cells run untuned (not fitted)"
        for bucket, sel in _token_buckets(d.num_tokens.to_numpy()):
            if sel.any():
                out.append(
                    ("grouped GEMM", label, f"{dist}, {bucket}")
                    + _stats(pred[sel], d.meas_s.to_numpy()[sel])
                )
    for phase in ("generation", "context"):
        rows = mla_rows(data, phase)
        for (src, kv), d in rows.groupby(["source", "kv"], sort=True):
            if phase == "generation":
                pred = _mla_dec(params.decode(str(kv)), d)
                out.append(("MLA decode", str(src), f"{kv} KV") + _stats(pred, d.meas_s.to_numpy()))
            else:
                form = "naive" if str(src).startswith("trtllm") else "absorbed"
                pred = _mla_pre(params.mla_prefill[form], d, form)
                out.append(
                    ("MLA prefill", str(src), f"{form}, {kv} KV")
                    + _stats(pred, d.meas_s.to_numpy())
                )
    a2a = deepep_rows(data)
    for key, d in a2a.groupby(["source", "mode", "phase", "node_num"], sort=True):
        src, mode, phase, nodes = (str(k) for k in key)
        pred = _a2a(params.all_to_all[mode][phase], d)
        out.append(
            (f"DeepEP {phase}", src, f"{nodes} node{'s' if nodes != '1' else ''}")
            + _stats(pred, d.meas_s.to_numpy())
        )
    return out


# the columns that name one timed point of a moe_perf table (the same work in every table)
POINT_KEYS = ["hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size",
              "distribution", "num_tokens", "dtype"]  # fmt: skip


def kernel_comparison(data: Path) -> pd.DataFrame:
    """Each vLLM / SGLang kernel of the moe_perf tables (framework, weight dtype, kernel
    source) against TensorRT-LLM's CUTLASS kernel on the very same points (shape, TP, EP,
    routing, tokens, dtype; the same H100): the median of their time over TensorRT-LLM's
    per token band, and the share of HBM bandwidth the kernel's weight read reaches at <= 16
    tokens (touched experts' weights over the measured time). TensorRT-LLM's cells its
    collector ran untuned (:func:`untuned_cells`) are left out. A diagnostic, printed by
    ``python -m calibration.fit_moe --kernels``; nothing is fitted to it."""
    moe = moe_rows(data)
    moe["kernel_source"] = moe.kernel_source.astype(str)
    ref = moe[(moe.fw == REF_MOE) & ~moe.untuned][[*POINT_KEYS, "meas_s"]]
    rows = []
    for (fw, dt, kern), d in moe[moe.fw.isin(GEMM_FRAMEWORKS)].groupby(
        ["fw", "dtype", "kernel_source"], sort=True
    ):
        m = d.merge(ref, on=POINT_KEYS, suffixes=("", "_ref"))
        small = d[d.num_tokens <= 16]
        mats = np.where(small.gated.to_numpy(bool), 3.0, 2.0)
        weights = small.touched * mats * small.hidden_size * small.width
        read = weights * small.elem / small.meas_s / HBM
        row = {"framework": fw, "dtype": dt, "kernel": kern, "rows": len(d),
               "fitted": kern not in NOT_FITTED_KERNELS, "matched": len(m),
               "hbm_share_le16_median": float(np.median(read)) if len(read) else np.nan}  # fmt: skip
        r = (m.meas_s / m.meas_s_ref).to_numpy()
        tok = m.num_tokens.to_numpy()
        for name, sel in (("le64", tok <= 64), ("65_1024", (tok > 64) & (tok <= 1024)),
                          ("gt1024", tok > 1024)):  # fmt: skip
            row[f"over_trtllm_{name}"] = float(np.median(r[sel])) if sel.any() else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


# SGLang's tuned cells with every expert on the rank (EP 1: the table's workload is the
# model's inputs; its EP > 1 rows run the collector's rank-0 workload, unsettled:
# docs/calibration.md) split by expert shard width: the wide ones (Mixtral-8x7B TP2-8,
# Mixtral-8x22B TP4/8: shards of 1,792-7,168, 8 experts) and the narrow ones (64-1,536,
# 128-512 experts); the check scores the compute-bound rows
WIDE_SHARD = 1792.0
WIDTH_CHECK_MIN_TOKENS = 2048


def width_split_check(moe: pd.DataFrame, dt: str = "bf16") -> pd.DataFrame:
    """SGLang's tuned-tile grouped-GEMM set held out by shard width (its EP 1 cells), in
    each compute form: fitted (the rules of :func:`fit_grouped_gemm`) on the narrow cells and scored on the
    wide ones, and the other way; per form and direction the held-out rows of at least
    ``WIDTH_CHECK_MIN_TOKENS`` tokens: median and p90 APE, measured over predicted (median,
    and at EP 1). A diagnostic, printed by ``python -m calibration.fit_moe --width-split``
    and in docs/validation.md; nothing shipped changes."""
    d = fitted_rows(moe, "sglang", dt, tuned=True)
    d = d[d.moe_ep_size == 1].reset_index(drop=True)
    wide = d.width.to_numpy(float) >= WIDE_SHARD
    out = []
    for name, form in (("tiles", TILE_FORM), ("saturation", SATURATION_FORM)):
        for direction, train in (("narrow -> wide", ~wide), ("wide -> narrow", wide)):
            fit = d[train].reset_index(drop=True)
            test = d[~train].reset_index(drop=True)
            if fit.empty or test.empty:
                continue
            x, _, _ = fit_grouped_gemm(fit, held_out=False, form=form)
            r = test.meas_s.to_numpy(float) / _gg(GroupedGemmParams(*x), test)
            big = test.num_tokens.to_numpy() >= WIDTH_CHECK_MIN_TOKENS
            a = np.abs(1.0 / r[big] - 1.0)
            out.append({"dtype": dt, "form": name, "held_out": direction, "n": int(big.sum()),
                        "median_ape": float(np.median(a)), "p90_ape": float(np.percentile(a, 90)),
                        "measured_over_predicted": float(np.median(r[big]))})  # fmt: skip
    return pd.DataFrame(out)


# the token range the large-m check holds out, and the most tokens of the rows it fits on
M_RANGE_HELD_MIN = 8192
M_RANGE_FIT_MAX = 4096
MIXTRAL_SHAPE = (4096, 14336, 8, 2)  # hidden, expert width, experts, top-k


def m_range_check(data: Path, params: MoeParams | None = None) -> pd.DataFrame:
    """TensorRT-LLM's grouped-GEMM fits at large token counts, held out by token range: per
    weight dtype (bf16, fp8), the reference rows of at least ``M_RANGE_HELD_MIN`` tokens
    predicted by the shipped set (fitted on every token count) and by a refit on the rows
    of at most ``M_RANGE_FIT_MAX`` tokens (the same rules, :func:`fit_grouped_gemm`), all
    shapes and Mixtral-8x7B's alone: median APE and measured over predicted. A diagnostic,
    printed by ``python -m calibration.fit_moe --m-range``; nothing shipped changes."""
    params = params or load_moe_params(GPU)
    moe = moe_rows(data, (REF_MOE,))
    out = []
    for dt in ("bf16", "fp8"):
        d = fitted_rows(moe, REF_MOE, dt)
        held = d[d.num_tokens >= M_RANGE_HELD_MIN].reset_index(drop=True)
        low = d[d.num_tokens <= M_RANGE_FIT_MAX].reset_index(drop=True)
        x, _, _ = fit_grouped_gemm(low, held_out=False)
        mix = np.ones(len(held), bool)
        for col, v in zip(("hidden_size", "inter_size", "num_experts", "topk"), MIXTRAL_SHAPE,
                          strict=True):  # fmt: skip
            mix &= held[col].to_numpy() == v
        for fit, p in (("shipped (all token counts)", params.grouped_gemm[dt]),
                       (f"refit on <= {M_RANGE_FIT_MAX} tokens", GroupedGemmParams(*x))):  # fmt: skip
            r = held.meas_s.to_numpy(float) / _gg(p, held)
            for rows, sel in (("all shapes", np.ones(len(held), bool)), ("Mixtral-8x7B", mix)):
                out.append({"dtype": dt, "fit": fit, "rows": rows, "n": int(sel.sum()),
                            "median_ape": float(np.median(np.abs(1.0 / r[sel] - 1.0))),
                            "measured_over_predicted": float(np.median(r[sel])),
                            "min": float(r[sel].min()), "max": float(r[sel].max())})  # fmt: skip
    return pd.DataFrame(out)


def _token_buckets(tokens: np.ndarray):
    yield "tokens <= 64", tokens <= 64
    yield "65-1024", (tokens > 64) & (tokens <= 1024)
    yield "> 1024", tokens > 1024


def validation_markdown(
    data: Path,
    params: MoeParams | None = None,
    m_range: pd.DataFrame | None = None,
    width_split: pd.DataFrame | None = None,
) -> str:
    """The ``docs/validation.md`` section on the MoE, MLA and DeepEP operators (with
    ``m_range``, :func:`m_range_check`'s table, and ``width_split``,
    :func:`width_split_check`'s; each computed here when None)."""
    params = params or load_moe_params(GPU)
    if m_range is None:
        m_range = m_range_check(data, params)
    if width_split is None:
        width_split = width_split_check(moe_rows(data, ("sglang",)))
    lines = [
        "## MoE, MLA and expert-parallel all-to-all (H100)",
        "",
        "The MoE operators of `disaggsim/costmodel/moe.py` and `mla.py` with the shipped",
        f"`{moe_params_path(GPU).relative_to(moe_params_path(GPU).parents[3])}` against every",
        "row of AIConfigurator's H100 MoE, MLA and DeepEP tables; fitted with",
        f"`{COMMAND}` (the module docstring says which rows each fit uses).",
        "Held-out errors (refit without one shape family at a time, predicted on it):",
        "",
        "| op | fitted to | n | median APE | mean APE | held out by | held-out median | held-out mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op, e in params.fit_error.items():
        if not isinstance(e, dict) or "median_ape" not in e:
            continue
        ho_med, ho_mean = e.get("held_out_median_ape"), e.get("held_out_mean_ape")
        held = "- | - |"
        if ho_med is not None and ho_mean is not None:
            held = f"{100 * ho_med:.1f}% | {100 * ho_mean:.1f}% |"
        lines.append(
            f"| {op} | {e.get('rows', '')} | {e['n']} | {100 * e['median_ape']:.1f}% | "
            f"{100 * e['mean_ape']:.1f}% | {e.get('held_out', '')} | " + held
        )
    lines += [
        "",
        "Every row, by source and bucket (power-law rows use the expected straggler factor of",
        "`power_law_imbalance`; the tables hold one random draw per point, so they scatter):",
        "",
        "| op | rows (source) | bucket | n | median APE | mean APE | p90 APE |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, src, bucket, n, med, mean, p90 in validation_rows(data, params):
        lines.append(
            f"| {op} | {src} | {bucket} | {n} | {100 * med:.1f}% | {100 * mean:.1f}% | "
            f"{100 * p90:.1f}% |"
        )
    lines += [
        "",
        "Each framework's rows are predicted with its own kernel's parameters (vllm, sglang;",
        "SGLang's WideEP rows with SGLang's; TensorRT-LLM's the reference set). Other GPUs take",
        "these efficiencies against their own peaks (FLOP/s, HBM, NVLink, NIC), the grouped",
        "GEMM's `half_sat` scaled by the machine balance: no public MoE table exists for them.",
        "For the A100 in particular, no fused-MoE or grouped-GEMM kernel time at a Mixtral",
        "width and thousands of tokens was found (vLLM's Triton kernel of any release,",
        "TensorRT-LLM's or SGLang's; AIConfigurator's A100 tables hold no MoE table), so no",
        "Ampere efficiency is carried and vLLM PR 3240's prefill-heavy A100 Mixtral batches,",
        'held out, stay missed (docs/calibration.md, "The A100\'s fused_moe").',
        "",
        "TensorRT-LLM's sets at 8,192-16,384 tokens, held out by token range (refitted on the",
        f"rows of at most {M_RANGE_FIT_MAX:,} tokens; `python -m calibration.fit_moe --data",
        "../shared/data --m-range`); measured / predicted is the median over the rows (above 1:",
        "a prediction too fast):",
        "",
        "| dtype | fit | rows | n | median APE | measured / predicted | range |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in m_range.to_dict("records"):
        lines.append(
            f"| {r['dtype']} | {r['fit']} | {r['rows']} | {r['n']} | "
            f"{100 * float(r['median_ape']):.1f}% | {float(r['measured_over_predicted']):.3f} | "
            f"{float(r['min']):.2f}-{float(r['max']):.2f} |"
        )
    lines += [
        "",
        "SGLang's tuned-tile set held out by expert shard width (`python -m calibration.fit_moe",
        "--data ../shared/data --width-split`; its cells with every expert on the rank, EP 1):",
        f"fitted on the cells of one width group (wide: shards of at least {WIDE_SHARD:,.0f}, 8",
        "experts; narrow: the rest, 128-512 experts) and scored on the other's rows of at",
        f"least {WIDTH_CHECK_MIN_TOKENS:,} tokens, in the shipped tile form and in the saturation",
        "form the other sets keep:",
        "",
        "| dtype | form | held out | n | median APE | p90 APE | measured / predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in width_split.to_dict("records"):
        lines.append(
            f"| {r['dtype']} | {r['form']} | {r['held_out']} | {r['n']} | "
            f"{100 * float(r['median_ape']):.1f}% | {100 * float(r['p90_ape']):.1f}% | "
            f"{float(r['measured_over_predicted']):.3f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.fit_moe", description=__doc__)
    ap.add_argument("--data", default="../shared/data", help="the public data folder")
    ap.add_argument("--out", default=str(moe_params_path(GPU)), help="parameter file to write")
    ap.add_argument(
        "--untuned",
        action="store_true",
        help="only print, per dtype, the TensorRT-LLM cells its collector ran untuned",
    )
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="only print each vLLM/SGLang kernel against TensorRT-LLM's on the same points",
    )
    ap.add_argument(
        "--m-range",
        action="store_true",
        help=f"only print TensorRT-LLM's fits on its rows of >= {M_RANGE_HELD_MIN} tokens, "
        f"shipped and refitted on <= {M_RANGE_FIT_MAX} tokens",
    )
    ap.add_argument(
        "--width-split",
        action="store_true",
        help="only print SGLang's tuned-tile fit held out by shard width, in each compute form",
    )
    args = ap.parse_args(argv)
    try:  # a table missing, or a path that is not a regular file: one line, exit 2
        if args.width_split:
            table = width_split_check(moe_rows(Path(args.data), ("sglang",)))
            with pd.option_context("display.width", 250, "display.max_columns", 20):
                print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            return 0
        if args.kernels or args.untuned or args.m_range:
            show = kernel_comparison if args.kernels else untuned_summary
            table = (m_range_check if args.m_range else show)(Path(args.data))
            with pd.option_context("display.width", 250, "display.max_columns", 20):
                print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
            return 0
        params, errors = fit_all(Path(args.data))
        prof = profile_dict(params, errors, Path(args.data))
    except (FileNotFoundError, UserError) as e:
        print(f"fit_moe: error: {e}", file=sys.stderr)
        return 2
    moe_params_from_dict(prof, args.out)  # validate before writing
    text = json.dumps(prof, indent=2) + "\n"
    try:  # only over a parameter file disaggsim wrote (disaggsim/output.py)
        written = write_file(
            args.out, lambda tmp: tmp.write_text(text), "--out", MOE_OWNED, "MoE fit"
        )
    except UserError as e:
        print(f"fit_moe: error: {e}", file=sys.stderr)
        return 2
    for op, err in errors.items():
        print(
            f"{op:28s} n={err['n']:6d} median {100 * err['median_ape']:5.1f}%  held-out median "
            f"{100 * (err['held_out_median_ape'] or 0):5.1f}% ({err['held_out']})"
        )
    # the default --out is the shipped parameter file: say when the fit replaced it
    print(f"MoE fit {written.note()}")
    return 0


if __name__ == "__main__":
    restart_on_one_blas_thread("calibration.fit_moe")
    sys.exit(main())
