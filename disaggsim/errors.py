"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2 for
bad input (:class:`UserError`), ``disaggsim: internal error: ...`` and 3 for a broken
invariant (:class:`InvariantError`): of a run, or of a value disaggsim computed itself."""


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
