"""Requests the router holds for decode room (``kv_aware`` back-pressure: a prefill worker
takes work, but no decode worker can promise a request its full length) wait for both
pools: the decode pool's room, then a prefill worker. The pool signals count them in the
decode pool's ``queue_depth`` and ``queued_prompt_tokens`` as well as the prefill pool's
(the decode pool counted none: a decode autoscaler on a queue or the ``slo`` policy never
saw a pool short of KV to promise; autoscaling/mix-shift with ``decode.policy: slo`` held
69-133 requests at the router at 200-225 s with one decode worker)."""

from __future__ import annotations

import numpy as np

from disaggsim.autoscale import PoolSignals
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import Cluster, EngineConfig, PoolSpec
from disaggsim.workload.requests import Requests

PREFILL = ConstantCost(prefill_base_s=0.01)
# 62 blocks of 16 tokens: room to promise 3 requests of 100 + 200 tokens (19 blocks each)
DECODE = ConstantCost(decode_base_s=0.01, kv_capacity_tokens=1000)


def _signals_at(at_s: float, backpressure: str) -> tuple[PoolSignals, PoolSignals, int]:
    """(prefill signals, decode signals, requests held at the router) at ``at_s`` of a run
    of 20 requests (100-token prompts, 200-token replies) arriving in the first 0.1 s."""
    n = 20
    reqs = Requests(
        arrival_s=np.linspace(0.0, 0.1, n),
        prompt_tokens=np.full(n, 100),
        output_tokens=np.full(n, 200),
    )
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, PREFILL, 64, 10_000),
            PoolSpec("decode", 1, DECODE, 64, 10_000),
        ),
        backpressure=backpressure,  # type: ignore[arg-type]
    )
    cluster = Cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    seen: list[tuple[PoolSignals, PoolSignals, int]] = []

    def look(now: float, _view: object) -> bool:
        if not seen and now >= at_s:
            sc = cluster.scaling
            seen.append(
                (
                    sc.signals("prefill", 1.0, 0.0),
                    sc.signals("decode", 1.0, 0.0),
                    len(cluster.router.queue),
                )
            )
        return False

    cluster.run(stop_check=look, check_every_s=at_s)
    return seen[0]


def test_held_for_decode_room_count_for_the_decode_pool() -> None:
    pre, dec, held = _signals_at(0.5, "kv_aware")
    # three requests hold the decode worker's promises (prefilled by 0.5 s, decoding);
    # the other 17 wait at the router for its room: the prefill pool's queue (they need a
    # prefill once room opens) and the decode pool's
    assert held == 17
    assert (pre.queue_depth, pre.queued_prompt_tokens) == (17, 1700)
    assert (dec.queue_depth, dec.queued_prompt_tokens) == (17, 1700)
    assert dec.running_seqs == 3


def test_without_back_pressure_nothing_is_held() -> None:
    """No kv_aware: every request goes to the prefill worker (which prefills them all at
    once) and the decode side has them; the router holds none."""
    pre, dec, held = _signals_at(0.5, "none")
    assert held == 0
    assert pre.queue_depth == 0
    assert dec.queue_depth + dec.running_seqs == 20
