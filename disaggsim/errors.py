"""User-facing errors. The CLI prints ``disaggsim: error: <message>`` and exits 2."""


class UserError(Exception):
    """Bad input: the message is one line naming the file, field and allowed values."""
