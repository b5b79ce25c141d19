"""A training run on disk: progress bar, metrics JSONL, checkpoints, resume, final plot.

Whatever stops a run (Ctrl-C, SIGTERM, an env that raises, diverging updates) leaves a
checkpoint of the last finished update, from which ``resume_from`` continues exactly.

Layout of ``output_dir``::

    config.json          PPOConfig and base model of the run
    metrics.jsonl        one line of metrics per update
    checkpoints/step_N/  policy (peft adapter + value head) + optimizer + RNG + trainer state
                         + env replay record
    final/               the trained policy (PPOPolicy.load(output_dir / "final"))
    learning_curve.png   return and invalid-reply rate over the run
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict
from peft.utils import load_peft_weights
from tqdm.auto import tqdm

from textgym_agents.checkpoint import (
    atomic_write_json,
    discard_checkpoints_after,
    latest_checkpoint,
    load_checkpoint,
    load_tensors,
    optimizer_state_from_files,
    optimizer_state_to_files,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from textgym_agents.ppo.trainer import NonFiniteUpdateError
from textgym_agents.tracking import MetricsLogger, plot_learning_curves

__all__ = ["Terminated", "TrainingRun", "find_checkpoint"]

logger = logging.getLogger(__name__)


class Terminated(SystemExit):
    """SIGTERM stopped training after a checkpoint; uncaught, the process exits with code 143.

    Example:
        >>> Terminated().code
        143
    """

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def find_checkpoint(path: str | Path) -> Path:
    """Return the checkpoint directory for a run directory (its latest) or a checkpoint path."""
    path = Path(path)
    if (path / "trainer_state.json").is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"No checkpoint found in {path}")
    return found


class TrainingRun:
    """Drives a :class:`~textgym_agents.ppo.trainer.PPOTrainer` and writes its run directory."""

    def __init__(self, trainer: Any) -> None:
        """Attach to a trainer (its ``output_dir`` decides whether files are written)."""
        self.trainer = trainer
        self.output_dir: Path | None = trainer.output_dir
        self._saved_step: int | None = None  # update step of the last checkpoint written
        self._boundary: dict[str, Any] | None = None  # RNG/env state the update began with
        self._in_update = False  # trainer.step() is running

    def run(
        self,
        total_episodes: int,
        *,
        resume_from: str | Path | None = None,
        callback: Callable[[dict[str, float]], Any] | None = None,
    ) -> dict[str, float]:
        """Train until ``total_episodes`` episodes have finished (counting resumed ones).

        Ctrl-C checkpoints the last finished update, then re-raises ``KeyboardInterrupt``;
        SIGTERM does the same and raises :class:`Terminated`. ``resume_from=output_dir``
        continues from there. Once an update has started changing the weights, the signal waits
        for it to finish; a second one stops at once, unsaved. An exception (an
        :class:`~textgym_agents.ppo.tracked.EnvFault`, a
        :class:`~textgym_agents.ppo.trainer.NonFiniteUpdateError`, ...) also checkpoints the
        last finished update before it propagates, with a note naming the checkpoint.
        """
        trainer, config = self.trainer, self.trainer.config
        if not (isinstance(total_episodes, int) and total_episodes >= 1):
            raise ValueError(f"total_episodes must be an int >= 1, got {total_episodes!r}")
        if resume_from is not None:
            self.resume(resume_from)
        else:
            torch.manual_seed(config.seed)
        metrics_logger = None
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            logger.info("Writing the run to %s", self.output_dir)
            if config.progress:
                tqdm.write(f"Writing the run to {self.output_dir}")
            atomic_write_json(
                self.output_dir / "config.json",
                {"ppo": config.to_dict(), "base": trainer.policy.base_info},
            )
            metrics_logger = MetricsLogger(self.output_dir, report_to=config.report_to)
            if resume_from is not None:
                # Continue from the checkpoint: later metrics and checkpoints belong to the
                # abandoned continuation of the run.
                metrics_logger.truncate_after(trainer.update_step)
                discard_checkpoints_after(self.output_dir, trainer.update_step)
        bar = tqdm(
            total=total_episodes,
            initial=min(trainer.episodes, total_episodes),
            unit="ep",
            disable=not config.progress,
            dynamic_ncols=True,
        )
        interrupts = _Interrupts(trainer.optimizer)
        self._saved_step = None
        self._in_update = False
        try:
            try:
                with interrupts:
                    metrics = self._loop(total_episodes, bar, metrics_logger, callback, interrupts)
            finally:
                bar.close()
                if metrics_logger is not None:
                    metrics_logger.close()
        except (KeyboardInterrupt, Terminated):
            self._interrupted(mid_update=interrupts.critical)
            raise
        except Exception as error:
            self._failed(error, mid_update=interrupts.critical)
            raise
        if self.output_dir is not None:
            self.checkpoint()
            trainer.policy.save(self.output_dir / "final")
            plot_learning_curves([self.output_dir], self.output_dir / "learning_curve.png")
        return metrics

    def _loop(
        self,
        total_episodes: int,
        bar: Any,
        metrics_logger: MetricsLogger | None,
        callback: Callable[[dict[str, float]], Any] | None,
        interrupts: _Interrupts,
    ) -> dict[str, float]:
        trainer, config = self.trainer, self.trainer.config
        metrics: dict[str, float] = {}
        while trainer.episodes < total_episodes:
            before = trainer.episodes
            # What a checkpoint written during this update (a signal, a fault) must hold.
            self._snapshot()
            self._in_update = True
            try:
                metrics = trainer.step()  # Ctrl-C is held once the weights change
            except NonFiniteUpdateError as error:
                # The update ran to its end: log it, and the checkpoint will hold it.
                self._finished_update(error.metrics, metrics_logger, interrupts)
                raise
            self._finished_update(metrics, metrics_logger, interrupts)
            bar.update(min(trainer.episodes, total_episodes) - min(before, total_episodes))
            bar.set_postfix(_postfix(metrics), refresh=False)
            if callback is not None and callback(metrics) is False:
                break
            every = config.save_every
            if self.output_dir is not None and every and trainer.update_step % every == 0:
                with interrupts.held():
                    self.checkpoint()
                self._saved_step = trainer.update_step
            interrupts.raise_pending()
        return metrics

    def _finished_update(
        self, metrics: dict[str, float], metrics_logger: MetricsLogger | None, interrupts: Any
    ) -> None:
        self._in_update = False
        interrupts.critical = False
        if metrics_logger is not None:
            metrics_logger.log(metrics, step=self.trainer.update_step)

    def _snapshot(self) -> None:
        """Keep the RNG and env state the next update starts from (besides weights/optimizer).

        They move on during the rollout; a checkpoint written after a signal or a fault in it
        must hold them as they were when the update began.
        """
        trainer, collector = self.trainer, self.trainer.collector
        envs = None
        if collector is not None:
            envs = trainer.envs.state()
            envs["collector"] = {
                "started": collector.observations is not None,
                "resetting": collector.resetting.tolist(),
                "returns": collector.returns.tolist(),
                "lengths": collector.lengths.tolist(),
                "invalid": collector.invalid.tolist(),
                "reports_success": collector.reports_success,
            }
        # The update's first step draws its minibatch order from trainer.rng, before any
        # weight changes: a Ctrl-C while it scores must not save the advanced generator.
        numpy_rng = trainer.rng.bit_generator.state
        self._boundary = {"rng": rng_state(), "numpy_rng": numpy_rng, "envs": envs}

    def _interrupted(self, mid_update: bool) -> None:
        """Ctrl-C or SIGTERM: checkpoint the last finished update, unless already saved."""
        step = self.trainer.update_step
        if self.output_dir is None:
            return
        if mid_update:
            # A second signal stopped an update (or its checkpoint) half-way: the weights may
            # match no update step, so nothing is saved; earlier checkpoints stay.
            logger.warning("Training stopped at once after update %d; no new checkpoint", step)
            return
        logger.warning("Training interrupted after update %d; checkpoint %s", step, self._save())

    def _failed(self, error: Exception, mid_update: bool) -> None:
        """An exception stops training: checkpoint the last finished update, note where."""
        step = self.trainer.update_step
        if self.output_dir is None:
            return
        if mid_update:
            note = (
                f"Training failed during update {step + 1}, after it had changed the weights: "
                f"no checkpoint of it was written (the latest is in {self.output_dir})"
            )
        else:
            try:
                path = self._save()
            except Exception as save_error:  # the original error matters more
                note = f"Training failed after update {step}; its checkpoint failed too: "
                note += repr(save_error)
            else:
                note = f"Training failed after update {step}; checkpoint {path} (resume_from it)"
        logger.error("%s: %s", note, error)
        if hasattr(error, "add_note"):  # Python >= 3.11 shows it under the traceback
            error.add_note(note)

    def _save(self) -> Path:
        step = self.trainer.update_step
        if self._saved_step == step:
            return self.output_dir / "checkpoints" / f"step_{step:08d}"  # type: ignore[operator]
        path = self.checkpoint()
        self._saved_step = step
        return path

    def checkpoint(self) -> Path:
        """Write a checkpoint of the policy, optimizer, RNG, env record and trainer state.

        RNG and env states are those the next update starts from (taken before it began when
        it is under way), so a run resumed from it continues as the uninterrupted one would.
        """
        trainer = self.trainer
        if self.output_dir is None:
            raise ValueError("The trainer has no output_dir to write checkpoints to")
        if not self._in_update or self._boundary is None:
            self._snapshot()
        boundary = self._boundary
        optimizer_tensors, optimizer_meta = optimizer_state_to_files(trainer.optimizer.state_dict())
        rng_tensors, rng_meta = boundary["rng"]  # type: ignore[index]
        state = {
            "update_step": trainer.update_step,
            "episodes": trainer.episodes,
            "turns": trainer.turns,
            "kl_coef": float(trainer.kl_ctl.value),
            "numpy_rng": boundary["numpy_rng"],  # type: ignore[index]
            "nonfinite_streak": trainer.nonfinite_streak,
            "nonfinite_total": trainer.nonfinite_total,
        }
        json_files = {"trainer_state": state, "optimizer": optimizer_meta, "rng": rng_meta}
        if boundary["envs"] is not None:  # type: ignore[index]
            json_files["envs"] = boundary["envs"]  # type: ignore[index]
        return save_checkpoint(
            self.output_dir,
            trainer.update_step,
            tensors={"optimizer": optimizer_tensors, "rng": rng_tensors},
            json_files=json_files,
            keep=trainer.config.keep_checkpoints,
            extra=trainer.policy.save_files,
        )

    def resume(self, path: str | Path) -> None:
        """Restore policy weights, optimizer, RNG and counters from a checkpoint."""
        trainer, policy = self.trainer, self.trainer.policy
        checkpoint = find_checkpoint(path)
        tensors, files = load_checkpoint(checkpoint)
        adapter = load_peft_weights(str(checkpoint / "adapter"), device=str(policy.device))
        set_peft_model_state_dict(policy.model, adapter)
        policy.value_head.load_state_dict(load_tensors(checkpoint / "value_head.safetensors"))
        trainer.optimizer.load_state_dict(
            optimizer_state_from_files(tensors["optimizer"], files["optimizer"])
        )
        set_rng_state(tensors["rng"], files["rng"])
        state = files["trainer_state"]
        trainer.update_step = int(state["update_step"])
        trainer.episodes = int(state["episodes"])
        trainer.turns = int(state["turns"])
        trainer.kl_ctl.value = float(state["kl_coef"])
        trainer.rng.bit_generator.state = state["numpy_rng"]
        trainer.nonfinite_streak = int(state.get("nonfinite_streak", 0))
        trainer.nonfinite_total = int(state.get("nonfinite_total", 0))
        if trainer.collector is not None:
            self._restore_envs(files.get("envs"))
        logger.info("Resumed from %s at update %d", checkpoint, trainer.update_step)

    def _restore_envs(self, saved: dict[str, Any] | None) -> None:
        """Replay the envs to where the checkpoint left them, else start fresh episodes."""
        trainer, collector = self.trainer, self.trainer.collector
        if saved is not None and not saved["collector"]["started"]:
            return  # saved before the first rollout: that rollout resets the envs as usual
        observations = trainer.envs.restore(saved) if saved is not None else None
        if observations is None:
            # Seeded by step, so the fresh episodes still do not depend on when we resumed.
            collector.reset(seed=trainer.config.seed + 1000 * trainer.update_step)
            return
        counters = saved["collector"]  # type: ignore[index]
        collector.observations = observations
        collector.resetting[:] = counters["resetting"]
        collector.returns[:] = counters["returns"]
        collector.lengths[:] = counters["lengths"]
        collector.invalid[:] = counters["invalid"]
        collector.reports_success = bool(counters["reports_success"])


class _Interrupts:
    """Ctrl-C or SIGTERM during training stops at a state that can be checkpointed and resumed.

    A signal during the rollout or the scoring of an update raises at once
    (``KeyboardInterrupt`` for SIGINT, :class:`Terminated` for SIGTERM): the weights are still
    those of the last finished update. Once the optimizer has started changing the weights (and
    while a checkpoint is written), the first signal is held until that is done; a second one
    stops at once. Handlers are only installed in the main thread, over the default ones.
    """

    _DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    _NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.critical = False  # the weights are between two update steps
        self.pending: int | None = None  # the signal held until the update ends
        self._previous: dict[int, Any] = {}
        self._hook: Any = None

    def __enter__(self) -> _Interrupts:
        self._hook = self.optimizer.register_step_pre_hook(self._weights_change)
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
        if not self.critical or self.pending is not None:
            _raise(signum)
        self.pending = signum
        name = self._NAMES[signum]
        # A write from a signal handler can collide with the progress bar's own write.
        with suppress(Exception):
            tqdm.write(
                f"{name}: finishing this update, then saving a checkpoint "
                f"({name} again to stop at once without saving it)",
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
        """Raise the signal held during the last update or checkpoint."""
        self.critical = False
        if self.pending is not None:
            _raise(self.pending)


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated
    raise KeyboardInterrupt


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    postfix = {}
    if "env/return_mean" in metrics:
        postfix["return"] = f"{metrics['env/return_mean']:.3f}"
    postfix["invalid"] = f"{metrics.get('env/invalid_rate', 0.0):.1%}"
    postfix["turns/s"] = f"{metrics.get('throughput/turns_per_s', 0.0):.1f}"
    return postfix
