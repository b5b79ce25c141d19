"""The count-based novelty bonus (``PPOConfig.novelty_bonus``)."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
from textgym_agents.ppo.novelty import VisitCounts
from textgym_agents.testing import tiny_model


def episode(anchors, done=True):
    turns = [Turn([1], [2], 0.0, anchor=a) for a in anchors]
    turns[-1].terminated = done
    return turns


def test_bonus_follows_the_count_of_the_state_a_turn_leads_to():
    counts = VisitCounts(coef=0.5)
    first = episode(["s0", "s1", "s2"])
    counts.assign([first])
    assert [t.bonus for t in first] == [0.5, 0.5, 0.0]  # s1, s2 new; the last turn: none
    again, cut = episode(["s0", "s1", "s1"]), episode(["s0", "s3"], done=False)
    counts.assign([again, cut])
    assert again[0].bonus == pytest.approx(0.5 / math.sqrt(3))  # s1: once before, twice now
    assert again[1].bonus == 0.0  # back at s1 within the episode: no bonus twice
    assert cut[0].bonus == pytest.approx(0.5)  # s3 seen once
    assert cut[-1].bonus == 0.0  # its successor is in the next rollout


def test_counts_survive_a_checkpoint_round_trip_including_tuple_anchors():
    counts = VisitCounts(coef=1.0)
    counts.assign([episode([("grid", 1), ("grid", 2), ("grid", 2)])])
    restored = VisitCounts(coef=1.0)
    restored.load_state(json.loads(json.dumps(counts.state())))
    assert restored.counts == counts.counts == {("grid", 1): 1, ("grid", 2): 2}


def test_bonus_gives_signal_to_a_group_whose_env_returns_are_equal():
    """GRPO on episodes with equal env returns: 0 advantages, unless the bonus tells them apart."""
    config = PPOConfig(advantage_estimator="grpo", group_size=2, kl_coef=0.0)

    def advantages(bonus):
        trainer = PPOTrainer(PPOPolicy(*tiny_model(), config=config))
        trainer.novelty = VisitCounts(bonus) if bonus else None
        buffer = RolloutBuffer()
        for stream, anchors in enumerate([["a", "b", "c"], ["a", "a", "a"]]):
            for turn in episode(anchors):
                turn.group = 0
                buffer.add(stream, turn)
        trainer.compute_advantages(buffer)
        return [t.advantage for t in buffer.turns()]

    assert advantages(0.0) == [0.0] * 6
    explored, stayed = np.split(np.array(advantages(0.5)), 2)
    assert (explored > 0).all() and (stayed < 0).all()


def test_training_with_the_bonus_counts_visits_and_reports_it():
    config = PPOConfig(
        decoding="choices",
        novelty_bonus=0.1,
        num_steps=3,
        minibatch_size=8,
        micro_batch_size=4,
        kl_coef=0.0,
    )
    torch.manual_seed(0)
    trainer = PPOTrainer(
        PPOPolicy(*tiny_model(), config=config), gym.make_vec("textgym/FrozenLake-v1", num_envs=2)
    )
    metrics = trainer.update(trainer.collect())
    assert sum(trainer.novelty.counts.values()) == metrics["env/turns"] == 6
    assert all(isinstance(anchor, str) for anchor in trainer.novelty.counts)
    assert metrics["train/novelty_bonus"] > 0
