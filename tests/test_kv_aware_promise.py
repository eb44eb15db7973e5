"""``kv_aware`` back-pressure promises decode room on ONE decode worker.

A request is decoded on one worker, so the room that can hold it is one worker's: the
router admits a request to prefill only when some accepting decode worker can still
promise its full length (prompt + ``max_tokens`` blocks) beyond the watermark, what its
sequences may hold at their longest and what is promised on it to requests already in
prefill, and the handoff goes to a worker that keeps the promise. Before, admission
checked the room summed over the decode pool and the handoff went wherever the KV fit
today, so a worker could end up promised more than it holds and preempt (the probe:
ci/fabric-contention with its KV cut to 1/60 at twice the rate, decode worker 3
promised 479 of its 470 blocks, 10 preemptions).

Without failures (the promise is lost only with a failed or drained worker) no decode
worker is ever promised more blocks than its capacity less the watermark, and no
sequence is preempted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import run_cluster
from disaggsim.engine.config import EngineConfig, PoolSpec
from disaggsim.engine.records import STATUS_COMPLETED
from disaggsim.engine.workers import DecodeWorker
from disaggsim.workload.requests import Requests
from tests.test_engine_failures import _check

REPO = Path(__file__).resolve().parents[1]


class _Promises:
    """Records, at every decode reservation, the worker's blocks promised at full length
    (what its sequences may hold at their longest) against its capacity less the
    watermark."""

    def __init__(self) -> None:
        self.over: list[tuple[int, int, int]] = []  # (worker, eventual blocks, room)
        self.reserves = 0

    def __enter__(self) -> _Promises:
        self._reserve = reserve = DecodeWorker.reserve

        def checked(w: DecodeWorker, rid: int) -> None:
            reserve(w, rid)
            self.reserves += 1
            room = w.kv_capacity_blocks - w.watermark_blocks
            if w.eventual_blocks > room:
                self.over.append((w.index, w.eventual_blocks, room))

        DecodeWorker.reserve = checked  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        DecodeWorker.reserve = self._reserve  # type: ignore[method-assign]


@st.composite
def _cut_kv_cluster(draw):
    """A disaggregated cluster whose decode workers hold a few long sequences each,
    offered more than they serve, kv_aware back-pressure, no failures."""
    n = draw(st.integers(10, 60))
    gaps = draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    prompts = np.array(draw(st.lists(st.integers(1, 400), min_size=n, max_size=n)))
    max_tokens = np.array(draw(st.lists(st.integers(1, 120), min_size=n, max_size=n)))
    # realised replies at most max_tokens (clients stop early; the router plans on max)
    share = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n)))
    outs = np.maximum(1, np.round(share * max_tokens)).astype(np.int64)
    reqs = Requests(np.cumsum(gaps), prompts, outs, max_tokens=max_tokens)
    block = draw(st.sampled_from([1, 4, 16]))
    longest = int((prompts + max_tokens).max())
    watermark = draw(st.sampled_from([0.0, 0.05]))

    def cost(kv_tokens: int) -> ConstantCost:
        return ConstantCost(
            prefill_base_s=draw(st.floats(0.001, 0.03)),
            prefill_per_token_s=draw(st.floats(0.0, 1e-4)),
            decode_base_s=draw(st.floats(0.001, 0.01)),
            decode_per_context_token_s=draw(st.floats(0.0, 1e-6)),
            kv_capacity_tokens=kv_tokens,
        )

    # room for the longest sequence (with its watermark and a block to spare) and up to
    # three times that: a handful of sequences at full length per decode worker
    blocks = -(-longest // block) + 2
    decode_kv = draw(st.integers(int(blocks / (1 - watermark)) + 2, 3 * blocks + 4)) * block
    seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(16, longest + 1), 2000))
    pools = (
        PoolSpec("prefill", draw(st.integers(1, 3)), cost(4 * longest + 64), seqs, budget),
        PoolSpec("decode", draw(st.integers(2, 4)), cost(decode_kv), seqs, budget),
    )
    cfg = EngineConfig(
        pools=pools,
        decode_policy=draw(st.sampled_from(["least_committed_kv", "most_free_kv", "round_robin"])),
        prefill_policy=draw(st.sampled_from(["least_tokens", "shortest_queue", "round_robin"])),
        block_tokens=block,
        kv_admission=draw(st.sampled_from(["on_demand", "reserve_full"])),
        kv_watermark=watermark,
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        backpressure="kv_aware",
        first_token_from=draw(st.sampled_from(["decode", "prefill"])),
        horizon_s=600.0,
    )
    return reqs, cfg, draw(st.floats(0.0, 0.01))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cut_kv_cluster())
def test_no_decode_worker_is_promised_more_than_it_holds(case):
    reqs, cfg, transfer = case
    with _Promises() as promises:
        raw = run_cluster(reqs, cfg, lambda nbytes, s, d: transfer)
    _check(reqs, cfg, raw)
    assert promises.over == [], promises.over[:5]
    assert int(np.asarray(raw.log.num_preemptions).sum()) == 0


def test_probe_fabric_contention_with_cut_kv_never_preempts():
    """The probe of the engine lane's session of 2026-12-01: ci/fabric-contention at
    twice its rate with every worker's KV cut to 1/60 (benchmarks/hash_records.py's
    ``+kvcut`` variant: 469 blocks per worker since the KV pool is sized from CUDA's device
    total of 2026-12-03, 473 with nvidia-smi's and the engine reserve of that day, 475 with
    the flat 1 GiB it was probed with)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import hash_records as hr
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    path = REPO / "scenarios/ci/fabric-contention.yaml"
    raw_scenario = hr._rate_times(hr._cap(hr._read(path), 3000), 2.0)
    with _Promises() as promises:
        raw = hr.run_engine(raw_scenario, path.parent, 60)
    decode = [w for w in raw.workers if w.role == "decode"]
    assert [w.kv_capacity_tokens // 16 for w in decode] == [469, 469]
    assert promises.reserves > 1000
    assert promises.over == []
    assert int(np.asarray(raw.log.num_preemptions).sum()) == 0


@pytest.mark.parametrize("policy", ["least_committed_kv", "most_free_kv", "round_robin"])
def test_a_request_waits_for_one_worker_with_room_not_for_the_pool_sum(policy):
    """Two decode workers with 10 free blocks each (20 in all) hold no 12-block request:
    it waits at the router until one worker has the room, and never preempts."""
    # decode workers of 16 blocks (one token per block), watermark 0: 15 promisable each
    # (the block kept for a joining sequence's next step). Requests 0 and 1 take 5 blocks
    # on each worker and run for a long time; request 2 needs 12 blocks.
    arrival = np.array([0.0, 0.0, 0.01])
    prompts = np.array([2, 2, 6])
    outs = np.array([3, 3, 6])
    reqs = Requests(arrival, prompts, outs)
    cost = ConstantCost(
        prefill_base_s=0.001,
        prefill_per_token_s=0.0,
        decode_base_s=1.0,  # one token a second: requests 0 and 1 hold their room 3 s
        decode_per_context_token_s=0.0,
        kv_capacity_tokens=16,
    )
    pools = (
        PoolSpec("prefill", 1, ConstantCost(kv_capacity_tokens=1000), 8, 1000),
        PoolSpec("decode", 2, cost, 8, 1000),
    )
    cfg = EngineConfig(
        pools=pools,
        decode_policy=policy,
        block_tokens=1,
        kv_admission="on_demand",
        backpressure="kv_aware",
    )
    with _Promises() as promises:
        raw = run_cluster(reqs, cfg)
    assert promises.over == []
    assert int(np.asarray(raw.log.num_preemptions).sum()) == 0
    # request 2 is admitted only once request 0 or 1 has left its worker
    first_end = min(raw.log.finish_at_s[0], raw.log.finish_at_s[1])
    assert raw.log.prefill_start_at_s[2] >= first_end
    assert list(raw.log.status) == [STATUS_COMPLETED] * 3
