"""Sweep grids: ``--param PATH=a:b:n`` / ``PATH=v1,v2`` parsing and point expansion.

A grid is an ordered mapping ``dot path → list of values``; its points are the
Cartesian product with the first parameter varying slowest, so the row order of a sweep
table is the grid order whatever executor ran it. A point is applied to a scenario as
``--set`` overrides (the same dot-path rules and errors as ``disaggsim run --set``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import yaml

from disaggsim.config.bounds import MAX_GRID_POINTS
from disaggsim.config.loader import apply_overrides, plain_number
from disaggsim.errors import UserError, command_line_running, given

RESERVED_PARAMS = ("seed",)  # seeds are swept with ``seeds=`` / ``--seeds``


@dataclass(frozen=True, slots=True)
class Param:
    """One swept parameter: a scenario dot path and the values it takes, in order."""

    path: str
    values: tuple[Any, ...]


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _scalar(text: str) -> Any:
    """A list item: an int, a float (``1e9`` included, unlike YAML 1.1), else a YAML scalar."""
    num = _number(text)
    if num is not None:
        return num
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, ArithmeticError):
        # PyYAML's constructors raise Python errors on scalars they cannot build
        # (2001-02-30, !!int x): such an item is kept as the text it is.
        return text
    return value if isinstance(value, (str, bool)) or value is None else text


def linspace_values(a: int | float, b: int | float, n: int) -> list[int | float]:
    """``n`` evenly spaced values from ``a`` to ``b`` inclusive; integers when ``a`` and
    ``b`` are integers and the step is integral."""
    if n == 1:
        return [a]
    if isinstance(a, int) and isinstance(b, int) and (b - a) % (n - 1) == 0:
        step = (b - a) // (n - 1)
        return [a + i * step for i in range(n)]
    # a + i*(b-a)/(n-1), with the last value exactly b (no accumulated rounding)
    return [float(a + (b - a) * i / (n - 1)) if i < n - 1 else float(b) for i in range(n)]


def parse_param(text: str) -> Param:
    """``path=a:b:n`` (n evenly spaced values, both ends included) or ``path=v1,v2,...``.

    Raises :class:`UserError` (one line) on bad syntax; the path itself is checked
    against the scenario by :func:`check_params`.
    """
    where = f"--param {text}"
    path, eq, spec = text.partition("=")
    path, spec = path.strip(), spec.strip()
    if not eq or not path or not spec:
        raise UserError(
            f"{where}: expected PATH=a:b:n or PATH=v1,v2,... (e.g. workload.rate_per_s=1:12:12)"
        )
    if not all(path.split(".")):
        raise UserError(f"{where}: empty component in key path {path!r}")
    if ":" in spec and "," not in spec:
        parts = spec.split(":")
        if len(parts) != 3:
            raise UserError(
                f"{where}: a range is a:b:n (start, stop, number of points), got {spec!r}"
            )
        a, b = _number(parts[0]), _number(parts[1])
        try:
            n = int(parts[2])
        except ValueError:
            n = 0
        if a is None or b is None:
            raise UserError(
                f"{where}: range ends must be numbers, got {parts[0]!r} and {parts[1]!r}"
            )
        if n < 1:
            raise UserError(f"{where}: number of points must be an integer >= 1, got {parts[2]!r}")
        if n > MAX_GRID_POINTS:
            raise UserError(
                f"{where}: {n:,} points, more than the {MAX_GRID_POINTS:,} simulations a sweep "
                "may run (docs/safety.md)"
            )
        if not (math.isfinite(a) and math.isfinite(b)):
            raise UserError(f"{where}: range ends must be finite")
        return Param(path, tuple(linspace_values(a, b, n)))
    items = [s.strip() for s in spec.split(",")]
    if not all(items):
        raise UserError(f"{where}: empty value in list {spec!r}")
    return Param(path, tuple(_scalar(s) for s in items))


def params_from_mapping(params: Mapping[str, Sequence[Any]] | None) -> tuple[Param, ...]:
    """The API's ``{"workload.rate_per_s": [1, 2, 4]}`` as :class:`Param` s (order kept);
    a numpy array of values, and numpy numbers among them, are read as Python values
    (``np.linspace(1, 10, 4)``: refused as "expected a list", and numpy numbers in a
    list failed with a RepresenterError traceback)."""
    if params is not None and not isinstance(params, Mapping):
        raise UserError(
            "params: give a mapping of dot path to values (e.g. {'workload.rate_per_s': "
            f"[1, 2, 4]}}), got {type(params).__name__} {' '.join(str(params).split())[:40]}"
        )
    out = []
    for path, values in (params or {}).items():
        if type(values).__module__ == "numpy" and getattr(values, "ndim", 0) == 1:
            values = cast(Any, values).tolist()
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            shown = " ".join(repr(values).split())  # one line (a numpy array's repr is not)
            raise UserError(
                f"param {path}: expected a list of values, got {shown[:60]}"
                + ("..." if len(shown) > 60 else "")
            )
        if len(values) == 0:
            raise UserError(f"param {path}: needs at least one value")
        if len(values) > MAX_GRID_POINTS:
            raise UserError(
                f"param {path}: {len(values):,} values, more than the {MAX_GRID_POINTS:,} "
                "simulations a sweep may run (docs/safety.md)"
            )
        out.append(Param(str(path), tuple(_plain(v) for v in values)))
    return tuple(out)


def _plain(value: Any) -> Any:
    """A numpy number, Fraction or Decimal as the Python number it holds; anything else
    as is (:func:`~disaggsim.config.loader.plain_number`)."""
    return plain_number(value)


def parse_params(texts: Sequence[str]) -> tuple[Param, ...]:
    out: list[Param] = []
    for t in texts:
        p = parse_param(t)
        if any(q.path == p.path for q in out):
            raise UserError(f"--param {t}: {p.path} is swept twice")
        out.append(p)
    return tuple(out)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def override_text(path: str, value: Any) -> str:
    """``path=value`` with the value written so the ``--set`` parser reads it back as is."""
    value = _plain(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    text = text.removesuffix("...").strip()
    try:
        back = yaml.safe_load(text)
        # NaN is no value's equal: written as .nan, it is read back as NaN, and the field
        # then refuses it by name (it was "param PATH: value nan cannot be written as a
        # scenario value", naming no flag and no field)
        same = back == value or (_is_nan(back) and _is_nan(value))
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, ArithmeticError):
        same = False
    if not same:  # pragma: no cover - guard against odd scalars
        where = given("--param", "params key {}", path)
        raise UserError(f"{where}: value {value!r} cannot be written as a scenario value")
    return f"{path}={text}"


def check_params(params: Sequence[Param], raw: dict, label: str) -> None:
    """Every path must name a scenario field (the ``--set`` check, reworded for sweeps)."""
    for p in params:
        where = given("--param", "params key {}", p.path)
        if p.path in RESERVED_PARAMS:
            seeds = "--seeds" if command_line_running() else "seeds="
            raise UserError(f"{where}: sweep seeds with {seeds}, not as a parameter")
        text = override_text(p.path, p.values[0])
        try:
            apply_overrides(raw, [text], label)
        except UserError as e:
            msg, prefix = str(e), given("--set", "overrides item {}", text) + ": "
            detail = msg[len(prefix) :] if msg.startswith(prefix) else msg
            raise UserError(f"{label}: {where}: {detail}") from None


def check_grid_size(params: Sequence[Param], seeds: int = 1) -> None:
    """Points × seeds at most :data:`MAX_GRID_POINTS`, checked before anything is built."""
    total = seeds
    for p in params:
        total *= len(p.values)
        if total > MAX_GRID_POINTS:
            break
    if total > MAX_GRID_POINTS:
        sizes = " × ".join(str(len(p.values)) for p in params) + (
            f" × {seeds} seeds" if seeds > 1 else ""
        )
        raise UserError(
            f"{'--param' if command_line_running() else 'params'}: {sizes} simulations, more than the {MAX_GRID_POINTS:,} a sweep may run "
            "(docs/safety.md)"
        )


def expand_grid(params: Sequence[Param], seeds: int = 1) -> list[dict[str, Any]]:
    """All points, first parameter slowest: ``[{path: value, ...}, ...]``."""
    check_grid_size(params, seeds)
    if not params:
        return [{}]
    return [
        dict(zip([p.path for p in params], combo, strict=True))
        for combo in itertools.product(*(p.values for p in params))
    ]


def point_overrides(point: Mapping[str, Any]) -> list[str]:
    return [override_text(path, value) for path, value in point.items()]
