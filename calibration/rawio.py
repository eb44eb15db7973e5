"""Raw measurement files: one CSV per op family, one row per measured point.

The harness (:mod:`calibration.harness`) appends rows as it measures, so a run cut short
still leaves every point measured so far. The fitter (:mod:`calibration.fit`) reads them
back. This module owns the column layout and nothing else; it never imports torch.

Columns (every file has all of them; shape columns an op does not use are empty):

- ``op``: ``gemm`` | ``decode_attention`` | ``prefill_attention`` | ``elementwise`` |
  ``copy`` | ``allreduce``
- shape: ``m, n, k`` (GEMM: m tokens × k → n), ``batch, context_tokens`` (decode: total
  cached tokens over the batch), ``prompt_tokens`` (prefill: per sequence), ``heads,
  kv_heads, head_dim``, ``nbytes, num_blocks, kind`` (copies: d2d, h2d_pinned,
  d2h_pinned, p2p, gather), ``num_gpus`` (all-reduce, ``nbytes`` per GPU)
- ``dtype`` (bf16, fp8, fp32 on CPU), ``backend`` (the kernel path that ran)
- ``timing``: ``graph`` (the calls captured in a CUDA graph and the replays timed: kernel
  time, no launches), ``cpu`` (CPU wall clock of the same calls), ``eager`` (CUDA events
  around one launched call: launch time inside short calls; every row of runs made before
  graph timing); ``ops_per_replay``: calls per timed replay (the row is per call)
- environment: ``device_name, driver, torch_version, cuda_version, date``
- timing: ``median_s, p10_s, p90_s, repeats`` (seconds, over the repeats after warm-up)
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd

from disaggsim.errors import UserError
from disaggsim.inputs import regular_file

OPS = ("gemm", "decode_attention", "prefill_attention", "elementwise", "copy", "allreduce")
SHAPE_COLUMNS = (
    "m",
    "n",
    "k",
    "batch",
    "context_tokens",
    "prompt_tokens",
    "heads",
    "kv_heads",
    "head_dim",
    "nbytes",
    "num_blocks",
    "num_gpus",
    "kind",
)
ENV_COLUMNS = ("device_name", "driver", "torch_version", "cuda_version", "date")
TIMING_COLUMNS = ("median_s", "p10_s", "p90_s", "repeats", "timing", "ops_per_replay")
COLUMNS = ("op", *SHAPE_COLUMNS, "dtype", "backend", *ENV_COLUMNS, *TIMING_COLUMNS)


def raw_csv_path(out_dir: Path, op: str) -> Path:
    return Path(out_dir) / f"{op}.csv"


class RawWriter:
    """Appends rows to ``<out_dir>/<op>.csv``, flushing after each row."""

    def __init__(self, out_dir: Path, env: dict[str, str]) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env)

    def write(self, op: str, shape: dict, dtype: str, backend: str, timing: dict) -> None:
        path = raw_csv_path(self.out_dir, op)
        new = not path.exists()
        row = {c: "" for c in COLUMNS}
        row.update({k: v for k, v in shape.items() if k in SHAPE_COLUMNS})
        row.update(op=op, dtype=dtype, backend=backend, **self.env, **timing)
        with path.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerow(row)


def read_raw(raw_dir: str | Path) -> pd.DataFrame:
    """All raw rows in ``raw_dir`` as one frame (empty shape cells are NaN)."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise UserError(f"{raw_dir}: raw measurement folder not found")
    frames = []
    for op in OPS:
        path = raw_csv_path(raw_dir, op)
        if not path.exists() and not path.is_symlink():
            continue
        regular_file(path, UserError, "raw CSV")  # a named pipe would block pandas for ever
        try:
            df = pd.read_csv(
                path, dtype={"kind": str, "backend": str, "dtype": str}, on_bad_lines="skip"
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
        missing = [c for c in ("op", "dtype", "median_s") if c not in df.columns]
        if missing:
            raise UserError(
                f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})"
            )
        frames.append(df)
    if not frames:
        raise UserError(f"{raw_dir}: no raw CSV files ({', '.join(op + '.csv' for op in OPS)})")
    df = pd.concat(frames, ignore_index=True)
    if "timing" not in df.columns:  # runs made before graph timing: one call per CUDA-event pair
        df["timing"] = np.where(df["device_name"].astype(str).str.startswith("cpu"), "cpu", "eager")
    if "ops_per_replay" not in df.columns:
        df["ops_per_replay"] = 1
    return df[df["median_s"] > 0].reset_index(drop=True)
