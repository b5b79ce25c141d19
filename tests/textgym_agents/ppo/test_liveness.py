"""A training run always ends: episodes an env never ends are cut at max_episode_turns.

Before the cap, ``learn()`` on such an env ran forever under choice decoding (145 updates in
60 s, 0 episodes, no warning): ``total_episodes`` was its only budget.
"""

from __future__ import annotations

import json
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from textgym import TextEnvWrapper
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.ppo.rollout import TURN_CAP_INFO, EpisodeTurnCap
from textgym_agents.testing import tiny_model
from textgym_agents.tracking.metrics_log import read_metrics

CAP = 5


class Endless(gym.Env):
    """Never terminates nor truncates: the observation counts steps, action 1 pays 1."""

    observation_space = gym.spaces.Discrete(10**6)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(3))
        return self.t, {}

    def step(self, action):
        self.t += 1
        return self.t, float(action), False, False, {}


def endless_env() -> TextEnvWrapper:
    return TextEnvWrapper(
        Endless(),
        formatter="Step {obs}.",
        system_prompt="Pick.",
        action_names=["wait", "go"],
    )


def policy(base: str | None = None, **overrides) -> PPOPolicy:
    """A choice-decoding policy on the tiny model (loaded from ``base`` when given)."""
    values = dict(decoding="choices", reply_prefix='{"action": "', num_steps=2, minibatch_size=4)
    values.update(micro_batch_size=4, num_epochs=1, progress=False, max_episode_turns=CAP)
    values.update(kl_coef=0.0, seed=0)
    values.update(overrides)
    torch.manual_seed(0)  # the LoRA initialisation draws from torch's global RNG
    if base is not None:
        return PPOPolicy.from_pretrained(base, config=PPOConfig(**values))
    return PPOPolicy(*tiny_model(), config=PPOConfig(**values))


class Episodes:
    """A trainer callback that keeps every finished episode."""

    def __init__(self) -> None:
        self.seen = []

    def on_update(self, trainer, metrics, *, episodes, games):
        self.seen += episodes


def test_learn_on_an_env_that_never_ends_returns_with_episodes_cut_at_the_cap():
    agent = policy()
    episodes = Episodes()
    metrics = agent.learn(endless_env(), total_episodes=3, output_dir=None, callback=episodes)
    assert metrics["env/episodes"] >= 3
    assert len(episodes.seen) >= 3
    assert all(e.truncated and e.length == CAP for e in episodes.seen)


def test_every_env_of_a_vector_env_is_capped_and_the_cut_turn_bootstraps():
    agent = policy(num_steps=CAP + 1)
    with torch.no_grad():  # a critic away from its zero init, so bootstrap values show
        for param in agent.value_head.parameters():
            param.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    envs = gym.vector.SyncVectorEnv([endless_env, endless_env])
    trainer = PPOTrainer(agent, envs)
    buffer = trainer.collect()
    episodes = trainer.collector.drain()
    assert sorted(e.env_index for e in episodes) == [0, 1]
    assert all(e.truncated and e.length == CAP for e in episodes)
    for stream in buffer.streams.values():
        cut = stream[CAP - 1]
        assert cut.truncated and not cut.terminated
        assert cut.bootstrap_ids is not None  # bootstrapped from the state it was cut in
        assert not any(t.done for t in stream[: CAP - 1])
    trainer.score(buffer.turns(), np.arange(len(buffer)))
    trainer.compute_advantages(buffer)
    for stream in buffer.streams.values():
        cut = stream[CAP - 1]
        assert cut.bootstrap_value != 0.0  # the critic's value of the state it was cut in
        gamma = agent.config.gamma
        assert cut.returns == pytest.approx(cut.reward + gamma * cut.bootstrap_value, abs=1e-5)
    assert trainer.collector.capped == 2


