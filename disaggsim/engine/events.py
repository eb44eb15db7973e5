"""The engine's callback-style waits.

The router's back-pressure and the autoscaler's control loops are SimPy processes that
``yield`` their events. A few waits need no process of their own: a cold start is one
timeout whose callback runs a function (:func:`call_later`); the arrivals, a KV
handoff's end and a client's timeout, the most numerous, are :func:`call_in` events
calling their function directly. Either is cheaper than a process per wait and keeps
SimPy's FIFO order among events due at the same instant. Workers run as callbacks on the
events they wait for (:mod:`disaggsim.engine.workers`): their own waits are
:func:`call_in` events, queued as timeouts would be; their start and their failures are
:func:`call_urgent` events, where SimPy puts a process's start and an interrupt.

A run's events are processed by :class:`Environment`, SimPy's with its loop over
``step`` written out (the same steps, no method call per event).

The engine reads the clock as ``env._now``, the attribute SimPy's ``now`` property
returns: no property call on the 15-20 reads per request (``tests/test_engine_events.py``
pins both private attributes; ``simpy`` is capped below 5 in ``pyproject.toml``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, Event, EventPriority


class Environment(simpy.Environment):
    """SimPy's environment, its :meth:`run` until an event with the loop over
    :meth:`~simpy.Environment.step` written out in one function: the same steps in the
    same order (pop the next event, set the clock, call its callbacks, crash on a failed
    event nobody defused; a stop inside the callbacks puts the rest back), without a
    method call per event (the engine processes about ten events per request). Any
    other ``until`` goes to SimPy's own :meth:`run`.

    Events due now (:func:`call_soon`, the workers' wakes and hops: about half the
    engine's events) wait in a FIFO beside SimPy's heap instead of in it, each with the
    id SimPy would have given it: the loop takes the FIFO's head while it comes before
    the heap's top in SimPy's order (time, priority, id), which is the order it would
    have popped them from the heap in. No heap push or pop for them (an event due now
    sifts to the top of the heap and back). :meth:`step`, :meth:`peek` and SimPy's own
    :meth:`run` first move them into the heap."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        # (id, event) due now at NORMAL priority, in id order (call_soon)
        self._soon: deque[tuple[int, Call]] = deque()

    def _flush_soon(self) -> None:
        """Move the events due now into SimPy's heap (where SimPy's step expects them)."""
        soon, queue, now = self._soon, self._queue, self._now
        while soon:
            eid, ev = soon.popleft()
            heappush(queue, (now, NORMAL, eid, ev))

    def step(self) -> None:
        self._flush_soon()
        super().step()

    def peek(self) -> float:
        self._flush_soon()
        return super().peek()

    def run(self, until: Any = None) -> Any:
        if not isinstance(until, Event) or until.callbacks is None:
            self._flush_soon()
            return super().run(until)
        until.callbacks.append(StopSimulation.callback)
        queue = self._queue
        soon = self._soon
        event: Event
        try:
            while True:  # step(), inline
                if soon and (
                    not queue
                    or (top := queue[0])[0] != self._now  # the heap's next is later
                    or (top[1] == NORMAL and top[2] > soon[0][0])  # due now, queued later
                ):
                    event = soon.popleft()[1]
                else:
                    try:
                        self._now, _, _, event = heappop(queue)
                    except IndexError:
                        raise EmptySchedule from None
                callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:
                    event.callbacks = callbacks[callbacks.index(callback) + 1 :]
                    self.schedule(event, EventPriority(-1))
                    raise
                # a Call is always ok: its class is checked first (type() is one
                # specialised call; _ok, a class attribute, a generic attribute lookup)
                if type(event) is not Call and not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
        except StopSimulation as exc:
            return exc.args[0]  # == until.value
        except EmptySchedule:
            assert not until.triggered
            raise RuntimeError(
                f'No scheduled events left but "until" event was not triggered: {until}'
            ) from None


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


if TYPE_CHECKING:  # typed as what the loop and the workers' waits take it for
    _CallBase = Event
else:
    _CallBase = object


class Call(_CallBase):
    """A function call due at an instant: what SimPy's loop reads of an event
    (``callbacks``, ``_ok``; ``_value`` None) and no more, so SimPy's heap and loop take
    it as a succeeded event. Made by :func:`call_in`, for the workers' own waits, as
    ``Call()`` with its callbacks set: a slotted object without a base (a
    :class:`simpy.Event` subclass made without its constructor costs about 500 machine
    instructions more to make and free, callgrind). ``_ok`` and ``_value`` are the
    class's (a Call is succeeded when made and never changes them); ``ok``, ``value``,
    ``triggered`` and ``processed`` read as :class:`simpy.Event`'s would. A Call is
    never yielded by a process nor a condition's operand."""

    __slots__ = ("callbacks",)

    _ok = True
    _value = None
    if TYPE_CHECKING:

        def __init__(self) -> None: ...

    else:  # simpy.Event's properties, as a succeeded event's
        ok = True
        value = None
        triggered = True

        @property
        def processed(self) -> bool:
            return self.callbacks is None


def call_in(env: simpy.Environment, delay_s: float, fn: Callable[[Any], None]) -> Call:
    """Call ``fn(event)`` ``delay_s`` seconds from now (simulated), after the events due
    then that were scheduled before it: queued exactly as ``env.timeout(delay_s)`` with
    ``fn`` as its callback would be (same time, priority and FIFO position), and with
    ``delay_s`` 0, as an event succeeded now. The one place that pushes onto SimPy's
    queue itself: a worker makes about nine such events per request, and this costs a
    fraction of a Timeout's constructor and ``Environment.schedule``."""
    ev = Call()
    ev.callbacks = [fn]
    heappush(env._queue, (env._now + delay_s, NORMAL, next(env._eid), ev))
    return ev


def call_soon_after(ev: Call, fn: Callable[[Any], None]) -> Call:
    """:func:`call_soon` of ``fn`` where ``ev`` is the event due now queued last, and no
    event was scheduled since: ``fn`` joins ``ev``'s callbacks (one event less) and
    ``ev`` is returned in place of a new event. The same order as two events, if
    ``ev``'s callbacks neither read the queue nor schedule an URGENT event: the two ids
    would be consecutive, so no other event could come between them (a prefill worker's
    pass, :meth:`~disaggsim.engine.cluster.Cluster._delivered`). A failure that takes
    one callback off leaves the other."""
    ev.callbacks.append(fn)
    return ev


def call_soon(env: Environment, fn: Callable[[Any], None]) -> Call:
    """:func:`call_in` with no delay, on the engine's :class:`Environment`: ``fn(event)``
    after the events due now that were scheduled before it, from the environment's
    FIFO of events due now (no heap push or pop)."""
    ev = Call()
    ev.callbacks = [fn]
    env._soon.append((next(env._eid), ev))
    return ev
