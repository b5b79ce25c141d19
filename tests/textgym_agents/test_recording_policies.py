"""record_trajectories with a PPOPolicy as the expert: every decoding mode gets what it needs."""

import pytest

import textgym  # noqa: F401  (registers the textgym/ ids)
from textgym import record_trajectories
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.testing import tiny_model


@pytest.mark.parametrize("decoding", ["constrained", "choices", "auto"])
def test_a_ppo_policy_records_valid_replies_in_every_decoding_mode(decoding):
    config = PPOConfig(decoding=decoding, max_new_tokens=32, seed=0)
    policy = PPOPolicy(*tiny_model(), config=config)
    dataset = record_trajectories(
        "textgym/Blackjack-v1", policy, n_episodes=4, seed=0, num_envs=2, greedy=True
    )
    assert sorted(set(dataset["episode"])) == [0, 1, 2, 3]
    assert not any(dataset["invalid"])  # choice and constrained replies always parse
