"""The exceptions that stop a training run, in one place (re-exported by ``textgym_agents``).

Each one is raised only after the last finished update has been checkpointed.
"""

from __future__ import annotations

import signal

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "EnvFault",
    "NonFiniteUpdateError",
    "PeerFailure",
    "RunFileError",
    "RunLockedError",
    "SIGTERMExit",
    "raise_signal",
]


class SIGTERMExit(SystemExit):
    """SIGTERM stopped training after a checkpoint; uncaught, the process exits with code 143.

    The SIGTERM counterpart of ``KeyboardInterrupt`` (SIGINT). A ``SystemExit``, so a batch
    scheduler sees the conventional 128 + 15.

    Example:
        >>> SIGTERMExit().code
        143
        >>> isinstance(SIGTERMExit(), SystemExit)
        True
    """

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def raise_signal(signum: int) -> None:
    """Raise what a stop signal means: :class:`SIGTERMExit` for SIGTERM, else KeyboardInterrupt.

    Example:
        >>> import signal
        >>> try:
        ...     raise_signal(signal.SIGTERM)
        ... except SIGTERMExit as stop:
        ...     stop.code
        143
    """
    if signum == signal.SIGTERM:
        raise SIGTERMExit
    raise KeyboardInterrupt


class PeerFailure(RuntimeError):
    """Another process of a distributed run failed in its rollout; this one stops with it.

    Example:
        >>> isinstance(PeerFailure("process 1 failed"), RuntimeError)
        True
    """


class NonFiniteUpdateError(FloatingPointError):
    """Several updates in a row had a non-finite loss or gradient: training cannot go on.

    Raised by :meth:`~textgym_agents.ppo.trainer.PPOTrainer.update` once the update has been
    fully accounted for (its finite optimizer steps applied, counters advanced), so the state
    can be checkpointed.

    Attributes:
        metrics: The metrics of the update that raised.

    Example:
        >>> error = NonFiniteUpdateError("Updates 1-3 ...", {"loss/total": float("nan")})
        >>> error.metrics
        {'loss/total': nan}
    """

    def __init__(self, message: str, metrics: dict[str, float]) -> None:
        super().__init__(message)
        self.metrics = metrics


class EnvFault(RuntimeError):
    """An env raised during ``step`` or ``reset``; the original exception is the ``__cause__``.

    Attributes:
        index: Index of the env in the vector env (None when it cannot be told).
        phase: ``"step"`` or ``"reset"``.
        episode: The env's episode (1 = its first of the run) during which it raised.
        step: The step of that episode (1 = its first action); 0 for a reset.

    Example:
        >>> str(EnvFault(2, "step", 5, 3, ValueError("boom")))
        'env 2 raised ValueError during step 3 of its episode 5: boom'
    """

    def __init__(
        self, index: int | None, phase: str, episode: int, step: int, error: BaseException
    ) -> None:
        self.index, self.phase, self.episode, self.step = index, phase, episode, step
        who = "an env (index unknown)" if index is None else f"env {index}"
        where = (
            f"step {step} of its episode {episode}"
            if phase == "step"
            else f"reset (starting its episode {episode})"
        )
        super().__init__(f"{who} raised {type(error).__name__} during {where}: {error}")


class CheckpointError(RuntimeError):
    """A checkpoint or saved policy is damaged or incomplete, or none in a run is intact.

    The message names the directory, the file and what is wrong with it (missing, truncated,
    a changed hash, unreadable).

    Example:
        >>> str(CheckpointError("runs/bj/checkpoints/step_00000003 is damaged: ..."))[:8]
        'runs/bj/'
    """


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (a full disk, a read-only directory): training stopped.

    An ``OSError`` with the failed write's ``errno`` (``errno.ENOSPC`` for a full disk). The
    checkpoint being written was discarded; earlier ones are intact. ``textgym train`` exits
    with code 74 (``EX_IOERR``).

    Example:
        >>> import errno
        >>> error = CheckpointWriteError(errno.ENOSPC, "No space left on device")
        >>> error.errno == errno.ENOSPC, isinstance(error, OSError)
        (True, True)
    """


class RunFileError(OSError):
    """A file of a run directory is a symbolic link, so writing it could change another file.

    Run files (``train.lock``, ``metrics.jsonl``) are opened without following links: a link
    planted in a shared run directory cannot make training overwrite or truncate its target.

    Example:
        >>> import errno
        >>> RunFileError(errno.ELOOP, "runs/bj/train.lock is a symbolic link").errno == errno.ELOOP
        True
    """


class RunLockedError(RuntimeError):
    """Another live process is training into this run directory (see ``run_lock.RunLock``).

    Example:
        >>> isinstance(RunLockedError("runs/bj is being written by pid 7"), RuntimeError)
        True
    """
