"""Topology: seed-fact transfer times per path, placement policies, TP shards, the
link-class mode, and one-line errors for bad layouts. Expected values are hand
arithmetic from the catalog (H100 SXM: NVLink 450 GB/s per direction, NIC 400 Gb/s,
PCIe Gen5 64 GB/s × 0.75 = 48 GB/s)."""

from __future__ import annotations

import pytest
import simpy

from disaggsim.catalog import GPU_IDS, get_gpu
from disaggsim.costmodel.kv import kv_transfer
from disaggsim.errors import UserError
from disaggsim.fabric import (
    FlowNetwork,
    build_topology,
    link_class_topology,
    parse_topology_config,
    pool_layouts,
)


def _topo(fabric: dict, prefill=("h100-sxm", 1, 1), decode=("h100-sxm", 1, 1)):
    cfg = parse_topology_config(fabric)
    return build_topology(cfg, pool_layouts([("prefill", *prefill), ("decode", *decode)]))


def _solo_s(topo, src, dst, nbytes, num_tokens=0) -> float:
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    path = topo.path(src, dst)
    net.start(
        nbytes, path, extra_latency_s=topo.transfer_latency_s(path, num_tokens) - path.latency_s
    )
    env.run()
    return net.records[0].end_at_s


SAME = {"placement": {"policy": "pack"}}
APART = {"placement": {"policy": "spread"}}


def test_seed_facts_nvlink_infiniband_staging():
    nbytes = 1.5e9
    nvl = _solo_s(_topo(SAME), 0, 1, nbytes)
    assert nvl == pytest.approx(1.5e9 / 450e9 + 10e-6)  # 3.3 ms
    assert 2e-3 <= nvl <= 4e-3
    ib = _solo_s(_topo({**APART, "nic": {"gbit_per_s": 200}}), 0, 1, nbytes)
    assert ib == pytest.approx(1.5e9 / 25e9 + 15e-6)  # 60 ms at 200 Gb/s = 25 GB/s
    assert 50e-3 <= ib <= 70e-3
    # no RDMA, PCIe Gen4 (0.75 × 32 = 24 GB/s) below the 25 GB/s NIC: 62.5 ms + 55 µs
    staged = {**APART, "nic": {"gbit_per_s": 200, "rdma": False}, "pcie": {"gen": 4}}
    st = _solo_s(_topo(staged), 0, 1, nbytes)
    assert st == pytest.approx(1.5e9 / 24e9 + 20e-6 + 15e-6 + 20e-6)
    pageable = _solo_s(_topo({**staged, "host_staging": "pageable"}), 0, 1, nbytes)
    assert pageable == pytest.approx(1.5e9 / 12e9 + 55e-6)  # half the pinned rate
    assert nvl < ib < st < pageable
    # Gen5 PCIe (48 GB/s) is not the bottleneck: staged = the NIC's rate, latency higher
    st5 = _solo_s(_topo({**APART, "nic": {"gbit_per_s": 200, "rdma": False}}), 0, 1, nbytes)
    assert st5 == pytest.approx(1.5e9 / 25e9 + 55e-6) and st5 > ib


@pytest.mark.parametrize("gpu", GPU_IDS)
def test_every_catalog_gpu_builds_and_stages_at_its_catalog_pcie_rate(gpu):
    """Without ``pcie.gen`` a GPU's host link is 0.75 × the catalog's ``pcie_gb_per_s``,
    the rate disaggsim.costmodel.kv uses (a B200, PCIe Gen6, failed with KeyError: 6)."""
    spec = get_gpu(gpu)
    rate = 0.75 * spec.pcie_bytes_per_s
    fast_nic = {**APART, "nic": {"gb_per_s": 1000, "rdma": False}}  # PCIe is the bottleneck
    st = _solo_s(_topo(fast_nic, prefill=(gpu, 1, 1), decode=(gpu, 1, 1)), 0, 1, 1.5e9)
    assert st == pytest.approx(1.5e9 / rate + 20e-6 + 15e-6 + 20e-6)
    assert rate == pytest.approx(0.75 * {4: 32e9, 5: 64e9, 6: 128e9}[spec.pcie_gen])


