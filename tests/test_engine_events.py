"""The engine's callback waits keep SimPy's order: ``call_in`` pushes onto SimPy's event
queue itself (its private ``_queue`` and ``_eid``), and the engine reads the clock as
``env._now`` (what ``env.now`` returns), so a SimPy release that changes those internals
must fail here rather than reorder a simulation silently."""

from __future__ import annotations

import pytest
import simpy

from disaggsim.engine.events import (
    Environment,
    call_in,
    call_later,
    call_soon,
    call_soon_after,
    call_urgent,
)


def _fire_order(use_call_in: bool) -> list[tuple[float, str]]:
    """Waits made in one order at several delays (ties included), each with either
    ``call_in`` or ``env.timeout``; returns the order they fire in."""
    env = simpy.Environment()
    seen: list[tuple[float, str]] = []

    def note(name: str):
        def noted(_ev: simpy.Event) -> None:
            assert env._now == env.now  # the engine's reading of the clock
            seen.append((env.now, name))

        return noted

    delays = [0.0, 1.0, 0.5, 1.0, 0.0, 0.5, 2.0, 1.0]
    for i, d in enumerate(delays):
        if use_call_in and i % 2 == 0:
            call_in(env, d, note(f"w{i}"))
        else:
            env.timeout(d).callbacks.append(note(f"w{i}"))
    call_later(env, 1.0, lambda: seen.append((env.now, "later")))
    call_urgent(env, note("urgent"))
    env.run()
    return seen


def test_call_in_queues_as_a_timeout_would() -> None:
    got = _fire_order(use_call_in=True)
    assert got == _fire_order(use_call_in=False)
    # the urgent call first; at each instant FIFO by creation
    assert got[0] == (0.0, "urgent")
    assert [n for t, n in got if t == 1.0] == ["w1", "w3", "w7", "later"]


def test_call_in_event_reads_as_processed() -> None:
    env = simpy.Environment()
    got: list[object] = []
    ev = call_in(env, 0.25, lambda e: got.append((env.now, e.ok, e.value)))
    env.run()
    assert got == [(0.25, True, None)]
    assert ev.processed


def _program(env: simpy.Environment) -> tuple[list[tuple[float, str]], object]:
    """A process, timeouts at tied instants, and an ``until`` event succeeded by a
    callback that is not its event's last (the rest run when the loop resumes); returns
    what fired, in order, and what ``run`` returned."""
    seen: list[tuple[float, str]] = []
    stop = env.event()

    def proc(env: simpy.Environment):
        for d in (0.5, 0.0, 1.0):
            yield env.timeout(d)
            seen.append((env.now, f"proc+{d}"))

    env.process(proc(env))
    ev = env.timeout(1.0)
    ev.callbacks.append(lambda _e: seen.append((env.now, "a")))
    ev.callbacks.append(lambda _e: stop.succeed("stopped"))
    ev.callbacks.append(lambda _e: seen.append((env.now, "b")))
    env.timeout(1.0).callbacks.append(lambda _e: seen.append((env.now, "c")))
    out = env.run(until=stop)
    seen.append((env.now, "returned"))
    env.run(until=env.timeout(5.0))
    return seen, out


def test_environment_runs_as_simpy_does() -> None:
    """The engine's Environment processes the same events in the same order as SimPy's,
    returns the same value, and crashes on the same undefused failure."""
    assert _program(Environment()) == _program(simpy.Environment())
    for make in (Environment, simpy.Environment):
        env = make()
        env.event().fail(ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            env.run(until=env.timeout(1.0))
        env = make()
        with pytest.raises(RuntimeError, match="No scheduled events left"):
            env.run(until=env.event())


def _due_now_program(env: simpy.Environment, soon) -> list[tuple[float, str]]:
    """Callbacks at tied instants that each schedule, in one order, events due now by
    ``soon``, SimPy timeouts of no delay, succeeded events, URGENT calls and later calls
    (one of them scheduling more events due now); returns the order they fire in."""
    seen: list[tuple[float, str]] = []

    def note(name: str):
        return lambda _ev: seen.append((env.now, name))

    def chain(name: str):
        def fired(_ev: simpy.Event) -> None:
            seen.append((env.now, name))
            soon(env, note(f"{name}.next"))
            call_in(env, 0.25, note(f"{name}.later"))

        return fired

    def burst(name: str):
        def fired(_ev: simpy.Event) -> None:
            seen.append((env.now, name))
            soon(env, note(f"{name}.s1"))
            env.timeout(0).callbacks.append(note(f"{name}.t0"))
            soon(env, chain(f"{name}.s2"))
            call_urgent(env, note(f"{name}.u"))
            ev = env.event()
            ev.callbacks.append(note(f"{name}.ev"))
            ev.succeed()
            call_in(env, 0.0, note(f"{name}.c0"))
            soon(env, note(f"{name}.s3"))

        return fired

    for i, d in enumerate((0.0, 1.0, 0.5, 1.0, 0.0)):
        call_in(env, d, burst(f"b{i}"))
    env.run(until=env.timeout(2.0))
    return seen


def test_events_due_now_keep_simpys_order() -> None:
    """Events due now wait in the engine's FIFO beside the heap: the same order as
    SimPy's heap gives them (``call_in`` with no delay), whatever else is due then."""
    got = _due_now_program(Environment(), call_soon)
    assert got == _due_now_program(simpy.Environment(), lambda env, fn: call_in(env, 0.0, fn))
    assert len(got) == 5 * 10  # every call fired
    # SimPy's own step, peek and run take them from the heap, in the same order
    env = Environment()
    seen: list[str] = []
    env.timeout(0).callbacks.append(lambda _e: seen.append("t0"))
    call_soon(env, lambda _e: seen.append("s"))
    call_urgent(env, lambda _e: seen.append("u"))
    assert env.peek() == 0.0
    env.step()
    env.run(until=1.0)
    assert seen == ["u", "t0", "s"]


def test_call_soon_after_fires_as_the_next_event_would() -> None:
    """A callback joined to the event due now queued last (nothing scheduled since) fires
    where its own ``call_soon`` event would: right after that event's callbacks, before
    anything those schedule, after what was due before; taken off, the rest still fire."""

    def program(join: bool) -> list[str]:
        env = Environment()
        seen: list[str] = []

        def first(_ev: simpy.Event) -> None:
            seen.append("first")
            call_soon(env, lambda _e: seen.append("scheduled by first"))
            call_in(env, 0.0, lambda _e: seen.append("timeout 0 by first"))

        def start(_ev: simpy.Event) -> None:
            call_in(env, 0.0, lambda _e: seen.append("due before"))
            ev = call_soon(env, first)
            if join:
                call_soon_after(ev, lambda _e: seen.append("second"))
            else:
                call_soon(env, lambda _e: seen.append("second"))

        call_in(env, 1.0, start)
        env.run(until=env.timeout(2.0))
        return seen

    assert program(join=True) == program(join=False)
    assert program(join=True) == [
        "due before",
        "first",
        "second",
        "scheduled by first",
        "timeout 0 by first",
    ]
    env = Environment()
    seen: list[str] = []
    ev = call_soon(env, lambda _e: seen.append("a"))
    b = lambda _e: seen.append("b")  # noqa: E731
    call_soon_after(ev, b)
    ev.callbacks.remove(b)  # as a failure takes its worker's callback off
    env.run(until=env.timeout(1.0))
    assert seen == ["a"]
