"""Sweeps: many simulations of one scenario, as one tidy table.

:func:`sweep` runs every grid point × seed and returns one row each (the run's summary,
with its attainment and steady-state columns, docs/metrics.md); the goodput search over
rate lives in :mod:`disaggsim.sweep.goodput`.

Seeds: seed index ``k`` of a point runs the scenario with ``seed = scenario.seed + k``
(so ``k = 0`` is exactly ``disaggsim run`` of that point). Tasks sent to workers are
plain data (the resolved scenario mapping and its base folder); the worker validates it,
runs :func:`disaggsim.run.simulate` and returns its :class:`~disaggsim.metrics.summary_table.Summary`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from disaggsim.config.bounds import MAX_SEEDS
from disaggsim.config.loader import LoadedScenario, apply_overrides, load_scenario
from disaggsim.config.scenario import Scenario
from disaggsim.errors import InvariantError, UserError, check_callable, given
from disaggsim.metrics.summary_table import Summary, nondeterministic_keys
from disaggsim.sweep.executors import Executor, check_executor, given_or_default
from disaggsim.sweep.grid import (
    Param,
    check_grid_size,
    check_params,
    expand_grid,
    override_text,
    params_from_mapping,
    point_overrides,
)

RATE_PATH = "workload.rate_per_s"
SEED_INDEX = "seed_index"
# Summary keys left out of tables: they differ between identical runs.
NONDETERMINISTIC_KEYS = nondeterministic_keys()

ProgressFn = Callable[[int, int], None]  # (tasks done, tasks total)


@dataclass(frozen=True, slots=True)
class PointTask:
    """One simulation, as plain data a worker process can unpickle."""

    raw: dict  # the resolved scenario mapping (overrides applied)
    base_dir: str  # relative paths in the scenario resolve against this
    # end the run once it certainly misses the SLO (simulate's stop_on_certain_miss and
    # stop_below_attainment)
    stop_on_certain_miss: bool = False
    stop_below_attainment: float | None = None
    # which run this is, for an error raised while it runs (``workload.rate_per_s=4
    # seed_index=1`` of a sweep); not part of what the run computes
    label: str = ""


def run_point(task: PointTask) -> Summary:
    """Worker side: validate, simulate, return the summary without the keys that differ
    between identical runs (a task with ``stop_on_certain_miss``: a run that certainly
    misses ends early and its summary says so, ``stopped_early_at_s``).

    Bad input (:class:`UserError`, such as a trace file the worker cannot read) and a
    broken run invariant come back as they are; any other exception is a bug in
    disaggsim, raised as one :class:`InvariantError` line naming the run, the exception
    and where it was raised (a Dask worker's exception came back as a traceback, with
    nothing saying which run raised it)."""
    from disaggsim.hardware.profile import ProfileError
    from disaggsim.run import simulate

    try:
        loaded = load_scenario(task.raw, base_dir=Path(task.base_dir))
        res = simulate(
            loaded,
            stop_on_certain_miss=task.stop_on_certain_miss,
            stop_below_attainment=task.stop_below_attainment,
        )
    except (UserError, InvariantError, ProfileError, OSError, MemoryError):
        raise  # bad input, a broken invariant, a file or the machine: as they are
    except Exception as e:
        raise InvariantError(_raised_in_run(task, e)) from e
    return res.summary.deterministic()


def _raised_in_run(task: PointTask, e: Exception) -> str:
    """``run workload.rate_per_s=4 seed_index=1: ZeroDivisionError: division by zero (at
    disaggsim/engine/x.py:120, in a sweep worker)``: the run, the exception and the
    innermost line of the traceback."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    at = ""
    if frames:
        f = frames[-1]
        parts = Path(f.filename).parts
        short = "/".join(parts[parts.index("disaggsim") :]) if "disaggsim" in parts else f.filename
        at = f" at {short}:{f.lineno}"
    what = " ".join(str(e).split())[:200]
    run = f"run {task.label}" if task.label else "a run"
    return (
        f"{run}: {type(e).__name__}{': ' + what if what else ''} ({'raised' + at}, in a sweep task)"
    )


@dataclass(frozen=True, slots=True)
class Source:
    """A scenario to sweep: its mapping, base folder and the label used in errors."""

    raw: dict
    base_dir: Path
    label: str
    seed: int
    num_gpus: int
    name: str
    architecture: str  # as in the summary: disaggregated, colocated-vllm, colocated-chunked
    attainment_target: float


