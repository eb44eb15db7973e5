"""A topology fabric's ``gpus_per_node`` sets both where an MoE unit's ranks go and how
its expert all-to-all splits between NVLink and RDMA (the cost model's volume used to
count nodes from the GPU catalog whatever the fabric said). Expected bytes by hand from
DeepEP's low-latency volume (docs/costmodel.md): each token sends ``top_k`` copies,
``top_k (r - 1) / ep`` of them over NVLink and ``top_k (ep - r) / ep`` over RDMA, with
``r = min(ep, gpus_per_node)`` ranks in a node."""

from __future__ import annotations

import copy

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.moe import build_cost
from disaggsim.errors import UserError
from disaggsim.run import build_costs, build_topology
from tests.test_moe_scenarios import EP_UNITS

# qwen3-30b-a3b: hidden 2048, top-8 of 128 experts, 48 MoE layers; fp8-block weights
# dispatch FP8 with a 4-byte scale per 128 values (2048 + 64 B a token), combine bf16
DISPATCH_B = 2048 + 2048 // 128 * 4
COMBINE_B = 2048 * 2


def unit_of_eight(fabric: dict) -> dict:
    raw = copy.deepcopy(EP_UNITS)
    raw["fabric"] = fabric
    raw["prefill_pool"] = {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "dp": 4}
    raw["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "dp": 8, "ep": 8}
    raw.pop("failures")
    return raw


def test_node_size_of_the_fabric_sets_the_all_to_all_split():
    # 64 decode sequences over 8 ranks: 8 tokens a GPU, low-latency kernels (decode only)
    catalog = build_costs(load_scenario(unit_of_eight({"kind": "topology"})).scenario)
    t8 = catalog["decode"].all_to_all_traffic(64, 0)
    assert (t8.mode, t8.num_layers, t8.nodes) == ("low_latency", 48, 1)
    # 8 ranks in one H100 node: 7 of the 8 copies over NVLink, none over RDMA
    assert t8.dispatch_nvlink_bytes == 8 * 7 * DISPATCH_B == 118_272
    assert t8.dispatch_rdma_bytes == 0 and t8.combine_rdma_bytes == 0

    raw = unit_of_eight({"kind": "topology", "gpus_per_node": 4})
    s = load_scenario(raw).scenario
    small = build_costs(s)["decode"]
    t4 = small.all_to_all_traffic(64, 0)
    # nodes of 4: r = 4, two nodes; 8 x 3/8 copies over NVLink, 8 x 4/8 over RDMA
    assert t4.nodes == 2
    assert t4.dispatch_nvlink_bytes == 8 * 3 * DISPATCH_B == 50_688
    assert t4.dispatch_rdma_bytes == 8 * 4 * DISPATCH_B == 67_584
    assert t4.combine_rdma_bytes == 8 * 4 * COMBINE_B == 131_072
    # the placement agrees: after the prefill unit's node, the decode unit's ranks sit
    # on two nodes of 4
    topo = build_topology(s)
    (decode,) = [w for w in topo.workers if w.role == "decode"]
    assert decode.nodes == (1, 2)
    # and the step prices the RDMA share: a decode step of the split unit is slower
    assert small.decode_time_s(64, 64 * 1000) > catalog["decode"].decode_time_s(64, 64 * 1000)


def test_a_link_fabric_keeps_the_catalog_node():
    cost = build_costs(load_scenario(unit_of_eight({"link": "infiniband"})).scenario)["decode"]
    assert cost.gpus_per_node == 8 and cost.all_to_all_traffic(64, 0).nodes == 1


def test_bad_node_size_is_one_line():
    with pytest.raises(UserError, match=r"^gpus_per_node: must be a positive integer, got 0$"):
        build_cost("qwen3-30b-a3b", "h100-sxm", 1, dp=8, weight_dtype="fp8-block", gpus_per_node=0)


def test_attention_tp_is_checked_against_the_cluster_node():
    # a fabric of 16-GPU nodes holds a TP16 group that the catalog's 8-GPU H100 node
    # cannot; a fabric of 4-GPU nodes cannot hold TP8
    big = build_cost("qwen3-30b-a3b", "h100-sxm", 16, weight_dtype="fp8-block", gpus_per_node=16)
    assert big.tp == 16 and big.nodes == 1
    with pytest.raises(
        UserError,
        match=r"^tp: attention TP 16 spans nodes \(h100-sxm has 8 GPUs per node\); use dp for "
        r"more GPUs \(allowed tp: 1, 2, 4, 8\)$",
    ):
        build_cost("qwen3-30b-a3b", "h100-sxm", 16, weight_dtype="fp8-block")
    with pytest.raises(
        UserError,
        match=r"^tp: attention TP 8 spans nodes \(gpus_per_node is 4\); use dp for more GPUs "
        r"\(allowed tp: 1, 2, 4\)$",
    ):
        build_cost("qwen3-30b-a3b", "h100-sxm", 8, dp=2, weight_dtype="fp8-block", gpus_per_node=4)


def test_a_scenario_on_large_nodes_runs_tp_beyond_the_catalog_node():
    raw = unit_of_eight({"kind": "topology", "gpus_per_node": 16})
    raw["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 1, "tp": 16}
    s = load_scenario(raw).scenario
    assert build_costs(s)["decode"].tp == 16
    (decode,) = [w for w in build_topology(s).workers if w.role == "decode"]
    assert decode.nodes == (1,) and decode.gpus == tuple(range(16))
    raw = unit_of_eight({"kind": "topology", "gpus_per_node": 4})
    raw["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 1, "tp": 8}
    with pytest.raises(UserError, match=r"^<scenario>: decode_pool: tp: attention TP 8 spans"):
        build_costs(load_scenario(raw).scenario)
