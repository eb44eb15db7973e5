"""The engine's one callback-style wait.

Workers, the router's back-pressure and the autoscaler's control loops are SimPy
processes that ``yield`` their events. A few waits need no process of their own (a KV
handoff's end, a cold start, a client's timeout): each is one timeout whose callback
runs a function, always through :func:`call_later`, which is cheaper than starting a
process per wait and keeps SimPy's FIFO order among events due at the same instant.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy


def call_later(env: simpy.Environment, delay_s: float, fn: Callable[[], None]) -> simpy.Event:
    """Call ``fn()`` ``delay_s`` seconds from now (simulated); returns the timeout."""
    ev = env.timeout(delay_s)
    ev.callbacks.append(lambda _ev: fn())
    return ev
