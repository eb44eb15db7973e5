"""Jobs in steps on an executor (disaggsim/sweep/executors.py, ``drive``): each job gets
exactly its own results whatever the executor, and with one that can submit a task at a
time a job's next step starts as soon as its own last one is back, not when every job's
is. The goodput search runs its scenarios that way, each with its own run-length rule."""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import Future

import pytest

from disaggsim.metrics.steady import RunLengthRule
from disaggsim.sweep import ProcessExecutor, SerialExecutor
from disaggsim.sweep.core import as_source
from disaggsim.sweep.executors import drive
from disaggsim.sweep.goodput import goodput_many
from tests.one_server import one_server, patch_constant_cost


def _square(x: int) -> int:
    return x * x


def _raise_or_die(x: int) -> int:
    """Task 1 raises; task 2 kills its worker process; the rest take a moment."""
    if x == 1:
        raise ValueError(f"task {x}")
    if x == 2:
        os._exit(3)
    time.sleep(0.5)
    return x


def _nap_free(task: tuple[float, int]) -> int:
    """A task that takes ``task[0]`` seconds of a :class:`VirtualPool`'s clock."""
    return task[1]


def _nap(task: tuple[float, int]) -> int:
    time.sleep(task[0])
    return task[1]


class MapOnly:
    """An executor that can only map (as Dask here): ``drive`` runs it in rounds."""

    def __init__(self) -> None:
        self.calls = 0

    def map(self, fn, tasks, on_done=None):
        self.calls += 1
        return SerialExecutor().map(fn, tasks, on_done)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class VirtualPool:
    """An executor with ``workers`` virtual workers and a clock (as
    benchmarks/plan_cost.py's): a task runs here at once, takes ``cost(task)`` seconds of
    the clock on the first free worker in the order sent, and comes back when the clock
    says. ``sent`` records the tasks in the order sent; ``most_out`` the most out at once."""

    def __init__(self, workers: int, cost=lambda t: t[0]) -> None:
        self.workers, self.cost = workers, cost
        self.now = 0.0
        self.sent: list = []
        self.most_out = 0
        self._free = [0.0] * workers
        self._queue: list = []  # sent, not started: (future, fn, task)
        self._ends: dict = {}  # started: future -> (end, worker)

    def submit(self, fn, task):
        f: Future = Future()
        self.sent.append(task)
        self._queue.append((f, fn, task))
        self.most_out = max(self.most_out, len(self._queue) + len(self._ends))
        self._start()
        return f

    def _start(self) -> None:
        while self._queue and len(self._ends) < self.workers:
            busy = {w for _, w in self._ends.values()}
            w = next(i for i in range(self.workers) if i not in busy)
            f, fn, t = self._queue.pop(0)
            f.set_result(fn(t))
            self._free[w] = max(self.now, self._free[w]) + self.cost(t)
            self._ends[f] = (self._free[w], w)

    def wait_first(self, futures):
        f = min((g for g in futures if g in self._ends), key=lambda g: self._ends[g][0])
        self.now = self._ends.pop(f)[0]
        self._start()
        return {f}

    def map(self, fn, tasks, on_done=None):
        raise AssertionError("drive submits")

    def close(self) -> None:
        pass


class Steps:
    """A job of fixed steps: step k sends ``steps[k]``; it keeps what came back."""

    def __init__(self, name: str, steps: list[list], log: list[str]) -> None:
        self.name, self.steps, self.log = name, steps, log
        self.got: list[list] = []

    def advance(self, results):
        if results is not None:
            self.got.append(results)
            self.log.append(self.name)
        return self.steps[len(self.got)] if len(self.got) < len(self.steps) else []


class Ranked(Steps):
    """A job of fixed steps that says how much work it has left: the sum of its
    remaining steps' task durations."""

    def priority(self) -> float:
        return sum(t[0] for step in self.steps[len(self.got) :] for t in step)


def test_each_job_gets_its_own_results_in_order_whatever_the_executor():
    plan = {"a": [[1, 2, 3], [4], [5, 6]], "b": [[7]], "c": [], "d": [[8, 9], [10, 11, 12]]}
    want = {k: [[x * x for x in step] for step in v] for k, v in plan.items()}
    for ex in (SerialExecutor(), MapOnly(), ProcessExecutor(2)):
        jobs = [Steps(k, v, []) for k, v in plan.items()]
        done: list[int] = []
        with ex:
            drive(ex, _square, jobs, lambda d=done: d.append(1))
        assert {j.name: j.got for j in jobs} == want, type(ex).__name__
        assert len(done) == 12
    m = MapOnly()
    drive(m, _square, [Steps(k, v, []) for k, v in plan.items()])
    assert m.calls == 3  # rounds: as many as the longest job has steps


