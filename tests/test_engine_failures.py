"""Memory pressure, back-pressure and failures: the cluster degrades, nothing is lost.

Hypothesis over random small clusters with tight KV memory, both admission policies,
both preemption modes, back-pressure on/off, client timeouts, queue limits, worker
failures and link outages.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import (
    Cluster,
    EngineConfig,
    LinkWindow,
    PoolSpec,
    WorkerFailureEvent,
    run_cluster,
)
from disaggsim.engine.events import call_in
from disaggsim.engine.records import STATUS_COMPLETED
from disaggsim.metrics.invariants import check_run
from disaggsim.metrics.reconstruct import request_frame, token_times
from disaggsim.workload.requests import Requests


@st.composite
def stressed(draw, swap_on_fabric: bool = False):
    """A random small stressed cluster; ``swap_on_fabric``: always disaggregated on a
    topology fabric with swap preemption, no back-pressure and slow PCIe, so swap copies
    run as long flows that failures and outages cut."""
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    reqs = Requests(np.cumsum(gaps), np.array(prompts), np.array(outs))

    def cost():
        return ConstantCost(
            prefill_base_s=draw(st.floats(0.001, 0.03)),
            prefill_per_token_s=draw(st.floats(0.0, 1e-4)),
            decode_base_s=draw(st.floats(0.001, 0.01)),
            decode_per_context_token_s=draw(st.floats(0.0, 1e-6)),
            kv_capacity_tokens=draw(st.integers(32, 1500)),
        )

    arch = (
        "disaggregated"
        if swap_on_fabric
        else draw(st.sampled_from(["disaggregated", "vllm", "chunked"]))
    )
    seqs = draw(st.integers(1, 6))
    budget = draw(st.integers(16, 400))
    if arch == "disaggregated":
        pools = (
            PoolSpec("prefill", draw(st.integers(1, 2)), cost(), seqs, budget),
            PoolSpec("decode", draw(st.integers(1, 3)), cost(), seqs, budget),
        )
    else:
        pools = (PoolSpec("colocated", draw(st.integers(1, 3)), cost(), seqs, budget, arch),)
    num_workers = sum(p.num_workers for p in pools)
    failures = tuple(
        WorkerFailureEvent(at, w, down)
        for at, w, down in draw(
            st.lists(
                st.tuples(
                    st.floats(0.0, 3.0), st.integers(0, num_workers - 1), st.floats(0.01, 1.0)
                ),
                max_size=4,
            )
        )
    )
    links = ()
    if arch == "disaggregated":
        links = tuple(
            LinkWindow(s, d, f)
            for s, d, f in draw(
                st.lists(
                    st.tuples(
                        st.floats(0.0, 3.0), st.floats(0.01, 0.5), st.sampled_from([0.0, 0.3])
                    ),
                    max_size=2,
                )
            )
        )
    topology = None
    overlap = False
    preemption = "swap" if swap_on_fabric else draw(st.sampled_from(["recompute", "swap"]))
    if arch == "disaggregated" and (swap_on_fabric or draw(st.booleans())):
        from disaggsim.fabric import build_topology, parse_topology_config, pool_layouts

        overlap = draw(st.booleans())
        fab = parse_topology_config(
            {
                "kind": "topology",
                "gpus_per_node": 2,
                "nic": {
                    "gbit_per_s": 0.1,
                    "per_gpu": draw(st.booleans()),
                    "rdma": draw(st.booleans()),
                },
                "placement": {"policy": draw(st.sampled_from(["pack", "spread", "pair"]))},
                "overlap": overlap,
                # 1000 B/token of KV: 1–50 MB/s makes a swap of a few hundred tokens last
                # milliseconds to seconds
                "pcie": {"gb_per_s": draw(st.floats(0.001, 0.05))} if swap_on_fabric else {},
            }
        )
        layouts = pool_layouts([(p.role, "h100-sxm", p.num_workers, 1) for p in pools])
        # swaps then run as flows over the decode GPUs' PCIe links
        topology = build_topology(fab, layouts, host_paths=preemption == "swap")
        if links and draw(st.booleans()):  # windows on a few named links only
            n = len(topology.links)
            links = tuple(
                LinkWindow(w.start_s, w.duration_s, w.factor, tuple(draw(
                    st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)
                )))
                for w in links
            )  # fmt: skip
    cfg = EngineConfig(
        pools=pools,
        topology=topology,
        overlap=overlap,
        num_layers=draw(st.integers(1, 8)),
        block_tokens=draw(st.sampled_from([1, 4, 16])),
        kv_admission="on_demand"
        if swap_on_fabric
        else draw(st.sampled_from(["on_demand", "reserve_full"])),
        kv_watermark=draw(st.sampled_from([0.0, 0.05])),
        preemption=preemption,
        backpressure="none" if swap_on_fabric else draw(st.sampled_from(["none", "kv_aware"])),
        first_token_from=draw(st.sampled_from(["decode", "prefill"])),
        max_queue=draw(st.one_of(st.none(), st.integers(1, 10))),
        client_timeout_s=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        worker_failures=failures,
        link_windows=links,
        horizon_s=60.0,  # far beyond any drain here: a request still running is a livelock
    )
    return reqs, cfg, draw(st.floats(0.0, 0.01))


def _check(reqs, cfg, raw):
    check_run(raw)  # the check run before results are written finds nothing wrong
    frame, gaps = request_frame(raw, warmup_s=0.0)
    # every request ends exactly once, with a reason unless completed
    assert set(frame["status"]) <= {"completed", "rejected", "abandoned"}, frame[
        "status"
    ].value_counts()
    ended = frame["status"] != "completed"
    assert (frame.loc[ended, "reason"] != "").all()
    assert (frame.loc[frame["status"] == "abandoned", "reason"] == "client_timeout").all()
    # completed requests received exactly their output tokens, in order, the last at finish
    done = np.flatnonzero(~ended.to_numpy())
    for rid in done:
        times = token_times(raw, int(rid))
        assert len(times) == reqs.output_tokens[rid], (rid, len(times), reqs.output_tokens[rid])
        assert (np.diff(times) > 0).all()
        assert abs(times[-1] - raw.log.finish_at_s[rid]) < 1e-9
    assert gaps.count == int((reqs.output_tokens[done] - 1).sum())
    # KV never above capacity; every block returned once drained
    caps = np.array([w.kv_capacity_tokens for w in raw.workers])
    w = np.asarray(raw.samples.worker, dtype=np.int64)
    kv = np.asarray(raw.samples.kv_used_tokens)
    assert (kv <= caps[w]).all()
    assert (kv >= 0).all()
    assert [x.kv_used_end_tokens for x in raw.workers] == [0] * len(raw.workers)
    assert raw.router_samples.orphaned_kv_bytes[-1] == 0
    assert raw.router_samples.queue_len[-1] == 0
    return frame


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stressed())
def test_nothing_is_lost(case):
    reqs, cfg, transfer = case
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: transfer)
    _check(reqs, cfg, raw)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stressed(swap_on_fabric=True))
def test_nothing_is_lost_when_swaps_share_the_fabric(case):
    reqs, cfg, transfer = case
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: transfer)
    _check(reqs, cfg, raw)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stressed())
def test_same_inputs_same_results(case):
    reqs, cfg, transfer = case
    a, _ = request_frame(run_cluster(reqs, cfg, lambda n, s, d: transfer), 0.0)
    b, _ = request_frame(run_cluster(reqs, cfg, lambda n, s, d: transfer), 0.0)
    pd.testing.assert_frame_equal(a, b)


def test_failure_after_a_cut_that_leaves_the_worker_idle():
    # Dyadic times. r0 lands on the decode worker at 0.1875 and runs 3 steps of 0.0625 to
    # 0.375. A wake 1e-13 s before that end (within the engine's _EPS) cuts the run at
    # its end: r0 finishes there and the worker goes idle, its run's timeout (0.375)
    # still queued without callbacks. The worker fails at 0.375, before that timeout is
    # processed: the failure finds nothing to take off the event it waited for.
    cost = ConstantCost(prefill_base_s=0.125, decode_base_s=0.0625)
    reqs = Requests(np.array([0.0, 2.0]), np.array([10, 10]), np.array([4, 4]))
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, cost, 8, 10_000), PoolSpec("decode", 1, cost, 8, 10_000))
    )
    cluster = Cluster(reqs, cfg, lambda nbytes, s, d: 0.0625)
    dec = cluster.decode_workers[0]
    call_in(cluster.env, 0.375 - 1e-13, lambda _ev: dec.notify())
    call_in(cluster.env, 0.375, lambda _ev: dec.fail(1.0))  # queued before the run's timeout
    raw = cluster.run()
    assert raw.log.status.tolist() == [STATUS_COMPLETED, STATUS_COMPLETED]
    assert raw.log.finish_at_s[1] == 2.375
    assert raw.workers[dec.index].num_failures == 1
