"""Long runs keep flat memory: history windows, rollout buffers and metric lists are bounded."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer
from textgym_agents.ppo.rollout import RolloutCollector
from textgym_agents.ppo.tracked import TrackedVectorEnv
from textgym_agents.runfiles.checkpoint import list_checkpoints

HISTORY = 2


@pytest.mark.slow
def test_every_buffer_stays_bounded_over_many_episodes(tiny_dir, tmp_path):
    """The structures a long run could grow stay within their bounds, update after update.

    Process-level growth (RSS, live objects, file descriptors, run-directory size, update
    time) over 2,000 updates is measured by ``benchmarks/soak.py`` instead: a heap measurement
    here depended on the machine's load (it failed once under load and passed alone).
    """
    config = PPOConfig(
        num_steps=2,
        max_new_tokens=4,
        minibatch_size=8,
        micro_batch_size=8,
        num_epochs=1,
        save_every=10,
        progress=False,
        seed=0,
    )
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(tiny_dir, config=config)
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4, history=HISTORY, max_invalid=3)
    trainer = PPOTrainer(policy, envs, output_dir=tmp_path)
    sizes = []

    def measure(metrics):
        collector, tracked = trainer.collector, trainer.envs
        sizes.append(
            (
                len(collector.finished),  # drained by every update
                max(len(r["actions"]) for r in tracked.records if r is not None),
                max(len(messages) for messages in collector.observations),
                len(policy._choice_cache),
                len(list_checkpoints(tmp_path)),
            )
        )
        return False if metrics["train/update"] >= 60 else None

    trainer.train(10**6, callback=measure)
    assert trainer.episodes >= 150  # many episodes went through every buffer
    finished, actions, messages, choices, checkpoints = np.array(sizes).max(axis=0)
    assert finished == 0
    assert actions <= 3  # at most max_invalid replies per episode are recorded
    assert messages <= 2 + 2 * HISTORY  # the prompt's history window
    assert choices == 0  # free decoding caches no choice sets
    assert 1 <= checkpoints <= config.keep_checkpoints  # pruned as they are written
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 60  # metrics go to disk


def test_undrained_episode_statistics_are_capped():
    """Someone collecting without ever updating keeps at most max_episode_history episodes."""

    class Stick:
        """A scripted policy: always stick, so every Blackjack step ends an episode."""

        def generate(self, batch):
            from textgym_agents import Generation

            n = len(batch)
            return Generation([[1]] * n, [[2]] * n, ['{"action": "stick"}'] * n)

        def encode(self, messages):
            return [1]

    envs = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    collector = RolloutCollector(envs, seed=0, max_episode_history=50)
    for _ in range(40):
        collector.collect(Stick(), 2, RolloutBuffer())
    assert envs.episodes.sum() > 150
    assert len(collector.finished) == 50