def test_tp_shards_move_over_each_gpus_rails():
    # TP4 → TP2 in one node: 4 shards, the 2 decode GPUs' NVLink inputs bound the rate:
    # 1.8 GB / (2 × 450 GB/s) = 2 ms
    topo = _topo(SAME, prefill=("h100-sxm", 1, 4), decode=("h100-sxm", 1, 2))
    path = topo.path(0, 1)
    assert path.kind == "nvlink" and path.num_shards == 4 and path.num_hops == 2
    assert _solo_s(topo, 0, 1, 1.8e9) == pytest.approx(2e-3 + 10e-6)
    # TP4 → TP4 across nodes, rail-aligned 400 Gb/s NICs: 4 × 50 GB/s; one shared NIC: 50
    rail = _topo(APART, prefill=("h100-sxm", 1, 4), decode=("h100-sxm", 1, 4))
    assert _solo_s(rail, 0, 1, 2e9) == pytest.approx(2e9 / 200e9 + 15e-6)
    shared = _topo({**APART, "nic": {"per_gpu": False}}, ("h100-sxm", 1, 4), ("h100-sxm", 1, 4))
    assert _solo_s(shared, 0, 1, 2e9) == pytest.approx(2e9 / 50e9 + 15e-6)


def test_no_nvlink_same_node_goes_peer_to_peer_over_pcie():
    topo = _topo(SAME, prefill=("h100-pcie", 1, 1), decode=("h100-pcie", 1, 1))
    assert topo.path(0, 1).kind == "pcie-p2p"
    assert _solo_s(topo, 0, 1, 4.8e9) == pytest.approx(0.1 + 40e-6)  # 48 GB/s, 2 × 20 µs


def test_setup_and_block_gather_costs():
    topo = _topo({**SAME, "setup_latency_us": 100, "per_block_us": 2})
    # 1000 tokens = 63 blocks of 16 (rounded up): 126 µs, + 100 µs setup + 10 µs NVLink
    path = topo.path(0, 1)
    assert topo.transfer_latency_s(path, 1000) == pytest.approx(236e-6)
    assert _solo_s(topo, 0, 1, 0.45e9, 1000) == pytest.approx(1e-3 + 236e-6)


def test_placement_policies():
    pools = dict(prefill=("h100-sxm", 2, 4), decode=("h100-sxm", 2, 4))
    pack = _topo(SAME, **pools)
    assert [(w.key, w.node, w.gpus) for w in pack.workers] == [
        ("prefill.0", 0, (0, 1, 2, 3)), ("prefill.1", 0, (4, 5, 6, 7)),
        ("decode.0", 1, (0, 1, 2, 3)), ("decode.1", 1, (4, 5, 6, 7)),
    ]  # fmt: skip
    assert pack.path(0, 2).kind == "rdma"
    pair = _topo({"placement": {"policy": "pair"}}, **pools)
    assert [w.node for w in pair.workers] == [0, 1, 0, 1]
    assert pair.path(0, 2).kind == "nvlink" and pair.path(0, 3).kind == "rdma"
    assert pair.path_rank(0, 2) < pair.path_rank(0, 3)
    # 2:1 pools interleave p0, d0, p1 into one node
    ratio = _topo({"placement": {"policy": "pair"}}, ("h100-sxm", 2, 2), ("h100-sxm", 1, 4))
    assert [(w.node, w.gpus) for w in ratio.workers] == [
        (0, (0, 1)),
        (0, (6, 7)),
        (0, (2, 3, 4, 5)),
    ]
    spread = _topo(APART, ("h100-sxm", 1, 2), ("h100-sxm", 1, 2))
    assert [w.node for w in spread.workers] == [0, 1] and spread.num_nodes == 2
    explicit = _topo(
        {"placement": {"explicit": {"prefill.0": [3, [6, 7]], "decode.0": [3, [0, 1]]}}},
        ("h100-sxm", 1, 2), ("h100-sxm", 1, 2),
    )  # fmt: skip
    assert explicit.path(0, 1).kind == "nvlink"
    assert explicit.links[explicit.path(0, 1).routes[0].links[0]].id == "n3.g6.nvlink.out"


