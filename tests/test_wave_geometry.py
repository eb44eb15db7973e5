"""The wave decode kernels' split geometry, computed once (ops.decode_wave_geometry).

The calibration fitter prices a multi-block wave kernel from split counts and waves it
computes once per set of rows (they do not depend on the fitted rates) and reuses at every
parameter vector. Calibration and prediction must not drift apart: its times must equal,
bit for bit, what the step model's ``ops.decode_attention_time_s`` gives for the same rows,
for both kinds of wave kernel and any subset of the rows (the fitter's held-out folds)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calibration.fit import ape, fit_decode_wave
from disaggsim.costmodel import ops
from tests.test_mmha_wave_decode import MMHA
from tests.test_xqa_wave_decode import PEAKS, WAVE

# 120 rows of decode steps: batch 1-256, 1-8 KV heads, head dim 64 or 128, 1-16 query heads
# per KV head, 100-40,000 cached tokens per sequence
RNG = np.random.default_rng(20261204)
N = 120
BATCH = RNG.choice([1, 2, 4, 8, 16, 32, 64, 128, 256], N).astype(float)
KV_HEADS = RNG.choice([1, 2, 4, 8], N).astype(float)
HEAD_DIM = RNG.choice([64, 128], N).astype(float)
Q_PER_KV = RNG.choice([1, 2, 4, 8, 16], N).astype(float)
CONTEXT = BATCH * RNG.integers(100, 40_000, N)
KERNELS = {"xqa": WAVE, "mmha": MMHA}


def _simulator(p, idx: np.ndarray, kv_elem_bytes: float) -> np.ndarray:
    return ops.decode_attention_time_s(
        PEAKS, p, BATCH[idx], CONTEXT[idx], KV_HEADS[idx], HEAD_DIM[idx], kv_elem_bytes,
        q_per_kv=Q_PER_KV[idx],
    )  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("kv_elem_bytes", [1.0, 2.0])
def test_geometry_of_all_rows_taken_at_a_subset_prices_as_the_simulator(
    kind: str, kv_elem_bytes: float
) -> None:
    p = KERNELS[kind]
    geometry = ops.decode_wave_geometry(
        BATCH, KV_HEADS, HEAD_DIM, Q_PER_KV, p.wave_sms, p.reread_bytes_per_s > 0.0
    )
    every = np.arange(N)
    fold = np.sort(RNG.choice(N, 37, replace=False))
    for idx in (every, fold):
        got = ops.decode_wave_time_s(PEAKS, p, geometry.take(idx), CONTEXT[idx], kv_elem_bytes)
        want = _simulator(p, idx, kv_elem_bytes)
        assert np.array_equal(got, want)
    # and the lines themselves, as the step model's decode_wave_lines gives them
    m, base, per = ops.decode_wave_lines_of(PEAKS, p, geometry, kv_elem_bytes)
    m2, base2, per2 = ops.decode_wave_lines(
        PEAKS, p, BATCH, KV_HEADS, HEAD_DIM, kv_elem_bytes, Q_PER_KV
    )
    assert np.array_equal(m, m2) and np.array_equal(base, base2) and np.array_equal(per, per2)


def test_a_geometry_of_another_kernel_is_refused() -> None:
    xqa = ops.decode_wave_geometry(BATCH, KV_HEADS, HEAD_DIM, Q_PER_KV, WAVE.wave_sms, False)
    with pytest.raises(ValueError, match="per query head"):
        ops.decode_wave_lines_of(PEAKS, MMHA, xqa, 2.0)  # a per-query-head kernel
    other_sms = dataclasses.replace(WAVE, wave_sms=WAVE.wave_sms * 2)
    with pytest.raises(ValueError, match="SMs"):
        ops.decode_wave_lines_of(PEAKS, other_sms, xqa, 2.0)


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_the_fitters_error_is_the_simulators_error_of_the_fitted_kernel(kind: str) -> None:
    """A fit on noisy rows of the kernel reports the error of its own model at the fitted
    parameters; recomputed through the step model's function it is the same number."""
    p = KERNELS[kind]
    idx = np.arange(N)
    measured = _simulator(p, idx, 2.0) * np.exp(RNG.normal(0.0, 0.05, N))
    fitted = fit_decode_wave(
        PEAKS, BATCH, CONTEXT, KV_HEADS, HEAD_DIM, measured, Q_PER_KV, int(p.wave_sms),
        held_out=False, per_query_head=kind == "mmha",
    )  # fmt: skip
    errors = ape(_simulator(fitted.params, idx, 2.0), measured)
    assert fitted.error.median_ape > 0.0
    assert float(np.median(errors)) == fitted.error.median_ape
    assert float(np.mean(errors)) == fitted.error.mean_ape
