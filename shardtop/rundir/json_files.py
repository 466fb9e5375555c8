"""Small JSON files a run directory holds, written whole: replaced atomically, or created once.

Readers on any host of a shared file system see the old file or the new one,
never half of one; of several writers racing to create a file, exactly one
wins.  No torch here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

JsonValue: TypeAlias = "None | bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue]"
"""What JSON holds: what ``json.loads`` returns, and what ``json.dumps`` writes (a tuple as an array).
Read-only containers, so that a ``list[str]`` or a ``dict[str, int]`` is one too."""
JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object being made for ``json.dumps``: a report, a plan, a record of the run directory."""


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    """``data`` as JSON, replacing ``path`` whole (``write_atomic``)."""
    write_atomic(path, _json(data))


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` whole or not at all; a failed write (a full disk) leaves no ``.tmp`` file behind."""
    tmp = _write_tmp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_once(path: Path, data: Mapping[str, object]) -> bool:
    """``data`` as JSON, in ``path`` unless it exists (``write_once``)."""
    return write_once(path, _json(data))


def write_once(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists: two writers never both win. True if this one did.

    The file is written under a private name and hard-linked into place (atomic
    on local disks and NFS alike); on a file system without hard links,
    ``O_EXCL`` decides instead.
    """
    if path.exists():
        return False
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(tmp.read_bytes())
        except BaseException:
            path.unlink(missing_ok=True)  # half a record is worse than none
            raise
        return True
    finally:
        os.unlink(tmp)


def _json(data: Mapping[str, object]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


def _write_tmp(path: Path, data: bytes) -> Path:
    """``data`` in a new hidden file beside ``path``; removed again if it cannot be written whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp
