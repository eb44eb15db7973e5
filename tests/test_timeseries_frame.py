"""The time-series frame (run.timeseries_frame) equals its definition, worker rows then
router rows stably sorted by time then worker, whether the samples arrive in time order
(as the engine records them: rows merged without sorting) or not (one lexsort)."""

from __future__ import annotations

from array import array
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from disaggsim.engine.records import RouterSamples, Samples
from disaggsim.run import simulate, timeseries_frame


def _definition(raw) -> pd.DataFrame:
    s, r = raw.samples, raw.router_samples
    role = np.array([w.role for w in raw.workers], dtype=object)
    cap = np.array([w.kv_capacity_tokens for w in raw.workers], dtype=float)
    worker = np.asarray(s.worker, dtype=np.int64)
    kv = np.asarray(s.kv_used_tokens, dtype=np.int64)
    n = len(r.at_s)
    rows = pd.DataFrame(
        {
            "at_s": np.asarray(s.at_s, float),
            "worker": worker,
            "role": role[worker],
            "queue_len": np.asarray(s.queue_len, dtype=np.int64),
            "batch": np.asarray(s.batch, dtype=np.int64),
            "kv_used_tokens": kv,
            "kv_util": kv / cap[worker],
            "orphaned_kv_bytes": np.zeros(len(worker), dtype=np.int64),
        }
    )
    router = pd.DataFrame(
        {
            "at_s": np.asarray(r.at_s, float),
            "worker": np.full(n, -1, dtype=np.int64),
            "role": np.full(n, "router", dtype=object),
            "queue_len": np.asarray(r.queue_len, dtype=np.int64),
            "batch": np.zeros(n, dtype=np.int64),
            "kv_used_tokens": np.zeros(n, dtype=np.int64),
            "kv_util": np.zeros(n),
            "orphaned_kv_bytes": np.asarray(r.orphaned_kv_bytes, dtype=np.int64),
        }
    )
    return pd.concat([rows, router], ignore_index=True).sort_values(
        ["at_s", "worker"], kind="stable", ignore_index=True
    )


@pytest.fixture(scope="module")
def result():
    return simulate(
        "scenarios/failures/backpressure-kv-aware.yaml",
        ["workload.num_requests=300", "sim.duration_s=60"],
    )


@pytest.fixture(scope="module")
def raw(result):
    assert len(result.raw.router_samples.at_s) > 10  # both kinds of rows
    return result.raw


def _with(raw, rows: np.ndarray, router_rows: np.ndarray, at_s=None, router_at_s=None):
    """``raw`` with its samples taken in the order ``rows`` (router: ``router_rows``),
    times optionally replaced."""
    s, r = raw.samples, raw.router_samples

    def take(col, typecode, idx):
        return array(typecode, np.asarray(col)[idx].tolist())

    samples = Samples(
        at_s=array("d", at_s.tolist()) if at_s is not None else take(s.at_s, "d", rows),
        worker=take(s.worker, "i", rows),
        queue_len=take(s.queue_len, "i", rows),
        batch=take(s.batch, "i", rows),
        kv_used_tokens=take(s.kv_used_tokens, "q", rows),
    )
    router = RouterSamples(
        at_s=array("d", router_at_s.tolist())
        if router_at_s is not None
        else take(r.at_s, "d", router_rows),
        queue_len=take(r.queue_len, "q", router_rows),
        orphaned_kv_bytes=take(r.orphaned_kv_bytes, "q", router_rows),
    )
    return replace(raw, samples=samples, router_samples=router)


def test_recorded_order_is_merged_as_defined(result, raw):
    pd.testing.assert_frame_equal(timeseries_frame(raw), _definition(raw), check_exact=True)
    # and the frame a run returns is that one
    pd.testing.assert_frame_equal(result.timeseries, _definition(raw), check_exact=True)


def test_samples_out_of_time_order_are_sorted_as_defined(raw):
    rng = np.random.default_rng(5)
    n, m = len(raw.samples.at_s), len(raw.router_samples.at_s)
    shuffled = _with(raw, rng.permutation(n), rng.permutation(m))
    pd.testing.assert_frame_equal(
        timeseries_frame(shuffled), _definition(shuffled), check_exact=True
    )


def test_ties_in_time_order_by_worker_then_record_router_rows_first(raw):
    """Times rounded to 0.5 s: many rows share a time; workers recorded out of order
    there (fallback), or in order (merge), and router rows at the same times."""
    n, m = len(raw.samples.at_s), len(raw.router_samples.at_s)
    at = np.floor(np.asarray(raw.samples.at_s) * 2) / 2
    r_at = np.floor(np.asarray(raw.router_samples.at_s) * 2) / 2
    recorded = _with(raw, np.arange(n), np.arange(m), at, r_at)
    pd.testing.assert_frame_equal(
        timeseries_frame(recorded), _definition(recorded), check_exact=True
    )
    by_worker = np.lexsort((np.asarray(raw.samples.worker), at))  # in order at ties
    ordered = _with(raw, by_worker, np.arange(m), at[by_worker], r_at)
    pd.testing.assert_frame_equal(timeseries_frame(ordered), _definition(ordered), check_exact=True)
