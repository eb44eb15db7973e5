"""MoE EP units spanning nodes on a topology fabric: each data-parallel rank placed as a
TP group inside a node, the unit's expert all-to-all moved as flows on its nodes' NICs
(contending with KV handoffs), and a lost unit losing nothing (its flows cancelled)."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

import disaggsim.engine.workers as workers_module
from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from disaggsim.run import build_costs, build_topology, simulate
from tests.test_moe_scenarios import EP_UNITS

# decode units of 16 GPUs (2 H100 nodes of 8 by the catalog), prefill units of 8
WIDE = copy.deepcopy(EP_UNITS)
WIDE["fabric"] = {"kind": "topology"}
WIDE["prefill_pool"] = {"gpu": "h100-sxm", "num_workers": 2, "tp": 1, "dp": 8}
WIDE["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 2, "tp": 1, "dp": 16, "ep": 16}
WIDE["workload"]["rate_per_s"] = 60.0
WIDE["sim"]["duration_s"] = 10.0
WIDE["failures"] = {"workers": [{"at_s": 6.0, "worker": "decode:0"}], "provision_s": 2.0}


def test_ranks_are_placed_as_tp_groups_inside_nodes():
    raw = copy.deepcopy(EP_UNITS)
    raw["fabric"] = {"kind": "topology", "gpus_per_node": 2}
    topo = build_topology(load_scenario(raw).scenario)
    used = set()
    for w in topo.workers:
        ranks = w.ranks or ((w.node, w.gpus),)
        assert len(ranks) == {"prefill": 2, "decode": 4}[w.role]
        for node, gpus in ranks:
            assert len(gpus) == 1  # tp 1
            for g in gpus:
                assert (node, g) not in used  # no GPU placed twice
                used.add((node, g))
        assert (w.node, w.gpus) == ranks[0]
    assert len(used) == 2 + 2 * 4
    by_key = {w.key: w for w in topo.workers}
    assert by_key["prefill.0"].nodes == (0,)
    assert by_key["decode.0"].nodes == (1, 2) and by_key["decode.1"].nodes == (3, 4)
    # only a unit across nodes has an all-to-all path: two routes whatever its size, the
    # first rank's NIC sending to the next node and receiving from the previous one
    assert topo.host_path(by_key["prefill.0"].index, "a2a") is None
    a2a = topo.host_path(by_key["decode.0"].index, "a2a")
    assert a2a is not None and a2a.num_shards == 2
    ids = [[topo.links[i].id for i in r.links] for r in a2a.routes]
    assert ids == [["n1.nic0.out", "n2.nic0.in"], ["n2.nic0.out", "n1.nic0.in"]]
    # a NIC per GPU (the default): each route carries one rank's share; a shared NIC,
    # its node's ranks'
    assert topo.a2a_share(by_key["decode.0"].index) == 2 * 1 / 4
    raw["fabric"]["nic"] = {"per_gpu": False}
    shared = build_topology(load_scenario(raw).scenario)
    assert shared.a2a_share(by_key["decode.0"].index) == 2 * 2 / 4


def test_explicit_placement_of_multi_rank_workers_is_one_line():
    raw = copy.deepcopy(EP_UNITS)
    raw["fabric"] = {
        "kind": "topology",
        "placement": {"explicit": {"prefill.0": [0, [0, 1]], "decode.0": [1, [0]]}},
    }
    with pytest.raises(UserError, match=r"placement\.explicit: .* data-parallel ranks"):
        simulate(raw)


def test_all_to_all_flows_load_the_nics_and_slow_handoffs():
    """The same run with and without the all-to-all flows: the flows move the cost
    model's RDMA bytes on the decode units' NICs, so the busiest link is busier and KV
    handoffs into those nodes take longer."""
    cost = build_costs(load_scenario(copy.deepcopy(WIDE)).scenario)["decode"]
    t = cost.all_to_all_traffic(64, 0)
    assert t.nodes == 2 and t.dispatch_rdma_bytes > 0 and t.combine_rdma_bytes > 0
    moved = []
    original = workers_module.Worker._copy

    def counted(self, nbytes, kind, done):
        if kind == "a2a":
            moved.append(nbytes)
        return original(self, nbytes, kind, done)

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(workers_module.Worker, "_copy", counted)
        on = simulate(copy.deepcopy(WIDE))
        mp.setattr(workers_module.Worker, "use_all_to_all", lambda self, share: None)
        off = simulate(copy.deepcopy(WIDE))
    finally:
        mp.undo()
    assert sum(moved) > 1e9
    a, b = on.summary, off.summary
    for s in (a, b):
        assert s["num_completed"] + s["num_rejected"] + s["num_unfinished"] == s["num_requests"]
    assert a["link_util_max"] > b["link_util_max"]
    assert a["kv_transfer_p50_s"] > b["kv_transfer_p50_s"]


def test_losing_a_unit_across_nodes_loses_nothing_and_repeats_exactly():
    a = simulate(copy.deepcopy(WIDE))
    b = simulate(copy.deepcopy(WIDE))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    s = a.summary
    assert s["num_worker_failures"] == 1
    assert s["num_completed"] + s["num_rejected"] + s["num_unfinished"] == s["num_requests"]
    redone = a.requests[a.requests.num_prefills > 1]
    assert len(redone) > 0 and (redone.finish_at_s.dropna() > 6.0).all()
