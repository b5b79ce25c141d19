"""textgym_agents: PPO with LoRA for LLM agents on any textgym environment."""

from textgym_agents.agent import Agent
from textgym_agents.evaluation import evaluate
from textgym_agents.policy import Generation, PPOPolicy
from textgym_agents.ppo.buffer import RolloutBuffer, Turn
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.sft import sft_warm_start

__all__ = [
    "Agent",
    "Generation",
    "PPOConfig",
    "PPOPolicy",
    "PPOTrainer",
    "RolloutBuffer",
    "Turn",
    "evaluate",
    "sft_warm_start",
]
