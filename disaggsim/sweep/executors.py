"""Where sweep points run: in process, in local worker processes, or on a Dask cluster.

Every executor has one method, :meth:`Executor.map`, which runs a picklable top-level
function over a list of picklable tasks and returns the results **in task order**, so a
sweep's table does not depend on which executor (or how many workers) produced it. The
``on_done`` callback is called once per finished task, in completion order (progress).

Executors that hold workers (a process pool, a Dask client) are context managers; they
start their workers on first use and release them on ``close()``.

Work whose next tasks depend on earlier results (the goodput search: each scenario's next
rate depends on its last) goes through :func:`drive`: with an executor that can
``submit`` one task (:class:`SerialExecutor`, :class:`ProcessExecutor`), each job's next
tasks are sent as soon as its own last ones finish, so a worker is never left idle
waiting for other jobs' runs; with one that can only ``map`` (Dask, test doubles), in
rounds, every job's next tasks in one call. A job may say how much work it has left
(``priority()``, e.g. its expected CPU seconds): then ``drive`` keeps one task per worker
and one more out, and sends the waiting task of the job with the most work left first
(longest first: a long chain of runs started last leaves the other workers idle at the
end while it finishes).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import math
import multiprocessing
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import (
    CancelledError,
    Future,
    InvalidStateError,
    ProcessPoolExecutor,
)
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from queue import Empty, SimpleQueue
from typing import Any, Protocol, TypeVar

from disaggsim.errors import UserError, WorkersLost, command_line_running, given
from disaggsim.stops import stops_held

T = TypeVar("T")
R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)
R_contra = TypeVar("R_contra", contravariant=True)
OnDone = Callable[[], None]
# called once per finished task with its index in ``tasks`` and its result, in completion
# order, before the next finished task is handled (a sweep's journal of finished runs)
OnResult = Callable[[int, Any], None]

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"


class Executor(Protocol):
    def map(
        self, fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None
    ) -> list[R]: ...

    def close(self) -> None: ...


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # a failure or a stop: the command ends
            self.abandon()

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        """Close after a failure or a stop, not waiting for what still runs."""
        self.close()


class SerialExecutor(_Closing):
    """Runs tasks one after another in this process (tests, notebooks, debugging)."""

    def submit(self, fn: Callable[[Any], Any], task: Any) -> Future:
        """Run ``task`` now; a finished future holds its result (or its exception)."""
        f: Future = Future()
        try:
            f.set_result(fn(task))
        except Exception as e:  # re-raised by f.result(), as a pool's future would
            f.set_exception(e)
        return f

    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        on_done: OnDone | None = None,
        on_result: OnResult | None = None,
    ) -> list[Any]:
        out = []
        for i, t in enumerate(tasks):
            out.append(fn(t))
            if on_result is not None:
                on_result(i, out[-1])
            if on_done is not None:
                on_done()
        return out


def check_executor(executor: Any) -> None:
    """An ``executor=`` argument of the Python API is None or has ``map`` (a string or a
    class raised AttributeError deep inside the sweep)."""
    if executor is not None and (
        isinstance(executor, type) or not callable(getattr(executor, "map", None))
    ):
        raise UserError(
            "executor: give SerialExecutor(), ProcessExecutor(n), DaskExecutor(...) or "
            f"None, got {type(executor).__name__} {' '.join(str(executor).split())[:40]}"
        )


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


# ``executor=None`` runs at most this many tasks at once in this process
SERIAL_MAX_TASKS = 4

_DIED = (
    "a sweep worker process died. Workers re-import the script that started "
    'them: put its top-level code under `if __name__ == "__main__":`, or pass '
    "executor=SerialExecutor(). (Otherwise a worker may have run out of memory.)"
)


def default_executor(max_parallel_tasks: int) -> SerialExecutor | ProcessExecutor:
    """What ``executor=None`` means for work that sends at most ``max_parallel_tasks``
    tasks to the executor at once: up to :data:`SERIAL_MAX_TASKS`, this process
    (:class:`SerialExecutor`: no worker start-up, which costs about as much as a small
    simulation, and a script needs no ``if __name__ == "__main__":`` guard); above it, a
    local :class:`ProcessExecutor`, whose workers re-import a script's top-level code, so
    a script needs the guard (or an explicit ``SerialExecutor()``)."""
    if max_parallel_tasks <= SERIAL_MAX_TASKS:
        return SerialExecutor()
    return ProcessExecutor()


@contextmanager
def given_or_default(executor: Executor | None, max_parallel_tasks: int) -> Iterator[Executor]:
    """``executor`` as given, left open for its owner; or, for ``None``, a
    :func:`default_executor` of the work's own, closed on the way out, and after a
    failure or a stop abandoned (its workers end at once instead of finishing what they
    run, and what they would return is lost anyway)."""
    if executor is not None:
        yield executor
        return
    with default_executor(max_parallel_tasks) as own:
        yield own


class ProcessExecutor(_Closing):
    """A local pool of worker processes (``concurrent.futures.ProcessPoolExecutor``).

    Workers are started with ``forkserver`` (``spawn`` where that is unavailable): a
    fork of a process that already runs threads (a progress bar, a Dask client) is
    unsafe."""

    def __init__(self, workers: int | None = None) -> None:
        n = default_workers() if workers is None else workers
        where = given("--workers", "ProcessExecutor(workers={})", n)
        if n < 1:
            raise UserError(f"{where}: must be >= 1")
        from disaggsim.config.bounds import MAX_WORKERS_PER_CPU, max_local_workers

        if n > max_local_workers():
            raise UserError(
                f"{where}: at most {max_local_workers()} worker processes on this "
                f"machine ({MAX_WORKERS_PER_CPU} per CPU, {os.cpu_count() or 1} CPUs; each "
                "holds the simulator: docs/safety.md)"
            )
        self.workers = n
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=ctx,
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        return self._pool

    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        on_done: OnDone | None = None,
        on_result: OnResult | None = None,
    ) -> list[Any]:
        finished: SimpleQueue[Future] = SimpleQueue()
        futures: list[Future] = []
        with _cancelled_on_failure(futures):
            for t in tasks:
                futures.append(self.submit(fn, t))
                _put_when_done(futures[-1], finished)
            index = {f: i for i, f in enumerate(futures)}
            pending = set(futures)
            while pending:
                done = _first_finished(finished, pending)
                pending -= done
                # in task order: which of several finished tasks is handled first is no accident
                for f in sorted(done, key=index.__getitem__):
                    result = f.result()  # raise the first failure now
                    if on_result is not None:
                        on_result(index[f], result)
                    if on_done is not None:
                        on_done()
        return [f.result() for f in futures]

    def submit(self, fn: Callable[[Any], Any], task: Any) -> Future:
        """A future of this executor's own that takes the pool task's outcome. Cancelling
        it leaves the pool's task alone: the pool cancels the tasks still waiting itself,
        in its own thread, when the executor closes (``shutdown(cancel_futures=True)``).
        Python 3.11's pool, when a worker dies (a stop sent to the whole process group
        reaches the workers too: Ctrl-C in a terminal, ``timeout``, a service manager), sets
        every waiting task's exception, and on one cancelled from here meanwhile it raised
        InvalidStateError in its thread: a traceback printed before the stop's one line."""
        out: Future = Future()
        pool = self._get_pool()
        with stops_held():  # a stop here would leave the task's lock taken (_first_finished)
            pool.submit(fn, task).add_done_callback(lambda done: _take(out, done))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def abandon(self) -> None:
        """End the workers at once (SIGTERM) instead of waiting for their simulations: a
        stop sent to this process alone (`kill PID`) waited for every running simulation
        to finish before the command ended (51 s for a sweep of two 150,000 s runs, whose
        results were not kept either). The pool's task processes are its private
        ``_processes`` (Python 3.10-3.13 name them so; a pool without them is closed as
        before)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=not procs, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(timeout=5.0)
        if manager is not None:
            manager.join(timeout=5.0)


def settle(set_: Callable[[Any], None], value: Any) -> None:
    """``set_(value)`` (a future's ``set_result`` or ``set_exception``), unless its caller
    cancelled that future meanwhile: then nobody waits for it."""
    try:
        set_(value)
    except InvalidStateError:
        pass


def _take(out: Future, done: Future) -> None:
    """Give ``out`` the outcome of ``done``."""
    if done.cancelled():
        out.cancel()
    elif (exc := done.exception()) is not None:
        settle(out.set_exception, exc)
    else:
        settle(out.set_result, done.result())


def _exit_with_parent(parent_pid: int) -> None:
    """Worker side, at start: end this worker process when ``parent_pid`` (the process
    that made the pool) ends. A pool's workers are the forkserver's children, not the
    parent's, and they hold both ends of the task queue themselves, so after a SIGKILL of
    the parent (which runs no cleanup) they finished the simulation they held, then
    waited for tasks forever, keeping the forkserver and the resource tracker alive too
    (the forkserver exits once its last child has closed the pipes it shares with it)."""
    import threading

    def watch() -> None:
        try:
            import select

            fd = os.pidfd_open(parent_pid)  # Linux 5.3+: readable once the process ends
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])
        else:  # another system: look once a second
            import time

            while True:
                try:
                    os.kill(parent_pid, 0)
                except ProcessLookupError:
                    break
                except OSError:
                    pass
                time.sleep(1.0)
        os._exit(1)

    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        os._exit(1)  # the parent is gone already
    except OSError:
        pass
    threading.Thread(target=watch, name="disaggsim-exit-with-parent", daemon=True).start()


class DaskExecutor(_Closing):
    """Tasks on a Dask cluster through ``dask.distributed``.

    Give a scheduler ``address`` (``tcp://host:port``; the client is created on first
    use and closed by :meth:`close`) or an existing ``client`` (left open). Workers need
    disaggsim installed (the same version) and any trace files a scenario reads."""

    def __init__(
        self, address: str | None = None, client: Any = None, wait_workers_s: float | None = None
    ) -> None:
        if (address is None) == (client is None):
            raise ValueError("DaskExecutor needs exactly one of address or client")
        self.address = address
        self._client = client
        self._owns_client = client is None
        # the address came from $DASK_SCHEDULER_ADDRESS (make_executor): errors name it
        self._from_environment = False
        self.wait_workers_s = wait_workers(wait_workers_s)

    def _get_client(self):
        if self._client is None:
            try:
                from distributed import Client
            except ImportError:
                raise UserError(
                    f"{self._where()}: dask.distributed is not installed (pip install "
                    "'disaggsim[dask]')"
                ) from None
            assert self.address is not None
            _probe(self.address, self._where())
            try:
                self._client = Client(self.address, timeout=f"{CONNECT_TIMEOUT_S}s")
            except (OSError, TimeoutError) as e:
                raise UserError(f"{self._where()}: cannot connect ({e})") from None
            except TypeError as e:
                # tls:// without dask's TLS configuration (distributed.comm.tls): a traceback
                why = " ".join(str(e).split())[:160]
                raise UserError(f"{self._where()}: cannot connect ({why})") from None
            except ValueError as e:  # tcp:// without a port, an unknown scheme: a traceback
                why = " ".join(str(e).split())[:120]
                raise UserError(
                    f"{self._where()}: not a scheduler address ({why}); expected tcp://host:port"
                ) from None
        return self._client

    def _shown(self) -> str:
        """The scheduler's address as dask knows it (a client's too)."""
        if self.address is not None:
            return self.address
        return str(getattr(getattr(self._client, "scheduler", None), "address", "") or "?")

    def _where(self) -> str:
        if self.address is None:
            return "the Dask cluster"
        if self._from_environment:
            return f"{SCHEDULER_ENV}={self.address}"
        return given("--scheduler", "DaskExecutor(address={})", self.address)

    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        on_done: OnDone | None = None,
        on_result: OnResult | None = None,
    ) -> list[Any]:
        """As the other executors' (module docstring). A task whose workers all died
        while running it (dask's ``KilledWorker``) and a lost scheduler are
        :class:`WorkersLost` (one line; it was a traceback of dask's), a task's own
        exception is raised as it is."""
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        client = self._get_client()
        futures = client.map(fn, list(tasks), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        failure: BaseException | None = None
        watch = _WorkerWatch(client, self.wait_workers_s, self._where(), self._shown())
        try:
            done = as_completed(futures)
            while not done.is_empty():
                if not done.has_ready():
                    # a scheduler without workers holds the tasks forever: bounded
                    watch.check()
                    _wait_a_little(done)
                    continue
                f = next(done)
                if f.status == "error":
                    exc = f.exception()
                    if isinstance(exc, KilledWorker):
                        raise WorkersLost(
                            f"{self._where()}: a run's workers died each time it was "
                            "started (dask's KilledWorker); a worker may have run out of "
                            "memory or been stopped"
                        ) from None
                    failure = exc  # the task's own exception, raised below as it is
                    break
                if f.status == "cancelled":  # not by us: the scheduler went away
                    raise WorkersLost(f"{self._where()}: lost the connection to the scheduler")
                i = index[f.key]
                results[i] = f.result()
                if on_result is not None:
                    on_result(i, results[i])
                if on_done is not None:
                    on_done()
        except WorkersLost:
            _cancel_quietly(client, futures)
            raise
        except (OSError, TimeoutError, asyncio.CancelledError, CancelledError) as e:
            # the client's own calls (a task's exceptions are raised below): the scheduler
            # or the network went away while results were fetched
            _cancel_quietly(client, futures)
            raise WorkersLost(
                f"{self._where()}: lost the connection to the scheduler ({_one_line(e, 120)})"
            ) from None
        except BaseException:
            _cancel_quietly(client, futures)
            raise
        if failure is not None:
            _cancel_quietly(client, futures)
            raise failure
        return results

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None


# how long a Dask scheduler may take to answer (dask's connect timeout), and how long a
# scheduler may have no worker while runs wait for one (--wait-workers-s,
# $DISAGGSIM_WAIT_WORKERS_S): a scheduler without workers held the runs forever
CONNECT_TIMEOUT_S = 10
WAIT_WORKERS_S = 60.0
WAIT_WORKERS_ENV = "DISAGGSIM_WAIT_WORKERS_S"
# a wait is said on stderr (the command line) once it has lasted this long
_SAY_WAITING_AFTER_S = 5.0


def wait_workers(value: float | None, environ: Mapping[str, str] | None = None) -> float:
    """The bound on a Dask scheduler's time without workers: ``value`` (``--wait-workers-s``,
    ``DaskExecutor(wait_workers_s=...)``), else ``$DISAGGSIM_WAIT_WORKERS_S``, else
    :data:`WAIT_WORKERS_S`; a finite number of seconds > 0 (one-line error)."""
    env = os.environ if environ is None else environ
    if value is not None:
        where = given("--wait-workers-s", "wait_workers_s", value)
    elif env.get(WAIT_WORKERS_ENV, "").strip():
        text = env[WAIT_WORKERS_ENV]
        where = f"{WAIT_WORKERS_ENV}={text}"
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"{where}: expected a number of seconds > 0") from None
    else:
        return WAIT_WORKERS_S
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: expected a number of seconds > 0")
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise UserError(f"{where}: must be a number of seconds > 0 and at most {MAX_WAIT_S:,}")
    return float(value)


MAX_WAIT_S = 30 * 86_400  # 30 days, as the longest simulated duration


def _say(text: str) -> None:
    """A note on stderr while the command line waits (the Python API waits silently)."""
    import sys

    if command_line_running():
        print(f"disaggsim: {text}", file=sys.stderr, flush=True)


def _probe(address: str, where: str) -> None:
    """Fail at once where a scheduler address refuses the connection or names no host
    (dask retried a refused connection for its whole 10 s connect timeout, silently), say
    what the command waits for when the host does not answer at once, and refuse a server
    that is not a Dask scheduler: a scheduler sends its handshake as soon as it accepts a
    connection, a message of a few hundred bytes whose first 8 bytes are its length (an
    HTTP server, such as the dashboard's port, waited for a request, and dask's client
    waited for its reply forever; a server that sends text first, such as SSH, had its
    text read as a length of exabytes: "out of memory", exit 4)."""
    import socket
    import time

    scheme, _, rest = address.partition("://")
    if scheme not in ("tcp", "tls") or not rest:
        return  # dask's own errors (an unknown scheme, inproc://, ws://)
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return  # dask says what is wrong with it
    limit_s = _handshake_wait_s()

    def connect(timeout_s: float) -> socket.socket:
        try:
            return socket.create_connection((host, int(port_text)), timeout=timeout_s)
        except ConnectionRefusedError:
            raise UserError(
                f"{where}: cannot connect (connection refused: no scheduler listens there)"
            ) from None
        except socket.gaierror as e:
            why = e.strerror or str(e)
            raise UserError(f"{where}: cannot connect (unknown host: {why})") from None
        except TimeoutError:
            raise
        except OSError as e:
            raise UserError(f"{where}: cannot connect ({e.strerror or e})") from None

    try:
        sock = connect(1.0)
    except TimeoutError:
        _say(f"waiting up to {limit_s:g} s for the Dask scheduler at {address} to answer")
        try:
            sock = connect(max(limit_s - 1.0, 0.1))
        except TimeoutError:
            raise UserError(f"{where}: cannot connect (no answer in {limit_s:g} s)") from None
    with sock:
        if scheme == "tls":
            return  # the client speaks first there (TLS): dask checks the rest
        # the greeting's own bound, from the accepted connection: a scheduler writes it at
        # once, so a silent server is not waited on for the whole connect timeout (30 s)
        start = time.monotonic()
        greet_s = min(GREETING_WAIT_S, limit_s)
        head = b""
        said = False
        while len(head) < 8:
            waited = time.monotonic() - start
            if waited >= greet_s:
                raise UserError(
                    f"{where}: cannot connect (the server there accepted the connection but "
                    f"sent nothing in {greet_s:g} s, where a Dask scheduler answers at once; "
                    "the scheduler's port is usually 8786, its dashboard's 8787)"
                )
            if waited >= 1.0 and not said:
                said = True
                _say(f"waiting up to {greet_s:g} s for the Dask scheduler at {address} to answer")
            sock.settimeout(min(1.0, greet_s - waited))
            try:
                got = sock.recv(8 - len(head))
            except TimeoutError:
                continue
            except OSError as e:
                raise UserError(f"{where}: cannot connect ({e.strerror or e})") from None
            if not got:
                raise UserError(
                    f"{where}: cannot connect (the server there closed the connection at "
                    "once: not a Dask scheduler)"
                )
            head += got
    if int.from_bytes(head, "little") > _MAX_HANDSHAKE_BYTES:
        shown = head.decode("ascii", "replace")
        raise UserError(
            f"{where}: cannot connect (the server there is not a Dask scheduler: it sent "
            f"{shown!r}...; the scheduler's port is usually 8786, its dashboard's 8787)"
        )


# a scheduler's handshake is a few hundred bytes; the first 8 bytes of other servers'
# greetings read as lengths of petabytes
_MAX_HANDSHAKE_BYTES = 2**26
# how long a server that accepted the connection may take to send its first bytes: a Dask
# scheduler writes its handshake as soon as it accepts (within milliseconds, measured on a
# loaded 2-core machine: docs/safety.md); one that says nothing is not a scheduler (an HTTP
# server, such as the dashboard's port, waits for a request). It waited dask's whole
# connect timeout, 30 s by default.
GREETING_WAIT_S = 5.0


def _handshake_wait_s() -> float:
    """How long a scheduler may take to answer: dask's connect timeout (its
    configuration, ``distributed.comm.timeouts.connect``, 30 s by default), at least
    :data:`CONNECT_TIMEOUT_S`."""
    try:
        import dask.config
        from dask.utils import parse_timedelta

        value = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
        return max(float(value), float(CONNECT_TIMEOUT_S))
    except Exception:  # dask absent or a configuration it cannot read: dask says so later
        return float(CONNECT_TIMEOUT_S)


class _WorkerWatch:
    """Whether a Dask scheduler has had no worker for longer than ``limit_s`` while runs
    wait (then :class:`WorkersLost`): asked at most once a second."""

    def __init__(self, client: Any, limit_s: float, where: str, address: str) -> None:
        import time

        self.client, self.limit_s, self.where, self.address = client, limit_s, where, address
        self.clock = time.monotonic
        self.seen_at = self.clock()  # when a worker was last seen
        self.next_at = self.seen_at  # ask now, the first time
        self.said = False

    def check(self) -> None:
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + 1.0
        if _num_workers(self.client) > 0:
            self.seen_at, self.said = now, False
            return
        idle = now - self.seen_at
        if idle >= self.limit_s:
            longer = "--wait-workers-s" if command_line_running() else "wait_workers_s="
            raise WorkersLost(
                f"{self.where}: the scheduler has had no worker for {self.limit_s:g} s, so "
                f"no run could go on; start workers (dask worker {self.address}), or wait "
                f"longer with {longer} or ${WAIT_WORKERS_ENV}"
            )
        if not self.said and _SAY_WAITING_AFTER_S <= idle < self.limit_s:
            self.said = True
            _say(
                f"the Dask scheduler at {self.address} has no worker; waiting up to "
                f"{self.limit_s:g} s for one"
            )


def _num_workers(client: Any) -> int:
    info = client.scheduler_info(n_workers=1)
    n = info.get("n_workers")
    return int(n) if isinstance(n, int) else len(info.get("workers", {}))


def _wait_a_little(done: Any) -> None:
    """Until a run finishes (``as_completed`` is told) or a quarter second passes."""
    cond = getattr(done, "thread_condition", None)
    if cond is None:
        import time

        time.sleep(0.05)
        return
    with cond:
        if not done.has_ready():
            cond.wait(timeout=0.25)


def _one_line(e: BaseException, limit: int) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cancel_quietly(client: Any, futures: list[Any]) -> None:
    """Cancel what is still out; a client that lost its scheduler cannot, and need not."""
    try:
        client.cancel(futures)
    except Exception:
        pass


class Job(Protocol[T_co, R_contra]):
    """Work in steps: ``advance(None)`` gives the first tasks, ``advance(results)`` (the
    results of the tasks it gave last, in their order) the next ones; ``[]``: done."""

    def advance(self, results: Sequence[R_contra] | None) -> Sequence[T_co]: ...

    # optional: ``priority() -> float``, the work the job has left after ``advance``
    # (any unit shared by the jobs; read once per step): :func:`drive` sends the waiting
    # task of the job with the most first


def _put_when_done(f: Future, finished: SimpleQueue[Future]) -> None:
    """Put ``f`` on ``finished`` when it is done (at once if it is)."""
    with stops_held():  # a stop here would leave the future's lock taken (_first_finished)
        f.add_done_callback(finished.put)


def _first_finished(finished: SimpleQueue[Future], futures: Collection[Future]) -> set[Future]:
    """Those of ``futures`` that have finished, at least one (waiting for it), read from
    ``finished``, the queue :func:`_put_when_done` puts each of them on (a future not among
    ``futures``, one given up, is dropped). Not ``concurrent.futures.wait``: that takes
    every future's lock in turn, and a stop (its exception raised between two of those
    steps) left locks taken; the pool's thread then waited for one forever as it set a
    result or cancelled a task, and the stopped command with it (`sweep` of 5,000 points
    under `timeout 10`). Blocked here, this thread holds no future's lock."""
    want = set(futures)
    while True:
        done = {finished.get()}
        while True:
            try:
                done.add(finished.get_nowait())
            except Empty:
                break
        if mine := done & want:
            return mine


