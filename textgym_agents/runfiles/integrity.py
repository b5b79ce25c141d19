"""File listings with sizes and SHA-256 hashes, so a damaged checkpoint or policy is refused.

A directory written by :mod:`textgym_agents.runfiles.checkpoint` or
:func:`~textgym_agents.runfiles.policy_files.save_policy` ends with a manifest listing every file
beside it (its size and hash), written last. :func:`find_damage` compares a directory with its
listing before anything is loaded: a truncated file (a full disk, a partial copy), a changed byte
(bit rot) or a missing file is reported by name, instead of surfacing later as a raw library error.

Example:
    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "weights.bin").write_bytes(b"0123456789")
    >>> listing = file_listing(d)
    >>> listing["weights.bin"]["bytes"], find_damage(d, listing)
    (10, None)
    >>> _ = (d / "weights.bin").write_bytes(b"01234")
    >>> find_damage(d, listing)
    'weights.bin is 5 bytes, expected 10 (truncated or replaced)'
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from textgym_agents.exceptions import CheckpointError

__all__ = ["CheckpointError", "confined", "file_listing", "find_damage", "raise_if_damaged"]

_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def confined(root: Path, name: Any) -> Path | None:
    """``root / name`` when ``name`` is a relative path that stays inside ``root``, else None.

    A manifest is data: a name that is absolute, climbs out with ``..``, or reaches a symbolic
    link pointing outside ``root`` would make a check read (and hash) a file elsewhere.

    Example:
        >>> import pathlib, tempfile
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> confined(root, "adapter/adapter_config.json") == root / "adapter/adapter_config.json"
        True
        >>> confined(root, "../secret"), confined(root, "/etc/passwd")
        (None, None)
    """
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return None
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        return None
    path = root / relative
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return None
    return path if inside else None


def file_listing(directory: str | os.PathLike[str], exclude: Container[str] = ()) -> dict[str, Any]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` of every file under ``directory``.

    Args:
        directory: The directory to describe (walked recursively; paths use ``/``).
        exclude: Relative paths to leave out (the manifest that will hold the listing).

    Returns:
        The listing, sorted by path.
    """
    root = Path(directory)
    listing = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name not in exclude:
            listing[name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    return listing


def find_damage(directory: str | os.PathLike[str], listing: Mapping[str, Any]) -> str | None:
    """The first way ``directory`` differs from ``listing``, in words, or None if it matches.

    Files not in the listing are ignored (a user may add notes); sizes are compared before
    hashes, so a truncated file costs no read.

    Args:
        directory: The directory to check.
        listing: What :func:`file_listing` returned when the directory was written.

    Returns:
        A sentence naming the damaged file and how it differs, or None.
    """
    try:
        return _find_damage(Path(directory), listing)
    except OSError as e:  # unreadable, or removed while we looked (a live run pruning it)
        return f"{getattr(e, 'filename', None) or directory} is unreadable ({e.strerror or e})"


def _find_damage(root: Path, listing: Mapping[str, Any]) -> str | None:
    if not isinstance(listing, Mapping):
        return f"its file listing is not an object: {type(listing).__name__}"
    for name in listing:
        if confined(root, name) is None:
            return f"the listing names {name!r}, which is not a file inside {root}"
    for name, expected in sorted(listing.items()):
        path = root / name
        if not isinstance(expected, Mapping) or not {"bytes", "sha256"} <= set(expected):
            return f"the listing entry of {name} is malformed: {expected!r}"
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{name} is {size} bytes, expected {expected['bytes']} (truncated or replaced)"
    for name, expected in sorted(listing.items()):
        if _sha256(root / name) != expected["sha256"]:
            return f"{name} does not match its SHA-256 hash (its contents changed or are corrupt)"
    return None


def raise_if_damaged(
    directory: str | os.PathLike[str], listing: Mapping[str, Any], what: str
) -> None:
    """Raise :class:`CheckpointError` naming ``what``, the file and the reason, if damaged.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> raise_if_damaged(d, {"a.bin": {"bytes": 1, "sha256": "0"}}, "The policy")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        textgym_agents.exceptions.CheckpointError: The policy ... is damaged: a.bin is missing
    """
    problem = find_damage(directory, listing)
    if problem is not None:
        raise CheckpointError(f"{what} {directory} is damaged: {problem}")
