"""Disaggregated decode preemption: without back-pressure (``router.backpressure:
none``) the decode pool admits a handoff on the blocks its context needs today, so a
decode batch can outgrow its worker's KV and preempt (recompute: the sequence goes back
through the prefill pool; swap: its KV goes to host memory and back). With ``kv_aware``
back-pressure (the default) the router promises decode room at full length (prompt +
``max_tokens``) and decode never runs out. ``simulate`` checks the run's invariants
(every token timestamped once, in order; docs/safety.md) before deriving anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from disaggsim.run import simulate

REPO = Path(__file__).resolve().parents[1]
# one decode worker with room for about 24,000 KV tokens, offered twice what it serves
SMALL_DECODE = [
    "workload.rate_per_s=24",
    "decode_pool.num_workers=1",
    "decode_pool.gpu_mem_util=0.24",
    "sim.duration_s=60",
]


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_without_backpressure_decode_preempts_and_every_request_completes(preemption):
    s = simulate(
        REPO / "scenarios/chat/disaggregated.yaml",
        [*SMALL_DECODE, "router.backpressure=none", f"kv.preemption={preemption}"],
    ).summary
    assert s.num_preemptions > 50
    assert s.num_unfinished == 0 and s.num_completed == s.num_requests
    assert s.mean_kv_util["decode"] > 0.8  # decode memory is what binds


def test_kv_aware_backpressure_never_preempts_decode():
    s = simulate(
        REPO / "scenarios/chat/disaggregated.yaml", [*SMALL_DECODE, "router.backpressure=kv_aware"]
    ).summary
    assert s.num_preemptions == 0
    assert s.router_queue_max > 100  # the queue waits at the router instead
    assert s.mean_kv_util["decode"] < 0.5  # full-length promises leave most blocks unused
