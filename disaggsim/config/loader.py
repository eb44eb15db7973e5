"""Reading a scenario: YAML → dot-path overrides → validated :class:`Scenario`.

Every failure becomes one :class:`UserError` line naming the file, the key (dot path) or
line, and what is allowed.
"""

from __future__ import annotations

import collections.abc
import copy
import datetime
import decimal
import fractions
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from disaggsim.config.bounds import MAX_SCENARIO_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, fmt
from disaggsim.config.scenario import Scenario
from disaggsim.errors import UserError, closest_hint, command_line_running, given
from disaggsim.inputs import read_regular


@dataclass(frozen=True, slots=True)
class LoadedScenario:
    scenario: Scenario
    path: Path | None  # None when built from a dict
    base_dir: Path  # folder that relative paths in the scenario resolve against
    raw: dict  # the resolved mapping (after overrides), as saved beside results


# ---------------------------------------------------------------- reading YAML


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps
    the last silently) and nesting deeper than :data:`MAX_YAML_DEPTH` (its composer
    recurses once per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML's scalar constructors raise Python errors, not YAMLError, on values they
        # cannot build (2001-02-30, !!int abc, !!timestamp x, an integer of more than
        # 4,300 digits): turned into YAML errors at the node, so they read as one line
        # naming the line like any other malformed YAML.
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError, ArithmeticError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, _unreadable(node, e), node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        # YAML 1.1 reads a leading 0 as octal and a colon as base 60: `num_workers: 010`
        # was 8 and `max_batch_seqs: 0100` 64, silently (hex 0x10 and binary 0b10 say
        # their base and are read as written)
        value = super().construct_yaml_int(node)
        _check_base(node, value)
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        _check_base(node, value)
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(key_text(key), line, seen[key])
                seen[key] = line
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


class _OtherBase(Exception):
    def __init__(self, line: int, why: str) -> None:
        self.line, self.why = line, why


def _check_base(node: yaml.ScalarNode, value: float) -> None:
    """Refuse a number YAML 1.1 reads in another base than its digits suggest."""
    text = str(node.value)
    digits = text.lstrip("+-").replace("_", "")
    if ":" in digits:
        why = f"YAML 1.1 reads digits separated by ':' in base 60: {value:g}; write the number"
    elif (
        len(digits) > 1
        and digits[0] == "0"
        and digits.isdigit()
        and abs(value) != int(digits, 10)  # 00-07 read the same either way
    ):
        sign = "-" if text.startswith("-") else ""
        why = (
            f"YAML 1.1 reads a leading 0 as octal: {value:g}; write {sign}{int(digits, 10)} "
            "without the leading 0"
        )
    else:
        return
    raise _OtherBase(
        node.start_mark.line + 1,
        f"{text!r} is not the number it looks like ({why}, or quote it for text)",
    )


def _unreadable(node: yaml.Node, e: Exception) -> str:
    """``cannot read '2001-02-30' as a YAML timestamp (day is out of range for month)``."""
    kind = node.tag.rsplit(":", 1)[-1]
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value):,} characters)"
    # a ValueError says what is wrong (Python's digit limit adds advice about its own
    # settings: cut); other errors come from inside PyYAML and say nothing to a reader
    why = str(e).split(";")[0][:100] if isinstance(e, ValueError) else f"not a valid {kind}"
    return f"cannot read {shown} as a YAML {kind} ({why})"


