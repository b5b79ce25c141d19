import math

import gymnasium as gym
import pytest
import torch

from textgym_agents import Agent, PPOPolicy
from textgym_agents.testing import tiny_model


class BlackjackAgent(Agent):
    def get_system_prompt(self):
        return "You are an expert blackjack player."

    def format_observation(self, observation):
        return f"Your current total is {observation[0]}"

    def extract_action(self, response):
        return 0 if "stay" in response else 1


class PickyAgent(BlackjackAgent):
    def extract_action(self, response):
        raise ValueError("never parses")


def play(agent, env, episodes, seed=0):
    stats = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            action = agent.act(observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            agent.assign_reward(reward)
            done = terminated or truncated
        stats.append(agent.terminate_episode())
    return stats


def make(cls=BlackjackAgent, **kwargs):
    model, tokenizer = tiny_model()
    return cls(model, tokenizer, "cpu", max_new_tokens=4, **kwargs)


def test_llamagym_loop_trains_when_the_batch_is_full():
    agent = make(batch_size=3)
    lora_before = [
        p.detach().clone() for n, p in agent.policy.model.named_parameters() if "lora_B" in n
    ]
    stats = play(agent, gym.make("Blackjack-v1"), 3)
    assert stats[:2] == [None, None]
    assert math.isfinite(stats[2]["loss/policy"]) and stats[2]["env/turns"] >= 3
    lora_after = [p for n, p in agent.policy.model.named_parameters() if "lora_B" in n]
    assert any(not torch.equal(a, b) for a, b in zip(lora_before, lora_after, strict=True))
    assert len(agent.buffer) == 0 and agent.episodes_in_buffer == 0


def test_conversation_is_kept_within_an_episode_and_reset_after():
    agent = make(batch_size=10)
    env = gym.make("Blackjack-v1")
    observation, _ = env.reset(seed=3)
    agent.act(observation)
    agent.assign_reward(0.0)
    roles = [m["role"] for m in agent.current_episode_messages]
    assert roles == ["system", "user", "assistant"]
    assert agent.current_episode_messages[1]["content"] == f"Your current total is {observation[0]}"
    agent.terminate_episode()
    assert [m["role"] for m in agent.current_episode_messages] == ["system"]


def test_failing_extract_action_is_recorded_invalid_and_penalised():
    agent = make(PickyAgent, batch_size=10, default_action=0, invalid_penalty=0.5)
    env = gym.make("Blackjack-v1")
    observation, _ = env.reset(seed=0)
    action = agent.act(observation)
    assert action == 0
    agent.assign_reward(1.0)
    turn = agent.current_turns[-1]
    assert turn.invalid and turn.reward == 0.5


def test_actions_outside_the_space_are_invalid():
    class Wild(BlackjackAgent):
        def extract_action(self, response):
            return 7

    agent = make(Wild, action_space=gym.spaces.Discrete(2), default_action=1)
    observation, _ = gym.make("Blackjack-v1").reset(seed=0)
    assert agent.act(observation) == 1 and agent.current_turns[-1].invalid


def test_assign_reward_before_act_is_a_clear_error():
    with pytest.raises(
        RuntimeError, match="assign_reward\\(\\) needs a turn: call act\\(\\) first"
    ):
        make().assign_reward(1.0)


def test_same_agent_definition_as_text_env_trains_with_ppo_policy():
    agent = make(batch_size=2)
    envs = gym.vector.SyncVectorEnv(
        [lambda: agent.text_env(gym.make("Blackjack-v1")) for _ in range(2)]
    )
    messages, _ = envs.reset(seed=0)
    assert messages[0][0]["content"] == "You are an expert blackjack player."
    assert messages[0][-1]["content"].startswith("Your current total is ")
    _, _, _, _, infos = envs.step(["I stay", "hit me"])
    assert infos["env_action"].tolist() == [0, 1]
    policy = PPOPolicy(*tiny_model(), config=agent.policy.config)
    metrics = policy.learn(envs, total_episodes=2, output_dir=None)
    assert math.isfinite(metrics["loss/policy"])


class NamedAgent(Agent):
    """LlamaGym's Blackjack agent that names its replies instead of parsing free text."""

    def get_system_prompt(self):
        return "You are an expert blackjack player. Reply stay or hit."

    def format_observation(self, observation):
        return f"Your current total is {observation[0]}"

    def action_replies(self):
        return {"stay": 0, "hit": 1}


def test_named_replies_use_choice_decoding_and_are_never_invalid():
    agent = make(NamedAgent, batch_size=4)
    config = agent.policy.config
    assert config.decoding == "choices" and config.temperature == 2.0  # env_defaults' choice
    stats = play(agent, gym.make("Blackjack-v1"), 4)
    update = stats[-1]
    assert update is not None and update["env/invalid_rate"] == 0.0
    assert math.isfinite(update["loss/policy"])
    with_config = make(NamedAgent, temperature=1.0)
    assert with_config.policy.config.temperature == 1.0  # given settings win


def test_named_replies_text_env_lists_them_for_evaluation():
    from textgym_agents import evaluate

    agent = make(NamedAgent)
    env = agent.text_env(gym.make("Blackjack-v1"))
    assert env.reply_choices() == ["stay", "hit"]
    result = evaluate(agent, env, n_episodes=4)
    assert result["invalid_rate"] == 0.0 and result["episodes"] == 4


def test_an_agent_needs_extract_action_or_action_replies():
    class Mute(Agent):
        def get_system_prompt(self):
            return "x"

        def format_observation(self, observation):
            return "y"

    with pytest.raises(TypeError, match="must define extract_action"):
        make(Mute)

    class Empty(NamedAgent):
        def action_replies(self):
            return {}

    with pytest.raises(ValueError, match="non-empty dict"):
        make(Empty)


@pytest.mark.parametrize("name", ["BlackjackAgent", "NamedAgent"])  # free text, choices
def test_turns_keep_the_values_and_scores_their_generation_measured(name):
    agent = make(globals()[name], batch_size=10)
    agent.act(gym.make("Blackjack-v1").reset(seed=0)[0])
    turn = agent.current_turns[-1]
    assert turn.value is not None  # the critic's value from generate(): no pass of its own
    if agent.policy.config.decoding == "choices":
        assert turn.old_logps is not None and turn.choice_ids is not None


def test_annealing_decays_the_learning_rate_over_total_episodes_and_needs_them():
    with pytest.raises(ValueError, match="anneal_lr=True decays .* give total_episodes"):
        make(NamedAgent, anneal_lr=True)
    agent = make(NamedAgent, batch_size=2, anneal_lr=True, total_episodes=4, learning_rate=1e-3)
    stats = [s for s in play(agent, gym.make("Blackjack-v1"), 4) if s is not None]
    # as textgym train: each update's rate from the episodes played before its batch
    assert [s["train/learning_rate"] for s in stats] == pytest.approx([1e-3, 5e-4])
    assert [s["env/episodes"] for s in stats] == [2, 4]
    assert "train/learning_rate" not in play(make(NamedAgent, batch_size=1), gym.make(
        "Blackjack-v1"), 1)[0]  # fmt: skip


def test_gigpo_groups_consecutive_episodes_and_the_turns_that_saw_the_same_text():
    with pytest.raises(ValueError, match="batch_size must be a multiple of it, got 3"):
        make(NamedAgent, batch_size=3, advantage_estimator="gigpo", group_size=2)
    agent = make(NamedAgent, batch_size=6, advantage_estimator="gigpo", group_size=2)
    env = gym.make("Blackjack-v1")
    for seed in (0, 0, 1, 1):  # a group plays one hand: reset with one seed
        observation, _ = env.reset(seed=seed)
        agent.act(observation)
        agent.assign_reward(0.0)
        agent.terminate_episode()
    turns = agent.buffer.turns()
    assert [turn.group for turn in turns] == [0, 0, 1, 1]
    anchors = [turn.anchor for turn in turns]
    assert anchors[0] == anchors[1] == agent.format_observation(env.reset(seed=0)[0])
    assert anchors[2] == anchors[3] == agent.format_observation(env.reset(seed=1)[0])
    assert anchors[0] != anchors[2]
    assert play(agent, env, 2, seed=5)[-1]["env/turns"] >= 6  # the update runs on the groups


@pytest.mark.parametrize("history", [None, 0, 1])
def test_history_sets_the_past_turns_each_prompt_keeps(history):
    agent = make(NamedAgent, batch_size=10, history=history)
    for total in (12, 15, 18):
        agent.act((total, 10, 0))
    prompt = agent.policy.tokenizer.decode(agent.current_turns[-1].prompt_ids)
    assert "Your current total is 18" in prompt
    assert ("Your current total is 15" in prompt) == (history != 0)
    assert ("Your current total is 12" in prompt) == (history is None)
    expected = 16 if history is None else history
    assert agent.text_env(gym.make("Blackjack-v1")).history == expected
    with pytest.raises(ValueError, match="history must be None or an int >= 0, got -1"):
        make(NamedAgent, history=-1)


@pytest.mark.parametrize("history", [None, 0])
def test_a_truncated_episode_is_bootstrapped_from_the_state_after_its_last_turn(history):
    agent = make(NamedAgent, batch_size=10, history=history)
    for total in (12, 15):
        agent.act((total, 10, 0))
        agent.assign_reward(0.0)
    last = agent.current_turns[-1]
    agent.terminate_episode(truncated=True, observation=(19, 10, 0))
    state = agent.policy.tokenizer.decode(last.bootstrap_ids)
    assert state.startswith(agent.policy.tokenizer.decode(last.prompt_ids[:5]))  # system prompt
    assert "Your current total is 19" in state  # as act() would show it, history and all
    assert ("Your current total is 15" in state) == (history is None)
    assert last.truncated and not last.terminated

    agent.act((12, 10, 0))
    agent.assign_reward(0.0)
    last = agent.current_turns[-1]
    agent.terminate_episode(truncated=True)  # no observation: the last prompt and reply
    assert last.bootstrap_ids == [*last.prompt_ids, *last.response_ids]
    agent.act((12, 10, 0))
    agent.terminate_episode()
    assert agent.buffer.turns()[-1].bootstrap_ids is None
