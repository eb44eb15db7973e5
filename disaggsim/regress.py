"""CI regression on TTFT/ITL curves: fresh runs of ``scenarios/ci/*.yaml`` vs the
reference curves committed under ``results/reference/``.

Each CI scenario ``scenarios/ci/<name>.yaml`` has a reference ``<name>.json`` holding
its grid (swept dot paths and values; the scenario schema has no room for it), the
number of seeds, and per point the metrics in :data:`METRICS`. :func:`check` re-runs the
reference's grid and reports every metric whose relative change exceeds
:data:`REL_TOL` (the runs are deterministic, so the same code gives the same numbers;
the tolerance only absorbs float printing). :func:`update` rewrites references — do it
for a modelling change only, and say so in the commit (docs/sweeps.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from disaggsim.config.bounds import MAX_GRID_POINTS, MAX_SEEDS
from disaggsim.errors import UserError
from disaggsim.inputs import read_json
from disaggsim.metrics.summary_table import regress_metrics
from disaggsim.output import check_file, json_owned, write_file
from disaggsim.sweep.core import (
    RATE_PATH,
    SEED_INDEX,
    PointTask,
    ProgressFn,
    as_source,
    run_tasks,
    sweep_tasks,
)
from disaggsim.sweep.executors import Executor
from disaggsim.sweep.grid import Param, check_params
from disaggsim.sweep.output import dump_json

METRICS = regress_metrics()  # the summary table's rows marked for regress
REL_TOL = 1e-9
FORMAT_VERSION = 1
DEFAULT_RATE_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5)


@dataclass(frozen=True, slots=True)
class Reference:
    name: str
    grid: dict[str, list[Any]]
    seeds: int
    metrics: tuple[str, ...]
    points: list[dict[str, Any]]  # grid values + seed_index + metrics (None = NaN)


@dataclass(frozen=True, slots=True)
class Drift:
    """One disagreement. ``metric``/``point`` are empty for structural problems (a missing
    reference, a changed grid), which ``problem`` describes."""

    scenario: str
    metric: str = ""
    point: str = ""
    reference: float | None = None
    fresh: float | None = None
    problem: str = ""

    @property
    def rel_change(self) -> float:
        ref, new = _f(self.reference), _f(self.fresh)
        if math.isnan(ref) or math.isnan(new):
            return float("nan")
        if ref == 0:
            return 0.0 if new == 0 else math.copysign(math.inf, new)
        return (new - ref) / abs(ref)


@dataclass(frozen=True, slots=True)
class Report:
    drifts: tuple[Drift, ...]
    checked: tuple[str, ...]  # scenario names compared
    num_values: int  # metric values compared

    @property
    def ok(self) -> bool:
        return not self.drifts

    def text(self) -> str:
        if self.ok:
            return (
                f"regress: OK: {self.num_values} values in {len(self.checked)} scenarios "
                f"({', '.join(self.checked)}) match the references"
            )
        lines = [
            f"regress: DRIFT in {len(self.drifts)} values/problems (relative tolerance {REL_TOL:g}):"
        ]
        rows = [d for d in self.drifts if not d.problem]
        for d in self.drifts:
            if d.problem:
                lines.append(f"  {d.scenario}: {d.problem}")
        if rows:
            head = ("scenario", "metric", "point", "reference", "fresh", "change")
            body = [
                (
                    d.scenario,
                    d.metric,
                    d.point,
                    _num(d.reference),
                    _num(d.fresh),
                    _pct(d.rel_change),
                )
                for d in rows
            ]
            widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
            for r in [head, *body]:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        lines.append(
            "If the change is intended (a modelling change), run `disaggsim regress --update` "
            "and say so in the commit message."
        )
        return "\n".join(lines)


def _f(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _num(v: float | None) -> str:
    return "NaN" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"


def _pct(r: float) -> str:
    return "n/a" if math.isnan(r) else f"{r:+.3%}"


def ci_scenarios(ci_dir: Path, only: Sequence[str] = ()) -> list[Path]:
    """Every ``*.yaml`` in the CI folder, sorted by name (``only``: these stems)."""
    if not ci_dir.is_dir():
        raise UserError(f"{ci_dir}: CI scenario folder not found")
    paths = sorted(ci_dir.glob("*.yaml"))
    if not paths:  # nothing would run, and the check would pass (or every reference drift)
        raise UserError(f"{ci_dir}: no CI scenarios (*.yaml) in this folder")
    if only:
        stems = {p.stem for p in paths}
        unknown = [o for o in only if o not in stems]
        if unknown:
            raise UserError(
                f"--only {unknown[0]}: no {ci_dir}/{unknown[0]}.yaml (allowed: {', '.join(sorted(stems))})"
            )
        paths = [p for p in paths if p.stem in only]
    return paths


def reference_path(ref_dir: Path, name: str) -> Path:
    return ref_dir / f"{name}.json"


def load_reference(path: Path) -> Reference:
    """A reference file, checked field by field: one line naming the file and the field
    that is not what ``regress --update`` writes (a point's metric that was no number
    was a ValueError traceback; a grid or seeds beyond the sweep bounds was reported as
    ``--param``/``--seeds``, flags the user never gave)."""
    raw = read_json(path, UserError)

    def bad(field: str, what: str) -> UserError:
        return UserError(f"{path}: {field}: {what} (not a reference `regress --update` wrote)")

    if not isinstance(raw, dict):
        raise UserError(f"{path}: not a reference file (expected a JSON object)")
    for key in ("grid", "seeds", "metrics", "points"):
        if key not in raw:
            raise bad(key, "missing")
    form = raw.get("format", FORMAT_VERSION)
    if isinstance(form, bool) or form != FORMAT_VERSION:
        raise bad("format", f"expected {FORMAT_VERSION}, got {raw['format']!r}"[:120])
    grid, seeds, metrics, points = raw["grid"], raw["seeds"], raw["metrics"], raw["points"]
    if not isinstance(grid, dict) or not all(
        isinstance(v, list) and v and all(_scalar(x) for x in v) for v in grid.values()
    ):
        raise bad("grid", "expected a mapping of dot path to a non-empty list of values")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_SEEDS:
        raise bad("seeds", f"expected an integer from 1 to {MAX_SEEDS:,}, got {seeds!r}")
    total = seeds
    for values in grid.values():
        total *= len(values)
    if total > MAX_GRID_POINTS:
        raise bad(
            "grid", f"{total:,} simulations, more than the {MAX_GRID_POINTS:,} a sweep may run"
        )
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise bad("metrics", "expected a list of metric names")
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise bad("points", "expected a list of objects")
    for i, point in enumerate(points):
        for m in metrics:
            v = point.get(m)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise bad(f"points.{i}.{m}", f"expected a number or null, got {v!r}"[:120])
        for k in (*grid, SEED_INDEX):
            if not _scalar(point.get(k)):
                raise bad(f"points.{i}.{k}", f"expected a grid value, got {point.get(k)!r}"[:120])
    return Reference(
        name=path.stem,
        grid={str(k): list(v) for k, v in grid.items()},
        seeds=seeds,
        metrics=tuple(metrics),
        points=list(points),
    )


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _params(grid: dict[str, list[Any]]) -> list[Param]:
    return [Param(k, tuple(v)) for k, v in grid.items()]


def default_grid(scenario_path: Path) -> dict[str, list[Any]]:
    """Rates around the scenario's own ``workload.rate_per_s`` (none → a single point)."""
    src = as_source(scenario_path)
    rate = src.raw.get("workload", {}).get("rate_per_s")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool):
        return {}
    return {RATE_PATH: [float(f"{rate * f:.4g}") for f in DEFAULT_RATE_FACTORS]}


