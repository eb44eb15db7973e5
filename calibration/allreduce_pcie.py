"""The all-reduce of GPUs without NVLink, fitted on public nccl-tests tables.

A tensor-parallel group of GPUs that have no NVLink (L40S, H100 PCIe as the catalog has
it) all-reduces over PCIe through NCCL: TensorRT-LLM's all-reduce plugin runs NCCL
whenever the group has no NVLink (``AllreducePlugin::selectImplementation``: strategy
``AUTO`` and no NVLink → ``NCCL``; its one-shot / two-shot kernels need NVLink), and
vLLM disables its custom all-reduce on more than two PCIe-only GPUs. NCCL itself uses
peer-to-peer copies only between GPUs behind a common PCIe switch by default
(``ncclTopoCheckP2p``: ``p2pLevel = PATH_PXB`` on x86 Intel hosts); anywhere else each
ring step is staged through host memory (the ``SHM`` transport). An 8-GPU L40S server
hangs its GPUs off the CPUs' root ports without a PCIe switch (the reference "2-2-4"
design), so its ring runs through host memory.

The data, ``calibration/comm_data/allreduce_pcie.csv`` (provenance beside it in
``allreduce_pcie.md``), are out-of-place ``all_reduce_perf`` times measured by others on
bare-metal PCIe Gen4 x16 servers (8 × RTX 4090 on two EPYC 7542 with P2P off and on, 4
and 6 × RTX 4090 with P2P), plus two busbw statements for 8 and 4 × RTX 5090 on PCIe
Gen5. Rows are ``fit`` (the 8-GPU table of each transport) or ``held_out`` (every other
GPU count, never fitted).

Form: NCCL's ring all-reduce of ``S`` bytes per GPU over ``n`` GPUs takes ``2 (n − 1)``
steps, each moving ``S / n`` bytes over one hop and paying the hop's latency, in the
faster of two protocols (Simple; LL, quick to start, half the bandwidth)::

    t = min over protocols p of  lat_p × (n − 1) / 7  +  2 (n − 1) / n × S / bw_p

``lat_p`` and ``bw_p`` are :func:`calibration.fit.fit_allreduce`'s fit of the transport's
8-GPU table (its latency at 8 GPUs is 14 steps: 7 × two), so the bus bandwidth is the
hop's and the same at every count, and the latency scales with the ring's steps. The
rule is checked held out on the P2P tables of 4 and 6 GPUs (:func:`held_out_report`).

A GPU's profile section (:func:`profile_section`) is the ``SHM`` fit
(:data:`PROFILE_TRANSPORT`) with both protocols' bandwidths scaled by the GPU's PCIe
bandwidth over the data's (Gen5 x16 twice Gen4's; latencies unchanged), for 2, 4 and 8
GPUs. ``python -m calibration.allreduce_pcie`` prints the fits, the held-out checks and
the sections; :func:`calibration.fit_public.prior_from` writes them into the profiles of
GPUs without NVLink.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from disaggsim.catalog import get_gpu
from disaggsim.errors import UserError

DATA = Path(__file__).parent / "comm_data" / "allreduce_pcie.csv"
COLUMNS = (
    "source",
    "gpu",
    "pcie_gb_per_s",
    "num_gpus",
    "transport",
    "role",
    "nbytes",
    "time_us",
    "busbw_gb_per_s",
)
TRANSPORTS = ("shm", "p2p", "unknown")
ROLES = ("fit", "held_out")
FIT_GPUS = 8
"""GPU count of the tables the fits are made on."""
PROFILE_TRANSPORT = "shm"
"""Transport of the shipped profiles: NCCL's default on an 8-GPU PCIe server without
switches (module docstring)."""
PROFILE_GPU_COUNTS = (2, 4, 8)
SOURCE = (
    "calibration/allreduce_pcie.py (NCCL's ring through host memory fitted on public "
    "nccl-tests tables of PCIe Gen4 servers; bandwidth times this GPU's PCIe over Gen4's)"
)
"""How a profile's provenance names this section's origin."""


@dataclass(frozen=True, slots=True)
class RingFit:
    """One transport's fit at :data:`FIT_GPUS` GPUs: per protocol latency (seconds) and
    bus bandwidth (bytes/s) on PCIe of ``pcie_bytes_per_s`` per direction."""

    transport: str
    latency_s: float
    bus_bw_bytes_per_s: float
    ll_latency_s: float
    ll_bus_bw_bytes_per_s: float
    pcie_bytes_per_s: float
    fit_error: dict[str, object]

    def params_for(
        self, num_gpus: int, pcie_bytes_per_s: float | None = None
    ) -> tuple[float, float, float, float]:
        """``(latency_s, bus_bw, ll_latency_s, ll_bus_bw)`` for ``num_gpus`` on PCIe of
        ``pcie_bytes_per_s`` (the data's when None): latency by the ring's steps,
        bandwidth by the PCIe ratio."""
        steps = (num_gpus - 1) / (FIT_GPUS - 1)
        bw = 1.0 if pcie_bytes_per_s is None else pcie_bytes_per_s / self.pcie_bytes_per_s
        return (
            self.latency_s * steps,
            self.bus_bw_bytes_per_s * bw,
            self.ll_latency_s * steps,
            self.ll_bus_bw_bytes_per_s * bw,
        )

    def time_s(
        self, nbytes: np.ndarray, num_gpus: int, pcie_bytes_per_s: float | None = None
    ) -> np.ndarray:
        """Seconds of an all-reduce of ``nbytes`` per GPU (the faster protocol)."""
        lat, bw, ll_lat, ll_bw = self.params_for(num_gpus, pcie_bytes_per_s)
        ring = 2.0 * (num_gpus - 1) / num_gpus * np.asarray(nbytes, float)
        return np.minimum(lat + ring / bw, ll_lat + ring / ll_bw)


def _num(text: str, field: str, where: str, *, positive: bool = True) -> float:
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{where}: {field}: not a number: {text!r}") from None
    if not np.isfinite(v) or v < 0 or (positive and v == 0):
        sign = "positive" if positive else "non-negative"
        raise UserError(f"{where}: {field}: must be a {sign} number, got {text!r}")
    return v


def read_rows(path: Path = DATA) -> pd.DataFrame:
    """The data file as a frame (``time_us`` NaN where a source states only a busbw);
    a bad row is a :class:`UserError` naming the file, line and field."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise UserError(
                    f"{path}: header must be {','.join(COLUMNS)}, got "
                    f"{','.join(reader.fieldnames or ())}"
                )
            out = []
            for i, r in enumerate(reader, start=2):
                where = f"{path}:{i}"
                if r["transport"] not in TRANSPORTS:
                    raise UserError(
                        f"{where}: transport: {r['transport']!r} (allowed: {', '.join(TRANSPORTS)})"
                    )
                if r["role"] not in ROLES:
                    raise UserError(f"{where}: role: {r['role']!r} (allowed: {', '.join(ROLES)})")
                n = _num(r["num_gpus"], "num_gpus", where)
                if n < 2 or n != int(n):
                    raise UserError(
                        f"{where}: num_gpus: must be an integer >= 2, got {r['num_gpus']!r}"
                    )
                time_us = r["time_us"].strip()
                out.append(
                    {
                        "source": r["source"],
                        "gpu": r["gpu"],
                        "pcie_bytes_per_s": _num(r["pcie_gb_per_s"], "pcie_gb_per_s", where) * 1e9,
                        "num_gpus": int(n),
                        "transport": r["transport"],
                        "role": r["role"],
                        "nbytes": _num(r["nbytes"], "nbytes", where),
                        "time_s": _num(time_us, "time_us", where) * 1e-6 if time_us else np.nan,
                        "busbw_bytes_per_s": _num(
                            r["busbw_gb_per_s"], "busbw_gb_per_s", where, positive=False
                        )
                        * 1e9,
                    }
                )
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if not out:
        raise UserError(f"{path}: no rows")
    return pd.DataFrame(out)


