"""Measure the shipped workload presets from the real traces and write ``presets/*.json``.

Run from the repository root::

    python -m disaggsim.workload.measure_presets --traces ../shared/data/traces \\
        --out disaggsim/workload/presets

Per trace: mean arrival rate ``(n - 1) / (last - first arrival)`` (the reciprocal of the
mean inter-arrival gap), inter-arrival coefficient of variation (population standard
deviation over mean of the gaps), the gap distribution (:func:`gap_quantiles`) and
prompt/output length quantiles (``np.quantile``, linear interpolation) at
:data:`QUANTILES`, after the trace reader's clamp of zero lengths to 1.

``--arrival-check`` prints, per trace, how the counts of arrivals in windows of 0.1 s to
5 minutes spread (index of dispersion: variance over mean of the counts) in the trace
and in the preset's arrival processes drawn over the trace's span at its rate (mean and
standard deviation over 20 draws; docs/workloads.md).

Per trace also its rate profile (arrivals per whole minute over their mean) and the gaps
left under it (:func:`modulated_gap_quantiles`), which ``arrival: modulated`` draws.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from disaggsim.errors import UserError
from disaggsim.output import check_file, json_owned, write_file
from disaggsim.workload.requests import Requests
from disaggsim.workload.traces import read_trace, spread_in_buckets, timestamp_bucket_s

PRESET_SOURCES: dict[str, str] = {
    "azure-conv-2023": "AzureLLMInferenceTrace_conv.csv",
    "azure-code-2023": "AzureLLMInferenceTrace_code.csv",
    "mooncake-conversation": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
}

QUANTILES: tuple[float, ...] = (
    0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0
)  # fmt: skip


# The gap table: every percentile, then finer into the tail, where a bursty trace's long
# gaps hold much of the mean gap.
GAP_QUANTILES: tuple[float, ...] = (
    tuple(round(i / 100, 4) for i in range(100))
    + tuple(round(0.99 + i / 1000, 4) for i in range(1, 10))
    + tuple(round(0.999 + i / 10000, 4) for i in range(1, 10))
    + (1.0,)
)


def gap_quantiles(arrival_s: np.ndarray, bucket_s: float | None) -> list[list[float]]:
    """The inter-arrival gaps' quantiles at :data:`GAP_QUANTILES` in units of the mean gap
    (each bucket's arrivals spread over it first when the timestamps are bucketed:
    :func:`~disaggsim.workload.traces.spread_in_buckets`, seed 0), rounded to 1e-6."""
    t = np.sort(arrival_s.astype(np.float64))
    if bucket_s is not None:
        t, _ = spread_in_buckets(t, bucket_s, np.random.default_rng(0))
    gaps = np.diff(t)
    qs = np.quantile(gaps / gaps.mean(), GAP_QUANTILES)
    return [[q, round(float(v), 6)] for q, v in zip(GAP_QUANTILES, qs, strict=True)]


PROFILE_PIECE_S = 60.0
"""Piece of a preset's rate profile: per-minute arrival counts."""


