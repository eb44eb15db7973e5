"""Sweeps and goodput: many simulations of one scenario, as one tidy table.

:func:`sweep` runs every grid point × seed and returns one row each; :func:`goodput`
finds, by bisection over ``workload.rate_per_s``, the highest rate at which the share of
requests meeting both SLOs reaches ``slo.attainment_target`` (DistServe's goodput).

Seeds: seed index ``k`` of a point runs the scenario with ``seed = scenario.seed + k``
(so ``k = 0`` is exactly ``disaggsim run`` of that point). Tasks sent to workers are
plain data (the resolved scenario mapping and its base folder); the worker validates it,
runs :func:`disaggsim.run.simulate` and returns its :class:`~disaggsim.metrics.summary_table.Summary`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from disaggsim.config.bounds import MAX_SEEDS
from disaggsim.config.loader import LoadedScenario, apply_overrides, load_scenario
from disaggsim.config.scenario import Scenario
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import Summary, nondeterministic_keys
from disaggsim.sweep.executors import Executor, default_executor
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


def run_point(task: PointTask) -> Summary:
    """Worker side: validate, simulate, return the summary without the keys that differ
    between identical runs."""
    from disaggsim.run import simulate

    loaded = load_scenario(task.raw, base_dir=Path(task.base_dir))
    return simulate(loaded).summary.deterministic()


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


def _task(src: Source, overrides: list[str]) -> PointTask:
    """Resolve and validate one point here, so a bad value fails before any work starts
    (with the file's name), and the worker receives a mapping that is known to load."""
    raw = apply_overrides(src.raw, overrides, src.label)
    try:
        loaded = load_scenario(raw, base_dir=src.base_dir)
    except UserError as e:
        raise UserError(str(e).replace("<scenario>", src.label, 1)) from None
    raw = dict(loaded.raw)
    _check_runnable(loaded, src.label)
    return PointTask(raw=raw, base_dir=str(src.base_dir))


def _check_runnable(loaded: LoadedScenario, label: str) -> None:
    from disaggsim.run import build_costs, build_transfer

    try:
        build_costs(loaded.scenario, label)
        build_transfer(loaded.scenario, label)
    except UserError as e:
        raise UserError(str(e).replace("<scenario>", label, 1)) from None


def _check_seeds(seeds: int) -> None:
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_SEEDS:
        raise UserError(f"--seeds {seeds}: must be an integer from 1 to {MAX_SEEDS:,}")


def sweep_tasks(
    src: Source, params: Sequence[Param], seeds: int
) -> tuple[list[dict], list[PointTask]]:
    """(row keys, tasks) for every point × seed, in grid order, seeds innermost."""
    _check_seeds(seeds)
    check_grid_size(params, seeds)
    check_params(params, src.raw, src.label)
    keys, tasks = [], []
    for point in expand_grid(params):
        base = point_overrides(point)
        for k in range(seeds):
            try:
                tasks.append(_task(src, base + [override_text("seed", src.seed + k)]))
            except UserError as e:
                where = " ".join(f"{p}={v}" for p, v in point.items())
                raise UserError(f"{e} (at sweep point {where})" if where else str(e)) from None
            keys.append({**point, SEED_INDEX: k})
    return keys, tasks


def run_tasks(
    tasks: Sequence[PointTask], executor: Executor | None, progress: ProgressFn | None
) -> list[Summary]:
    total = len(tasks)
    done = [0]

    def on_done() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    if progress is not None:
        progress(0, total)
    if executor is not None:
        return executor.map(run_point, tasks, on_done)
    with default_executor(total) as ex:
        return ex.map(run_point, tasks, on_done)


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
    src = as_source(scenario, overrides)
    keys, tasks = sweep_tasks(src, params_from_mapping(params), seeds)
    return table(keys, run_tasks(tasks, executor, progress))


# ------------------------------------------------------------------ goodput


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """Goodput of one scenario.

    ``rate_per_s`` is the highest evaluated rate whose (seed-mean) SLO attainment met
    the target; the bisection stopped with a failing rate at most ``tol_per_s`` above it
    (``status == "found"``). ``status == "above_range"``: even ``rate_hi`` met the target,
    so the goodput is at least ``rate_per_s = rate_hi``. ``status == "below_range"``:
    ``rate_lo`` already missed it; ``rate_per_s`` is NaN (goodput < ``rate_lo``).
    """

    scenario: str
    num_gpus: int
    rate_per_s: float
    per_gpu_per_s: float
    status: str  # "found" | "above_range" | "below_range"
    attainment_target: float
    tol_per_s: float
    evaluations: tuple[tuple[float, float], ...]  # (rate_per_s, attainment), in order


class Bisection:
    """The bisection over rate as a small state machine, so several scenarios can be
    advanced in lock-step (one executor round per step) and a pure function of rate
    can drive it in tests.

    Assumes attainment is non-increasing in rate. Where noise breaks that near the
    threshold, the result is still a rate that met the target next to one, at most
    ``tol_per_s`` above, that did not. NaN attainment (no measured request) counts as
    a miss."""

    def __init__(self, rate_lo: float, rate_hi: float, target: float, tol_per_s: float) -> None:
        if not (0 < rate_lo < rate_hi) or not math.isfinite(rate_hi):
            raise UserError(f"goodput: need 0 < rate_lo < rate_hi, got {rate_lo} and {rate_hi}")
        if not tol_per_s > 0:
            raise UserError(f"goodput: tolerance must be > 0 req/s, got {tol_per_s}")
        self.lo, self.hi = float(rate_lo), float(rate_hi)
        self.target = target
        self.tol = float(tol_per_s)
        self.evaluations: list[tuple[float, float]] = []
        self.status: str | None = None
        self._bracketed = False  # the ends have been evaluated

    def ok(self, attainment: float) -> bool:
        return bool(attainment >= self.target)  # NaN → False

    def next_rates(self) -> list[float]:
        if self.status is not None:
            return []
        if not self._bracketed:
            return [self.lo, self.hi]
        return [0.5 * (self.lo + self.hi)]

    def record(self, results: Sequence[tuple[float, float]]) -> None:
        """Results for exactly the rates :meth:`next_rates` returned, in that order."""
        self.evaluations.extend(results)
        if not self._bracketed:
            self._bracketed = True
            (_, a_lo), (hi, a_hi) = results
            if not self.ok(a_lo):
                self.status = "below_range"
            elif self.ok(a_hi):
                self.status = "above_range"
                self.lo = hi
        else:
            ((mid, a_mid),) = results
            if self.ok(a_mid):
                self.lo = mid
            else:
                self.hi = mid
        if self.status is None and self.hi - self.lo <= self.tol:
            self.status = "found"

    @property
    def rate_per_s(self) -> float:
        return float("nan") if self.status == "below_range" else self.lo


def bisect_rate(
    attainment: Callable[[float], float],
    rate_lo: float,
    rate_hi: float,
    target: float,
    tol_per_s: float,
) -> Bisection:
    """Run :class:`Bisection` against a function of rate (tests, analytic models)."""
    b = Bisection(rate_lo, rate_hi, target, tol_per_s)
    while rates := b.next_rates():
        b.record([(r, attainment(r)) for r in rates])
    return b


def goodput_many(
    scenarios: Sequence[Source],
    rate_lo: float,
    rate_hi: float,
    *,
    tol_per_s: float | None = None,
    seeds: int = 1,
    executor: Executor | None = None,
    progress: ProgressFn | None = None,
) -> list[GoodputResult]:
    """Goodput of several scenarios, bisected in lock-step: each round sends every
    scenario's next rate × seeds to the executor at once."""
    _check_seeds(seeds)
    tol = 0.01 * rate_hi if tol_per_s is None else tol_per_s
    searches = [Bisection(rate_lo, rate_hi, s.attainment_target, tol) for s in scenarios]
    rounds = 1 + max(1, math.ceil(math.log2(max((rate_hi - rate_lo) / tol, 1.0))))
    for src in scenarios:
        check_params([Param(RATE_PATH, (rate_lo,))], src.raw, src.label)
    own = executor is None
    # the first round sends both ends of every search
    ex = executor if executor is not None else default_executor(2 * len(scenarios) * seeds)
    done_tasks, total_est = 0, rounds * len(scenarios) * seeds + len(scenarios) * seeds
    try:
        while True:
            batch: list[tuple[int, float]] = []
            tasks: list[PointTask] = []
            for i, (src, b) in enumerate(zip(scenarios, searches, strict=True)):
                for rate in b.next_rates():
                    batch.append((i, rate))
                    for k in range(seeds):
                        tasks.append(
                            _task(
                                src,
                                [
                                    override_text(RATE_PATH, rate),
                                    override_text("seed", src.seed + k),
                                ],
                            )
                        )
            if not tasks:
                break

            def on_done() -> None:
                nonlocal done_tasks
                done_tasks += 1
                if progress is not None:
                    progress(done_tasks, max(total_est, done_tasks))

            summaries = ex.map(run_point, tasks, on_done)
            per_search: dict[int, list[tuple[float, float]]] = {}
            for j, (i, rate) in enumerate(batch):
                att = [s.slo_attainment for s in summaries[j * seeds : (j + 1) * seeds]]
                mean = sum(att) / len(att)
                per_search.setdefault(i, []).append((rate, mean))
            for i, results in per_search.items():
                searches[i].record(results)
    finally:
        if own:
            ex.close()
    out = []
    for src, b in zip(scenarios, searches, strict=True):
        rate = b.rate_per_s
        out.append(
            GoodputResult(
                scenario=src.name,
                num_gpus=src.num_gpus,
                rate_per_s=rate,
                per_gpu_per_s=rate / src.num_gpus,
                status=str(b.status),
                attainment_target=src.attainment_target,
                tol_per_s=tol,
                evaluations=tuple(b.evaluations),
            )
        )
    return out


def goodput(
    scenario: LoadedScenario | Scenario | str | Path | dict,
    rate_lo: float,
    rate_hi: float,
    *,
    tol_per_s: float | None = None,
    seeds: int = 1,
    executor: Executor | None = None,
    overrides: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
) -> GoodputResult:
    """Highest ``workload.rate_per_s`` in ``[rate_lo, rate_hi]`` with SLO attainment
    (mean over ``seeds``) >= ``slo.attainment_target``, by bisection to ``tol_per_s``
    (default 1 % of ``rate_hi``); per GPU = rate / the scenario's GPU count.
    See :class:`Bisection` for the monotonicity assumption."""
    src = as_source(scenario, overrides)
    return goodput_many(
        [src],
        rate_lo,
        rate_hi,
        tol_per_s=tol_per_s,
        seeds=seeds,
        executor=executor,
        progress=progress,
    )[0]
