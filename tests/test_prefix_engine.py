"""Prefix caching in the engine (docs/prefix-caching.md, "Engine integration contract"):
hand-derived timelines with the constant-cost double, the cache's invariants under
random stressed clusters with failures, determinism, the ideal store against the
trace's own reuse figure, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disaggsim.cache import CacheConfig, WorkerKvCache
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, WorkerFailureEvent, run_cluster
from disaggsim.engine.prefix import PrefixSetup
from disaggsim.metrics.reconstruct import request_frame
from disaggsim.run import simulate
from disaggsim.workload.chains import PrefixChains
from disaggsim.workload.requests import Requests
from disaggsim.workload.reuse import trace_prefix_reuse
from tests.conftest import REPO, SHARED_DATA
from tests.test_engine_failures import _check

DECODE = ConstantCost(prefill_base_s=0.1, decode_base_s=0.01, kv_capacity_tokens=100_000)


def _chains(chains: list[list[int]], block_tokens: int) -> PrefixChains:
    ids = np.array([b for c in chains for b in c], dtype=np.int64)
    offsets = np.zeros(len(chains) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in chains], out=offsets[1:])
    return PrefixChains(ids, offsets, block_tokens, int(ids.max()) + 1)


def _run(reqs, prefill_cost, cache, promote_time=None, policy="least_tokens"):
    setup = PrefixSetup(cache=cache, chains=reqs.prefix_chains)
    if promote_time is not None:
        setup = PrefixSetup(cache=cache, chains=reqs.prefix_chains, promote_time=promote_time)
    cfg = EngineConfig(
        pools=(
            PoolSpec("prefill", 1, prefill_cost, 8, 10_000),
            PoolSpec("decode", 1, DECODE, 8, 10_000),
        ),
        block_tokens=1,
        prefill_policy=policy,
        prefix=setup,
    )
    return run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)


def test_a_repeated_prompt_prefills_only_its_uncached_suffix():
    """Blocks of 4 tokens. r0 (t=0) computes its 10 tokens: 0.1 + 10 × 0.01 = 0.2 s. r1
    (t=1) repeats the prompt: radix cached the partial last block too, so 9 tokens hit
    (the last is always computed): 0.1 + 1 × 0.01 = 0.11 s. r2 (t=2) shares the first
    two blocks and differs after: 8 hit, 4 computed: 0.14 s."""
    cost = ConstantCost(prefill_base_s=0.1, prefill_per_token_s=0.01, kv_capacity_tokens=1000)
    chains = [[0, 1, 2], [0, 1, 2], [0, 1, 3]]
    reqs = Requests(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_tokens=np.array([10, 10, 12]),
        output_tokens=np.array([3, 3, 3]),
        prefix_chains=_chains(chains, 4),
    )
    raw = _run(reqs, cost, CacheConfig(policy="radix"))
    np.testing.assert_allclose(raw.log.prefill_end_at_s, [0.2, 1.11, 2.14])
    assert raw.prefix_log is not None
    hbm, dram, remote = raw.prefix_log.columns()
    assert hbm.tolist() == [0, 9, 8] and dram.tolist() == [0, 0, 0] == remote.tolist()
    # lru (vLLM) caches full blocks only: r1 hits 8 tokens and computes 2
    raw = _run(reqs, cost, CacheConfig(policy="lru"))
    np.testing.assert_allclose(raw.log.prefill_end_at_s, [0.2, 1.12, 2.14])
    # the prefill iterations logged the computed tokens
    it = [w for w in raw.workers if w.role == "prefill"][0].steps.prefill_iters
    assert list(it.num_tokens) == [10, 2, 4]


def test_a_dram_hit_is_promoted_before_the_prefill_starts():
    """HBM of 14 tokens. r0 (chain A: 4+4+2 tokens) is cached; r1 (chain B, 10 tokens)
    needs room: A's last two blocks (leaves first) are evicted to DRAM, its first block
    stays. r2 repeats A: 4 tokens hit in HBM, 5 in DRAM (9 in all, the last token is
    computed); the 6 DRAM tokens (6,000 bytes at 1,000 B/token) are promoted first, taking
    0.06 s with this promotion rate, then 0.1 + 1 × 0.01 s of prefill: it ends at 2.17."""
    cost = ConstantCost(prefill_base_s=0.1, prefill_per_token_s=0.01, kv_capacity_tokens=14)
    reqs = Requests(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_tokens=np.array([10, 10, 10]),
        output_tokens=np.array([2, 2, 2]),
        max_tokens=np.array([4, 4, 4]),
        prefix_chains=_chains([[0, 1, 2], [3, 4, 5], [0, 1, 2]], 4),
    )
    cache = CacheConfig.model_validate({"tiers": {"dram": {"capacity_gib_per_node": 1}}})
    raw = _run(reqs, cost, cache, promote_time=lambda c, pcie, nic: (pcie + nic) * 1e-5)
    np.testing.assert_allclose(raw.log.prefill_end_at_s, [0.2, 1.2, 2.17])
    hbm, dram, remote = raw.prefix_log.columns()
    assert (hbm[2], dram[2], remote[2]) == (4, 5, 0)
    ts = pd.DataFrame({"w": raw.samples.worker, "hbm": raw.samples.cache_hbm_tokens})
    assert ts.loc[ts["w"] == 0, "hbm"].max() <= 14
    # DRAM got A's two evicted blocks (6 tokens), then B's two when r2's promotion made
    # room (6 more; DRAM keeps copies of promoted blocks: the tiers are inclusive)
    assert sorted(set(raw.samples.cache_dram_tokens)) == [0, 6, 12]


def test_on_a_topology_a_promotion_is_a_flow_on_the_workers_pcie_link():
    """The same three requests on a topology fabric (1 GPU per worker, host DRAM over a
    1 GB/s PCIe link, 5 µs per hop): r2's 6,000 bytes of DRAM hits move host → GPU over
    the prefill GPU's PCIe link as a flow, 5 µs + 6 µs, before its 0.11 s prefill. A
    remote-store promotion takes the NIC's in-link the same way."""
    from disaggsim.fabric import build_topology, parse_topology_config, pool_layouts

    cost = ConstantCost(prefill_base_s=0.1, prefill_per_token_s=0.01, kv_capacity_tokens=14)
    reqs = Requests(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_tokens=np.array([10, 10, 10]),
        output_tokens=np.array([2, 2, 2]),
        max_tokens=np.array([4, 4, 4]),
        prefix_chains=_chains([[0, 1, 2], [3, 4, 5], [0, 1, 2]], 4),
    )
    fab = parse_topology_config(
        {"kind": "topology", "gpus_per_node": 1, "pcie": {"gb_per_s": 1.0, "latency_us": 5}}
    )
    topo = build_topology(fab, pool_layouts([("prefill", "h100-sxm", 1, 1),
                                             ("decode", "h100-sxm", 1, 1)]),  # fmt: skip
                          cache_paths=True)  # fmt: skip
    h2d = topo.host_path(0, "h2d")
    assert h2d is not None and [topo.links[i].id for r in h2d.routes for i in r.links] == [
        "n0.g0.pcie.in"
    ]
    assert topo.host_path(0, "nic.in") is not None and topo.host_path(1, "h2d") is None
    for tiers, expect_end in (
        ({"dram": {"capacity_gib_per_node": 1}}, 2.0 + 5e-6 + 6e-6 + 0.11),
        ({"remote": {"capacity_gib": "unbounded"}}, None),
    ):
        cfg = EngineConfig(
            pools=(
                PoolSpec("prefill", 1, cost, 8, 10_000),
                PoolSpec("decode", 1, DECODE, 8, 10_000),
            ),
            block_tokens=1,
            topology=topo,
            prefix=PrefixSetup(
                cache=CacheConfig.model_validate({"tiers": tiers}),
                chains=reqs.prefix_chains,
                promote_time=lambda c, pcie, nic: 1.0,  # not used: flows on a topology
            ),
        )
        raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.0)
        _check(reqs, cfg, raw)
        end = raw.log.prefill_end_at_s
        if expect_end is not None:
            assert end[2] == pytest.approx(expect_end, abs=1e-12)
        else:  # remote hits: r2 hits all it computed earlier through the NIC's in-link
            hbm, dram, remote = raw.prefix_log.columns()
            assert remote[2] > 0 and dram[2] == 0
            assert 2.11 < end[2] < 2.2


