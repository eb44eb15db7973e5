"""One handoff outside a run (disaggsim/fabric/estimate.py), checked against hand-derived
times from the link rates."""

from __future__ import annotations

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from disaggsim.fabric.estimate import estimate_handoff, pair_topology
from disaggsim.run import build_topology
from tests.conftest import REPO

NBYTES = 1.5e9


def test_same_node_moves_over_nvlink():
    e = estimate_handoff(pair_topology("same-node", "h100-sxm", 1), 0, 1, NBYTES)
    assert (e.path.kind, e.link, e.path.num_hops, e.path.num_shards) == ("nvlink", "nvlink", 2, 1)
    assert e.path_links == ("n0.g0.nvlink.out", "n0.g1.nvlink.in")
    assert e.latency_s == pytest.approx(10e-6)
    assert e.transfer_s == pytest.approx(NBYTES / 450e9 + 10e-6)
    assert e.exposed_s == pytest.approx(e.transfer_s)  # no prefill: all of it shows


def test_rail_aligned_nics_carry_one_shard_each():
    # tp 4 across nodes, one 200 Gb/s NIC per GPU: four shards at 25 GB/s each
    topo = pair_topology("cross-node-rdma", "h100-sxm", 4, nic_gbit_per_s=200)
    e = estimate_handoff(topo, 0, 1, NBYTES)
    assert (e.path.kind, e.link, e.path.num_shards) == ("rdma", "infiniband", 4)
    assert e.transfer_s == pytest.approx(NBYTES / (4 * 25e9) + 15e-6)
    assert e.bandwidth_bytes_per_s == pytest.approx(100e9)


def test_overlap_hides_all_but_the_last_layer():
    topo = pair_topology("cross-node-rdma", "h100-sxm", 1, nic_gbit_per_s=200)
    serial = NBYTES / 25e9  # 60 ms
    on = estimate_handoff(topo, 0, 1, NBYTES, prefill_s=1.0, num_layers=80, overlap=True)
    assert on.exposed_s == pytest.approx(serial / 80 + 15e-6, rel=1e-9)
    off = estimate_handoff(topo, 0, 1, NBYTES, prefill_s=1.0, num_layers=80, overlap=False)
    assert off.exposed_s == pytest.approx(serial + 15e-6, rel=1e-9)
    assert on.transfer_s == off.transfer_s  # the whole transfer does not depend on overlap


def test_setup_and_block_gathering_count_in_the_latency():
    loaded = load_scenario(
        REPO / "scenarios" / "fabric" / "nvlink.yaml",
        ["fabric.setup_latency_us=100", "fabric.per_block_us=2", "fabric.overlap=false"],
    )
    topo = build_topology(loaded.scenario)
    assert topo is not None
    # prefill worker 0 and decode worker 1 share node 0 (placement: pack), TP4 each
    e = estimate_handoff(topo, 0, 1, NBYTES, num_tokens=160)  # 10 blocks of 16 tokens
    assert e.path.kind == "nvlink" and e.path.num_shards == 4
    assert e.latency_s == pytest.approx(10e-6 + 100e-6 + 10 * 2e-6)
    assert e.transfer_s == pytest.approx(NBYTES / (4 * 450e9) + e.latency_s)


def test_pair_errors_name_the_cause():
    with pytest.raises(UserError, match="node 0 has 8 GPUs"):
        pair_topology("same-node", "h100-sxm", 8, label="--path")
    with pytest.raises(UserError, match="unknown path 'cross-rack'"):
        pair_topology("cross-rack", "h100-sxm", 1)  # type: ignore[arg-type]
