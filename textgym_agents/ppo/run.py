"""A training run on disk: progress bar, metrics JSONL, checkpoints, resume, final plot.

Whatever stops a run (Ctrl-C, SIGTERM, an env that raises, diverging updates) leaves a
checkpoint of the last finished update, from which ``resume_from`` continues exactly. With
several processes (``accelerate launch``) only the main one writes files; every one resumes.

Layout of ``output_dir``::

    config.json          PPOConfig and base model of the run
    metrics.jsonl        one line of metrics per update
    episodes.jsonl       a few episodes per update, turn by turn (capped in size)
    checkpoints/step_N/  policy (peft adapter + value head) + optimizer + RNG + trainer state
                         + env replay record (+ rng_rankR, rankR: those of process R > 0)
    final/               the trained policy (PPOPolicy.load(output_dir / "final"))
    learning_curve.png   return, success and invalid-reply rates against episodes
    train.lock           while a process trains into it (see textgym_agents.runfiles.run_lock)

A checkpoint that fails to write (a full disk) stops the run with
:class:`~textgym_agents.exceptions.CheckpointWriteError`; the earlier checkpoints stay intact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from textgym.env_records import env_record
from textgym_agents.distributed.signals import StopSignals
from textgym_agents.exceptions import CheckpointWriteError, NonFiniteUpdateError, SIGTERMExit
from textgym_agents.ppo.run_files import (
    find_checkpoint,
    restore_checkpoint,
    write_checkpoint,
    write_or_stop,
)
from textgym_agents.ppo.tracked import rollout_state
from textgym_agents.runfiles.atomic import atomic_write_json
from textgym_agents.runfiles.checkpoint import checkpoint_dirs, discard_checkpoints_after, rng_state
from textgym_agents.runfiles.run_lock import RunLock
from textgym_agents.tracking.episode_samples import EpisodeSampleLog
from textgym_agents.tracking.metrics_log import METRICS_FILE, MetricsLogger, read_metrics
from textgym_agents.tracking.plotting import plot_run

if TYPE_CHECKING:  # the trainer imports this driver (PPOTrainer.train), never the reverse
    from textgym_agents.ppo.trainer import PPOTrainer

__all__ = ["TrainingRun", "find_checkpoint"]

logger = logging.getLogger(__name__)


class TrainingRun:
    """Drives a :class:`~textgym_agents.ppo.trainer.PPOTrainer` and writes its run directory."""

    def __init__(self, trainer: PPOTrainer) -> None:
        """Attach to a trainer (its ``output_dir`` decides whether files are written)."""
        self.trainer = trainer
        self.process = trainer.process  # the processes of the run (one unless launched)
        self.output_dir: Path | None = trainer.output_dir
        self._saved_step: int | None = None  # update step of the last checkpoint written
        self._boundary: dict[str, Any] | None = None  # RNG/env state the update began with
        self._in_update = False  # trainer.step() is running
        self._episode_log: EpisodeSampleLog | None = None  # episodes.jsonl, while running

    def run(
        self,
        total_episodes: int,
        *,
        resume_from: str | Path | None = None,
        callback: Callable[[dict[str, float]], Any] | None = None,
    ) -> dict[str, float]:
        """Train until ``total_episodes`` episodes have finished (counting resumed ones).

        Ctrl-C checkpoints the last finished update, then re-raises ``KeyboardInterrupt``;
        SIGTERM does the same and raises :class:`~textgym_agents.exceptions.SIGTERMExit`.
        ``resume_from=output_dir`` continues from there. Once an update has started changing
        the weights, the signal waits for it to finish; a second one stops at once, unsaved. An
        exception (an :class:`~textgym_agents.exceptions.EnvFault`, a
        :class:`~textgym_agents.exceptions.NonFiniteUpdateError`, ...) also checkpoints the
        last finished update before it propagates, with a note naming the checkpoint.

        With several processes, episodes are counted over all of them, a signal stops them all
        at the end of the rollout or update under way (see
        :class:`~textgym_agents.distributed.signals.StopSignals`), a failed rollout stops them
        all, and the main process writes the files while the others wait.
        """
        if not (isinstance(total_episodes, int) and total_episodes >= 1):
            raise ValueError(f"total_episodes must be an int >= 1, got {total_episodes!r}")
        writes = self.output_dir is not None and self.process.is_main
        # One writer per run directory: a second process is refused before it reads anything.
        with RunLock(self.output_dir) if writes else contextlib.nullcontext():  # type: ignore[arg-type]
            return self._run(total_episodes, resume_from, callback)

    def _run(
        self,
        total_episodes: int,
        resume_from: str | Path | None,
        callback: Callable[[dict[str, float]], Any] | None,
    ) -> dict[str, float]:
        trainer, config, process = self.trainer, self.trainer.config, self.process
        if trainer.envs is not None:  # recorded in config.json and every saved policy
            trainer.policy.trained_env = env_record(trainer.envs)
        fresh = resume_from is None and trainer.update_step == 0
        if resume_from is not None:
            self.resume(resume_from)
            process.barrier()  # all have read the checkpoint before the main process prunes
        else:
            if fresh:
                self._refuse_a_started_run()
            torch.manual_seed(process.seed(config.seed))
        metrics_logger = None
        if self.output_dir is not None and process.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            logger.info("Writing the run to %s", self.output_dir)
            if config.progress:
                tqdm.write(f"Writing the run to {self.output_dir}")
            atomic_write_json(
                self.output_dir / "config.json",
                {
                    "ppo": config.to_dict(),
                    "base": trainer.policy.base_info,
                    "env": trainer.policy.trained_env,
                },
            )
            metrics_file = self.output_dir / METRICS_FILE
            earlier_start = fresh and metrics_file.is_file() and metrics_file.stat().st_size > 0
            metrics_logger = MetricsLogger(self.output_dir, report_to=config.report_to)
            if config.sample_episodes:
                self._episode_log = EpisodeSampleLog(self.output_dir)
            # Later metrics (and checkpoints) belong to an abandoned continuation: after the
            # checkpoint resumed from, or, at a fresh start, a run stopped before its first save.
            if resume_from is not None:
                metrics_logger.truncate_after(trainer.update_step)
                if self._episode_log is not None:
                    self._episode_log.truncate_after(trainer.update_step)
                discard_checkpoints_after(self.output_dir, trainer.update_step)
            elif earlier_start:
                if self._episode_log is not None:
                    self._episode_log.truncate_after(0)
                if dropped := metrics_logger.truncate_after(0):
                    logger.warning(
                        "%s: dropped %d metrics rows of an earlier start that saved no checkpoint",
                        self.output_dir,
                        dropped,
                    )
        bar = tqdm(
            total=total_episodes,
            initial=min(trainer.episodes, total_episodes),
            unit="ep",
            disable=not (config.progress and process.is_main),
            dynamic_ncols=True,
        )
        interrupts = StopSignals(trainer.optimizer, process)
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
                if self._episode_log is not None:
                    self._episode_log.close()
                    self._episode_log = None
        except (KeyboardInterrupt, SIGTERMExit):
            self._interrupted(mid_update=interrupts.critical)
            raise
        except Exception as error:
            self._failed(error, mid_update=interrupts.critical)
            raise
        if self.output_dir is not None:
            self.checkpoint()
            if process.is_main:
                final = self.output_dir / "final"
                write_or_stop(self.output_dir, final, lambda: trainer.policy.save(final))
                plot_run(self.output_dir)
        process.barrier()  # learn() returns everywhere once the run directory is complete
        return metrics

    def _refuse_a_started_run(self) -> None:
        """Refuse a fresh start in a directory holding another run's checkpoints (not lost)."""
        if self.output_dir is None:
            return
        saved = checkpoint_dirs(self.output_dir)
        if saved:
            raise ValueError(
                f"{self.output_dir} already holds checkpoints of a run (up to {saved[-1].name}); "
                f"continue it with train(..., resume_from='{self.output_dir}') or give another "
                "output_dir"
            )

    def _loop(
        self,
        total_episodes: int,
        bar: Any,
        metrics_logger: MetricsLogger | None,
        callback: Callable[[dict[str, float]], Any] | None,
        interrupts: StopSignals,
    ) -> dict[str, float]:
        trainer, config = self.trainer, self.trainer.config
        metrics: dict[str, float] = {}
        while trainer.episodes < total_episodes:
            before = trainer.episodes
            # What a checkpoint written during this update (a signal, a fault) must hold.
            self._snapshot()
            if config.anneal_lr:
                lr = trainer.anneal_learning_rates(total_episodes)
            self._in_update = True
            try:
                metrics = trainer.step()  # Ctrl-C is held once the weights change
            except NonFiniteUpdateError as error:
                # The update ran to its end: log it, and the checkpoint will hold it.
                self._finished_update(error.metrics, metrics_logger, interrupts)
                raise
            if config.anneal_lr:
                metrics["train/learning_rate"] = lr
            self._finished_update(metrics, metrics_logger, interrupts)
            bar.update(min(trainer.episodes, total_episodes) - min(before, total_episodes))
            bar.set_postfix(_postfix(metrics), refresh=False)
            stop = callback is not None and callback(metrics) is False
            if self.process.stop_check(stop=stop):  # all processes stop after the same update
                break
            every = config.save_every
            if self.output_dir is not None and every and trainer.update_step % every == 0:
                with interrupts.held():
                    self.checkpoint()
                self._saved_step = trainer.update_step
            interrupts.raise_pending()
        return metrics or self._metrics_so_far()

    def _metrics_so_far(self) -> dict[str, float]:
        """What a run returns when no update is left (resumed at or past its total episodes).

        The last logged update's metrics when the run directory has them, else the counts.
        """
        trainer = self.trainer
        if self.output_dir is not None and (self.output_dir / METRICS_FILE).exists():
            for record in reversed(read_metrics(self.output_dir)):
                if record["step"] == trainer.update_step:
                    return {k: v for k, v in record.items() if k not in ("step", "time")}
        return {"env/episodes": float(trainer.episodes), "train/update": float(trainer.update_step)}

    def _finished_update(
        self, metrics: dict[str, float], metrics_logger: MetricsLogger | None, interrupts: Any
    ) -> None:
        self._in_update = False
        interrupts.critical = False
        if metrics_logger is not None:
            metrics_logger.log(metrics, step=self.trainer.update_step)
        if self._episode_log is not None:  # never stops training: a failure is a warning
            self._episode_log.append(self.trainer.episode_samples)

    def _snapshot(self) -> None:
        """Keep the RNG and env state the next update starts from (besides weights/optimizer).

        They move on during the rollout; a checkpoint written after a signal or a fault in it
        must hold them as they were when the update began.
        """
        trainer, collector = self.trainer, self.trainer.collector
        envs = rollout_state(trainer.envs, collector) if collector is not None else None
        # The update's first step draws its minibatch order from trainer.rng, before any
        # weight changes: a Ctrl-C while it scores must not save the advanced generator.
        numpy_rng = trainer.rng.bit_generator.state
        self._boundary = {"rng": rng_state(), "numpy_rng": numpy_rng, "envs": envs}

    def _consistent(self, mid_update: bool, error: BaseException | None = None) -> bool:
        """Whether every process stopped at the last finished update (so it can be saved)."""
        if mid_update or not self.process.enabled:
            return not mid_update
        # Each process stops wherever it is on its own (a second signal, most errors): the
        # others are not at the same point, so no collective checkpoint can be written.
        return self.process.stopped_together or isinstance(error, NonFiniteUpdateError)

    def _interrupted(self, mid_update: bool) -> None:
        """Ctrl-C or SIGTERM: checkpoint the last finished update, unless already saved."""
        step = self.trainer.update_step
        if self.output_dir is None:
            return
        if not self._consistent(mid_update):
            # A second signal stopped an update (or its checkpoint) half-way: the weights may
            # match no update step, so nothing is saved; earlier checkpoints stay.
            logger.warning("Training stopped at once after update %d; no new checkpoint", step)
            return
        path = self._save_together()
        if self.process.is_main:
            logger.warning("Training interrupted after update %d; checkpoint %s", step, path)

    def _failed(self, error: Exception, mid_update: bool) -> None:
        """An exception stops training: checkpoint the last finished update, note where."""
        step = self.trainer.update_step
        if self.output_dir is None:
            return
        if isinstance(error, CheckpointWriteError):
            return  # its message says it all and was logged; another save would fail too
        if mid_update:
            note = (
                f"Training failed during update {step + 1}, after it had changed the weights: "
                f"no checkpoint of it was written (the latest is in {self.output_dir})"
            )
        elif not self._consistent(mid_update, error):
            note = (
                f"Training failed after update {step} in process {self.process.rank} alone: no "
                f"checkpoint of it was written (the latest is in {self.output_dir})"
            )
        else:
            try:
                path = self._save_together()
            except Exception as save_error:  # the original error matters more
                note = f"Training failed after update {step}; its checkpoint failed too: "
                note += repr(save_error)
            else:
                note = f"Training failed after update {step}; checkpoint {path} (resume_from it)"
        logger.error("%s: %s", note, error)
        if hasattr(error, "add_note"):  # Python >= 3.11 shows it under the traceback
            error.add_note(note)

    def _save_together(self) -> Path:
        try:
            return self._save()
        finally:
            self.process.barrier()  # the others wait until the main process has written it

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
        With several processes every one calls it (their states are gathered); the main one
        writes the files, the others return the path it writes to.
        """
        trainer = self.trainer
        if self.output_dir is None:
            raise ValueError("The trainer has no output_dir to write checkpoints to")
        if not self._in_update or self._boundary is None:
            self._snapshot()
        boundary: dict[str, Any] = self._boundary  # type: ignore[assignment]
        rng_tensors, rng_meta = boundary["rng"]
        own = {"rng": rng_meta, "numpy_rng": boundary["numpy_rng"], "envs": boundary["envs"]}
        # Each process's RNG and envs, to the main process (with one process: its own).
        ranks = self.process.gather_state(rng_tensors, own)
        if not self.process.is_main:
            return self.output_dir / "checkpoints" / f"step_{trainer.update_step:08d}"
        return write_checkpoint(trainer, self.process, self.output_dir, boundary, ranks)

    def resume(self, path: str | Path) -> None:
        """Restore policy weights, optimizer, RNG and counters from a checkpoint.

        Every process reads it: the shared weights, optimizer and counters, and its own RNG and
        env state (process R > 0 from ``rng_rankR`` / ``rankR``).
        """
        restore_checkpoint(self.trainer, self.process, path)


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    postfix = {}
    if "env/return_mean" in metrics:
        postfix["return"] = f"{metrics['env/return_mean']:.3f}"
    postfix["invalid"] = f"{metrics.get('env/invalid_rate', 0.0):.1%}"
    postfix["turns/s"] = f"{metrics.get('throughput/turns_per_s', 0.0):.1f}"
    return postfix
