"""Readers for real request traces: Azure LLM inference 2023 CSV and Mooncake JSONL.

Both produce a :class:`Requests` table with arrivals in seconds relative to the earliest
request (the first row, in the sorted files published), rows sorted stably by arrival.

- Azure CSV: header ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is wall clock,
  ``2023-11-16 18:17:03.9799600`` (ISO 8601, any number of fraction digits).
- Mooncake JSONL: one object per line with ``timestamp`` (milliseconds),
  ``input_length``, ``output_length`` and optionally ``hash_ids`` (prefix hashes of
  512-token blocks, ``ceil(input_length / 512)`` of them), kept as canonical prefix ids
  in ``Requests.prefix_chains`` (:mod:`disaggsim.workload.chains`).

Either format may carry the clients' ``max_tokens``: an Azure ``MaxTokens`` column, a
Mooncake ``max_tokens`` key (on every line once the first has it), whole numbers >= 1; a
recorded reply longer than its ``max_tokens`` is cut to it. Without one, ``max_tokens``
is left unset (docs/workloads.md gives the default).

Zero token counts are clamped to 1: ``output_tokens`` counts the first token, which every
request produces, and an empty prompt still costs a forward pass. Negative, missing or
non-numeric values are a :class:`UserError` naming the file and line.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from disaggsim.config.bounds import MAX_TOKENS
from disaggsim.errors import UserError
from disaggsim.inputs import regular_file
from disaggsim.workload.chains import canonical_chains
from disaggsim.workload.requests import Requests

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
AZURE_MAX_TOKENS = "MaxTokens"  # optional column
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
TRACE_FORMATS = ("azure", "mooncake", "auto")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the published Mooncake traces."""


def detect_format(path: Path) -> str:
    """``azure`` for ``.csv``, ``mooncake`` for ``.jsonl``/``.json``."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix in (".jsonl", ".json"):
        return "mooncake"
    raise UserError(
        f"{path}: cannot tell the trace format from the extension {suffix!r}; "
        "use .csv (azure) or .jsonl (mooncake), or set format: azure | mooncake"
    )


def _check_text(path: Path) -> None:
    """A trace is text (an Azure CSV or Mooncake JSON lines): a Parquet file or another
    binary file (compressed, an image) is refused as such, not reported as a CSV that
    does not decode or a JSON line that does not parse."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    kind = None
    if head.startswith(b"PAR1"):
        kind = "a Parquet file"
    elif head.startswith((b"\x1f\x8b", b"PK\x03\x04", b"\x28\xb5\x2f\xfd", b"BZh")):
        kind = "a compressed file (decompress it first)"
    elif b"\x00" in head:
        kind = "a binary file"
    else:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(head) - 3:  # not a character cut by the 4096-byte read
                kind = "not UTF-8 text"
    if kind is not None:
        raise UserError(
            f"{path}: {kind}, not a trace; workload.path takes an Azure CSV (.csv) or "
            "Mooncake JSON lines (.jsonl) (workload.format allowed: azure, mooncake, auto)"
        )


