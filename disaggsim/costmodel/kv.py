"""KV-cache handoff sizes and transfer times per link class.

Owns the first-order model of moving a prefill worker's KV cache to a decode worker:
``time_s = latency_s + nbytes / bandwidth_bytes_per_s`` on one link class. Contention
between concurrent transfers and layer-wise overlap with prefill belong to the engine's
fabric, which uses these per-link defaults.

Default bandwidths (bytes/s, per direction, per GPU; GB = 1e9 bytes):

==============  =========================================  =================================
link            with a catalog GPU                         without a GPU
==============  =========================================  =================================
``nvlink``      the GPU's NVLink per direction             450 GB/s (NVLink 4, H100/H200)
``infiniband``  the GPU's NIC (GPUDirect RDMA)             200 Gb/s HDR = 25 GB/s
``roce``        the GPU's NIC (GPUDirect RDMA over RoCE)   200 Gb/s = 25 GB/s
``pcie``        0.75 × the GPU's PCIe per direction        0.75 × 32 GB/s (Gen4 x16) = 24 GB/s
==============  =========================================  =================================

PCIe carries protocol overhead (TLP headers, flow control): pinned-memory copies reach
about three quarters of the link rate, hence 0.75. Default latencies (seconds, priors
of the order NCCL and RDMA benchmarks show for small messages): NVLink 10 µs,
InfiniBand 15 µs, RoCE 25 µs (Ethernet switching and congestion control add a little),
PCIe 20 µs (through the host root complex).
"""

from __future__ import annotations

from dataclasses import dataclass

from disaggsim.catalog import GpuSpec, ModelSpec, get_gpu, get_model
from disaggsim.errors import UserError
from disaggsim.units import GB, GBIT

__all__ = [
    "DEFAULT_BANDWIDTH_BYTES_PER_S",
    "DEFAULT_LATENCY_S",
    "LINK_CLASSES",
    "PCIE_EFFICIENCY",
    "KvTransfer",
    "kv_bytes",
    "kv_transfer",
    "link_bandwidth_bytes_per_s",
]

LINK_CLASSES: tuple[str, ...] = ("nvlink", "infiniband", "roce", "pcie")
PCIE_EFFICIENCY = 0.75
DEFAULT_BANDWIDTH_BYTES_PER_S: dict[str, float] = {
    "nvlink": 450 * GB,
    "infiniband": 200 * GBIT,
    "roce": 200 * GBIT,
    "pcie": PCIE_EFFICIENCY * 32 * GB,
}
DEFAULT_LATENCY_S: dict[str, float] = {
    "nvlink": 10e-6,
    "infiniband": 15e-6,
    "roce": 25e-6,
    "pcie": 20e-6,
}


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """One KV transfer: ``time_s = latency_s + nbytes / bandwidth_bytes_per_s``."""

    time_s: float
    bandwidth_bytes_per_s: float
    latency_s: float
    link: str


def kv_bytes(model: str | ModelSpec, tokens: int, kv_dtype: str = "bf16") -> int:
    """Bytes of KV cache for ``tokens`` tokens of context of ``model`` (windowed layers
    keep at most their window: :meth:`ModelSpec.kv_bytes`)."""
    if tokens < 0:
        raise UserError(f"tokens must be >= 0, got {tokens}")
    return get_model(model).kv_bytes(tokens, kv_dtype)


def _check_link(link: str) -> None:
    if link not in LINK_CLASSES:
        raise UserError(f"unknown link {link!r} (allowed: {', '.join(LINK_CLASSES)})")


def link_bandwidth_bytes_per_s(link: str, gpu: str | GpuSpec | None = None) -> float:
    """Default per-direction bandwidth of ``link`` for ``gpu`` (or without a GPU)."""
    _check_link(link)
    if gpu is None:
        return DEFAULT_BANDWIDTH_BYTES_PER_S[link]
    g = get_gpu(gpu)
    if link == "nvlink":
        if g.nvlink_bytes_per_s <= 0:
            raise UserError(f"{g.id} has no NVLink (use one of: infiniband, roce, pcie)")
        return g.nvlink_bytes_per_s
    if link in ("infiniband", "roce"):
        return g.nic_bytes_per_s
    return PCIE_EFFICIENCY * g.pcie_bytes_per_s


def kv_transfer(
    nbytes: float,
    link: str,
    gpu: str | GpuSpec | None = None,
    bandwidth_bytes_per_s: float | None = None,
    latency_s: float | None = None,
) -> KvTransfer:
    """Time to move ``nbytes`` of KV cache over one ``link`` (one of :data:`LINK_CLASSES`).

    ``bandwidth_bytes_per_s`` and ``latency_s`` override the defaults, which come from
    ``gpu``'s catalog entry when given (see the module docstring).
    """
    _check_link(link)
    if nbytes < 0:
        raise UserError(f"KV bytes must be >= 0, got {nbytes}")
    bw = (
        link_bandwidth_bytes_per_s(link, gpu)
        if bandwidth_bytes_per_s is None
        else float(bandwidth_bytes_per_s)
    )
    if bw <= 0:
        raise UserError(f"link bandwidth must be > 0 bytes/s, got {bw}")
    lat = DEFAULT_LATENCY_S[link] if latency_s is None else float(latency_s)
    if lat < 0:
        raise UserError(f"link latency must be >= 0 s, got {lat}")
    return KvTransfer(time_s=lat + nbytes / bw, bandwidth_bytes_per_s=bw, latency_s=lat, link=link)
