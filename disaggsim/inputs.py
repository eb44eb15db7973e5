"""Reading a JSON file a user names (a profile, a base profile, MoE parameters, a
regression reference): every way it can fail is one line naming the file, raised as the
caller's error class (``UserError`` or ``ProfileError``), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 2**20


def read_json(path: str | Path, error: type[Exception]) -> Any:
    """The parsed contents of ``path``; ``error(message)`` when it is missing,
    unreadable, larger than 64 MiB, not UTF-8, not JSON or nested too deeply."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise error(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MiB")
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
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
