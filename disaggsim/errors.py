"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2 for
bad input (:class:`UserError`), ``disaggsim: internal error: ...`` and 3 for a broken
invariant (:class:`InvariantError`): of a run, or of a value disaggsim computed itself."""


class UserError(Exception):
    """Bad input: the message is one line naming the file, field and allowed values."""


class InvariantError(Exception):
    """A run broke one of its invariants, or a value disaggsim computed itself broke one
    (a planner's goodput bracket, say; docs/safety.md): a bug in disaggsim, not bad
    input. The CLI prints ``disaggsim: internal error: <message>``, writes nothing and
    exits 3."""
