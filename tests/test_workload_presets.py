"""Shipped presets: load without traces, drive generation, and are reproduced by the
measurement script from the real traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter

import disaggsim.workload.generate as generate_module
from disaggsim.errors import UserError
from disaggsim.workload import PRESET_NAMES, WorkloadConfig, generate_requests
from disaggsim.workload.measure_presets import PRESET_SOURCES, QUANTILES, main
from disaggsim.workload.presets import load_preset

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
SHIPPED = Path(__file__).resolve().parents[1] / "disaggsim" / "workload" / "presets"
ADAPTER = TypeAdapter(WorkloadConfig)
ROWS = {  # ../shared/data/README.md
    "azure-conv-2023": 19_366,
    "azure-code-2023": 8_819,
    "mooncake-conversation": 12_031,
    "mooncake-synthetic": 3_993,
}


def _no_traces(*args: object, **kwargs: object) -> None:
    raise AssertionError("a preset must not read a trace file")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_presets_load_and_generate_without_traces(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generate_module, "read_trace", _no_traces)
    preset = load_preset(name)
    assert preset.source_file == PRESET_SOURCES[name]
    assert preset.source_rows == ROWS[name]
    assert tuple(q for q, _ in preset.prompt_tokens_quantiles) == QUANTILES
    assert "measure_presets" in preset.command
    cfg = ADAPTER.validate_python({"kind": "preset", "preset": name, "num_requests": 2000})
    r = generate_requests(cfg, duration_s=math.inf, seed=1)
    assert len(r) == 2000
    lo, hi = preset.prompt_tokens_quantiles[0][1], preset.prompt_tokens_quantiles[-1][1]
    assert r.prompt_tokens.min() >= round(lo) and r.prompt_tokens.max() <= round(hi)


def test_unknown_preset_lists_the_allowed_ones() -> None:
    with pytest.raises(UserError, match="allowed: azure-conv-2023, azure-code-2023"):
        load_preset("nope")


def test_preset_rate_cv_and_median_follow_the_measurements() -> None:
    preset = load_preset("azure-conv-2023")
    cfg = ADAPTER.validate_python({"kind": "preset", "preset": "azure-conv-2023"})
    r = generate_requests(cfg, duration_s=4000, seed=2)
    expected = preset.mean_rate_per_s * 4000
    # renewal count (empirical gaps, the default): sd ~ cv * sqrt(n)
    assert abs(len(r) - expected) < 5 * preset.interarrival_cv * math.sqrt(expected)
    gaps = np.diff(r.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(preset.interarrival_cv, rel=0.1)
    median = dict(preset.output_tokens_quantiles)[0.5]
    assert np.mean(r.output_tokens <= median) == pytest.approx(0.5, abs=0.03)


def test_preset_overrides() -> None:
    cfg = ADAPTER.validate_python(
        {
            "kind": "preset",
            "preset": "mooncake-conversation",
            "rate_per_s": 20,
            "arrival": "poisson",
            "max_prompt_tokens": 8192,
            "max_output_tokens": 100,
        }
    )
    r = generate_requests(cfg, duration_s=1000, seed=0)
    assert abs(len(r) - 20_000) < 5 * math.sqrt(20_000)
    gaps = np.diff(r.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert r.prompt_tokens.max() == 8192 and r.output_tokens.max() == 100


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found at {TRACES}")
def test_measure_presets_reproduces_the_shipped_files(tmp_path: Path) -> None:
    assert main(["--traces", str(TRACES), "--out", str(tmp_path)]) == 0
    for name in PRESET_NAMES:
        fresh = json.loads((tmp_path / f"{name}.json").read_text())
        shipped = json.loads((SHIPPED / f"{name}.json").read_text())
        assert fresh.pop("command") != shipped.pop("command")  # tmp path vs repo path
        assert fresh == shipped
    # spot check against an independent computation on the raw file
    lines = (TRACES / "AzureLLMInferenceTrace_conv.csv").read_text().splitlines()[1:]
    outputs = np.array([int(line.split(",")[2]) for line in lines])
    shipped = json.loads((SHIPPED / "azure-conv-2023.json").read_text())
    assert dict(map(tuple, shipped["output_tokens_quantiles"]))[0.5] == np.median(outputs)


def test_measure_presets_missing_folder_exits_2(tmp_path: Path) -> None:
    assert main(["--traces", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2


DOCS = Path(__file__).resolve().parents[1] / "docs" / "workloads.md"


def test_docs_table_matches_the_shipped_presets() -> None:
    text = DOCS.read_text()
    for name in PRESET_NAMES:
        d = json.loads((SHIPPED / f"{name}.json").read_text())
        p = dict(map(tuple, d["prompt_tokens_quantiles"]))
        o = dict(map(tuple, d["output_tokens_quantiles"]))
        row = (
            f"| `{name}` | `{d['source_file']}` | {d['source_rows']:,} | {d['duration_s']:.1f} "
            f"| {d['mean_rate_per_s']:.3f} | {d['interarrival_cv']:.3f} "
            f"| {p[0.5]:g} / {p[0.9]:g} / {p[0.99]:g} / {p[1.0]:g} "
            f"| {o[0.5]:g} / {o[0.9]:g} / {o[0.99]:g} / {o[1.0]:g} |"
        )
        assert row in text, row
