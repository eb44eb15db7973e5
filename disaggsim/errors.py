"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2 for
bad input (:class:`UserError`), ``disaggsim: internal error: ...`` and 3 for a broken
invariant (:class:`InvariantError`): of a run, or of a value disaggsim computed itself."""

from collections.abc import Iterator
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
