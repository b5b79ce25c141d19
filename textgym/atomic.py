"""Atomic file writes: a file at a path is either the old version or the new one, never a mix.

Each write goes to a temp file next to the target, is fsynced, then renamed into place.
``textgym_agents.runfiles.atomic`` builds tensors and checkpoint directories on these.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["atomic_file", "atomic_write_bytes", "atomic_write_json", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Flush a directory: a rename is only durable once the directory holding it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; its renames are journaled anyway.
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp file next to ``path``; on a clean exit it is fsynced and becomes ``path``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> with atomic_file(p) as tmp:
        ...     _ = tmp.write_text("new")
        >>> p.read_text()
        'new'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a mix.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.bin"
        >>> atomic_write_bytes(p, b"hi"); p.read_bytes()
        b'hi'
    """
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, *, default: Callable[[Any], Any] | None = None
) -> None:
    """Atomically write ``obj`` as indented JSON (numpy scalars and paths become plain values).

    NaN and infinities are written as Python's ``NaN``/``Infinity`` so they round-trip.

    Args:
        path: The file to write.
        obj: JSON-ready data.
        default: Converts what JSON cannot hold, past numpy scalars and paths (which become
            plain values), or raises ``TypeError`` (as ``json.dumps``'s ``default``).

    Example:
        >>> import tempfile, pathlib, json
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.json"
        >>> atomic_write_json(p, {"step": np.int64(3)}); json.loads(p.read_text())
        {'step': 3}
    """

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if default is not None:
            return default(value)
        raise TypeError(f"Cannot write {type(value).__name__} to JSON")

    atomic_write_bytes(path, json.dumps(obj, indent=2, default=plain).encode() + b"\n")
