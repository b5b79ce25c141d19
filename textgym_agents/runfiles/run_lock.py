"""One writer per run directory: an exclusive lock held while a process trains into it.

``PPOPolicy.learn`` / ``PPOTrainer.train`` (and ``textgym train``, from before its first
evaluation) hold ``RUN_DIR/train.lock``, an advisory ``flock`` lock on a file that names the
owner (pid, host, start time). A second process pointed at the same directory is refused with
:class:`RunLockedError` naming the owner, instead of interleaving checkpoints and metrics.

Stale locks cannot block anyone: the kernel releases a ``flock`` lock when its process dies
(even by SIGKILL), so a lock file left by a dead run is taken over, with a log line naming the
pid that left it. The lock is re-entrant within a process (``textgym train`` holds it and
calls ``learn``, which takes it again). It needs POSIX ``fcntl`` (Linux, macOS) and a file
system whose ``flock`` works across the processes involved (local disks; on NFS only within
one host).

Example:
    >>> import tempfile
    >>> run = tempfile.mkdtemp()
    >>> with RunLock(run):
    ...     with RunLock(run):  # the same process may take it again
    ...         pass
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from textgym_agents.exceptions import RunLockedError
from textgym_agents.runfiles.atomic import open_run_file

__all__ = ["LOCK_FILE", "RunLock", "RunLockedError"]

logger = logging.getLogger(__name__)

LOCK_FILE = "train.lock"
_HELD: dict[str, tuple[int, int]] = {}  # lock path -> (file descriptor, depth), this process


def _owner(path: Path) -> dict[str, Any]:
    try:
        owner = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


class RunLock:
    """Hold the lock of a run directory for the duration of a ``with`` block.

    Args:
        run_dir: The run directory (created if missing).

    Raises:
        RunLockedError: Another live process holds the lock (on entering the block).
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        """Name the run directory whose lock :meth:`acquire` takes."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._key: str | None = None  # the resolved lock path, fixed when acquired

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunLockedError` naming the process that holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        key = self._key = str(self.path.resolve())
        if key in _HELD:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth + 1)
            return
        while True:
            fd = open_run_file(self.path, os.O_RDWR | os.O_CREAT)  # never through a link
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = _owner(self.path)
                raise RunLockedError(
                    f"{self.run_dir} is being written by another training process (pid "
                    f"{owner.get('pid', '?')} on {owner.get('host', '?')}, since "
                    f"{owner.get('started', '?')}); wait for it to finish or stop it, or write "
                    "this run to another directory"
                ) from None
            # The holder may have removed the file between our open and our lock: then we
            # hold a lock on a file nobody else will open. Retry on the current file.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _owner(self.path)
        if previous:
            logger.info("Taking over %s left by pid %s (it ended)", self.path, previous.get("pid"))
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        except OSError:  # a full disk: give the lock back rather than hold it unnamed
            os.close(fd)
            raise
        _HELD[key] = (fd, 1)

    def release(self) -> None:
        """Give the lock back (the file is removed when the outermost holder releases it)."""
        key = self._key
        if key is None or key not in _HELD:
            raise RuntimeError(f"{self.path} is not held by this process")
        fd, depth = _HELD[key]
        if depth > 1:
            _HELD[key] = (fd, depth - 1)
            return
        del _HELD[key]
        try:
            self.path.unlink(missing_ok=True)  # while still locked: no one holds the old file
        finally:
            os.close(fd)  # releases the flock

    def __enter__(self) -> RunLock:
        """Acquire the lock."""
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Release the lock."""
        self.release()
