"""The engine's record columns: unsigned while it appends, signed in the result.

The engine appends to unsigned integer columns (cheaper per append on CPython) and
returns them with the signed typecodes every reader expects, the same values; a -1 (a
re-prefill's point segment) survives the round trip. ``benchmarks/hash_records.py``
checks the same on every column of many runs (the typecodes are hashed too).
"""

from __future__ import annotations

import numpy as np

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.engine.records import (
    RequestLogColumns,
    Samples,
    Segments,
    StepLog,
    signed_columns,
    unsigned_columns,
)
from disaggsim.workload.requests import Requests

COST = ConstantCost(prefill_base_s=0.1, decode_base_s=0.01)


def test_round_trip_keeps_values_and_typecodes() -> None:
    seg, smp, steps = Segments(), Samples().with_cache_columns(), StepLog()
    unsigned_columns(seg, smp, steps)
    assert seg.rid.typecode == "Q" and smp.worker.typecode == "I"
    assert steps.prefill_iters.num_seqs.typecode == "Q"
    seg.add(7, 3, 0, 12)
    seg.add_point(7, 1.5)
    smp.worker.append(2)
    steps.add_run(0.0, 4, 2, 100, 0.01, 1e-6)
    steps.prefill_iters.append((0.0, 0.1, 2, 300))
    signed_columns(seg, smp, steps)
    assert [seg.rid.typecode, seg.worker.typecode, smp.worker.typecode] == ["q", "q", "i"]
    assert smp.kv_used_tokens.typecode == "q" and smp.cache_hbm_tokens is not None
    assert smp.cache_hbm_tokens.typecode == "q"
    assert list(seg.worker) == [3, -1] and list(seg.start_step) == [0, -1]
    assert list(smp.worker) == [2] and list(steps.run_context0) == [100]
    assert list(steps.prefill_iters.num_tokens) == [300]
    assert steps.run_base_s.typecode == "d" and list(steps.run_base_s) == [0.01]


def test_request_log_columns_write_through_to_the_int64_log() -> None:
    cols = RequestLogColumns(3)
    cols.prefill_worker[1] = 4
    cols.num_prefills[1] += 1
    cols.first_token_at_s[2] = 0.25
    log = cols.log
    assert log.prefill_worker.dtype == np.int64 and list(log.prefill_worker) == [-1, 4, -1]
    assert list(log.num_prefills) == [0, 1, 0]
    assert np.isnan(log.first_token_at_s[0]) and log.first_token_at_s[2] == 0.25


def test_run_returns_signed_columns() -> None:
    requests = Requests(
        arrival_s=np.array([0.0, 0.0, 0.05]),
        prompt_tokens=np.array([100, 200, 300]),
        output_tokens=np.array([3, 5, 2]),
    )
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, COST, 8, 10_000), PoolSpec("decode", 1, COST, 8, 10_000))
    )
    raw = run_cluster(requests, cfg, lambda nbytes, s, d: 0.001)
    assert raw.samples.worker.typecode == "i" and raw.samples.kv_used_tokens.typecode == "q"
    assert raw.segments.rid.typecode == "q" and raw.router_samples.queue_len.typecode == "q"
    for w in raw.workers:
        assert w.steps.run_steps.typecode == "q"
        assert w.steps.prefill_iters.num_seqs.typecode == "q"
    assert sorted(raw.segments.rid) == [0, 1, 2]
    assert list(raw.log.status) == [1, 1, 1]
