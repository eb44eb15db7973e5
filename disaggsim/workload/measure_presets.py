"""Measure the shipped workload presets from the real traces and write ``presets/*.json``.

Run from the repository root::

    python -m disaggsim.workload.measure_presets --traces ../shared/data/traces \\
        --out disaggsim/workload/presets

Per trace: mean arrival rate ``(n - 1) / (last - first arrival)`` (the reciprocal of the
mean inter-arrival gap), inter-arrival coefficient of variation (population standard
deviation over mean of the gaps) and prompt/output length quantiles (``np.quantile``,
linear interpolation) at :data:`QUANTILES`, after the trace reader's clamp of zero
lengths to 1.
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
from disaggsim.workload.traces import read_trace

PRESET_SOURCES: dict[str, str] = {
    "azure-conv-2023": "AzureLLMInferenceTrace_conv.csv",
    "azure-code-2023": "AzureLLMInferenceTrace_code.csv",
    "mooncake-conversation": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
}

QUANTILES: tuple[float, ...] = (
    0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0
)  # fmt: skip


def _quantiles(values: np.ndarray) -> list[list[float]]:
    qs = np.quantile(values.astype(np.float64), QUANTILES)
    return [[q, round(float(v), 2)] for q, v in zip(QUANTILES, qs, strict=True)]


def measure(requests: Requests) -> dict[str, Any]:
    """Arrival and length statistics of one trace (JSON-ready, rounded)."""
    gaps_s = np.diff(requests.arrival_s)
    duration_s = float(requests.arrival_s[-1] - requests.arrival_s[0])
    return {
        "duration_s": round(duration_s, 6),
        "mean_rate_per_s": round(1.0 / float(gaps_s.mean()), 6),
        "interarrival_cv": round(float(gaps_s.std() / gaps_s.mean()), 6),
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disaggsim.workload.measure_presets", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--traces", type=Path, required=True, help="folder with the traces")
    parser.add_argument("--out", type=Path, required=True, help="folder for <preset>.json")
    args = parser.parse_args(argv)
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