def drive(
    ex: Executor, fn: Callable[[T], R], jobs: Sequence[Job[T, R]], on_done: OnDone | None = None
) -> None:
    """Advance every job until it gives no more tasks (module docstring). Each job sees
    exactly the results of its own tasks, in order, whatever the executor: the outcome
    does not depend on which tasks ran when. ``on_done`` is called once per finished task.

    Order: with jobs that have a ``priority()`` and an executor that says how many
    ``workers`` it has, at most that many tasks and one more are out at once (the extra
    one in the executor's queue) and a freed place goes to the waiting task of the job
    with the highest priority (ties: the job first in ``jobs``, then its tasks in
    order); otherwise every task is sent when its job gives it."""
    submit = getattr(ex, "submit", None)
    # an executor may keep its own clock (benchmarks/plan_cost.py replays the runs' CPU
    # seconds on virtual workers): then it says which of its futures finishes first
    wait_first = getattr(ex, "wait_first", None)
    # else each future is put on a queue as it finishes (_first_finished)
    finished: SimpleQueue[Future] | None = None
    if wait_first is None:
        finished = SimpleQueue()
        wait_first = functools.partial(_first_finished, finished)
    if submit is None:
        todo = [(j, j.advance(None)) for j in jobs]
        while todo := [(j, t) for j, t in todo if t]:
            results = iter(ex.map(fn, [x for _, ts in todo for x in ts], on_done))
            todo = [(j, j.advance([next(results) for _ in ts])) for j, ts in todo]
        return
    ranked = [getattr(j, "priority", None) for j in jobs]
    workers = getattr(ex, "workers", None)
    # tasks out at once when jobs are ranked: one per worker and one waiting in the
    # executor's queue (a worker that finishes starts it without waiting for this
    # process to send one), else all
    limit = workers + 1 if workers and any(r is not None for r in ranked) else math.inf
    # futures -> (job, slot); a job's results wait in its slots until all have come
    where: dict[Future, tuple[int, int]] = {}
    slots: list[list[Any]] = []
    left: list[int] = []
    waiting: list[tuple[float, int, int, Any]] = []  # heap: (-priority, job, slot, task)

    def queue(i: int, tasks: Sequence[T]) -> None:
        slots[i] = [None] * len(tasks)
        left[i] = len(tasks)
        rank = ranked[i]
        p = float(rank()) if rank is not None and tasks else 0.0
        for k, t in enumerate(tasks):
            heapq.heappush(waiting, (-p, i, k, t))

    def send() -> None:
        while waiting and len(where) < limit:
            _, i, k, t = heapq.heappop(waiting)
            f = submit(fn, t)  # not held: a serial executor runs the task here
            where[f] = (i, k)
            if finished is not None:
                _put_when_done(f, finished)

    with _cancelled_on_failure(where):  # the futures still out when a failure comes
        for i, j in enumerate(jobs):
            slots.append([])
            left.append(0)
            queue(i, j.advance(None))
        send()
        while where:
            done = wait_first(list(where))
            # in job order: which of several finished tasks is handled first is no accident
            for f in sorted(done, key=lambda f: where[f]):
                i, k = where.pop(f)
                slots[i][k] = f.result()  # raises the task's failure here
                if on_done is not None:
                    on_done()
                left[i] -= 1
                if left[i] == 0:
                    queue(i, jobs[i].advance(slots[i]))
            send()


