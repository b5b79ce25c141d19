"""The parts a PPO trainer is built from: collector, optimizer, KL controller, learning rates.

:class:`~textgym_agents.ppo.trainer.PPOTrainer` builds them here; an annealed run
(``anneal_lr``) rescales the learning rates before each update.

Example:
    >>> from textgym_agents.ppo.config import PPOConfig
    >>> make_kl_controller(PPOConfig(kl_coef=0.05)).value
    0.05
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from textgym_agents.ppo import core
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.ppo.groups import GroupRolloutCollector, default_anchor
from textgym_agents.ppo.rollout import RolloutCollector

__all__ = ["make_collector", "make_kl_controller", "make_optimizer", "scale_learning_rates"]


def make_collector(
    envs: Any, config: PPOConfig, process: Any, anchor_key: Callable[[Any], Hashable] | None
) -> RolloutCollector:
    """The rollout collector: seed-shared groups when ``group_size > 1``, else plain.

    Process r plays envs seeded after those of processes 0..r-1, like one big vector env; a
    group never straddles processes (``group_size`` divides ``num_envs``).
    """
    (stride,) = process.max([envs.num_envs])
    seed = process.seed(config.seed, stride)
    if config.group_size > 1:
        return GroupRolloutCollector(envs, seed, config.group_size, anchor_key=anchor_key)
    critic_free_replay = config.self_imitation and not config.uses_critic
    if config.novelty_bonus > 0 or config.all_choices or critic_free_replay:  # need anchors
        return RolloutCollector(envs, seed, anchor_key=anchor_key or default_anchor)
    return RolloutCollector(envs, seed)


def make_optimizer(policy: Any, config: PPOConfig) -> torch.optim.AdamW:
    """AdamW over the LoRA weights, and the value head's unless the estimator is critic-free."""
    lora_params, head_params = policy.trainable_parameters()
    groups = [{"params": lora_params, "lr": config.learning_rate}]
    if config.uses_critic:  # critic-free: no value loss and no optimizer state for the head
        groups.append({"params": head_params, "lr": config.value_learning_rate})
    return torch.optim.AdamW(groups, weight_decay=config.weight_decay)


def make_kl_controller(config: PPOConfig) -> Any:
    """The adaptive KL controller (``adaptive_kl``) or a fixed coefficient."""
    if config.adaptive_kl:
        return core.AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
    return core.FixedKLController(config.kl_coef)


def scale_learning_rates(optimizer: Any, config: PPOConfig, fraction: float) -> float:
    """Set each group's learning rate to its configured one times ``fraction``; the LoRA one.

    The groups are those of :func:`make_optimizer`: the LoRA weights, then the value head.
    """
    bases = [config.learning_rate, config.value_learning_rate]
    for group, base in zip(optimizer.param_groups, bases, strict=False):
        group["lr"] = base * fraction
    return float(optimizer.param_groups[0]["lr"])
