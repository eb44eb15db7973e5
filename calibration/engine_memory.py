"""Fit the engine memory reserve (:mod:`disaggsim.costmodel.reserve`) to engines' start-up logs.

Rows: ``calibration/engine_data/engine_memory.csv`` (provenance in ``engine_memory.md``).
Column ``role`` says what a row is for: ``fit`` rows fit, ``held_out`` rows are predicted
only, ``moe_check`` rows (MoE models, whose forward pass the dense form does not describe)
and ``other_version`` rows (releases other than the one fitted) are reported, never fitted.

Per framework:

- vLLM 0.19 activation peak = ``max(forward × T × (2 hidden + 3 ffn / tp) × 2,
  logits × S × vocab)``: ``forward`` and ``logits`` minimise the squared relative error
  over the fit rows on a grid (``forward`` 0.01 apart, ``logits`` 0.05 apart: the max
  makes the problem piecewise linear, and two parameters make a grid exact enough);
  ``base`` = mean ``non_torch`` of the TP 1 fit rows, ``comm`` = mean of the TP > 1 fit
  rows minus ``base``.
- TensorRT-LLM: ``forward`` = the least-squares ratio of the execution-context memory to
  ``T × (2 hidden + 3 ffn / tp) × 2`` over its fit rows (``logits`` 0: the decoder
  buffers are not in the reserve); ``base`` and ``comm`` from the AIConfigurator rows as
  for vLLM (TP 4 taken for TP > 1: the larger, and the same at TP 8).
- SGLang: ``comm`` = mean init memory of the TP > 1 fit rows minus that at TP 1;
  ``base`` = vLLM's (the CUDA context, which SGLang's logs do not show); no activation
  terms (outside ``--mem-fraction-static``).

Run: ``python -m calibration.engine_memory`` prints the parameters and every row's
prediction and error.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disaggsim.costmodel.reserve import EngineMemory
from disaggsim.errors import UserError
from disaggsim.units import GiB

ROWS = Path(__file__).parent / "engine_data" / "engine_memory.csv"
ROLES = ("fit", "held_out", "moe_check", "other_version")
FORWARD_GRID = np.round(np.arange(0.0, 4.0 + 1e-9, 0.01), 2)
LOGITS_GRID = np.round(np.arange(0.0, 40.0 + 1e-9, 0.05), 2)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    row_id: str
    engine: str
    tp: int
    hidden: int | None
    ffn: int | None
    vocab: int | None
    tokens: int | None  # the iteration budget (max_num_batched_tokens / max_num_tokens)
    seqs: int | None  # the batch limit (max_num_seqs)
    activation_gib: float | None
    non_torch_gib: float | None
    role: str


def _opt_float(r: dict[str, str], field: str, where: str) -> float | None:
    """``r[field]`` as a number >= 0, None where empty; a one-line error otherwise."""
    text = r[field]
    if text == "":
        return None
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{where}: field {field}: expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise UserError(f"{where}: field {field}: expected a number >= 0, got {text!r}")
    return v


def _opt_int(r: dict[str, str], field: str, where: str) -> int | None:
    v = _opt_float(r, field, where)
    if v is not None and v != int(v):
        raise UserError(f"{where}: field {field}: expected an integer, got {r[field]!r}")
    return None if v is None else int(v)


def read_rows(path: Path = ROWS) -> list[MemoryRow]:
    """The rows of ``path``; a malformed row is a one-line error naming file, row, field."""
    rows = []
    with path.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            where = f"{path}: row {i}"
            if r["role"] not in ROLES:
                raise UserError(f"{where}: field role: {r['role']!r} (allowed: {', '.join(ROLES)})")
            rows.append(
                MemoryRow(
                    row_id=r["row_id"],
                    engine=r["engine"],
                    tp=_opt_int(r, "tp", where) or 0,
                    hidden=_opt_int(r, "hidden", where),
                    ffn=_opt_int(r, "ffn", where),
                    vocab=_opt_int(r, "vocab", where),
                    tokens=_opt_int(r, "max_num_batched_tokens", where),
                    seqs=_opt_int(r, "max_num_seqs", where),
                    activation_gib=_opt_float(r, "activation_peak_gib", where),
                    non_torch_gib=_opt_float(r, "non_torch_gib", where),
                    role=r["role"],
                )
            )
    return rows


def _forward_elems(r: MemoryRow) -> float:
    assert r.hidden is not None and r.ffn is not None and r.tokens is not None
    return r.tokens * (2.0 * r.hidden + 3.0 * r.ffn / r.tp) * 2.0


def predict_activation_gib(r: MemoryRow, forward: float, logits: float) -> float:
    """The activation peak (GiB) the form gives for ``r``'s shape and limits."""
    fwd = forward * _forward_elems(r)
    lg = logits * (r.seqs or 0) * (r.vocab or 0)
    return max(fwd, lg) / GiB


def _activation_rows(rows: list[MemoryRow], engine: str, role: str) -> list[MemoryRow]:
    return [r for r in rows if r.engine == engine and r.role == role and r.activation_gib]


