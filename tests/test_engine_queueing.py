"""Prefill queueing against queueing theory (M/D/1, Pollaczek–Khinchine)."""

from __future__ import annotations

import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.workload import SyntheticWorkload, generate_requests


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_prefill_queue_matches_pollaczek_khinchine(rho):
    # One prefill worker serving one prompt per batch in exactly D seconds, Poisson
    # arrivals at rate lam: mean wait in queue Wq = lam D^2 / (2 (1 - rho)).
    service_s = 0.1
    lam = rho / service_s
    wl = SyntheticWorkload.model_validate(
        {
            "kind": "synthetic",
            "rate_per_s": lam,
            "prompt_tokens": {"dist": "fixed", "value": 64},
            "output_tokens": {"dist": "fixed", "value": 2},
            "num_requests": 60_000,
        }
    )
    reqs = generate_requests(wl, duration_s=float("inf"), seed=5)
    prefill = ConstantCost(prefill_base_s=service_s)
    decode = ConstantCost(decode_base_s=1e-4, kv_capacity_tokens=10**9)
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, prefill, 1, 10_000),
            PoolSpec("decode", 1, decode, 10_000, 10_000),
        )
    )
    raw = run_cluster(reqs, cfg)
    wait = raw.log.prefill_start_at_s - reqs.arrival_s
    wq_theory = lam * service_s**2 / (2 * (1 - rho))
    # drop the first 5% (start-up from an empty queue)
    measured = wait[len(wait) // 20 :].mean()
    assert measured == pytest.approx(wq_theory, rel=0.06)
    # server busy share equals rho
    busy = sum(d for _, d, _, _ in raw.workers[0].steps.prefill_iters)
    assert busy / raw.log.prefill_end_at_s.max() == pytest.approx(rho, rel=0.02)