def rate_profile(arrival_s: np.ndarray, piece_s: float = PROFILE_PIECE_S) -> np.ndarray:
    """Arrivals in each whole ``piece_s`` from the first arrival, over their mean (a
    trailing partial piece is left out). ``arrival_s`` sorted, bucketed timestamps
    already spread."""
    t = arrival_s - arrival_s[0]
    num_pieces = int(t[-1] // piece_s)
    if num_pieces < 2:
        raise UserError(f"a rate profile needs a trace of at least {2 * piece_s:g} s")
    counts = np.bincount((t // piece_s).astype(np.int64), minlength=num_pieces + 1)
    counts = counts[:num_pieces].astype(np.float64)
    return counts / counts.mean()


def modulated_gap_quantiles(
    arrival_s: np.ndarray, profile: np.ndarray, piece_s: float = PROFILE_PIECE_S
) -> list[list[float]]:
    """The gaps left once the rate profile is taken out: each arrival in the whole pieces
    mapped to ``M(t)``, the integral of the profile from the first arrival (so every
    piece holds its arrivals at the mean rate), and the gaps of those times measured as
    :func:`gap_quantiles` measures the trace's. ``arrival_s`` sorted, bucketed timestamps
    already spread."""
    t = arrival_s - arrival_s[0]
    t = t[t < len(profile) * piece_s]
    m = profile / profile.mean()
    knots = np.concatenate(([0.0], np.cumsum(m))) * piece_s  # M at each piece's start
    return gap_quantiles(np.interp(t, np.arange(len(m) + 1) * piece_s, knots), None)


def _quantiles(values: np.ndarray) -> list[list[float]]:
    qs = np.quantile(values.astype(np.float64), QUANTILES)
    return [[q, round(float(v), 2)] for q, v in zip(QUANTILES, qs, strict=True)]


def measure(requests: Requests) -> dict[str, Any]:
    """Arrival and length statistics of one trace (JSON-ready, rounded)."""
    gaps_s = np.diff(requests.arrival_s)
    duration_s = float(requests.arrival_s[-1] - requests.arrival_s[0])
    bucket_s = timestamp_bucket_s(requests.arrival_s)
    spread = np.sort(requests.arrival_s.astype(np.float64))
    if bucket_s is not None:
        spread, _ = spread_in_buckets(spread, bucket_s, np.random.default_rng(0))
    profile = np.round(rate_profile(spread), 6)  # as written, as drawn from
    return {
        "duration_s": round(duration_s, 6),
        "mean_rate_per_s": round(1.0 / float(gaps_s.mean()), 6),
        "interarrival_cv": round(float(gaps_s.std() / gaps_s.mean()), 6),
        "interarrival_bucket_s": None if bucket_s is None else round(bucket_s, 6),
        "interarrival_gap_quantiles": gap_quantiles(requests.arrival_s, bucket_s),
        "rate_profile_piece_s": PROFILE_PIECE_S,
        "rate_profile": [float(m) for m in profile],
        "modulated_gap_quantiles": modulated_gap_quantiles(spread, profile),
        "prompt_tokens_quantiles": _quantiles(requests.prompt_tokens),
        "output_tokens_quantiles": _quantiles(requests.output_tokens),
    }


def _to_json(record: dict[str, Any]) -> str:
    """Indented JSON with each innermost list (a ``[q, tokens]`` pair) on one line."""
    text = json.dumps(record, indent=2)
    return (
        re.sub(
            r"\[\s+([^\[\]]+?)\s+\]",
            lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
            text,
        )
        + "\n"
    )


def _write_text(text: str, path: Path) -> None:
    path.write_text(text)


# A preset file this module wrote (the only kind it replaces).
PRESET_OWNED = json_owned("name", "source_file", "source_rows", "command")


def measure_presets(traces_dir: Path, out_dir: Path, command: str) -> list[Path]:
    """Measure every preset's source trace in ``traces_dir``; write ``out_dir/<name>.json``."""
    for name in PRESET_SOURCES:  # before measuring: every preset file can be written
        check_file(out_dir / f"{name}.json", "--out", PRESET_OWNED, "preset")
    written = []
    for name, source in PRESET_SOURCES.items():
        requests = read_trace(traces_dir / source)
        record = {
            "name": name,
            "source_file": source,
            "source_rows": len(requests),
            "command": command,
            **measure(requests),
        }
        path = out_dir / f"{name}.json"
        write_file(path, partial(_write_text, _to_json(record)), "--out", PRESET_OWNED, "preset")
        written.append(path)
    return written


CHECK_WINDOWS_S: tuple[float, ...] = (0.1, 1.0, 10.0, 60.0, 300.0)
CHECK_SEEDS = 20
"""Draws of each process averaged in the check (one hour of a trace holds only ~58
windows of 60 s: one draw's index of dispersion varies by up to a fifth)."""
CHECK_PROCESSES: tuple[str, ...] = ("empirical", "modulated", "gamma", "poisson")


def _dispersion(arrival_s: np.ndarray, span_s: float, window_s: float) -> float:
    """Variance over mean of the counts of arrivals in the whole windows of ``[0, span_s)``."""
    n_windows = int(span_s // window_s)
    idx = (arrival_s // window_s).astype(np.int64)
    counts = np.bincount(idx[idx < n_windows], minlength=n_windows)
    return float(counts.var() / counts.mean())


def _draw(process: str, preset: Any, span_s: float, seed: int) -> np.ndarray:
    """One draw of a preset's arrival process over ``span_s`` at its measured rate, as
    :func:`~disaggsim.workload.generate.generate_requests` draws it, from
    ``numpy.random.default_rng(seed)`` (``modulated`` takes its phase from it first)."""
    from disaggsim.workload.arrivals import arrival_times
    from disaggsim.workload.generate import preset_arrivals

    rng = np.random.default_rng(seed)
    schedule, process, gaps = preset_arrivals(preset, process, preset.mean_rate_per_s, rng)
    return arrival_times(
        rng,
        schedule=schedule,
        process=process,
        cv=preset.interarrival_cv,
        duration_s=span_s,
        gap_quantiles=gaps,
    )


def arrival_check(traces_dir: Path, seeds: int = CHECK_SEEDS) -> list[str]:
    """Markdown rows: per preset, the index of dispersion of arrival counts in windows of
    :data:`CHECK_WINDOWS_S` in the trace and, as mean ± standard deviation over draws
    with seeds ``0 .. seeds - 1``, in the trace's gaps shuffled (``permutation``; a
    bucketed trace's after spreading its arrivals within their buckets, seed 0) and in
    the preset's arrival processes run over the trace's span at its mean rate. ``-``: a window under two timestamp buckets of a bucketed
    trace, or one the span holds fewer than ten times."""
    from disaggsim.workload.presets import load_preset

    head = " | ".join(f"{w:g} s" for w in CHECK_WINDOWS_S)
    rows = [
        f"| preset | arrivals | {head} |",
        "|---|---|" + "---|" * len(CHECK_WINDOWS_S),
    ]
    for name, source in PRESET_SOURCES.items():
        t = np.sort(read_trace(traces_dir / source).arrival_s.astype(np.float64))
        t = t - t[0]
        span_s = float(t[-1])
        preset = load_preset(name)
        bucket_s = timestamp_bucket_s(t)
        shown = [
            not (bucket_s is not None and w < 2 * bucket_s) and span_s // w >= 10
            for w in CHECK_WINDOWS_S
        ]

        def cells(values: list[list[float]], shown: list[bool] = shown) -> str:
            out = []
            for ok, v in zip(shown, np.array(values).T, strict=True):
                if not ok:
                    out.append("-")
                elif len(v) == 1:
                    out.append(f"{v[0]:.2f}")
                else:
                    out.append(f"{v.mean():.2f} ± {v.std():.2f}")
            return " | ".join(out)

        rows.append(
            f"| `{name}` | trace | "
            + cells([[_dispersion(t, span_s, w) for w in CHECK_WINDOWS_S]])
            + " |"
        )
        # The trace's own gaps in random order: an i.i.d. renewal with exactly its gaps,
        # so what it lacks against the trace comes from the order of the gaps (of a
        # bucketed trace, the gaps after the spread the preset was measured on).
        spread = (
            t if bucket_s is None else spread_in_buckets(t, bucket_s, np.random.default_rng(0))[0]
        )
        gaps = np.diff(spread)
        shuffled = [
            np.concatenate(([0.0], np.cumsum(np.random.default_rng(s).permutation(gaps))))
            for s in range(seeds)
        ]
        rows.append(
            f"| `{name}` | trace, gaps shuffled | "
            + cells([[_dispersion(x, span_s, w) for w in CHECK_WINDOWS_S] for x in shuffled])
            + " |"
        )
        for process in CHECK_PROCESSES:
            draws = [
                [_dispersion(_draw(process, preset, span_s, s), span_s, w) for w in CHECK_WINDOWS_S]
                for s in range(seeds)
            ]
            what = process if process != "gamma" else f"gamma (CV {preset.interarrival_cv:.2f})"
            rows.append(f"| `{name}` | {what} | " + cells(draws) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disaggsim.workload.measure_presets", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--traces", type=Path, required=True, help="folder with the traces")
    parser.add_argument("--out", type=Path, help="folder for <preset>.json")
    parser.add_argument(
        "--arrival-check",
        action="store_true",
        help="print how arrival counts spread in the traces and in the presets' processes",
    )
    args = parser.parse_args(argv)
    if args.arrival_check:
        try:
            print("\n".join(arrival_check(args.traces)))
        except UserError as exc:
            print(f"measure_presets: error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.out is None:
        parser.error("--out is required (or --arrival-check)")
    command = (
        f"python -m disaggsim.workload.measure_presets --traces {args.traces} --out {args.out}"
    )
    try:
        written = measure_presets(args.traces, args.out, command)
    except UserError as exc:
        print(f"measure_presets: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
