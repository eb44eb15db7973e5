"""Where a tensor-parallel group sits, and what its all-reduce costs there.

Owns the one rule every command applies to a TP degree (``run``, ``sweep``, ``compare``,
``plan`` and ``cost`` all build workers through
:func:`disaggsim.costmodel.step.build_worker_cost`, which asks this module):

- ``tp <= gpus_per_node`` (the cluster's node size: a topology fabric's ``gpus_per_node``
  where the scenario declares one, else the GPU catalog's): the group sits in one node and
  its all-reduce is the profile's fitted in-node collective (NVLink, or PCIe on GPUs
  without NVLink), exactly as before;
- ``tp > gpus_per_node``: the group spans ``num_nodes = tp / g`` nodes with ``g`` GPUs in
  each (``g`` the largest divisor of ``tp`` that fits in a node; 8 × 2 for TP16 on 8-GPU
  nodes) and its all-reduce is *hierarchical*: a reduce-scatter inside each node, an
  all-reduce of each GPU's ``1/g`` shard across the nodes over that GPU's NIC (one ring
  per local rank, rail-aligned), and an all-gather inside the node.

The node size is the fabric's because the fabric decides where the group's GPUs sit: a
scenario declaring an NVLink domain of 16 or 36 GPUs (NVL72-like) places a TP16 group in
one domain, so its all-reduce never touches a NIC. In a domain larger than the profile's
largest measured in-node count (8 on the catalog's GPUs), the in-node fit used is that
count's (the nearest measured; the ring's byte factor ``2 (g − 1) / g`` is exact).

For ``S`` bytes per GPU, with ``λ``/``B`` the NIC latency and per-GPU bandwidth::

    t = AR_node(S, g) + 2 (k − 1) λ + 2 (k − 1) / k × (S / g) / B

``AR_node(S, g)`` is the fitted in-node ring all-reduce ``min over protocols of
latency + 2 (g − 1) / g × S / bus_bw``: the in-node reduce-scatter and all-gather move
together exactly a ring all-reduce's bytes, so their sum is priced by that fit. The
cross-node ring over ``k`` nodes takes ``2 (k − 1)`` steps, each paying the NIC latency.
``B`` is the catalog's NIC per GPU (GPUDirect RDMA, line rate: an upper bound on speed —
Vidur's ``a100_dgx`` measurements reach about a quarter of HDR line rate across nodes,
docs/costmodel.md) and ``λ`` the InfiniBand latency prior of
:mod:`disaggsim.costmodel.kv`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from disaggsim.catalog import GpuSpec, ModelSpec, get_gpu
from disaggsim.costmodel.kv import DEFAULT_LATENCY_S

__all__ = ["TpLayout", "allreduce_s", "tp_layout", "tp_options"]


@dataclass(frozen=True, slots=True)
class TpLayout:
    """A TP group's placement: ``gpus_in_node`` GPUs on each of ``num_nodes`` nodes."""

    tp: int
    gpus_per_node: int  # the node's size (a topology fabric's, else the catalog's)
    gpus_in_node: int  # g: the group's GPUs in each node it uses
    num_nodes: int  # k
    nic_bytes_per_s: float  # per GPU, per direction
    nic_latency_s: float

    @property
    def cross_node(self) -> bool:
        """True when the group spans nodes (its all-reduce is hierarchical)."""
        return self.num_nodes > 1

    def describe(self) -> str:
        if not self.cross_node:
            return f"tp {self.tp} in one node of {self.gpus_per_node} GPUs"
        return (
            f"tp {self.tp} across {self.num_nodes} nodes x {self.gpus_in_node} GPUs "
            f"(hierarchical all-reduce over {self.nic_bytes_per_s * 8 / 1e9:.0f} Gb/s NICs)"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "tp": self.tp,
            "gpus_per_node": self.gpus_per_node,
            "gpus_in_node": self.gpus_in_node,
            "num_nodes": self.num_nodes,
            "allreduce": "hierarchical" if self.cross_node else "in-node",
            "nic_bytes_per_s": self.nic_bytes_per_s,
            "nic_latency_s": self.nic_latency_s,
        }


def tp_layout(gpu: str | GpuSpec, tp: int, gpus_per_node: int | None = None) -> TpLayout:
    """The placement of a ``tp``-GPU group on ``gpu`` nodes (see the module docstring):
    nodes of ``gpus_per_node`` GPUs (a topology fabric's node size), or the catalog's
    ``gpu.gpus_per_node`` when None."""
    g = get_gpu(gpu)
    node = gpus_per_node or g.gpus_per_node
    if tp <= node:
        per_node = tp
    else:
        per_node = max(d for d in range(1, node + 1) if tp % d == 0)
    return TpLayout(
        tp=tp,
        gpus_per_node=node,
        gpus_in_node=per_node,
        num_nodes=tp // per_node,
        nic_bytes_per_s=g.nic_bytes_per_s,
        nic_latency_s=DEFAULT_LATENCY_S["infiniband"],
    )


def allreduce_s(
    layout: TpLayout, in_node_protocols: Sequence[tuple[float, float]], nbytes: float
) -> float:
    """Seconds for one all-reduce of ``nbytes`` per GPU over the group.

    ``in_node_protocols`` are the profile's ``(latency_s, bus_bw_bytes_per_s)`` fits for
    ``layout.gpus_in_node`` GPUs (empty when that is 1). Plain float arithmetic: the
    step model calls this in the engine's hot loop."""
    g = layout.gpus_in_node
    t = 0.0
    if g > 1:
        ring_bytes = 2.0 * (g - 1) / g * nbytes
        t = min(lat + ring_bytes / bw for lat, bw in in_node_protocols)
    k = layout.num_nodes
    if k > 1:
        t += 2.0 * (k - 1) * layout.nic_latency_s + (
            2.0 * (k - 1) / k * (nbytes / g) / layout.nic_bytes_per_s
        )
    return t


def tp_options(model: ModelSpec, gpu: str | GpuSpec, max_tp: int) -> list[TpLayout]:
    """Every TP degree up to ``max_tp`` that shards ``model``, with its layout on ``gpu``
    (in one node, or hierarchical beyond it). Memory fit is not checked here."""
    from disaggsim.costmodel.step import valid_tps

    return [tp_layout(gpu, tp) for tp in valid_tps(model, max_tp)]
