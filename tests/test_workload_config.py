"""The ``workload:`` config models: accepted shapes, clear validation errors, public API."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

import disaggsim.workload as workload
from disaggsim.workload import (
    PRESET_NAMES,
    PresetWorkload,
    SyntheticWorkload,
    TraceWorkload,
    WorkloadConfig,
    generate_requests,
)
from disaggsim.workload.config import PresetName

ADAPTER = TypeAdapter(WorkloadConfig)
FIXED = {"dist": "fixed", "value": 10}


def synthetic(**fields: Any) -> dict[str, Any]:
    return {"kind": "synthetic", "prompt_tokens": FIXED, "output_tokens": FIXED, **fields}


def error_text(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as err:
        ADAPTER.validate_python(data)
    return str(err.value)


def test_public_api() -> None:
    assert sorted(workload.__all__) == sorted(
        [
            "WorkloadConfig",
            "SyntheticWorkload",
            "PresetWorkload",
            "TraceWorkload",
            "SessionWorkload",
            "generate_requests",
            "Requests",
            "PRESET_NAMES",
            "read_trace",
        ]
    )
    for name in workload.__all__:
        assert hasattr(workload, name)
    assert PRESET_NAMES == get_args(PresetName)
    assert {"azure-conv-2023", "azure-code-2023", "mooncake-conversation"} <= set(PRESET_NAMES)


def test_each_kind_validates_and_is_frozen() -> None:
    s = ADAPTER.validate_python(
        synthetic(rate_per_s=4, arrival="gamma", burstiness_cv=2, num_requests=10)
    )
    p = ADAPTER.validate_python({"kind": "preset", "preset": "azure-conv-2023"})
    t = ADAPTER.validate_python({"kind": "trace", "path": "x.csv", "rate_scale": 2})
    assert isinstance(s, SyntheticWorkload)
    assert isinstance(p, PresetWorkload) and isinstance(t, TraceWorkload)
    with pytest.raises(ValidationError):
        s.rate_per_s = 5  # type: ignore[misc]


def test_every_kind_accepts_rate_per_s() -> None:
    for data in (
        synthetic(rate_per_s=4),
        {"kind": "preset", "preset": "azure-code-2023", "rate_per_s": 4},
        {"kind": "trace", "path": "x.jsonl", "rate_per_s": 4},
    ):
        assert ADAPTER.validate_python(data).rate_per_s == 4


def test_embeds_as_a_pydantic_field() -> None:
    class Scenario(BaseModel):
        workload: WorkloadConfig

    s = Scenario.model_validate({"workload": {"kind": "preset", "preset": "azure-conv-2023"}})
    assert isinstance(s.workload, PresetWorkload)
    again = Scenario.model_validate(s.model_dump())
    assert again == s


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (synthetic(rate_per_s=-1), "greater than 0"),
        (synthetic(rate_per_s=0), "greater than 0"),
        (synthetic(), "exactly one of rate_per_s, rate_schedule or rate_shape, got none"),
        (synthetic(rate_per_s=1, rate_schedule=[[0, 1]]), "exactly one of"),
        (synthetic(rate_per_s=1, burstiness_cv=2), "burstiness_cv applies only to arrival: gamma"),
        (synthetic(rate_per_s=1, arrival="weibull"), "'poisson' or 'gamma'"),
        (synthetic(rate_per_s=1, rate_typo=3), "Extra inputs are not permitted"),
        (
            synthetic(rate_per_s=1, prompt_tokens={"dist": "uniform", "low": 9, "high": 3}),
            "low <= high, got low=9 > high=3",
        ),
        (
            synthetic(rate_per_s=1, prompt_tokens={"dist": "zipf", "value": 3}),
            "'fixed', 'uniform', 'lognormal', 'empirical'",
        ),
        (
            synthetic(rate_per_s=1, prompt_tokens={"dist": "fixed", "value": 0}),
            "greater than or equal to 1",
        ),
        (
            synthetic(
                rate_per_s=1,
                prompt_tokens={"dist": "lognormal", "median": 100, "sigma": 1, "min": 50, "max": 10},
            ),
            "min <= max",
        ),
        (
            synthetic(
                rate_per_s=1,
                output_tokens={"dist": "empirical", "quantiles": [[0, 1], [0.5, 9], [0.4, 10], [1, 20]]},
            ),
            "q must be strictly increasing, got 0.5 then 0.4",
        ),
        (
            synthetic(
                rate_per_s=1,
                output_tokens={"dist": "empirical", "quantiles": [[0, 1], [0.5, 9], [1, 5]]},
            ),
            "values must be non-decreasing",
        ),
        (
            synthetic(
                rate_per_s=1, output_tokens={"dist": "empirical", "quantiles": [[0.1, 1], [1, 5]]}
            ),
            "start at q=0 and end at q=1",
        ),
        (synthetic(rate_schedule=[[5, 1]]), "must start at t_s=0"),
        (synthetic(rate_schedule=[[0, 1], [10, 2], [10, 3]]), "strictly increasing"),
        (synthetic(rate_schedule=[[0, 0]]), "at least one rate_per_s > 0"),
        (synthetic(rate_schedule=[[0, 1], [3, -2]]), "finite and >= 0"),
        (
            {"kind": "preset", "preset": "azure-chat-2099"},
            "'azure-conv-2023', 'azure-code-2023', 'mooncake-conversation'",
        ),
        ({"kind": "preset", "preset": "azure-conv-2023", "rate_per_s": -3}, "greater than 0"),
        (
            {"kind": "preset", "preset": "azure-conv-2023", "arrival": "poisson", "burstiness_cv": 3},
            "burstiness_cv applies only",
        ),
        ({"kind": "trace", "path": "x.csv", "rate_scale": 2, "rate_per_s": 3}, "not both"),
        ({"kind": "trace", "path": "x.csv", "format": "parquet"}, "'azure', 'mooncake' or 'auto'"),
        ({"kind": "trace", "path": "x.csv", "start_s": -1}, "greater than or equal to 0"),
        ({"kind": "replay", "path": "x.csv"}, "'synthetic', 'preset', 'trace'"),
    ],
)  # fmt: skip
def test_validation_errors(data: dict[str, Any], words: str) -> None:
    assert words in error_text(data)


def test_docs_yaml_examples_validate_and_generate() -> None:
    root = Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```yaml\n(.*?)```", (root / "docs" / "workloads.md").read_text(), re.S)
    kinds = set()
    for block in blocks:
        cfg = ADAPTER.validate_python(yaml.safe_load(block)["workload"])
        kinds.add(cfg.kind)
        if isinstance(cfg, TraceWorkload):
            continue  # needs ../shared/data; trace replay is tested in test_workload_traces
        r = generate_requests(cfg, duration_s=60, seed=0)
        assert len(r) > 0 and math.isfinite(r.arrival_s[-1])
    assert kinds == {"synthetic", "preset", "trace", "sessions"}


@pytest.mark.parametrize(
    ("spec", "smallest", "largest"),
    [
        ({"dist": "fixed", "value": 128}, 128, 128),
        ({"dist": "uniform", "low": 5, "high": 900}, 5, 900),
        ({"dist": "lognormal", "median": 500, "sigma": 1.0, "min": 3, "max": 4000}, 3, 4000),
        ({"dist": "lognormal", "median": 500, "sigma": 1.0}, 1, None),  # no upper clip
        ({"dist": "empirical", "quantiles": [[0, 2.5], [0.5, 40], [1, 8191.6]]}, 2, 8192),
        ({"dist": "empirical", "quantiles": [[0, 1.2], [1, 3.5]]}, 1, 4),
    ],
)
def test_a_length_distribution_knows_the_lengths_it_can_draw(spec, smallest, largest) -> None:
    """The ends a draw can take (validity's longest prompt, autoscale notes' shortest):
    empirical values round as a draw does (to the nearest integer, ties to even)."""
    from disaggsim.workload.config import LengthDistribution

    d = TypeAdapter(LengthDistribution).validate_python(spec)
    assert (d.smallest, d.largest) == (smallest, largest)
