"""The engine's record columns: unsigned while it appends, signed in the result; sample
and segment rows packed and moved into their columns in bulk.

The engine appends to unsigned integer columns (cheaper per append on CPython) and
returns them with the signed typecodes every reader expects, the same values; a -1 (a
re-prefill's point segment) survives the round trip. ``benchmarks/hash_records.py``
checks the same on every column of many runs (the typecodes are hashed too).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.engine.records import (
    PrefillIters,
    RequestLogColumns,
    Rows,
    Samples,
    Segments,
    StepLog,
    flush_held,
    held_rows,
    minus_one,
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


def test_held_rows_flush_as_the_appends_would() -> None:
    """A worker's step-log rows held packed (:func:`held_rows`) and flushed (midway, at
    the end, with nothing held; short and long tables) give the signed columns, byte for byte, that appending
    each value gives (NaN and 8-byte ints included); only 8-byte columns are taken."""
    log, ref = StepLog(), StepLog()
    run_cols = (
        log.run_start_at_s,
        log.run_steps,
        log.run_batch,
        log.run_context0,
        log.run_base_s,
        log.run_per_token_s,
        log.run_prefill_tokens,
    )
    it = log.prefill_iters
    iter_cols = (it.start_at_s, it.duration_s, it.num_seqs, it.num_tokens)
    runs, (pack_run, put_run) = held_rows(*run_cols)
    iters, (pack_iter, put_iter) = held_rows(*iter_cols)
    for i in range(3000):  # the last flush moves 2,799 runs (numpy) and 700 iterations
        row = (
            i * 0.1 + 1e-9 * i,
            i % 17 + 1,
            i % 250,
            2**40 + i,
            0.013,
            math.nan if i == 3 else 1e-7,
        )
        put_run(pack_run(*row, i % 5))
        ref.add_run(*row, i % 5)
        if i % 4 == 0:
            put_iter(pack_iter(row[0], 0.2, i % 3, 2**33 + i))
            ref.prefill_iters.append((row[0], 0.2, i % 3, 2**33 + i))
        if i == 200:
            flush_held(runs, run_cols)
            flush_held(iters, iter_cols)
    for _ in range(2):  # the second flush finds nothing held
        flush_held(runs, run_cols)
        flush_held(iters, iter_cols)
    assert not runs and not iters
    for name in StepLog.__slots__:
        a, b = getattr(log, name), getattr(ref, name)
        if name == "prefill_iters":
            for n in PrefillIters.__slots__:
                x, y = getattr(a, n), getattr(b, n)
                assert x.typecode == y.typecode and x.tobytes() == y.tobytes(), n
        else:
            assert a.typecode == b.typecode and a.tobytes() == b.tobytes(), name
    with pytest.raises(ValueError, match="8-byte"):
        held_rows(array("i"))


def test_rows_flush_as_the_appends_would() -> None:
    """Rows packed and flushed (once midway, once at the end) give the columns, byte for
    byte, that appending each value gives: floats (NaN included), 4- and 8-byte
    unsigned ints, the two's complement that stands for -1."""
    smp, seg = Samples(), Segments()
    unsigned_columns(smp, seg)
    ref_smp, ref_seg = Samples(), Segments()
    unsigned_columns(ref_smp, ref_seg)
    sample_rows = Rows(smp.at_s, smp.worker, smp.queue_len, smp.batch, smp.kv_used_tokens)
    segment_rows = Rows(seg.rid, seg.worker, seg.start_step, seg.tokens, seg.at_s)
    point = minus_one(seg.worker)
    assert point == (1 << 64) - 1
    for i in range(1000):
        t = i * 0.1 + 1e-9 * i
        sample = (t, i % 250, i % 7, 2**31 - 1 if i == 5 else i, 2**40 + i)
        pack, put = sample_rows.write
        put(pack(*sample))
        for col, v in zip(
            (ref_smp.at_s, ref_smp.worker, ref_smp.queue_len, ref_smp.batch),
            sample,
            strict=False,
        ):
            col.append(v)
        ref_smp.kv_used_tokens.append(sample[4])
        if i % 3:
            pack, put = segment_rows.write
            put(pack(i, i % 9, 3 * i, 17, math.nan))
            ref_seg.add(i, i % 9, 3 * i, 17)
        else:
            pack, put = segment_rows.write
            put(pack(i, point, point, 1, t))
            ref_seg.add_point(i, t)
        if i == 400:
            sample_rows.flush()
            segment_rows.flush()
    sample_rows.flush()
    segment_rows.flush()
    sample_rows.flush()  # nothing held: nothing added
    assert not sample_rows.rows and not segment_rows.rows
    signed_columns(smp, seg, ref_smp, ref_seg)
    for name in ("at_s", "worker", "queue_len", "batch", "kv_used_tokens"):
        a, b = getattr(smp, name), getattr(ref_smp, name)
        assert a.typecode == b.typecode and a.tobytes() == b.tobytes(), name
    for name in ("rid", "worker", "start_step", "tokens", "at_s"):
        a, b = getattr(seg, name), getattr(ref_seg, name)
        assert a.typecode == b.typecode and a.tobytes() == b.tobytes(), name
    assert list(seg.worker[:1]) == [-1] and math.isnan(seg.at_s[1])


def test_rows_refuse_a_column_they_cannot_pack() -> None:
    col = array("L")  # C long: struct's standard size differs where long is 8 bytes
    if col.itemsize == 4:
        return
    try:
        Rows(col)
    except ValueError:
        return
    raise AssertionError("a packed row of a column whose size struct does not give")
