"""Upper bounds on every size a scenario or a command can set.

Each bound keeps one run's memory and time sane on one machine (docs/safety.md has the
table, with the reasons). They are checked where the input is read, so a value beyond
one is a one-line error naming the field and the bound, never a hang or an allocation
failure halfway through. Times are finite by the same rule (``allow_inf_nan=False`` on
every config model).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    from disaggsim.workload.config import WorkloadConfig

MAX_WORKERS_PER_POOL = 1024
"""Workers one pool may hold, initially or by autoscaling (``max_workers``)."""
MAX_TP = 64
"""GPUs per worker (tensor-parallel degree)."""
MAX_DP = 1024
"""Attention data-parallel ranks per worker (an MoE EP unit: DeepSeek's decode unit has
144); a worker holds at most ``MAX_TP × MAX_DP`` GPUs and the scenario ``MAX_GPUS``."""
MAX_GPUS = 16384
"""GPUs of the whole scenario, autoscaled pools counted at ``max_workers``."""
MAX_GPUS_PER_NODE = 64
MAX_NODES = 16384
MAX_BATCH_SEQS = 16384
"""Sequences in one batch."""
MAX_BATCH_TOKENS = 1_048_576
"""Tokens in one prefill iteration."""
MAX_TOKENS = 1_048_576
"""Prompt or output tokens of one request (every length distribution, trace cell and
``cost`` token count)."""
MAX_REQUESTS = 2_000_000
"""Requests of one run: the expected arrivals (rate × duration) and a trace's rows."""
MAX_SERVICE_MULTIPLE = 1000.0
"""``--service-multiple`` of compare and plan: a goodput run's window lasts at most this
many longest service times (the default is 10; ``1e300`` passed and shrank every run to
the MAX_REQUESTS one run may hold). ``--min-requests`` is at most MAX_REQUESTS."""
MAX_DURATION_S = 30 * 86400.0
"""Simulated seconds: ``sim.duration_s`` and ``sim.max_drain_s`` (30 days each)."""
MAX_EVENTS = 1_000_000
"""Scheduled control events of one run: random worker failures expected over the run,
autoscaler decisions (horizon / interval_s), link failure windows."""
MAX_PREFILL_ITERATIONS = 1e9
"""Chunked prefill iterations one run needs at least (expected requests × mean prompt
tokens / ``max_batch_tokens`` of a colocated chunked pool). Each iteration is a step of
the simulation: 15,625 of them (10 prompts of 100,000 tokens in 64-token chunks) took
0.61 s of ``simulate`` on this project's shared 2-core machine, about 25,000 a second, so
the bound is some 11 hours; a realistic run (2,000,000 requests of 128k-token prompts in
8,192-token chunks: 3.1e7) stays 30 times below it. The requests bound alone does not
bound the work: 2,000,000 prompts of 1,048,576 tokens in 16-token chunks are 1.3e11
iterations (two months)."""
MAX_BURSTINESS_CV = 100.0
"""Coefficient of variation of gamma inter-arrival gaps (real traces: 1-13)."""
MAX_TOOL_CALLS = 1000
"""Agent tool calls per user turn (mean and cap) of a sessions workload."""
MAX_GRID_POINTS = 10_000
"""Simulations of one sweep or comparison: grid points × seeds."""
MAX_SEEDS = 1000
MAX_SCENARIO_BYTES = 4 * 2**20
"""Size of a scenario YAML file."""
MAX_YAML_DEPTH = 64
"""Nesting of a scenario YAML file."""
MAX_YAML_NODES = 1_000_000
"""Values in a scenario after YAML aliases are expanded."""
MAX_SEED = 2**63 - 1 - MAX_SEEDS
MAX_NUMBER = 1e15
"""Largest magnitude of any real number in a scenario, in its own unit (s, ms, us,
GB/s, req/s, ...): far beyond any physical value, and small enough that sums of a few
never overflow to inf."""
LOGNORMAL_TAIL_SIGMAS = 6.0
"""A lognormal without ``max`` must keep ``median · exp(6 sigma)`` within MAX_TOKENS."""


