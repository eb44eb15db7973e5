"""Reading a file a user names (a scenario, a profile, a base profile, MoE parameters, a
regression reference, a result folder's marker, a ``cost --input`` table, a trace):
every way it can fail is one line naming the file, raised as the caller's error class
(``UserError`` or ``ProfileError``), never a traceback and never a hang.

A path that names something other than a regular file (a folder, a named pipe, a device
such as ``/dev/zero``, a socket; a symbolic link is followed) is refused before it is
opened for reading: a named pipe blocks the reader until another process writes to it,
and a device may never end.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 2**20


def kind_of(mode: int) -> str:
    """What a ``st_mode`` names, in words: ``a folder``, ``a named pipe (FIFO)``, ..."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def regular_file(path: str | Path, error: type[Exception], what: str = "file") -> Path:
    """``path`` when it is a regular file (a symbolic link to one included); otherwise
    ``error("PATH: <what> not found")`` or ``error("PATH: a named pipe (FIFO), not a
    <what>")`` (a folder, a device, a socket likewise). Call before opening a file a user
    named."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, no permission
        raise error(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(mode):
        raise error(f"{path}: {kind_of(mode)}, not a {what}")
    return path


def read_regular(
    path: str | Path, error: type[Exception], limit: int, what: str = "file", *, head: bool = False
) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`regular_file`), at most
    ``limit`` of them: a larger file is ``error("PATH: larger than ...")``, or with
    ``head`` its first ``limit`` bytes. Opened without blocking, so a path swapped for a
    named pipe after the check cannot hang."""
    path = regular_file(path, error, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: {kind_of(mode)}, not a {what}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        if head:
            return data[:limit]
        raise error(f"{path}: larger than the {limit:,} bytes a {what} may have")
    return data


def read_json(path: str | Path, error: type[Exception], what: str = "file") -> Any:
    """The parsed contents of ``path``; ``error(message)`` when it is missing, not a
    regular file, unreadable, larger than 64 MiB, not UTF-8, not JSON or nested too
    deeply."""
    path = Path(path)
    data = read_regular(path, error, MAX_JSON_BYTES, what)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply") from None
