"""The grouped-GEMM fits are determined: a parameter the fitted rows cannot tell is held by
a stated rule (calibration/fit_moe.py, ``fit_grouped_gemm``), so a refit from other
starting points lands on the same parameters; a fit without the rules does not."""

from __future__ import annotations

import numpy as np
import pytest

from calibration import fit_moe as fm
from calibration.fit import _least_squares_log
from disaggsim.costmodel.moe_params import load_moe_params

# the sets whose solver stop followed the start or the CPU before the rules (TensorRT-LLM
# mxfp4, vLLM bf16, SGLang mxfp4) and SGLang's tuned-tile sets (few shapes)
SETS = [("trtllm", "mxfp4", False), ("vllm", "bf16", False), ("sglang", "mxfp4", False),
        ("sglang", "bf16", True), ("sglang", "fp8-block", True)]  # fmt: skip
# each start scaled by its own factor: every parameter starts elsewhere
SCALE = (0.6, 1.7, 1.5, 0.7, 1.3, 0.8)
RTOL = 1e-4  # the shipped file keeps 5 significant digits


@pytest.fixture(scope="module")
def moe(moe_tables):
    return moe_tables.moe  # tests/conftest.py: the rows of calibration.fit_moe.moe_rows


def _moved(starts):
    return [np.asarray(s, float) * f for s, f in zip(starts, SCALE, strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize(("fw", "dt", "tuned"), SETS)
def test_a_refit_from_other_starts_gives_the_shipped_parameters(moe, fw, dt, tuned) -> None:
    d = fm.fitted_rows(moe, fw, dt, tuned)
    x, _, held = fm.fit_grouped_gemm(d, held_out=False)
    y, _, held_y = fm.fit_grouped_gemm(d, starts=_moved(fm.GG_STARTS), held_out=False)
    assert held == held_y
    np.testing.assert_allclose(y, x, rtol=RTOL, atol=0.0)
    p = load_moe_params("h100-sxm").gemm(dt, fw, tuned)
    shipped = np.array([getattr(p, k) for k in fm.GG_KEYS])
    np.testing.assert_allclose(x, shipped, rtol=RTOL, atol=0.0)
    for k, v in held.items():  # a held parameter is its rule's value in the file
        assert getattr(p, k) == fm.HELD_VALUE[k] == v


def test_the_check_fails_a_fit_that_follows_its_start(moe) -> None:
    """The same comparison on SGLang's mxfp4 rows fitted without the rules (all seven
    parameters free, the solver as before 2026-12-03): two starts, two answers."""
    d = fm.fitted_rows(moe, "sglang", "mxfp4")
    meas, idx = d.meas_s.to_numpy(), np.arange(len(d))

    def model(x, i):
        return fm._gg(fm.GroupedGemmParams(*x), d.iloc[i])

    a = _least_squares_log(model, idx, meas, [fm.GG_STARTS[0]], fm.GG_LOWER, fm.GG_UPPER)
    b = _least_squares_log(model, idx, meas, _moved(fm.GG_STARTS)[:1], fm.GG_LOWER, fm.GG_UPPER)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=0.0)


def test_the_rules_hold_what_the_rows_cannot_tell(moe) -> None:
    # SGLang's mxfp4 rows: no row's time is its weight stream (mem_eff held at the peak) and
    # the narrow-shard and per-expert terms change no error by 0.1 point (left out)
    d = fm.fitted_rows(moe, "sglang", "mxfp4")
    _, _, held = fm.fit_grouped_gemm(d, held_out=False)
    assert held == {"mem_eff": 1.0, "width_half_sat": 0.0, "expert_s": 0.0}
    # TensorRT-LLM's bf16 rows (wide and narrow shards, 128-expert shapes) need every term
    d = fm.fitted_rows(moe, "trtllm", "bf16")
    d = d[d.family.isin(sorted(set(d.family))[:4])]  # four shape families: quick
    x, _, held = fm.fit_grouped_gemm(d, held_out=False)
    assert "mem_eff" not in held and fm._weight_stream_binds(d.reset_index(drop=True), x)
