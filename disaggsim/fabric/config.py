"""The ``fabric:`` section of a scenario in topology form: nodes, NVLink, NICs, PCIe,
host staging, placement and layer-wise overlap.

Pydantic models, frozen and ``extra="forbid"``, in human units (``_gb_per_s`` with
GB = 1e9 bytes, ``_gbit_per_s`` with Gb = 1e9 bits, ``_us`` microseconds); the SI values
are read through properties, converted once here. Checks that need the pools (worker
counts, TP degrees, GPU types) live in :func:`disaggsim.fabric.topology.build_topology`.
:func:`parse_topology_config` turns a mapping into a config or one :class:`UserError`
line naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from disaggsim.config.bounds import MAX_GPUS_PER_NODE, MAX_NODES, ConfigModel
from disaggsim.errors import UserError
from disaggsim.units import GB, GBIT, US

__all__ = [
    "FabricTopologyConfig",
    "NicConfig",
    "PcieConfig",
    "PlacementConfig",
    "parse_topology_config",
]


class NicConfig(ConfigModel):
    """Network interfaces of a node. Give at most one of ``gb_per_s``/``gbit_per_s``
    (per direction, per NIC); without either, the GPU catalog's NIC rate is used."""

    gb_per_s: float | None = Field(default=None, gt=0.0, description="GB/s, GB = 1e9 bytes")
    gbit_per_s: float | None = Field(default=None, gt=0.0, description="Gb/s, Gb = 1e9 bits")
    per_gpu: bool = Field(
        default=True, description="rail-aligned: one NIC per GPU (true) or one per node (false)"
    )
    rdma: bool = Field(default=True, description="GPUDirect RDMA (false: staged through host)")
    latency_us: float = Field(default=15.0, ge=0.0)

    @model_validator(mode="after")
    def _one_rate(self) -> NicConfig:
        if self.gb_per_s is not None and self.gbit_per_s is not None:
            raise ValueError("give gb_per_s or gbit_per_s, not both")
        return self

    @property
    def bytes_per_s(self) -> float | None:
        """The configured rate in bytes/s, or None to use the GPU catalog's."""
        if self.gb_per_s is not None:
            return self.gb_per_s * GB
        if self.gbit_per_s is not None:
            return self.gbit_per_s * GBIT
        return None

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class PcieConfig(ConfigModel):
    """Each GPU's host link. ``gb_per_s`` is the effective per-direction rate (protocol
    overhead included); without it, 0.75 × the x16 rate of ``gen`` (Gen4 32 GB/s, Gen5
    64 GB/s, Gen6 128 GB/s) or, without ``gen``, of the GPU catalog's ``pcie_gb_per_s``:
    the same efficiency and rate as :mod:`disaggsim.costmodel.kv`."""

    gen: Literal[4, 5, 6] | None = Field(default=None, description="default: the GPU catalog's")
    gb_per_s: float | None = Field(default=None, gt=0.0, description="effective GB/s override")
    latency_us: float = Field(default=20.0, ge=0.0)

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class PlacementConfig(ConfigModel):
    """Which GPUs of which node each worker occupies.

    ``pack``: workers fill nodes in pool order (prefill, then decode); ``spread``: each
    pool on its own nodes, so every handoff crosses the network; ``pair``: prefill and
    decode workers interleaved in their pools' ratio, so nodes hold both roles.
    ``explicit`` maps every worker key (``prefill.0``, ``decode.1``, ``colocated.0``) to
    ``[node, [gpu indices]]`` and overrides the policy.
    """

    policy: Literal["pack", "spread", "pair"] = "pack"
    explicit: dict[str, tuple[int, tuple[int, ...]]] | None = None
    num_nodes: int | None = Field(
        default=None, ge=1, le=MAX_NODES, description="nodes available (default: as many as needed)"
    )


class FabricTopologyConfig(ConfigModel):
    """A cluster of nodes with ``gpus_per_node`` GPUs, an NVLink domain per node, NICs
    and PCIe links; see docs/fabric.md for the path each transfer takes."""

    kind: Literal["topology"] = "topology"
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=MAX_GPUS_PER_NODE, description="default: GPU catalog"
    )
    nvlink_gb_per_s: float | None = Field(
        default=None,
        gt=0.0,
        description="per direction per GPU, GB = 1e9 bytes; default: GPU catalog (omit for none)",
    )
    nvlink_latency_us: float = Field(default=10.0, ge=0.0)
    nic: NicConfig | None = Field(default=NicConfig(), description="null: nodes have no NIC")
    pcie: PcieConfig = PcieConfig()
    host_staging: Literal["pinned", "pageable"] = "pinned"
    placement: PlacementConfig = PlacementConfig()
    overlap: bool = Field(default=False, description="stream KV layer by layer during prefill")
    setup_latency_us: float = Field(default=0.0, ge=0.0, description="per transfer")
    per_block_us: float = Field(
        default=0.0, ge=0.0, description="gathering one paged block (16 tokens) before sending"
    )

    @property
    def nvlink_bytes_per_s(self) -> float | None:
        return None if self.nvlink_gb_per_s is None else self.nvlink_gb_per_s * GB

    @property
    def nvlink_latency_s(self) -> float:
        return self.nvlink_latency_us * US

    @property
    def setup_latency_s(self) -> float:
        return self.setup_latency_us * US

    @property
    def per_block_s(self) -> float:
        return self.per_block_us * US


def parse_topology_config(data: Any, source: str = "fabric") -> FabricTopologyConfig:
    """``data`` validated as a :class:`FabricTopologyConfig`; a bad value is one
    :class:`UserError` line ``<source>.<field path>: <problem>``."""
    try:
        return FabricTopologyConfig.model_validate(data)
    except ValidationError as err:
        e = err.errors(include_url=False)[0]
        key = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        raise UserError(f"{source}.{key}: {msg}" if key else f"{source}: {msg}") from None
