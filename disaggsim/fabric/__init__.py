"""The KV fabric: topology and placement, max-min fair flows, layer-wise overlap.

:mod:`.config` reads the scenario's ``fabric:`` section (topology form);
:mod:`.topology` places workers on nodes and GPUs and computes each transfer's path;
:mod:`.flows` shares link bandwidth among concurrent transfers in SimPy time;
:mod:`.overlap` holds the exposed-tail model of streaming KV during the prefill.
See docs/fabric.md.
"""

from disaggsim.fabric.config import (
    FabricTopologyConfig,
    NicConfig,
    PcieConfig,
    PlacementConfig,
    parse_topology_config,
)
from disaggsim.fabric.flows import (
    FlowHandle,
    FlowNetwork,
    LinkUtilisation,
    TransferRecord,
    fabric_summary,
    max_min_rates,
)
from disaggsim.fabric.overlap import SendPlan, exposed_time_s, send_plan
from disaggsim.fabric.topology import (
    BLOCK_TOKENS,
    PATH_KINDS,
    Link,
    Path,
    PoolLayout,
    Route,
    Topology,
    WorkerPlacement,
    build_topology,
    describe_path,
    link_class_topology,
    pool_layouts,
)

__all__ = [
    "BLOCK_TOKENS",
    "PATH_KINDS",
    "FabricTopologyConfig",
    "FlowHandle",
    "FlowNetwork",
    "Link",
    "LinkUtilisation",
    "NicConfig",
    "Path",
    "PcieConfig",
    "PlacementConfig",
    "PoolLayout",
    "Route",
    "SendPlan",
    "Topology",
    "TransferRecord",
    "WorkerPlacement",
    "build_topology",
    "describe_path",
    "exposed_time_s",
    "fabric_summary",
    "link_class_topology",
    "max_min_rates",
    "parse_topology_config",
    "pool_layouts",
    "send_plan",
]
