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
import io
import os
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
        """Append one row whole, or nothing: a row the system refuses in part (a full
        disk) is cut off again and the measurement stops with :class:`RawWriteError`
        (the harness went on to the next sweep, exit 0, and left the cut row, which
        ``calibrate fit`` read as a TypeError traceback)."""
        path = raw_csv_path(self.out_dir, op)
        new = not path.exists()
        row = {c: "" for c in COLUMNS}
        row.update({k: v for k, v in shape.items() if k in SHAPE_COLUMNS})
        row.update(op=op, dtype=dtype, backend=backend, **self.env, **timing)
        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)
        data = text.getvalue().encode("utf-8")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as e:
                try:
                    if new and end == 0:
                        path.unlink()  # no empty file left: none was there
                    else:
                        os.ftruncate(fd, end)
                except OSError:
                    pass  # a cut last line: read_raw drops it
                why = e.strerror or str(e)
                raise RawWriteError(
                    f"{path}: could not write a measured row ({why}); the rows measured "
                    f"before it are kept in {self.out_dir}/"
                ) from None
        finally:
            os.close(fd)


class RawWriteError(UserError):
    """The system refused a raw row (a full disk, a quota): the measurement stops (every
    later row would be refused too), the rows so far kept."""


# the columns that hold numbers (an empty cell: the op does not use it)
NUMBER_COLUMNS = (*(c for c in SHAPE_COLUMNS if c != "kind"), "median_s", "p10_s", "p90_s",
                  "repeats", "ops_per_replay")  # fmt: skip


def _check_numbers(df: pd.DataFrame, path: Path) -> None:
    """Every non-empty cell of a number column is a number: one that is not (an edited
    cell, a damaged row) is one line naming the file, the line and the column (it was a
    TypeError traceback comparing a string with a float inside the fit)."""
    for column in NUMBER_COLUMNS:
        if column not in df.columns or df[column].dtype.kind in "iufb":
            continue
        cells = df[column]
        bad = cells.notna() & pd.to_numeric(cells, errors="coerce").isna()
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise UserError(
                f"{path}: row {i + 1}: {column}: {str(cells.iloc[i])[:40]!r} is not a number "
                "(a raw file calibrate wrote holds numbers there)"
            )
        df[column] = pd.to_numeric(cells)


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
            text = path.read_text(encoding="utf-8")
            if text and not text.endswith("\n"):
                # a last row without its line end was cut short (a measurement killed
                # while writing it, or a full disk): dropped, as a sweep's journal drops
                # its cut last line; read as a row, its cells were a TypeError in the fit
                text = text[: text.rfind("\n") + 1]
            df = pd.read_csv(
                io.StringIO(text),
                dtype={"kind": str, "backend": str, "dtype": str},
                on_bad_lines="skip",
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
        missing = [c for c in ("op", "dtype", "median_s") if c not in df.columns]
        if missing:
            raise UserError(
                f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})"
            )
        _check_numbers(df, path)
        frames.append(df)
    if not frames:
        raise UserError(f"{raw_dir}: no raw CSV files ({', '.join(op + '.csv' for op in OPS)})")
    df = pd.concat(frames, ignore_index=True)
    if "timing" not in df.columns:  # runs made before graph timing: one call per CUDA-event pair
        df["timing"] = np.where(df["device_name"].astype(str).str.startswith("cpu"), "cpu", "eager")
    if "ops_per_replay" not in df.columns:
        df["ops_per_replay"] = 1
    df = df[df["median_s"] > 0].reset_index(drop=True)
    if df.empty:  # headers only, or every row cut: the fit failed on an IndexError
        names = ", ".join(op + ".csv" for op in OPS if raw_csv_path(raw_dir, op).exists())
        raise UserError(f"{raw_dir}: no measured row in {names} (a run stopped before one)")
    return df
