"""Finished runs kept while ``disaggsim sweep``, ``compare`` or ``plan`` runs, so that no
finished simulation is lost.

A command's result folder is written once, when every run has finished
(:func:`disaggsim.output.write_folder`): a half-written table is never put in place. Until
then each finished run is appended, as it comes back from its worker, to
``OUT.partial/runs.jsonl`` beside the result folder ``OUT``: one JSON line per run, the
run's task fingerprint, its summary and the command that ran it. When the command stops
before the end (an error, a dead worker, a lost Dask scheduler, Ctrl-C, SIGTERM, even
SIGKILL of this process), the runs that finished are in that file, and the same command
with ``--resume`` runs only the others; what it writes is what an uninterrupted command
writes (a run is deterministic given its scenario, seed and disaggsim version, which the
fingerprint holds). After the result folder is in place, the partial folder is deleted.

A sweep knows its runs in advance (:func:`open_journal` with its tasks). ``compare`` and
``plan`` choose each goodput search's next rate from the last runs, so their runs are
known only as they are sent: :class:`KeptRuns` wraps the executor, answers a run kept in
the journal from it and records every other one as it finishes.

The partial folder is a disaggsim result folder (its marker lists ``runs.jsonl``). While a
command writes into it, it holds an exclusive ``flock`` on the journal: a second command
into the same ``--out`` is refused, one line, before it runs anything (the lock goes with
the process, so a killed command leaves none behind).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from disaggsim import __version__
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import Summary, summary_key
from disaggsim.output import MARKER, _fail, check_folder, os_why, read_marker
from disaggsim.stops import stops_held
from disaggsim.sweep.core import PointTask, run_point
from disaggsim.sweep.executors import settle

JOURNAL = "runs.jsonl"
# the marker's command of a partial folder, by the command that made it; a journal's runs
# are reused by fingerprint whichever command ran them
COMMANDS = {c: f"{c} (finished runs of an unfinished {c})" for c in ("sweep", "compare", "plan")}


def partial_path(out: Path) -> Path:
    """Where the finished runs of a command into ``out`` are kept: ``OUT.partial``."""
    return out.with_name(out.name + ".partial")


def fingerprint(task: PointTask) -> str:
    """What makes a run's result: its resolved scenario (seed included), the folder its
    relative paths resolve against, how it may end early, and the disaggsim version."""
    doc = {
        "version": __version__,
        "raw": task.raw,
        "base_dir": task.base_dir,
        "stop_on_certain_miss": task.stop_on_certain_miss,
        "stop_below_attainment": task.stop_below_attainment,
    }
    text = json.dumps(doc, sort_keys=True, default=repr, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Journal:
    """The open ``OUT.partial/runs.jsonl`` of one command (see the module docstring)."""

    folder: Path
    shown: Path  # as the user named it, for messages
    command: str  # sweep, compare or plan: recorded with each run
    # a sweep's runs, known in advance (task index -> fingerprint); empty for compare and
    # plan, whose runs are known as they are sent (KeptRuns)
    fingerprints: list[str]
    kept: dict[str, Summary] = field(default_factory=dict)  # the runs the file held at open
    reused: dict[int, Summary] = field(default_factory=dict)  # a sweep's: task index -> kept
    _whose: dict[str, tuple[str, str]] = field(default_factory=dict)  # run -> (command, name)
    _file: IO[str] | None = None
    _used: set[str] = field(default_factory=set)  # this command's runs in the file
    _made: list[Path] = field(default_factory=list)  # folders open_journal made, deepest first
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def others(self) -> int:
        """Kept runs that are not this command's (another grid, scenario, seeds, command or
        version): they stay in the journal, and the folder stays after this command. A
        sweep knows them at open; compare and plan once they have ended."""
        return len(self.kept.keys() - self._used)

    def others_note(self) -> str:
        """What the runs of :attr:`others` are, for the command's last line: ``s.partial/
        keeps 3 runs of a sweep of chunked and 40 of a plan (12 scenarios), not runs of
        this compare ...``."""
        names: dict[str, set[str]] = {}
        counts: dict[str, int] = {}
        for run in self.kept.keys() - self._used:
            command, name = self._whose.get(run, ("sweep", "?"))
            names.setdefault(command, set()).add(name)
            counts[command] = counts.get(command, 0) + 1
        parts = []
        for k, command in enumerate(sorted(counts, key=lambda c: (-counts[c], c))):
            n, of = counts[command], sorted(names[command])
            scenarios = f"of {of[0]}" if len(of) == 1 else f"({len(of)} scenarios)"
            parts.append(f"{_runs(n) if k == 0 else n} of a {command} {scenarios}")
        return (
            f"{self.shown}/ keeps {' and '.join(parts)}, not runs of this {self.command} "
            "(another grid, scenario, seeds, command or version): that command with --resume "
            "into this --out reuses them; delete the folder to drop them"
        )

    @property
    def num_kept(self) -> int:
        """This command's runs in the journal: those it reused and those it recorded."""
        return len(self._used)

    @property
    def reused_runs(self) -> int:
        """Kept runs this command used instead of running them again."""
        return len(self._used & self.kept.keys())

    @property
    def total(self) -> int:
        return len(self.fingerprints)

    def lookup(self, run: str) -> Summary | None:
        """The kept summary of the run with fingerprint ``run``, or None (then run it)."""
        with self._lock:
            summary = self.kept.get(run)
            if summary is not None:
                self._used.add(run)
            return summary

    def record(self, index: int, summary: Summary) -> None:
        """Append a sweep's run ``index`` (:attr:`fingerprints`)."""
        self.record_run(self.fingerprints[index], summary)

    def record_run(self, run: str, summary: Summary) -> None:
        """Append one finished run, on disk before the next one is handled. (Called from
        a pool's thread too: :class:`KeptRuns`.)"""
        flat = summary.to_dict()
        doc = {"run": run, "summary": flat, "command": self.command, "sha256": _digest(flat)}
        data = (json.dumps(doc) + "\n").encode()
        # on disk and counted as one step: a stop between them said one run fewer kept
        with self._lock, stops_held():
            if self._file is None:  # closed: the command is over
                return
            fd = self._file.fileno()
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                # written unbuffered: a line the system refuses in part (a full disk) is
                # cut off again below, and nothing is left to be flushed later
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as e:
                # the runs kept so far stay whole; this one is not kept (a full disk left
                # a part of a line, then the error named no file, and closing the journal
                # failed again, losing the clause that says where the runs are)
                try:
                    os.ftruncate(fd, end)
                except OSError:
                    pass  # a cut last line: the next --resume drops it
                self._file.close()
                self._file = None
                raise UserError(
                    f"{self.shown}/{JOURNAL}: could not keep a finished run there ({os_why(e)})"
                ) from None
            self._used.add(run)

    def kept_note(self) -> str | None:
        """The clause an error line ends with when the command stops unfinished: where
        the finished runs are and how to go on. None when no run finished (the partial
        folder is then deleted: nothing is left behind)."""
        n = len(self._used)
        if n == 0:
            return None
        if not self.fingerprints:  # compare, plan: how many runs are left is not known
            return (
                f"{_runs(n)} finished and {'are' if n > 1 else 'is'} kept in {self.shown}/ "
                "(the same command with --resume reuses them and runs only the others)"
            )
        left = self.total - n
        then = f"runs only the other {left}" if left else "writes the table from them"
        return (
            f"{n} of {_runs(self.total)} finished and are kept in {self.shown}/ (the "
            f"same command with --resume {then})"
        )

    def close(self, finished: bool) -> None:
        """Release the lock; delete the folder when it holds no run, or when the command's
        result is in place (``finished``) and it holds no run of another command."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()  # releases the flock
                except OSError:
                    pass  # nothing buffered (record_run writes unbuffered): closed anyway
                self._file = None
        try:
            empty = (self.folder / JOURNAL).stat().st_size == 0
        except OSError:
            empty = False
        if empty or (finished and self.others == 0):
            with stops_held():  # a second Ctrl-C while it is deleted: the folder half gone
                for name in (JOURNAL, MARKER):
                    try:
                        (self.folder / name).unlink()
                    except FileNotFoundError:
                        pass
                for made in self._made or [self.folder]:
                    try:
                        made.rmdir()
                    except OSError:
                        break  # something else is in it: left as it is


def open_journal(
    out: Path,
    flag: str,
    tasks: Sequence[PointTask] | None,
    resume: bool,
    command: str = "sweep",
) -> Journal:
    """Claim ``OUT.partial`` for a command into ``out``: lock it (another command writing
    there is a one-line error), and with ``resume`` read the runs an earlier, unfinished
    command kept there (a sweep's ``tasks``: those of them it kept are :attr:`Journal.reused`;
    ``None``: runs known as they are sent, :class:`KeptRuns`). Without ``resume`` a
    partial folder holding finished runs is a one-line error: it is neither reused nor
    deleted silently.

    Call it inside :func:`~disaggsim.stops.stops_held`, assigning the journal there
    (``with stops_held(): journal = open_journal(...)``) within the ``try`` whose
    ``except`` closes it: a stop between the folder's making and that assignment left an
    empty ``OUT.partial`` that no cleanup knew of."""
    shown = partial_path(out)
    folder = partial_path(Path(os.path.abspath(out)))
    prints = [fingerprint(t) for t in tasks or ()]
    _check_partial_folder(out, shown, folder, flag)
    # the folders this makes (``results/`` of a default --out included), removed again
    # when the command leaves no partial folder: nothing left that disaggsim did not need
    made = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MARKER).exists():  # first, so that the folder is always recognisably ours
        doc = {
            "written_by": "disaggsim",
            "command": COMMANDS[command],
            "files": [JOURNAL],
            # the folders above it made here (``results/``): a resumed command that ends
            # removes them too, when empty (the command that made them may have been killed)
            "made_above": max(len(made) - 1, 0),
        }
        try:
            (folder / MARKER).write_text(json.dumps(doc) + "\n", encoding="utf-8")
        except OSError as e:  # a full disk: no folder left that holds nothing of use
            (folder / MARKER).unlink(missing_ok=True)
            for above in made:
                try:
                    above.rmdir()
                except OSError:
                    break
            raise _partial_fail(flag, out, shown, f"cannot be written ({os_why(e)})") from None
    else:
        made = [folder, *folder.parents[: _made_above(folder)]]
    path = folder / JOURNAL
    try:
        f = open(path, "a+", encoding="utf-8")
    except OSError as e:
        raise _partial_fail(flag, out, shown, f"cannot be written ({os_why(e)})") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _fail(
            flag,
            out,
            f"another disaggsim command is writing into it now (its runs go to {shown}/); "
            "wait for it to end or give another folder",
        ) from None
    journal = Journal(
        folder=folder, shown=shown, command=command, fingerprints=prints, _file=f, _made=made
    )
    try:
        f.seek(0)
        try:
            text = f.read()
        except UnicodeDecodeError:
            raise UserError(
                f"{shown}/{JOURNAL}: not UTF-8, so not runs disaggsim wrote; delete the folder "
                "to start again"
            ) from None
        kept, whose, whole = _read_runs(text, shown)
        if kept and not resume:
            mine = sum(1 for p in set(prints) if p in kept)
            which = f" ({mine} of them this sweep's)" if tasks is not None else ""
            raise _fail(
                flag,
                out,
                f"{shown}/ holds {_runs(len(kept))}{which} of an earlier command that did not "
                f"end; rerun with --resume to reuse those of this {command}, or delete that "
                "folder",
            )
        if whole is not None:  # a last line cut short (a killed command): dropped
            f.truncate(whole)
        f.seek(0, os.SEEK_END)
        journal.kept, journal._whose = kept, whose
        for i, p in enumerate(prints):
            summary = journal.lookup(p)
            if summary is not None:
                journal.reused[i] = summary
    except BaseException:
        journal.close(finished=False)
        raise
    return journal


def _made_above(folder: Path) -> int:
    """How many folders above ``folder`` the command that made it made (its marker's
    ``made_above``; 0 when it does not say, and at most 8)."""
    try:
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        n = doc.get("made_above", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 8 else 0


def _runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def _partial_fail(flag: str, out: Path, shown: Path, why: str) -> UserError:
    """An error about ``OUT.partial`` names the ``--out`` the user typed and the partial
    folder as what it is (it read ``--out j.partial: ...``, a path nobody typed)."""
    return _fail(flag, out, f"{shown}/, where its finished runs are kept, {why}")


def _check_partial_folder(out: Path, shown: Path, folder: Path, flag: str) -> None:
    """``OUT.partial`` is new, or a partial folder disaggsim wrote (its marker, the
    journal, nothing else); anything else there is the user's and is left alone."""
    if not os.path.lexists(folder):
        try:
            check_folder(shown, flag)  # a path through a file, a name too long, no room
        except UserError as e:
            said = str(_fail(flag, shown, ""))  # the check's own start, naming the path
            why = str(e).removeprefix(said)
            raise _partial_fail(flag, out, shown, f"cannot be made: {why}") from None
        return
    if folder.is_symlink() or not folder.is_dir():
        raise _partial_fail(
            flag, out, shown, "exists and is not a folder disaggsim wrote; move it away"
        )
    names = set(os.listdir(folder))
    previous = read_marker(folder)
    ours = previous is not None and previous.command in COMMANDS.values()
    if names and (not ours or names - {MARKER, JOURNAL}):
        raise _partial_fail(
            flag,
            out,
            shown,
            "holds files that are not the kept runs of a sweep, compare or plan; move them "
            "or give another --out",
        )
    if os.path.lexists(folder / JOURNAL) and not (folder / JOURNAL).is_file():
        raise _partial_fail(flag, out, shown, f"holds a {JOURNAL} that is not a file; move it away")


