"""disaggsim: discrete-event simulation of disaggregated vs colocated LLM serving.

The public API (``__all__``)::

    from disaggsim import load_scenario, simulate, sweep

    res = simulate(load_scenario("scenarios/quickstart.yaml"), ["workload.rate_per_s=25"])
    res.summary.ttft_p99_s, res.requests  # a Summary; one row per request
    table = sweep("scenarios/quickstart.yaml", {"workload.rate_per_s": [10, 20, 30]})

Scenarios: :func:`load_scenario` (YAML path or mapping, ``--set``-style overrides) gives
a :class:`LoadedScenario`. One run: :func:`simulate` → :class:`SimulationResult` (its
``summary`` is a :class:`Summary`, docs/metrics.md), :func:`write_results` writes its
result folder. Many runs: :func:`sweep`, :func:`goodput` (→ :class:`GoodputResult`) and
:func:`compare` (→ :class:`CompareResult`), on a :class:`SerialExecutor`,
:class:`ProcessExecutor` or :class:`DaskExecutor` (docs/sweeps.md). Bad input raises
:class:`UserError` with a one-line message. The planner is :func:`disaggsim.plan.plan`
(docs/planning.md); everything else is reached through its module.

Note that ``disaggsim.sweep`` is the :func:`sweep` function: import the sweep package's
other names with ``from disaggsim.sweep import ...``.
"""

import importlib.metadata as _metadata

from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.config.scenario import Scenario
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import Summary
from disaggsim.run import SimulationResult, simulate, write_results
from disaggsim.sweep import (
    DaskExecutor,
    GoodputResult,
    ProcessExecutor,
    SerialExecutor,
    goodput,
    sweep,
)
from disaggsim.sweep.compare import CompareResult, compare

try:
    __version__ = _metadata.version("disaggsim")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CompareResult",
    "DaskExecutor",
    "GoodputResult",
    "LoadedScenario",
    "ProcessExecutor",
    "Scenario",
    "SerialExecutor",
    "SimulationResult",
    "Summary",
    "UserError",
    "__version__",
    "compare",
    "goodput",
    "load_scenario",
    "simulate",
    "sweep",
    "write_results",
]
