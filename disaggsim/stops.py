"""Short stretches of code that a stop (Ctrl-C, SIGTERM, SIGHUP) must not cut in two.

Python raises a signal's exception (``KeyboardInterrupt``, the command line's
``_Terminated``) between any two bytecodes of the main thread. Most places that is what
the writers' cleanup expects: each ``try`` removes what it made. But a few steps make
something on disk *before* the code that would clean it up can know of it: a folder
created and then handed to the ``try`` that removes it (a stop in between left
``OUT.partial`` empty, or a hidden ``.NAME.tmp-XXXXXXXX`` folder), or two renames that
swap an earlier result for a new one (a stop between them left the earlier result
hidden in ``.NAME.old-XXXXXXXX`` and deleted the new one). :func:`stops_held` runs such
a step with the stop held back: a signal that arrives meanwhile is delivered, to the
handler that was there, as soon as the step is over, so its exception is raised where
the caller's cleanup sees everything the step made.

SIGKILL cannot be held (nothing runs after it); docs/safety.md says what it leaves.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# the stops a command cleans up after (docs/safety.md, exit codes 130, 143, 129)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Held:
    """The handler put in place while a step runs: records the signal; once the step is
    over (``active`` false: a signal that comes while the handlers are put back) hands
    it straight to the handler that was there."""

    def __init__(self, previous: dict[int, Callable[[int, FrameType | None], Any]]) -> None:
        self.previous = previous
        self.active = True
        self.pending: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.active:
            self.pending.append(signum)
            return
        self.previous[signum](signum, frame)


@contextmanager
def stops_held() -> Iterator[None]:
    """Run the ``with`` body with Ctrl-C, SIGTERM and SIGHUP held back: one that arrives
    meanwhile is raised by its handler as the body ends (after an assignment the body
    made, so ``x = make()`` inside it is either not done or seen by the caller's
    ``except``). Keep the body to a few system calls: it cannot be interrupted.

    Only signals whose handler is a Python function are held (a signal ignored stays
    ignored; one with the system's default action, which runs no cleanup anyway, is left
    as it is), and only in the main thread (the only thread a signal's handler runs in).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = _Held({})
    try:
        for sig in STOP_SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):
                # recorded before the swap: a stop raised by the swap still restores it
                held.previous[sig] = handler
                signal.signal(sig, held)
        yield
    finally:
        held.active = False  # from here on a signal goes straight to its handler
        try:
            for signum, handler in held.previous.items():
                signal.signal(signum, handler)
        finally:
            if held.pending:
                first = held.pending[0]
                held.previous[first](first, None)
