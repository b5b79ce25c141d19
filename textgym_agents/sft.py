"""Supervised warm start: fine-tune a PPOPolicy's own LoRA adapter on recorded replies with TRL.

``sft_warm_start`` runs ``trl.SFTTrainer`` on a chat dataset (``textgym.record_trajectories``)
with the loss on the replies only, so PPO continues from the adapter with the same reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textgym_agents.model.gradient_checkpointing import (
    disable_gradient_checkpointing,
    enable_gradient_checkpointing,
    gradient_checkpointing_enabled,
)
from textgym_agents.model.precision import mixed_precision

if TYPE_CHECKING:
    from datasets import Dataset

    from textgym_agents.policy import PPOPolicy

__all__ = ["prepare_sft_dataset", "sft_warm_start"]

logger = logging.getLogger(__name__)
_CHECKPOINTING_ARGS = ("activation_checkpointing", "gradient_checkpointing")


def prepare_sft_dataset(
    dataset: Dataset | str | os.PathLike[str], reply_prefix: str = "", deduplicate: bool = False
) -> Dataset:
    """The ``prompt``/``completion`` rows SFT trains on: valid replies only, other columns dropped.

    Args:
        dataset: A recorded dataset (``prompt`` and ``completion`` columns, as written by
            ``textgym.record_trajectories``), a conversational dataset with a ``messages``
            column whose last message is the assistant's reply, or a directory saved with
            ``Dataset.save_to_disk``.
        reply_prefix: The policy's ``config.reply_prefix``: every reply must start with it,
            since the policy can only write replies that do.
        deduplicate: Keep only the first of identical (prompt, reply) rows. Envs with few
            states repeat them often (500 Blackjack hands of basic strategy: 760 turns, 203
            distinct); for a deterministic expert this trains on each state once.

    Raises:
        ValueError: If the dataset has neither format, a completion is not an assistant
            message, a reply lacks the prefix, or no valid reply is left.

    Example:
        >>> from datasets import Dataset
        >>> chat = [{"role": "user", "content": "Hit?"}, {"role": "assistant", "content": "hit"}]
        >>> prepare_sft_dataset(Dataset.from_list([{"messages": chat}]))[0]["completion"]
        [{'role': 'assistant', 'content': 'hit'}]
    """
    from datasets import load_from_disk

    if isinstance(dataset, str | os.PathLike):
        dataset = load_from_disk(os.fspath(dataset))
    columns = set(dataset.column_names)
    if "invalid" in columns:
        keep = [i for i, invalid in enumerate(dataset["invalid"]) if not invalid]
        dataset = dataset.select(keep, keep_in_memory=True)
    if {"prompt", "completion"} <= columns:
        dataset = dataset.select_columns(["prompt", "completion"])
    elif "messages" in columns:
        dataset = dataset.map(
            lambda messages: {"prompt": messages[:-1], "completion": messages[-1:]},
            input_columns="messages",
            remove_columns=dataset.column_names,
            keep_in_memory=True,
        )
    else:
        raise ValueError(
            "Expected a dataset with 'prompt' and 'completion' columns (textgym."
            "record_trajectories) or a 'messages' column, got columns "
            f"{sorted(columns)}"
        )
    if deduplicate:
        seen: set[str] = set()
        keep = []
        for index, row in enumerate(zip(dataset["prompt"], dataset["completion"], strict=True)):
            key = json.dumps(row, sort_keys=True)
            if key not in seen:
                seen.add(key)
                keep.append(index)
        dataset = dataset.select(keep, keep_in_memory=True)
    if len(dataset) == 0:
        raise ValueError("The dataset has no valid replies to train on")
    for index, completion in enumerate(dataset["completion"]):
        if not completion or any(m["role"] != "assistant" for m in completion):
            raise ValueError(f"Row {index}: expected assistant messages as the completion")
        if not completion[0]["content"].startswith(reply_prefix):
            raise ValueError(
                f"Row {index}: the reply {completion[0]['content']!r} does not start with the "
                f"policy's reply_prefix {reply_prefix!r}, so the policy could never write it"
            )
    # In memory: TRL's preparation map()s would otherwise write cache files into the
    # directory of a dataset loaded from disk.
    return dataset.flatten_indices(keep_in_memory=True)


def sft_warm_start(
    policy: PPOPolicy,
    dataset: Dataset | str | os.PathLike[str],
    *,
    epochs: float = 1.0,
    learning_rate: float = 2e-4,
    batch_size: int = 8,
    gradient_accumulation_steps: int = 1,
    max_length: int | None = 1024,
    gradient_checkpointing: bool = False,
    deduplicate: bool = False,
    seed: int = 0,
    progress: bool = False,
    output_dir: str | os.PathLike[str] | None = None,
    **sft_args: Any,
) -> dict[str, float]:
    """Fine-tune the policy's LoRA adapter on recorded replies with ``trl.SFTTrainer``.

    Each row is TRL's conversational prompt-completion format: the prompt is rendered with the
    tokenizer's chat template and the loss covers only the reply tokens (and the end-of-turn
    token), which is TRL's completion-only loss; the policy scores a reply with exactly these
    tokens. (TRL's ``assistant_only_loss`` needs ``{% generation %}`` markers in the chat
    template, which SmolLM2's does not have.) Only the adapter that PPO trains changes: the
    base weights and the value head stay as they are, so PPO's reference (the base model with
    the adapter disabled) is unchanged, and the model is left in eval mode, as PPO needs it.
    Rows whose reply was invalid are left out. Like any ``transformers.Trainer``, this seeds
    the global random number generators with ``seed``.

    Args:
        policy: The :class:`~textgym_agents.PPOPolicy` whose adapter is trained, in place.
        dataset: See :func:`prepare_sft_dataset`.
        epochs: Passes over the dataset (a float allows part of one).
        learning_rate: Peak learning rate (linear decay to zero, TRL's default schedule).
        batch_size: Rows per forward pass.
        gradient_accumulation_steps: Forward passes per optimizer step.
        max_length: Longer tokenised rows are truncated (None: no limit).
        gradient_checkpointing: Recompute activations in the backward pass to save memory, with
            :func:`~textgym_agents.model.gradient_checkpointing.enable_gradient_checkpointing`
            (disabled again afterwards unless it was enabled before).
        deduplicate: Train on each distinct (prompt, reply) row once (see
            :func:`prepare_sft_dataset`).
        seed: Seed of the data order and the global RNGs.
        progress: Show a progress bar with the loss.
        output_dir: Trainer output directory (nothing is saved there by default); None uses
            a temporary directory.
        **sft_args: Other ``trl.SFTConfig`` fields (``lr_scheduler_type``, ``max_steps``, ...).

    Returns:
        ``sft/loss_first`` and ``sft/loss_last`` (mean loss of the first and last optimizer
        step), ``sft/train_loss`` (mean over training), ``sft/token_accuracy_last``,
        ``sft/steps``, ``sft/rows`` and ``sft/seconds``.

    Example:
        >>> import textgym
        >>> from textgym import record_trajectories
        >>> from textgym_agents import PPOPolicy
        >>> demos = record_trajectories("textgym/Blackjack-v1", lambda obs: 0, n_episodes=50)
        >>> policy = PPOPolicy.from_pretrained()  # doctest: +SKIP
        >>> metrics = sft_warm_start(policy, demos, epochs=1)  # doctest: +SKIP
        >>> metrics["sft/loss_last"] < metrics["sft/loss_first"]  # doctest: +SKIP
        True
    """
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = policy.model, policy.tokenizer
    cpu = policy.device.type == "cpu"
    settings: dict[str, Any] = {
        "num_train_epochs": epochs,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "max_length": max_length,
        "completion_only_loss": True,
        "assistant_only_loss": False,
        # The Trainer's own mixed precision would cast differently from PPO's; ours is set
        # below. Checkpointing is ours too (below), which also works in PPO's eval mode.
        "bf16": False,
        "fp16": False,
        "use_cpu": cpu,
        "dataloader_pin_memory": not cpu,
        "seed": seed,
        "data_seed": seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }
    # transformers >= 5.2x renamed gradient_checkpointing; TRL's default for it is True.
    names = {f.name for f in dataclasses.fields(SFTConfig)}
    settings[next(n for n in _CHECKPOINTING_ARGS if n in names)] = False
    settings.update(sft_args)
    log = _log_callback(progress)
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="textgym-sft-") as tmp,
        _restored(model, tokenizer, gradient_checkpointing),
    ):
        rows = prepare_sft_dataset(dataset, policy.config.reply_prefix, deduplicate)
        config = SFTConfig(output_dir=os.fspath(output_dir or Path(tmp)), **settings)
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=rows, processing_class=tokenizer
        )
        for default in list(trainer.callback_handler.callbacks):
            if type(default).__name__ in ("PrinterCallback", "ProgressCallback"):
                trainer.remove_callback(default)  # they print every log line
        trainer.add_callback(log)
        # The forward and loss run with the numerics PPO uses (`PPOConfig.mixed_precision`):
        # on a bf16 base the LoRA products in bf16 too; nothing changes on a float32 model.
        enabled, passes = policy.config.mixed_precision, policy.pass_dtype
        trainer.autocast_smart_context_manager = lambda *_, **__: mixed_precision(
            model, enabled=enabled, dtype=passes
        )
        result = trainer.train()
    seconds = time.perf_counter() - start
    losses = log.losses or [float("nan")]
    logger.info("SFT: %d steps on %d rows in %.0f s", result.global_step, len(rows), seconds)
    return {
        "sft/loss_first": losses[0],
        "sft/loss_last": losses[-1],
        "sft/train_loss": float(result.training_loss),
        "sft/token_accuracy_last": log.accuracy,
        "sft/steps": float(result.global_step),
        "sft/rows": float(len(rows)),
        "sft/seconds": seconds,
    }


@contextlib.contextmanager
def _restored(model: Any, tokenizer: Any, checkpointing: bool) -> Iterator[None]:
    """Leave the policy's model and tokenizer as they were, apart from the adapter weights.

    The Trainer puts the model in train mode and turns its KV cache off in the config, and
    SFTTrainer patches the causal LM's ``forward`` with a fused LM head; all are undone here.
    Our gradient checkpointing is on for the duration when asked for (and not on already);
    the datasets library's progress bars are off.
    """
    import datasets

    base = model.get_base_model()
    had_forward, forward = "forward" in vars(base), vars(base).get("forward")
    use_cache = getattr(base.config, "use_cache", None)
    padding = (tokenizer.padding_side, tokenizer.pad_token)
    checkpointing = checkpointing and not gradient_checkpointing_enabled(model)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one bar per map() of the data preparation: noise
    if checkpointing:
        enable_gradient_checkpointing(model)
    try:
        yield
    finally:
        if checkpointing:
            disable_gradient_checkpointing(model)
        if bars:
            datasets.enable_progress_bars()
        if had_forward:
            base.forward = forward
        else:
            vars(base).pop("forward", None)
        if use_cache is not None:
            base.config.use_cache = use_cache
        tokenizer.padding_side, tokenizer.pad_token = padding
        model.eval()  # PPO needs eval mode: no dropout, old and new log-probs equal


def _log_callback(progress: bool) -> Any:
    """A ``TrainerCallback`` that keeps each step's loss and may draw a progress bar."""
    from transformers import TrainerCallback

    class LogCallback(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.accuracy = float("nan")
            self.bar: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if progress:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=state.max_steps, desc="SFT", unit="step")

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs") or {}
            if "loss" in logs:
                self.losses.append(float(logs["loss"]))
                self.accuracy = float(logs.get("mean_token_accuracy", self.accuracy))
                if self.bar is not None:
                    self.bar.set_postfix(loss=f"{self.losses[-1]:.3f}")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.update(1)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.close()

    return LogCallback()