@contextmanager
def _cancelled_on_failure(futures: Collection[Future]) -> Iterator[None]:
    """On any failure inside, cancel the futures ``futures`` holds then (a live collection)
    and re-raise; a dead worker process becomes the one-line :data:`_DIED` error."""
    try:
        yield
    except BrokenProcessPool as e:
        _cancel_all(futures)
        raise WorkersLost(_DIED) from e
    except BaseException:
        _cancel_all(futures)
        raise


def _cancel_all(futures: Collection[Future]) -> None:
    """Cancel ``futures`` with a stop held back: ``timeout`` and a service manager send
    theirs to the command and again to its process group, and a second stop raised while
    a cancel held a task's lock left it taken; the pool's thread then waited for it forever
    as it failed or cancelled that task (_first_finished)."""
    with stops_held():
        for f in futures:
            f.cancel()


def make_executor(
    workers: int | None = None,
    scheduler: str | None = None,
    *,
    environ: dict | None = None,
    wait_workers_s: float | None = None,
) -> SerialExecutor | ProcessExecutor | DaskExecutor:
    """The CLI's choice: Dask when a scheduler address is given (``--scheduler`` or
    ``DASK_SCHEDULER_ADDRESS``; ``wait_workers_s``: :func:`wait_workers`), otherwise a
    local process pool of ``workers``."""
    env = os.environ if environ is None else environ
    address = scheduler or env.get(SCHEDULER_ENV) or None
    if address:
        from_environment = not scheduler
        if "://" not in address:
            where = (
                f"{SCHEDULER_ENV}={address}"
                if from_environment
                else given("--scheduler", "scheduler", address)
            )
            raise UserError(f"{where}: expected an address like tcp://host:8786")
        ex = DaskExecutor(address=address, wait_workers_s=wait_workers_s)
        ex._from_environment = from_environment
        return ex
    return ProcessExecutor(workers)
