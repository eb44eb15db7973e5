"""Reading a scenario: YAML → dot-path overrides → validated :class:`Scenario`.

Every failure becomes one :class:`UserError` line naming the file, the key (dot path) or
line, and what is allowed.
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from disaggsim.config.scenario import Scenario
from disaggsim.errors import UserError


@dataclass(frozen=True, slots=True)
class LoadedScenario:
    scenario: Scenario
    path: Path | None  # None when built from a dict
    base_dir: Path  # folder that relative paths in the scenario resolve against
    raw: dict  # the resolved mapping (after overrides), as saved beside results


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: scenario file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}: {where}malformed YAML ({problem})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of scenario keys at top level")
    return raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (["a", "b", "c"], value parsed as a YAML scalar/list)."""
    if "=" not in text:
        raise UserError(f"--set {text}: expected KEY.PATH=VALUE")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set {text}: empty component in key path {key!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def apply_overrides(raw: dict, overrides: list[str], source: str) -> dict:
    """Set dot-path keys; the path must name a field of the scenario schema."""
    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        _check_path(parts, out, text)
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise UserError(
                    f"--set {text}: {'.'.join(parts[: i + 1])} is a value, not a section"
                )
            node = nxt
        node[parts[-1]] = value
    return out


def _check_path(parts: list[str], raw: dict, text: str) -> None:
    """Fail early (naming allowed keys) when a --set path is not in the schema."""
    model: Any = Scenario
    node: Any = raw
    for i, part in enumerate(parts):
        fields = _fields_of(model, node)
        if fields is None:
            return  # free-form below here (lists, dicts): leave it to validation
        if part not in fields:
            where = ".".join(parts[:i]) or "top level"
            raise UserError(
                f"--set {text}: unknown key {part!r} at {where} (allowed: {', '.join(sorted(fields))})"
            )
        model = fields[part]
        node = node.get(part) if isinstance(node, dict) else None


def _fields_of(annotation: Any, node: Any) -> dict[str, Any] | None:
    """Field name → annotation for a model annotation (resolving Optional and unions)."""
    for cls in _model_classes(annotation):
        if isinstance(node, dict) and "kind" in node:
            kind_field = cls.model_fields.get("kind")
            if kind_field is not None and node["kind"] not in typing.get_args(
                kind_field.annotation
            ):
                continue
        return {name: f.annotation for name, f in cls.model_fields.items()}
    return None


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_classes(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            out.extend(_model_classes(arg))
        return out
    return []


def format_validation_error(err: ValidationError, source: str) -> str:
    e = err.errors(include_url=False)[0]
    loc = [str(p) for p in e["loc"]]
    # Drop discriminator tags (workload.synthetic.rate_per_s → workload.rate_per_s): a tag
    # stands right after a union field, so only there is a tag name dropped.
    clean: list[str] = []
    for i, p in enumerate(loc):
        if p.startswith("function-"):
            continue
        if p in _TAGS and i > 0 and loc[i - 1] in _UNION_FIELDS:
            continue
        clean.append(p)
    key = ".".join(clean)
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        parent = clean[:-1]
        allowed = _allowed_keys(parent)
        msg = "unknown key" + (f" (allowed: {', '.join(sorted(allowed))})" if allowed else "")
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif e["type"] == "union_tag_invalid" or e["type"] == "union_tag_not_found":
        msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    n_more = len(err.errors()) - 1
    more = f" (+{n_more} more problem{'s' if n_more > 1 else ''})" if n_more else ""
    if not key:
        return f"{source}: {msg}{more}"
    return f"{source}: {key}: {msg}{more}"


_TAGS = {
    "synthetic",
    "preset",
    "trace",
    "sessions",
    "fixed",
    "exponential",
    "uniform",
    "lognormal",
    "empirical",
    "link",
    "topology",
}
_UNION_FIELDS = {
    "workload",
    "prompt_tokens",
    "output_tokens",
    "fabric",
    "rate_shape",
    # sessions workloads
    "turns",
    "user_tokens",
    "think_time_s",
    "tool_call_tokens",
    "tool_result_tokens",
    "tool_latency_s",
}


def _allowed_keys(parent: list[str]) -> list[str]:
    model: Any = Scenario
    for part in parent:
        fields = _fields_of(model, None)
        if fields is None or part not in fields:
            return []
        model = fields[part]
    fields = _fields_of(model, None)
    return list(fields) if fields else []


def load_scenario(
    source: str | Path | dict,
    overrides: list[str] | None = None,
    base_dir: Path | None = None,
) -> LoadedScenario:
    """Load and validate a scenario from a YAML path or a mapping, applying ``--set``s."""
    overrides = overrides or []
    if isinstance(source, dict):
        path = None
        raw = copy.deepcopy(source)
        label = "<scenario>"
        base = base_dir or Path.cwd()
    else:
        path = Path(source)
        raw = read_yaml(path)
        label = str(path)
        base = base_dir or path.resolve().parent
    raw = apply_overrides(raw, overrides, label)
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation_error(err, label)) from None
    _check_catalog_ids(scenario, label)
    return LoadedScenario(scenario=scenario, path=path, base_dir=base, raw=raw)


def _check_catalog_ids(scenario: Scenario, label: str) -> None:
    from disaggsim.catalog import GPU_IDS, MODEL_IDS

    if scenario.model not in MODEL_IDS:
        raise UserError(
            f"{label}: model: unknown model {scenario.model!r} (allowed: {', '.join(MODEL_IDS)})"
        )
    for role, pool in scenario.pools.items():
        key = "pool" if role == "colocated" else f"{role}_pool"
        if pool.gpu not in GPU_IDS:
            raise UserError(
                f"{label}: {key}.gpu: unknown GPU {pool.gpu!r} (allowed: {', '.join(GPU_IDS)})"
            )