def fmt(n: float) -> str:
    """A bound for a message: ``1,048,576``."""
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:g}"


def expected_requests(workload: WorkloadConfig, duration_s: float) -> float:
    """Requests a synthetic, preset or sessions workload is expected to generate in
    ``duration_s`` (its rate integrated over the window, times the mean requests per
    session, capped by ``num_requests``); 0 for a trace, whose rows are counted when it is
    read (every kind's actual count is checked again once generated)."""
    from disaggsim.workload.config import PresetWorkload, SessionWorkload, SyntheticWorkload
    from disaggsim.workload.generate import synthetic_schedule
    from disaggsim.workload.presets import load_preset

    if isinstance(workload, SyntheticWorkload):
        n = synthetic_schedule(workload).cumulative(duration_s)
    elif isinstance(workload, SessionWorkload):
        # session starts × mean turns × (the answer + mean tool calls) per turn
        calls = workload.agent.tool_calls_mean if workload.agent is not None else 0.0
        if workload.agent is not None and workload.agent.max_tool_calls is not None:
            calls = min(calls, workload.agent.max_tool_calls)
        starts = synthetic_schedule(workload).cumulative(duration_s)
        n = starts * mean_length(workload.turns) * (1.0 + calls)
    elif isinstance(workload, PresetWorkload):
        rate = workload.rate_per_s or load_preset(workload.preset).mean_rate_per_s
        n = rate * duration_s
    else:
        return 0.0
    if workload.num_requests is not None:
        n = min(n, workload.num_requests)
    return n if math.isfinite(n) else math.inf


class ConfigModel(BaseModel):
    """Base of every scenario config model (the scenario, its pools, fabric, workload,
    autoscale, cache and MoE sections): frozen, unknown keys refused, every number
    finite (``.inf``/``.nan`` are one-line errors naming the field) and within
    :data:`MAX_NUMBER` (:func:`check_magnitudes`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="after")
    def _numbers_in_range(self) -> ConfigModel:
        check_magnitudes(self)
        return self


def check_magnitudes(model: object) -> None:
    """Every float field of a config model (tuples of floats included) within
    :data:`MAX_NUMBER`; called by each config model's base class after validation."""
    for name in type(model).model_fields:  # type: ignore[attr-defined]
        value = getattr(model, name)
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, tuple):
                stack.extend(v)
            elif isinstance(v, float) and abs(v) > MAX_NUMBER:
                raise ValueError(
                    f"{name}: {v:g} is beyond {MAX_NUMBER:g}, the largest number a scenario "
                    "may hold (docs/safety.md)"
                )


def mean_length(dist: object) -> float:
    """The mean of a length distribution (lognormal: of the unclipped distribution,
    capped at its max; empirical: of its piecewise-linear inverse CDF)."""
    from disaggsim.workload.config import (
        EmpiricalLengths,
        FixedLengths,
        LognormalLengths,
        UniformLengths,
    )

    match dist:
        case FixedLengths(value=v):
            return float(v)
        case UniformLengths(low=lo, high=hi):
            return (lo + hi) / 2.0
        case LognormalLengths(median=m, sigma=s, max=hi):
            mean = m * math.exp(min(s * s / 2.0, 700.0))
            return min(mean, hi) if hi is not None else mean
        case EmpiricalLengths(quantiles=points):
            return sum(
                (q1 - q0) * (v0 + v1) / 2.0
                for (q0, v0), (q1, v1) in zip(points, points[1:], strict=False)
            )
    return 1.0


MAX_WORKERS_PER_CPU = 4
"""Local sweep worker processes (``--workers``) per CPU of the machine: each is a Python
process holding the simulator (about 130 MB at rest, 160 MB running a small scenario,
measured with ``/usr/bin/time -v``), started as tasks are sent, so ``--workers 100000``
on a sweep of 10,000 points would start 10,000 of them (over 1 TB)."""


def max_local_workers() -> int:
    """:data:`MAX_WORKERS_PER_CPU` times this machine's CPU count."""
    import os

    return MAX_WORKERS_PER_CPU * (os.cpu_count() or 1)