def test_link_class_mode_is_todays_transfer_time():
    nbytes, bw, lat, shards = 2.5e9, 25e9, 15e-6, 4
    topo = link_class_topology(2, bw, lat, shards)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    for _ in range(3):  # concurrent transfers do not contend in this mode
        net.start(nbytes, topo.path(0, 1))
    env.run()
    today = kv_transfer(nbytes / shards, "infiniband", bandwidth_bytes_per_s=bw, latency_s=lat)
    assert [r.end_at_s for r in net.records] == pytest.approx([today.time_s] * 3)


@pytest.mark.parametrize(
    "fabric, pools, message",
    [
        ({"placement": {"explicit": {"prefill.0": [0, [0, 1, 2, 3]], "decode.0": [0, [4, 5, 6, 7, 0]]}}},
         (("h100-sxm", 1, 4), ("h100-sxm", 1, 5)),
         r"^fabric\.placement\.explicit: node 0 has 8 GPUs but workers prefill\.0, decode\.0 need 9$"),
        ({}, (("h100-sxm", 1, 16), ("h100-sxm", 1, 8)),
         r"^fabric\.gpus_per_node: prefill_pool\.tp 16 is larger than the node.s NVLink domain \(8 GPUs\) \(allowed: tp <= 8 "),
        ({"gpus_per_node": 4}, (("h100-sxm", 1, 4), ("h100-sxm", 1, 8)),
         r"^fabric\.gpus_per_node: decode_pool\.tp 8 is larger"),
        ({"nic": None, "placement": {"policy": "spread"}}, (("h100-sxm", 1, 1), ("h100-sxm", 1, 1)),
         r"^fabric\.nic: prefill\.0 \(node 0\) and decode\.0 \(node 1\) need a cross-node path but nodes have no NIC"),
        ({"placement": {"num_nodes": 1}}, (("h100-sxm", 2, 4), ("h100-sxm", 1, 4)),
         r"^fabric\.placement\.num_nodes: placement pack needs 2 nodes for 3 workers \(12 GPUs\) but num_nodes is 1$"),
        ({"placement": {"explicit": {"prefill.0": [0, [0]], "decode.0": [0, [0]]}}},
         (("h100-sxm", 1, 1), ("h100-sxm", 1, 1)),
         r"^fabric\.placement\.explicit\.decode\.0: GPU 0 of node 0 is also given to prefill\.0$"),
        ({"placement": {"explicit": {"prefill.0": [0, [0]], "decode.7": [0, [1]]}}},
         (("h100-sxm", 1, 1), ("h100-sxm", 1, 1)),
         r"^fabric\.placement\.explicit\.decode\.7: no such worker"),
        ({"placement": {"explicit": {"prefill.0": [0, [0]], "decode.0": [0, [1, 2]]}}},
         (("h100-sxm", 1, 1), ("h100-sxm", 1, 1)),
         r"^fabric\.placement\.explicit\.decode\.0: 2 GPUs listed but tp is 1$"),
    ],
)  # fmt: skip
def test_bad_layouts_are_one_line_errors_naming_the_field(fabric, pools, message):
    with pytest.raises(UserError, match=message) as err:
        _topo(fabric, *pools)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "fabric, message",
    [
        ({"nvlink_gb_per_s": 0}, r"^fabric\.nvlink_gb_per_s: Input should be greater than 0"),
        ({"nic": {"gbit_per_s": 0}}, r"^fabric\.nic\.gbit_per_s: Input should be greater than 0"),
        ({"pcie": {"gb_per_s": 0}}, r"^fabric\.pcie\.gb_per_s: Input should be greater than 0"),
        ({"nic": {"gbit_per_s": 200, "gb_per_s": 25}}, r"^fabric\.nic: give gb_per_s or gbit_per_s, not both$"),
        ({"pcie": {"gen": 3}}, r"^fabric\.pcie\.gen: Input should be 4, 5 or 6$"),
        ({"nvlink_gbps": 450}, r"^fabric\.nvlink_gbps: unknown key$"),
        ({"placement": {"policy": "scatter"}}, r"^fabric\.placement\.policy: Input should be 'pack', 'spread' or 'pair'$"),
    ],
)  # fmt: skip
def test_bad_config_values_are_one_line_errors(fabric, message):
    with pytest.raises(UserError, match=message):
        parse_topology_config(fabric)


