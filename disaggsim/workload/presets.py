"""Shipped workload presets: arrival and length statistics measured from real traces.

Each preset is a JSON file in ``presets/`` written by ``measure_presets.py`` (the file
records the source trace, its row count and the command). Loading needs no trace file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import get_args

from disaggsim.errors import UserError
from disaggsim.workload.config import PresetName

PRESET_NAMES: tuple[str, ...] = get_args(PresetName)


@dataclass(frozen=True, slots=True)
class Preset:
    """Statistics of one trace. Quantiles are ``((q, tokens), ...)`` from q=0 to q=1."""

    name: str
    source_file: str
    source_rows: int
    command: str
    duration_s: float
    mean_rate_per_s: float
    interarrival_cv: float
    interarrival_bucket_s: float | None
    """The trace's timestamp bucket when its arrivals share bucketed timestamps (the
    gaps below were measured with each bucket's arrivals spread evenly over it)."""
    interarrival_gap_quantiles: tuple[tuple[float, float], ...]
    """``((q, gap / mean gap), ...)``: the gap distribution ``arrival: empirical`` draws."""
    rate_profile_piece_s: float
    """Length of one piece of :attr:`rate_profile` (60 s: per-minute counts)."""
    rate_profile: tuple[float, ...]
    """The trace's arrivals in each whole piece over their mean: the rate
    ``arrival: modulated`` follows (from a random piece, repeated)."""
    modulated_gap_quantiles: tuple[tuple[float, float], ...]
    """``((q, gap / mean gap), ...)``: the gaps ``arrival: modulated`` draws, measured
    after dividing the trace's time by its rate profile (the gaps the profile leaves)."""
    prompt_tokens_quantiles: tuple[tuple[float, float], ...]
    output_tokens_quantiles: tuple[tuple[float, float], ...]


def load_preset(name: str) -> Preset:
    """Read the shipped preset ``name`` (one of :data:`PRESET_NAMES`)."""
    if name not in PRESET_NAMES:
        raise UserError(f"unknown workload preset {name!r}; allowed: {', '.join(PRESET_NAMES)}")
    text = resources.files("disaggsim.workload").joinpath("presets", f"{name}.json").read_text()
    data = json.loads(text)
    return Preset(
        name=data["name"],
        source_file=data["source_file"],
        source_rows=int(data["source_rows"]),
        command=data["command"],
        duration_s=float(data["duration_s"]),
        mean_rate_per_s=float(data["mean_rate_per_s"]),
        interarrival_cv=float(data["interarrival_cv"]),
        interarrival_bucket_s=None
        if data["interarrival_bucket_s"] is None
        else float(data["interarrival_bucket_s"]),
        interarrival_gap_quantiles=tuple(
            (float(q), float(v)) for q, v in data["interarrival_gap_quantiles"]
        ),
        rate_profile_piece_s=float(data["rate_profile_piece_s"]),
        rate_profile=tuple(float(m) for m in data["rate_profile"]),
        modulated_gap_quantiles=tuple(
            (float(q), float(v)) for q, v in data["modulated_gap_quantiles"]
        ),
        prompt_tokens_quantiles=tuple(
            (float(q), float(v)) for q, v in data["prompt_tokens_quantiles"]
        ),
        output_tokens_quantiles=tuple(
            (float(q), float(v)) for q, v in data["output_tokens_quantiles"]
        ),
    )
