"""Whole-simulation check against published max-load throughput (held out, never fitted).

TensorRT-LLM's performance overview (``docs/source/performance/perf-overview.md``) reports
``trtllm-bench throughput``: a dataset of ``num_requests`` identical requests (ISL prompt
tokens, OSL output tokens, ``prepare_dataset.py token-norm-dist`` with zero deviation)
issued all at once to an in-flight-batching engine, and the output tokens per second of
the whole run (``Token Throughput``: request throughput × OSL, first token included). A
per-step fit cannot be checked against such a figure: it depends on how many sequences
the engine keeps in flight (its batch and KV limits), how prompts share iterations with
decodes, and every step's cost along the way. This module simulates each benchmark with
disaggsim and compares.

One row of ``calibration/engine_data/trtllm_throughput.csv`` is one published figure; its
provenance is in ``calibration/engine_data/trtllm_throughput.md``. A row is simulated as:

- one colocated worker of the row's GPU and TP, ``engine: trtllm`` (the shipped profile),
  the row's weight and KV dtypes;
- ``num_requests`` requests of exactly ISL prompt / OSL output tokens, all arriving at
  t = 0, each client asking for exactly OSL (``max_tokens``; ``trtllm-bench`` runs
  with ``eos_id -1``);
- the engine's limits as ``trtllm-bench build --dataset`` sets them where the row gives
  none (:func:`trtllm_bench_limits`, the build heuristic of TensorRT-LLM 0.15-0.17):
  ``max_batch_size`` → ``max_batch_seqs``, ``max_num_tokens`` → ``max_batch_tokens`` of a
  ``chunked`` pool (TensorRT-LLM's in-flight batching puts context and generation tokens
  in one iteration under ``max_num_tokens``, and ``trtllm-bench throughput`` enables
  chunked context by default: ``--enable_chunked_context/--disable_chunked_context``,
  default on; a 20,000-token prompt under a 2,048-token budget needs it);
- KV admission ``reserve_full`` (TensorRT-LLM's ``Guaranteed No Evict`` scheduling: a
  request starts only when blocks for ISL + OSL are free), 64-token blocks, no watermark;
  KV memory 0.95 of what the weights and the engine's runtime reserve leave of the
  device memory CUDA reports (``--kv_cache_free_gpu_mem_fraction 0.95``, the page's
  setting "in the majority of cases", of ``cudaMemGetInfo``'s free memory;
  :func:`kv_gpu_mem_util`); the reserve is TensorRT-LLM's
  (:mod:`disaggsim.costmodel.reserve`) at the build's ``max_num_tokens`` and TP
  (:func:`runtime_reserve`).

Simulated throughput = the requests' output tokens / the last request's finish time.
The figures are compared per row (simulated / published) and summarised as median and
90th-percentile absolute percentage error per engine and GPU.

Run: ``python -m calibration.throughput`` prints every row and the summary;
``--write-doc`` writes ``docs/validation-throughput.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from disaggsim.catalog import GPU_IDS, MODEL_IDS, get_gpu, get_model
from disaggsim.config.bounds import MAX_BATCH_SEQS
from disaggsim.costmodel.moe import build_cost
from disaggsim.costmodel.reserve import runtime_reserve_bytes
from disaggsim.costmodel.step import prefill_attention_at_length_s
from disaggsim.errors import UserError
from disaggsim.hardware.engines import ENGINE_NAMES, resolve_engine
from disaggsim.hardware.profile import PrefillAttentionParams
from disaggsim.run import simulate
from disaggsim.units import GiB
from disaggsim.workload.requests import Requests

DATA_DIR = Path(__file__).parent / "engine_data"
ROWS = DATA_DIR / "trtllm_throughput.csv"
DOC = Path(__file__).resolve().parents[1] / "docs" / "validation-throughput.md"

KV_FREE_MEM_FRACTION = 0.95
"""``--kv_cache_free_gpu_mem_fraction`` of the measured runs (perf-overview 0.17: "in the
majority of cases ... 0.95", falling back to 0.90 on out-of-memory)."""
KV_BLOCK_TOKENS = 64
"""TensorRT-LLM's default ``tokens_per_block``."""
DTYPES = ("fp8", "fp16", "bf16")
COLUMNS = (
    "row_id",
    "source",
    "engine",
    "gpu",
    "model",
    "weight_dtype",
    "kv_dtype",
    "tp",
    "pp",
    "isl",
    "osl",
    "num_requests",
    "max_batch_size",
    "max_num_tokens",
    "output_tokens_per_s",
)


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    """One published max-load throughput figure (output tokens per second, all GPUs)."""

    row_id: str
    source: str
    engine: str
    gpu: str
    model: str
    weight_dtype: str
    kv_dtype: str
    tp: int
    pp: int
    isl: int
    osl: int
    num_requests: int
    max_batch_size: int | None  # None: the trtllm-bench build heuristic
    max_num_tokens: int | None
    output_tokens_per_s: float


def _int(text: str, field: str, where: str, low: int, high: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise UserError(
            f"{where}: field {field}: expected a whole number {low}..{high}, got {text!r}"
        ) from None
    if not low <= v <= high:
        raise UserError(f"{where}: field {field}: must be {low}..{high}, got {v}")
    return v


def _choice(text: str, field: str, where: str, allowed: Sequence[str]) -> str:
    if text not in allowed:
        raise UserError(
            f"{where}: field {field}: {text!r} is not one of {', '.join(sorted(allowed))}"
        )
    return text


def read_rows(path: Path = ROWS) -> list[ThroughputRow]:
    """The rows of a throughput CSV (columns :data:`COLUMNS`), each checked; a bad row is a
    one-line :class:`UserError` naming the file, line, field and what is allowed."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = tuple(reader.fieldnames or ())
            if header != COLUMNS:
                missing = [c for c in COLUMNS if c not in header]
                extra = [c for c in header if c not in COLUMNS]
                raise UserError(
                    f"{path}: header must be {','.join(COLUMNS)}"
                    + (f"; missing {', '.join(missing)}" if missing else "")
                    + (f"; unknown {', '.join(extra)}" if extra else "")
                )
            rows = [_row(r, f"{path}:{reader.line_num}") for r in reader]
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    except csv.Error as e:
        raise UserError(f"{path}: not a CSV file ({e})") from None
    seen: set[str] = set()
    for r in rows:
        if r.row_id in seen:
            raise UserError(f"{path}: field row_id: {r.row_id!r} appears twice")
        seen.add(r.row_id)
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


def _row(r: dict[str, str | None], where: str) -> ThroughputRow:
    if None in r or any(v is None for v in r.values()):
        raise UserError(f"{where}: expected {len(COLUMNS)} fields")
    c = {k: (v or "").strip() for k, v in r.items() if k is not None}
    if not c["row_id"]:
        raise UserError(f"{where}: field row_id: empty")
    if not c["source"]:
        raise UserError(f"{where}: field source: empty")
    figure = c["output_tokens_per_s"]
    try:
        value = float(figure)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(
            f"{where}: field output_tokens_per_s: expected a number > 0, got {figure!r}"
        )
    limits = {}
    for name in ("max_batch_size", "max_num_tokens"):
        text = c[name]
        limits[name] = None if text == "" else _int(text, name, where, 1, 1 << 20)
    return ThroughputRow(
        row_id=c["row_id"],
        source=c["source"],
        engine=_choice(c["engine"], "engine", where, ENGINE_NAMES),
        gpu=_choice(c["gpu"], "gpu", where, GPU_IDS),
        model=_choice(c["model"], "model", where, MODEL_IDS),
        weight_dtype=_choice(c["weight_dtype"], "weight_dtype", where, DTYPES),
        kv_dtype=_choice(c["kv_dtype"], "kv_dtype", where, DTYPES),
        tp=_int(c["tp"], "tp", where, 1, 64),
        pp=_int(c["pp"], "pp", where, 1, 1),
        isl=_int(c["isl"], "isl", where, 1, 1 << 20),
        osl=_int(c["osl"], "osl", where, 1, 1 << 20),
        num_requests=_int(c["num_requests"], "num_requests", where, 1, 1_000_000),
        max_batch_size=limits["max_batch_size"],
        max_num_tokens=limits["max_num_tokens"],
        output_tokens_per_s=value,
    )


# ---------------------------------------------------------------- the benchmark's limits


def trtllm_bench_limits(row: ThroughputRow) -> tuple[int, int, float]:
    """``(max_batch_size, max_num_tokens, kv_cache_max_requests)`` as ``trtllm-bench build
    --dataset`` chose them in TensorRT-LLM 0.15-0.17 (``tensorrt_llm/bench/build/tuning.py``
    ``calc_engine_setting`` / ``finetune_setting``; restated here, not imported):

    - bytes per weight / KV element: 1 for FP8, else 2; the engine's size
      ``param_count / 1e9 × bytes`` and the memory ``nvml total GiB × GPUs`` (the file
      mixes the two units; so does this);
    - KV bytes per token ``2 × layers × max(tp, kv_heads) × head_dim × bytes``;
      ``kv_cache_max_requests = 0.95 × (memory − engine) / per token / (ISL + OSL)``;
    - ``raw_bs = min(requests, 4096) / pp``, ``raw_tokens = min(raw_bs × (1 + ISL / OSL),
      32768)``; the batch rounded up to 32 (at least 64) below 256, to 128 below 1024,
      else to 256; the tokens to 256 (at least 2048) below 4096, to 512 below 8192, else
      to 1024.

    A row's own ``max_batch_size`` / ``max_num_tokens`` replace the heuristic's."""
    model = get_model(row.model)
    gpu = get_gpu(row.gpu)
    byte_per_elem = 1 if row.weight_dtype == "fp8" else 2
    byte_per_kv = 1 if row.kv_dtype == "fp8" else 2
    per_token_gib = (
        2 * model.num_layers * max(row.tp, model.num_kv_heads) * model.head_dim * byte_per_kv
    ) / GiB
    n_gpus = row.tp * row.pp
    engine_size = model.num_params / 1000**3 * byte_per_elem
    memory = gpu.hbm_bytes / GiB * n_gpus
    kv_max_requests = (
        KV_FREE_MEM_FRACTION * (memory - engine_size) / per_token_gib / (row.isl + row.osl)
    )
    raw_bs = min(kv_max_requests, 4096) / row.pp
    raw_tokens = min(raw_bs * (1 + row.isl / row.osl), 32768)
    if raw_bs < 256:
        max_bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        max_bs = 128 * math.ceil(raw_bs / 128)
    else:
        max_bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        max_tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        max_tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        max_tokens = 1024 * math.ceil(raw_tokens / 1024)
    return (
        row.max_batch_size if row.max_batch_size is not None else max_bs,
        row.max_num_tokens if row.max_num_tokens is not None else max_tokens,
        kv_max_requests,
    )


def runtime_reserve(row: ThroughputRow) -> float:
    """Bytes per GPU the engine holds besides weights and KV for ``row``'s build: the
    engine's reserve (:mod:`disaggsim.costmodel.reserve`) at the row's TP and its
    ``max_num_tokens`` / ``max_batch_size`` (:func:`trtllm_bench_limits`)."""
    max_bs, max_tokens, _ = trtllm_bench_limits(row)
    model = get_model(row.model)
    return runtime_reserve_bytes(model, row.tp, resolve_engine(row.engine), max_tokens, max_bs)


def _weights_per_gpu(row: ThroughputRow) -> float:
    """The bytes of weights one GPU of the row's worker holds, as the simulated worker
    places them (its cost model's ``weights_bytes_per_gpu``: 16-bit embedding and LM head
    under FP8 weights, replicated norms); a worker whose weights alone overflow the GPU
    counts the catalog's figure (the simulation then refuses the row itself)."""
    try:
        cost = build_cost(
            row.model,
            row.gpu,
            row.tp,
            weight_dtype=row.weight_dtype,
            kv_dtype=row.kv_dtype,
            engine=row.engine,
            gpu_mem_util=1.0,
            activation_reserve_bytes=0.0,
        )
    except UserError:
        return get_model(row.model).weights_bytes(row.weight_dtype) / row.tp
    return float(cost.weights_bytes_per_gpu)


def kv_gpu_mem_util(row: ThroughputRow) -> float:
    """The ``gpu_mem_util`` that leaves the KV cache ``0.95 × (CUDA's total − weights −
    runtime reserve)`` per GPU: disaggsim's KV memory is ``usable × util − weights −
    reserve`` (``GpuSpec.usable_bytes``: the total CUDA reports, from which the engine's
    ``cudaMemGetInfo`` free memory is left), the engine's 0.95 of the memory free after
    loading and allocating its buffers (the worker's own weights, and
    :func:`runtime_reserve`, which :func:`scenario_for` gives the scenario as
    ``activation_reserve_gib`` so that both use one figure)."""
    gpu = get_gpu(row.gpu)
    used = _weights_per_gpu(row) + runtime_reserve(row)
    free = max(gpu.usable_bytes - used, 0.0)
    return min((KV_FREE_MEM_FRACTION * free + used) / gpu.usable_bytes, 1.0)


def scenario_for(row: ThroughputRow, kv_less_bytes: float = 0.0) -> dict:
    """The scenario (a mapping) that simulates ``row``'s benchmark; its requests come from
    :func:`requests_for`. ``kv_less_bytes`` (a diagnostic, :func:`kv_less_check`): that
    many bytes per GPU less KV memory than the engine's (0: the check as shipped)."""
    max_bs, max_tokens, _ = trtllm_bench_limits(row)
    util = kv_gpu_mem_util(row) - kv_less_bytes / get_gpu(row.gpu).usable_bytes
    return {
        "name": "throughput-check",
        "seed": 0,
        "model": row.model,
        "weight_dtype": row.weight_dtype,
        "kv_dtype": row.kv_dtype,
        "engine": row.engine,
        "architecture": "colocated",
        "pool": {
            "gpu": row.gpu,
            "num_workers": 1,
            "tp": row.tp,
            "scheduler": "chunked",
            "max_batch_seqs": min(max_bs, MAX_BATCH_SEQS),
            "max_batch_tokens": max_tokens,
            "gpu_mem_util": util,
            # the reserve at the build's own limits (max_batch_seqs above may be capped)
            "activation_reserve_gib": runtime_reserve(row) / GiB,
        },
        "kv": {"block_tokens": KV_BLOCK_TOKENS, "admission": "reserve_full", "watermark": 0.0},
        # no SLO is judged here; the fields are required
        "slo": {"ttft_ms": 1e9, "itl_ms": 1e9},
        # the workload section is required but unused: simulate() is given the requests
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 1.0,
            "prompt_tokens": {"dist": "fixed", "value": row.isl},
            "output_tokens": {"dist": "fixed", "value": row.osl},
        },
        "sim": {"duration_s": 1.0, "max_drain_s": 1e6},
    }


def requests_for(row: ThroughputRow) -> Requests:
    """``num_requests`` identical requests, all at t = 0, each asking for exactly OSL."""
    n = row.num_requests
    return Requests(
        arrival_s=np.zeros(n),
        prompt_tokens=np.full(n, row.isl, dtype=np.int64),
        output_tokens=np.full(n, row.osl, dtype=np.int64),
        max_tokens=np.full(n, row.osl, dtype=np.int64),
    )


@dataclass(frozen=True, slots=True)
class RowResult:
    row_id: str
    simulated_output_tokens_per_s: float  # NaN where not simulated
    max_batch_size: int
    max_num_tokens: int
    kv_max_requests: float  # the build heuristic's estimate
    mean_batch: float  # sequences per iteration, time-weighted (summary.mean_batch)
    makespan_s: float
    note: str  # why a row was not simulated, else ""
    wall_s: float


def _not_simulated(
    row: ThroughputRow, limits: tuple[int, int, float], note: str, wall_s: float
) -> RowResult:
    max_bs, max_tokens, kv_req = limits
    nan = math.nan
    return RowResult(row.row_id, nan, max_bs, max_tokens, kv_req, nan, nan, note, wall_s)


def simulate_row(row: ThroughputRow, kv_less_bytes: float = 0.0) -> RowResult:
    """Simulate one row's benchmark (see the module docstring); ``kv_less_bytes`` as
    :func:`scenario_for` takes it."""
    limits = trtllm_bench_limits(row)
    max_bs, max_tokens, kv_req = limits
    t0 = time.perf_counter()
    if kv_req < 1:
        # trtllm-bench refuses to build: "The amount of KV cache memory is insufficient"
        return _not_simulated(
            row, limits, "trtllm-bench build would refuse (KV for < 1 request)", 0.0
        )
    try:
        res = simulate(scenario_for(row, kv_less_bytes), requests=requests_for(row))
    except UserError as e:
        return _not_simulated(row, limits, f"not simulated: {e}", time.perf_counter() - t0)
    frame = res.requests
    done = frame["status"] == "completed"
    if not bool(done.all()):
        reasons = frame.loc[~done, "reason"].value_counts().to_dict()
        note = f"{int((~done).sum())} requests not completed: {reasons}"
        return _not_simulated(row, limits, note, time.perf_counter() - t0)
    makespan_s = float(frame["finish_at_s"].max())
    tokens = float(frame["output_tokens"].sum())
    mean_batch = float(next(iter(res.summary.mean_batch.values()), math.nan))
    return RowResult(
        row.row_id,
        tokens / makespan_s,
        max_bs,
        max_tokens,
        kv_req,
        mean_batch,
        makespan_s,
        "",
        time.perf_counter() - t0,
    )


# ---------------------------------------------------------------- what-if diagnostics


def _prefix_length_attention_s(
    peak: float,
    p: PrefillAttentionParams,
    num_seqs: float,
    new_tokens: float,
    pairs: float,
    heads: float,
    head_dim: float,
) -> float:
    """``step._prefill_attention_s`` with the efficiency saturating in ``2 × pairs /
    new_tokens − 1`` (twice the mean keys per query, minus one) where that exceeds the
    query length: the same length for a prompt without a prefix, ``2 × prefix + chunk``
    for a chunk over a cached prefix."""
    mean_len = new_tokens / max(num_seqs, 1.0)
    length = max(mean_len, 2.0 * pairs / max(new_tokens, 1.0) - 1.0)
    return prefill_attention_at_length_s(peak, p, length, pairs, heads, head_dim)


WHAT_IF = ("prefix-attention", "fused-fp8-quant")
"""Diagnostics (nothing shipped changes): ``prefix-attention`` prices a prefill chunk's
attention at the efficiency of its keys per query (:func:`_prefix_length_attention_s`);
``fused-fp8-quant`` drops the separate FP8 activation-quantisation passes (quantisation
fused into the preceding norm / activation kernel). Both replace private names of
``disaggsim.costmodel.step`` for the run; the MoE cost model looks up the prefill
attention there too, so ``prefix-attention`` reaches every row, and prices no separate
FP8 quantisation pass, so ``fused-fp8-quant`` leaves MoE rows as they are."""


@contextmanager
def what_if(names: Sequence[str]) -> Iterator[None]:
    """Run the enclosed simulations with the :data:`WHAT_IF` changes ``names``."""
    from disaggsim.costmodel import step

    saved = (step._prefill_attention_s, step.FP8_QUANT_BYTES_PER_ELEM)
    try:
        if "prefix-attention" in names:
            step._prefill_attention_s = _prefix_length_attention_s
        if "fused-fp8-quant" in names:
            step.FP8_QUANT_BYTES_PER_ELEM = 0.0
        yield
    finally:
        step._prefill_attention_s, step.FP8_QUANT_BYTES_PER_ELEM = saved


# ---------------------------------------------------------------- comparison and report


def compare(rows: Sequence[ThroughputRow], progress: bool = False) -> pd.DataFrame:
    """One line per row: the row's fields, the limits used, the simulated throughput,
    ``ratio`` (simulated / published) and ``ape`` (|ratio − 1|; NaN where not simulated)."""
    out = []
    for i, row in enumerate(rows):
        r = simulate_row(row)
        if progress:
            print(f"  [{i + 1}/{len(rows)}] {row.row_id} {r.wall_s:.1f} s", file=sys.stderr)
        d = {f.name: getattr(row, f.name) for f in fields(row)}
        d.update({f.name: getattr(r, f.name) for f in fields(r) if f.name != "row_id"})
        out.append(d)
    df = pd.DataFrame(out)
    df["ratio"] = df["simulated_output_tokens_per_s"] / df["output_tokens_per_s"]
    df["ape"] = (df["ratio"] - 1.0).abs()
    return df


def summary(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group: rows compared, median and 90th-percentile APE, median ratio, and the
    rows not simulated."""
    g = df.groupby(list(by), sort=True)
    s = pd.DataFrame(
        {
            "n": g["ape"].count(),
            "median_ape": g["ape"].median(),
            "p90_ape": g["ape"].quantile(0.9),
            "median_ratio": g["ratio"].median(),
            "min_ratio": g["ratio"].min(),
            "max_ratio": g["ratio"].max(),
            "not_simulated": g["ape"].apply(lambda a: int(a.isna().sum())),
        }
    )
    return s.reset_index()


def overall(df: pd.DataFrame) -> dict[str, float]:
    a = df["ape"].dropna()
    return {
        "n": int(len(a)),
        "median_ape": float(a.median()),
        "p90_ape": float(a.quantile(0.9)),
        "median_ratio": float(df["ratio"].median()),
    }


def _pct(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{100 * x:.1f} %"


def _cell(v: object) -> str:
    """A table key as written: whole numbers without a decimal point."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _md_table(s: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    head = [
        *keys,
        "rows",
        "median APE",
        "p90 APE",
        "median sim/pub",
        "range sim/pub",
        "not simulated",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in s.to_dict("records"):
        lines.append(
            "| "
            + " | ".join(
                [
                    *(_cell(r[k]) for k in keys),
                    str(int(r["n"])),
                    _pct(r["median_ape"]),
                    _pct(r["p90_ape"]),
                    f"{r['median_ratio']:.3f}",
                    f"{r['min_ratio']:.2f}-{r['max_ratio']:.2f}",
                    str(int(r["not_simulated"])),
                ]
            )
            + " |"
        )
    return lines


def doc_text(df: pd.DataFrame, command: str) -> str:
    """The generated ``docs/validation-throughput.md``."""
    o = overall(df)
    lines = [
        "# Validation: whole simulations against published max-load throughput",
        "",
        f"Generated by `{command}` (calibration/throughput.py); do not edit by hand.",
        "",
        "Every row is a figure from an engine's published throughput table (output tokens per",
        "second of a `trtllm-bench throughput` run: all requests issued at once), simulated end to",
        "end with the shipped engine profile (`engine: trtllm`), the benchmark's requests, limits",
        "and KV share (calibration/throughput.py's docstring says how). No parameter is fitted to",
        "these rows; provenance: calibration/engine_data/trtllm_throughput.md.",
        "",
        f"All rows: {o['n']} compared, median APE {_pct(o['median_ape'])}, "
        f"p90 APE {_pct(o['p90_ape'])}, median simulated/published {o['median_ratio']:.3f}.",
        "",
        "## Per source",
        "",
        *_md_table(summary(df, ["engine", "source"]), ["engine", "source"]),
        "",
        "## Per engine and GPU",
        "",
        *_md_table(
            summary(df, ["engine", "gpu", "weight_dtype"]), ["engine", "gpu", "weight_dtype"]
        ),
        "",
        "## Per model and TP",
        "",
        *_md_table(summary(df, ["model", "tp"]), ["model", "tp"]),
        "",
        "## Per ISL/OSL",
        "",
        *_md_table(summary(df, ["isl", "osl"]), ["isl", "osl"]),
        "",
        f"## Where the simulation is optimistic (simulated / published > {OPTIMISTIC})",
        "",
        "A simulator that is fast at max load undersizes fleets, so these rows matter more than",
        "the median. Groups (source, GPU, dtype, model, TP) holding such rows, with how many of",
        "the group's rows are above the line; the causes are in docs/calibration.md, \"Whole",
        'simulations against published max-load throughput".',
        "",
        *_optimistic_table(df),
        "",
        "## Every row",
        "",
        "| row | GPU | model | dtype | TP | ISL/OSL | requests | max batch / tokens | "
        "published tok/s | simulated tok/s | sim/pub | mean batch | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in df.iterrows():
        sim = r["simulated_output_tokens_per_s"]
        lines.append(
            f"| {r['row_id']} | {r['gpu']} | {r['model']} | {r['weight_dtype']} | {r['tp']} | "
            f"{r['isl']}/{r['osl']} | {r['num_requests']} | {r['max_batch_size']} / "
            f"{r['max_num_tokens']} | {r['output_tokens_per_s']:.0f} | "
            + ("—" if not math.isfinite(sim) else f"{sim:.0f}")
            + f" | {r['ratio']:.3f} | "
            + ("—" if not math.isfinite(r["mean_batch"]) else f"{r['mean_batch']:.0f}")
            + f" | {r['note']} |"
        )
    return "\n".join(lines) + "\n"


OPTIMISTIC = 1.2
"""Simulated / published above this is listed on its own in the generated doc."""


def _optimistic_table(df: pd.DataFrame) -> list[str]:
    keys = ["source", "gpu", "weight_dtype", "model", "tp"]
    head = "| source | GPU | dtype | model | TP | rows above | of rows | sim/pub range | ISL/OSL above |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for key, g in df.groupby(keys, sort=True):
        above = g[g["ratio"] > OPTIMISTIC]
        if above.empty:
            continue
        ios = ", ".join(
            f"{int(i)}/{int(o)}" for i, o in zip(above["isl"], above["osl"], strict=True)
        )
        lines.append(
            "| "
            + " | ".join(_cell(k) for k in key)
            + f" | {len(above)} | {len(g)} | {g['ratio'].min():.2f}-{g['ratio'].max():.2f} | {ios} |"
        )
    if len(lines) == 2:
        lines.append("| (none) | | | | | | | | |")
    return lines


SUMMARY = DATA_DIR / "trtllm_throughput_summary.json"
"""Written with the doc: the overall figures :func:`validation_sentence` reports."""


def summary_json(df: pd.DataFrame) -> dict[str, object]:
    o = overall(df)
    return {
        "generated_by": "python -m calibration.throughput --write-doc",
        "rows": int(len(df)),
        "compared": o["n"],
        "median_ape": round(o["median_ape"], 4),
        "p90_ape": round(o["p90_ape"], 4),
        "median_ratio": round(o["median_ratio"], 4),
        "optimistic_rows": int((df["ratio"] > OPTIMISTIC).sum()),
        "sources": sorted(df["source"].unique().tolist()),
    }


def validation_sentence(path: Path = SUMMARY) -> str:
    """One paragraph for docs/validation.md from the summary the doc's run wrote."""
    import json

    try:
        d = json.loads(path.read_text())
        return (
            f"Published max-load throughput, whole simulations (held out, never fitted): "
            f"{d['compared']} rows of {', '.join(d['sources'])}, median APE "
            f"{100 * d['median_ape']:.1f} %, p90 {100 * d['p90_ape']:.1f} %, median "
            f"simulated/published {d['median_ratio']:.3f}; {d['optimistic_rows']} rows "
            f"simulated more than {OPTIMISTIC}x the published figure. Per GPU, model, "
            "length and row: docs/validation-throughput.md (`python -m calibration.throughput "
            "--write-doc`); where it misses and why: docs/calibration.md."
        )
    except (OSError, ValueError, KeyError) as e:
        return f"Published max-load throughput: no summary ({path.name}: {e}); run `python -m calibration.throughput --write-doc`."


def kv_less_check(rows: Sequence[ThroughputRow], less_gib: Sequence[float]) -> pd.DataFrame:
    """A diagnostic, nothing shipped changes: each row simulated with its KV memory as
    shipped and with each of ``less_gib`` GiB per GPU less (the KV pool the engine would
    keep if it held that much more besides weights and KV). Per row and amount the
    simulated / published ratio and the mean batch: how large a memory shortfall would
    explain a row, and whether the row follows the KV pool at all (a row whose batch is
    not KV-bound does not)."""
    out = []
    for row in rows:
        gpu = get_gpu(row.gpu)
        kv_gib = (gpu.usable_bytes * kv_gpu_mem_util(row) - _weights_per_gpu(row)) / GiB
        kv_gib -= runtime_reserve(row) / GiB
        for gib in (0.0, *less_gib):
            if gib >= kv_gib:
                ratio, batch = math.nan, math.nan
                note = f"not simulated: the row's KV memory is {kv_gib:.2f} GiB per GPU"
            else:
                r = simulate_row(row, gib * GiB)
                ratio = r.simulated_output_tokens_per_s / row.output_tokens_per_s
                batch, note = r.mean_batch, r.note
            out.append(
                {
                    "row_id": row.row_id,
                    "kv_less_gib": gib,
                    "ratio": ratio,
                    "mean_batch": batch,
                    "note": note,
                }
            )
    return pd.DataFrame(out)


def _print_what_if(rows: Sequence[ThroughputRow], names: Sequence[str]) -> int:
    base = compare(rows)
    with what_if(names):
        alt = compare(rows)
    base["ratio_what_if"] = alt["ratio"]
    base["ape_what_if"] = alt["ape"]
    rows_out = []
    groups = [(f"{gpu} {dtype}", g) for (gpu, dtype), g in base.groupby(["gpu", "weight_dtype"])]
    for key, g in [("all", base), *groups]:
        rows_out.append(
            {
                "rows": key,
                "n": int(g["ape"].count()),
                "shipped median/p90 APE": f"{_pct(float(g['ape'].median()))} / "
                f"{_pct(float(g['ape'].quantile(0.9)))}",
                "shipped median ratio": round(float(g["ratio"].median()), 3),
                "what-if median/p90 APE": f"{_pct(float(g['ape_what_if'].median()))} / "
                f"{_pct(float(g['ape_what_if'].quantile(0.9)))}",
                "what-if median ratio": round(float(g["ratio_what_if"].median()), 3),
            }
        )
    print(f"what-if {'+'.join(names)} on {len(rows)} rows")
    print(pd.DataFrame(rows_out).to_string(index=False))
    by_io = base.groupby(["isl", "osl"])[["ratio", "ratio_what_if"]].median().round(3)
    print(by_io.to_string())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.throughput",
        description="Simulate published max-load throughput benchmarks and compare.",
    )
    p.add_argument("--rows", type=Path, default=ROWS, help="throughput CSV (default: shipped)")
    p.add_argument("--only", default=None, help="rows whose gpu, model or row_id contain this")
    p.add_argument("--every", type=int, default=1, help="every k-th row only (a sample)")
    p.add_argument("--write-doc", action="store_true", help=f"write {DOC.name}")
    p.add_argument("--csv", type=Path, default=None, help="write the per-row results here")
    p.add_argument(
        "--what-if",
        action="append",
        choices=WHAT_IF,
        default=[],
        help="diagnostic: also run the rows with this change (repeatable; "
        "nothing shipped changes) and print both",
    )
    p.add_argument(
        "--kv-less-gib",
        action="append",
        type=float,
        default=[],
        metavar="GIB",
        help="diagnostic: also run the rows with GIB GiB per GPU less KV memory (repeatable; "
        "nothing shipped changes) and print the ratio and mean batch of each",
    )
    a = p.parse_args(argv)
    try:
        if a.every < 1:
            raise UserError(f"--every: must be >= 1, got {a.every}")
        bad = [g for g in a.kv_less_gib if not (math.isfinite(g) and g > 0.0)]
        if bad:
            raise UserError(f"--kv-less-gib: must be a number of GiB > 0, got {bad[0]:g}")
        rows = read_rows(a.rows)
        if a.only:
            rows = [r for r in rows if a.only in r.gpu or a.only in r.model or a.only in r.row_id]
            if not rows:
                raise UserError(f"--only {a.only!r}: no row's gpu, model or row_id contains it")
        rows = rows[:: a.every]
        if a.write_doc and (a.only or a.every != 1 or a.rows != ROWS or a.what_if or a.kv_less_gib):
            raise UserError(
                "--write-doc takes every shipped row (no --only, --every, --rows, --what-if "
                "or --kv-less-gib)"
            )
        if a.kv_less_gib:
            t = kv_less_check(rows, a.kv_less_gib)
            wide = t.pivot_table(
                index="row_id", columns="kv_less_gib", values=["ratio", "mean_batch"], sort=False
            )
            print("simulated / published (ratio) and mean batch with GiB per GPU less KV memory")
            with pd.option_context("display.width", 250, "display.max_rows", 1000):
                print(wide.round(3).to_string())
            notes = t[t["note"] != ""]
            for r in notes.itertuples():
                print(f"{r.row_id} at {r.kv_less_gib:g} GiB less: {r.note}")
            return 0
        if a.what_if:
            return _print_what_if(rows, a.what_if)
        t0 = time.perf_counter()
        df = compare(rows, progress=True)
        wall = time.perf_counter() - t0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_rows", 1000):
        cols = [
            "row_id",
            "gpu",
            "model",
            "weight_dtype",
            "tp",
            "isl",
            "osl",
            "max_batch_size",
            "max_num_tokens",
            "output_tokens_per_s",
            "simulated_output_tokens_per_s",
            "ratio",
            "mean_batch",
            "note",
        ]
        print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print()
        print(summary(df, ["engine", "gpu", "weight_dtype"]).to_string(index=False))
        print()
        print(summary(df, ["model", "tp"]).to_string(index=False))
    o = overall(df)
    print(
        f"\nall: {o['n']} rows, median APE {_pct(o['median_ape'])}, p90 {_pct(o['p90_ape'])}, "
        f"median ratio {o['median_ratio']:.3f}; {wall:.0f} s"
    )
    if a.csv is not None:
        df.to_csv(a.csv, index=False)
    # a row the simulator refused or left unfinished is a failure of this check, not a
    # figure (rows trtllm-bench itself would not build are only listed)
    failed = df["note"].str.startswith(("not simulated", "requests not")) | df["note"].str.contains(
        "not completed"
    )
    if bool(failed.any()):
        print(
            f"error: {int(failed.sum())} rows not simulated (first: {df.loc[failed, 'row_id'].iloc[0]}: "
            f"{df.loc[failed, 'note'].iloc[0]}); doc not written",
            file=sys.stderr,
        )
        return 1
    if a.write_doc:
        import json

        DOC.write_text(doc_text(df, "python -m calibration.throughput --write-doc"))
        SUMMARY.write_text(json.dumps(summary_json(df), indent=1) + "\n")
        print(f"wrote {DOC} and {SUMMARY}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