@pytest.mark.parametrize("name, kind", [("nvlink", "nvlink"), ("pcie", "staged")])
def test_fabric_scenario_pair_builds_its_topology(name, kind):
    """The pair's ``fabric:`` sections validate and place the workers as their comments
    say."""
    import yaml

    from tests.conftest import REPO

    raw = yaml.safe_load((REPO / "scenarios" / "fabric" / f"{name}.yaml").read_text())
    cfg = parse_topology_config(raw["fabric"])
    pools = [(r, raw[f"{r}_pool"]["gpu"], raw[f"{r}_pool"]["num_workers"], raw[f"{r}_pool"]["tp"])
             for r in ("prefill", "decode")]  # fmt: skip
    topo = build_topology(cfg, pool_layouts(pools))
    path = topo.path(0, 1)
    assert path.kind == kind and path.num_shards == 4
    # 8k tokens × 327,680 B = 2.68 GB: NVLink 4 × 450 GB/s; staged: one shared 25 GB/s NIC
    expected = 2.68435456e9 / (1800e9 if kind == "nvlink" else 25e9) + path.latency_s
    assert _solo_s(topo, 0, 1, 2.68435456e9) == pytest.approx(expected)


def test_swap_host_paths_use_each_decode_gpus_pcie_link_and_contend_with_handoffs():
    # staged handoffs (no RDMA, one shared 400 Gb/s NIC per node) end on the decode GPUs'
    # PCIe inputs, the same links a swap-in (host → device) copy uses
    fabric = {**APART, "nic": {"per_gpu": False, "rdma": False}}
    cfg = parse_topology_config(fabric)
    layouts = pool_layouts([("prefill", "h100-sxm", 1, 2), ("decode", "h100-sxm", 1, 2)])
    assert build_topology(cfg, layouts).host_path(1, "h2d") is None  # built only for swap
    topo = build_topology(cfg, layouts, host_paths=True)
    assert topo.host_path(0, "d2h") is None  # prefill workers never swap
    out, back = topo.host_path(1, "d2h"), topo.host_path(1, "h2d")
    ids = [[topo.links[i].id for i in r.links] for r in (*out.routes, *back.routes)]
    assert ids == [["n1.g0.pcie.out"], ["n1.g1.pcie.out"], ["n1.g0.pcie.in"], ["n1.g1.pcie.in"]]
    lat = cfg.pcie.latency_s

    def swap_in_s(with_handoff: bool) -> float:
        env = simpy.Environment()
        net = FlowNetwork(env, topo)
        done = []
        net.start(1.92e9, back, record=False, on_done=lambda rec: done.append((env.now, rec)))
        if with_handoff:
            net.start(4e9, topo.path(0, 1))
        env.run()
        assert [rec for _, rec in done] == [None]  # a swap copy leaves no KV record
        assert all(r.path_kind == "staged" for r in net.records)
        return done[0][0]

    # alone: each GPU copies 0.96 GB at its PCIe Gen5 48 GB/s
    assert swap_in_s(False) == pytest.approx(0.96e9 / 48e9 + lat)
    # beside a handoff: each decode GPU's PCIe input carries one swap shard and one handoff
    # shard; max-min fair, both get 24 GB/s (the shared 50 GB/s NIC, 2 × 24, is not the
    # bottleneck), and the handoff (2 GB per shard, 83 ms) outlasts the copy
    assert swap_in_s(True) == pytest.approx(0.96e9 / 24e9 + lat)


