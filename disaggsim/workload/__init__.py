"""Workloads: the requests a scenario serves, generated up front from seeded streams.

Synthetic arrival processes and length distributions, shipped presets measured from real
traces, replay of trace files (Azure LLM inference CSV, Mooncake JSONL), and multi-turn
sessions with prefix reuse.
"""

from disaggsim.workload.config import (
    PresetWorkload,
    SessionWorkload,
    SyntheticWorkload,
    TraceWorkload,
    WorkloadConfig,
)
from disaggsim.workload.generate import generate_requests
from disaggsim.workload.presets import PRESET_NAMES
from disaggsim.workload.requests import Requests
from disaggsim.workload.traces import read_trace

__all__ = [
    "PRESET_NAMES",
    "PresetWorkload",
    "Requests",
    "SessionWorkload",
    "SyntheticWorkload",
    "TraceWorkload",
    "WorkloadConfig",
    "generate_requests",
    "read_trace",
]
