"""Sweeps over scenario parameters, steady-state goodput, and the executors that run them.

Python API (notebooks)::

    from disaggsim.sweep import sweep, goodput, SerialExecutor
    df = sweep("scenarios/seed-70b-4k/chunked.yaml", {"workload.rate_per_s": [1, 2, 3]}, seeds=2)
    g = goodput("scenarios/seed-70b-4k/chunked.yaml", 0.5, 8.0)

Definitions and the CLI (``disaggsim sweep`` / ``compare``): docs/sweeps.md.
"""

from disaggsim.metrics.steady import RunLengthRule
from disaggsim.sweep.core import PointTask, run_point, sweep
from disaggsim.sweep.executors import (
    DaskExecutor,
    Executor,
    ProcessExecutor,
    SerialExecutor,
    make_executor,
)
from disaggsim.sweep.goodput import (
    Evaluation,
    GoodputResult,
    RateSearch,
    goodput,
    goodput_many,
    search_rate,
)
from disaggsim.sweep.grid import Param, expand_grid, parse_param, parse_params

__all__ = [
    "DaskExecutor",
    "Evaluation",
    "Executor",
    "GoodputResult",
    "Param",
    "PointTask",
    "ProcessExecutor",
    "RateSearch",
    "RunLengthRule",
    "SerialExecutor",
    "expand_grid",
    "goodput",
    "goodput_many",
    "make_executor",
    "parse_param",
    "parse_params",
    "run_point",
    "search_rate",
    "sweep",
]
