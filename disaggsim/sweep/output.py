"""Tables and JSON for sweep/compare result folders. Where and how the folder itself is
written (temporary sibling, marker, never over a user's files) is
:mod:`disaggsim.output`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd


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
