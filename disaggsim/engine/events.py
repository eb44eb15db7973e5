"""The engine's callback-style waits.

The router's back-pressure and the autoscaler's control loops are SimPy processes that
``yield`` their events. A few waits need no process of their own (a KV handoff's end, a
cold start, a client's timeout): each is one timeout whose callback runs a function,
always through :func:`call_later`, which is cheaper than starting a process per wait and
keeps SimPy's FIFO order among events due at the same instant. Workers run as callbacks
on the events they wait for (:mod:`disaggsim.engine.workers`); their start and their
failures are :func:`call_urgent` events, where SimPy puts a process's start and an
interrupt.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from simpy.events import URGENT, Event


def call_later(env: simpy.Environment, delay_s: float, fn: Callable[[], None]) -> simpy.Event:
    """Call ``fn()`` ``delay_s`` seconds from now (simulated); returns the timeout."""
    ev = env.timeout(delay_s)
    ev.callbacks.append(lambda _ev: fn())
    return ev


def call_urgent(env: simpy.Environment, fn: Callable[[Event], None]) -> Event:
    """Call ``fn(event)`` at the current instant, before the events of normal priority
    due now: SimPy's URGENT priority, that of a process's start (``Initialize``) and of
    an interrupt (``Interruption``), in FIFO order among those. Returns the event."""
    ev = Event(env)
    ev._ok = True
    ev._value = None
    ev.callbacks.append(fn)
    env.schedule(ev, URGENT)
    return ev


def call_soon(env: simpy.Environment, fn: Callable[[Event], None]) -> Event:
    """Call ``fn(event)`` at the current instant, after the events already due now (normal
    priority, FIFO): the hop of an event succeeded now. Returns the event."""
    ev = Event(env)
    ev._ok = True
    ev._value = None
    ev.callbacks.append(fn)
    env.schedule(ev)
    return ev