def test_a_job_does_not_wait_for_another_jobs_slow_run():
    """Job ``quick`` takes three steps of one 0.05 s task; ``slow`` one task of 3 s. On
    two workers ``quick`` is done long before ``slow``; in rounds it would wait for
    ``slow`` after its first step."""
    log: list[str] = []
    jobs = [Steps("slow", [[(3.0, 0)]], log), Steps("quick", [[(0.05, k)] for k in range(3)], log)]
    with ProcessExecutor(2) as ex:
        drive(ex, _nap, jobs)
    assert log == ["quick", "quick", "quick", "slow"]
    log.clear()
    jobs = [Steps("slow", [[(0.2, 0)]], log), Steps("quick", [[(0.0, k)] for k in range(3)], log)]
    drive(MapOnly(), _nap, jobs)
    assert log == ["slow", "quick", "quick", "quick"]  # in rounds: after the first


def test_ranked_jobs_send_the_longest_chain_first():
    """Four jobs of one 1-s task each, then one of three 1-s tasks in a row, on two
    workers. Sent as they come (no ``priority``), the chain starts after the four and
    ends at 5 s; ranked by the work left, it starts at once and every run is done at 4 s,
    the least two workers can (7 runs). No more than a task per worker and one more are
    out at once; each job gets the same results either way."""
    steps = {"b": [[(1.0, 1)]], "c": [[(1.0, 2)]], "d": [[(1.0, 3)]], "e": [[(1.0, 4)]],
             "chain": [[(1.0, 5)], [(1.0, 6)], [(1.0, 7)]]}  # fmt: skip
    got = {}
    for kind in (Steps, Ranked):
        log: list[str] = []
        jobs = [kind(k, v, log) for k, v in steps.items()]
        ex = VirtualPool(2)
        drive(ex, _nap_free, jobs)
        got[kind] = ({j.name: j.got for j in jobs}, ex.now, [t[1] for t in ex.sent], ex.most_out)
    assert (
        got[Steps][0]
        == got[Ranked][0]
        == {k: [[t[1] for t in step] for step in v] for k, v in steps.items()}
    )
    assert got[Steps][1] == 5.0 and got[Steps][2] == [1, 2, 3, 4, 5, 6, 7]
    assert got[Ranked][1] == 4.0 and got[Ranked][2] == [5, 1, 2, 6, 3, 4, 7]
    assert got[Steps][3] == 5 and got[Ranked][3] == 3  # all at once; 2 workers + 1


def test_ranking_ties_keep_the_job_order_and_serial_runs_everything():
    """Jobs of equal priority go in their order; an executor without ``workers`` (serial)
    gets every task as soon as its job gives it, ranked or not."""
    log: list[str] = []
    jobs = [Ranked(k, [[(1.0, i)]], log) for i, k in enumerate("abc")]
    ex = VirtualPool(1)
    drive(ex, _nap_free, jobs)
    assert [t[1] for t in ex.sent] == [0, 1, 2] and log == ["a", "b", "c"]
    jobs = [Ranked("a", [[(1.0, 0)], [(1.0, 1)]], []), Ranked("b", [[(5.0, 2)]], [])]
    drive(SerialExecutor(), _nap_free, jobs)
    assert [j.got for j in jobs] == [[[0], [1]], [[2]]]


def test_a_failed_task_is_raised():
    def bad(x: int) -> int:
        raise ValueError(f"task {x}")

    with pytest.raises(ValueError, match="task 1"):
        drive(SerialExecutor(), bad, [Steps("a", [[1]], [])])


# ------------------------------------------------------------------ goodput searches


def test_goodput_many_with_a_rule_per_scenario_is_each_search_alone(monkeypatch):
    """Two scenarios with different run-length rules searched together give, each, what
    it gives searched alone with its rule, with a submitting executor or in rounds."""
    patch_constant_cost(monkeypatch)
    a, b = as_source(one_server(2.0)), as_source(one_server(0.6))
    ra = RunLengthRule(min_measured_requests=150)
    rb = RunLengthRule(min_measured_requests=300, service_multiple=20.0)

    def key(r):
        return [
            (e.rate_per_s, e.meets, e.duration_s, e.confirm, e.attainment) for e in r.evaluations
        ]

    kw = {"tol_per_s": 0.2, "brackets": [(2.0, 20.0), (1.0, 12.0)]}
    alone = [
        goodput_many([a], 2.0, 20.0, tol_per_s=0.2, rule=ra, executor=SerialExecutor())[0],
        goodput_many([b], 1.0, 12.0, tol_per_s=0.2, rule=rb, executor=SerialExecutor())[0],
    ]
    assert key(alone[0]) != key(alone[1])
    for ex in (SerialExecutor(), MapOnly()):
        both = goodput_many([a, b], 0, 0, rules=[ra, rb], executor=ex, **kw)  # type: ignore[arg-type]
        assert [key(r) for r in both] == [key(r) for r in alone]
        assert [dataclasses.replace(r, evaluations=()) for r in both] == [
            dataclasses.replace(r, evaluations=()) for r in alone
        ]


