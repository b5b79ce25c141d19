"""PPO trains on worlds from other libraries like on any text env (smoke tests, tiny model)."""

import math

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.testing import tiny_model


def one_update(env_id, **settings):
    envs = gym.make_vec(env_id, num_envs=4)
    config = PPOConfig.for_env(envs, max_new_tokens=8, seed=0, progress=False, **settings)
    torch.manual_seed(0)
    trainer = PPOTrainer(PPOPolicy(*tiny_model(), config=config), envs)
    metrics = trainer.step()
    assert math.isfinite(metrics["loss/total"])
    return config, metrics


@pytest.mark.slow
def test_ppo_updates_on_a_reasoning_gym_task():
    pytest.importorskip("reasoning_gym")
    config, metrics = one_update("textgym/rg-basic_arithmetic-v0", num_steps=3)
    assert (config.decoding, config.reply_prefix) == ("free", '{"')  # flat JSON answers
    assert metrics["env/episodes"] >= 4  # an answer, or three unreadable replies, ends one


def test_ppo_updates_on_a_textarena_game():
    pytest.importorskip("textarena")
    config, metrics = one_update("textgym/ta-GuessTheNumber-v0", num_steps=2)
    assert config.decoding == "free" and metrics["env/invalid_rate"] == 0.0  # the game judges


@pytest.mark.parametrize("env_id", ["textgym/Sokoban-v0", "textgym/FrozenLakeRandom-v0"])
def test_ppo_updates_on_ragens_worlds(env_id):
    config, metrics = one_update(env_id, num_steps=2)
    assert config.decoding == "choices" and metrics["env/invalid_rate"] == 0.0


@pytest.mark.slow
def test_ppo_trains_through_an_openenv_server():
    """Served over OpenEnv and consumed as textgym/OpenEnv-v0: choice decoding, two updates."""
    pytest.importorskip("openenv")
    from textgym.openenv_server import running_server

    with running_server("textgym/Blackjack-v1", max_sessions=4) as url:
        envs = gym.make_vec("textgym/OpenEnv-v0", num_envs=4, base_url=url)
        config = PPOConfig.for_env(envs, seed=0, progress=False, num_steps=2)
        assert config.decoding == "choices"  # the server's valid replies reached the policy
        torch.manual_seed(0)
        trainer = PPOTrainer(PPOPolicy(*tiny_model(), config=config), envs)
        for _ in range(2):
            metrics = trainer.step()
            assert math.isfinite(metrics["loss/total"])
        assert metrics["env/invalid_rate"] == 0.0
        envs.close()
