"""The ``autoscale:`` config: shapes, one-line validation errors naming the field,
cross-checks with the pools, cold start, summary helpers, docs examples, public API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

import disaggsim.autoscale as autoscale
from disaggsim.autoscale import (
    AutoscaleConfig,
    PoolAutoscaleConfig,
    check_against_pools,
    choose_to_drain,
    cold_start_s,
    decode_step_fn,
    gpu_hours,
    prefill_tokens_per_s,
    time_average,
)

POOL = {"min_workers": 1, "max_workers": 4, "policy": "slo"}


def pool(**fields: Any) -> dict[str, Any]:
    return {**POOL, **fields}


def test_public_api() -> None:
    for name in autoscale.__all__:
        assert hasattr(autoscale, name)
    assert "Autoscaler" in autoscale.__all__ and "PoolSignals" in autoscale.__all__


def test_defaults_and_frozen() -> None:
    cfg = PoolAutoscaleConfig.model_validate(POOL)
    assert (cfg.interval_s, cfg.slo.margin, cfg.scale_down_stabilization_s) == (15.0, 0.8, 300.0)
    assert (cfg.provision_s, cfg.weights_load_bytes_per_s) == (30.0, 5e9)
    with pytest.raises(ValidationError):
        cfg.min_workers = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (pool(min_workers=5), "min_workers (5) must be <= max_workers (4)"),
        (pool(min_workers=0), "greater than or equal to 1"),
        (pool(interval_s=0), "greater than 0"),
        (pool(policy="target"), "policy target needs a target section"),
        (pool(policy="pid"), "'target' or 'slo'"),
        (pool(policy="target", target={"signal": "cpu", "target_value": 1}), "'queue_depth'"),
        (pool(policy="target", target={"signal": "kv_util", "target_value": 0}), "greater than 0"),
        (pool(slo={"margin": 1.5}), "less than or equal to 1"),
        (pool(max_step_up=0), "greater than or equal to 1"),
        (pool(weights_load_gb_per_s=0), "greater than 0"),
        (pool(scale_down_stabilization_s=-1), "greater than or equal to 0"),
        (pool(intervall_s=3), "Extra inputs are not permitted"),
    ],
)
def test_validation_errors(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as err:
        PoolAutoscaleConfig.model_validate(data)
    assert words in str(err.value)
    first = err.value.errors()[0]["msg"]
    assert "\n" not in first


def test_check_against_pools() -> None:
    cfg = AutoscaleConfig.model_validate({"prefill": POOL, "decode": pool(max_workers=8)})
    check_against_pools(cfg, "disaggregated", {"prefill": 2, "decode": 8})
    with pytest.raises(ValueError, match=r"decode_pool.num_workers \(9\) must lie in autoscale"):
        check_against_pools(cfg, "disaggregated", {"prefill": 2, "decode": 9})
    with pytest.raises(ValueError, match="autoscale.prefill: architecture colocated has no"):
        check_against_pools(cfg, "colocated", {"colocated": 2})
    colo = AutoscaleConfig.model_validate({"colocated": POOL})
    with pytest.raises(ValueError, match=r"^pool.num_workers \(6\)"):
        check_against_pools(colo, "colocated", {"colocated": 6})


def test_cold_start_by_hand() -> None:
    # Llama-3-70B bf16 on TP 4: ~35.3e9 bytes per GPU; 30 s + 35.3e9 / 5e9 = 37.06 s.
    cfg = PoolAutoscaleConfig.model_validate(POOL)
    assert cold_start_s(35.3e9, cfg) == pytest.approx(37.06)
    fast = PoolAutoscaleConfig.model_validate(pool(provision_s=0, weights_load_gb_per_s=20))
    assert cold_start_s(16e9, fast) == pytest.approx(0.8)


class _Const:
    """Prefill 1 ms + 0.1 µs per token; decode 5 ms + 0.2 ms per sequence + 1 ns/token."""

    def prefill_time_s(self, num_seqs: int, new_tokens: int, attn_pairs: float) -> float:
        return 1e-3 + 1e-7 * new_tokens

    def decode_coeffs(self, batch: int) -> tuple[float, float]:
        return (5e-3 + 2e-4 * batch, 1e-9)


def test_cost_inputs_by_hand() -> None:
    # 8192 // 1000 = 8 prompts, 8000 tokens in 1 ms + 0.8 ms: 8000 / 1.8e-3 tokens/s.
    tps = prefill_tokens_per_s(_Const(), max_batch_tokens=8192, prompt_tokens=1000)
    assert tps == pytest.approx(8000 / 1.8e-3)
    # A prompt longer than the budget still runs alone: 20000 / 3 ms.
    assert prefill_tokens_per_s(_Const(), max_batch_tokens=8192, prompt_tokens=20_000) == (
        pytest.approx(20_000 / 3e-3)
    )
    step = decode_step_fn(_Const())
    assert step(10, 1e6) == pytest.approx(5e-3 + 2e-3 + 1e-3)
    # A second line (decode_item_coeffs, e.g. an eager engine's launch floor) counts
    # where it is longer, as the engine times the step: 9 ms flat against 7 ms + 1 ns/token.
    step2 = decode_step_fn(_TwoLines())
    assert step2(10, 1e6) == pytest.approx(9e-3)
    assert step2(10, 3e6) == pytest.approx(5e-3 + 2e-3 + 3e-3)


class _TwoLines(_Const):
    def decode_item_coeffs(self, batch: int) -> tuple[float, float]:
        return (9e-3, 0.0)


def test_summary_helpers_by_hand() -> None:
    # 2 workers on [0, 100), 5 on [100, 160), 3 on [160, 200): (200 + 300 + 120) / 200.
    assert time_average([0, 100, 160], [2, 5, 3], 200.0) == pytest.approx(3.1)
    assert time_average([0, 100, 260], [2, 5, 3], 200.0) == pytest.approx(3.5)  # ends at 200
    with pytest.raises(ValueError, match="sorted"):
        time_average([0, 10, 5], [1, 2, 3], 20.0)
    # 4 GPUs for 1800 s + 8 GPUs from 900 s, never released, to 3600 s: 2 + 6 GPU-hours.
    assert gpu_hours([0, 900], [1800, float("inf")], [4, 8], 3600.0) == pytest.approx(8.0)
    assert choose_to_drain([(0, 50.0), (1, 10.0), (2, 10.0), (3, 99.0)], 2) == (2, 1)
    assert choose_to_drain([(0, 1.0)], 0) == ()


def test_docs_yaml_examples_validate() -> None:
    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "autoscaling.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    sections = [b["autoscale"] for b in blocks if isinstance(b, dict) and "autoscale" in b]
    assert len(sections) >= 2
    for section in sections:
        AutoscaleConfig.model_validate(section)
