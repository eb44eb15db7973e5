"""Where workers sit and which links a KV transfer crosses.

Owns the cluster's physical layout: nodes of ``gpus_per_node`` GPUs, each GPU with an
NVLink port (to the node's non-blocking NVSwitch), a PCIe link to its host, and NICs
(one per GPU when rail-aligned, else one per node) into a non-blocking network core.
:func:`build_topology` places every worker on GPUs of one node (a TP group never
straddles nodes) — an MoE unit of several data-parallel ranks whole in one node when it
fits, else on fresh nodes, whole TP groups each, the fewest nodes
(:func:`disaggsim.costmodel.moe.unit_nodes`, which its all-to-all cost counts too) — and
checks the layout; an autoscaled pool's workers up to its
``max_workers`` are placed too, after every pool's initial workers, so a scale-up has GPUs
and paths and the initial layout is the same as without autoscaling; :meth:`Topology.path` says which links each
shard of a transfer crosses:

=====================  ==========================================================
``nvlink``             same node: src GPU NVLink out → dst GPU NVLink in
``pcie-p2p``           same node without NVLink: src PCIe out → dst PCIe in
``rdma``               across nodes, GPUDirect RDMA: src NIC out → dst NIC in
``staged``             across nodes without RDMA: src PCIe out (device → host),
                       src NIC out, dst NIC in, dst PCIe in (host → device)
=====================  ==========================================================

A TP-sharded KV cache moves as ``max(tp_src, tp_dst)`` parallel shards, shard ``k``
from source GPU ``k·tp_src // m`` to destination GPU ``k·tp_dst // m`` (each GPU holds
its own KV heads), so the aggregate rate is set by the smaller group's rails — the
``min(tp_src, tp_dst)`` of :func:`disaggsim.run.build_transfer` — and shards sharing a
NIC share it. Staged hops are pipelined (chunked double-buffering), so a shard's rate is
its slowest hop; latencies add up along the route. Every link is one direction.

Link latencies (seconds, priors): NVLink 10 µs on the sending port; PCIe 20 µs per
traversal; NIC 15 µs on the sending NIC (InfiniBand; set ``nic.latency_us`` for RoCE).
Pageable host staging caps each staged shard at :data:`PAGEABLE_FACTOR` × the PCIe rate
(the driver bounces pageable memory through its own pinned buffer with a CPU copy).

:func:`link_class_topology` is the no-topology mode: each transfer runs alone at
``num_shards × bandwidth`` after ``latency`` — today's ``size/bw + latency`` per link
class, with no contention.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from disaggsim.catalog import get_gpu
from disaggsim.costmodel.kv import PCIE_EFFICIENCY
from disaggsim.costmodel.moe import unit_nodes
from disaggsim.errors import UserError
from disaggsim.fabric.config import FabricTopologyConfig
from disaggsim.units import GB, GBIT

__all__ = [
    "BLOCK_TOKENS",
    "PAGEABLE_FACTOR",
    "PATH_KINDS",
    "PCIE_X16_BYTES_PER_S",
    "Link",
    "Path",
    "PoolLayout",
    "Route",
    "Topology",
    "WorkerPlacement",
    "build_topology",
    "describe_path",
    "link_class_topology",
    "pool_layouts",
]

BLOCK_TOKENS = 16
PAGEABLE_FACTOR = 0.5
PCIE_X16_BYTES_PER_S: Mapping[int, float] = MappingProxyType({4: 32 * GB, 5: 64 * GB, 6: 128 * GB})
PATH_KINDS: tuple[str, ...] = ("nvlink", "pcie-p2p", "rdma", "staged", "link-class")
# a worker's GPUs ↔ host memory (swap, cache tiers), ↔ its NIC (remote cache store)
# and an EP unit's all-to-all between its nodes
HOST_PATH_KINDS: tuple[str, ...] = ("d2h", "h2d", "nic.in", "nic.out", "a2a")
# Defaults when no catalog GPU is named (as costmodel.kv): NVLink 4, 200 Gb/s HDR, Gen4.
_PATH_RANK: Mapping[str, int] = MappingProxyType(
    {"nvlink": 0, "link-class": 0, "pcie-p2p": 1, "rdma": 2, "staged": 3}
)
_GENERIC: Mapping[str, float] = MappingProxyType(
    {"nvlink": 450 * GB, "nic": 200 * GBIT, "pcie_gen": 4, "gpus_per_node": 8}
)


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of one physical link."""

    id: str  # e.g. "n0.g3.nvlink.out", "n1.nic0.in"
    kind: str  # "nvlink" | "pcie" | "nic"
    capacity_bytes_per_s: float
    latency_s: float  # added once per route that crosses it


