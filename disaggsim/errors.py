"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2 for
bad input (:class:`UserError`), ``disaggsim: internal error: ...`` and 3 for a broken
run invariant (:class:`InvariantError`)."""


class UserError(Exception):
    """Bad input: the message is one line naming the file, field and allowed values."""


class InvariantError(Exception):
    """A run broke one of its invariants (a bug in disaggsim, not bad input): the CLI
    prints ``disaggsim: internal error: <message>``, writes nothing and exits 3."""