def source_of(loaded: LoadedScenario, label: str) -> Source:
    """The picklable description of a loaded scenario that executors ship to workers."""
    s = loaded.scenario
    arch = s.architecture + (f"-{s.pool.scheduler}" if s.pool is not None else "")
    return Source(
        raw=loaded.raw,
        base_dir=loaded.base_dir,
        label=label,
        seed=s.seed,
        num_gpus=s.num_gpus,
        name=s.name,
        architecture=arch,
        attainment_target=s.slo.attainment_target,
    )


def fixed_time_events(scenario: Scenario) -> list[tuple[str, float]]:
    """The parts of ``scenario`` timed at a fixed simulated second, as ``(field path,
    time_s)``: worker failures (``at_s``), link failures (``start_s``) and a workload mix
    shift (``at_s``)."""
    events = [
        (f"failures.workers.{i}.at_s", f.at_s) for i, f in enumerate(scenario.failures.workers)
    ]
    events += [
        (f"failures.links.{i}.start_s", w.start_s) for i, w in enumerate(scenario.failures.links)
    ]
    shift = getattr(scenario.workload, "mix_shift", None)
    if shift is not None:
        events.append(("workload.mix_shift.at_s", shift.at_s))
    return events


def refuse_fixed_time_events(scenario: Scenario, label: str) -> None:
    """A goodput search sets each run's length from its rate (docs/metrics.md, "Run
    length"), so an event at a fixed time would fall inside some of its runs, in the
    warm-up of others and after the end of the rest, and the goodput would depend on
    where: a :class:`UserError` naming the first such field, before any run."""
    events = fixed_time_events(scenario)
    if not events:
        return
    path, at_s = events[0]
    more = f" (and {len(events) - 1} more)" if len(events) > 1 else ""
    fix = (
        "drop workload.mix_shift"
        if path.startswith("workload.")
        else "give failures as a rate (failures.random: pool, mtbf_s, mttr_s)"
    )
    raise UserError(
        f"{label}: {path} = {at_s:g} s{more}: a goodput search sets each run's length from "
        "its rate, so an event at a fixed time falls inside some runs and after others; "
        f"{fix}, or run fixed rates at the scenario's own length with disaggsim sweep "
        f"--param {RATE_PATH}=a:b:n"
    )


def with_overrides(src: Source, overrides: Sequence[str]) -> Source:
    """The same scenario (same label and base folder) with more ``--set`` overrides."""
    raw = apply_overrides(src.raw, list(overrides), src.label)
    try:
        loaded = load_scenario(raw, base_dir=src.base_dir)
    except UserError as e:
        raise UserError(str(e).replace("<scenario>", src.label, 1)) from None
    return source_of(loaded, src.label)


def as_source(
    scenario: LoadedScenario | Scenario | str | Path | dict, overrides: Sequence[str] | None = None
) -> Source:
    if isinstance(scenario, LoadedScenario):
        loaded = load_scenario(scenario.raw, list(overrides or []), base_dir=scenario.base_dir)
        label = str(scenario.path) if scenario.path else "<scenario>"
    elif isinstance(scenario, Scenario):
        loaded = load_scenario(scenario.model_dump(mode="json"), list(overrides or []))
        label = "<scenario>"
    else:
        loaded = load_scenario(scenario, list(overrides or []))
        label = str(loaded.path) if loaded.path else "<scenario>"
    return source_of(loaded, label)


def _task(
    src: Source,
    overrides: list[str],
    stop_on_certain_miss: bool = False,
    stop_below_attainment: float | None = None,
    check_runnable: bool = True,
    label: str = "",
) -> PointTask:
    """Resolve and validate one point here, so a bad value fails before any work starts
    (with the file's name), and the worker receives a mapping that is known to load
    (``stop_on_certain_miss``, ``stop_below_attainment``: :class:`PointTask`).
    ``check_runnable=False`` skips building the cost models, link and topology
    (:func:`_check_runnable`): for a caller that checked them on the same scenario with
    other rates, seeds and run lengths, which none of them reads."""
    raw = apply_overrides(src.raw, overrides, src.label)
    try:
        loaded = load_scenario(raw, base_dir=src.base_dir)
    except UserError as e:
        raise UserError(str(e).replace("<scenario>", src.label, 1)) from None
    raw = dict(loaded.raw)
    if check_runnable:
        _check_runnable(loaded, src.label)
    return PointTask(
        raw=raw,
        base_dir=str(src.base_dir),
        stop_on_certain_miss=stop_on_certain_miss,
        stop_below_attainment=stop_below_attainment,
        label=label,
    )


