"""A training run on disk: progress bar, metrics JSONL, checkpoints, resume, final plot.

Layout of ``output_dir``::

    config.json          PPOConfig and base model of the run
    metrics.jsonl        one line of metrics per update
    checkpoints/step_N/  policy (peft adapter + value head) + optimizer + RNG + trainer state
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
from textgym_agents.tracking import MetricsLogger, plot_learning_curves

__all__ = ["TrainingRun", "find_checkpoint"]

logger = logging.getLogger(__name__)


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

    def run(
        self,
        total_episodes: int,
        *,
        resume_from: str | Path | None = None,
        callback: Callable[[dict[str, float]], Any] | None = None,
    ) -> dict[str, float]:
        """Train until ``total_episodes`` episodes have finished (counting resumed ones).

        Ctrl-C checkpoints the last finished update, then re-raises ``KeyboardInterrupt``;
        ``resume_from=output_dir`` continues from there. Once an update has started changing
        the weights, Ctrl-C waits for it to finish; a second Ctrl-C stops at once, unsaved.
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
        try:
            try:
                with interrupts:
                    metrics = self._loop(total_episodes, bar, metrics_logger, callback, interrupts)
            finally:
                bar.close()
                if metrics_logger is not None:
                    metrics_logger.close()
        except KeyboardInterrupt:
            self._interrupted(mid_update=interrupts.critical)
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
            metrics = trainer.step()  # Ctrl-C is held once the weights change
            interrupts.critical = False
            if metrics_logger is not None:
                metrics_logger.log(metrics, step=trainer.update_step)
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

    def _interrupted(self, mid_update: bool) -> None:
        """Ctrl-C: checkpoint the state of the last finished update, unless already saved."""
        step = self.trainer.update_step
        if self.output_dir is None:
            return
        if mid_update:
            # A second Ctrl-C stopped an update (or its checkpoint) half-way: the weights may
            # match no update step, so nothing is saved; earlier checkpoints stay.
            logger.warning("Training stopped at once after update %d; no new checkpoint", step)
            return
        if self._saved_step != step:
            path = self.checkpoint()
        else:
            path = self.output_dir / "checkpoints" / f"step_{step:08d}"
        logger.warning("Training interrupted after update %d; checkpoint %s", step, path)

    def checkpoint(self) -> Path:
        """Write a checkpoint of the policy, optimizer, RNG and trainer state."""
        trainer = self.trainer
        if self.output_dir is None:
            raise ValueError("The trainer has no output_dir to write checkpoints to")
        optimizer_tensors, optimizer_meta = optimizer_state_to_files(trainer.optimizer.state_dict())
        rng_tensors, rng_meta = rng_state()
        state = {
            "update_step": trainer.update_step,
            "episodes": trainer.episodes,
            "turns": trainer.turns,
            "kl_coef": float(trainer.kl_ctl.value),
            "numpy_rng": trainer.rng.bit_generator.state,
        }
        return save_checkpoint(
            self.output_dir,
            trainer.update_step,
            tensors={"optimizer": optimizer_tensors, "rng": rng_tensors},
            json_files={"trainer_state": state, "optimizer": optimizer_meta, "rng": rng_meta},
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
        if trainer.collector is not None:
            # Env states cannot be saved; resumed runs start fresh episodes, seeded by step.
            trainer.collector.reset(seed=trainer.config.seed + 1000 * trainer.update_step)
        logger.info("Resumed from %s at update %d", checkpoint, trainer.update_step)


class _Interrupts:
    """Ctrl-C during training stops at a state that can be checkpointed and resumed.

    A Ctrl-C (SIGINT) during the rollout or the scoring of an update raises
    ``KeyboardInterrupt`` at once: the weights are still those of the last finished update.
    Once the optimizer has started changing the weights (and while a checkpoint is written),
    the first Ctrl-C is held until that is done; a second one stops at once. The handler is
    only installed in the main thread and over Python's default one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.critical = False  # the weights are between two update steps
        self.pending = False
        self._previous: Any = None
        self._hook: Any = None

    def __enter__(self) -> _Interrupts:
        self._hook = self.optimizer.register_step_pre_hook(self._weights_change)
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hook.remove()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _weights_change(self, *args: Any) -> None:
        self.critical = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not self.critical or self.pending:
            raise KeyboardInterrupt
        self.pending = True
        # A write from a signal handler can collide with the progress bar's own write.
        with suppress(Exception):
            tqdm.write(
                "Ctrl-C: finishing this update, then saving a checkpoint "
                "(Ctrl-C again to stop at once without saving it)",
                file=sys.stderr,
            )

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the first Ctrl-C while the block runs (a checkpoint being written)."""
        self.critical = True
        try:
            yield
        finally:
            self.critical = False

    def raise_pending(self) -> None:
        """Raise the Ctrl-C held during the last update or checkpoint."""
        self.critical = False
        if self.pending:
            raise KeyboardInterrupt


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    postfix = {}
    if "env/return_mean" in metrics:
        postfix["return"] = f"{metrics['env/return_mean']:.3f}"
    postfix["invalid"] = f"{metrics.get('env/invalid_rate', 0.0):.1%}"
    postfix["turns/s"] = f"{metrics.get('throughput/turns_per_s', 0.0):.1f}"
    return postfix