def fit_transport(rows: pd.DataFrame, transport: str) -> RingFit:
    """Fit the ``fit`` rows of ``transport`` (one :data:`FIT_GPUS`-GPU table)."""
    from calibration.fit import fit_allreduce

    t = rows[(rows["role"] == "fit") & (rows["transport"] == transport)]
    if t.empty or set(t["num_gpus"]) != {FIT_GPUS} or t["pcie_bytes_per_s"].nunique() != 1:
        raise UserError(
            f"{DATA.name}: transport {transport!r}: needs fit rows of one {FIT_GPUS}-GPU "
            "table on one PCIe bandwidth"
        )
    f = fit_allreduce(t["nbytes"].to_numpy(), t["time_s"].to_numpy(), FIT_GPUS)
    lat, bw, ll_lat, ll_bw = (float(x) for x in f.params)
    return RingFit(
        transport, lat, bw, ll_lat, ll_bw, float(t["pcie_bytes_per_s"].iloc[0]),
        f.error.as_dict(),
    )  # fmt: skip


def profile_section(gpu: str, rows: pd.DataFrame | None = None) -> dict[str, dict[str, float]]:
    """The ``ops.allreduce`` section of ``gpu``'s profile: the :data:`PROFILE_TRANSPORT`
    fit for each of :data:`PROFILE_GPU_COUNTS`, bandwidths scaled to ``gpu``'s PCIe."""
    from calibration.fit import allreduce_dict

    fit = fit_transport(read_rows() if rows is None else rows, PROFILE_TRANSPORT)
    pcie = get_gpu(gpu).pcie_bytes_per_s
    return {str(n): allreduce_dict(fit.params_for(n, pcie)) for n in PROFILE_GPU_COUNTS}


