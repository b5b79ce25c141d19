"""Critic-free updates train only on turns with an advantage (``drop_zero_advantage``)."""

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym.episodes import reply_choices
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
from textgym_agents.testing import tiny_model


def choice_policy(**settings):
    values = dict(num_steps=2, minibatch_size=8, micro_batch_size=4, seed=0, kl_coef=0.0)
    config = PPOConfig(decoding="choices", **{**values, **settings})
    torch.manual_seed(0)
    return PPOPolicy(*tiny_model(), config=config)


def grouped_buffer(policy, rewards_by_group):
    """One single-turn episode per reward, in the given groups (replies drawn by the policy)."""
    env = gym.make("textgym/Blackjack-v1")
    buffer = RolloutBuffer()
    stream = 0
    for group, rewards in enumerate(rewards_by_group):
        for reward in rewards:
            messages, _ = env.reset(seed=group)
            generation = policy.generate([messages], choices=[reply_choices(env)])
            turn = Turn(
                generation.prompt_ids[0],
                generation.response_ids[0],
                reward,
                terminated=True,
                choice_ids=generation.choice_ids[0],
                group=group,
            )
            turn.old_logps = torch.tensor([generation.logps[0]])
            buffer.add(stream, turn)
            stream += 1
    return buffer


def lora_weights(policy):
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("drop", [True, False])
def test_zero_advantage_batch_leaves_every_weight_unchanged(drop):
    # An entropy bonus is the only gradient such a batch has: dropped, nothing moves.
    policy = choice_policy(
        advantage_estimator="grpo", group_size=2, ent_coef=0.5, drop_zero_advantage=drop
    )
    trainer = PPOTrainer(policy)
    before = lora_weights(policy)
    metrics = trainer.update(grouped_buffer(policy, [[1.0, 1.0], [0.0, 0.0]]))
    after = lora_weights(policy)
    unchanged = all(torch.equal(after[n], w) for n, w in before.items())
    assert unchanged is drop
    assert metrics["train/trained_turns"] == (0 if drop else 4)
    assert metrics["train/epochs_done"] == (0 if drop else policy.config.num_epochs)
    assert metrics["env/turns"] == 4  # the rollout still counts


def test_only_turns_with_an_advantage_are_trained(policy_loss_calls):
    policy = choice_policy(advantage_estimator="grpo", group_size=2)
    trainer = PPOTrainer(policy)
    buffer = grouped_buffer(policy, [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    metrics = trainer.update(buffer)
    assert metrics["train/trained_turns"] == 2
    rows = sum(int(mask.sum()) for _, _, mask in policy_loss_calls)
    assert rows == 2 * policy.config.num_epochs  # one scored token per choice turn


def test_gae_trains_on_every_turn():
    policy = choice_policy()
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    metrics = trainer.update(trainer.collect())
    assert metrics["train/trained_turns"] == metrics["env/turns"] > 0


def mirror_buffer(policy, plays):
    """Single-turn Blackjack episodes: (anchor, reply index, reward) each, from one deal."""
    env = gym.make("textgym/Blackjack-v1")
    messages, _ = env.reset(seed=0)
    generation = policy.generate([messages], choices=[reply_choices(env)])
    buffer = RolloutBuffer()
    for stream, (anchor, reply, reward) in enumerate(plays):
        choice_ids = generation.choice_ids[0]
        turn = Turn(
            generation.prompt_ids[0],
            choice_ids[reply],
            reward,
            terminated=True,
            choice_ids=choice_ids,
            group=stream // 2,
            anchor=anchor,
        )
        turn.old_choice_logps = generation.choice_logps[0]
        turn.old_logps = generation.choice_logps[0][reply : reply + 1]
        buffer.add(stream, turn)
    return buffer


def test_mirror_updates_hold_turns_without_a_comparison_only_beside_turns_that_move():
    settings = dict(advantage_estimator="grpo", group_size=2, ent_coef=0.5, all_choices=True)
    policy = choice_policy(choice_update="mirror", **settings)
    trainer = PPOTrainer(policy)
    before = lora_weights(policy)
    # every observation played with one reply: no comparison anywhere, nothing moves
    metrics = trainer.update(mirror_buffer(policy, [("a", 0, 1.0), ("b", 0, 0.0)]))
    assert metrics["train/trained_turns"] == 0
    assert all(torch.equal(lora_weights(policy)[n], w) for n, w in before.items())
    # "s" played with both replies: its turns move, and "c" is held beside them
    plays = [("s", 0, 1.0), ("s", 1, -1.0), ("c", 0, 0.0), ("c", 0, 0.0)]
    metrics = trainer.update(mirror_buffer(policy, plays))
    assert metrics["train/trained_turns"] == 4
    clipped = PPOTrainer(choice_policy(**settings))
    assert clipped.update(mirror_buffer(policy, plays))["train/trained_turns"] == 2