def _read_runs(
    text: str, shown: Path
) -> tuple[dict[str, Summary], dict[str, tuple[str, str]], int | None]:
    """The runs a journal holds, whose they are (command, scenario name), and where a last
    line cut short starts (the process was killed while writing it: dropped), else None.
    Any other line that does not read is a one-line error."""
    kept: dict[str, Summary] = {}
    whose: dict[str, tuple[str, str]] = {}
    lines = text.split("\n")
    offset = 0
    for n, line in enumerate(lines, 1):
        start, offset = offset, offset + len(line.encode()) + 1
        if not line:
            continue
        if n == len(lines):  # no newline after it: written in part
            return kept, whose, start
        try:
            doc: Any = json.loads(line)
            run, flat = doc["run"], doc["summary"]
            # lines of disaggsim 2026-12-03 have no command: only sweeps kept runs then
            command = doc.get("command", "sweep")
            if not isinstance(run, str) or not isinstance(flat, dict) or command not in COMMANDS:
                raise ValueError("not a run")
            _check_kinds(flat)
            # lines of disaggsim before 2026-12-04 have no checksum
            if "sha256" in doc and doc["sha256"] != _digest(flat):
                raise UserError(
                    f"{shown}/{JOURNAL}: line {n}: the run's summary is not what disaggsim "
                    "wrote (its checksum differs: the file was changed since); delete that "
                    "line to run it again, or the folder to start again"
                )
            kept[run] = Summary.from_dict(flat)
            whose[run] = (command, kept[run].scenario)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            why = " ".join(str(e).split())[:80]
            raise UserError(
                f"{shown}/{JOURNAL}: line {n}: not a run disaggsim kept ({why}); delete the "
                "folder to start again"
            ) from None
    return kept, whose, None


