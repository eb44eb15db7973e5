"""An MoE EP unit sits on the nodes its all-to-all is priced for. A topology fabric places
a unit that fits a node inside one node, and a larger one on fresh nodes from their first
GPU (whole TP groups per node, the fewest nodes), as vLLM (one ``vllm serve`` per node),
SGLang (``--nnodes``) and Dynamo (``multinode.nodeCount``) run them; the cost model
counts the same nodes. Before, ``pack`` filled nodes rank by rank, so a unit could start
mid-node and span one node more than its cost assumed (no RDMA priced, no flows moved).

Expected bytes by hand from DeepEP's low-latency volume (docs/costmodel.md): each token
sends ``top_k`` copies, ``top_k (r - 1) / ep`` over NVLink and ``top_k (ep - r) / ep``
over RDMA, ``r`` the unit's GPUs in one node."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.moe import unit_node_gpus, unit_nodes
from disaggsim.fabric import build_topology as place
from disaggsim.fabric import pool_layouts
from disaggsim.fabric.config import parse_topology_config
from disaggsim.run import build_costs, build_topology
from tests.test_moe_scenarios import EP_UNITS

# qwen3-30b-a3b, fp8-block: top-8 of 128 experts, 48 MoE layers, dispatch 2048 B + a
# 4-byte scale per 128 values a token
DISPATCH_B = 2048 + 2048 // 128 * 4


def scenario(fabric: dict, prefill: dict, decode: dict) -> dict:
    raw = copy.deepcopy(EP_UNITS)
    raw.pop("failures")
    raw["fabric"] = fabric
    raw["prefill_pool"] = {"gpu": "h100-sxm", "num_workers": 1, **prefill}
    raw["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 1, **decode}
    return raw


def test_a_unit_of_a_whole_node_after_a_half_node_takes_the_next_node():
    # catalog nodes of 8: a 4-GPU prefill unit on node 0, then an 8-GPU decode unit. Rank
    # by rank it went to GPUs 4-7 of node 0 and 0-3 of node 1 while its cost priced one
    # node (no RDMA, so no all-to-all flows either)
    s = load_scenario(
        scenario({"kind": "topology"}, {"tp": 1, "dp": 4}, {"tp": 1, "dp": 8, "ep": 8})
    ).scenario
    topo = build_topology(s)
    by_key = {w.key: w for w in topo.workers}
    assert by_key["prefill.0"].ranks == tuple((0, (g,)) for g in range(4))
    decode = by_key["decode.0"]
    assert decode.ranks == tuple((1, (g,)) for g in range(8))
    assert decode.nodes == (1,)
    assert topo.host_path(decode.index, "a2a") is None  # one node: nothing over the NICs
    t = build_costs(s)["decode"].all_to_all_traffic(64, 0)  # 8 tokens a GPU
    assert t.nodes == 1 and t.dispatch_rdma_bytes == 0 and t.combine_rdma_bytes == 0
    assert t.dispatch_nvlink_bytes == 8 * 7 * DISPATCH_B == 118_272


def test_a_unit_that_fits_a_node_never_straddles_two():
    # 6 GPUs of node 0 taken: a 4-GPU unit goes whole to node 1 (was 2 + 2), the second
    # one beside it
    s = load_scenario(
        scenario(
            {"kind": "topology"},
            {"tp": 2, "dp": 3},
            {"tp": 1, "dp": 4, "ep": 4, "num_workers": 2},
        )
    ).scenario
    by_key = {w.key: w for w in build_topology(s).workers}
    assert by_key["prefill.0"].ranks == ((0, (0, 1)), (0, (2, 3)), (0, (4, 5)))
    assert by_key["decode.0"].ranks == tuple((1, (g,)) for g in range(4))
    assert by_key["decode.1"].ranks == tuple((1, (g,)) for g in range(4, 8))


def test_a_unit_larger_than_a_node_starts_on_a_fresh_node_with_whole_tp_groups():
    # nodes of 6, decode tp4 x dp2 (ep 8): a node holds one TP4 rank, so the unit spans
    # 2 nodes of 4 GPUs each (r = 4), not 6 + 2 (r = 6, as counting GPUs alone said)
    s = load_scenario(
        scenario(
            {"kind": "topology", "gpus_per_node": 6},
            {"tp": 1, "dp": 2},
            {"tp": 4, "dp": 2, "ep": 8},
        )
    ).scenario
    topo = build_topology(s)
    decode = next(w for w in topo.workers if w.role == "decode")
    assert decode.ranks == ((1, (0, 1, 2, 3)), (2, (0, 1, 2, 3)))
    assert topo.host_path(decode.index, "a2a") is not None
    cost = build_costs(s)["decode"]
    assert cost.nodes == 2
    t = cost.all_to_all_traffic(64, 0)  # 64 sequences over 8 GPUs: 8 tokens a GPU
    # 8 copies a token: 8 x 3/8 = 3 to the other GPUs of its node, 8 x 4/8 = 4 to the
    # other node (with r = 6 it was 5 and 2: 84,480 and 33,792 B)
    assert t.dispatch_nvlink_bytes == 8 * 3 * DISPATCH_B == 50_688
    assert t.dispatch_rdma_bytes == 8 * 4 * DISPATCH_B == 67_584


def test_unit_nodes_by_hand():
    assert [unit_nodes(1, dp, 8) for dp in (1, 4, 8, 9, 16, 17)] == [1, 1, 1, 2, 2, 3]
    assert unit_nodes(4, 2, 6) == 2 and unit_node_gpus(4, 2, 6) == 4
    assert unit_nodes(2, 3, 8) == 1 and unit_node_gpus(2, 3, 8) == 6
    assert unit_nodes(3, 5, 8) == 3 and unit_node_gpus(3, 5, 8) == 6


pool = st.tuples(
    st.sampled_from([1, 2, 4]),  # tp
    st.integers(1, 6),  # dp
    st.integers(1, 3),  # workers
)


@settings(max_examples=150, deadline=None)
@given(
    gpn=st.sampled_from([4, 6, 8]),
    policy=st.sampled_from(["pack", "spread", "pair"]),
    pre=pool,
    dec=pool,
)
def test_every_unit_spans_the_nodes_its_cost_counts(gpn, policy, pre, dec):
    cfg = parse_topology_config(
        {"kind": "topology", "gpus_per_node": gpn, "placement": {"policy": policy}}
    )
    layouts = pool_layouts(
        [
            ("prefill", "h100-sxm", pre[2], pre[0], pre[1]),
            ("decode", "h100-sxm", *dec[2:], dec[0], dec[1]),
        ]
    )
    topo = place(cfg, layouts)
    used: set[tuple[int, int]] = set()
    for w in topo.workers:
        ranks = w.ranks or ((w.node, w.gpus),)
        assert len(w.nodes) == unit_nodes(w.tp, len(ranks), gpn)
        per_node = {n: sum(len(g) for m, g in ranks if m == n) for n in w.nodes}
        assert max(per_node.values()) == unit_node_gpus(w.tp, len(ranks), gpn)
        for node, gpus in ranks:  # a rank's TP group: consecutive GPUs of one node
            assert len(gpus) == w.tp and gpus == tuple(range(gpus[0], gpus[0] + w.tp))
            assert 0 <= gpus[0] and gpus[-1] < gpn
            for g in gpus:
                assert (node, g) not in used
                used.add((node, g))
        if len(w.nodes) > 1:  # a unit over nodes starts a node of its own
            assert ranks[0][1][0] == 0