@dataclass(frozen=True, slots=True)
class Route:
    """The links one shard crosses, by index into :attr:`Topology.links`."""

    links: tuple[int, ...]
    rate_cap_bytes_per_s: float = math.inf  # a private limit (pageable copy, link class)


@dataclass(frozen=True, slots=True)
class Path:
    """How a transfer from ``src_worker`` to ``dst_worker`` moves: one route per shard."""

    kind: str  # one of PATH_KINDS
    src_worker: int
    dst_worker: int
    routes: tuple[Route, ...]
    latency_s: float  # sum of the hop latencies along the slowest route

    @property
    def num_shards(self) -> int:
        return len(self.routes)

    @property
    def num_hops(self) -> int:
        """Links one shard crosses (0 in link-class mode)."""
        return max(len(r.links) for r in self.routes)


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    index: int  # global worker index, pool order (as Cluster.workers)
    key: str  # "prefill.0"
    role: str
    gpu: str | None  # catalog id
    tp: int
    node: int
    gpus: tuple[int, ...]  # GPU indices within the node
    # a worker of several data-parallel ranks (an MoE EP unit): each rank's (node, GPUs),
    # the first one being ``node``/``gpus`` above; () for a one-rank worker
    ranks: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def nodes(self) -> tuple[int, ...]:
        """The nodes the worker's GPUs are on, in rank order, each once."""
        if not self.ranks:
            return (self.node,)
        return tuple(dict.fromkeys(n for n, _ in self.ranks))


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """What placement needs of one pool: its GPU type, worker count and TP degree, and
    the most workers it may grow to (``max_workers``, autoscaling; default
    ``num_workers``)."""

    gpu: str | None
    num_workers: int
    tp: int
    max_workers: int | None = None
    dp: int = 1  # data-parallel ranks per worker (each of ``tp`` GPUs, within a node)

    @property
    def num_placed(self) -> int:
        """Workers placed: the initial ones and every one the autoscaler may start."""
        return max(self.num_workers, self.max_workers or 0)


