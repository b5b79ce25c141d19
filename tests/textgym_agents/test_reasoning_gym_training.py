"""PPO trains on a reasoning-gym text env like on any other (a smoke test with the tiny model)."""

import math

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.testing import tiny_model

pytest.importorskip("reasoning_gym")


def test_ppo_updates_on_a_reasoning_gym_task():
    envs = gym.make_vec("textgym/rg-basic_arithmetic-v0", num_envs=4)
    config = PPOConfig.for_env(envs, num_steps=3, max_new_tokens=8, seed=0, progress=False)
    assert (config.decoding, config.reply_prefix) == ("free", '{"')  # flat JSON answers
    torch.manual_seed(0)
    trainer = PPOTrainer(PPOPolicy(*tiny_model(), config=config), envs)
    for _ in range(1):
        metrics = trainer.step()
        assert math.isfinite(metrics["loss/total"])
    assert metrics["env/episodes"] >= 4  # an answer, or three unreadable replies, ends one