def _expanded_size(obj: Any, label: str) -> int:
    """Values in ``obj`` with every YAML alias expanded (a "billion laughs" file is small
    on disk but huge once expanded); a recursive alias is an error."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(o: Any) -> int:
        if not isinstance(o, (dict, list)):
            return 1
        key = id(o)
        if key in memo:
            return memo[key]
        if key in active:
            raise UserError(f"{label}: a YAML alias refers to itself (recursive structure)")
        active.add(key)
        children = o.values() if isinstance(o, dict) else o
        n = 1 + sum(size(c) for c in children)
        active.discard(key)
        memo[key] = n
        return n

    return size(obj)


def read_yaml(path: Path) -> dict:
    """A scenario file as a mapping; every way it can be unreadable is one line (a
    folder, a named pipe or a device is refused before it is read)."""
    data = read_regular(path, UserError, MAX_SCENARIO_BYTES, "scenario file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}); save the scenario as UTF-8"
        ) from None
    return parse_yaml_text(text, str(path))


def parse_yaml_text(text: str, path: str) -> dict:
    """Scenario YAML text (read from ``path``, the label its errors start with) as a
    mapping, by the rules of :func:`read_yaml`."""
    if len(text) > MAX_SCENARIO_BYTES or len(text.encode("utf-8", "replace")) > MAX_SCENARIO_BYTES:
        raise UserError(f"{path}: more than {MAX_SCENARIO_BYTES:,} bytes of YAML")
    try:
        raw = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as e:
        raise UserError(
            f"{path}: line {e.line}: duplicate key {e.key!r} (first given on line "
            f"{e.first_line}); give each key once"
        ) from None
    except _OtherBase as e:
        raise UserError(f"{path}: line {e.line}: {e.why}") from None
    except _TooDeep as e:
        raise UserError(
            f"{path}: line {e.line}: nested more than {MAX_YAML_DEPTH} levels deep"
        ) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}: {where}malformed YAML ({problem})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of scenario keys at top level")
    n = _expanded_size(raw, path)
    if n > MAX_YAML_NODES:
        raise UserError(
            f"{path}: {n:,} values once YAML aliases are expanded, more than the "
            f"{fmt(MAX_YAML_NODES)} allowed"
        )
    return raw


def _set(text: str) -> str:
    """An override as its errors name it: ``--set TEXT``, or ``overrides item 'TEXT'``."""
    return given("--set", "overrides item {}", text)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (["a", "b", "c"], value parsed as a YAML scalar/list)."""
    if "=" not in text:
        raise UserError(f"{_set(text)}: expected KEY.PATH=VALUE")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"{_set(text)}: empty component in key path {key!r}")
    try:
        parsed = yaml.load(value, Loader=_StrictLoader) if value.strip() else ""
    except _DuplicateKey as e:
        raise UserError(f"{_set(text)}: duplicate key {e.key!r}; give each key once") from None
    except _OtherBase as e:
        raise UserError(f"{_set(text)}: {e.why}") from None
    except (_TooDeep, RecursionError):
        raise UserError(f"{_set(text)}: nested more than {MAX_YAML_DEPTH} levels deep") from None
    except yaml.YAMLError:
        parsed = value
    if _expanded_size(parsed, f"{_set(text)}") > MAX_YAML_NODES:
        raise UserError(f"{_set(text)}: more than {fmt(MAX_YAML_NODES)} values")
    return parts, parsed


def apply_overrides(raw: dict, overrides: list[str], source: str) -> dict:
    """Set dot-path keys; the path must name a field of the scenario schema. A number
    in the path indexes an item of a list the scenario already holds
    (``failures.workers.0.at_s=60``); a list is added or replaced whole
    (``failures.workers=[{at_s: 60, worker: "decode:0"}]``)."""
    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        _check_path(parts, out, text)
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):  # an index _check_path found in range
                node = node[int(part)]
                continue
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, (dict, list)):
                raise UserError(
                    f"{_set(text)}: {'.'.join(parts[: i + 1])} is a value, not a section"
                )
            node = nxt
        if isinstance(node, list):
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value
    return out


def _check_path(parts: list[str], raw: dict, text: str) -> None:
    """Fail early (naming allowed keys) when a --set path is not in the schema, or
    indexes a list item the scenario does not hold."""
    model: Any = Scenario
    node: Any = raw
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "top level"
        item_type = _item_type(model, part)
        if item_type is not None:
            _check_index(part, node, where, text)
            model = item_type
            node = node[int(part)]
            continue
        fields = _fields_of(model, node)
        if fields is None:
            return  # free-form below here: leave it to validation
        if part not in fields:
            hint = closest_hint(part, list(fields))
            raise UserError(
                f"{_set(text)}: unknown key {part!r} at {where}{hint} "
                f"(allowed: {', '.join(sorted(fields))})"
            )
        model = fields[part]
        node = node.get(part) if isinstance(node, dict) else None


_NOT_A_LIST = object()


