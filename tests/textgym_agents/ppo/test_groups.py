"""Seed-shared groups and critic-free training with a real env and a tiny model."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.ppo.buffer import RolloutBuffer
from textgym_agents.ppo.groups import GroupRolloutCollector, default_anchor, group_seeds
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.testing import paying_choice_env, paying_choice_policy, tiny_model


def make_policy(**overrides):
    values = dict(num_steps=2, max_new_tokens=4, minibatch_size=8, micro_batch_size=4, seed=0)
    values.update(overrides)
    return PPOPolicy(*tiny_model(), config=PPOConfig(**values))


class CountingPolicy:
    """Records how many observations each generation call was given (the policy still runs)."""

    def __init__(self, policy):
        self.policy, self.batches = policy, []
        self.wants_choices = policy.wants_choices
        self.wants_schemas = policy.wants_schemas

    def generate(self, batch, **kwargs):
        self.batches.append(len(batch))
        return self.policy.generate(batch, **kwargs)

    def encode(self, messages):
        return self.policy.encode(messages)


def first_prompts(buffer):
    return [(turns[0].group, tuple(turns[0].prompt_ids)) for turns in buffer.episodes()]


def test_members_share_the_first_observation_and_groups_differ():
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=8)
    collector = GroupRolloutCollector(envs, seed=3, group_size=4)
    policy = make_policy(decoding="choices")
    buffer = RolloutBuffer()
    collector.collect(policy, 6, buffer)
    starts: dict[int, set] = {}
    for group, prompt in first_prompts(buffer):
        starts.setdefault(group, set()).add(prompt)
    assert len(starts) >= 4 and all(len(s) == 1 for s in starts.values())  # members agree
    assert len({next(iter(s)) for s in starts.values()}) > 1  # groups (and rounds) differ


def test_group_seeds_are_reproducible_and_fresh_per_round():
    assert group_seeds(7, 2, 6, 3) == group_seeds(7, 2, 6, 3)
    assert len(set(group_seeds(7, 2, 6, 3))) == 2
    rounds = [tuple(group_seeds(7, r, 6, 3)) for r in range(20)]
    assert len(set(rounds)) == 20
    assert group_seeds(7, 0, 6, 3) != group_seeds(8, 0, 6, 3)


def test_same_seed_same_episodes():
    def play():
        envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4)
        collector = GroupRolloutCollector(envs, seed=11, group_size=2)
        buffer = RolloutBuffer()
        torch.manual_seed(0)
        collector.collect(make_policy(decoding="choices"), 3, buffer)
        return first_prompts(buffer)

    assert play() == play()


def test_finished_members_idle_and_no_episode_is_dropped():
    """Each call generates only for envs whose episode runs; every episode is complete and
    counted once, in the buffer and in the episode statistics."""
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=6)
    collector = GroupRolloutCollector(envs, seed=0, group_size=3)
    counting = CountingPolicy(make_policy(decoding="choices", temperature=3.0))
    buffer = RolloutBuffer()
    collector.collect(counting, 5, buffer)
    assert sum(counting.batches) == len(buffer)  # one generated reply per recorded turn
    assert min(counting.batches) < 6  # some calls left finished members out
    episodes = buffer.episodes()
    assert all(turns[-1].done for turns in episodes)  # whole episodes only
    assert len(episodes) == 6 * collector.rounds
    assert len(collector.drain()) == len(episodes)
    assert all(isinstance(t.anchor, str) and "dealer" in t.anchor for t in buffer)


def test_anchor_is_the_current_observation_and_overridable():
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    seen = []

    def key(observation):
        seen.append(observation)
        return "same"

    collector = GroupRolloutCollector(envs, seed=0, group_size=2, anchor_key=key)
    buffer = RolloutBuffer()
    collector.collect(make_policy(decoding="choices"), 1, buffer)
    assert {t.anchor for t in buffer} == {"same"} and len(seen) == len(buffer)
    assert default_anchor(seen[0]) == seen[0][-1]["content"]
    assert "dealer" in default_anchor(seen[0])  # the state text, not the system prompt


def test_num_envs_must_be_a_multiple_of_the_group_size():
    policy = make_policy(advantage_estimator="grpo", group_size=4)
    with pytest.raises(ValueError, match=r"num_envs \(6\) must be a multiple of group_size \(4\)"):
        PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=6))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_group_estimators_need_groups(estimator):
    with pytest.raises(ValueError, match="group_size must be >= 2, got 1"):
        PPOConfig(advantage_estimator=estimator)


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match="advantage_estimator must be one of"):
        PPOConfig(advantage_estimator="ppo")


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo", "reinforce"])
@pytest.mark.slow
def test_critic_free_never_runs_or_trains_the_value_head(estimator):
    group = 1 if estimator == "reinforce" else 2
    policy = make_policy(decoding="choices", advantage_estimator=estimator, group_size=group)
    calls = []
    policy.value_head.register_forward_hook(lambda *_: calls.append(1))
    before = [p.detach().clone() for p in policy.value_head.parameters()]
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not held & {id(p) for p in policy.value_head.parameters()}  # no optimizer state
    metrics = trainer.step()
    metrics.update(trainer.step())
    assert calls == []
    after = list(policy.value_head.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not [k for k in metrics if k.startswith(("value/", "loss/value"))]  # absent, not 0
    assert math.isfinite(metrics["loss/policy"])


def test_gae_still_runs_the_value_head():
    policy = make_policy(decoding="choices")
    calls = []
    policy.value_head.register_forward_hook(lambda *_: calls.append(1))
    metrics = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=2)).step()
    assert calls and "value/explained_var" in metrics and "loss/value" in metrics


@pytest.mark.parametrize(
    "settings",
    [
        {"decoding": "free"},
        {"decoding": "constrained"},
        {"decoding": "choices", "kl_coef": 0.1, "gradient_checkpointing": True},
        {"decoding": "choices", "advantage_estimator": "gae"},  # GAE on seed-shared rounds
    ],
    ids=["free", "constrained", "choices-kl-checkpointing", "gae-groups"],
)
@pytest.mark.slow
def test_groups_work_with_every_decoding_mode(settings):
    # Every turn trained: with zero-advantage turns left out, a round whose groups all tie
    # (the KL is exactly 0 at the first update) would take no optimizer step at all.
    settings = {"advantage_estimator": "gigpo", "group_size": 2, **settings}
    policy = make_policy(**settings, drop_zero_advantage=False)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    metrics = trainer.step()
    assert math.isfinite(metrics["loss/total"]) and metrics["env/episodes"] % 4 == 0
    if settings.get("kl_coef"):
        assert metrics["objective/kl"] == pytest.approx(0.0, abs=1e-6)  # first update


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo", "reinforce"])
@pytest.mark.slow
def test_tiny_model_learns_the_paying_choice(estimator):
    """Each critic-free estimator makes a tiny model prefer the paying reply (> 90% greedy)."""
    group_size = 1 if estimator == "reinforce" else 4
    policy = paying_choice_policy(advantage_estimator=estimator, group_size=group_size)
    trainer = PPOTrainer(policy, gym.vector.SyncVectorEnv([paying_choice_env] * 16))
    prompts = [paying_choice_env().reset(seed=seed)[0] for seed in range(16)]
    rates = []
    for _ in range(20):
        trainer.step()
        rates.append(np.mean([r == "yes" for r in policy.act(prompts, greedy=True)]))
        if rates[-1] > 0.9:
            break
    assert rates[-1] > 0.9, rates
