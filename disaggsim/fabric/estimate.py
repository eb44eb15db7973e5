"""One KV handoff on its own: its path, time and exposed tail, outside a run.

For questions about a single transfer (``disaggsim cost kv --path``, the planner's fabric
condition) with the same placement, flow network and overlap model the engine uses, and
nothing else on the network. :func:`pair_topology` places one prefill and one decode
worker as a named case (one node, or two nodes with or without GPUDirect RDMA);
:func:`estimate_handoff` moves ``nbytes`` between two workers of any placed topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import simpy

from disaggsim.errors import UserError
from disaggsim.fabric.config import parse_topology_config
from disaggsim.fabric.flows import FlowNetwork
from disaggsim.fabric.overlap import send_plan
from disaggsim.fabric.topology import Path, Topology, build_topology, describe_path, pool_layouts

PairPath = Literal["same-node", "cross-node-rdma", "cross-node-staged"]
PAIR_PATHS: tuple[PairPath, ...] = ("same-node", "cross-node-rdma", "cross-node-staged")
# the link class (costmodel.kv.LINK_CLASSES) each path kind corresponds to
PATH_LINK_CLASS = {"nvlink": "nvlink", "pcie-p2p": "pcie", "rdma": "infiniband", "staged": "pcie"}


@dataclass(frozen=True, slots=True)
class HandoffEstimate:
    """One uncontended transfer of ``nbytes`` from ``path.src_worker`` to ``path.dst_worker``."""

    path: Path
    link: str  # the link class of the path (PATH_LINK_CLASS)
    path_links: tuple[str, ...]  # link ids one shard crosses
    nbytes: float
    latency_s: float  # fixed part: hop latencies + setup (+ block gathering)
    transfer_s: float  # latency + serialisation, sent after the prefill (no overlap)
    bandwidth_bytes_per_s: float  # nbytes / serialisation time
    exposed_s: float  # the part after a prefill of prefill_s ends (streamed with overlap)


def pair_topology(
    where: PairPath,
    gpu: str | None,
    tp: int,
    *,
    nic_gbit_per_s: float | None = None,
    host_staging: Literal["pinned", "pageable"] = "pinned",
    label: str = "fabric",
) -> Topology:
    """One prefill worker (global index 0) and one decode worker (index 1) of ``tp`` GPUs
    each: on one node (``same-node``), or on two nodes whose NICs move the KV with
    GPUDirect RDMA (``cross-node-rdma``) or staged through host memory
    (``cross-node-staged``). Hardware defaults come from the GPU catalog; a placement
    that does not fit is a :class:`UserError` prefixed with ``label``."""
    if where not in PAIR_PATHS:
        raise UserError(f"{label}: unknown path {where!r} (allowed: {', '.join(PAIR_PATHS)})")
    same = where == "same-node"
    nic: dict[str, object] = {"rdma": where != "cross-node-staged"}
    if nic_gbit_per_s is not None:
        nic["gbit_per_s"] = nic_gbit_per_s
    cfg = parse_topology_config(
        {
            "nic": nic,
            "host_staging": host_staging,
            "placement": {
                "explicit": {
                    "prefill.0": [0, list(range(tp))],
                    "decode.0": [0, list(range(tp, 2 * tp))] if same else [1, list(range(tp))],
                }
            },
        },
        label,
    )
    return build_topology(cfg, pool_layouts([("prefill", gpu, 1, tp), ("decode", gpu, 1, tp)]))


def estimate_handoff(
    topology: Topology,
    src_worker: int,
    dst_worker: int,
    nbytes: float,
    *,
    prefill_s: float = 0.0,
    num_layers: int = 1,
    overlap: bool = False,
    num_tokens: int = 0,
) -> HandoffEstimate:
    """Move ``nbytes`` from ``src_worker`` to ``dst_worker`` alone on ``topology``.

    ``transfer_s`` is the transfer sent whole after the prefill (hop latencies, setup and
    the gathering of ``num_tokens``' paged blocks, then the bytes at the path's
    uncontended rate); ``exposed_s`` is what remains after a prefill of ``prefill_s``
    ends, with the KV streamed layer by layer over ``num_layers`` when ``overlap``
    (:func:`disaggsim.fabric.overlap.send_plan`, as the engine sends it)."""
    path = topology.path(src_worker, dst_worker)
    latency = topology.transfer_latency_s(path, num_tokens)
    extra = latency - path.latency_s  # setup and block gathering, as the engine adds them
    env = simpy.Environment()
    net = FlowNetwork(env, topology)
    plan = send_plan(nbytes, 0.0, prefill_s, prefill_s, num_layers, overlap)
    if plan.source_rate_cap_bytes_per_s is None and prefill_s > 0:
        env.run(until=prefill_s)  # without overlap the KV leaves when the prefill ends
    net.start(
        nbytes,
        path,
        start_delay_s=plan.start_delay_s,
        source_rate_cap_bytes_per_s=plan.source_rate_cap_bytes_per_s,
        cap_until_s=plan.cap_until_s,
        ready_at_s=plan.ready_at_s,
        extra_latency_s=extra,
    )
    env.run()
    (rec,) = net.records
    # the rate one uncontended transfer gets: the same network, no overlap
    solo_env = simpy.Environment()
    solo = FlowNetwork(solo_env, topology)
    solo.start(nbytes, path, extra_latency_s=extra)
    solo_env.run()
    serial = solo.records[0].transfer_s - latency
    return HandoffEstimate(
        path=path,
        link=PATH_LINK_CLASS[path.kind],
        path_links=describe_path(topology, path),
        nbytes=nbytes,
        latency_s=latency,
        transfer_s=serial + latency,
        bandwidth_bytes_per_s=nbytes / serial if serial > 0 else float("inf"),
        exposed_s=rec.exposed_s,
    )
