from contextlib import nullcontext

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, Turn
from textgym_agents.decoding.shared_prefix import shared_length
from textgym_agents.ppo.steps import minibatch_loss, minibatches
from textgym_agents.testing import tiny_model

SHARED = list(range(100, 130))  # a 30-token "system prompt" every row starts with


def turns_of(lengths):
    rng = np.random.default_rng(0)
    return [
        Turn(SHARED + rng.integers(1, 50, size=n).tolist(), [7, 8], reward=0.0) for n in lengths
    ]


@pytest.mark.parametrize("budget", [1, 40, 100, 400])
def test_token_bounded_micro_batches_keep_every_turn_within_the_budget(budget):
    turns = turns_of([5, 60, 12, 33, 2, 90, 41, 17, 8, 64])
    order = np.random.default_rng(1).permutation(len(turns))
    layout = list(minibatches(order, turns, 6, 4, micro_batch_tokens=budget))
    assert [sorted(i for micro in mb for i in micro) for mb in layout] == [
        sorted(order[:6].tolist()),
        sorted(order[6:].tolist()),
    ]
    for minibatch in layout:
        prompts = [turns[i].prompt_ids for micro in minibatch for i in micro]
        shared = shared_length(prompts, min(len(p) for p in prompts) - 1)
        for micro in minibatch:
            assert len(micro) <= 4
            own = [len(turns[i].prompt_ids) + len(turns[i].response_ids) - shared for i in micro]
            assert len(micro) == 1 or max(own) * len(micro) <= budget
    # without a bound: micro_batch_size turns per pass
    plain = list(minibatches(order, turns, 6, 4))
    assert [len(micro) for mb in plain for micro in mb] == [4, 2, 4]


def test_token_bounded_micro_batches_give_the_same_gradient():
    model, tokenizer = tiny_model()
    config = PPOConfig(num_steps=3, max_new_tokens=5, minibatch_size=12, micro_batch_size=12)
    policy = PPOPolicy(model, tokenizer, config=config)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    turns = buffer.turns()
    order = np.arange(len(turns))
    trainer.score(turns, order)
    trainer.compute_advantages(buffer)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    params += list(policy.value_head.parameters())

    def gradient(budget):
        layout = next(minibatches(order, turns, 12, 12, micro_batch_tokens=budget))
        for p in params:
            p.grad = None
        tokens = sum(turns[i].scored_tokens for micro in layout for i in micro)
        stats = minibatch_loss(policy, config, turns, layout, tokens, len(turns))
        return len(layout), [p.grad.clone() for p in params], stats

    one_pass, whole, whole_stats = gradient(None)
    passes, split, split_stats = gradient(60)
    assert one_pass == 1 and passes > 1
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert split_stats["loss/total"] == pytest.approx(whole_stats["loss/total"], rel=1e-4)


def test_micro_batch_tokens_is_checked():
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        PPOConfig(micro_batch_tokens=0)
    assert PPOConfig(micro_batch_tokens=512).micro_batch_tokens == 512


def test_a_minibatchs_shared_prefix_runs_once_with_the_same_gradient(monkeypatch):
    from textgym_agents.decoding.scoring import PolicyScoring

    config = PPOConfig(minibatch_size=10, micro_batch_size=2, advantage_estimator="reinforce")
    policy = PPOPolicy(*tiny_model(), config=config)
    turns = turns_of([5, 60, 12, 33, 2, 9])
    for k, turn in enumerate(turns):
        turn.advantage = float(k - 2)
    layout = next(minibatches(np.arange(len(turns)), turns, 10, 2))
    assert len(layout) == 3
    tokens = sum(turn.scored_tokens for turn in turns)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    prefix_runs = []
    decoder = policy._decoder()
    handle = decoder.register_forward_pre_hook(
        lambda m, args, kwargs: prefix_runs.append(kwargs["input_ids"].shape[1] == len(SHARED)),
        with_kwargs=True,
    )

    def gradient():
        for p in params:
            p.grad = None
        for turn in turns:
            turn.old_logps = None
        prefix_runs.clear()
        minibatch_loss(policy, config, turns, layout, tokens, len(turns), first_pass=True)
        return [p.grad.clone() for p in params], sum(prefix_runs)

    once, runs_once = gradient()
    monkeypatch.setattr(PolicyScoring, "sharing_prefix", lambda self, prompts: nullcontext())
    each, runs_each = gradient()
    handle.remove()
    assert (runs_once, runs_each) == (1, 3)
    assert any(g.abs().max() > 0 for g in once)
    for a, b in zip(once, each, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
