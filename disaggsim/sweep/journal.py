"""Finished sweep runs kept while ``disaggsim sweep`` runs, so that no finished run is lost.

A sweep's result folder is written once, when every run has finished
(:func:`disaggsim.output.write_folder`): a half-written table is never put in place. Until
then each finished run is appended, as it comes back from its worker, to
``OUT.partial/runs.jsonl`` beside the result folder ``OUT``: one JSON line per run, the
run's task fingerprint and its summary. When the sweep stops before the end (an error, a
dead worker, a lost Dask scheduler, Ctrl-C, SIGTERM, even SIGKILL of this process), the
runs that finished are in that file, and the same command with ``--resume`` runs only the
others; the table it writes is the one an uninterrupted sweep writes (a run is
deterministic given its scenario, seed and disaggsim version, which the fingerprint
holds). After the result folder is in place, the partial folder is deleted.

The partial folder is a disaggsim result folder (its marker lists ``runs.jsonl``). While a
sweep writes into it, it holds an exclusive ``flock`` on the journal: a second sweep into
the same ``--out`` is refused, one line, before it runs anything (the lock goes with the
process, so a killed sweep leaves none behind).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from disaggsim import __version__
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import Summary
from disaggsim.output import MARKER, _fail, check_folder, read_marker
from disaggsim.sweep.core import PointTask

JOURNAL = "runs.jsonl"
COMMAND = "sweep (finished runs of an unfinished sweep)"


def partial_path(out: Path) -> Path:
    """Where the finished runs of a sweep into ``out`` are kept: ``OUT.partial``."""
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
    """The open ``OUT.partial/runs.jsonl`` of one sweep (see the module docstring)."""

    folder: Path
    shown: Path  # as the user named it, for messages
    fingerprints: list[str]
    reused: dict[int, Summary] = field(default_factory=dict)  # task index -> kept summary
    _file: IO[str] | None = None
    _kept: int = 0  # runs of this sweep in the journal (reused ones included)
    _others: int = 0  # runs of another sweep found in the journal (kept there)
    _made: list[Path] = field(default_factory=list)  # folders open_journal made, deepest first

    @property
    def others(self) -> int:
        """Runs of another sweep (another grid, scenario, seeds or version) found in the
        journal; they stay in it, and the folder stays after this sweep."""
        return self._others

    @property
    def total(self) -> int:
        return len(self.fingerprints)

    def record(self, index: int, summary: Summary) -> None:
        """Append one finished run, on disk before the next one is handled."""
        assert self._file is not None
        line = json.dumps({"run": self.fingerprints[index], "summary": summary.to_dict()})
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._kept += 1

    def kept_note(self) -> str | None:
        """The clause an error line ends with when the sweep stops unfinished: where the
        finished runs are and how to go on. None when no run finished (the partial folder
        is then deleted: nothing is left behind)."""
        if self._kept == 0:
            return None
        left = self.total - self._kept
        then = f"runs only the other {left}" if left else "writes the table from them"
        return (
            f"{self._kept} of {_runs(self.total)} finished and are kept in {self.shown}/ (the "
            f"same command with --resume {then})"
        )

    def close(self, finished: bool) -> None:
        """Release the lock; delete the folder when it holds no run, or when the sweep's
        result is in place (``finished``) and it holds no run of another sweep."""
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None
        try:
            empty = (self.folder / JOURNAL).stat().st_size == 0
        except OSError:
            empty = False
        if empty or (finished and self._others == 0):
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


def open_journal(out: Path, flag: str, tasks: Sequence[PointTask], resume: bool) -> Journal:
    """Claim ``OUT.partial`` for this sweep: lock it (another sweep writing there is a
    one-line error), and with ``resume`` read the runs an earlier, unfinished sweep kept
    there (those whose fingerprint is one of ``tasks``'). Without ``resume`` a partial
    folder holding finished runs is a one-line error: it is neither reused nor deleted
    silently."""
    shown = partial_path(out)
    folder = partial_path(Path(os.path.abspath(out)))
    prints = [fingerprint(t) for t in tasks]
    _check_partial_folder(shown, folder, flag)
    # the folders this makes (``results/`` of a default --out included), removed again
    # when the sweep leaves no partial folder: nothing left that disaggsim did not need
    made = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MARKER).exists():  # first, so that the folder is always recognisably ours
        (folder / MARKER).write_text(
            json.dumps({"written_by": "disaggsim", "command": COMMAND, "files": [JOURNAL]}) + "\n",
            encoding="utf-8",
        )
    path = folder / JOURNAL
    try:
        f = open(path, "a+", encoding="utf-8")
    except OSError as e:
        raise _fail(
            flag, shown, f"cannot write the sweep's runs there ({e.strerror or e})"
        ) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _fail(
            flag,
            out,
            f"another disaggsim sweep is writing into it now (its runs go to {shown}/); "
            "wait for it to end or give another folder",
        ) from None
    journal = Journal(folder=folder, shown=shown, fingerprints=prints, _file=f, _made=made)
    try:
        f.seek(0)
        try:
            text = f.read()
        except UnicodeDecodeError:
            raise UserError(
                f"{shown}/{JOURNAL}: not UTF-8, so not runs a sweep wrote; delete the folder "
                "to start the sweep again"
            ) from None
        kept, whole = _read_runs(text, shown)
        if kept and not resume:
            raise _fail(
                flag,
                out,
                f"{shown}/ holds {_runs(len(kept))} of an earlier sweep that did not "
                "end; rerun with --resume to reuse those of this sweep, or delete that folder",
            )
        if whole is not None:  # a last line cut short (a killed sweep): dropped
            f.truncate(whole)
        f.seek(0, os.SEEK_END)
        where = {p: i for i, p in enumerate(prints)}
        for run, summary in kept.items():
            if run in where:
                journal.reused[where[run]] = summary
        # runs of another sweep (another grid, scenario, seeds or version) stay in the
        # file, and the folder stays when this sweep ends (close)
        journal._kept = len(journal.reused)
        journal._others = len(kept) - len(journal.reused)
    except BaseException:
        journal.close(finished=False)
        raise
    return journal


def _runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def _check_partial_folder(shown: Path, folder: Path, flag: str) -> None:
    """``OUT.partial`` is new, or a partial folder disaggsim wrote (its marker, the
    journal, nothing else); anything else there is the user's and is left alone."""
    if not os.path.lexists(folder):
        check_folder(shown, flag)  # a path through a file, a name too long, no room
        return
    if folder.is_symlink() or not folder.is_dir():
        raise _fail(flag, shown, "exists and is not a folder disaggsim wrote; move it away")
    names = set(os.listdir(folder))
    previous = read_marker(folder)
    ours = previous is not None and previous.command == COMMAND
    if names and (not ours or names - {MARKER, JOURNAL}):
        raise _fail(
            flag,
            shown,
            "holds files that are not a sweep's kept runs; move them or give another --out",
        )
    if os.path.lexists(folder / JOURNAL) and not (folder / JOURNAL).is_file():
        raise _fail(flag, shown, f"{JOURNAL} there is not a file; move it away")


def _read_runs(text: str, shown: Path) -> tuple[dict[str, Summary], int | None]:
    """The runs a journal holds, and where a last line cut short starts (the process was
    killed while writing it: dropped), else None. Any other line that does not read is a
    one-line error."""
    kept: dict[str, Summary] = {}
    lines = text.split("\n")
    offset = 0
    for n, line in enumerate(lines, 1):
        start, offset = offset, offset + len(line.encode()) + 1
        if not line:
            continue
        if n == len(lines):  # no newline after it: written in part
            return kept, start
        try:
            doc: Any = json.loads(line)
            run, flat = doc["run"], doc["summary"]
            if not isinstance(run, str) or not isinstance(flat, dict):
                raise ValueError("not a run")
            kept[run] = Summary.from_dict(flat)
        except (ValueError, KeyError, TypeError) as e:
            why = " ".join(str(e).split())[:80]
            raise UserError(
                f"{shown}/{JOURNAL}: line {n}: not a run a sweep wrote ({why}); delete the "
                "folder to start the sweep again"
            ) from None
    return kept, None
