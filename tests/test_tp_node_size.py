"""A topology fabric's ``gpus_per_node`` decides where a dense TP group's all-reduce runs:
in one NVLink domain, or hierarchically across nodes (the cost model used to ask the GPU
catalog's node size whatever the fabric declared, so a TP16 group in a 16-GPU NVLink
domain paid a cross-node NIC phase it never crosses). Expected times by hand from the
h100_sxm profile's 8-GPU all-reduce fit (the nearest measured count for 16 in a node)
and the catalog's NIC (400 Gb/s a GPU, 15 µs)."""

from __future__ import annotations

import json

import pytest

from disaggsim.cli import main
from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.moe import build_cost
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.costmodel.tp_layout import tp_layout
from disaggsim.errors import UserError
from disaggsim.hardware.profile import load_profile
from disaggsim.run import build_costs
from tests.test_validity import H100_AR8

S = 8 * 8192 * 2  # bytes per GPU of one decode all-reduce at batch 8 (hidden 8192, bf16)


def in_node(g: int) -> float:
    return min(lat + 2 * (g - 1) / g * S / bw for lat, bw in H100_AR8)


ACROSS_2 = 2 * 15e-6 + 2 * (1 / 2) * (S / 8) / 50e9  # 2 nodes x 8 GPUs, NIC ring


def test_layout_follows_the_given_node_size():
    assert not tp_layout("h100-sxm", 16, gpus_per_node=16).cross_node
    assert tp_layout("h100-sxm", 16, gpus_per_node=16).describe() == (
        "tp 16 in one node of 16 GPUs"
    )
    four = tp_layout("h100-sxm", 8, gpus_per_node=4)
    assert (four.gpus_in_node, four.num_nodes, four.cross_node) == (4, 2, True)
    assert tp_layout("h100-sxm", 16) == tp_layout("h100-sxm", 16, gpus_per_node=None)


def test_tp16_in_a_16_gpu_domain_has_no_nic_phase():
    catalog = build_worker_cost("llama-3-70b", "h100-sxm", 16)
    domain = build_worker_cost("llama-3-70b", "h100-sxm", 16, gpus_per_node=16)
    assert catalog.tp_layout.cross_node and not domain.tp_layout.cross_node
    layers = 80
    assert catalog.breakdown(decode_batch=8).allreduce_s == pytest.approx(
        layers * 2 * (in_node(8) + ACROSS_2), rel=1e-12
    )
    assert domain.breakdown(decode_batch=8).allreduce_s == pytest.approx(
        layers * 2 * in_node(16), rel=1e-12
    )


def test_smaller_fabric_nodes_split_the_group():
    cost = build_cost("llama-3-70b", "h100-sxm", 8, gpus_per_node=4)
    assert (cost.tp_layout.gpus_in_node, cost.tp_layout.num_nodes) == (4, 2)
    # the profile's own 4-GPU fit in each node, then a 2-node NIC ring of a quarter each
    fit4 = load_profile("h100-sxm").allreduce.protocols_for_gpus(4)
    four = min(lat + 2 * 3 / 4 * S / bw for lat, bw in fit4)
    across = 2 * 15e-6 + 2 * (1 / 2) * (S / 4) / 50e9
    assert cost.breakdown(decode_batch=8).allreduce_s == pytest.approx(
        80 * 2 * (four + across), rel=1e-12
    )


def _dense_tp16(fabric: dict) -> dict:
    return {
        "name": "tp16-domain",
        "model": "llama-3-70b",
        "architecture": "disaggregated",
        "prefill_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 16},
        "decode_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 16},
        "fabric": fabric,
        "slo": {"ttft_ms": 1000, "itl_ms": 50},
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 1,
            "prompt_tokens": {"dist": "fixed", "value": 1000},
            "output_tokens": {"dist": "fixed", "value": 20},
        },
        "sim": {"duration_s": 5},
    }


def test_scenario_topology_fabric_sets_the_all_reduce_node():
    domain = build_costs(
        load_scenario(_dense_tp16({"kind": "topology", "gpus_per_node": 16})).scenario
    )
    assert all(not c.tp_layout.cross_node for c in domain.values())
    assert domain["decode"].breakdown(decode_batch=8).allreduce_s == pytest.approx(
        80 * 2 * in_node(16), rel=1e-12
    )
    # a link fabric declares no node: the catalog's (8 GPUs) decides, two nodes of 8
    link = build_costs(load_scenario(_dense_tp16({"link": "infiniband"})).scenario)
    assert all(c.tp_layout.cross_node for c in link.values())
    # and a topology fabric without a node size keeps the catalog's
    plain = build_costs(load_scenario(_dense_tp16({"kind": "topology"})).scenario)
    assert plain["decode"].tp_layout.num_nodes == 2


def test_cost_cli_takes_the_node_size(capsys):
    common = ["--model", "llama-3-70b", "--gpu", "h100-sxm", "--batch", "8", "--tp", "16"]
    main(["cost", "decode", *common, "--context-tokens", "100", "--gpus-per-node", "16"])
    main(["cost", "decode", *common, "--context-tokens", "100"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["tp_layout"]["allreduce"] == "in-node"
    assert lines[0]["tp_layout"]["gpus_per_node"] == 16
    assert lines[1]["tp_layout"]["allreduce"] == "hierarchical"
    assert lines[0]["breakdown"]["allreduce_s"] < lines[1]["breakdown"]["allreduce_s"]


def test_bad_node_size_is_one_line():
    with pytest.raises(UserError, match=r"^gpus_per_node: must be a positive integer, got 0$"):
        build_worker_cost("llama-3-8b", "h100-sxm", 1, gpus_per_node=0)
