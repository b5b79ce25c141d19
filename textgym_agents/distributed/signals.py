"""Ctrl-C / SIGTERM during training: stop at a state that can be checkpointed and resumed.

:class:`StopSignals` holds a signal while the weights are between two update steps and, with
several processes, makes them all stop at the same point (through :mod:`.collectives`).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch
from tqdm.auto import tqdm

from textgym_agents.distributed.collectives import Distributed
from textgym_agents.exceptions import raise_signal

__all__ = ["StopSignals"]


class StopSignals:
    """Ctrl-C or SIGTERM during training stops at a state that can be checkpointed and resumed.

    One process: a signal during the rollout or the scoring of an update raises at once
    (``KeyboardInterrupt`` for SIGINT, :class:`~textgym_agents.exceptions.SIGTERMExit` for
    SIGTERM), as the weights are still those of the last finished update. Once the optimizer
    has started changing the weights (and while a checkpoint is written), the first signal is
    held until that is done.

    Several processes: the first signal is always held until the next
    :meth:`~textgym_agents.distributed.collectives.Distributed.stop_check` (the end of this
    process's rollout, or of the update), where every process learns of it and all stop
    together. In both cases a second signal stops this process at once. Handlers are only
    installed in the main thread, over the default ones.

    Example:
        >>> import torch
        >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> with StopSignals(optimizer) as stops:
        ...     with stops.held():  # a checkpoint being written: a first signal would wait
        ...         stops.critical
        True
        >>> stops.critical, stops.pending  # no signal arrived: raise_pending() does nothing
        (False, None)
    """

    _DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    _NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __init__(
        self, optimizer: torch.optim.Optimizer, process: Distributed | None = None
    ) -> None:
        """Watch ``optimizer`` steps (they make the weights critical) for ``process``."""
        self.optimizer = optimizer
        self.process = process or Distributed()
        self.critical = False  # the weights are between two update steps
        self.pending: int | None = None  # the signal held until the update ends
        self._previous: dict[int, Any] = {}
        self._hook: Any = None

    def __enter__(self) -> StopSignals:
        self._hook = self.optimizer.register_step_pre_hook(self._weights_change)
        self.process.pending_signal, self.process.stopped_together = 0, False
        if threading.current_thread() is threading.main_thread():
            for signum, default in self._DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hook.remove()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _weights_change(self, *args: Any) -> None:
        self.critical = True

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.pending is not None or not (self.critical or self.process.enabled):
            raise_signal(signum)
        self.pending = self.process.pending_signal = signum
        name = self._NAMES[signum]
        what = "finishing this update, then saving a checkpoint"
        if self.process.enabled:
            what = "every process stops after this rollout or update, with a checkpoint"
        # A write from a signal handler can collide with the progress bar's own write.
        if self.process.is_main:
            with suppress(Exception):
                tqdm.write(
                    f"{name}: {what} ({name} again to stop at once without saving it)",
                    file=sys.stderr,
                )

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the first signal while the block runs (a checkpoint being written)."""
        self.critical = True
        try:
            yield
        finally:
            self.critical = False

    def raise_pending(self) -> None:
        """Raise the signal held during the last update or checkpoint (on every process)."""
        self.critical = False
        if self.process.enabled:
            self.process.stop_check()
        elif self.pending is not None:
            raise_signal(self.pending)
