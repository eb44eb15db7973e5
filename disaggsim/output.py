"""Where disaggsim may write: the one owner of every output path.

The rule (docs/metrics.md, "Where results go"):

- A **result folder** (``run``, ``sweep``, ``compare``, ``plan --out``, ``calibrate
  --out``) is written only where there is no folder yet, into an empty folder, or over an
  earlier disaggsim result: a folder holding :data:`MARKER`, whose manifest lists every
  file that result wrote, and nothing else. Any other folder (the working folder, a folder
  above it, a project checkout, a folder with a user's files) is a one-line error before
  any simulation.
- A **single file** (``--trace``, a calibrated profile, a regression reference, a
  measured preset, a generated doc) is created where named, or replaces a file that
  disaggsim recognisably wrote (each caller says how to recognise its own files) — never
  another file.
- The new files are written into a temporary sibling and moved into place only when all
  of them exist, so an error or Ctrl-C leaves the earlier state as it was.
- Replacing an earlier result is reported (:attr:`Written.replaced`); the commands say so
  on their last line. Only the files the earlier result's manifest lists are deleted.
- One command at a time writes to an output: a command holds it (:func:`hold_folder`,
  :func:`hold_file`) from its check to its write, by an exclusive lock on a hidden sibling
  ``.NAME.disaggsim-lock``; a second command is refused before it starts its work (two
  runs into one ``--out`` both said "written", and the later one had replaced the
  other's result).

Every check that can fail runs in :func:`check_folder` / :func:`check_file`, which the
commands call before simulating (and the writers call again, since the disk may have
changed in the meantime).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from disaggsim.errors import UserError
from disaggsim.inputs import kind_of, read_json, read_regular
from disaggsim.stops import stops_held

MARKER = ".disaggsim-result.json"
# Longest file name most filesystems take (NAME_MAX); a temporary sibling adds a suffix.
_NAME_MAX_BYTES = 255
_TMP_NAME_CHARS = 40


@dataclass(frozen=True, slots=True)
class Previous:
    """An earlier disaggsim result found at the output path."""

    command: str
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Written:
    """What a writer did: the folder or file, the files written, what it replaced."""

    path: Path
    files: tuple[Path, ...]
    replaced: Previous | None
    left_in: Path | None = None  # where earlier files that could not be deleted are

    def note(self) -> str:
        """``written to X/`` plus, when it applies, what was replaced."""
        if self.files == (self.path,):  # one file
            if self.replaced is None:
                return f"written to {self.path}"
            return f"written to {self.path} (replaced the earlier {self.replaced.command} there)"
        if self.replaced is None:
            return f"written to {self.path}/"
        n = len(self.replaced.files)
        left = (
            f"; some of its files could not be deleted and are in {self.left_in}/"
            if self.left_in is not None
            else ""
        )
        return (
            f"written to {self.path}/ (replaced the earlier disaggsim {self.replaced.command} "
            f"result there: {n} file{'s' if n != 1 else ''}{left})"
        )


# ---------------------------------------------------------------------------------------
# checks


_DEFAULT = "default:"


def default_flag(flag: str = "--out") -> str:
    """The ``flag`` argument of the checks and writers for a path the user did not give
    (a command's default output, ``results/<name>``): its errors name the path as the
    default and the flag that chooses another, not a flag the user never typed."""
    return _DEFAULT + flag


def out_flag(given: bool, flag: str = "--out") -> str:
    """``flag`` when the user gave it, else :func:`default_flag`."""
    return flag if given else default_flag(flag)


def _fail(flag: str, path: Path | str, why: str) -> UserError:
    if flag.startswith(_DEFAULT):
        chooser = flag[len(_DEFAULT) :]
        return UserError(f"{path} (the default output; choose another with {chooser}): {why}")
    return UserError(f"{flag} {path}: {why}")


def os_why(e: OSError, inside: Path | None = None) -> str:
    """Why the system refused a write, in a few words: ``No space left on device``, with
    the file's name when the error gives one inside ``inside`` (``writing summary.json``).
    pyarrow's errors carry no ``strerror``; their text holds ``[errno 28] No space ...``."""
    why = " ".join(str(e.strerror or e).split()) or type(e).__name__
    m = re.search(r"\[errno \d+\] ([^\n\]]+)", why, re.IGNORECASE)
    if m:
        why = m.group(1).strip()
    name = e.filename
    if isinstance(name, str | bytes | os.PathLike) and inside is not None:
        f = Path(os.fsdecode(name))
        if f.parent == inside:
            why = f"{why}, writing {f.name}"
    return why


def _write_failed(
    flag: str, path: Path | str, e: OSError, inside: Path | None, what: str, earlier: bool
) -> UserError:
    """One line for a write the system refused once the work was done (a full disk, a
    quota, a file-size limit, an I/O error): the output named, why, and that nothing was
    put there (it was ``Error writing bytes to file. Detail: [errno 28] ...``, naming no
    path)."""
    kept = f"the earlier {what} there is as it was" if earlier else "nothing was written there"
    return _fail(flag, path, f"could not write the {what} ({os_why(e, inside)}); {kept}")


def _check_common(path: Path, flag: str, kind: str) -> Path:
    """Checks shared by folders and files; returns the absolute path (symlinks in the
    folders above resolved, the last component kept as given). A path the system refuses
    to look at (longer than PATH_MAX, a NUL byte, a folder above it may not be read) is a
    one-line error naming the flag."""
    try:
        return _check_common_unguarded(path, flag, kind)
    except (OSError, ValueError) as e:
        raise _fail(
            flag, path, f"cannot use this path ({getattr(e, 'strerror', None) or e})"
        ) from None


def _check_common_unguarded(path: Path, flag: str, kind: str) -> Path:
    text = str(path)
    if not text.strip():
        raise _fail(flag, repr(text), f"empty path (give a {kind})")
    control = sorted({c for c in text if unicodedata.category(c) == "Cc"})
    if control:
        # a newline, tab or escape in a name (a pasted line, an unset variable's
        # neighbour): it made a folder no shell line names easily ("r\n"), every later
        # listing of it garbled
        shown = ", ".join(repr(c) for c in control)
        raise _fail(flag, path, f"holds a control character ({shown}); give a name without one")
    if path.name in ("", ".", ".."):
        raise _fail(flag, path, f"names an existing folder ('.', '..' or '/'), not a new {kind}")
    first = path.parts[0]
    if first == "~" or (first.startswith("~") and len(path.parts) > 1):
        # `--out=~/r` reaches disaggsim unexpanded (a shell expands a leading ~ only as a
        # word of its own): a folder named "~" in the working folder, which a later
        # `rm -r ~...` would aim at the home folder
        raise _fail(
            flag, path, "starts with '~', which the shell did not expand; give the full path"
        )
    if len(os.fsencode(path.name)) > _NAME_MAX_BYTES - _TMP_NAME_CHARS:
        raise _fail(
            flag,
            path,
            f"name longer than {_NAME_MAX_BYTES - _TMP_NAME_CHARS} bytes (filesystem limit)",
        )
    absolute = _normal(path)
    if not _utf8(str(absolute)):
        # bytes no UTF-8 decoding holds (a latin-1 name: Python carries them as lone
        # surrogates): the Parquet writer cannot name such a path, so a run simulated,
        # then failed to write with a traceback (a sweep's kept runs not said)
        where = "holds"
        if _utf8(text):  # the working folder's name, or one above it
            odd = next(p for p in reversed(absolute.parents) if not _utf8(str(p)))
            where = f"lies in {_bytes_shown(odd)}, whose name holds"
        raise _fail(
            flag,
            _bytes_shown(path),
            f"{where} bytes that are not UTF-8 (disaggsim writes under UTF-8 names only: "
            "its Parquet writer cannot name others); give a path whose names are UTF-8",
        )
    parent = absolute.parent
    cwd = Path.cwd().resolve()
    if absolute == cwd or absolute in cwd.parents:
        raise _fail(flag, path, "is the working folder or a folder above it; give a new folder")
    if path.is_symlink():
        raise _fail(flag, path, "is a symbolic link; give the path it points to")
    # A component above that exists but is not a folder: "a/file.txt/out".
    for above in [parent, *parent.parents]:
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise _fail(flag, path, f"{above} is a file, not a folder")
            break
    return absolute


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bytes_shown(path: Path | str) -> str:
    """A path as its bytes read, those that are not UTF-8 as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _normal(path: Path) -> Path:
    """The location :func:`_check_common` checked: the folders above resolved (symbolic
    links and ``..`` as the system reads them), the last name as given."""
    return path.parent.resolve() / path.name


def _probe_writable(absolute: Path, flag: str, shown: Path) -> None:
    """Create and remove an empty folder where the temporary sibling will go (the nearest
    existing folder above), so an unwritable location fails before any simulation."""
    above = absolute.parent
    while not above.exists():
        above = above.parent
    with stops_held():  # made and removed: a stop between them left the probe folder
        try:
            probe = tempfile.mkdtemp(prefix=".disaggsim-probe-", dir=above)
        except OSError as e:
            raise _fail(flag, shown, f"cannot write in {above} ({e.strerror or e})") from None
        os.rmdir(probe)


def read_marker(folder: Path) -> Previous | None:
    """The earlier result a folder's marker describes; None if it has no valid marker.
    A marker disaggsim wrote is a regular file of a few kilobytes: a symbolic link, a
    named pipe (reading it would block) or a device is no marker."""
    marker = folder / MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return None
        doc = read_json(marker, _NotOurs)
    except (OSError, ValueError, _NotOurs):
        return None
    if not isinstance(doc, dict) or doc.get("written_by") != "disaggsim":
        return None
    files = doc.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    if any("/" in f or f in ("", ".", "..", MARKER) or not _plain_file_name(f) for f in files):
        return None
    return Previous(command=str(doc.get("command", "?")), files=tuple(files))


def _plain_file_name(name: str) -> bool:
    """Whether ``name`` is a file name disaggsim could have written: printable (no NUL,
    control character or lone surrogate) and at most NAME_MAX bytes. A marker edited to
    list ``"a\u0000b"`` passed as an earlier result, and deleting that name after the run
    was a ValueError traceback that left the earlier result hidden in ``.r.old-XXXXXXXX``."""
    return name.isprintable() and len(name.encode("utf-8")) <= _NAME_MAX_BYTES


class _NotOurs(Exception):
    """A file a recogniser read is not one disaggsim wrote (internal to this module)."""


def _shown(names: Iterable[str], limit: int = 4) -> str:
    names = sorted(names)
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f", ... (+{more} more)" if more > 0 else "")


def check_folder(path: str | Path, flag: str = "--out") -> Previous | None:
    """Fail (one line) unless ``path`` may receive a result folder; returns the earlier
    disaggsim result there, if any. Call before simulating."""
    path = Path(path)
    absolute = _check_common(path, flag, "folder")
    _check_not_inside_result(absolute, flag, path)
    if absolute.exists():
        if not absolute.is_dir():
            raise _fail(flag, path, "exists and is not a folder")
        if os.path.ismount(absolute):
            # a result is moved into place by renaming, which a mount point refuses (the
            # results were computed, then not written)
            raise _fail(
                flag,
                path,
                "is a mount point (the top folder of a disk or volume); give a folder inside it",
            )
        try:
            names = os.listdir(absolute)
        except OSError as e:
            raise _fail(flag, path, f"cannot list it ({e.strerror or e})") from None
        previous = None
        if names:
            previous = read_marker(absolute)
            if previous is None:
                # a marker there that does not read as disaggsim's (edited, cut, a link):
                # it said "holds files disaggsim did not write (.disaggsim-result.json,
                # ...)", naming disaggsim's own marker among the user's files
                damaged = (
                    f" (its {MARKER} is not a marker disaggsim wrote: edited or damaged)"
                    if MARKER in names
                    else ""
                )
                raise _fail(
                    flag,
                    path,
                    f"folder holds files disaggsim did not write ({_shown(names)}){damaged}; "
                    "give a new or empty folder",
                )
            foreign = set(names) - set(previous.files) - {MARKER}
            # a listed name that is now a folder is not the file that result wrote
            foreign |= {n for n in set(names) & set(previous.files) if _is_folder(absolute / n)}
            if foreign:
                raise _fail(
                    flag,
                    path,
                    f"holds an earlier disaggsim result plus files it did not write "
                    f"({_shown(foreign)}); move them or give another folder",
                )
    else:
        previous = None
    _probe_writable(absolute, flag, path)
    return previous


def _check_not_inside_result(absolute: Path, flag: str, shown: Path) -> None:
    """A result folder is flat and holds only the files its marker lists: a new result
    folder inside an earlier one (``sweep --out r/sub`` where ``r`` is a result) made
    ``r`` a folder holding something disaggsim did not list, so replacing ``r`` later
    was refused and the user had to untangle the two by hand."""
    for above in absolute.parents:
        previous = read_marker(above)
        if previous is not None:
            raise _fail(
                flag,
                shown,
                f"lies inside {above}, an earlier disaggsim {previous.command} result (a "
                "result folder holds its own files only); give a folder outside it",
            )


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _check_file_name(path: str | Path, flag: str, what: str) -> None:
    """A file path given as text that ends in '/' names a folder: Path("d/") is "d", so
    `--out d/` wrote a file named d where the user meant a folder."""
    if isinstance(path, str) and path.endswith(("/", os.sep)) and path.strip("/"):
        raise _fail(flag, path, f"ends with '/', so names a folder; give a {what} file name")


def check_file(
    path: str | Path, flag: str, owned: Callable[[Path], bool], what: str = "file"
) -> bool:
    """Fail (one line) unless ``path`` may receive a file: it does not exist, or it is a
    file ``owned`` recognises as written by disaggsim. Returns whether one exists."""
    _check_file_name(path, flag, what)
    path = Path(path)
    absolute = _check_common(path, flag, what)
    exists = absolute.exists()
    if exists:
        if absolute.is_dir():
            raise _fail(flag, path, f"is a folder (give a {what} name)")
        mode = absolute.stat().st_mode
        if not stat.S_ISREG(mode):  # a named pipe would block the recogniser's read
            raise _fail(flag, path, f"exists and is {kind_of(mode)}; give a new {what} name")
        try:
            mine = owned(absolute)
        except (OSError, ValueError, UnicodeDecodeError, _NotOurs):
            mine = False
        if not mine:
            raise _fail(
                flag,
                path,
                f"exists and is not a {what} disaggsim wrote; give a new name or remove it",
            )
    _probe_writable(absolute, flag, path)
    return exists


# ---------------------------------------------------------------------------------------
# holding an output: one command at a time

_LOCK_SUFFIX = ".disaggsim-lock"


@dataclass(slots=True)
class _Hold:
    """An output this process holds: the locked file, the folders made above the output
    to hold it (removed again if they stay empty), and the output as it was found."""

    fd: int
    lock: Path
    made: list[Path]
    found: tuple[int, int, int, int] | None
    thread: int
    depth: int = 1


# The outputs this process holds, by their checked location. The lock is an ``flock``,
# which the system keeps per open file: opening the lock again in this process would be
# refused by this process's own lock, so a writer called inside a command's hold (the
# command holds its output from its check to its write) finds it here instead.
_HELD: dict[Path, _Hold] = {}
_HELD_GUARD = threading.Lock()


def _lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}{_LOCK_SUFFIX}"


def _found(target: Path) -> tuple[int, int, int, int] | None:
    """What is at ``target`` as a later check compares it: a result folder's marker, or
    the file itself (None: no result there)."""
    try:
        st = os.lstat(target)
        if stat.S_ISDIR(st.st_mode):
            st = os.lstat(target / MARKER)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _holder(fd: int) -> str:
    """`` (pid 123)``: the process the lock file names, else nothing."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"null")
        pid = doc.get("pid") if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return ""
    return f" (pid {pid})" if isinstance(pid, int) and not isinstance(pid, bool) else ""


def _ours(fd: int) -> bool:
    """Whether an existing lock file is one disaggsim made: what it wrote, or empty (a
    command killed between making it and writing it)."""
    try:
        head = os.pread(fd, 4096, 0)
        if not head:
            return True
        doc = json.loads(head)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("written_by") == "disaggsim"


def _busy(flag: str, shown: Path, what: str, who: str) -> UserError:
    return _fail(
        flag,
        shown,
        f"another disaggsim command{who} is writing there now; wait until it ends or give "
        f"another {what}",
    )


def _lock(lock: Path, flag: str, shown: Path, what: str) -> int:
    """Open and lock ``lock`` (made if need be); the open file, locked. A lock another
    process holds is a one-line error; one left by a killed command is taken over."""
    for _ in range(100):
        created = True
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            created = False
            try:
                fd = os.open(lock, flags)
            except FileNotFoundError:
                continue  # released meanwhile
            except OSError as e:  # a symbolic link, a folder, unreadable
                try:
                    mode = os.lstat(lock).st_mode
                    what_is = "a symbolic link" if stat.S_ISLNK(mode) else kind_of(mode)
                except OSError:
                    what_is = "unreadable"
                if what_is in ("not a regular file", "unreadable"):
                    what_is = f"{what_is} ({e.strerror or e})"
                raise _fail(
                    flag,
                    shown,
                    f"{lock.name} beside it is {what_is}, not a lock disaggsim made; move it away",
                ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _fail(
                    flag,
                    shown,
                    f"{lock.name} beside it is {kind_of(st.st_mode)}, not a lock disaggsim "
                    "made; move it away",
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(flag, shown, what, _holder(fd)) from None
            except OSError as e:  # a filesystem without locks: the file made is removed
                if created:
                    with contextlib.suppress(OSError):
                        os.unlink(lock)
                raise _fail(
                    flag, shown, f"cannot lock {lock.name} beside it ({e.strerror or e})"
                ) from None
            try:
                now = os.lstat(lock)
                same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # released and removed between our open and our lock: again
                os.close(fd)
                continue
            if not created and not _ours(fd):
                raise _fail(
                    flag,
                    shown,
                    f"{lock.name} beside it is a file disaggsim did not write; move it away",
                )
            try:  # who holds it, for the message of a command refused meanwhile
                os.ftruncate(fd, 0)
                doc = {"written_by": "disaggsim", "pid": os.getpid()}
                os.pwrite(fd, (json.dumps(doc) + "\n").encode(), 0)
            except OSError:
                pass  # a full disk: the lock holds without it
            return fd
        except BaseException:
            os.close(fd)
            raise
    raise _busy(flag, shown, what, "")


def _acquire(target: Path, flag: str, shown: Path, what: str) -> None:
    """Hold ``target`` for this thread (again, if it holds it already)."""
    me = threading.get_ident()
    with _HELD_GUARD:
        held = _HELD.get(target)
        if held is not None:
            if held.thread != me:
                raise _busy(flag, shown, what, f" (pid {os.getpid()})")
            held.depth += 1
            return
        with stops_held():  # made, locked and registered for _release as one step
            try:
                made = _make_parents(target)
            except OSError as e:
                raise _fail(flag, shown, f"cannot be made ({e.strerror or e})") from None
            try:
                fd = _lock(_lock_path(target), flag, shown, what)
            except BaseException:
                _remove_made(made)
                raise
            _HELD[target] = _Hold(fd, _lock_path(target), made, _found(target), me)


def _release(target: Path) -> None:
    """Let go of ``target`` if this thread holds it; the last release removes the lock
    file (while still locked: a command waiting on it then finds it gone and makes its
    own) and the folders made to hold it, if they are empty."""
    with _HELD_GUARD:
        held = _HELD.get(target)
        if held is None or held.thread != threading.get_ident():
            return
        held.depth -= 1
        if held.depth:
            return
        with stops_held():
            del _HELD[target]
            try:
                os.unlink(held.lock)
            except OSError:
                pass
            os.close(held.fd)
            _remove_made(held.made)


@contextmanager
def _holding(target: Path, flag: str, shown: Path, what: str) -> Iterator[None]:
    try:
        _acquire(target, flag, shown, what)
        yield
    finally:
        _release(target)


def _file_holding(target: Path, flag: str, shown: Path, what: str) -> AbstractContextManager[None]:
    """The hold of a single file: of its folder when that is a result folder (a trace
    written into ``--out``, a profile fitted into its raw folder), so no lock file is
    made inside a result, which holds only the files its marker lists."""
    parent = target.parent
    if parent in _HELD or read_marker(parent) is not None:
        return _holding(parent, flag, shown, what)
    # a folder another command holds (a trace named inside the --out a run writes)
    _check_not_held_elsewhere(parent, flag, shown, what)
    return _holding(target, flag, shown, what)


def _check_not_held_elsewhere(folder: Path, flag: str, shown: Path, what: str) -> None:
    """Refuse when another process holds ``folder`` (its lock taken, without making
    anything: a shared lock tried and let go)."""
    try:
        fd = os.open(_lock_path(folder), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError):
        return  # none there (or none that could be one)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(flag, shown, what, _holder(fd)) from None
    finally:
        os.close(fd)


def _check_unchanged(target: Path, flag: str, shown: Path, what: str) -> None:
    """Refuse to replace a result that was put at ``target`` after this command took
    hold of it (by something that does not take the lock): replacing it would lose it."""
    held = _HELD.get(target)
    now = _found(target)
    if held is not None and now is not None and now != held.found:
        raise _fail(
            flag,
            shown,
            f"another {what} was put there while this command worked; both are kept",
        )


@contextmanager
def hold_folder(path: str | Path, flag: str = "--out") -> Iterator[Previous | None]:
    """Check ``path`` as :func:`check_folder` does and hold it until the ``with`` ends:
    another disaggsim command that would write there is refused meanwhile (one line
    naming the folder), and :func:`write_folder` inside the ``with`` writes under this
    hold. Yields the earlier result there, as found once held. A lock left by a killed
    command (SIGKILL) is taken over."""
    path = Path(path)
    check_folder(path, flag)
    target = _normal(path)
    with _holding(target, flag, path, "folder"):
        yield check_folder(path, flag)  # again: a command may have finished meanwhile


@contextmanager
def hold_file(
    path: str | Path, flag: str, owned: Callable[[Path], bool], what: str = "file"
) -> Iterator[bool]:
    """:func:`hold_folder` for a single file (:func:`check_file`, :func:`write_file`);
    yields whether a file disaggsim wrote is there."""
    check_file(path, flag, owned, what)
    target = _normal(Path(path))
    with _file_holding(target, flag, Path(path), what):
        yield check_file(path, flag, owned, what)


# ---------------------------------------------------------------------------------------
# writers


def _tmp_sibling(path: Path, kind: str, folder: bool) -> Path:
    """A new hidden sibling of ``path`` (``.NAME.tmp-XXXXXXXX``), created with the
    default permissions (unlike :func:`tempfile.mkdtemp`, which makes it private)."""
    stem = f".{path.name[: _TMP_NAME_CHARS - 16]}.{kind}-"
    for _ in range(100):
        cand = path.parent / (stem + secrets.token_hex(4))
        try:
            if folder:
                os.mkdir(cand)
            else:
                os.close(os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return cand
    raise FileExistsError(f"no free temporary name beside {path}")


def _make_parents(target: Path) -> list[Path]:
    """Make the folders above ``target`` that do not exist (``results/`` of a default
    output); returns them, deepest first, for :func:`_remove_made`."""
    made = [p for p in target.parents if not os.path.lexists(p)]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except BaseException:  # some made, then refused (a name too long further down)
        _remove_made(made)
        raise
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the folders :func:`_make_parents` made, when a write fails: an empty
    ``results/`` was left behind by a command that wrote nothing."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break  # something else is in it now: left as it is


def write_folder(
    path: str | Path,
    render: Callable[[Path], object],
    command: str,
    flag: str = "--out",
) -> Written:
    """Write a result folder: ``render(tmp)`` writes its files into a temporary sibling,
    a marker listing them is added, then the folder is moved into place (replacing an
    earlier disaggsim result there, whose listed files alone are deleted)."""
    path = Path(path)
    check_folder(path, flag)
    # Built and moved at the checked location (folders above resolved): "r/../r" through
    # a folder that does not exist yet, or one that is renamed aside, names another place
    # once "r" is made or moved.
    target = _normal(path)
    with _holding(target, flag, path, "folder"):  # held already by a command's hold_folder
        return _write_folder_held(path, target, render, command, flag)


def _write_folder_held(
    path: Path, target: Path, render: Callable[[Path], object], command: str, flag: str
) -> Written:
    earlier = check_folder(path, flag) is not None
    made: list[Path] = []
    tmp = None
    try:
        with stops_held():  # made and known to the cleanup below as one step
            made = _make_parents(target)
            tmp = _tmp_sibling(target, "tmp", folder=True)
        render(tmp)
        names = sorted(os.listdir(tmp))
        for n in names:
            if not (tmp / n).is_file():  # result folders are flat: a folder is a bug
                raise RuntimeError(f"result folder entry {n} is not a file")
        _write_marker(tmp, command, names)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(made)
        if isinstance(e, OSError) and tmp is not None:  # the disk refused a file
            raise _write_failed(flag, path, e, tmp, "result", earlier) from None
        raise
    try:
        replaced, left_in = _move_into_place(tmp, target, flag, shown=path)
    except (UserError, OSError) as e:
        # the folder changed while the work ran, or the system refused the move (an
        # immutable or busy folder, one owned by another user in a sticky folder): the
        # finished result is kept beside it and named, not deleted
        raise _unplaced(tmp, target, flag, path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(made)
        raise
    return Written(
        path=path, files=tuple(path / n for n in names), replaced=replaced, left_in=left_in
    )


def _unplaced(tmp: Path, target: Path, flag: str, shown: Path, e: Exception) -> UserError:
    """One line for a finished result (a folder or a file) that could not be put at
    ``shown``: why, and the visible sibling that holds it (the hidden temporary one,
    renamed)."""
    kept = tmp
    folder = tmp.is_dir()
    for _ in range(100):
        name = f"{target.name[: _NAME_MAX_BYTES - _TMP_NAME_CHARS]}.unplaced-{secrets.token_hex(4)}"
        cand = target.parent / name
        try:
            # claimed empty (a folder or a file), then replaced by the rename
            if folder:
                os.mkdir(cand)
            else:
                os.close(os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.rename(tmp, cand)
        except FileExistsError:
            continue
        except OSError:
            try:
                cand.rmdir() if folder else cand.unlink()
            except OSError:
                pass
            break
        kept = cand
        break
    why = str(e) if isinstance(e, UserError) else f"{getattr(e, 'strerror', None) or e}"
    if isinstance(e, UserError) and why.startswith(f"{flag} {shown}: "):
        why = why[len(f"{flag} {shown}: ") :]
    elif isinstance(e, UserError) and flag.startswith(_DEFAULT) and why.startswith(f"{shown} ("):
        why = why.split("): ", 1)[-1]
    where = f"{kept}/" if folder else str(kept)
    return _fail(flag, shown, f"could not put the result there ({why}); it is in {where}")


def _write_marker(folder: Path, command: str, names: Iterable[str]) -> None:
    """Write ``folder``'s marker whole or not at all: a new one is written beside it and
    renamed over it (a full disk truncated the marker of an earlier result in place, which
    then read as a folder of files disaggsim did not write)."""
    doc = {"written_by": "disaggsim", "command": command, "files": sorted(names)}
    with stops_held():  # a stop between opening and writing left an empty marker
        tmp = folder / f"{MARKER}.tmp-{secrets.token_hex(4)}"
        try:
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, folder / MARKER)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _delete_listed(folder: Path, previous: Previous) -> list[str]:
    """Delete the files an earlier result's manifest lists (and its marker), nothing else;
    returns the names the system refused to delete."""
    refused = []
    for name in (*previous.files, MARKER):
        if _is_folder(folder / name):
            continue  # not a file that result wrote (check_folder refuses it first)
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            refused.append(name)
    return refused


def claim_folder(path: str | Path, command: str, flag: str = "--out") -> Previous | None:
    """For long measurements that write as they go (and must keep partial data when
    stopped): check ``path`` as :func:`check_folder` does, delete an earlier result's
    listed files, create the folder and mark it. Call :func:`seal_folder` when done (also
    on failure), so the marker lists what was written. Returns what was replaced."""
    path = Path(path)
    check_folder(path, flag)
    target = _normal(path)
    # held until seal_folder: another command measuring into the same folder is refused
    _acquire(target, flag, path, "folder")
    try:
        previous = check_folder(path, flag)
        with stops_held():  # the earlier files deleted, the folder marked: one step
            if previous is not None and _delete_listed(target, previous):
                raise _fail(
                    flag, target, "could not delete the earlier result's files; delete them"
                )
            target.mkdir(parents=True, exist_ok=True)
            _write_marker(target, command, [])
    except BaseException:
        _release(target)
        raise
    return previous


def seal_folder(path: str | Path, command: str) -> None:
    """List every file now in a claimed folder in its marker. On a full disk (a measurement
    stopped by it) the new marker may not fit beside the old one: it is then written over
    the old one in place, whose blocks it reuses (else the folder's measured files stayed
    unlisted, and the next command refused the folder as holding files disaggsim did not
    write)."""
    path = _normal(Path(path))
    try:
        if path.is_dir():
            names = [n for n in os.listdir(path) if n != MARKER]
            try:
                _write_marker(path, command, names)
            except OSError:
                doc = {"written_by": "disaggsim", "command": command, "files": sorted(names)}
                with stops_held():
                    (path / MARKER).write_text(json.dumps(doc) + "\n", encoding="utf-8")
    finally:
        _release(path)  # claim_folder's hold


def _move_into_place(
    tmp: Path, path: Path, flag: str, shown: Path
) -> tuple[Previous | None, Path | None]:
    """Move the finished ``tmp`` to ``path``: (the earlier result it replaced, the hidden
    folder left holding earlier files the system refused to delete). An OSError leaves
    ``path`` as it was. A stop (Ctrl-C, SIGTERM) is held back until the moves are done:
    one between the two renames left the earlier result hidden in ``.NAME.old-XXXXXXXX``
    and the new one deleted."""
    with stops_held():
        return _move_into_place_held(tmp, path, flag, shown)


def _move_into_place_held(
    tmp: Path, path: Path, flag: str, shown: Path
) -> tuple[Previous | None, Path | None]:
    # Checked again: the disk may have changed while the simulation ran.
    previous = check_folder(shown, flag)
    _check_unchanged(path, flag, shown, "result")
    if not path.exists() or previous is None:  # none, or an empty folder: replaced atomically
        os.rename(tmp, path)
        return None, None
    # An earlier result: move it aside, move the new one in, then delete only the files
    # its manifest lists (and the folder, if nothing else appeared in it meanwhile).
    old = _tmp_sibling(path, "old", folder=True)
    try:
        os.rename(path, old)  # onto the new empty folder
    except BaseException:
        os.rmdir(old)  # not left behind empty
        raise
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    refused = _delete_listed(old, previous)
    try:
        old.rmdir()
    except OSError:
        # something else is in it (left rather than deleted), or files it could not delete
        return previous, (old if refused else None)
    return previous, None


def write_file(
    path: str | Path,
    write: Callable[[Path], object],
    flag: str,
    owned: Callable[[Path], bool],
    what: str = "file",
) -> Written:
    """Write one file: ``write(tmp)`` fills a temporary sibling, which then replaces
    ``path`` atomically. ``path`` must be new or a file ``owned`` recognises."""
    _check_file_name(path, flag, what)
    path = Path(path)
    check_file(path, flag, owned, what)
    target = _normal(path)  # as in write_folder: "t/../t" would make "t" first
    with _file_holding(target, flag, path, what):  # held already by a command's hold_file
        return _write_file_held(path, target, write, flag, owned, what)


def _write_file_held(
    path: Path,
    target: Path,
    write: Callable[[Path], object],
    flag: str,
    owned: Callable[[Path], bool],
    what: str,
) -> Written:
    existed = check_file(path, flag, owned, what)
    made: list[Path] = []
    tmp = None
    try:
        with stops_held():  # made and known to the cleanup below as one step
            made = _make_parents(target)
            tmp = _tmp_sibling(target, "tmp", folder=False)
        write(tmp)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        _remove_made(made)
        if isinstance(e, OSError) and tmp is not None:  # the disk refused the file
            raise _write_failed(flag, path, e, None, what, existed) from None
        raise
    # the file put in place and listed in its folder's marker: one step (a stop between
    # them left a result folder holding a file its marker did not list)
    with stops_held():
        try:
            existed = check_file(path, flag, owned, what)
            _check_unchanged(target, flag, path, what)
            os.replace(tmp, target)
        except (UserError, OSError) as e:  # kept and named, as a result folder is
            raise _unplaced(tmp, target, flag, path, e) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            _remove_made(made)
            raise
        # A file written into a result folder (a profile fitted into its raw folder) joins
        # that result's manifest, so replacing the result later replaces it too.
        folder = read_marker(target.parent)
        if folder is not None and target.name not in folder.files:
            try:
                _write_marker(target.parent, folder.command, [*folder.files, target.name])
            except OSError as e:  # a file its marker does not list: taken back out
                if not existed:
                    target.unlink(missing_ok=True)
                raise _write_failed(flag, path, e, None, what, existed) from None
    previous = Previous(command=what, files=(path.name,)) if existed else None
    return Written(path=path, files=(path,), replaced=previous)


def json_owned(*keys: str) -> Callable[[Path], bool]:
    """Recogniser for JSON files disaggsim writes: a mapping holding all of ``keys``."""

    def owned(p: Path) -> bool:
        doc = read_json(p, _NotOurs)
        return isinstance(doc, dict) and all(k in doc for k in keys)

    return owned


def prefix_owned(prefix: str) -> Callable[[Path], bool]:
    """Recogniser for files disaggsim writes that start with a fixed text."""
    head = prefix.encode()

    def owned(p: Path) -> bool:
        try:
            return read_regular(p, _NotOurs, len(head), head=True) == head
        except _NotOurs:
            return False

    return owned


# A hardware profile disaggsim wrote (``calibrate fit``, ``fit-steps``, ``fit_public``).
PROFILE_OWNED = json_owned("schema_version", "gpu", "ops", "provenance")