def _item_type(annotation: Any, part: str) -> Any:
    """The annotation of item ``part`` of a list/tuple field; None when ``annotation``
    takes no list (``part`` is then a key). A part that is not an index of a list field
    yields the sentinel :data:`_NOT_A_LIST` (checked by :func:`_check_index`)."""
    if _model_classes(annotation):
        return None  # a section: part is one of its keys
    index = _is_index(part)
    types_ = _element_types(annotation, int(part) + 1 if index else 1)
    if types_ is None:
        return None
    return types_[-1] if index else _NOT_A_LIST


def _is_index(part: str) -> bool:
    return part.isascii() and part.isdigit()


def _check_index(part: str, node: Any, where: str, text: str) -> None:
    """``part`` indexes an item ``node`` (a list the scenario holds) has, else one line
    saying what --set can index there."""
    whole = "give the whole list instead: " + (
        f"--set '{where}=[...]'" if command_line_running() else f"an overrides item '{where}=[...]'"
    )
    if not _is_index(part):
        n = len(node) if isinstance(node, list) else 0
        items = f"0..{n - 1}" if n else "none held"
        raise UserError(
            f"{_set(text)}: {where} is a list: index its items by number ({items}), or {whole}"
        )
    if node is None:
        raise UserError(
            f"{_set(text)}: {where} is not in the scenario, so it has no item {part} to "
            f"set; {whole}"
        )
    if not isinstance(node, list):
        raise UserError(f"{_set(text)}: {where} holds {_shown_input(node)}, not a list; {whole}")
    if int(part) >= len(node):
        n = len(node)
        have = f"items 0..{n - 1}" if n else "no items"
        raise UserError(
            f"{_set(text)}: {where} has {have}, no item {int(part)} (only items the list "
            f"holds can be set); {whole}"
        )


def _fields_of(annotation: Any, node: Any) -> dict[str, Any] | None:
    """Field name → annotation for a model annotation (resolving Optional and unions):
    of a union, the member ``node`` describes by its tags (``kind``, ``dist``; the first
    member where ``node`` is no mapping); None where the annotation is no model or
    ``node``'s tag names no member (validation then names the tag). (Only ``kind`` was
    read: ``--set workload.prompt_tokens.median=1000`` on a lognormal was refused as an
    unknown key of ``{dist: fixed, value}``.)"""
    classes = _model_classes(annotation)
    if not classes:
        return None
    if isinstance(node, dict) and len(classes) > 1:
        cls = _pick_model(classes, node)
        if cls is None:
            return None
        classes = [cls]
    return {name: f.annotation for name, f in classes[0].model_fields.items()}


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


# ---------------------------------------------------------------- schema walk


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _union_args(annotation: Any) -> tuple[Any, ...]:
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(_unwrap(a) for a in typing.get_args(annotation))
    return (annotation,)


def _numbers_only(annotation: Any) -> bool:
    """True when the field takes numbers and nothing else (so a YAML boolean there is a
    mistake: ``num_workers: yes`` would otherwise be read as 1)."""
    kinds = [a for a in _union_args(annotation) if a is not type(None)]
    if not kinds:
        return False
    for a in kinds:
        if a in (int, float):
            continue
        if typing.get_origin(a) is typing.Literal and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in typing.get_args(a)
        ):
            continue
        return False
    return True


def _pick_model(classes: list[type[BaseModel]], node: dict) -> type[BaseModel] | None:
    """The member of a union of models that ``node`` describes: the first whose tag
    fields (``kind``, ``dist``: a literal of one value) agree with it; None when no
    member fits (pydantic then reports the tag). A literal of several values (``link:
    nvlink | pcie | ...``) is an ordinary field, not a tag: a wrong value there is that
    field's error, not a sign of another member."""
    if len(classes) == 1:
        return classes[0]
    for cls in classes:
        fits = True
        for name, f in cls.model_fields.items():
            ann = _unwrap(f.annotation)
            if typing.get_origin(ann) is not typing.Literal or len(typing.get_args(ann)) != 1:
                continue
            if name in node:
                fits = node[name] in typing.get_args(ann)
            elif f.is_required():
                fits = False
            if not fits:
                break
        if fits:
            return cls
    return None