def _digest(flat: dict[str, Any]) -> str:
    """A journal line's checksum of its summary: a value changed on disk (an edit, a
    damaged block) would otherwise be reused as the run's result."""
    text = json.dumps(flat, sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_kinds(flat: dict[str, Any]) -> None:
    """Each value of a kept summary is of its key's kind (docs/metrics.md): a string or a
    mapping where a number belongs was a pyarrow traceback when the table was built."""
    for key, value in flat.items():
        try:
            kind = summary_key(key).kind
        except KeyError:
            continue  # Summary.from_dict names it
        if value is None:  # NaN as JSON writes it
            continue
        if isinstance(value, bool):
            ok = kind is bool
        elif isinstance(value, int):
            ok = kind in (int, float)
        elif isinstance(value, float):
            ok = kind is float or (kind is int and math.isnan(value))
        else:
            ok = kind is str and isinstance(value, str)
        if not ok:
            shown = json.dumps(value)[:40]
            raise ValueError(f"{key}: expected {kind.__name__}, got {shown}")


class _Relay(Future):
    """The future :meth:`KeptRuns.submit` returns for a run it sends: done once the run
    is on disk. Cancelling it cancels the run where it has not started; a run that
    finishes anyway is still kept."""

    def __init__(self, inner: Future) -> None:
        super().__init__()
        self._inner = inner

    def cancel(self) -> bool:
        self._inner.cancel()
        return super().cancel()


class KeptRuns:
    """An executor that keeps every finished run of ``inner`` in ``journal`` and answers
    a run the journal kept without running it again (``compare`` and ``plan``: module
    docstring). It has ``submit`` (and ``workers``) where ``inner`` does, so
    :func:`~disaggsim.sweep.executors.drive` sends work to it as it would to ``inner``;
    only :func:`~disaggsim.sweep.core.run_point` runs are kept (a run is known by its
    task's :func:`fingerprint`)."""

    def __init__(self, inner: Any, journal: Journal) -> None:
        self.inner, self.journal = inner, journal
        if callable(getattr(inner, "submit", None)):
            self.submit = self._submit
        if getattr(inner, "workers", None) is not None:
            self.workers = inner.workers

    def _submit(self, fn: Callable[[Any], Any], task: Any) -> Future:
        if fn is not run_point:
            return self.inner.submit(fn, task)
        run = fingerprint(task)
        kept = self.journal.lookup(run)
        if kept is not None:
            f: Future = Future()
            f.set_result(kept)
            return f
        inner = self.inner.submit(fn, task)
        out = _Relay(inner)

        def finished(done: Future) -> None:
            if done.cancelled():
                out.cancel()
                return
            exc = done.exception()
            if exc is not None:
                settle(out.set_exception, exc)
                return
            summary = done.result()
            try:
                self.journal.record_run(run, summary)
            except BaseException as e:  # raised where the caller waits for the run
                settle(out.set_exception, e)
                return
            settle(out.set_result, summary)

        inner.add_done_callback(finished)
        return out

    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        on_done: Callable[[], None] | None = None,
        on_result: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        if fn is not run_point:
            return self.inner.map(fn, tasks, on_done, on_result=on_result)
        runs = [fingerprint(t) for t in tasks]
        results: list[Any] = [None] * len(tasks)
        todo = []
        for i, run in enumerate(runs):
            kept = self.journal.lookup(run)
            if kept is None:
                todo.append(i)
                continue
            results[i] = kept
            if on_result is not None:
                on_result(i, kept)
            if on_done is not None:
                on_done()

        def each(k: int, summary: Any) -> None:
            i = todo[k]
            self.journal.record_run(runs[i], summary)
            results[i] = summary
            if on_result is not None:
                on_result(i, summary)

        if todo:
            self.inner.map(fn, [tasks[i] for i in todo], on_done, on_result=each)
        return results

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> KeptRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