@pytest.mark.parametrize("scheduler", ["vllm", "chunked"])
def test_colocated_workers_prefill_only_the_uncached_suffix(scheduler):
    """The repeated prompt of the first test on one colocated worker: r1 hits 9 of its 10
    tokens. vllm: a prefill-only iteration of 0.1 + 1 × 0.01 s. chunked: the first chunk
    starts after the cached prefix, so r1's prefill is one mixed step computing 1 token."""
    cost = ConstantCost(
        prefill_base_s=0.1, prefill_per_token_s=0.01, decode_base_s=0.01, kv_capacity_tokens=1000
    )
    reqs = Requests(
        arrival_s=np.array([0.0, 1.0]),
        prompt_tokens=np.array([10, 10]),
        output_tokens=np.array([3, 3]),
        prefix_chains=_chains([[0, 1, 2], [0, 1, 2]], 4),
    )
    cfg = EngineConfig(
        pools=(PoolSpec("colocated", 1, cost, 8, 10_000, scheduler),),
        block_tokens=1,
        kv_admission="on_demand",
        prefix=PrefixSetup(cache=CacheConfig(), chains=reqs.prefix_chains),
    )
    raw = run_cluster(reqs, cfg)
    _check(reqs, cfg, raw)
    hbm, _, _ = raw.prefix_log.columns()
    assert hbm.tolist() == [0, 9]
    # vllm: a prefill iteration 0.1 + n × 0.01; chunked: a prefill-only mixed step is the
    # prefill part plus its base (ConstantCost.mixed_time_s)
    np.testing.assert_allclose(raw.log.prefill_end_at_s, [0.2, 1.11])
    it = raw.workers[0].steps.prefill_iters
    assert list(it.num_tokens) == [10, 1]