def _element_types(annotation: Any, n: int) -> list[Any] | None:
    """Annotations of the ``n`` items of a list/tuple value (None: not a sequence type)."""
    for a in _union_args(annotation):
        origin = typing.get_origin(a)
        args = typing.get_args(a)
        if origin in (list, collections.abc.Sequence) and args:
            return [args[0]] * n
        if origin is tuple and args:
            if len(args) == 2 and args[1] is Ellipsis:
                return [args[0]] * n
            return list(args[:n]) + [Any] * max(0, n - len(args))
    return None


def _value_type(annotation: Any) -> Any:
    for a in _union_args(annotation):
        if typing.get_origin(a) is dict:
            return typing.get_args(a)[1]
    return None


def schema_problems(
    node: Any, annotation: Any = None, path: tuple[str, ...] = ()
) -> list[tuple[int, str]]:
    """Problems pydantic would report late or not at all, found by walking ``node``
    along the schema: unknown keys (rank 0, with the nearest allowed key) and booleans
    where a number belongs (rank 1). Returns ``(rank, "dot.path: message")`` in
    document order."""
    annotation = Scenario if annotation is None else annotation
    out: list[tuple[int, str]] = []
    where = ".".join(path)
    if isinstance(node, (bytes, bytearray, memoryview)):
        # pydantic reads bytes as text: a YAML !!binary value became a name silently
        out.append((1, f"{where}: binary data (a YAML !!binary value or bytes), not text"))
        return out
    if isinstance(node, bool):
        if _numbers_only(annotation):
            out.append(
                (
                    1,
                    f"{where}: {str(node).lower()} is a boolean, not a number (YAML reads "
                    "true/false/yes/no/on/off as booleans)",
                )
            )
        return out
    if isinstance(node, dict):
        classes = [c for a in _union_args(annotation) for c in _model_classes(a)]
        if classes:
            cls = _pick_model(classes, node)
            if cls is None:
                return out
            fields = cls.model_fields
            forbid = cls.model_config.get("extra") == "forbid"
            for key, value in node.items():
                if key not in fields:
                    if forbid:
                        out.append(
                            (
                                0,
                                f"{'.'.join((*path, key_text(key)))}: "
                                + unknown_key_message(key, list(fields)),
                            )
                        )
                    continue
                out += schema_problems(value, fields[key].annotation, (*path, key))
            return out
        value_type = _value_type(annotation)
        if value_type is not None:
            for key, value in node.items():
                out += schema_problems(value, value_type, (*path, key_text(key)))
        return out
    if isinstance(node, (list, tuple)):
        types_ = _element_types(annotation, len(node))
        if types_ is not None:
            for i, (item, t) in enumerate(zip(node, types_, strict=True)):
                out += schema_problems(item, t, (*path, str(i)))
    return out


def key_text(key: Any) -> str:
    """A mapping key as YAML wrote it: ``null`` (``~``, an empty key), ``true``, a date;
    a string as is. (Python's spelling, ``None: unknown key``, named no key the user
    wrote.)"""
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return str(key).lower()
    if isinstance(key, (datetime.date, datetime.datetime)):
        return key.isoformat()
    return str(key)


def unknown_key_message(key: Any, allowed: list[str]) -> str:
    """``unknown key (did you mean num_workers?) (allowed: ...)``; a key YAML read as
    null, a boolean, a number or a date says so (a name is text)."""
    hint = closest_hint(key, allowed)
    kind = _YAML_KIND.get(type(key))
    read_as = f" (YAML reads this key as {kind}, not a name)" if kind else ""
    return f"unknown key{read_as}{hint} (allowed: {', '.join(sorted(allowed))})"


_YAML_KIND: dict[type, str] = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    datetime.date: "a date",
    datetime.datetime: "a date",
}


# Which of several validation errors to report: an unknown key first (a misspelt key is
# the cause of the "required key is missing" beside it), a missing key last.
_ERROR_RANK = {"extra_forbidden": 0, "missing": 2}


