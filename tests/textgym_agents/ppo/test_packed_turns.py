"""Turns of a conversation-keeping episode scored and trained in one row (``pack_turns``)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
from textgym_agents.decoding.shared_prefix import shared_length
from textgym_agents.ppo.steps import chained_order, minibatches
from textgym_agents.testing import tiny_model

SHARED = list(range(100, 130))


def chain(start, replies):
    """Turns whose prompt and reply begin the next turn's prompt (a kept conversation)."""
    turns, prompt = [], SHARED + [start]
    for reply in replies:
        turns.append(Turn(list(prompt), list(reply), reward=0.0))
        prompt = prompt + list(reply) + [start + 1, start + 2]  # the next observation
    return turns


def test_chained_turns_ride_in_their_longest_turns_row():
    turns = chain(1, [[7, 8], [9], [10, 11, 12]]) + chain(50, [[7]]) + [Turn(SHARED, [3], 0.0)]
    order = np.array([4, 0, 3, 2, 1])
    packed = list(minibatches(order, turns, 5, 2, pack=True))
    # one minibatch; rows [2, 0, 1] (the chain, longest turn first), [3], [4]; two per pass
    assert packed == [[[2, 0, 1, 3], [4]]]
    # within a token budget only the longest turn of a row counts: room for two rows
    prompts = [turn.prompt_ids for turn in turns]
    shared = shared_length(prompts, min(len(p) for p in prompts) - 1)
    width = len(turns[2].prompt_ids) + 3 - shared  # own tokens of the chain's row
    budget = list(minibatches(order, turns, 5, 8, micro_batch_tokens=2 * width, pack=True))
    assert budget == [[[2, 0, 1, 3], [4]]]
    plain = list(minibatches(order, turns, 5, 2))
    assert [len(micro) for micro in plain[0]] == [2, 2, 1]
    # a turn split from its chain by the minibatch boundary gets its own row
    apart = list(minibatches(np.array([0, 1, 2]), turns, 2, 4, pack=True))
    assert apart == [[[1, 0]], [[2]]]


def test_choice_turns_are_never_packed():
    turns = chain(1, [[7, 8], [9]])
    turns[0].choice_ids = [[7, 8], [5, 6]]
    assert list(minibatches(np.array([0, 1]), turns, 2, 1, pack=True)) == [[[1], [0]]]
    assert len(chained_order(np.random.default_rng(0), turns)) == 2


def test_chained_order_shuffles_chains_not_turns():
    turns = chain(1, [[7], [8], [9]]) + chain(50, [[7], [8]]) + [Turn(SHARED, [3], 0.0)]
    seen = set()
    for seed in range(20):
        order = chained_order(np.random.default_rng(seed), turns).tolist()
        assert sorted(order) == list(range(6))
        starts = {order.index(0), order.index(3), order.index(5)}
        assert order[order.index(0) : order.index(0) + 3] == [0, 1, 2]
        assert order[order.index(3) : order.index(3) + 2] == [3, 4]
        seen.add(tuple(sorted(starts)))
    assert len(seen) > 1
    # without chains: the plain permutation, so such runs keep their random stream
    single = [Turn(SHARED + [i], [3], 0.0) for i in range(7)]
    expected = np.random.default_rng(3).permutation(7)
    assert chained_order(np.random.default_rng(3), single).tolist() == expected.tolist()


def conversation_buffer(policy):
    """Two streams of a kept conversation: 3 turns then 2, the last of each terminating."""
    buffer = RolloutBuffer()
    for stream, (question, replies) in enumerate(
        [("What is 2 + 3?", ["calc 2+3", "maybe", "5"]), ("What is 7 * 6?", ["calc", "42"])]
    ):
        chat = [{"role": "user", "content": question}]
        for k, reply in enumerate(replies):
            last = k == len(replies) - 1
            ids = policy.tokenizer.encode(reply, add_special_tokens=False)
            turn = Turn(policy.encode(chat), ids, reward=1.0 if last else -0.1, terminated=last)
            buffer.add(stream, turn)
            chat = chat + [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Observation {k}"},
            ]
    return buffer


def trained(pack, calls):
    settings = dict(num_epochs=2, minibatch_size=64, micro_batch_size=8, kl_coef=0.0, seed=0)
    policy = PPOPolicy(*tiny_model(), config=PPOConfig(pack_turns=pack, **settings))
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    calls.clear()
    metrics = trainer.update(conversation_buffer(policy))
    first = calls[0]
    weights = [p.detach().clone() for p in policy.model.parameters() if p.requires_grad]
    return metrics, first, weights + [p.detach().clone() for p in policy.value_head.parameters()]


def test_a_packed_update_matches_one_row_per_turn(policy_loss_calls):
    turns = conversation_buffer(PPOPolicy(*tiny_model())).turns()
    (layout,) = minibatches(np.arange(5), turns, 64, 1, pack=True)
    assert layout == [[2, 0, 1], [4, 3]]  # each episode is one row
    packed, first, packed_weights = trained(True, policy_loss_calls)
    new, old, mask = first
    assert mask.sum() > 0
    assert torch.equal(new * mask, old * mask)  # scoring and the first epoch share the rows
    plain, _, plain_weights = trained(False, policy_loss_calls)
    for key in ("loss/policy", "loss/value", "policy/entropy"):
        assert packed[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(packed_weights, plain_weights, strict=True))
    for a, b in zip(packed_weights, plain_weights, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
