"""Several scenarios (architectures) on the same axes: one sweep table and goodput per
GPU for each, optionally at the same total GPU count."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from disaggsim.config.bounds import MAX_NUMBER
from disaggsim.config.loader import load_scenario, plain_number
from disaggsim.errors import (
    UserError,
    check_callable,
    check_switch,
    command_line_running,
    given,
)
from disaggsim.metrics.steady import RunLengthRule
from disaggsim.sweep.core import (
    RATE_PATH,
    ProgressFn,
    Source,
    as_source,
    refuse_fixed_time_events,
    run_tasks,
    sweep_tasks,
    table,
    with_overrides,
)
from disaggsim.sweep.executors import Executor, check_executor, given_or_default
from disaggsim.sweep.goodput import SEED_SPREAD, GoodputResult, check_rule, goodput_many
from disaggsim.sweep.grid import (
    Param,
    check_grid_size,
    expand_grid,
    params_from_mapping,
    point_overrides,
)

SCENARIO_FILE = "scenario_file"
GOODPUT_COLUMNS = (
    SCENARIO_FILE,
    "scenario",
    "architecture",
    "num_gpus",
    "goodput_per_s",
    "goodput_per_gpu_per_s",
    "ratio_to_best",
    "status",
    "confirmed",
    "confirm_rate_per_s",
    "confirm_attainment",
    "confirm_duration_s",
    "search_duration_s",
    "unattainable_below_per_s",
    "attainment_target",
    "tol_per_s",
    "num_runs",
    "num_stopped_early",
    "confirm_stopped_early",
    "num_shortened",
)


@dataclass(frozen=True, slots=True)
class CompareResult:
    table: pd.DataFrame  # scenario_file + the sweep table of each scenario, stacked
    goodput: pd.DataFrame  # one row per scenario: GOODPUT_COLUMNS
    results: tuple[GoodputResult, ...]


def check_same_gpus(sources: Sequence[Source]) -> None:
    """Every scenario must have the first one's total GPU count (error names the file)."""
    first = sources[0]
    for s in sources[1:]:
        if s.num_gpus != first.num_gpus:
            raise UserError(
                f"{s.label}: {s.num_gpus} GPUs in total but {first.label} has {first.num_gpus} "
                "(--same-gpus: change the pool sizes so the totals match)"
            )


def rate_range(
    params: Sequence[Param], rate_lo: float | None, rate_hi: float | None
) -> tuple[float, float]:
    """Starting goodput bracket: given, else the min and max of a swept
    ``workload.rate_per_s`` (the search widens it until it brackets the goodput)."""
    swept = [p for p in params if p.path == RATE_PATH]
    lo_from, hi_from = "--rate-lo", "--rate-hi"
    if rate_lo is None or rate_hi is None:
        if not swept:
            raise UserError(
                f"compare: give --rate-lo and --rate-hi, or sweep --param {RATE_PATH}=a:b:n"
            )
        for v in swept[0].values:
            # a word, a null or NaN among the swept rates was a ValueError or TypeError
            # traceback, or left out of the bracket as if not given
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                where = given("--param", "params key {}", RATE_PATH)
                raise UserError(
                    f"{where}: {'null' if v is None else repr(v)} is not a finite number of "
                    "requests per second (the goodput search starts from the lowest and "
                    "highest swept rates)"
                )
        values = [float(v) for v in swept[0].values]
        if rate_lo is None:
            rate_lo, lo_from = min(values), f"the lowest swept {RATE_PATH}"
        if rate_hi is None:
            rate_hi, hi_from = max(values), f"the highest swept {RATE_PATH}"
    if not (0 < rate_lo < rate_hi and math.isfinite(rate_hi)):
        raise UserError(
            f"compare: {lo_from} {rate_lo:g} and {hi_from} {rate_hi:g}: the goodput search "
            "starts from this bracket and needs 0 < low < high, both finite "
            "(give --rate-lo and --rate-hi)"
        )
    if rate_hi > MAX_NUMBER:  # checked before the comparison's first runs, not after them
        raise UserError(
            f"compare: {hi_from} {rate_hi:g}: at most {MAX_NUMBER:g} req/s, the largest "
            "number a scenario may hold (docs/safety.md)"
        )
    return float(rate_lo), float(rate_hi)