def held_out_report(rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each held-out source against its transport's fit at its GPU count and PCIe (the
    ``unknown``-transport statements against both): median and largest APE of the time
    (or of the stated busbw where there is no time)."""
    rows = read_rows() if rows is None else rows
    fits = {tr: fit_transport(rows, tr) for tr in ("shm", "p2p")}
    out = []
    held = rows[rows["role"] == "held_out"]
    for (src, tr), g in held.groupby(["source", "transport"], sort=False):
        n, pcie = int(g["num_gpus"].iloc[0]), float(g["pcie_bytes_per_s"].iloc[0])
        nb = g["nbytes"].to_numpy()
        for fit_tr in fits if tr == "unknown" else (str(tr),):
            pred = fits[fit_tr].time_s(nb, n, pcie)
            if g["time_s"].notna().all():
                ratio = pred / g["time_s"].to_numpy()
                what = "time"
            else:
                ratio = (2.0 * (n - 1) / n * nb / pred) / g["busbw_bytes_per_s"].to_numpy()
                what = "busbw"
            ape = np.abs(ratio - 1.0)
            out.append(
                {
                    "source": src, "num_gpus": n, "pcie_gb_per_s": pcie / 1e9, "fit": fit_tr,
                    "compared": what, "rows": len(g), "median_ape": float(np.median(ape)),
                    "max_ape": float(ape.max()), "median_pred_over_meas": float(np.median(ratio)),
                }
            )  # fmt: skip
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.allreduce_pcie",
        description="Fit the PCIe all-reduce on public nccl-tests tables and check it held out.",
    )
    p.parse_args(argv)
    try:
        rows = read_rows()
        for tr in ("shm", "p2p"):
            f = fit_transport(rows, tr)
            print(
                f"{tr}: {FIT_GPUS} GPUs, PCIe {f.pcie_bytes_per_s / 1e9:.0f} GB/s: Simple "
                f"{f.latency_s * 1e6:.1f} us + {f.bus_bw_bytes_per_s / 1e9:.2f} GB/s, LL "
                f"{f.ll_latency_s * 1e6:.1f} us + {f.ll_bus_bw_bytes_per_s / 1e9:.2f} GB/s; "
                f"fit {f.fit_error}"
            )
        with pd.option_context("display.width", 200):
            print(held_out_report(rows).round(3).to_string(index=False))
        for gpu in ("l40s", "h100-pcie"):
            print(gpu, profile_section(gpu, rows))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