def format_validation_error(err: ValidationError, source: str) -> str:
    errors = err.errors(include_url=False)
    e = min(errors, key=lambda x: _ERROR_RANK.get(x["type"], 1))
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
    form = _mapping_form(clean) if e["type"] in _MAPPING_EXPECTED else None
    tag = _tag_message(e, clean) if isinstance(e["input"], dict) else None
    if e["type"] == "extra_forbidden":
        msg = unknown_key_message(clean[-1], _allowed_keys(clean[:-1]))
    elif tag is not None:
        key, msg = tag
    elif form is not None:
        got = f", got {_shown_input(e['input'])}" if not isinstance(e["input"], dict) else ""
        msg = f"expected {form}{got}"
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif e["type"] == "less_than_equal":
        limit = float(e.get("ctx", {}).get("le", math.nan))
        msg = f"must be <= {fmt(limit)}, got {_shown_input(e['input'])}"
    elif e["input"] is None and e["type"].endswith("_type"):
        # `gpu: ~`, `gpu:` with nothing after it: "Input should be a valid string" named
        # neither the null YAML read nor the values the field takes
        msg = (
            f"{msg}, got null (YAML reads ~, null and a key with no value as null)"
            f"{_catalog_allowed(clean)}"
        )
    elif e["type"] not in _NO_INPUT_SHOWN and _short(e["input"]):
        msg = f"{msg}, got {_shown_input(e['input'])}"
        if e["type"] == "literal_error":  # `engine: vlm`: the value meant, as for keys
            msg += closest_hint(e["input"], re.findall(r"'([^']*)'", e["ctx"]["expected"]))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        # A model's check naming one of its fields ("provision_s: ...") extends the path.
        field = re.match(r"([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*): (.*)", msg, flags=re.S)
        if field:
            key = f"{key}.{field.group(1)}" if key else field.group(1)
            msg = field.group(2)
    n_more = len(errors) - 1
    more = f" (+{n_more} more problem{'s' if n_more > 1 else ''})" if n_more else ""
    if not key:
        return f"{source}: {msg}{more}"
    return f"{source}: {key}: {msg}{more}"


def _catalog_allowed(path: list[str]) -> str:
    """`` (allowed: ...)`` for a field that names a catalog entry (a pool's GPU, the
    model), else nothing."""
    from disaggsim.catalog import GPU_IDS, MODEL_IDS

    if path == ["model"]:
        return f" (allowed: {', '.join(MODEL_IDS)})"
    if len(path) == 2 and path[0] in ("pool", "prefill_pool", "decode_pool") and path[1] == "gpu":
        return f" (allowed: {', '.join(GPU_IDS)})"
    return ""


def _tag_message(e: Any, clean: list[str]) -> tuple[str, str] | None:
    """A mapping whose tag (``dist``, ``kind``) is missing or names no member of the
    union: (the tag's dot path, "required key is missing; give one of {dist: fixed,
    value}, ..." or "unknown value 'fixd' (did you mean fixed?) (allowed: ...)"); None
    for other errors. (Pydantic said "Input tag 'fixd' found using 'dist' does not match
    any of the expected tags", and a mapping without its tag was reported as "expected a
    mapping".)"""
    if e["type"] not in ("union_tag_not_found", "union_tag_invalid"):
        return None
    tag = str(e.get("ctx", {}).get("discriminator", "")).strip("'")
    if not tag.isidentifier():  # a function picks the member (fabric: kind, default link)
        tag = "kind"
    values = _tag_values(clean, tag)
    if not values:
        return None
    key = ".".join((*clean, tag))
    if tag not in e["input"]:
        form = _mapping_form(clean)
        allowed = f"give {form}" if form else f"allowed: {', '.join(values)}"
        return key, f"required key is missing ({allowed})"
    given = e["input"][tag]
    hint = closest_hint(given, values)
    return key, f"unknown value {_shown_input(given)}{hint} (allowed: {', '.join(values)})"


def _tag_values(parts: list[str], tag: str) -> list[str]:
    """The values the tag field ``tag`` takes in the union of models at ``parts``."""
    annotation = _annotation_at(parts)
    if annotation is None:
        return []
    out = []
    for cls in (c for a in _union_args(annotation) for c in _model_classes(a)):
        f = cls.model_fields.get(tag)
        if f is not None and typing.get_origin(_unwrap(f.annotation)) is typing.Literal:
            out += [str(v) for v in typing.get_args(_unwrap(f.annotation))]
    return out