def compare(
    scenarios: Sequence[str | Path | dict],
    params: Mapping[str, Sequence[Any]] | Sequence[Param] | None = None,
    *,
    seeds: int = 1,
    executor: Executor | None = None,
    same_gpus: bool = False,
    rate_lo: float | None = None,
    rate_hi: float | None = None,
    tol_per_s: float | None = None,
    rule: RunLengthRule | None = None,
    overrides: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
    goodput_progress: ProgressFn | None = None,
) -> CompareResult:
    """Sweep every scenario over the same grid and search each one's steady-state
    goodput (:mod:`disaggsim.sweep.goodput`).

    Goodput is found for every scenario × combination of the swept parameters other
    than ``workload.rate_per_s`` (the rate is what the bisection varies). With
    ``same_gpus`` every scenario must have the first one's total GPU count at every
    such combination; otherwise a :class:`UserError` names the file that differs."""
    if not isinstance(scenarios, (list, tuple)):
        # one scenario was iterated: a path character by character ("/: a folder"), a
        # mapping by its keys; a number was a TypeError
        raise UserError(
            "compare: give a list of scenarios (paths, mappings or loaded scenarios), got "
            f"{type(scenarios).__name__}"
        )
    check_executor(executor)
    if not scenarios:
        raise UserError("compare: give at least one scenario")
    if params is None or isinstance(params, Mapping):
        plist = params_from_mapping(params)
    elif isinstance(params, (list, tuple)) and all(isinstance(p, Param) for p in params):
        plist = tuple(params)
    else:  # a list of "path=values" strings was an AttributeError traceback
        raise UserError(
            "params: give a mapping of dot path to values (e.g. {'workload.rate_per_s': "
            f"[1, 2, 4]}}), got {type(params).__name__} {' '.join(str(params).split())[:40]}"
        )
    same_gpus = check_switch("same_gpus", same_gpus)
    check_rule("rule", rule)
    check_callable("progress", progress)
    check_callable("goodput_progress", goodput_progress)
    rate_lo, rate_hi, tol_per_s = (plain_number(v) for v in (rate_lo, rate_hi, tol_per_s))
    check_grid_size(plist, seeds * len(scenarios))
    sources = [as_source(s, overrides) for s in scenarios]
    lo, hi = rate_range(plist, rate_lo, rate_hi)
    number = isinstance(tol_per_s, numbers.Real) and not isinstance(tol_per_s, bool)
    if tol_per_s is not None and not (number and tol_per_s > 0 and math.isfinite(tol_per_s)):
        # before the sweep's runs (goodput_many would find it only after them); the
        # API's argument by its name (it said --tol, a flag the caller never typed)
        tol = f"--tol {tol_per_s:g}" if command_line_running() else f"tol_per_s={tol_per_s!r}"
        raise UserError(f"compare: {tol}: must be a finite number > 0 req/s")
    keys, tasks = [], []
    for src in sources:
        k, t = sweep_tasks(src, plist, seeds)
        keys += [{SCENARIO_FILE: src.label, **row} for row in k]
        tasks += t
    other = [p for p in plist if p.path != RATE_PATH]
    points = expand_grid(other)
    g_sources: list[Source] = []
    g_keys: list[dict[str, Any]] = []
    for point in points:
        at_point = [with_overrides(src, point_overrides(point)) for src in sources]
        if same_gpus:
            check_same_gpus(at_point)
        g_sources += at_point
        g_keys += [point] * len(at_point)
    for src in g_sources:  # before the sweep's runs, not after them
        loaded = load_scenario(src.raw, base_dir=src.base_dir)
        refuse_fixed_time_events(loaded.scenario, src.label)
    width = max(len(tasks), 2 * len(g_sources) * seeds)  # the most tasks sent at once
    with given_or_default(executor, width) as ex:
        df = table(keys, run_tasks(tasks, ex, progress))
        results = goodput_many(
            g_sources,
            lo,
            hi,
            tol_per_s=tol_per_s,
            seeds=seeds,
            rule=rule,
            executor=ex,
            progress=goodput_progress,
        )
    frame = goodput_frame(g_sources, g_keys, results, [p.path for p in other])
    return CompareResult(table=df, goodput=frame, results=tuple(results))


