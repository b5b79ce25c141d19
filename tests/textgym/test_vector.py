import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

import textgym  # noqa: F401  (registers the textgym/ ids)
from textgym.checker import find_text_wrapper


def scripted_replies(envs, n):
    """Valid replies for every sub-env: example replies of sampled base actions."""
    single = gym.make(envs.spec.id)
    text_env = find_text_wrapper(single)
    text_env.env.action_space.seed(0)
    return [text_env.example_reply(text_env.env.action_space.sample()) for _ in range(n)]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "env_id", ["textgym/Blackjack-v1", "textgym/FrozenLake-v1", "textgym/Pendulum-v1"]
)
def test_make_vec_batches_messages_and_replies(env_id, mode):
    envs = gym.make_vec(env_id, num_envs=3, vectorization_mode=mode)
    try:
        observations, infos = envs.reset(seed=0)
        assert isinstance(observations, tuple) and len(observations) == 3
        for messages in observations:
            assert envs.single_observation_space.contains(messages)
            assert messages[0]["role"] == "system"
        single = gym.make(env_id)
        assert observations[1] == single.reset(seed=1)[0]  # sub-env i is seeded with seed + i
        replies = scripted_replies(envs, 3)
        for _ in range(4):
            observations, rewards, terminations, truncations, infos = envs.step(replies)
            assert rewards.shape == (3,) and terminations.dtype == np.bool_
            assert all(envs.single_observation_space.contains(m) for m in observations)
            assert not infos["invalid"][infos["_invalid"]].any()
        envs.step(["not an action", *replies[1:]])
    finally:
        envs.close()


def test_async_and_sync_agree():
    results = []
    for mode in ("sync", "async"):
        envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2, vectorization_mode=mode)
        obs, _ = envs.reset(seed=42)
        steps = [obs]
        for reply in ["hit", "stick", "hit"]:
            obs, rewards, *_ = envs.step([reply, reply])
            steps.append((obs, rewards.tolist()))
        envs.close()
        results.append(steps)
    assert results[0] == results[1]


def test_async_shared_memory_carries_unicode_and_long_history():
    envs = gym.make_vec(
        "textgym/Blackjack-v1",
        num_envs=2,
        vectorization_mode="async",
        history=3,
        system_prompt="Joue au blackjack — ♠♥♦♣ 🂡",
    )
    try:
        obs, _ = envs.reset(seed=0)
        assert obs[0][0]["content"].startswith("Joue au blackjack — ♠♥♦♣ 🂡")
        long_reply = "é" * 4000 + "\ud800"  # invalid, but kept in the history as sent
        obs, *_ = envs.step([long_reply, long_reply])
        assert obs[0][2] == {"role": "assistant", "content": long_reply}
    finally:
        envs.close()


def test_gymnasium_wrappers_compose():
    env = RecordEpisodeStatistics(TimeLimit(gym.make("textgym/CartPole-v1"), max_episode_steps=3))
    env.reset(seed=0)
    for _ in range(3):
        _, _, terminated, truncated, info = env.step('{"action": "left"}')
    assert truncated or terminated
    assert info["episode"]["l"] == 3


def test_vector_autoreset_resets_text_state():
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=1, vectorization_mode="sync", history=2)
    envs.reset(seed=1)
    obs, _, terminated, *_ = envs.step(["stick"])  # seed 1: stick ends the hand
    assert terminated[0]
    obs, *_ = envs.step(["ignored on autoreset"])
    assert [m["role"] for m in obs[0]] == ["system", "user"]
    envs.close()