def _run(
    jobs: Sequence[tuple[Path, dict[str, list[Any]], int]],
    executor: Executor | None,
    progress: ProgressFn | None,
    references: Sequence[Path] | None = None,
) -> list[list[dict[str, Any]]]:
    """Fresh points for each (scenario, grid, seeds), all sent to the executor at once
    (``references``: the file each grid was read from, named in its errors)."""
    keys_all: list[dict[str, Any]] = []
    tasks_all: list[PointTask] = []
    spans: list[tuple[int, int]] = []
    for i, (path, grid, seeds) in enumerate(jobs):
        try:
            keys, tasks = sweep_tasks(as_source(path), _params(grid), seeds)
        except UserError as e:  # a grid read from a reference: named with its file
            if references is None:
                raise
            raise UserError(f"{references[i]}: grid: {e}") from None
        spans.append((len(keys_all), len(keys)))
        keys_all += keys
        tasks_all += tasks
    summaries = run_tasks(tasks_all, executor, progress)
    out = []
    for start, n in spans:
        rows = []
        for k, s in zip(keys_all[start : start + n], summaries[start : start + n], strict=True):
            rows.append({**k, **{m: s[m] for m in METRICS}})
        out.append(rows)
    return out


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def update(
    ci_dir: Path,
    ref_dir: Path,
    *,
    executor: Executor | None = None,
    only: Sequence[str] = (),
    params: Sequence[Param] = (),
    progress: ProgressFn | None = None,
) -> list[Path]:
    """Rewrite the references of the CI scenarios from fresh runs. The grid is ``params``
    if given, else the existing reference's, else :func:`default_grid`."""
    paths = ci_scenarios(ci_dir, only)
    jobs = []
    for p in paths:
        ref_file = reference_path(ref_dir, p.stem)
        if params:
            grid = {q.path: list(q.values) for q in params}
            seeds = 1
        elif ref_file.exists():
            ref = load_reference(ref_file)
            grid, seeds = ref.grid, ref.seeds
        else:
            grid, seeds = default_grid(p), 1
        jobs.append((p, grid, seeds))
    for p, _, _ in jobs:  # before any run: every reference can be written
        check_file(reference_path(ref_dir, p.stem), "--reference-dir", _OWNED, "reference")
    fresh = _run(jobs, executor, progress)
    written = []
    for (p, grid, seeds), rows in zip(jobs, fresh, strict=True):
        doc = {
            "format": FORMAT_VERSION,
            "scenario": p.name,
            "grid": grid,
            "seeds": seeds,
            "metrics": list(METRICS),
            "points": [{k: _clean(v) for k, v in r.items()} for r in rows],
        }
        final = reference_path(ref_dir, p.stem)
        write_file(final, partial(dump_json, doc), "--reference-dir", _OWNED, "reference")
        written.append(final)
    return written