# -- invariants under stress ------------------------------------------------------------


@st.composite
def cached_cluster(draw):
    """Random requests over a few shared prefixes, 1-3 prefill workers with small HBM,
    optional DRAM and remote tiers, both policies, both routers, worker failures."""
    n = draw(st.integers(1, 30))
    bt = draw(st.sampled_from([2, 8, 32]))
    stems = draw(st.lists(st.integers(1, 6), min_size=3, max_size=3))  # blocks per stem
    next_id = 1000
    chains, prompts = [], []
    for _ in range(n):
        stem = draw(st.integers(0, 2))
        tail = draw(st.integers(0, 3))
        chain = [stem * 100 + k for k in range(stems[stem])] + list(range(next_id, next_id + tail))
        next_id += tail
        last = draw(st.integers(1, bt))  # tokens of the last block
        chains.append(chain)
        prompts.append((len(chain) - 1) * bt + last)
    # a partial last block is its own id (it names the block's tokens, not only its hash)
    chains = [c[:-1] + [c[-1] * 1000 + p % bt] for c, p in zip(chains, prompts, strict=True)]
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    reqs = Requests(
        np.cumsum(gaps),
        np.array(prompts),
        np.array(outs),
        prefix_chains=_chains(chains, bt),
    )
    longest = max(prompts) + max(outs)
    pre = ConstantCost(
        prefill_base_s=draw(st.floats(0.001, 0.03)),
        prefill_per_token_s=draw(st.floats(0.0, 1e-3)),
        kv_capacity_tokens=draw(st.integers(longest, 4 * longest)),
    )
    dec = ConstantCost(decode_base_s=0.005, kv_capacity_tokens=10 * longest)
    n_pre = draw(st.integers(1, 3))
    arch = draw(st.sampled_from(["disaggregated", "vllm", "chunked"]))
    tiers = {}
    if draw(st.booleans()):
        tiers["dram"] = {"capacity_gib_per_node": draw(st.sampled_from([0.0, 1e-5, 1.0]))}
    if draw(st.booleans()):
        tiers["remote"] = {"capacity_gib": draw(st.sampled_from(["unbounded", 1e-5]))}
    cache = CacheConfig.model_validate(
        {"policy": draw(st.sampled_from(["lru", "radix"])), "tiers": tiers}
    )
    failures = tuple(
        WorkerFailureEvent(
            draw(st.floats(0.0, 3.0)),
            draw(st.integers(0, n_pre if arch == "disaggregated" else n_pre - 1)),
            0.5,
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    topology = None
    if arch == "disaggregated" and draw(st.booleans()):  # copies as flows beside handoffs
        from disaggsim.fabric import build_topology, parse_topology_config, pool_layouts

        fab = parse_topology_config(
            {
                "kind": "topology",
                "gpus_per_node": 2,
                "nic": {"gbit_per_s": 0.1, "per_gpu": draw(st.booleans())},
                "pcie": {"gb_per_s": draw(st.floats(0.001, 0.05))},
            }
        )
        layouts = pool_layouts([("prefill", "h100-sxm", n_pre, 1), ("decode", "h100-sxm", 1, 1)])
        topology = build_topology(fab, layouts, cache_paths=True)
    if arch == "disaggregated":
        pools = (
            PoolSpec("prefill", n_pre, pre, draw(st.integers(1, 4)), 10_000),
            PoolSpec("decode", 1, dec, 8, 10_000),
        )
    else:  # colocated: the prefill cost's memory, decoding too (on_demand growth)
        col = ConstantCost(
            prefill_base_s=pre.prefill_base_s,
            prefill_per_token_s=pre.prefill_per_token_s,
            decode_base_s=0.005,
            kv_capacity_tokens=pre.kv_capacity_tokens + draw(st.integers(0, 2 * longest)),
        )
        budget = draw(st.integers(longest, 4 * longest))
        pools = (PoolSpec("colocated", n_pre, col, draw(st.integers(1, 4)), budget, arch),)
    cfg = EngineConfig(
        pools=pools,
        topology=topology,
        kv_admission="on_demand" if arch != "disaggregated" else "reserve_full",
        block_tokens=draw(st.sampled_from([1, 4])),
        prefill_policy=draw(st.sampled_from(["cache_aware", "least_tokens", "round_robin"])),
        backpressure=draw(st.sampled_from(["none", "kv_aware"])),
        worker_failures=failures,
        prefix=PrefixSetup(
            cache=cache,
            chains=reqs.prefix_chains,
            promote_time=lambda c, pcie, nic: (pcie + nic) * 1e-7,
            gpus_per_node=draw(st.sampled_from([1, 2, 8])),
        ),
        horizon_s=200.0,
    )
    return reqs, cfg


def _pins_kept(cache: WorkerKvCache) -> None:
    """Every block a held request pinned is still cached (in use, never evicted), and
    HBM holds no more than its capacity."""
    for held in cache._held.values():
        for bid in held.pinned:
            assert bid in cache._blocks, bid
    assert cache.tokens_total <= cache.capacity_tokens
    assert 0 <= cache.pinned_tokens <= cache.cached_tokens


@pytest.fixture
def checked_caches(monkeypatch):
    """Check the cache invariants after every engine call that changes a cache."""
    for name in ("admit", "commit", "release", "clear"):
        original = getattr(WorkerKvCache, name)

        def wrapped(self, *args, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            _pins_kept(self)
            return out

        monkeypatch.setattr(WorkerKvCache, name, wrapped)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(cached_cluster())
def test_caching_loses_nothing_and_never_evicts_in_use(checked_caches, case):
    reqs, cfg = case
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    frame = _check(reqs, cfg, raw)  # conservation, token order, KV within capacity
    s = raw.samples
    w = np.asarray(s.worker)
    hbm = np.asarray(s.cache_hbm_tokens)
    caps = np.array([x.kv_capacity_tokens for x in raw.workers])
    assert (hbm <= caps[w]).all()
    assert (np.asarray(s.cache_hbm_pinned_tokens) <= hbm).all()
    # a failed worker's cache is empty when it goes down (sampled at that instant)
    at = np.asarray(s.at_s)
    for f in raw.failures:
        rows = np.flatnonzero((w == f.worker) & (at == f.at_s))
        if len(rows):
            assert hbm[rows[-1]] == 0
    # hit tokens: at most the prompt less one, and only for requests that were prefilled
    hbm_hit, dram_hit, remote_hit = raw.prefix_log.columns()
    hit = hbm_hit + dram_hit + remote_hit
    assert (hit <= np.maximum(reqs.prompt_tokens - 1, 0)).all()
    assert (hit[frame["num_prefills"].to_numpy() == 0] == 0).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cached_cluster())
def test_caching_runs_are_deterministic(case):
    reqs, cfg = case
    a = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    b = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    pd.testing.assert_frame_equal(request_frame(a, 0.0)[0], request_frame(b, 0.0)[0])
    assert [list(c) for c in a.prefix_log.columns()] == [list(c) for c in b.prefix_log.columns()]


# -- scenarios ----------------------------------------------------------------------------

TRACE = SHARED_DATA / "traces" / "mooncake_conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not TRACE.is_file(), reason="needs ../shared/data")


def _slice(tmp_path, window_s: float):
    """The trace's first ``window_s`` seconds as a file of its own."""
    out = tmp_path / "slice.jsonl"
    with TRACE.open() as f, out.open("w") as g:
        for line in f:
            if line.strip() and json.loads(line)["timestamp"] < window_s * 1e3:
                g.write(line)
    return out


@needs_trace
def test_ideal_store_reaches_the_reuse_the_trace_allows(tmp_path):
    """mooncake-ideal on the trace's first 10 minutes: with an unbounded shared store the
    run's prefix_hit_share lies between the trace's own figures (computed from the file
    by workload/reuse.py, no cache code): blocks of requests stamped at least the run's
    longest TTFT plus one 3 s timestamp bucket earlier (the scenario spreads each
    arrival within its bucket, so such a request arrived at least the longest TTFT
    earlier and its blocks were surely computed by then), and every earlier or
    simultaneous request's blocks (spreading keeps the buckets' order)."""
    path = _slice(tmp_path, 600)
    res = simulate(
        REPO / "scenarios" / "prefix" / "mooncake-ideal.yaml",
        [f"workload.path={path}", "sim.duration_s=600"],
    )
    s = res.summary
    assert s["num_completed"] == s["num_requests"]
    ttft_max = float(res.requests["ttft_s"].max())
    assert res.scenario.workload.bucketed_timestamps == "spread"
    low = trace_prefix_reuse(path, min_age_s=ttft_max + 3.0).prefix_hit_share
    high = trace_prefix_reuse(path, same_time_hits=True).prefix_hit_share
    assert low - 1e-12 <= s["prefix_hit_share"] <= high + 1e-12, (low, s["prefix_hit_share"], high)
    assert s["prefix_hit_share"] > 0.2
    tiers = s["prefix_hit_share_hbm"] + s["prefix_hit_share_dram"] + s["prefix_hit_share_remote"]
    assert tiers == pytest.approx(s["prefix_hit_share"], abs=1e-12)
    assert s["prefix_hit_share_dram"] == 0.0  # no DRAM tier
    ts = res.timeseries[res.timeseries["role"] == "prefill"]
    assert (ts["cache_remote_tokens"].diff().dropna() >= 0).all()  # unbounded: only grows
    assert ts["cache_remote_tokens"].iloc[-1] > 0


@needs_trace
def test_cache_aware_routing_reuses_more_than_round_robin(tmp_path):
    """Same deployment, same trace slice: the cache-aware router finds more cached
    prefix than round robin (conversations return to the worker holding their turns)."""
    path = _slice(tmp_path, 900)
    shares = {}
    for name in ("mooncake-cache-aware", "mooncake-round-robin"):
        res = simulate(
            REPO / "scenarios" / "prefix" / f"{name}.yaml",
            [f"workload.path={path}", "sim.duration_s=900", "sim.warmup_s=0"],
        )
        assert res.summary["num_completed"] == res.summary["num_requests"]
        shares[name] = res.summary["prefix_hit_share"]
    assert shares["mooncake-cache-aware"] > shares["mooncake-round-robin"] > 0


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["cache.policy=fifo"], "cache.policy: unknown cache policy 'fifo' (allowed: lru, radix)"),
        (["router.prefill_policy=cache_aware", "cache=null"], "cache_aware needs a cache:"),
        (["cache.tiers.dram.capacity_gib_per_node=-1"], "capacity_gib_per_node"),
    ],
)
def test_bad_cache_input_is_one_line_and_exit_2(tmp_path, sets, needle):
    scenario = REPO / "scenarios" / "prefix" / "mooncake-cache-aware.yaml"
    args = [sys.executable, "-m", "disaggsim", "run", str(scenario), "--out", str(tmp_path / "o")]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "o").exists()


