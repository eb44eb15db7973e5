"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2 for
bad input (:class:`UserError`), ``disaggsim: internal error: ...`` and 3 for a broken
invariant (:class:`InvariantError`): of a run, or of a value disaggsim computed itself."""

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

# set while a command of the command line runs (disaggsim.cli.main): an error then names
# the flag the user typed, else (the Python API) the argument they passed
_ON_COMMAND_LINE: ContextVar[bool] = ContextVar("disaggsim_on_command_line", default=False)


@contextmanager
def on_command_line() -> Iterator[None]:
    token = _ON_COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _ON_COMMAND_LINE.reset(token)


def command_line_running() -> bool:
    """Whether a command of the command line is running (else: the Python API)."""
    return _ON_COMMAND_LINE.get()


def given(flag: str, argument: str, value: object) -> str:
    """How an error names a value the user gave: the flag on the command line (``--seeds
    0``), the argument in the Python API (``seeds=0``; an ``argument`` holding ``{}``
    is a template for the value's repr: ``overrides item 'x'``). An API user passed a
    keyword, not a flag: ``--seeds 0`` named a flag they never typed."""
    if _ON_COMMAND_LINE.get():
        return f"{flag} {value}"
    if "{}" in argument:
        return argument.format(repr(value))
    return f"{argument}={value!r}"


def one_line(message: str) -> str:
    """An error message as one line: control characters a user's value brought in (a
    path or a string field ending in a newline, echoed by the message) written as
    escapes, ``\\n`` for a newline."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


class UserError(Exception):
    """Bad input: the message is one line naming the file, field and allowed values (made
    one line here, so the Python API's messages are too: a numpy array echoed by one
    spanned several lines)."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(one_line(str(message)), *args)


class InvariantError(Exception):
    """A run broke one of its invariants, or a value disaggsim computed itself broke one
    (a planner's goodput bracket, say; docs/safety.md): a bug in disaggsim, not bad
    input. The CLI prints ``disaggsim: internal error: <message>``, writes nothing and
    exits 3."""


class WorkersLost(RuntimeError):
    """The processes a sweep ran on failed, not its input or disaggsim: a local worker
    process died (out of memory, killed), a Dask task's workers died each time it ran, or
    the connection to the Dask scheduler was lost. The CLI prints one line and exits 4."""


def note_kept(e: BaseException, note: str | None) -> None:
    """Attach to an error that stops a command the clause saying where its finished work
    was kept (a sweep's finished runs); the CLI ends the error's one line with it."""
    if note is not None:
        e.kept = note  # type: ignore[attr-defined]


def kept_of(e: BaseException) -> str | None:
    return getattr(e, "kept", None)


def plain_name(text: str) -> str:
    """A name as people misspell it the same: no case, no ``-``, ``_`` or spaces."""
    return re.sub(r"[-_\s]", "", text.lower())


def closest_hint(
    given: object,
    allowed: Iterable[str] | Mapping[str, str],
    *,
    key: Callable[[str], str] = plain_name,
    cutoff: float = 0.6,
    prefix: bool = False,
    same_numbers: bool = False,
) -> str:
    """`` (did you mean round_robin?)`` for a text close to an allowed name, else ``""``:
    the one "did you mean" of every error (a scenario's keys and tag values, a field's
    values, a flag's choices, a catalog GPU or model id, a ``calibrate --gpu``; each had
    its own difflib call, and they disagreed: ``Num-Workers`` found nothing as a key).

    ``allowed`` maps each name to the value it means (a Hugging Face repository id to a
    catalog id), or lists the names themselves. Names are compared by ``key`` (default:
    case, ``-``, ``_`` and spaces ignored: ``round-robin``, ``FP8``, ``trt-llm``); the same
    key is the one meant; else, with ``prefix``, every name whose key starts with the
    given one and a ``-`` (``h100``: h100-sxm or h100-pcie); else the closest spelling
    (difflib, ``cutoff``), with ``same_numbers`` only one holding the same numbers
    (never a model of another size or a GPU of other memory), all such names then, else
    the nearest one. Never the given text itself, and never a substitute: the caller
    still refuses the value."""
    if not isinstance(given, str):
        return ""
    meaning = dict(allowed) if isinstance(allowed, Mapping) else {a: a for a in allowed}
    keyed: dict[str, str] = {}
    for name, meant in meaning.items():
        keyed.setdefault(key(name), meant)
    k = key(given)
    if not k or not keyed:
        return ""
    found = [keyed[k]] if k in keyed else []
    if not found and prefix:
        found = [m for name, m in keyed.items() if name.startswith(k + "-")]
    if not found:
        if same_numbers:
            numbers = re.findall(r"\d+", k)
            close = difflib.get_close_matches(k, list(keyed), n=3, cutoff=cutoff)
            found = [keyed[c] for c in close if re.findall(r"\d+", c) == numbers]
        else:
            found = [
                keyed[c] for c in difflib.get_close_matches(k, list(keyed), n=1, cutoff=cutoff)
            ]
    found = [f for f in dict.fromkeys(found) if f != given]
    return f" (did you mean {' or '.join(found)}?)" if found else ""


def _shown_value(value: object) -> str:
    """``int 5``: a value of the wrong kind, as an API error names it (one line, short)."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def check_callable(name: str, value: object) -> None:
    """An API argument that takes a function (``progress``) is one or None: a number was
    a TypeError traceback from inside the run."""
    if value is not None and not callable(value):
        raise UserError(f"{name}: give a function or None, got {_shown_value(value)}")


def check_switch(name: str, value: object) -> bool:
    """An API argument that takes True or False gets a boolean (numpy's included), as a
    bool: any other value was read by its truth (``same_gpus="no"`` checked the GPUs,
    ``retest=0.0`` turned retests off)."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise UserError(f"{name}: give True or False, got {_shown_value(value)}")