def test_the_cap_applies_to_a_make_vec_env_and_a_shorter_limit_ends_episodes_first():
    agent = policy(max_episode_turns=3, num_steps=4)
    envs = gym.make_vec("textgym/FrozenLake-v1", num_envs=2, max_episode_steps=2)
    trainer = PPOTrainer(agent, envs)
    assert all(isinstance(e, EpisodeTurnCap) for e in envs.envs)
    assert trainer.envs.env.envs[0].spec.max_episode_steps == 2  # the spec passes through
    trainer.collect()
    # walking into the lake's edge survives 2 turns: the env's own limit cut it, not the cap
    assert all(e.length <= 2 for e in trainer.collector.drain())
    # a second trainer on the same envs re-caps them instead of wrapping them twice
    PPOTrainer(policy(max_episode_turns=7), envs)
    assert [e.max_turns for e in envs.envs] == [7, 7]
    assert not isinstance(envs.envs[0].env, EpisodeTurnCap)


def test_a_warning_says_when_updates_pass_without_a_finished_episode(caplog):
    agent = policy(max_episode_turns=9, num_steps=1)
    trainer = PPOTrainer(agent, endless_env(), stall_warning_updates=2)
    with caplog.at_level(logging.WARNING, logger="textgym_agents"):
        for _ in range(9):
            trainer.step()
    stalls = [r.getMessage() for r in caplog.records if "No episode has finished" in r.message]
    # updates 2, 4 and 8 without an episode; the 9th finished one (cut at the cap)
    assert len(stalls) == 3, stalls
    assert "in the last 2 updates (2 turns)" in stalls[0]
    assert "max_episode_turns=9" in stalls[0]
    assert trainer.episodes == 1 and trainer.updates_without_episode == 0
    cut = [r.getMessage() for r in caplog.records if "played max_episode_turns=9" in r.message]
    assert len(cut) == 1


def test_max_episode_turns_is_validated():
    with pytest.raises(ValueError, match="max_episode_turns must be an int >= 1, got 0"):
        PPOConfig(max_episode_turns=0)
    with pytest.raises(ValueError, match="stall_warning_updates must be an int >= 1"):
        PPOTrainer(policy(), None, stall_warning_updates=0)
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeTurnCap(endless_env(), 0)


def test_the_cap_is_an_info_key_of_the_cut_step():
    env = EpisodeTurnCap(endless_env(), 2)
    env.reset(seed=0)
    first = env.step('{"action": "go"}')
    second = env.step('{"action": "go"}')
    assert first[3:] == (False, first[4]) and TURN_CAP_INFO not in first[4]
    assert second[3] is True and second[4][TURN_CAP_INFO] == 2
    env.reset(seed=0)
    assert env.step('{"action": "go"}')[3] is False  # the count starts again


@pytest.mark.slow
def test_resume_mid_episode_reproduces_the_capped_run_exactly(tiny_dir, tmp_path):
    """Checkpoints fall inside capped episodes; the replay restores each env's turn count."""
    n = 6

    def trainer(run):
        agent = policy(tiny_dir, num_steps=3, kl_coef=0.05, save_every=100)
        envs = gym.vector.SyncVectorEnv([endless_env, endless_env])
        return PPOTrainer(agent, envs, output_dir=run)

    def stop_at(update):
        return lambda metrics: False if metrics["train/update"] >= update else None

    straight = trainer(tmp_path / "straight")
    straight.train(10**6, callback=stop_at(n))
    trainer(tmp_path / "resumed").train(10**6, callback=stop_at(n // 2))
    checkpoints = sorted((tmp_path / "resumed" / "checkpoints").iterdir())
    replay = json.loads((checkpoints[-1] / "envs.json").read_text())["replay"]
    assert replay is not None and any(r["actions"] for r in replay["records"])  # mid-episode
    resumed = trainer(tmp_path / "resumed")
    resumed.train(10**6, callback=stop_at(n), resume_from=tmp_path / "resumed")

    def timeless(lines):
        return [{k: v for k, v in line.items() if not k.startswith(("time", "throughput/"))}
                for line in lines]  # fmt: skip

    straight_lines = timeless(read_metrics(tmp_path / "straight"))
    assert straight_lines[-1]["env/episodes"] >= 4  # episodes were cut across checkpoints
    assert timeless(read_metrics(tmp_path / "resumed")) == straight_lines
    pairs = zip(resumed.policy.model.parameters(), straight.policy.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