# Error types that say a mapping was expected (a scalar or list given, or a mapping
# without its tag): the message names the forms the field takes.
_MAPPING_EXPECTED = ("model_attributes_type", "model_type", "dict_type", "union_tag_not_found")


def _annotation_at(parts: list[str]) -> Any:
    """The annotation of the field at ``parts`` (a union of models is entered through
    the first member that has the next field); None when the path leaves the schema."""
    annotation: Any = Scenario
    for part in parts:
        for cls in _model_classes(annotation):
            if part in cls.model_fields:
                annotation = cls.model_fields[part].annotation
                break
        else:
            return None
    return annotation


def _mapping_form(parts: list[str]) -> str | None:
    """What the field at ``parts`` takes when it takes only mappings: ``a mapping, one of
    {dist: fixed, value}, {dist: uniform, low, high}, ...`` (each member's tag and
    required keys) or ``a mapping with keys a, b (required: a)``; None otherwise."""
    annotation = _annotation_at(parts)
    if annotation is None:
        return None
    members = [a for a in _union_args(annotation) if a is not type(None)]
    classes = [c for a in members for c in _model_classes(a)]
    if not classes or len(classes) != len(members):
        return None  # a field that also takes scalars: pydantic's message stands
    if len(classes) == 1:
        fields = classes[0].model_fields
        required = [n for n, f in fields.items() if f.is_required()]
        req = f" (required: {', '.join(required)})" if required else ""
        return f"a mapping with keys {', '.join(fields)}{req}"
    forms = []
    for cls in classes:
        tags, keys = [], []
        for name, f in cls.model_fields.items():
            ann = _unwrap(f.annotation)
            if typing.get_origin(ann) is typing.Literal and len(typing.get_args(ann)) == 1:
                tags.append(f"{name}: {typing.get_args(ann)[0]}")
            elif f.is_required():
                keys.append(name)
        if not keys:  # nothing required: the keys it takes
            keys = [n for n in cls.model_fields if not any(t.startswith(f"{n}:") for t in tags)]
        forms.append("{" + ", ".join(tags + keys) + "}")
    return f"a mapping, one of {', '.join(forms)}"


# Error types whose message already says what was given.
_NO_INPUT_SHOWN = ("union_tag_invalid", "union_tag_not_found", "value_error", "assertion_error")


