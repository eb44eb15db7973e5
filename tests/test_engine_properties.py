"""Hypothesis invariants of the engine over random small clusters and request sets."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.metrics.invariants import check_run
from disaggsim.metrics.reconstruct import request_frame, token_times
from disaggsim.workload.requests import Requests


@st.composite
def cases(draw):
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    reqs = Requests(np.cumsum(gaps), np.array(prompts), np.array(outs))
    cost = ConstantCost(
        prefill_base_s=draw(st.floats(0.001, 0.05)),
        prefill_per_token_s=draw(st.floats(0.0, 1e-4)),
        decode_base_s=draw(st.floats(0.001, 0.02)),
        decode_per_seq_s=draw(st.floats(0.0, 1e-3)),
        decode_per_context_token_s=draw(st.floats(0.0, 1e-6)),
        kv_capacity_tokens=draw(st.integers(64, 3000)),
    )
    seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(16, 600))
    arch = draw(st.sampled_from(["disaggregated", "vllm", "chunked"]))
    workers = draw(st.integers(1, 3))
    if arch == "disaggregated":
        pools = (
            PoolSpec("prefill", workers, cost, seqs, budget),
            PoolSpec("decode", draw(st.integers(1, 3)), cost, seqs, budget),
        )
    else:
        pools = (PoolSpec("colocated", workers, cost, seqs, budget, arch),)
    policy = draw(st.sampled_from(["round_robin", "least_tokens", "shortest_queue"]))
    cfg = EngineConfig(
        pools=pools, prefill_policy=policy, block_tokens=draw(st.sampled_from([1, 16]))
    )
    transfer = draw(st.floats(0.0, 0.01))
    return reqs, cfg, transfer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_invariants(case):
    reqs, cfg, transfer = case
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: transfer)
    check_run(raw)  # the check run before results are written finds nothing wrong
    frame, gaps = request_frame(raw, warmup_s=0.0)
    log = raw.log
    # every request ends exactly once: completed or rejected with a reason, none lost
    assert set(frame["status"]) <= {"completed", "rejected"}
    rejected = frame["status"] == "rejected"
    assert (frame.loc[rejected, "reason"] != "").all()
    done = ~rejected.to_numpy()
    # timestamps ordered along the request's path
    order = [
        "arrival_at_s",
        "prefill_start_at_s",
        "prefill_end_at_s",
        "first_token_at_s",
        "finish_at_s",
    ]
    t = frame.loc[done, order].to_numpy()
    assert (np.diff(t, axis=1) >= -1e-12).all()
    if raw.workers[0].role == "prefill":
        tr = frame.loc[
            done,
            ["prefill_end_at_s", "transfer_start_at_s", "transfer_end_at_s", "first_token_at_s"],
        ]
        assert (np.diff(tr.to_numpy(), axis=1) >= -1e-12).all()
    # each completed request emits exactly its output tokens, in order, the last at finish
    for rid in np.flatnonzero(done):
        times = token_times(raw, int(rid))
        assert len(times) == reqs.output_tokens[rid]
        assert (np.diff(times) > 0).all()
        assert (
            times[-1] == np.float64(log.finish_at_s[rid])
            or abs(times[-1] - log.finish_at_s[rid]) < 1e-9
        )
    # gap distribution holds one gap per token after the first, for completed requests
    assert gaps.count == int((reqs.output_tokens[done] - 1).sum())
    # KV never above capacity, and every block returned once drained
    ts = pd.DataFrame({"w": raw.samples.worker, "kv": raw.samples.kv_used_tokens})
    caps = np.array([w.kv_capacity_tokens for w in raw.workers])
    assert (ts["kv"].to_numpy() <= caps[ts["w"].to_numpy()]).all()
    assert (ts["kv"] >= 0).all()
    assert all(w.kv_used_end_tokens == 0 for w in raw.workers)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_same_inputs_identical_frames(case):
    reqs, cfg, transfer = case
    a, _ = request_frame(run_cluster(reqs, cfg, lambda n, s, d: transfer), 0.0)
    b, _ = request_frame(run_cluster(reqs, cfg, lambda n, s, d: transfer), 0.0)
    pd.testing.assert_frame_equal(a, b)