@dataclass(frozen=True, slots=True)
class Topology:
    links: tuple[Link, ...]
    workers: tuple[WorkerPlacement, ...]
    num_nodes: int
    link_index: Mapping[str, int]
    setup_latency_s: float = 0.0
    per_block_s: float = 0.0
    overlap: bool = False
    _routes: Mapping[tuple[int, int], Path] = field(default_factory=dict, repr=False)
    _host: Mapping[tuple[int, str], Path] = field(default_factory=dict, repr=False)
    _a2a_share: Mapping[int, float] = field(default_factory=dict, repr=False)

    def a2a_share(self, worker: int) -> float:
        """Share of a multi-node worker's all-to-all bytes its ``a2a`` path carries."""
        return self._a2a_share.get(worker, 0.0)

    def path(self, src_worker: int, dst_worker: int) -> Path:
        """The path a KV transfer from ``src_worker`` to ``dst_worker`` takes."""
        try:
            return self._routes[(src_worker, dst_worker)]
        except KeyError:
            raise ValueError(f"no path from worker {src_worker} to worker {dst_worker}") from None

    def host_path(self, worker: int, kind: str) -> Path | None:
        """``kind`` ``d2h`` (swap out, cache demotion) or ``h2d`` (swap in, promotion
        from host DRAM): each GPU of ``worker`` over its own PCIe link to host memory,
        one route per GPU; ``nic.in`` / ``nic.out`` (prefix cache promotion from, and
        write-through to, the remote store): each GPU's shard through its node's NIC
        (its own with ``nic.per_gpu``). None when not built."""
        return self._host.get((worker, kind))

    def transfer_latency_s(self, path: Path, num_tokens: int) -> float:
        """Fixed time of one transfer: hop latencies + setup + gathering its paged blocks
        (each shard's GPU gathers its own blocks in parallel)."""
        num_blocks = -(-num_tokens // BLOCK_TOKENS)
        return path.latency_s + self.setup_latency_s + self.per_block_s * num_blocks

    def path_rank(self, src_worker: int, dst_worker: int) -> int:
        """Order of preference for routing: 0 NVLink, 1 PCIe peer, 2 RDMA, 3 staged."""
        return _PATH_RANK[self.path(src_worker, dst_worker).kind]


def _role_key(role: str) -> str:
    return {"prefill": "prefill_pool", "decode": "decode_pool"}.get(role, "pool")


@dataclass(frozen=True, slots=True)
class _NodeHw:
    gpu: str | None
    gpus_per_node: int
    nvlink_bytes_per_s: float  # 0: no NVLink
    pcie_bytes_per_s: float
    nic_bytes_per_s: float  # 0: no NIC


def _hardware(cfg: FabricTopologyConfig, gpu: str | None) -> _NodeHw:
    spec = get_gpu(gpu) if gpu is not None else None
    gpn = cfg.gpus_per_node or (spec.gpus_per_node if spec else _GENERIC["gpus_per_node"])
    nvl = cfg.nvlink_bytes_per_s
    if nvl is None:
        nvl = spec.nvlink_bytes_per_s if spec else _GENERIC["nvlink"]
    if cfg.pcie.gb_per_s is not None:
        pcie = cfg.pcie.gb_per_s * GB
    elif cfg.pcie.gen is not None:
        pcie = PCIE_EFFICIENCY * PCIE_X16_BYTES_PER_S[cfg.pcie.gen]
    elif spec is not None:  # the catalog's x16 rate, as disaggsim.costmodel.kv reads it
        pcie = PCIE_EFFICIENCY * spec.pcie_bytes_per_s
    else:
        pcie = PCIE_EFFICIENCY * PCIE_X16_BYTES_PER_S[int(_GENERIC["pcie_gen"])]
    nic = 0.0
    if cfg.nic is not None:
        nic = cfg.nic.bytes_per_s or (spec.nic_bytes_per_s if spec else _GENERIC["nic"])
    return _NodeHw(gpu, int(gpn), float(nvl), float(pcie), float(nic))


def _workers(pools: Mapping[str, PoolLayout]) -> list[WorkerPlacement]:
    """Every worker the engine builds, indexed as :attr:`Cluster.workers` (pools in
    order, each pool's initial workers then the ones it may scale up to)."""
    out: list[WorkerPlacement] = []
    for role, pool in pools.items():
        ranks = tuple((-1, ()) for _ in range(pool.dp)) if pool.dp > 1 else ()
        for i in range(pool.num_placed):
            out.append(
                WorkerPlacement(len(out), f"{role}.{i}", role, pool.gpu, pool.tp, -1, (), ranks)
            )
    return out


def _placement_order(
    policy: str, workers: list[WorkerPlacement], pools: Mapping[str, PoolLayout]
) -> list[WorkerPlacement]:
    """Initial workers first (so autoscaling leaves the initial layout as it is), then the
    workers autoscaling may start, each group in the policy's order."""

    def initial(w: WorkerPlacement) -> bool:
        return int(w.key.rpartition(".")[2]) < pools[w.role].num_workers

    first = [w for w in workers if initial(w)]
    later = [w for w in workers if not initial(w)]
    if policy == "pair":
        return _interleave(first) + _interleave(later)
    return first + later


def _interleave(workers: list[WorkerPlacement]) -> list[WorkerPlacement]:
    """Prefill and decode workers merged in their pools' ratio (p0, d0, p1, d1, … for
    1:1; p0, p1, d0, p2, p3, d1 for 2:1), ties to prefill."""
    pre = [w for w in workers if w.role == "prefill"]
    dec = [w for w in workers if w.role == "decode"]
    rest = [w for w in workers if w.role not in ("prefill", "decode")]
    keyed = [((i + 0.5) / len(pre), 0, w) for i, w in enumerate(pre)]
    keyed += [((i + 0.5) / len(dec), 1, w) for i, w in enumerate(dec)]
    return [w for *_, w in sorted(keyed, key=lambda t: (t[0], t[1], t[2].index))] + rest


def _place_policy(
    cfg: FabricTopologyConfig,
    workers: list[WorkerPlacement],
    hw: Mapping[str | None, _NodeHw],
    pools: Mapping[str, PoolLayout],
) -> list[WorkerPlacement]:
    policy = cfg.placement.policy
    order = _placement_order(policy, workers, pools)
    node_gpu: list[str | None] = []  # GPU type of each opened node
    node_free: list[int] = []
    node_group: list[str] = []  # spread: the pool that opened the node
    placed: dict[int, WorkerPlacement] = {}
    for w in order:
        group = w.role if policy == "spread" else ""
        gpn = hw[w.gpu].gpus_per_node
        num_ranks = max(len(w.ranks), 1)
        ranks: list[tuple[int, tuple[int, ...]]] = []
        if w.tp * num_ranks <= gpn:  # the whole unit in the first node with room for it
            for n in range(len(node_free)):
                if (
                    node_gpu[n] == w.gpu
                    and node_group[n] == group
                    and node_free[n] >= w.tp * num_ranks
                ):
                    break
            else:
                n = _open_node(node_gpu, node_free, node_group, w.gpu, gpn, group)
            fresh = [n] * num_ranks
        else:  # over several nodes: fresh ones, from their first GPU, rank after rank
            per_node = gpn // w.tp  # whole TP groups a node holds
            nodes = [
                _open_node(node_gpu, node_free, node_group, w.gpu, gpn, group)
                for _ in range(unit_nodes(w.tp, num_ranks, gpn))
            ]
            fresh = [nodes[r // per_node] for r in range(num_ranks)]
        for n in fresh:  # each rank's TP group inside one node
            first = gpn - node_free[n]
            node_free[n] -= w.tp
            ranks.append((n, tuple(range(first, first + w.tp))))
        node, gpus = ranks[0]
        placed[w.index] = WorkerPlacement(
            w.index, w.key, w.role, w.gpu, w.tp, node, gpus, tuple(ranks) if w.ranks else ()
        )
    limit = cfg.placement.num_nodes
    if limit is not None and len(node_free) > limit:
        need = sum(w.tp * max(len(w.ranks), 1) for w in workers)
        scaled = sum(p.num_placed - p.num_workers for p in pools.values())
        extra = f", {scaled} of them autoscaled up to max_workers" if scaled else ""
        raise UserError(
            f"fabric.placement.num_nodes: placement {policy} needs {len(node_free)} nodes for "
            f"{len(workers)} workers ({need} GPUs{extra}) but num_nodes is {limit}"
        )
    return [placed[w.index] for w in workers]


def _open_node(
    node_gpu: list[str | None],
    node_free: list[int],
    node_group: list[str],
    gpu: str | None,
    gpus_per_node: int,
    group: str,
) -> int:
    node_gpu.append(gpu)
    node_free.append(gpus_per_node)
    node_group.append(group)
    return len(node_free) - 1


def _place_explicit(
    cfg: FabricTopologyConfig, workers: list[WorkerPlacement], hw: Mapping[str | None, _NodeHw]
) -> list[WorkerPlacement]:
    explicit = cfg.placement.explicit or {}
    where = "fabric.placement.explicit"
    for w in workers:
        if w.ranks:
            raise UserError(
                f"{where}: {w.key} has {len(w.ranks)} data-parallel ranks; place workers of "
                "several ranks with placement.policy (pack, spread, pair)"
            )
    keys = [w.key for w in workers]
    for k in explicit:
        if k not in keys:
            raise UserError(f"{where}.{k}: no such worker (workers: {', '.join(keys)})")
    missing = [k for k in keys if k not in explicit]
    if missing:
        raise UserError(
            f"{where}: worker {missing[0]} is not placed (list every worker, those an "
            "autoscaled pool may start up to max_workers included)"
        )
    out: list[WorkerPlacement] = []
    node_gpu: dict[int, str | None] = {}
    node_used: dict[int, list[str]] = {}
    node_tp: dict[int, int] = {}
    for w in workers:
        node, gpus = explicit[w.key]
        gpn = hw[w.gpu].gpus_per_node
        if node < 0 or (cfg.placement.num_nodes is not None and node >= cfg.placement.num_nodes):
            raise UserError(f"{where}.{w.key}: node {node} does not exist")
        if len(gpus) != w.tp:
            raise UserError(f"{where}.{w.key}: {len(gpus)} GPUs listed but tp is {w.tp}")
        if node_gpu.setdefault(node, w.gpu) != w.gpu:
            raise UserError(
                f"{where}.{w.key}: node {node} holds {node_gpu[node]} GPUs, not {w.gpu}"
            )
        node_tp[node] = node_tp.get(node, 0) + w.tp
        node_used.setdefault(node, []).append(w.key)
        if node_tp[node] > gpn:
            raise UserError(
                f"{where}: node {node} has {gpn} GPUs but workers "
                f"{', '.join(node_used[node])} need {node_tp[node]}"
            )
        bad = [g for g in gpus if not 0 <= g < gpn]
        if bad:
            raise UserError(f"{where}.{w.key}: GPU {bad[0]} outside 0..{gpn - 1}")
        out.append(WorkerPlacement(w.index, w.key, w.role, w.gpu, w.tp, node, tuple(gpus)))
    owner: dict[tuple[int, int], str] = {}
    for p in out:
        for g in p.gpus:
            other = owner.setdefault((p.node, g), p.key)
            if other != p.key:
                raise UserError(
                    f"{where}.{p.key}: GPU {g} of node {p.node} is also given to {other}"
                )
    return out


class _LinkTable:
    def __init__(self) -> None:
        self.links: list[Link] = []
        self.index: dict[str, int] = {}

    def get(self, id_: str, kind: str, capacity: float, latency_s: float) -> int:
        if id_ not in self.index:
            self.index[id_] = len(self.links)
            self.links.append(Link(id_, kind, capacity, latency_s))
        return self.index[id_]


def build_topology(
    cfg: FabricTopologyConfig,
    pools: Mapping[str, PoolLayout],
    host_paths: bool = False,
    cache_paths: bool = False,
) -> Topology:
    """Place the workers of ``pools`` (role → layout, in pool order: prefill then decode)
    and compute every prefill→decode path; with ``host_paths``, also each decode worker's
    GPU ↔ host paths over its PCIe links (KV swap, :meth:`Topology.host_path`); with
    ``cache_paths``, each prefill worker's GPU ↔ host paths and, where nodes have a NIC,
    its GPU ↔ NIC paths (prefix cache tiers, docs/prefix-caching.md).

    Raises :class:`UserError` (one line naming the field) for a TP group larger than a
    node's NVLink domain, a node asked for more GPUs than it has, or a cross-node path
    with no NIC.
    """
    hw = {p.gpu: _hardware(cfg, p.gpu) for p in pools.values()}
    for role, pool in pools.items():
        gpn = hw[pool.gpu].gpus_per_node
        if pool.tp > gpn:
            raise UserError(
                f"fabric.gpus_per_node: {_role_key(role)}.tp {pool.tp} is larger than the "
                f"node's NVLink domain ({gpn} GPUs) (allowed: tp <= {gpn} on a topology "
                "fabric; fabric kind link prices TP across nodes hierarchically)"
            )
    workers = _workers(pools)
    if cfg.placement.explicit is not None:
        placed = _place_explicit(cfg, workers, hw)
    else:
        placed = _place_policy(cfg, workers, hw, pools)
    table = _LinkTable()
    routes: dict[tuple[int, int], Path] = {}
    pageable = cfg.host_staging == "pageable"
    senders = [w for w in placed if w.role in ("prefill", "colocated")]
    receivers = [w for w in placed if w.role in ("decode", "colocated")]
    for s in senders:
        for d in receivers:
            if s.index != d.index:
                routes[(s.index, d.index)] = _path(cfg, table, hw, s, d, pageable)
    host: dict[tuple[int, str], Path] = {}
    if host_paths:
        for d in receivers:
            for kind, way in (("d2h", "out"), ("h2d", "in")):
                host[(d.index, kind)] = _host_path(cfg, table, hw[d.gpu], d, kind, way)
    a2a_share: dict[int, float] = {}
    for w in placed:  # an EP unit across nodes: its expert all-to-all over the NICs
        if len(w.nodes) > 1 and cfg.nic is not None and hw[w.gpu].nic_bytes_per_s > 0:
            host[(w.index, "a2a")], a2a_share[w.index] = _a2a_path(cfg, table, hw[w.gpu], w)
    if cache_paths:
        for w in placed:
            if w.role != "prefill":
                continue
            for kind, way in (("d2h", "out"), ("h2d", "in")):
                host[(w.index, kind)] = _host_path(cfg, table, hw[w.gpu], w, kind, way)
            if cfg.nic is not None and hw[w.gpu].nic_bytes_per_s > 0:
                for way in ("in", "out"):
                    host[(w.index, f"nic.{way}")] = _nic_path(cfg, table, hw[w.gpu], w, way)
    return Topology(
        links=tuple(table.links),
        workers=tuple(placed),
        num_nodes=1 + max((w.node for w in placed), default=-1),
        link_index=MappingProxyType(dict(table.index)),
        setup_latency_s=cfg.setup_latency_s,
        per_block_s=cfg.per_block_s,
        overlap=cfg.overlap,
        _routes=MappingProxyType(routes),
        _host=MappingProxyType(host),
        _a2a_share=MappingProxyType(a2a_share),
    )


def _host_path(
    cfg: FabricTopologyConfig,
    table: _LinkTable,
    hwn: _NodeHw,
    w: WorkerPlacement,
    kind: str,
    way: str,
) -> Path:
    """Every GPU of ``w`` copying its own KV shard over its PCIe link (pinned host memory;
    ``way`` ``out``: device → host)."""
    lat = cfg.pcie.latency_s
    routes = tuple(
        Route((table.get(f"n{w.node}.g{g}.pcie.{way}", "pcie", hwn.pcie_bytes_per_s, lat),))
        for g in w.gpus
    )
    return Path(kind, w.index, w.index, routes, lat)


def _a2a_path(
    cfg: FabricTopologyConfig, table: _LinkTable, hwn: _NodeHw, w: WorkerPlacement
) -> tuple[Path, float]:
    """A multi-node worker's all-to-all as it loads the links others share: the first
    rank's NIC (its GPU's own with ``nic.per_gpu``, else its node's) sending to the rank
    at the same position on the next node and receiving from the one on the previous
    node (nodes in a ring), and the share of the unit's all-to-all bytes each of those
    two routes carries (one rank's, or with a shared NIC every rank's on the node). KV
    handoffs of the unit use the first rank's GPUs, so this is where they meet the
    all-to-all; the other ranks' NICs carry shares nothing else uses. Two routes
    whatever the unit's size: the flow's work per run does not grow with its GPUs."""
    assert cfg.nic is not None
    lat = cfg.nic.latency_s
    ranks = w.ranks
    nodes = w.nodes
    node, gpus = ranks[0]
    nxt = next(r for r in ranks if r[0] == nodes[1])  # first rank of the next node
    prv = next(r for r in ranks if r[0] == nodes[-1])  # and of the previous one

    def nic(r: tuple[int, tuple[int, ...]], way: str) -> int:
        k = r[1][0] if cfg.nic is not None and cfg.nic.per_gpu else 0
        return table.get(
            f"n{r[0]}.nic{k}.{way}", "nic", hwn.nic_bytes_per_s, lat if way == "out" else 0.0
        )

    first = (node, gpus)
    routes = (
        Route((nic(first, "out"), nic(nxt, "in"))),
        Route((nic(prv, "out"), nic(first, "in"))),
    )
    same = sum(1 for n, _ in ranks if n == node)  # ranks on the first rank's node
    share = 2 * (1 if cfg.nic.per_gpu else same) / len(ranks)  # split over two routes
    return Path("a2a", w.index, w.index, routes, lat), share


def _nic_path(
    cfg: FabricTopologyConfig, table: _LinkTable, hwn: _NodeHw, w: WorkerPlacement, way: str
) -> Path:
    """Every GPU of ``w`` moving its own KV shard through its node's NIC (its own with
    ``nic.per_gpu``) to or from a store outside the node (``way`` ``in``: into the GPU)."""
    assert cfg.nic is not None
    lat = cfg.nic.latency_s
    routes = tuple(
        Route(
            (
                table.get(
                    f"n{w.node}.nic{g if cfg.nic.per_gpu else 0}.{way}",
                    "nic",
                    hwn.nic_bytes_per_s,
                    lat if way == "out" else 0.0,
                ),
            )
        )
        for g in w.gpus
    )
    return Path(f"nic.{way}", w.index, w.index, routes, lat)


def _path(
    cfg: FabricTopologyConfig,
    table: _LinkTable,
    hw: Mapping[str | None, _NodeHw],
    s: WorkerPlacement,
    d: WorkerPlacement,
    pageable: bool,
) -> Path:
    hs, hd = hw[s.gpu], hw[d.gpu]
    m = max(s.tp, d.tp)
    pcie_lat = cfg.pcie.latency_s

    def nvl(hwn: _NodeHw, node: int, gpu: int, way: str) -> int:
        lat = cfg.nvlink_latency_s if way == "out" else 0.0
        return table.get(f"n{node}.g{gpu}.nvlink.{way}", "nvlink", hwn.nvlink_bytes_per_s, lat)

    def pcie(hwn: _NodeHw, node: int, gpu: int, way: str) -> int:
        return table.get(f"n{node}.g{gpu}.pcie.{way}", "pcie", hwn.pcie_bytes_per_s, pcie_lat)

    def nic(hwn: _NodeHw, node: int, gpu: int, way: str) -> int:
        assert cfg.nic is not None
        k = gpu if cfg.nic.per_gpu else 0
        lat = cfg.nic.latency_s if way == "out" else 0.0
        return table.get(f"n{node}.nic{k}.{way}", "nic", hwn.nic_bytes_per_s, lat)

    same_node = s.node == d.node
    if same_node:
        kind = "nvlink" if hs.nvlink_bytes_per_s > 0 and hd.nvlink_bytes_per_s > 0 else "pcie-p2p"
    else:
        if cfg.nic is None:
            raise UserError(
                f"fabric.nic: {s.key} (node {s.node}) and {d.key} (node {d.node}) need a "
                "cross-node path but nodes have no NIC (nic: null)"
            )
        kind = "rdma" if cfg.nic.rdma else "staged"
    routes = []
    for k in range(m):
        gs, gd = s.gpus[k * s.tp // m], d.gpus[k * d.tp // m]
        cap = math.inf
        links: tuple[int, ...]
        if kind == "nvlink":
            links = (nvl(hs, s.node, gs, "out"), nvl(hd, d.node, gd, "in"))
        elif kind == "pcie-p2p":
            links = (pcie(hs, s.node, gs, "out"), pcie(hd, d.node, gd, "in"))
        elif kind == "rdma":
            links = (nic(hs, s.node, gs, "out"), nic(hd, d.node, gd, "in"))
        else:
            links = (
                pcie(hs, s.node, gs, "out"),
                nic(hs, s.node, gs, "out"),
                nic(hd, d.node, gd, "in"),
                pcie(hd, d.node, gd, "in"),
            )
            if pageable:
                cap = PAGEABLE_FACTOR * min(hs.pcie_bytes_per_s, hd.pcie_bytes_per_s)
        routes.append(Route(links, cap))
    latency = max(sum(table.links[i].latency_s for i in r.links) for r in routes)
    return Path(kind, s.index, d.index, tuple(routes), latency)


def link_class_topology(
    num_workers: int, bandwidth_bytes_per_s: float, latency_s: float, num_shards: int = 1
) -> Topology:
    """No topology: every transfer runs alone at ``num_shards × bandwidth`` after
    ``latency_s`` (size/bw + latency per shard, as today's link-class model)."""
    if bandwidth_bytes_per_s <= 0:
        raise UserError(f"fabric.bandwidth_gb_per_s: must be > 0, got {bandwidth_bytes_per_s / GB}")
    route = Route((), bandwidth_bytes_per_s * num_shards)
    paths = {
        (s, d): Path("link-class", s, d, (route,), latency_s)
        for s in range(num_workers)
        for d in range(num_workers)
        if s != d
    }
    return Topology(
        links=(), workers=(), num_nodes=0, link_index=MappingProxyType({}),
        _routes=MappingProxyType(paths),
    )  # fmt: skip


def describe_path(topology: Topology, path: Path) -> tuple[str, ...]:
    """Link ids of the first shard's route, for records and the CLI."""
    return tuple(topology.links[i].id for i in path.routes[0].links)


def pool_layouts(
    items: Sequence[tuple[str, str | None, int, int] | tuple[str, str | None, int, int, int]],
    max_workers: Mapping[str, int] | None = None,
) -> dict[str, PoolLayout]:
    """``[(role, gpu, num_workers, tp[, dp]), …]`` (and each autoscaled role's
    ``max_workers``) → the mapping :func:`build_topology` takes."""
    most = max_workers or {}
    out = {}
    for role, gpu, n, tp, *rest in items:
        out[role] = PoolLayout(gpu, n, tp, most.get(role), rest[0] if rest else 1)
    return out
