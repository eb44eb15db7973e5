"""Work per decode routing decision against the size of the decode pool.

For each policy and pool size W, one run of a constant-cost disaggregated cluster (the
engine's test double, so only the router's and the workers' own work is timed) with
the load per decode worker held fixed: arrivals at W × 4 req/s, varied lengths, decode
KV binding (handoffs the first choice cannot take happen). Printed per run: handoff
decisions, decode workers looked at per decision (calls of ``room_blocks``: the
policy's own fit checks), and microseconds of routing per decision (``_try_handoff``
wall time, the decode index refresh included). A policy whose work does not grow with
the fleet keeps the second and third columns flat as W grows.

    python benchmarks/decode_routing_cost.py [--sizes 2,8,32,128]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import run_cluster
from disaggsim.engine.config import EngineConfig, PoolSpec
from disaggsim.engine.router import Router
from disaggsim.engine.workers import DecodeWorker
from disaggsim.workload.requests import Requests

POLICIES = ("least_committed_kv", "most_free_kv", "round_robin")


def run(policy: str, num_decode: int, seed: int = 0) -> tuple[int, float, float]:
    rng = np.random.default_rng(seed)
    n = 400 * num_decode  # ~100 s of arrivals at 4 req/s per decode worker
    arrival = np.cumsum(rng.exponential(1 / (4.0 * num_decode), n))
    prompts = rng.integers(64, 2048, n)
    outs = rng.integers(16, 400, n)
    decode_cost = ConstantCost(
        prefill_base_s=0.001,
        prefill_per_token_s=0.0,
        decode_base_s=0.02,
        decode_per_context_token_s=0.0,
        kv_capacity_tokens=16_000,  # about 12 of these sequences: KV binds
    )
    prefill_cost = ConstantCost(
        prefill_base_s=0.001, prefill_per_token_s=1e-6, kv_capacity_tokens=10**7
    )
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", max(1, num_decode // 4), prefill_cost, 64, 1 << 20),
            PoolSpec("decode", num_decode, decode_cost, 64, 1 << 20),
        ),
        decode_policy=policy,  # type: ignore[arg-type]
        kv_admission="on_demand",
        backpressure="none",  # finished prefills wait for room: handoffs retried as it frees
    )
    looks = [0]
    decisions = [0]
    spent = [0.0]
    room, handoff = DecodeWorker.room_blocks, Router._try_handoff

    def counted_room(self: DecodeWorker) -> int:
        looks[0] += 1
        return room(self)

    def timed_handoff(self: Router, rid: int, src, prefill_s=None) -> bool:  # type: ignore[no-untyped-def]
        decisions[0] += 1
        t = time.perf_counter()
        ok = handoff(self, rid, src, prefill_s)
        spent[0] += time.perf_counter() - t
        return ok

    try:
        DecodeWorker.room_blocks = counted_room  # type: ignore[method-assign]
        Router._try_handoff = timed_handoff  # type: ignore[method-assign]
        run_cluster(Requests(arrival, prompts, outs), cfg, lambda nbytes, s, d: 0.001)
    finally:
        DecodeWorker.room_blocks = room  # type: ignore[method-assign]
        Router._try_handoff = handoff  # type: ignore[method-assign]
    return decisions[0], looks[0] / decisions[0], spent[0] / decisions[0] * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,8,32,128")
    ap.add_argument("--policies", default=",".join(POLICIES))
    a = ap.parse_args(argv)
    print(
        f"{'policy':20s} {'W':>5s} {'decisions':>10s} {'looked/decision':>16s} {'us/decision':>12s}"
    )
    for policy in a.policies.split(","):
        for w in (int(x) for x in a.sizes.split(",")):
            decisions, looked, us = run(policy, w)
            print(f"{policy:20s} {w:5d} {decisions:10d} {looked:16.2f} {us:12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