def _check_runnable(loaded: LoadedScenario, label: str) -> None:
    """Everything :func:`disaggsim.run.simulate` builds before its first event that can
    refuse the scenario: cost models, the link and the topology (a TP group larger than a
    node on a ``kind: topology`` fabric fails here, before any point runs)."""
    from disaggsim.run import build_costs, build_topology, build_transfer

    try:
        build_costs(loaded.scenario, label)
        build_transfer(loaded.scenario, label)
        build_topology(loaded.scenario, label)
    except UserError as e:
        raise UserError(str(e).replace("<scenario>", label, 1)) from None


def check_seeds(seeds: int) -> None:
    """``seeds`` (per point, per goodput search) an integer from 1 to MAX_SEEDS; the error
    names ``--seeds`` on the command line, ``seeds=`` in the API."""
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_SEEDS:
        where = given("--seeds", "seeds", seeds)
        raise UserError(f"{where}: must be an integer from 1 to {MAX_SEEDS:,}")


def sweep_tasks(
    src: Source, params: Sequence[Param], seeds: int
) -> tuple[list[dict], list[PointTask]]:
    """(row keys, tasks) for every point × seed, in grid order, seeds innermost."""
    check_seeds(seeds)
    check_grid_size(params, seeds)
    check_params(params, src.raw, src.label)
    keys, tasks = [], []
    for point in expand_grid(params):
        base = point_overrides(point)
        where = " ".join(f"{p}={v}" for p, v in point.items())
        for k in range(seeds):
            label = f"{where} {SEED_INDEX}={k}".strip()
            try:
                tasks.append(_task(src, base + [override_text("seed", src.seed + k)], label=label))
            except UserError as e:
                raise UserError(f"{e} (at sweep point {where})" if where else str(e)) from None
            keys.append({**point, SEED_INDEX: k})
    return keys, tasks


def run_tasks(
    tasks: Sequence[PointTask],
    executor: Executor | None,
    progress: ProgressFn | None,
    *,
    done: Mapping[int, Summary] | None = None,
    on_result: Callable[[int, Summary], None] | None = None,
) -> list[Summary]:
    """Every task's summary, in task order. ``done``: summaries already at hand (task
    index -> summary; a resumed sweep's kept runs), not run again. ``on_result(index,
    summary)``: called as each task finishes, before the next is handled (a sweep's
    journal); it needs one of disaggsim's executors (Serial, Process, Dask)."""
    done = done or {}
    todo = [i for i in range(len(tasks)) if i not in done]
    total = len(tasks)
    count = [len(done)]

    def on_done() -> None:
        count[0] += 1
        if progress is not None:
            progress(count[0], total)

    def each(k: int, summary: Summary) -> None:
        if on_result is not None:
            on_result(todo[k], summary)

    if progress is not None:
        progress(count[0], total)
    sent = [tasks[i] for i in todo]
    if not sent:
        ran: list[Summary] = []
    else:
        with given_or_default(executor, len(sent)) as ex:
            ran = _map(ex, sent, on_done, each if on_result is not None else None)
    out = dict(done)
    out.update(zip(todo, ran, strict=True))
    return [out[i] for i in range(total)]


def _map(
    ex: Executor,
    tasks: list[PointTask],
    on_done: Callable[[], None],
    on_result: Callable[[int, Summary], None] | None,
) -> list[Summary]:
    if on_result is None:
        return ex.map(run_point, tasks, on_done)
    return ex.map(run_point, tasks, on_done, on_result=on_result)  # type: ignore[call-arg]


def table(keys: list[dict], summaries: Sequence[Summary]) -> pd.DataFrame:
    """Rows = swept values + ``seed_index`` + every summary key (``seed`` included)."""
    rows = [{**k, **s.to_dict()} for k, s in zip(keys, summaries, strict=True)]
    return pd.DataFrame.from_records(rows)


def sweep(
    scenario: LoadedScenario | Scenario | str | Path | dict,
    params: Mapping[str, Sequence[Any]] | None = None,
    seeds: int = 1,
    executor: Executor | None = None,
    *,
    overrides: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Simulate every combination of ``params`` (dot path → values) ``seeds`` times.

    Returns one row per point × seed, in grid order (first parameter slowest, seed
    index fastest): one column per swept path (named by the path), ``seed_index``
    (k), then every summary key of :func:`disaggsim.run.simulate` except ``wall_s``;
    ``seed`` is the seed that ran (scenario seed + k). ``executor=None`` runs up to
    four tasks in this process and more in a local pool of ``min(2, cpu count)`` worker
    processes (:func:`~disaggsim.sweep.executors.default_executor`).
    """
    check_executor(executor)
    check_callable("progress", progress)
    src = as_source(scenario, overrides)
    keys, tasks = sweep_tasks(src, params_from_mapping(params), seeds)
    return table(keys, run_tasks(tasks, executor, progress))
