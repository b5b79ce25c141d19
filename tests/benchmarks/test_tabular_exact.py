"""The exact tabular return (benchmarks/tabular_exact.py) against the Gymnasium envs themselves."""

import doctest

import gymnasium as gym
import numpy as np
import pytest

import textgym  # noqa: F401
from benchmarks import tabular_exact
from benchmarks.tabular_exact import (
    expected_return,
    greedy_policy,
    optimal,
    policy_tables,
    uniform,
)
from textgym_agents import PPOConfig, PPOPolicy, evaluate


def sampled_returns(env, policy, episodes, seed=0, steps=False):
    """Returns (with ``steps``: lengths) of ``policy``, a (states, actions) probability table,
    in real episodes."""
    rng = np.random.default_rng(seed)
    cumulative = policy.cumsum(1)
    returns = np.empty(episodes)
    for i in range(episodes):
        state, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action = min(int(np.searchsorted(cumulative[state], rng.random())), policy.shape[1] - 1)
            state, reward, terminated, truncated, _ = env.step(action)
            total += 1.0 if steps else float(reward)
            done = terminated or truncated
        returns[i] = total
    return returns


def test_the_module_examples_run():
    assert doctest.testmod(tabular_exact).failed == 0


@pytest.mark.parametrize(
    ("env_id", "kwargs", "table", "episodes"),
    [
        ("FrozenLake-v1", {"is_slippery": True}, "uniform", 10_000),
        ("FrozenLake-v1", {"is_slippery": True}, "optimal", 2_000),
        ("CliffWalking-v1", {"max_episode_steps": 100}, "uniform", 1_000),
        ("CliffWalking-v1", {"max_episode_steps": 100, "is_slippery": True}, "optimal", 2_000),
    ],
)
@pytest.mark.slow
def test_the_exact_return_is_the_mean_of_real_episodes(env_id, kwargs, table, episodes):
    env = gym.make(env_id, **kwargs)
    horizon = env.spec.max_episode_steps
    policy = uniform(env) if table == "uniform" else optimal(env, horizon)
    exact = expected_return(env, policy, horizon)
    returns = sampled_returns(env, policy, episodes)
    se = returns.std(ddof=1) / np.sqrt(episodes)
    assert abs(returns.mean() - exact) < 4 * se + 1e-9, (returns.mean(), exact, se)


def test_the_expected_length_is_the_mean_length_of_real_episodes():
    env = gym.make("FrozenLake-v1", is_slippery=True)
    exact = expected_return(env, uniform(env), 100, steps=True)
    lengths = sampled_returns(env, uniform(env), 4_000, steps=True)
    se = lengths.std(ddof=1) / np.sqrt(len(lengths))
    assert abs(lengths.mean() - exact) < 4 * se, (lengths.mean(), exact, se)
    still = gym.make("FrozenLake-v1", is_slippery=False)
    assert expected_return(still, optimal(still, 100), 100, steps=True) == 6.0  # the short path
    cliff = gym.make("CliffWalking-v1")
    assert expected_return(cliff, np.eye(4)[np.full(48, 3)], 100, steps=True) == 100.0


def test_known_values_at_the_time_limit():
    slippery = gym.make("FrozenLake-v1", is_slippery=True)
    assert expected_return(slippery, optimal(slippery, 100), 100) == pytest.approx(0.7402, abs=1e-4)
    cliff = gym.make("CliffWalking-v1")
    assert expected_return(cliff, optimal(cliff, 100), 100) == -13.0  # the 13-step path
    # A table that walks into the edge forever is cut by the limit: 100 steps of -1.
    assert expected_return(cliff, np.eye(4)[np.full(48, 3)], 100) == -100.0


def test_an_env_without_a_transition_table_is_refused():
    with pytest.raises(TypeError, match="publishes no transition table P"):
        expected_return(gym.make("CartPole-v1"), np.ones((1, 2)), 10)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [("textgym/FrozenLake-v1", {"is_slippery": False}), ("textgym/CliffWalking-v1", {})],
)
@pytest.mark.slow
def test_the_greedy_table_plays_as_the_policy_does_in_the_text_env(tiny_dir, env_id, kwargs):
    """Deterministic envs: one greedy episode of the text env returns the table's exact value."""
    env = gym.make(env_id, **kwargs)
    policy = PPOPolicy.from_pretrained(tiny_dir, config=PPOConfig.for_env(env, seed=0))
    table = greedy_policy(policy, env)
    assert table.shape == (env.unwrapped.observation_space.n, 4)
    assert (table.sum(1) == 1).all()
    played = evaluate(policy, env, 1, seed=0, num_envs=1)
    exact = expected_return(env, table, env.spec.max_episode_steps)
    assert played["mean_return"] == pytest.approx(exact)


@pytest.mark.slow
def test_the_sampling_table_is_what_the_text_policy_samples(tiny_dir):
    """The sampling table's exact episode length is the mean length of the text env's sampled
    episodes; a hotter temperature flattens it and leaves the greedy table as it was."""
    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, max_episode_steps=8)
    config = PPOConfig.for_env(env, seed=0)
    policy = PPOPolicy.from_pretrained(tiny_dir, config=config)
    greedy, sampling = policy_tables(policy, env)
    assert np.allclose(sampling.sum(1), 1.0)
    assert (greedy.argmax(1) == sampling.argmax(1)).all()
    exact = expected_return(env, sampling, 8, steps=True)
    lengths = np.array([e.length for e in evaluate(policy, env, 256, greedy=False).episodes])
    se = lengths.std(ddof=1) / np.sqrt(len(lengths))
    assert abs(lengths.mean() - exact) < 4 * se, (lengths.mean(), exact, se)
    config.temperature *= 4
    hot_greedy, hot = policy_tables(policy, env)
    assert (hot_greedy == greedy).all()
    entropy = [-(table * np.log(table)).sum(1).mean() for table in (sampling, hot)]
    assert entropy[1] > entropy[0]
