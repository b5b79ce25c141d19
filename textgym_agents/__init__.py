"""textgym_agents: PPO with LoRA for LLM agents on any textgym environment."""

from textgym_agents.agent import Agent
from textgym_agents.evaluation import evaluate
from textgym_agents.exceptions import (
    EnvFault,
    NonFiniteUpdateError,
    PeerFailure,
    SIGTERMExit,
    Terminated,  # noqa: F401 - deprecated alias of SIGTERMExit, for textgym/cli_train.py
)
from textgym_agents.policy import Generation, PPOPolicy
from textgym_agents.ppo.buffer import RolloutBuffer, Turn
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.sft import sft_warm_start
from textgym_agents.trl_env import grpo_dataset, with_tool_template

__all__ = [
    "Agent",
    "EnvFault",
    "Generation",
    "NonFiniteUpdateError",
    "PPOConfig",
    "PPOPolicy",
    "PPOTrainer",
    "PeerFailure",
    "RolloutBuffer",
    "SIGTERMExit",
    "Turn",
    "evaluate",
    "grpo_dataset",
    "sft_warm_start",
    "with_tool_template",
]
