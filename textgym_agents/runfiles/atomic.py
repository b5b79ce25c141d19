"""Atomic writes: a file or a directory at a path is either the old version or the new one.

Each write goes to a temp file or directory next to the target, is fsynced, then renamed into
place (files via :mod:`textgym.atomic`); :mod:`textgym_agents.runfiles.checkpoint` builds on these.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from textgym.atomic import atomic_file as _atomic_file
from textgym.atomic import atomic_write_bytes
from textgym.atomic import atomic_write_json as _atomic_write_json
from textgym.atomic import fsync_dir as _fsync_dir
from textgym_agents.exceptions import RunFileError

logger = logging.getLogger(__name__)

__all__ = [
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_json",
    "load_tensors",
    "open_log_file",
    "open_run_file",
    "read_fd",
    "remove_path",
    "save_tensors",
]


def open_run_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` a file of a run directory without following a symbolic link at ``path``.

    Returns:
        The file descriptor.

    Raises:
        RunFileError: ``path`` is a symbolic link (the message names it).

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / "train.lock").symlink_to(d / "elsewhere")
        >>> open_run_file(d / "train.lock", os.O_RDWR | os.O_CREAT)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        textgym_agents.exceptions.RunFileError: [Errno 40] .../train.lock is a symbolic link; ...
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno != errno.ELOOP or not os.path.islink(path):
            raise
        raise RunFileError(
            errno.ELOOP,
            f"{path} is a symbolic link; a run file must be a regular file inside its run "
            "directory (remove the link, or write the run to another directory)",
        ) from None


def read_fd(fd: int) -> bytes:
    """Everything left to read from ``fd``, from its current offset."""
    return b"".join(iter(lambda: os.read(fd, 1 << 20), b""))


def open_log_file(path: str | os.PathLike[str]) -> tuple[int, bytes]:
    r"""Open a run's line log (``*.jsonl``) to append: ``(file descriptor, its complete lines)``.

    Never through a symbolic link (:func:`open_run_file`); a partial last line, left by a
    writer killed mid-line, is cut off the file first (with a warning) and left out of the
    lines returned.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> _ = path.write_bytes(b'{"step": 1}\n{"st')
        >>> fd, lines = open_log_file(path)
        >>> os.close(fd); lines, path.read_bytes()
        (b'{"step": 1}\n', b'{"step": 1}\n')
    """
    fd = open_run_file(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        data = read_fd(fd)
        if data and not data.endswith(b"\n"):
            logger.warning("%s: dropping a truncated last line left by a killed run", path)
            data = data[: data.rfind(b"\n") + 1]
            os.ftruncate(fd, len(data))
    except BaseException:
        os.close(fd)
        raise
    return fd, data


def _refuse(obj: Any) -> Any:
    raise TypeError(
        f"Cannot write {type(obj).__name__} to JSON; put tensors in `tensors=` or encode the "
        "object with state_to_files()"
    )


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (:func:`textgym.atomic.atomic_write_json`).

    Tensors are refused with a hint: they belong in safetensors files (:func:`save_tensors`).

    Example:
        >>> import tempfile, pathlib, json
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.json"
        >>> atomic_write_json(p, {"step": 3}); json.loads(p.read_text())
        {'step': 3}
    """
    _atomic_write_json(path, obj, default=_refuse)


def save_tensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> None:
    """Atomically write ``tensors`` to a safetensors file (moved to CPU; shared storage is fine).

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.safetensors"
        >>> w = torch.arange(4.0)
        >>> save_tensors(p, {"w": w, "head": w[:2]}); load_tensors(p)["head"]
        tensor([0., 1.])
    """
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TypeError(f"safetensors metadata must map str to str, got {metadata!r}")
    seen: set[int] = set()
    prepared = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Expected a torch.Tensor for {name!r}, got {type(tensor).__name__}")
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        # safetensors refuses tensors that alias each other; copies break the aliasing.
        prepared[name] = t.clone() if ptr in seen and t.numel() else t
        seen.add(ptr)
    with _atomic_file(path) as tmp:
        safetensors.torch.save_file(prepared, tmp, metadata=metadata)


def load_tensors(path: str | os.PathLike[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file (see :func:`save_tensors`)."""
    return safetensors.torch.load_file(path, device=device)


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp directory next to ``path`` that becomes ``path`` on a clean exit.

    Files in it are fsynced, then it is renamed to ``path``. If ``path`` exists it is renamed to
    ``path.old-<random>`` first, the new directory is renamed in, and the old one deleted. A crash
    between those two renames leaves no ``path``: the previous version survives as ``path.old-*``
    and the new one as ``path.tmp-*``, both ignored by
    :func:`~textgym_agents.runfiles.checkpoint.latest_checkpoint` and removed by the next
    :func:`~textgym_agents.runfiles.checkpoint.save_checkpoint`. On an exception the temp directory
    is removed and ``path`` is untouched.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "out"
        >>> with atomic_directory(p) as tmp:
        ...     _ = (tmp / "f.txt").write_text("x")
        >>> sorted(q.name for q in p.iterdir())
        ['f.txt']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f"{path.name}.tmp-"))
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                fd = os.open(Path(root) / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(Path(root))
        aside = None
        if path.exists() or path.is_symlink():
            aside = path.with_name(f"{path.name}.old-{secrets.token_hex(4)}")
            os.rename(path, aside)
        try:
            os.rename(tmp, path)  # the crash window described above ends here
        except BaseException:
            if aside is not None:
                os.rename(aside, path)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    if aside is not None:
        # The new version is in place; the next checkpoint save removes leftovers too.
        with contextlib.suppress(OSError):
            remove_path(aside)


def remove_path(path: Path) -> None:
    """Delete a file, a symlink or a directory tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
