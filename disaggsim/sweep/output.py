"""Writing sweep/compare result folders: every file is rendered into a temporary sibling
folder first and moved into place only when all of them exist, so a failure leaves the
output folder as it was (other files in it are left alone)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from disaggsim.errors import UserError


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")


def write_folder(out: Path, render: Callable[[Path], list[Path]]) -> list[Path]:
    """``render(tmp)`` writes files into ``tmp`` and returns them; they are then moved to
    ``out`` (replacing files of the same name). Returns the final paths."""
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = render(tmp)
        out.mkdir(exist_ok=True)
        final = []
        for f in files:
            dst = out / f.name
            os.replace(f, dst)
            final.append(dst)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_table(df: pd.DataFrame, folder: Path, stem: str) -> list[Path]:
    pq, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
    df.to_parquet(pq, index=False)
    df.to_csv(csv, index=False)
    return [pq, csv]


def jsonable(value):
    """Floats that JSON can carry (NaN/inf → null), numpy scalars → Python."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dump_json(obj, path: Path) -> Path:
    path.write_text(json.dumps(jsonable(obj), indent=1, allow_nan=False) + "\n")
    return path