def test_cache_on_a_workload_without_prefix_chains_is_refused(tmp_path):
    args = [
        sys.executable, "-m", "disaggsim", "run", "scenarios/ci/disaggregated.yaml",
        "--set", "cache.policy=radix", "--out", str(tmp_path / "o"),
    ]  # fmt: skip
    p = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2, p.stderr
    assert "cache: the workload has no prefix chains" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run(
        [sys.executable, "-m", "disaggsim", "run", "scenarios/ci/colocated-vllm.yaml",
         "--set", "cache.policy=radix", "--set", "kv.admission=reserve_full",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "cache: prefix caching on a colocated pool needs kv.admission on_demand" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_on_a_topology_a_workers_dram_is_its_placed_nodes():
    """Placement pair puts prefill.0 with decode.0 on node 0 and prefill.1 with decode.1
    on node 1: the two prefill workers read different DRAM tiers (grouping by worker
    order alone would have put both on one 8-GPU node)."""
    from disaggsim.engine.cluster import Cluster
    from disaggsim.fabric import build_topology, parse_topology_config, pool_layouts

    fab = parse_topology_config(
        {"kind": "topology", "gpus_per_node": 2, "placement": {"policy": "pair"}}
    )
    layouts = pool_layouts([("prefill", "h100-sxm", 2, 1), ("decode", "h100-sxm", 2, 1)])
    topo = build_topology(fab, layouts, cache_paths=True)
    reqs = Requests(
        arrival_s=np.array([0.0]),
        prompt_tokens=np.array([10]),
        output_tokens=np.array([2]),
        prefix_chains=_chains([[0, 1, 2]], 4),
    )
    cost = ConstantCost(kv_capacity_tokens=1000)
    cache = CacheConfig.model_validate({"tiers": {"dram": {"capacity_gib_per_node": 1}}})
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 2, cost, 8, 10_000), PoolSpec("decode", 2, DECODE, 8, 10_000)),
        topology=topo,
        prefix=PrefixSetup(cache=cache, chains=reqs.prefix_chains),
    )
    cluster = Cluster(reqs, cfg, lambda nbytes, s, d: 0.0)
    assert cluster.prefix is not None
    placed = {p.index: p.node for p in topo.workers}
    assert cluster.prefix.node_of == {0: placed[0], 1: placed[1]} and placed[0] != placed[1]
    a, b = (cluster.prefix.by_worker[i].dram for i in (0, 1))
    assert a is not None and b is not None and a is not b