def _check_format_fits(path: Path, format: str) -> None:
    """A format given for a file of the other kind (``format: azure`` on a Mooncake JSONL
    file, or the reverse) is refused naming ``workload.format``, not reported as a
    malformed line of the file. A JSON-lines trace's first non-blank character is
    ``{`` (or ``[``: JSON, though not a request); a CSV's is a header name."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    if head.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        head = head[3:].lstrip()
    if not head:
        return  # empty: the reader says so
    is_json = head[:1] in (b"{", b"[")
    if format == "azure" and is_json:
        raise UserError(
            f"workload.format: azure, but {path} holds JSON lines (a mooncake trace?) "
            "(allowed: azure, mooncake, auto)"
        )
    if format == "mooncake" and not is_json:
        raise UserError(
            f"workload.format: mooncake, but {path} is not JSON lines (a CSV: azure?) "
            "(allowed: azure, mooncake, auto)"
        )


def read_trace(
    path: str | Path, format: str = "auto", block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> Requests:
    """Read a trace file into :class:`Requests` (arrivals from 0, sorted).

    Parameters
    ----------
    path : the trace file.
    format : ``"azure"``, ``"mooncake"`` or ``"auto"`` (by extension).
    block_tokens : tokens per ``hash_ids`` block (Mooncake: 512).
    """
    path = Path(path)
    if format not in TRACE_FORMATS:
        raise UserError(f"{path}: unknown trace format {format!r}; allowed: azure, mooncake, auto")
    regular_file(path, UserError, "trace file")  # a named pipe or a device would block
    _check_text(path)
    if format == "auto":
        format = detect_format(path)
    else:
        _check_format_fits(path, format)
    if format == "azure":
        return _read_azure(path)
    return _read_mooncake(path, block_tokens)


def _finish(
    path: Path,
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    hashes: list[list[Any]] | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    max_tokens: np.ndarray | None = None,
) -> Requests:
    if len(arrival_s) == 0:
        raise UserError(f"{path}: the trace has no requests")
    order = np.argsort(arrival_s, kind="stable")
    arrival_s = arrival_s[order]
    arrival_s = arrival_s - arrival_s[0]
    prompt_tokens = np.maximum(prompt[order], 1).astype(np.int64)
    chains = None
    if hashes is not None:
        chains = canonical_chains([hashes[i] for i in order], prompt_tokens, block_tokens)
    requests = Requests(
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        output_tokens=np.maximum(output[order], 1).astype(np.int64),
        prefix_chains=chains,
    )
    if max_tokens is not None:
        requests = requests.with_max_tokens(max_tokens[order])
    return requests


# ---------------------------------------------------------------- Azure CSV


def _csv_line_of_row(path: Path, row: int) -> int:
    """1-based file line of data row ``row`` (0-based), skipping blank lines as pandas
    does. Only called on the error path."""
    seen = -1
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if line_no == 1 or not line.strip():
                continue
            seen += 1
            if seen == row:
                return line_no
    return row + 2


_NS_FIRST = np.datetime64("1678-01-01T00:00:00")
_NS_LAST = np.datetime64("2261-12-31T23:59:59")
_OFFSET = re.compile(r":\d\d(?:\.\d+)?\s*(?:Z|[+-]\d\d(?::?\d\d)?)$")  # after the time


def _azure_stamps(path: Path, text: pd.Series) -> pd.Series:
    """The TIMESTAMP column as date-times (NaT where unreadable). Date-times with UTC
    offsets (``+01:00``, ``Z``) are compared in UTC; offsets on some rows but not others
    are refused (pandas raised "Mixed timezones detected" out of the reader)."""
    try:
        stamps = pd.to_datetime(text, format="ISO8601", errors="coerce")
    except (ValueError, OverflowError):
        with_offset = text.str.contains(_OFFSET)
        if not with_offset.all():
            row = int(np.argmax(~with_offset.to_numpy()))
            raise UserError(
                f"{path}:{_csv_line_of_row(path, row)}: TIMESTAMP {text.iloc[row]!r} has no "
                "UTC offset, but other rows have one; give every row an offset or none"
            ) from None
        stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    if isinstance(stamps.dtype, pd.DatetimeTZDtype):
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    return stamps


def _check_unique_columns(path: Path) -> None:
    """A column named twice in the header (pandas reads the first and renames the other
    ``NAME.1``: which one is the trace's is a guess) is refused."""
    import csv

    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        header = next(csv.reader(f), [])
    seen: set[str] = set()
    for name in (h.strip() for h in header):
        if name in seen:
            raise UserError(f"{path}:1: column {name!r} given twice; give each column once")
        seen.add(name)


def _read_azure(path: Path) -> Requests:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.ParserError as exc:
        # pandas says e.g. "Expected 3 fields in line 5, saw 4"
        detail = str(exc).split("C error: ")[-1].strip()
        where = re.search(r"line (\d+)", detail)
        line = f":{where.group(1)}" if where else ""
        raise UserError(f"{path}{line}: malformed CSV: {detail}") from None
    except (pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not an Azure trace CSV ({exc})") from None
    _check_unique_columns(path)
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in AZURE_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(
            f"{path}:1: missing column(s) {', '.join(missing)}; "
            f"an Azure trace needs {', '.join(AZURE_COLUMNS)}"
        )

    stamps = _azure_stamps(path, frame["TIMESTAMP"].str.strip())
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        value = frame["TIMESTAMP"].iloc[row]
        raise UserError(
            f"{path}:{_csv_line_of_row(path, row)}: TIMESTAMP {value!r} is not a date-time "
            "like 2023-11-16 18:17:03.9799600"
        )
    # Nanoseconds since 1970 hold the years 1678-2261 only: a date outside them (pandas
    # parses it at a coarser unit) wrapped around silently, giving wrong arrival times.
    native = stamps.to_numpy()
    outside = (native < _NS_FIRST) | (native > _NS_LAST)
    if outside.any():
        row = int(np.argmax(outside))
        raise UserError(
            f"{path}:{_csv_line_of_row(path, row)}: TIMESTAMP "
            f"{frame['TIMESTAMP'].iloc[row]!r} is outside the years 1678-2261"
        )
    stamp_ns = native.astype("datetime64[ns]").astype(np.int64)
    # Subtract in integer nanoseconds: epoch nanoseconds do not fit a float64 exactly.
    origin_ns = stamp_ns.min() if len(stamp_ns) else 0
    arrival_s = (stamp_ns - origin_ns).astype(np.float64) * 1e-9

    counts = []
    optional = (AZURE_MAX_TOKENS,) if AZURE_MAX_TOKENS in frame.columns else ()
    for column in AZURE_COLUMNS[1:] + optional:
        raw = frame[column]
        values = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=np.float64)
        bad = (
            ~np.isfinite(values)
            | (values < 0)
            | (values != np.floor(values))
            | (values > MAX_TOKENS)
        )
        if bad.any():
            row = int(np.argmax(bad))
            raise UserError(
                f"{path}:{_csv_line_of_row(path, row)}: {column} {raw.iloc[row]!r} "
                f"must be a non-negative integer <= {MAX_TOKENS:,}"
            )
        if column == AZURE_MAX_TOKENS and (values < 1).any():
            row = int(np.argmax(values < 1))
            raise UserError(
                f"{path}:{_csv_line_of_row(path, row)}: {column} {raw.iloc[row]!r} "
                "must be an integer >= 1"
            )
        counts.append(values.astype(np.int64))
    max_tokens = counts[2] if optional else None
    return _finish(path, arrival_s, counts[0], counts[1], None, max_tokens=max_tokens)


# ---------------------------------------------------------------- Mooncake JSONL


def mooncake_number(path: Path, line_no: int, record: dict[str, Any], key: str) -> float:
    if key not in record:
        raise UserError(f"{path}:{line_no}: missing key {key!r}; needs {', '.join(MOONCAKE_KEYS)}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{path}:{line_no}: {key} {value!r} must be a non-negative number")
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:  # math.isfinite raised OverflowError
        raise UserError(
            f"{path}:{line_no}: {key}: an integer of {len(str(abs(value)))} digits is "
            "beyond any number the trace may hold"
        )
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{path}:{line_no}: {key} {value!r} must be a non-negative number")
    return value


_FLOAT_MAX = int(sys.float_info.max)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (``json`` keeps the last silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateJsonKey(k)
        out[k] = v
    return out


class _DuplicateJsonKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def mooncake_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines trace; a line that
    is not one JSON object (invalid JSON, nested too deeply, a key given twice, an
    integer of more than 4,300 digits) is one line naming the file and line. A UTF-8
    byte-order mark is skipped, as the CSV reader does. Also read by
    :mod:`disaggsim.workload.reuse`."""
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line, object_pairs_hook=_json_object)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{line_no}: invalid JSON ({exc.msg})") from None
            except RecursionError:
                raise UserError(f"{path}:{line_no}: JSON nested too deeply") from None
            except _DuplicateJsonKey as exc:
                raise UserError(
                    f"{path}:{line_no}: key {exc.key!r} given twice in one object"
                ) from None
            except ValueError as exc:  # an integer of more than 4,300 digits
                raise UserError(
                    f"{path}:{line_no}: invalid JSON ({str(exc).split(';')[0]})"
                ) from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{line_no}: expected a JSON object per line")
            yield line_no, record


def _read_mooncake(path: Path, block_tokens: int) -> Requests:
    times_ms: list[float] = []
    prompt: list[float] = []
    output: list[float] = []
    hashes: list[list[Any]] = []
    has_hashes: bool | None = None
    max_tokens: list[float] = []
    has_max: bool | None = None
    for line_no, record in mooncake_records(path):
        times_ms.append(mooncake_number(path, line_no, record, "timestamp"))
        for key, column in (("input_length", prompt), ("output_length", output)):
            value = mooncake_number(path, line_no, record, key)
            if value != int(value) or value > MAX_TOKENS:
                raise UserError(
                    f"{path}:{line_no}: {key} {value!r} must be an integer <= {MAX_TOKENS:,}"
                )
            column.append(value)
        if has_max is None:
            has_max = "max_tokens" in record
        elif not has_max and "max_tokens" in record:
            raise UserError(
                f"{path}:{line_no}: max_tokens given, but not on the first line; give "
                "it on every line or on none"
            )
        if has_max:
            if "max_tokens" not in record:
                raise UserError(
                    f"{path}:{line_no}: missing key 'max_tokens' (present on every line "
                    "once the first line has it)"
                )
            value = mooncake_number(path, line_no, record, "max_tokens")
            if value != int(value) or value < 1:
                raise UserError(
                    f"{path}:{line_no}: max_tokens {value!r} must be an integer >= 1 "
                    "(present on every line once the first line has it)"
                )
            max_tokens.append(value)
        if has_hashes is None:
            has_hashes = "hash_ids" in record
        elif not has_hashes and "hash_ids" in record:
            raise UserError(
                f"{path}:{line_no}: hash_ids given, but not on the first line; give "
                "them on every line or on none"
            )
        if has_hashes:
            ids = record.get("hash_ids")
            if not isinstance(ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in ids
            ):
                raise UserError(
                    f"{path}:{line_no}: hash_ids must be a list of integers "
                    "(present on every line once the first line has it)"
                )
            length = int(prompt[-1])
            need = -(-length // block_tokens)
            if len(ids) != need:
                raise UserError(
                    f"{path}:{line_no}: hash_ids has {len(ids)} ids but input_length "
                    f"{length} needs ceil({length}/{block_tokens}) = {need} "
                    f"(one per {block_tokens}-token block): set workload.hash_block_tokens "
                    "to the trace's block size"
                )
            # An empty prompt is clamped to one token below: give it a block of its
            # own, shared with nothing.
            hashes.append(ids if ids else [("empty-prompt", line_no)])
    return _finish(
        path,
        np.asarray(times_ms, dtype=np.float64) * 1e-3,
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
        hashes if has_hashes else None,
        block_tokens,
        np.asarray(max_tokens, dtype=np.int64) if has_max else None,
    )


def timestamp_bucket_s(arrival_s: np.ndarray) -> float | None:
    """The bucket of a trace whose timestamps were rounded to one (most arrivals share a
    timestamp with another, and nine in ten steps between distinct timestamps are one
    bucket, within 1%), else None. The Mooncake conversation trace: 3 s."""
    distinct = np.unique(arrival_s)
    if len(distinct) < 3 or len(distinct) > 0.5 * len(arrival_s):
        return None
    steps = np.diff(distinct)
    bucket = float(np.median(steps))
    if bucket <= 0.0 or np.mean(np.abs(steps - bucket) <= 0.01 * bucket) < 0.9:
        return None
    return bucket


def spread_in_buckets(
    arrival_s: np.ndarray, bucket_s: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals of bucketed timestamps placed uniformly at random in their bucket, and
    sorted: ``(times, order)``, ``times[i]`` the spread time of row ``order[i]`` (a
    stable sort). Where within its bucket an arrival came is not recorded, and even
    spacing would invent a regularity the trace does not show."""
    spread = arrival_s + rng.uniform(0.0, bucket_s, size=len(arrival_s))
    order = np.argsort(spread, kind="stable")
    return spread[order], order