# A reference file disaggsim wrote (the only kind ``update`` replaces).
_OWNED = json_owned("format", "scenario", "grid", "points")


def _point_label(row: dict[str, Any], grid: dict[str, list[Any]], seeds: int) -> str:
    parts = [f"{k.rsplit('.', 1)[-1]}={row.get(k)}" for k in grid]
    if seeds > 1:
        parts.append(f"seed+{row.get(SEED_INDEX)}")
    return " ".join(parts) or "-"


def _same(ref: Any, new: Any) -> bool:
    r, n = _f(ref), _f(new)
    if math.isnan(r) or math.isnan(n):
        return math.isnan(r) and math.isnan(n)
    return math.isclose(r, n, rel_tol=REL_TOL, abs_tol=0.0)


def compare_points(ref: Reference, fresh: list[dict[str, Any]]) -> list[Drift]:
    """Drifts between a reference and fresh rows of the same grid."""
    if len(fresh) != len(ref.points):
        return [
            Drift(
                ref.name,
                problem=f"{len(fresh)} fresh points but {len(ref.points)} in the reference",
            )
        ]
    drifts = []
    for r, f in zip(ref.points, fresh, strict=True):
        keys = list(ref.grid) + [SEED_INDEX]
        if any(
            not _same(r.get(k), f.get(k))
            if isinstance(r.get(k), (int, float))
            else r.get(k) != f.get(k)
            for k in keys
        ):
            return [Drift(ref.name, problem="the grid points differ from the reference's")]
        label = _point_label(r, ref.grid, ref.seeds)
        for m in ref.metrics:
            if m not in f:
                drifts.append(
                    Drift(ref.name, m, label, problem=f"metric {m} is no longer computed")
                )
            elif not _same(r.get(m), f[m]):
                drifts.append(Drift(ref.name, m, label, _f(r.get(m)), _f(f[m])))
    return drifts


def check(
    ci_dir: Path,
    ref_dir: Path,
    *,
    executor: Executor | None = None,
    only: Sequence[str] = (),
    progress: ProgressFn | None = None,
) -> Report:
    """Re-run every CI scenario over its reference grid and list the drifts."""
    paths = ci_scenarios(ci_dir, only)
    drifts: list[Drift] = []
    jobs, refs = [], []
    for p in paths:
        f = reference_path(ref_dir, p.stem)
        if not f.exists():
            drifts.append(
                Drift(
                    p.stem,
                    problem=f"no reference {f} (run `disaggsim regress --update --only {p.stem}`)",
                )
            )
            continue
        ref = load_reference(f)
        try:  # the grid's paths against the scenario, naming the reference, not --param
            check_params(_params(ref.grid), as_source(p).raw, str(p))
        except UserError as e:
            raise UserError(f"{f}: grid: {str(e).split(': --param ', 1)[-1]}") from None
        refs.append(ref)
        jobs.append((p, ref.grid, ref.seeds))
    if not only and ref_dir.is_dir():
        stems = {p.stem for p in paths}
        for f in sorted(ref_dir.glob("*.json")):
            if f.stem not in stems:
                drifts.append(
                    Drift(f.stem, problem=f"reference {f} has no scenario {ci_dir}/{f.stem}.yaml")
                )
    files = [reference_path(ref_dir, r.name) for r in refs]
    fresh = _run(jobs, executor, progress, files) if jobs else []
    n = 0
    for ref, rows in zip(refs, fresh, strict=True):
        drifts += compare_points(ref, rows)
        n += len(rows) * len(ref.metrics)
    return Report(drifts=tuple(drifts), checked=tuple(r.name for r in refs), num_values=n)
