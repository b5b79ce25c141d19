"""A training run's checkpoints: finding the one to resume, writing one, restoring from one.

What :class:`~textgym_agents.ppo.run.TrainingRun` saves and loads, apart from its loop: the
files of a checkpoint (policy, optimizer, every process's RNG and env record, counters), the
choice of the newest intact checkpoint, and a write failure turned into one clear error.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from peft import set_peft_model_state_dict
from peft.utils import load_peft_weights

from textgym_agents.exceptions import CheckpointWriteError
from textgym_agents.ppo.tracked import restore_rollout
from textgym_agents.runfiles.atomic import load_tensors
from textgym_agents.runfiles.checkpoint import (
    MANIFEST,
    check_intact,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    optimizer_state_from_files,
    optimizer_state_to_files,
    save_checkpoint,
    set_rng_state,
)

if TYPE_CHECKING:
    from textgym_agents.distributed.collectives import Distributed
    from textgym_agents.ppo.trainer import PPOTrainer

__all__ = ["find_checkpoint", "restore_checkpoint", "write_checkpoint", "write_or_stop"]

logger = logging.getLogger(__name__)


def find_checkpoint(path: str | Path) -> Path:
    """Return the checkpoint to resume from: a run directory's newest intact one, or ``path``.

    Raises:
        FileNotFoundError: ``path`` is neither a checkpoint nor a run with checkpoints.
        CheckpointError: ``path`` is a damaged checkpoint, or a run none of whose checkpoints
            is intact (damaged newer ones are skipped with a warning).
    """
    path = Path(path)
    if (path / "trainer_state.json").is_file() or (path / MANIFEST).is_file():
        check_intact(path)
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"No checkpoint found in {path}")
    return found


def write_checkpoint(
    trainer: PPOTrainer,
    process: Distributed,
    output_dir: Path,
    boundary: dict[str, Any],
    ranks: list[Any],
) -> Path:
    """Write the main process's checkpoint of ``trainer`` at its update step.

    Args:
        trainer: The trainer (weights, optimizer, counters).
        process: The processes of the run.
        output_dir: The run directory.
        boundary: The RNG and env state the next update starts from.
        ranks: Every process's RNG tensors and state (``process.gather_state``).

    Raises:
        CheckpointWriteError: The checkpoint could not be written (see :func:`write_or_stop`).
    """
    rng_tensors, rng_meta = boundary["rng"]
    optimizer_tensors, optimizer_meta = optimizer_state_to_files(trainer.optimizer.state_dict())
    state = {
        "update_step": trainer.update_step,
        "episodes": trainer.episodes,
        "turns": trainer.turns,
        "kl_coef": float(trainer.kl_ctl.value),
        "ent_coef": float(trainer.ent_ctl.value),
        "numpy_rng": boundary["numpy_rng"],
        "nonfinite_streak": trainer.nonfinite_streak,
        "nonfinite_total": trainer.nonfinite_total,
    }
    if trainer.novelty is not None:
        state["visit_counts"] = trainer.novelty.state()
    if trainer.choice_returns is not None:
        state["choice_returns"] = trainer.choice_returns.state()
    if trainer.replay is not None:
        state["self_imitation"] = trainer.replay.state()
    if trainer.state_returns is not None:
        state["state_returns"] = trainer.state_returns.state()
    json_files = {"trainer_state": state, "optimizer": optimizer_meta, "rng": rng_meta}
    tensors = {"optimizer": optimizer_tensors, "rng": rng_tensors}
    if boundary["envs"] is not None:
        json_files["envs"] = boundary["envs"]
    if process.enabled:
        state["world_size"] = process.world_size
    for rank, (rank_tensors, rank_meta) in enumerate(ranks[1:], start=1):
        tensors[f"rng_rank{rank}"] = rank_tensors
        json_files[f"rank{rank}"] = rank_meta
    for key, callback in _saved_callbacks(trainer):
        tensors[key], json_files[key] = callback.checkpoint_state()
    return write_or_stop(
        output_dir,
        output_dir / "checkpoints" / f"step_{trainer.update_step:08d}",
        lambda: save_checkpoint(
            output_dir,
            trainer.update_step,
            tensors=tensors,
            json_files=json_files,
            keep=trainer.config.keep_checkpoints,
            extra=trainer.policy.save_files,
        ),
    )


def restore_checkpoint(trainer: PPOTrainer, process: Distributed, path: str | Path) -> None:
    """Restore policy weights, optimizer, RNG and counters from a checkpoint.

    Every process reads it: the shared weights, optimizer and counters, and its own RNG and
    env state (process R > 0 from ``rng_rankR`` / ``rankR``).
    """
    policy = trainer.policy
    checkpoint = find_checkpoint(path)  # verified: every listed file against its hash
    _warn_if_precision_differs(checkpoint, policy.base_info)
    tensors, files = load_checkpoint(checkpoint, verified=True)
    adapter = load_peft_weights(str(checkpoint / "adapter"), device=str(policy.device))
    set_peft_model_state_dict(policy.model, adapter)
    policy.value_head.load_state_dict(load_tensors(checkpoint / "value_head.safetensors"))
    trainer.optimizer.load_state_dict(
        optimizer_state_from_files(tensors["optimizer"], files["optimizer"])
    )
    state = files["trainer_state"]
    trainer.update_step = int(state["update_step"])
    trainer.episodes = int(state["episodes"])
    trainer.turns = int(state["turns"])
    trainer.kl_ctl.value = float(state["kl_coef"])
    trainer.ent_ctl.value = float(state.get("ent_coef", trainer.config.ent_coef))
    trainer.nonfinite_streak = int(state.get("nonfinite_streak", 0))
    trainer.nonfinite_total = int(state.get("nonfinite_total", 0))
    if trainer.novelty is not None:
        trainer.novelty.load_state(state.get("visit_counts", []))
    if trainer.choice_returns is not None:
        trainer.choice_returns.load_state(state.get("choice_returns", []))
    if trainer.replay is not None:
        trainer.replay.load_state(state.get("self_imitation", {}))
    if trainer.state_returns is not None:
        trainer.state_returns.load_state(state.get("state_returns", []))
    rank = process.rank
    own = {"rng": files["rng"], "numpy_rng": state["numpy_rng"], "envs": files.get("envs")}
    if rank:
        own = files.get(f"rank{rank}")  # type: ignore[assignment]
    # Seeded by step, so fresh episodes and draws still do not depend on when we resumed.
    draws_seed = process.seed(trainer.config.seed) + 1000 * trainer.update_step
    if own is None:
        logger.warning(
            "%s holds no state of process %d (it was written by %d); this process starts "
            "fresh episodes with fresh random draws",
            checkpoint,
            rank,
            state.get("world_size", 1),
        )
        torch.manual_seed(draws_seed)
        trainer.rng = np.random.default_rng(draws_seed)
    else:
        set_rng_state(tensors[f"rng_rank{rank}" if rank else "rng"], own["rng"])
        trainer.rng.bit_generator.state = own["numpy_rng"]
    for key, callback in _saved_callbacks(trainer):  # before the envs replay: opponents
        if key in files:
            callback.load_checkpoint_state(tensors.get(key, {}), files[key])
        else:
            logger.warning("%s holds no %s state; the %s starts afresh", checkpoint, key, key)
    if trainer.collector is not None:
        seed = trainer.collector.seed + 1000 * trainer.update_step
        saved = own["envs"] if own is not None else None
        restore_rollout(trainer.envs, trainer.collector, saved, fresh_seed=seed)
    logger.info("Resumed from %s at update %d", checkpoint, trainer.update_step)


def _warn_if_precision_differs(checkpoint: Path, base_info: dict[str, Any]) -> None:
    """Warn when the policy resuming a checkpoint computes in another dtype than it was saved in.

    The resumed run then cannot match the uninterrupted one; ``textgym train --resume`` avoids
    it by loading the base model in the run's own dtype.
    """
    try:
        saved = json.loads((checkpoint / "policy.json").read_text()).get("base", {}).get("dtype")
    except (OSError, ValueError, AttributeError):
        return
    now = base_info.get("dtype")
    if saved and now and saved != now:
        logger.warning(
            "%s was trained in %s but the policy resuming it computes in %s: the resumed run "
            "will not match the uninterrupted one (load the base model with dtype=%r)",
            checkpoint,
            saved,
            now,
            saved,
        )


def _saved_callbacks(trainer: PPOTrainer) -> list[tuple[str, Any]]:
    """The trainer's callbacks that keep state in checkpoints, by file name.

    A callback opts in with ``checkpoint_key`` (its files' name), ``checkpoint_state() ->
    (tensors, json)`` and ``load_checkpoint_state(tensors, json)`` (a self-play pool does).
    """
    found = []
    for callback in trainer.callbacks:
        key = getattr(callback, "checkpoint_key", None)
        if isinstance(key, str) and callable(getattr(callback, "checkpoint_state", None)):
            found.append((f"callback_{key}", callback))
    return found


# How libraries that do not raise OSError (safetensors' SafetensorError) report a failed write.
_ERRNO_IN_TEXT = re.compile(r"(?:os error|code:)\s*(\d+)")
_NO_SPACE_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"


def write_errno(error: BaseException) -> int | None:
    """The ``errno`` of a failed write, from any library: None when it was no OS error.

    Looks through the exception's chain (``__cause__``, ``__context__``) for an ``OSError``
    with an errno, else for the error number in the message of a library that wraps its own
    I/O errors (safetensors' ``SafetensorError`` prints Rust's ``Os { code: 28, ... }``).

    Example:
        >>> write_errno(RuntimeError('IoError(Os { code: 28, kind: StorageFull, ... })'))
        28
        >>> write_errno(ValueError("bad value")) is None
        True
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return int(current.errno)
        text = str(current)
        if (match := _ERRNO_IN_TEXT.search(text)) is not None:
            return int(match.group(1))
        if _NO_SPACE_TEXT in text:
            return errno.ENOSPC
        current = current.__cause__ or current.__context__
    return None


def write_or_stop(run_dir: Path, path: Path, write: Callable[[], Any]) -> Any:
    """``write()`` of ``path``; an OS error (a full disk) becomes one CheckpointWriteError.

    Whatever library raised it: an ``OSError``, or an error whose chain or message carries an
    errno (:func:`write_errno`). The atomic writers have already discarded the partial
    ``path``; the message says so and names the newest checkpoint left, and is logged once.
    """
    try:
        return write()
    except Exception as e:
        code = write_errno(e)
        if code is None and isinstance(e, OSError):
            code = errno.EIO
        if code is None:
            raise
        reason = os.strerror(code)
        kept = [p.name for p in list_checkpoints(run_dir)]
        left = f"the newest complete checkpoint is {kept[-1]}" if kept else "no checkpoint exists"
        message = (
            f"Could not write {path}: {reason}. The partial write was discarded and {left}; "
            f"free space (or fix the directory) and resume from {run_dir}"
        )
        logger.error(message)
        raise CheckpointWriteError(code, message) from e