def goodput_frame(
    sources: Sequence[Source],
    points: Sequence[dict[str, Any]],
    results: Sequence[GoodputResult],
    param_cols: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per goodput search; ``ratio_to_best`` is per GPU, against the best row."""
    per_gpu = [r.per_gpu_per_s for r in results]
    finite = [v for v in per_gpu if math.isfinite(v)]
    best = max(finite) if finite else float("nan")
    rows = []
    for src, point, r in zip(sources, points, results, strict=True):
        c = r.confirmation
        rows.append(
            {
                SCENARIO_FILE: src.label,
                **point,
                "scenario": r.scenario,
                "architecture": src.architecture,
                "num_gpus": r.num_gpus,
                "goodput_per_s": r.rate_per_s,
                "goodput_per_gpu_per_s": r.per_gpu_per_s,
                "ratio_to_best": r.per_gpu_per_s / best if best > 0 else float("nan"),
                "status": r.status,
                "confirmed": r.confirmed,
                "confirm_rate_per_s": c.rate_per_s if c is not None else float("nan"),
                "confirm_attainment": c.attainment if c is not None else float("nan"),
                "confirm_duration_s": c.duration_s if c is not None else float("nan"),
                "search_duration_s": r.search_duration_s,
                "unattainable_below_per_s": r.unattainable_below_per_s
                if r.unattainable_below_per_s is not None
                else float("nan"),
                "attainment_target": r.attainment_target,
                "tol_per_s": r.tol_per_s,
                "num_runs": r.num_runs,
                "num_stopped_early": r.num_stopped_early,
                "confirm_stopped_early": c is not None and c.num_stopped_early > 0,
                # runs a scenario bound cut short of the run-length rule (MAX_REQUESTS)
                "num_shortened": sum(e.num_runs for e in r.shortened),
            }
        )
    cols = [SCENARIO_FILE, *param_cols, *GOODPUT_COLUMNS[1:]]
    return pd.DataFrame(rows, columns=cols)


def near_best_note(frame: pd.DataFrame, seeds: int) -> str | None:
    """A note naming the rows whose goodput per GPU lies below the best's by less than one
    sd of a ratio's seed spread (:data:`~disaggsim.sweep.goodput.SEED_SPREAD` /
    sqrt(``seeds``), docs/sweeps.md "How much a goodput moves"), so that another seed
    could put one of them first; None where no row does. Rows are named by scenario and
    their other swept values."""
    band = SEED_SPREAD / math.sqrt(seeds)
    skip = set(GOODPUT_COLUMNS)
    near = []
    for r in frame.to_dict("records"):
        ratio = r["ratio_to_best"]
        if isinstance(ratio, float) and math.isfinite(ratio) and 1.0 - band < ratio < 1.0:
            extra = ", ".join(f"{k}={v}" for k, v in r.items() if k not in skip)
            near.append(f"{r['scenario']}{f' ({extra})' if extra else ''} {ratio:.2f}x")
    if not near:
        return None
    more = "; --seeds 4 narrows that by about half" if seeds < 4 else ""
    return (
        f"within {band:.1%} of the best goodput per GPU: {', '.join(near)}. That is one sd "
        f"of a ratio's seed spread at {seeds} seed{'s' if seeds > 1 else ''} "
        f"(docs/sweeps.md), so another seed could put one of them first{more}"
    )
