"""textgym_agents: PPO with LoRA for LLM agents on any textgym environment.

The names below are imported on first use (PEP 562), so ``textgym --help`` can load the
``textgym_agents.cli`` plugins without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from textgym_agents.model.memory import bound_kernel_cache

bound_kernel_cache()  # before torch builds its first bf16 kernel (model/memory.py)

if TYPE_CHECKING:
    from textgym_agents.agent import Agent
    from textgym_agents.decoding.generation import Generation
    from textgym_agents.evaluation import evaluate
    from textgym_agents.exceptions import (
        CheckpointError,
        CheckpointWriteError,
        EnvFault,
        NonFiniteUpdateError,
        PeerFailure,
        RunFileError,
        RunLockedError,
        SIGTERMExit,
    )
    from textgym_agents.policy import PPOPolicy
    from textgym_agents.ppo.buffer import RolloutBuffer, Turn
    from textgym_agents.ppo.config import PPOConfig
    from textgym_agents.ppo.trainer import PPOTrainer
    from textgym_agents.sft import sft_warm_start
    from textgym_agents.trl_grpo import grpo_dataset, with_tool_template

_EXPORTS = {
    "Agent": "textgym_agents.agent",
    "CheckpointError": "textgym_agents.exceptions",
    "CheckpointWriteError": "textgym_agents.exceptions",
    "EnvFault": "textgym_agents.exceptions",
    "Generation": "textgym_agents.decoding.generation",
    "NonFiniteUpdateError": "textgym_agents.exceptions",
    "PPOConfig": "textgym_agents.ppo.config",
    "PPOPolicy": "textgym_agents.policy",
    "PPOTrainer": "textgym_agents.ppo.trainer",
    "PeerFailure": "textgym_agents.exceptions",
    "RolloutBuffer": "textgym_agents.ppo.buffer",
    "RunFileError": "textgym_agents.exceptions",
    "RunLockedError": "textgym_agents.exceptions",
    "SIGTERMExit": "textgym_agents.exceptions",
    "Turn": "textgym_agents.ppo.buffer",
    "evaluate": "textgym_agents.evaluation",
    "grpo_dataset": "textgym_agents.trl_grpo",
    "sft_warm_start": "textgym_agents.sft",
    "with_tool_template": "textgym_agents.trl_grpo",
}

__all__ = [
    "Agent",
    "CheckpointError",
    "CheckpointWriteError",
    "EnvFault",
    "Generation",
    "NonFiniteUpdateError",
    "PPOConfig",
    "PPOPolicy",
    "PPOTrainer",
    "PeerFailure",
    "RolloutBuffer",
    "RunFileError",
    "RunLockedError",
    "SIGTERMExit",
    "Turn",
    "evaluate",
    "grpo_dataset",
    "sft_warm_start",
    "with_tool_template",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'textgym_agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once; later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
