"""A fixed hardware profile for hand-arithmetic tests of the cost model and ``cost`` CLI.

Shipped profiles are refitted whenever calibration improves, so tests that check a step
time by hand use this profile instead: H100-SXM datasheet peaks with round, typed-in
parameters that the expectations in the tests are computed from.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from disaggsim.hardware.engines import EngineProfile
from disaggsim.hardware.profile import HardwareProfile, profile_from_dict

# H100-SXM datasheet peaks: 989 TFLOP/s dense bf16, 1979 fp8, 3.35 TB/s HBM, 80 GiB-class
FIXED_H100: dict[str, Any] = {
    "schema_version": 1,
    "gpu": "h100-sxm",
    "peaks": {
        "bf16_flop_per_s": 989e12,
        "fp8_flop_per_s": 1979e12,
        "hbm_bytes_per_s": 3.35e12,
        "hbm_bytes": 85520809984.0,
    },
    "ops": {
        "gemm": {
            "bf16": {"launch_s": 5e-6, "max_eff": 0.75, "half_sat": 32.0, "mem_eff": 0.8},
            "fp8": {"launch_s": 5e-6, "max_eff": 0.6, "half_sat": 64.0, "mem_eff": 0.8},
        },
        "decode_attention": {
            "bf16": {"floor_s": 8e-6, "per_seq_s": 1e-7, "bw_eff": 0.7},
            "fp8": {"floor_s": 8e-6, "per_seq_s": 1e-7, "bw_eff": 0.6},
        },
        "prefill_attention": {"bf16": {"floor_s": 1e-5, "max_eff": 0.6, "half_sat": 512.0}},
        "elementwise": {"launch_s": 3e-6, "bw_eff": 0.7},
        "allreduce": {
            "2": {"latency_s": 1e-5, "bus_bw_bytes_per_s": 2.5e11},
            "4": {"latency_s": 1.5e-5, "bus_bw_bytes_per_s": 3.0e11},
            "8": {"latency_s": 2e-5, "bus_bw_bytes_per_s": 3.5e11},
        },
        "copy": {
            "d2d": {"latency_s": 5e-6, "bw_bytes_per_s": 1.2e12},
            "h2d_pinned": {"latency_s": 1e-5, "bw_bytes_per_s": 4.8e10},
            "d2h_pinned": {"latency_s": 1e-5, "bw_bytes_per_s": 4.8e10},
            "p2p": {"latency_s": 1e-5, "bw_bytes_per_s": 3.6e11},
            "gather": {"latency_s": 5e-6, "bw_bytes_per_s": 1.2e12, "per_block_s": 2e-7},
        },
    },
    "provenance": {"kind": "provisional", "source": "tests/costmodel_fixtures.py"},
}


# Engine profiles for hand arithmetic: a graph engine and an eager one
FIXED_GRAPHS = EngineProfile(name="vllm", per_iteration_s=3e-4, per_layer_s=1e-6)
FIXED_EAGER = EngineProfile(
    name="vllm-eager-2023", per_iteration_s=1e-3, per_layer_s=2e-5, cuda_graphs=False
)


def fixed_h100_dict() -> dict[str, Any]:
    return copy.deepcopy(FIXED_H100)


def fixed_h100_profile() -> HardwareProfile:
    return profile_from_dict(fixed_h100_dict(), "tests/costmodel_fixtures.py")


def write_fixed_h100(folder: Path) -> Path:
    path = Path(folder) / "fixed_h100.json"
    path.write_text(json.dumps(FIXED_H100))
    return path
