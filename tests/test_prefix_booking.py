"""Queued prefill tokens with prefix caching: what the router books and workers take back.

The cache-aware router books on the worker it picks only the tokens that worker will
prefill (the prompt its HBM does not hold, plus a re-prefill's reply); a worker with a
prefix cache keeps each request's booking and takes exactly that back when the request
leaves its queue (its prefill starts, it is taken back for a re-route or an abandonment,
the worker fails). So at every instant a worker's ``queued_tokens`` is the sum of the
bookings of the requests in its queue, and it is 0 once every request has ended.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.config.loader import load_scenario
from disaggsim.engine.cluster import Cluster
from disaggsim.engine.records import RequestView
from disaggsim.run import (
    build_autoscalers,
    build_costs,
    build_topology,
    build_transfer,
    engine_config,
    make_requests,
)

REPO = Path(__file__).resolve().parents[1]
SESSIONS = yaml.safe_load((REPO / "scenarios/prefix/chat-sessions.yaml").read_text())


def _scenario(
    arch: str, policy: str, rate: float, seed: int, failures: bool, timeout_s: float | None
) -> dict[str, Any]:
    raw = copy.deepcopy(SESSIONS)
    raw["seed"] = seed
    raw["workload"]["rate_per_s"] = rate
    raw["sim"] = {"duration_s": 40, "warmup_s": 0, "max_drain_s": 600}
    raw["router"] = {"prefill_policy": policy}
    if timeout_s is not None:
        raw["router"]["client_timeout_s"] = timeout_s
    roles = ["prefill", "decode"]
    if arch != "disaggregated":
        del raw["prefill_pool"], raw["decode_pool"]
        raw["architecture"] = "colocated"
        raw["pool"] = {"gpu": "h100-sxm", "num_workers": 3, "tp": 1, "scheduler": arch}
        raw["kv"] = {"admission": "on_demand", "preemption": "recompute"}
        roles = ["colocated"]
    if failures:
        raw["failures"] = {"random": [{"pool": r, "mtbf_s": 15, "mttr_s": 3} for r in roles]}
    return raw


def _run(
    raw: dict[str, Any],
    probe_every_s: float = 0.5,
    whole: bool = False,
    before: Callable[[Cluster], None] | None = None,
) -> tuple[Cluster, list[str]]:
    """Run the scenario, checking the bookings of every front worker every
    ``probe_every_s`` simulated seconds (through the engine's stop check, which only
    reads; ``whole``: every booking is the request's whole prefill); returns the cluster
    after the run and the violations seen. ``before(cluster)`` runs before the run."""
    loaded = load_scenario(raw)
    s = loaded.scenario
    costs = build_costs(s)
    reqs = make_requests(loaded)
    cfg = engine_config(
        s,
        costs,
        0,
        build_topology(s),
        build_autoscalers(s, costs, int(reqs.prompt_tokens.mean())),
        prefix_chains=reqs.prefix_chains,
    )
    transfer = build_transfer(s) or (lambda nbytes, src, dst: 0.0)
    cluster = Cluster(reqs, cfg, transfer)
    if before is not None:
        before(cluster)
    bad: list[str] = []

    def probe(now_s: float, view: RequestView) -> bool:
        for w in cluster.front_workers:
            booked = w._booked
            assert booked is not None  # every front worker has a cache here
            if set(booked) != set(w.queue):
                bad.append(
                    f"{now_s}: worker {w.index} books {sorted(booked)}, queue {list(w.queue)}"
                )
            if w.queued_tokens != sum(booked.values()):
                bad.append(f"{now_s}: worker {w.index} queued {w.queued_tokens} != {booked}")
            rs = cluster.requests
            for rid, tokens in booked.items():
                full = rs.prefill_len(rid)
                if not 1 <= tokens <= full or (whole and tokens != full):
                    bad.append(f"{now_s}: request {rid} booked {tokens} of {full}")
        return False

    cluster.run(stop_check=probe, check_every_s=probe_every_s)
    return cluster, bad


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    arch=st.sampled_from(["disaggregated", "chunked", "vllm"]),
    policy=st.sampled_from(["cache_aware", "round_robin", "least_tokens"]),
    rate=st.sampled_from([0.5, 2.0, 6.0]),
    seed=st.integers(0, 50),
    failures=st.booleans(),
    timeout_s=st.sampled_from([None, 2.0]),
)
def test_queued_tokens_are_the_queued_bookings_and_return_to_zero(
    arch, policy, rate, seed, failures, timeout_s
):
    cluster, bad = _run(_scenario(arch, policy, rate, seed, failures, timeout_s))
    assert not bad, bad[:5]
    assert cluster.all_done.triggered  # every request ended before the horizon
    for w in cluster.front_workers:
        assert w.queued_tokens == 0 and not w.queue and w._booked == {}


def test_cache_aware_books_only_the_uncached_tokens():
    """Sessions re-send their conversation: under cache_aware most later turns find
    their prefix in the HBM of the worker they are routed to and book less than their
    prompt (the probe checks every booking is what the worker holds and takes back)."""
    raw = _scenario("disaggregated", "cache_aware", 2.0, 3, False, None)
    booked: list[tuple[int, int]] = []

    def record(cluster: Cluster) -> None:
        router = cluster.router._cache_aware
        assert router is not None
        choose = router.choose_booked

        def choose_booked(rid: int):
            w, tokens = choose(rid)
            booked.append((tokens, cluster.requests.prefill_len(rid)))
            return w, tokens

        router.choose_booked = choose_booked  # type: ignore[method-assign]

    cluster, bad = _run(raw, before=record)
    assert not bad, bad[:5]
    assert len(booked) >= len(cluster.requests)  # every request routed at least once
    less = [b for b, full in booked if b < full]
    assert len(less) > len(booked) // 2, (len(less), len(booked))
    assert all(1 <= b <= full for b, full in booked)


def test_other_policies_book_whole_prompts():
    cluster, bad = _run(_scenario("chunked", "least_tokens", 2.0, 3, True, None), whole=True)
    assert not bad, bad[:5]
    assert cluster.router._cache_aware is None
