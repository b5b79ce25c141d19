"""Exploration with exact ratios: replies drawn from (1 - eps) * π + eps * uniform."""

import math

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym.episodes import reply_choices
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, Turn
from textgym_agents.decoding.choices import ChoiceScores
from textgym_agents.ppo import core
from textgym_agents.ppo.steps import behaviour_weight
from textgym_agents.testing import tiny_model


def surrogate_gradient(logits, old_logps, action, advantage, behaviour_logp):
    """Gradient of PPO's clipped loss for one sampled choice, weighted as the update does."""
    turn = Turn([1], [2], reward=0.0, behaviour_logp=behaviour_logp)
    turn.old_logps = old_logps[action : action + 1]
    weighted = torch.tensor([advantage * behaviour_weight(turn)])
    logps = logits.log_softmax(0)[action].reshape(1, 1)
    loss, stats = core.policy_loss(logps, turn.old_logps[None], weighted, torch.ones(1, 1), 0.2)
    assert stats["ratio_mean"].item() == 1.0  # at the old weights the ratio is exactly 1
    (gradient,) = torch.autograd.grad(loss, logits)
    return gradient


@pytest.mark.parametrize("eps", [0.0, 0.3, 0.9])
def test_mixture_gradient_equals_the_on_policy_gradient(eps):
    """On a one-state bandit, summing over every action: E_μ[weighted grad] = E_π[grad]."""
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0], dtype=torch.float64, requires_grad=True)
    advantages = [1.0, -0.5, 2.0, 0.25]
    old_logps = logits.detach().log_softmax(0)
    pi = old_logps.exp()
    mu = (1 - eps) * pi + eps / len(pi)
    explored = sum(
        mu[a] * surrogate_gradient(logits, old_logps, a, advantages[a], float(mu[a].log()))
        for a in range(len(pi))
    )
    on_policy = sum(
        pi[a] * surrogate_gradient(logits, old_logps, a, advantages[a], None)
        for a in range(len(pi))
    )
    torch.testing.assert_close(explored, on_policy)
    # ... and that is the policy gradient: d/dθ Σ_a π_θ(a) A(a), negated (a loss)
    (exact,) = torch.autograd.grad(
        -(logits.softmax(0) * torch.tensor(advantages, dtype=torch.float64)).sum(), logits
    )
    torch.testing.assert_close(on_policy, exact)


def test_explore_draws_from_the_mixture_and_returns_its_log_probs():
    pi = torch.tensor([0.97, 0.01, 0.01, 0.01], dtype=torch.float64)
    scores = ChoiceScores([pi.log()] * 4000, None)
    picks, logps = scores.explore(0.4, torch.Generator().manual_seed(0))
    mu = 0.6 * pi + 0.1
    counts = torch.bincount(torch.tensor(picks), minlength=4) / len(picks)
    torch.testing.assert_close(counts.double(), mu, atol=0.025, rtol=0)
    assert logps == pytest.approx([math.log(mu[k]) for k in picks])


def explored_policy(**settings):
    values = dict(num_steps=2, minibatch_size=8, micro_batch_size=4, seed=0, kl_coef=0.0)
    config = PPOConfig(decoding="choices", explore_eps=0.5, **{**values, **settings})
    torch.manual_seed(0)
    return PPOPolicy(*tiny_model(), config=config)


def test_rollout_records_the_mixture_and_its_weights_are_bounded(policy_loss_calls):
    policy = explored_policy()
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    turns = buffer.turns()
    assert turns and all(t.behaviour_logp is not None for t in turns)
    for turn in turns:  # μ keeps eps / K of the mass on every reply; π / μ <= 1 / (1 - eps)
        assert turn.behaviour_logp >= math.log(0.5 / 2) - 1e-9
        assert 0 < behaviour_weight(turn) <= 2.0 + 1e-9
    trainer.update(buffer)
    new, old, mask = policy_loss_calls[0]
    torch.testing.assert_close(new * mask, old * mask, atol=1e-5, rtol=0)


def test_acting_outside_training_rollouts_never_explores():
    policy = explored_policy()
    env = gym.make("textgym/Blackjack-v1")
    messages, _ = env.reset(seed=0)
    generation = policy.generate([messages], choices=[reply_choices(env)])
    assert generation.behaviour_logps is None  # drawn from the policy itself


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"explore_eps": 1.0, "decoding": "choices"}, r"explore_eps must be in \[0, 1\)"),
        ({"explore_eps": -0.1, "decoding": "choices"}, r"explore_eps must be in \[0, 1\)"),
        ({"explore_eps": 0.2, "decoding": "free"}, "needs decoding='choices' or 'auto'"),
        (
            {"explore_eps": 0.2, "decoding": "choices", "rollout_engine": "vllm"},
            "rollout_engine='hf'",
        ),
    ],
)
def test_bad_exploration_settings_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**settings)