def test_a_worker_killed_after_a_stop_raises_nothing_in_the_pools_thread(monkeypatch):
    """A stop sent to the whole process group (Ctrl-C in a terminal, `timeout`, a
    service manager) reaches the workers too: the command cancels the tasks still out and
    a worker dies of the signal. Python 3.11's pool then sets every pending task's
    exception and, on a task cancelled meanwhile, raised InvalidStateError in its own
    thread: a traceback printed before the stop's one line (`sweep` of 5,000 points under
    `timeout 7`). The futures the executor hands out are its own: cancelling one leaves
    the pool's task to the pool, which cancels it itself when the executor closes."""
    import signal
    import threading

    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    ex = ProcessExecutor(1)
    try:
        futures = [ex.submit(_nap, (0.3, i)) for i in range(20)]
        time.sleep(0.5)  # the first task runs, the rest wait in the pool
        for f in futures:
            f.cancel()  # as a stop does (executors._cancelled_on_failure)
        assert ex._pool is not None
        for proc in list(ex._pool._processes.values()):
            os.kill(proc.pid, signal.SIGTERM)  # the group's stop reaches the worker
        time.sleep(1.0)  # the pool's thread sees the dead worker
    finally:
        ex.close()
    assert raised == []
    assert all(f.cancelled() for f in futures[1:])


def test_a_stop_while_waiting_leaves_no_task_locked(monkeypatch):
    """A stop's exception is raised between any two steps of this thread. Waiting with
    ``concurrent.futures.wait`` takes every future's lock in turn and gives them back
    after: a stop in between left locks taken, and the pool's thread, cancelling the
    waiting tasks as the executor closed (or failing them as a killed worker broke the
    pool), waited for one of those locks forever; the stopped command never ended
    (`sweep` of 5,000 points under `timeout 10`). Here that window is held open: were the
    executor to wait that way, the stop would come while it holds the locks."""
    import signal
    import threading
    from concurrent.futures import _base

    taking = _base._AcquireFutures.__enter__

    def slow_take(self):  # the stop comes while the futures' locks are taken
        taking(self)
        time.sleep(1.0)

    monkeypatch.setattr(_base._AcquireFutures, "__enter__", slow_take)

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, stop)
    ex = ProcessExecutor(1)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            ex.map(_nap, [(0.05, i) for i in range(200)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    closing = threading.Thread(target=ex.close, daemon=True)
    closing.start()
    closing.join(timeout=30.0)
    assert not closing.is_alive(), "the executor's pool waited for a lock the stop left taken"


def test_a_second_stop_does_not_cut_the_cancelling_short(monkeypatch):
    """`timeout` signals the command and then its whole process group: the command gets
    the stop twice, the second while the first's cleanup cancels the tasks still out (a
    cancel takes the task's lock; a stop raised while one held it left it taken). The
    stop is held back until every task is cancelled, then raised."""
    import signal

    from disaggsim.sweep.executors import _cancel_all

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    class SecondStop(Future):
        def cancel(self) -> bool:
            os.kill(os.getpid(), signal.SIGTERM)  # the group's copy of the stop
            return super().cancel()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        futures = [Future() for _ in range(50)]
        futures[10] = SecondStop()
        with pytest.raises(Stopped):
            _cancel_all(futures)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert all(f.cancelled() for f in futures)


def test_a_stopped_executor_ends_its_running_tasks_at_once():
    """A stop sent to the command alone (`kill PID`) reaches no worker: closing the pool
    waited for every running simulation to finish (51 s for a sweep of two 150,000 s
    runs), whose results were not kept either. Left by a failure or a stop, the executor
    ends its workers at once."""
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), ProcessExecutor(2) as ex:
        [ex.submit(_nap, (60.0, i)) for i in range(2)]
        time.sleep(1.0)  # both tasks run
        assert ex._pool is not None
        procs = list(ex._pool._processes.values())
        raise KeyboardInterrupt
    assert time.monotonic() - start < 30.0  # the tasks would run 60 s
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)


def test_a_process_executors_failure_is_raised_and_a_dead_worker_named():
    """With worker processes, map and drive raise a task's own failure, and a worker
    that dies becomes the one-line error saying so (not a BrokenProcessPool)."""
    for run in (
        lambda ex, xs: ex.map(_raise_or_die, xs),
        lambda ex, xs: drive(ex, _raise_or_die, [Steps("a", [xs], [])]),
    ):
        with ProcessExecutor(2) as ex, pytest.raises(ValueError, match="task 1"):
            run(ex, [0, 1, 0])
        with ProcessExecutor(2) as ex, pytest.raises(RuntimeError, match="worker process died"):
            run(ex, [0, 2, 0])
