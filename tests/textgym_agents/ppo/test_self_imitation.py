"""Self-imitation (``PPOConfig.self_imitation``): replaying better-than-expected turns."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
from textgym_agents.ppo import core
from textgym_agents.ppo.self_imitation import SCALE_FLOOR, SelfImitationReplay
from textgym_agents.testing import tiny_model


def episode(rewards, values, end="terminated", reply=2):
    turns = [Turn([1, 5 + k], [reply], r) for k, r in enumerate(rewards)]
    for turn, value in zip(turns, values, strict=True):
        turn.value = value
    if end:
        setattr(turns[-1], end, True)
    return turns


def test_keeps_only_finished_turns_whose_return_beat_their_value():
    replay = SelfImitationReplay(capacity=10)
    won = episode([0.0, 1.0], [0.5, 0.9])  # returns 1, 1: both beat their values
    lost = episode([0.0, 0.2], [0.5, 0.1])  # returns 0.2, 0.2: only the last beats 0.1
    cut = episode([0.0, 1.0], [0.0, 0.0], end="truncated")  # return unknown: skipped
    running = episode([1.0], [0.0], end=None)  # unfinished: skipped
    replay.add([won, lost, cut, running], gamma=1.0)
    kept = [(k.prompt_ids, k.ret) for k in replay.kept]
    assert kept == [([1, 5], 1.0), ([1, 6], 1.0), ([1, 6], 0.2)]


def test_returns_are_discounted_and_the_oldest_turns_leave_first():
    replay = SelfImitationReplay(capacity=2)
    replay.add([episode([0.0, 0.0, 1.0], [0.0, 0.0, 0.0])], gamma=0.5)
    assert [k.ret for k in replay.kept] == [0.5, 1.0]  # the first turn's 0.25 was pushed out


def test_sample_draws_distinct_fresh_turns_and_the_state_round_trips():
    replay = SelfImitationReplay(capacity=8)
    replay.add([episode([0.0, 0.0, 1.0], [0.0, 0.0, 0.0])], gamma=1.0)
    drawn = replay.sample(5, np.random.default_rng(0))
    assert sorted(t.prompt_ids[1] for t in drawn) == [5, 6, 7]
    assert all(t.value is None and t.old_logps is None and t.returns == 1.0 for t in drawn)
    restored = SelfImitationReplay(capacity=8)
    restored.load_state(json.loads(json.dumps(replay.state())))
    assert restored.kept == replay.kept
    assert replay.sample(0, np.random.default_rng(0)) == []


def test_config_validates_the_switch():
    assert PPOConfig().self_imitation == 0
    with pytest.raises(ValueError, match="self_imitation must be an int >= 0"):
        PPOConfig(self_imitation=-1)
    # Without a critic the values come from the run's returns per observation.
    assert PPOConfig(self_imitation=4, advantage_estimator="grpo", group_size=2).self_imitation
    with pytest.raises(ValueError, match="self_imitation_capacity must be an int >= 1"):
        PPOConfig(self_imitation=4, self_imitation_capacity=0)


def trainer_with(value, **overrides):
    """A trainer whose critic says ``value`` for every prompt (a zero head with that bias)."""
    config = dict(minibatch_size=8, micro_batch_size=4, seed=0, self_imitation=4)
    config.update(overrides)
    model, tokenizer = tiny_model()
    policy = PPOPolicy(model, tokenizer, config=PPOConfig(**config))
    with torch.no_grad():
        policy.value_head.summary.bias.fill_(value)
    return PPOTrainer(policy)


def rollout(rewards=(0.0, 1.0)):
    buffer = RolloutBuffer()
    for stream in range(2):
        for k, reward in enumerate(rewards):
            last = k == len(rewards) - 1
            buffer.add(stream, Turn([1, 2, 3 + k], [4 + stream, 6], reward, terminated=last))
    return buffer


def test_replayed_turns_get_the_positive_part_of_their_return_over_the_value_now():
    trainer = trainer_with(0.25)
    trainer.replay.add([episode([1.0], [0.0], reply=7), episode([0.1], [0.0], reply=8)], 1.0)
    trainer.update(rollout())  # scores the rollout: sets advantage_scale
    buffer = rollout()
    turns = buffer.turns()
    order = np.arange(len(turns))
    trainer.score(turns, order)
    trainer.compute_advantages(buffer)
    # The scale the batch was whitened by, from its raw advantages (before whitening).
    raw = torch.tensor([t.returns - t.value for t in turns])
    scale = max(float(core.masked_var(raw, torch.ones_like(raw)).sqrt()), SCALE_FLOOR)
    trainer.replay.kept.clear()
    trainer.replay.add([episode([1.0], [0.0], reply=7), episode([0.1], [0.0], reply=8)], 1.0)
    trained, new_order = trainer._with_replay(buffer, turns, order)
    replayed = trained[len(turns) :]
    # Return 1.0 beats the critic's ~0.25 now; 0.1 does not and is left out.
    assert [t.response_ids for t in replayed] == [[7]]
    (turn,) = replayed
    assert turn.value < 1.0 and turn.old_logps is not None
    assert turn.advantage == pytest.approx((1.0 - turn.value) / scale, rel=1e-4)
    assert new_order.tolist() == [*order.tolist(), len(turns)]
    # This rollout's better-than-expected turns are kept for later updates.
    assert len(trainer.replay) > 2


def test_update_reports_replayed_turns_and_raises_a_kept_reply():
    def logp_after(self_imitation):
        trainer = trainer_with(0.0, self_imitation=self_imitation, learning_rate=1e-3)
        kept = episode([1.0], [0.0], reply=9)[0]
        if trainer.replay is not None:
            trainer.replay.add([[kept]], 1.0)
        metrics = trainer.update(rollout(rewards=(0.0, 0.0)))
        with torch.no_grad():
            logp = trainer.policy.score([kept.prompt_ids], [kept.response_ids]).logps[0, 0]
        return float(logp), metrics

    without, plain = logp_after(0)
    with_replay, metrics = logp_after(4)
    assert "train/replayed_turns" not in plain
    assert metrics["train/replayed_turns"] == 1
    assert metrics["train/trained_turns"] == 4 + 1
    assert with_replay > without + 1e-3


def test_a_batch_without_spread_does_not_blow_up_replayed_advantages():
    trainer = trainer_with(0.0)
    buffer = rollout(rewards=(0.0, 0.0))  # every return 0, every value 0: whitening scale ~0
    turns = buffer.turns()
    trainer.score(turns, np.arange(len(turns)))
    trainer.compute_advantages(buffer)
    assert trainer.advantage_scale < 1e-3
    trainer.replay.add([episode([1.0], [0.0], reply=9)], 1.0)
    trained, _ = trainer._with_replay(buffer, turns, np.arange(len(turns)))
    assert trained[-1].advantage == pytest.approx((1.0 - trained[-1].value) / SCALE_FLOOR)


def test_training_from_envs_with_self_imitation_runs():
    trainer = PPOTrainer(
        PPOPolicy(*tiny_model(), config=PPOConfig(
            decoding="choices", num_steps=3, minibatch_size=8, micro_batch_size=4, seed=0,
            self_imitation=8, self_imitation_capacity=16,
        )),
        gym.make_vec("textgym/Blackjack-v1", num_envs=4),
    )  # fmt: skip
    first = trainer.update(trainer.collect())
    buffer = trainer.collect()
    played = len(buffer)
    second = trainer.update(buffer)
    assert first["train/replayed_turns"] == 0  # nothing kept before the first rollout
    assert 0 < len(trainer.replay) <= 16
    assert second["train/replayed_turns"] > 0
    assert second["train/trained_turns"] == played + second["train/replayed_turns"]


def grouped_rollout(returns, anchor="s"):
    """One-turn episodes from one observation, in one seed-shared group."""
    buffer = RolloutBuffer()
    for stream, reward in enumerate(returns):
        turn = Turn([1, 2, 3], [4 + stream], reward, terminated=True, group=0, anchor=anchor)
        buffer.add(stream, turn)
    return buffer


def test_without_a_critic_replay_measures_returns_against_the_observations_mean_return():
    trainer = trainer_with(0.0, advantage_estimator="grpo", group_size=2)
    assert trainer.state_returns is not None and trainer.choice_returns is None
    # Kept earlier (both did better than expected then): returns 1.0 and 0.4 from "s".
    kept = [episode([1.0], [0.0], reply=7), episode([0.4], [0.0], reply=8)]
    for turns in kept:
        turns[0].anchor = "s"
    trainer.replay.add(kept, 1.0)
    buffer = grouped_rollout([1.0, 0.0])  # this rollout: returns 1 and 0 from "s"
    trainer.compute_advantages(buffer)  # records them: V(s) = 0.5
    assert trainer.state_returns.value("s") == 0.5
    turns = buffer.turns()
    trainer.score(turns, np.arange(len(turns)))
    trained, order = trainer._with_replay(buffer, turns, np.arange(len(turns)))
    replayed = trained[len(turns) :]
    # 1.0 beats V(s) = 0.5 now, 0.4 does not. The scale: the spread of this rollout's R - V,
    # +0.5 and -0.5 (std 0.5).
    assert [(t.response_ids, t.value) for t in replayed] == [([7], 0.5)]
    assert trainer.advantage_scale == pytest.approx(0.5)
    assert replayed[0].advantage == pytest.approx((1.0 - 0.5) / 0.5)
    assert replayed[0].old_logps is not None and order.tolist() == [0, 1, 2]
    # This rollout's return of 1 beat V(s) = 0.5: kept, with its observation.
    assert len(trainer.replay) == 3 and trainer.replay.kept[-1].anchor == "s"


def test_without_a_critic_turns_of_unknown_observations_are_neither_kept_nor_replayed():
    trainer = trainer_with(0.0, advantage_estimator="grpo", group_size=2)
    trainer.replay.add([episode([1.0], [0.0], reply=7)], 1.0)  # kept with no anchor
    buffer = grouped_rollout([1.0, 0.0], anchor=None)
    trainer.compute_advantages(buffer)
    turns = buffer.turns()
    trainer.score(turns, np.arange(len(turns)))
    trained, _ = trainer._with_replay(buffer, turns, np.arange(len(turns)))
    assert trained == turns and len(trainer.replay) == 1


def test_group_estimators_train_from_envs_with_self_imitation():
    config = PPOConfig(
        decoding="choices", advantage_estimator="gigpo", group_size=2, num_steps=3,
        minibatch_size=8, micro_batch_size=4, seed=0, self_imitation=8,
    )  # fmt: skip
    trainer = PPOTrainer(
        PPOPolicy(*tiny_model(), config=config), gym.make_vec("textgym/Blackjack-v1", num_envs=4)
    )
    replayed = 0
    for _ in range(4):
        metrics = trainer.update(trainer.collect())
        replayed += metrics["train/replayed_turns"]
    assert len(trainer.state_returns.entries) > 0
    assert all(k.anchor is not None for k in trainer.replay.kept)
    assert replayed > 0