def _base_comm(rows: list[MemoryRow], engine: str) -> tuple[float, float]:
    nt = [r for r in rows if r.engine == engine and r.role == "fit" and r.non_torch_gib is not None]
    one = [r.non_torch_gib for r in nt if r.tp == 1]
    many = [r.non_torch_gib for r in nt if r.tp > 1]
    if engine == "trtllm":  # the TP 4 figure (also TP 8's; TP 2's is smaller)
        many = [r.non_torch_gib for r in nt if r.tp == 4]
    base = float(np.mean(one))  # type: ignore[arg-type]
    return base, float(np.mean(many)) - base  # type: ignore[arg-type]


def fit_vllm(rows: list[MemoryRow]) -> EngineMemory:
    fit = _activation_rows(rows, "vllm", "fit")
    meas = np.array([r.activation_gib for r in fit])
    fwd = np.array([_forward_elems(r) for r in fit]) / GiB
    lg = np.array([(r.seqs or 0) * (r.vocab or 0) for r in fit]) / GiB
    # (grid forward) x (grid logits) x rows: relative squared error
    pred = np.maximum(
        FORWARD_GRID[:, None, None] * fwd[None, None, :], LOGITS_GRID[None, :, None] * lg
    )
    err = (((pred - meas) / meas) ** 2).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    base, comm = _base_comm(rows, "vllm")
    return EngineMemory(
        framework="vllm",
        base_bytes=round(base, 4) * GiB,
        comm_bytes=round(comm, 4) * GiB,
        forward=float(FORWARD_GRID[i]),
        logits_bytes=float(LOGITS_GRID[j]),
    )


def fit_trtllm(rows: list[MemoryRow]) -> EngineMemory:
    fit = _activation_rows(rows, "trtllm", "fit")
    x = np.array([_forward_elems(r) for r in fit])
    y = np.array([(r.activation_gib or 0.0) * GiB for r in fit])
    # y = k x with the squared relative error least: sum((k x / y - 1)^2) is least at
    # k = sum(x / y) / sum((x / y)^2)
    q = x / y
    k = float((q.sum()) / (q**2).sum())
    base, comm = _base_comm(rows, "trtllm")
    return EngineMemory(
        framework="trtllm",
        base_bytes=round(base, 4) * GiB,
        comm_bytes=round(comm, 4) * GiB,
        forward=round(k, 2),
        logits_bytes=0.0,
    )


def fit_sglang(rows: list[MemoryRow], vllm: EngineMemory) -> EngineMemory:
    nt = [r for r in rows if r.engine == "sglang" and r.role == "fit"]
    one = np.mean([r.non_torch_gib for r in nt if r.tp == 1])
    many = np.mean([r.non_torch_gib for r in nt if r.tp > 1])
    return EngineMemory(
        framework="sglang",
        base_bytes=vllm.base_bytes,
        comm_bytes=round(float(many - one), 4) * GiB,
        forward=0.0,
        logits_bytes=0.0,
    )


def fit_all(rows: list[MemoryRow] | None = None) -> dict[str, EngineMemory]:
    """Every framework's parameters, as :data:`disaggsim.costmodel.reserve.ENGINE_MEMORY`
    ships them."""
    rows = read_rows() if rows is None else rows
    vllm = fit_vllm(rows)
    return {"vllm": vllm, "sglang": fit_sglang(rows, vllm), "trtllm": fit_trtllm(rows)}


def report(rows: list[MemoryRow] | None = None) -> list[tuple[str, str, float, float, float]]:
    """``(row_id, role, measured, predicted, relative error)`` of every activation row of
    vLLM and TensorRT-LLM (GiB)."""
    rows = read_rows() if rows is None else rows
    params = fit_all(rows)
    out = []
    for r in rows:
        if r.engine not in ("vllm", "trtllm") or not r.activation_gib or r.hidden is None:
            continue
        p = params[r.engine]
        pred = predict_activation_gib(r, p.forward, p.logits_bytes)
        out.append((r.row_id, r.role, r.activation_gib, pred, pred / r.activation_gib - 1.0))
    return out


def main(argv: list[str] | None = None) -> int:
    del argv
    rows = read_rows()
    for name, p in fit_all(rows).items():
        print(
            f"{name}: base {p.base_bytes / GiB:.4f} GiB, comm {p.comm_bytes / GiB:.4f} GiB, "
            f"forward {p.forward:.2f}, logits {p.logits_bytes:.2f} bytes per seq x vocab"
        )
    print(f"{'row':48s} {'role':14s} {'GiB':>7s} {'pred':>7s} {'error':>7s}")
    res = report(rows)
    for row_id, role, meas, pred, err in res:
        print(f"{row_id:48s} {role:14s} {meas:7.3f} {pred:7.3f} {100 * err:+6.1f}%")
    for role in ROLES:
        errs = [abs(e) for _, ro, _, _, e in res if ro == role]
        if errs:
            print(
                f"{role}: {len(errs)} rows, median |error| {100 * np.median(errs):.1f} %, "
                f"max {100 * max(errs):.1f} %"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