def _short(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and len(repr(value)) <= 40


def _shown_input(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and abs(value) >= 10**6:
        return (
            f"{value:.3g}"
            if abs(value) < 10**300
            else "a number of " + str(len(str(value))) + " digits"
        )
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    "max_tokens",
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
    annotation = _annotation_at(parent)
    fields = None if annotation is None else _fields_of(annotation, None)
    return list(fields) if fields else []


def load_scenario(
    source: str | Path | dict,
    overrides: list[str] | None = None,
    base_dir: Path | None = None,
) -> LoadedScenario:
    """Load and validate a scenario from a YAML path, YAML text (a string holding a line
    break: no path does) or a mapping, applying ``--set``s (a list of
    ``KEY.PATH=VALUE`` strings). Numpy numbers and arrays in a mapping are read as the
    Python numbers and lists they hold (a notebook's ``np.linspace``)."""
    overrides = check_overrides(overrides)
    if isinstance(source, dict):
        path = None
        label = "<scenario>"
        raw = plain_values(source, label)
        base = base_dir or Path.cwd()
    elif isinstance(source, str) and "\n" in source:
        path = None
        label = "<scenario>"
        raw = parse_yaml_text(source.removeprefix("\ufeff"), label)
        base = base_dir or Path.cwd()
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if isinstance(source, str) and ": " in source and not path.exists():
            raise UserError(
                f"{source}: no such scenario file (a string is read as YAML text only when "
                "it holds a line break)"
            )
        raw = read_yaml(path)
        label = str(path)
        base = base_dir or path.resolve().parent
    else:
        raise UserError(
            "load_scenario: a scenario is a YAML file path, YAML text or a mapping, got "
            f"{_type_shown(source)}"
        )
    raw = apply_overrides(raw, overrides, label)
    # the schema walk first, cache section included: keys YAML read as null, a boolean
    # or a number, and binary values, are named as the user wrote them (the cache
    # section's own check said "cache.None: Keys should be strings")
    problems = schema_problems(raw)
    if problems:
        n_more = len(problems) - 1
        more = f" (+{n_more} more problem{'s' if n_more > 1 else ''})" if n_more else ""
        raise UserError(f"{label}: {min(problems, key=lambda p: p[0])[1]}{more}")
    if isinstance(raw, dict) and isinstance(raw.get("cache"), dict):
        from disaggsim.cache.config import validate_cache_section

        validate_cache_section(raw["cache"], label)  # its one-line messages name the field
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation_error(err, label)) from None
    _check_catalog_ids(scenario, label)
    return LoadedScenario(scenario=scenario, path=path, base_dir=base, raw=raw)


def _type_shown(value: Any) -> str:
    """``int 3``, ``bytes b'x.yaml'``: a value of the wrong kind, briefly."""
    text = " ".join(repr(value).split())  # one line (a numpy array's repr is several)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_overrides(overrides: Any) -> list[str]:
    """``--set``-style overrides of the Python API: a list (or tuple) of
    ``KEY.PATH=VALUE`` strings. One string was read character by character (``"seed=3"``
    gave "--set s: expected KEY.PATH=VALUE"), a number raised a TypeError."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, (list, tuple)):
        raise UserError(
            "overrides: give a list of 'KEY.PATH=VALUE' strings (e.g. ['seed=3']), got "
            f"{_type_shown(overrides)}"
        )
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(
                f"overrides: each item is a 'KEY.PATH=VALUE' string, got {_type_shown(item)}"
            )
    return list(overrides)


def _is_numpy(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "tolist")


def plain_number(value: Any) -> Any:
    """A number of another kind than Python's own as the Python number it holds: a numpy
    number (its ``tolist()``), a ``Fraction`` or a ``Decimal`` (a float: YAML writes none
    of them, and a scenario value, sweep value or goodput bound of that kind was a
    RepresenterError traceback, or, a Decimal bound, refused as no number); anything else
    as is."""
    if _is_numpy(value):
        return value.tolist()
    if isinstance(value, (fractions.Fraction, decimal.Decimal)):
        return float(value)
    return value


def plain_values(source: dict, label: str) -> dict:
    """A deep copy of a scenario mapping given to the Python API, checked as a YAML file
    is: nesting at most :data:`MAX_YAML_DEPTH` deep, at most :data:`MAX_YAML_NODES`
    values, no structure holding itself (each was a RecursionError traceback); numpy
    scalars and arrays become the Python values they hold (YAML cannot write numpy
    values: a sweep point or a written scenario.yaml failed with a RepresenterError)."""
    count = [0]
    active: set[int] = set()

    def walk(obj: Any, depth: int) -> Any:
        count[0] += 1
        if count[0] > MAX_YAML_NODES:
            raise UserError(f"{label}: more than {fmt(MAX_YAML_NODES)} values")
        obj = plain_number(obj)
        if not isinstance(obj, (dict, list, tuple)):
            return obj
        if depth > MAX_YAML_DEPTH:
            raise UserError(f"{label}: nested more than {MAX_YAML_DEPTH} levels deep")
        if id(obj) in active:
            raise UserError(f"{label}: a value holds itself (a recursive structure)")
        active.add(id(obj))
        if isinstance(obj, dict):
            out: Any = {walk(k, depth + 1): walk(v, depth + 1) for k, v in obj.items()}
        else:
            out = type(obj)(walk(v, depth + 1) for v in obj)
        active.discard(id(obj))
        return out

    return walk(source, 0)


def _check_catalog_ids(scenario: Scenario, label: str) -> None:
    from disaggsim.catalog import GPU_IDS, MODEL_IDS, id_hint

    if scenario.model not in MODEL_IDS:
        raise UserError(
            f"{label}: model: unknown model {scenario.model!r} (allowed: {', '.join(MODEL_IDS)})"
            + id_hint("model", scenario.model)
        )
    for role, pool in scenario.pools.items():
        key = "pool" if role == "colocated" else f"{role}_pool"
        if pool.gpu not in GPU_IDS:
            raise UserError(
                f"{label}: {key}.gpu: unknown GPU {pool.gpu!r} (allowed: {', '.join(GPU_IDS)})"
                + id_hint("gpu", pool.gpu)
            )