@pytest.mark.parametrize("policy", ["pack", "spread", "pair"])
def test_autoscaled_workers_are_placed_after_the_initial_layout(policy):
    """A pool that may grow to max_workers gets those workers placed too (engine indices:
    pools in order, each with every worker it may have), after every pool's initial
    workers, so the initial workers sit where they sit without autoscaling."""
    cfg = parse_topology_config({"gpus_per_node": 4, "placement": {"policy": policy}})
    fixed = build_topology(
        cfg, pool_layouts([("prefill", "h100-sxm", 1, 2), ("decode", "h100-sxm", 2, 1)])
    )
    scaled = build_topology(
        cfg,
        pool_layouts([("prefill", "h100-sxm", 1, 2), ("decode", "h100-sxm", 2, 1)], {"prefill": 3, "decode": 3}),
    )  # fmt: skip
    keys = ["prefill.0", "prefill.1", "prefill.2", "decode.0", "decode.1", "decode.2"]
    assert [w.key for w in scaled.workers] == keys
    assert [w.index for w in scaled.workers] == list(range(6))
    where = {w.key: (w.node, w.gpus) for w in scaled.workers}
    assert [where[w.key] for w in fixed.workers] == [(w.node, w.gpus) for w in fixed.workers]
    gpus = [(w.node, g) for w in scaled.workers for g in w.gpus]
    assert len(gpus) == len(set(gpus)) == 3 * 2 + 3 * 1  # no GPU given twice
    for s in (0, 1, 2):  # every prefill → decode path exists, scaled workers included
        for d in (3, 4, 5):
            assert scaled.path(s, d).src_worker == s


def test_pack_places_scaled_workers_in_the_next_free_gpus():
    # initial: prefill.0 (n0 g0-1), decode.0 (n0 g2); then prefill.1 (g0-1 of a new node:
    # node 0 has one GPU left), decode.1 (n0 g3)
    cfg = parse_topology_config({"gpus_per_node": 4, "placement": {"policy": "pack"}})
    topo = build_topology(
        cfg, pool_layouts([("prefill", "h100-sxm", 1, 2), ("decode", "h100-sxm", 1, 1)], {"prefill": 2, "decode": 2})
    )  # fmt: skip
    assert [(w.key, w.node, w.gpus) for w in topo.workers] == [
        ("prefill.0", 0, (0, 1)), ("prefill.1", 1, (0, 1)),
        ("decode.0", 0, (2,)), ("decode.1", 0, (3,)),
    ]  # fmt: skip
    assert topo.path(1, 2).kind == "rdma" and topo.path(0, 3).kind == "nvlink"


@pytest.mark.parametrize(
    "fabric, message",
    [
        ({"gpus_per_node": 4, "placement": {"num_nodes": 1}},
         r"^fabric\.placement\.num_nodes: placement pack needs 2 nodes for 4 workers "
         r"\(6 GPUs, 2 of them autoscaled up to max_workers\) but num_nodes is 1$"),
        ({"placement": {"explicit": {"prefill.0": [0, [0, 1]], "decode.0": [0, [2]]}}},
         r"^fabric\.placement\.explicit: worker prefill\.1 is not placed \(list every worker, "
         r"those an autoscaled pool may start up to max_workers included\)$"),
    ],
)  # fmt: skip
def test_no_room_for_autoscaled_workers_is_a_one_line_error(fabric, message):
    cfg = parse_topology_config(fabric)
    layouts = pool_layouts(
        [("prefill", "h100-sxm", 1, 2), ("decode", "h100-sxm", 1, 1)], {"prefill": 2, "decode": 2}
    )
    with pytest.raises(UserError, match=message):
        build_topology(cfg, layouts)
