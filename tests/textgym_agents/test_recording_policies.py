"""record_trajectories with a PPOPolicy as the expert: every decoding mode gets what it needs."""

import gymnasium as gym
import pytest

import textgym  # noqa: F401  (registers the textgym/ ids)
from textgym import Policy, record_trajectories
from textgym_agents import Agent, PPOConfig, PPOPolicy, evaluate
from textgym_agents.testing import tiny_model


@pytest.mark.parametrize("decoding", ["constrained", "choices", "auto"])
@pytest.mark.slow
def test_a_ppo_policy_records_valid_replies_in_every_decoding_mode(decoding):
    config = PPOConfig(decoding=decoding, max_new_tokens=32, seed=0)
    policy = PPOPolicy(*tiny_model(), config=config)
    dataset = record_trajectories(
        "textgym/Blackjack-v1", policy, n_episodes=4, seed=0, num_envs=2, greedy=True
    )
    assert sorted(set(dataset["episode"])) == [0, 1, 2, 3]
    assert not any(dataset["invalid"])  # choice and constrained replies always parse


class BlackjackAgent(Agent):
    def get_system_prompt(self):
        return "You are an expert blackjack player."

    def format_observation(self, observation):
        return f"Your current total is {observation[0]}"

    def extract_action(self, response):
        return 0 if "stay" in response else 1


def test_ppo_policy_and_agent_are_textgym_policies():
    model, tokenizer = tiny_model()
    agent = BlackjackAgent(model, tokenizer, max_new_tokens=4, decoding="auto")
    assert isinstance(agent.policy, Policy) and isinstance(agent, Policy)
    assert agent.wants_choices and agent.wants_schemas  # as its PPOPolicy's decoding says
    env = agent.text_env(gym.make("Blackjack-v1"))  # its own parser: free text
    result = evaluate(agent, env, n_episodes=3, num_envs=1)
    assert result["episodes"] == 3 and result.invalid_rate == 0.0  # extract_action never fails
    assert agent.current_turns == [] and len(agent.buffer) == 0  # evaluation records no turns
