from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from textgym_agents.ppo.core import (
    AdaptiveKLController,
    FixedKLController,
    compute_gae,
    entropy,
    explained_variance,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    value_loss,
)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# --- GAE ----------------------------------------------------------------------------------------


def naive_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Textbook GAE, one episode at a time, with plain Python floats."""
    advantages = [0.0] * len(rewards)
    start = 0
    for end in range(len(rewards)):
        if not (terminated[end] or truncated[end] or end == len(rewards) - 1):
            continue
        # Within an episode V(s_{t+1}) is the next turn's value, except after its last turn.
        for t in range(start, end + 1):
            adv, discount = 0.0, 1.0
            for k in range(t, end + 1):
                if k < end:
                    v_next = values[k + 1]
                elif terminated[k]:
                    v_next = 0.0
                else:
                    v_next = next_values[k]
                adv += discount * (rewards[k] + gamma * v_next - values[k])
                discount *= gamma * lam
            advantages[t] = adv
        start = end + 1
    return advantages


def pay_at_end_sequence(episode_lengths, truncate_first):
    """Episodes that pay 1 on their last turn only, under a constant value function V = 0.5.

    The first episode can be cut short by truncation instead (no pay, bootstrap from V); the last
    one always terminates.
    """
    rewards, terminated, truncated = [], [], []
    for i, length in enumerate(episode_lengths):
        cut = truncate_first and i == 0
        rewards += [0.0] * (length - 1) + [0.0 if cut else 1.0]
        terminated += [False] * (length - 1) + [not cut]
        truncated += [False] * (length - 1) + [cut]
    values = [0.5] * len(rewards)
    return rewards, values, list(values), terminated, truncated


@pytest.mark.parametrize("gamma", [0.9, 0.99, 1.0])
@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
@pytest.mark.parametrize("n_episodes", [1, 2, 3])
@pytest.mark.parametrize("truncate_first", [False, True])
def test_gae_matches_naive_loop(gamma, lam, n_episodes, truncate_first):
    episode_lengths = [4, 2, 5][:n_episodes]
    rewards, values, next_values, terminated, truncated = pay_at_end_sequence(
        episode_lengths, truncate_first
    )
    advantages, returns = compute_gae(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(next_values),
        torch.tensor(terminated),
        torch.tensor(truncated),
        gamma=gamma,
        lam=lam,
    )
    expected = naive_gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    assert np.allclose(advantages.numpy(), expected, atol=1e-6)
    assert np.allclose(returns.numpy(), np.array(expected) + np.array(values), atol=1e-6)


def test_gae_lam_one_gives_discounted_return_minus_value():
    # With γ = λ = 1 and a terminal reward of 1, every turn's return is exactly 1.
    rewards, values, next_values, terminated, truncated = pay_at_end_sequence([3, 4], False)
    _, returns = compute_gae(
        *map(torch.tensor, (rewards, values, next_values, terminated, truncated)),
        gamma=1.0,
        lam=1.0,
    )
    assert_close(returns, torch.ones(7))


def test_gae_random_inputs_match_naive_loop(generator):
    n = 12
    rewards = torch.randn(n, generator=generator)
    values = torch.randn(n, generator=generator)
    next_values = torch.cat([values[1:], torch.randn(1, generator=generator)])
    terminated = torch.zeros(n, dtype=torch.bool)
    truncated = torch.zeros(n, dtype=torch.bool)
    terminated[3], truncated[7] = True, True
    # After a truncated turn the next value is V(final obs), not V(next episode's first prompt).
    next_values[7] = 0.7
    advantages, _ = compute_gae(
        rewards, values, next_values, terminated, truncated, gamma=0.97, lam=0.9
    )
    expected = naive_gae(
        *(x.tolist() for x in (rewards, values, next_values, terminated, truncated)), 0.97, 0.9
    )
    assert_close(advantages, torch.tensor(expected))


def flags(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def test_truncation_bootstraps_termination_does_not():
    rewards, values, next_values = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([10.0])
    terminated_adv, _ = compute_gae(
        rewards, values, next_values, flags(True), flags(False), gamma=0.5, lam=0.9
    )
    truncated_adv, _ = compute_gae(
        rewards, values, next_values, flags(False), flags(True), gamma=0.5, lam=0.9
    )
    still_running_adv, _ = compute_gae(
        rewards, values, next_values, flags(False), flags(False), gamma=0.5, lam=0.9
    )
    assert_close(terminated_adv, torch.tensor([1.0]))
    assert_close(truncated_adv, torch.tensor([1.0 + 0.5 * 10.0]))
    assert_close(still_running_adv, truncated_adv)


@pytest.mark.parametrize("boundary", ["terminated", "truncated"])
def test_advantages_do_not_leak_across_episode_boundaries(boundary):
    # Turn 0 ends an episode; turn 1 starts another with a huge reward that must stay put.
    ends = {"terminated": (flags(True, True), flags(False, False))}
    ends["truncated"] = (flags(False, True), flags(True, False))
    terminated, truncated = ends[boundary]
    advantages, _ = compute_gae(
        rewards=torch.tensor([1.0, 1000.0]),
        values=torch.tensor([0.0, 0.0]),
        next_values=torch.tensor([2.0, 0.0]),
        terminated=terminated,
        truncated=truncated,
        gamma=1.0,
        lam=1.0,
    )
    first_turn = 1.0 if boundary == "terminated" else 1.0 + 2.0
    assert_close(advantages, torch.tensor([first_turn, 1000.0]))


def test_gae_accepts_float_flags_and_detaches():
    values = torch.tensor([0.5, 0.5], requires_grad=True)
    advantages, returns = compute_gae(
        torch.tensor([0.0, 1.0]),
        values,
        torch.tensor([0.5, 0.0]),
        torch.tensor([0.0, 1.0]),
        torch.tensor([0.0, 0.0]),
        gamma=1.0,
        lam=1.0,
    )
    assert not advantages.requires_grad and not returns.requires_grad
    assert_close(advantages, torch.tensor([0.5, 0.5]))


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(
        ValueError, match=r"of one shape, got \(2,\), \(2,\), \(3,\), \(2,\), \(2,\)$"
    ):
        compute_gae(
            torch.zeros(2), torch.zeros(2), torch.zeros(3), flags(0, 0), flags(0, 0), 0.9, 0.9
        )


# --- masked statistics -------------------------------------------------------------------------


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_masked_mean_and_var_match_naive(generator, mask_dtype):
    values = torch.randn(4, 7, generator=generator)
    mask = (torch.rand(4, 7, generator=generator) > 0.4).to(mask_dtype)
    mask[:, 0] = 1  # every row has a valid entry
    valid = values[mask.bool()]
    assert_close(masked_mean(values, mask), valid.mean())
    assert_close(masked_var(values, mask), valid.var())
    assert_close(masked_var(values, mask, unbiased=False), valid.var(unbiased=False))
    row_means = torch.stack([row[m.bool()].mean() for row, m in zip(values, mask, strict=True)])
    assert_close(masked_mean(values, mask, dim=1), row_means)


def test_masked_mean_ignores_non_finite_padding():
    values = torch.tensor([1.0, 3.0, float("inf"), float("nan")])
    assert_close(masked_mean(values, torch.tensor([1, 1, 0, 0])), torch.tensor(2.0))


def test_masked_whiten_gives_zero_mean_unit_std_over_valid_entries(generator):
    values = 5.0 + 3.0 * torch.randn(64, generator=generator)
    mask = torch.rand(64, generator=generator) > 0.3
    whitened = masked_whiten(values, mask)
    assert_close(whitened[mask].mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    assert_close(whitened[mask].std(), torch.tensor(1.0), atol=1e-5, rtol=0)
    unshifted = masked_whiten(values, mask, shift_mean=False)
    assert_close(unshifted[mask].mean(), values[mask].mean())


def test_single_element_mask_is_finite():
    values = torch.tensor([3.0, -2.0, 7.0])
    mask = torch.tensor([0.0, 1.0, 0.0])
    assert masked_mean(values, mask).item() == -2.0
    assert masked_var(values, mask).item() == 0.0
    assert torch.isfinite(masked_whiten(values, mask)).all()
    assert masked_whiten(values, mask)[1].item() == 0.0


# --- policy and value losses -------------------------------------------------------------------


def test_policy_loss_ratio_one_is_minus_mean_advantage(generator):
    logps = -torch.rand(3, 5, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    pg_loss, stats = policy_loss(logps, logps.clone(), advantages, mask, clip_range=0.2)
    per_token_advantages = advantages.unsqueeze(-1).expand(3, 5)
    assert_close(pg_loss, -masked_mean(per_token_advantages, mask))
    assert stats["clip_frac"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    assert stats["ratio_mean"].item() == 1.0


def test_policy_loss_hand_computed_clipping():
    # Ratios per token: 1.5, 0.5, 1.5, 0.5, 1.1 (last one padding); clip ε = 0.2.
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]])
    old = torch.full((1, 5), -1.0)
    logps = old + ratios.log()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    pg_loss, stats = policy_loss(logps, old, advantages, mask, clip_range=0.2)
    # A > 0: max(-1.5, -1.2) = -1.2 (clipped), max(-0.5, -0.8) = -0.5 (unclipped).
    # A < 0: max(1.5, 1.2) = 1.5 (unclipped), max(0.5, 0.8) = 0.8 (clipped).
    assert_close(pg_loss, torch.tensor((-1.2 - 0.5 + 1.5 + 0.8) / 4))
    assert_close(stats["clip_frac"], torch.tensor(0.5))
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.5, 0.5)]
    assert_close(stats["approx_kl"], torch.tensor(sum(k3) / 4))
    assert_close(stats["ratio_mean"], torch.tensor(1.0))


def test_policy_loss_gradient_flows_only_through_valid_tokens():
    old = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -100.0, -100.0]])
    # Padding holds log-probs far apart enough that exp() would overflow to inf.
    logps = torch.tensor([[-0.9, -1.1, -200.0], [-2.1, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    pg_loss, stats = policy_loss(logps, old, torch.tensor([1.0, -1.0]), mask, clip_range=0.2)
    pg_loss.backward()
    assert torch.isfinite(pg_loss) and all(torch.isfinite(v) for v in stats.values())
    assert (logps.grad[mask == 0] == 0).all()
    assert (logps.grad[mask == 1] != 0).all()


def test_policy_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"of one shape, got \(2, 3\), \(2, 3\), \(2, 4\)$"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 4), 0.2)


def test_value_loss_unclipped():
    values = torch.tensor([1.0, 2.0, 0.0])
    returns = torch.tensor([0.0, 4.0, 0.0])
    v_loss, stats = value_loss(values, torch.zeros(3), returns, clip_range_value=None)
    assert_close(v_loss, torch.tensor(0.5 * (1.0 + 4.0 + 0.0) / 3))
    assert stats["value_clip_frac"].item() == 0.0


def test_value_loss_clipped():
    values = torch.tensor([1.0, 2.0, 0.1], requires_grad=True)
    old_values = torch.tensor([0.0, 0.0, 0.0])
    returns = torch.tensor([0.0, 4.0, 0.0])
    v_loss, stats = value_loss(values, old_values, returns, clip_range_value=0.5)
    # v_clipped = [0.5, 0.5, 0.1]; squared errors unclipped [1, 4, 0.01], clipped [0.25, 12.25,
    # 0.01]; the max picks [1, 12.25, 0.01], so only the second turn takes the clipped branch.
    assert_close(v_loss, torch.tensor(0.5 * (1.0 + 12.25 + 0.01) / 3))
    assert_close(stats["value_clip_frac"], torch.tensor(1 / 3))
    v_loss.backward()
    assert values.grad[1].item() == 0.0  # clipped: no gradient pushes v further from old


def test_value_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"got \(2, 1\), \(2,\) and \(2,\)"):
        value_loss(torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), None)


# --- KL ----------------------------------------------------------------------------------------


def test_kl_penalty_estimators_match_formulas(generator):
    logps = -torch.rand(4, 6, generator=generator) * 3
    ref = -torch.rand(4, 6, generator=generator) * 3
    assert_close(kl_penalty(logps, ref), logps - ref)
    assert_close(kl_penalty(logps, ref, "k3"), torch.exp(ref - logps) - 1 - (ref - logps))
    assert_close(kl_penalty(logps, ref, "abs"), (logps - ref).abs())
    assert_close(kl_penalty(logps, ref, "mse"), 0.5 * (logps - ref) ** 2)
    assert (kl_penalty(logps, ref, "k3") >= 0).all()
    assert (kl_penalty(logps, logps, "k3") == 0).all()


def test_kl_penalty_unknown_estimator():
    with pytest.raises(ValueError) as excinfo:
        kl_penalty(torch.zeros(1), torch.zeros(1), "k2")
    assert str(excinfo.value) == (
        "Unknown KL estimator 'k2'; expected one of ('k1', 'k3', 'abs', 'mse')"
    )


def test_fixed_kl_controller_never_moves():
    kl_ctl = FixedKLController(0.1)
    for current_kl in (0.0, 1.0, 100.0):
        kl_ctl.update(current_kl, n_steps=1000)
    assert kl_ctl.value == 0.1


@pytest.mark.parametrize(("current_kl", "direction"), [(12.0, 1), (3.0, -1), (6.0, 0)])
def test_adaptive_kl_controller_moves_toward_target(current_kl, direction):
    kl_ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10_000)
    kl_ctl.update(current_kl, n_steps=1000)
    assert np.sign(kl_ctl.value - 0.1) == direction


def test_adaptive_kl_controller_clips_error():
    kl_ctl = AdaptiveKLController(init_kl_coef=0.1, target=1.0, horizon=100)
    kl_ctl.update(current_kl=50.0, n_steps=100)  # error 49 clipped to 0.2
    assert kl_ctl.value == pytest.approx(0.12)
    kl_ctl.update(current_kl=0.0, n_steps=50)  # error -1 clipped to -0.2
    assert kl_ctl.value == pytest.approx(0.12 * 0.9)


def test_kl_controllers_validate_arguments():
    with pytest.raises(ValueError, match=r"Expected kl_coef >= 0, got -1"):
        FixedKLController(-1)
    with pytest.raises(ValueError, match=r"got init_kl_coef=0.1, target=0, horizon=10"):
        AdaptiveKLController(0.1, target=0, horizon=10)


# --- explained variance ------------------------------------------------------------------------


def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 4.0, 8.0])
    assert explained_variance(y, y) == 1.0
    assert explained_variance(torch.full((4,), y.mean().item()), y) == pytest.approx(0.0)
    assert explained_variance(-y, y) < 0
    assert math.isnan(explained_variance(y, torch.full((4,), 3.0)))


# --- log-probs and entropy from logits ---------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_logprobs_from_logits_matches_naive(generator, temperature):
    logits = torch.randn(2, 5, 11, generator=generator)
    labels = torch.randint(0, 11, (2, 5), generator=generator)
    expected = (logits / temperature).log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert_close(logprobs_from_logits(logits, labels, temperature), expected)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_entropy_matches_naive(generator, temperature):
    logits = torch.randn(2, 5, 11, generator=generator)
    probs = (logits / temperature).softmax(-1)
    expected = -(probs * probs.log()).sum(-1)
    assert_close(entropy(logits, temperature), expected)


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match=r"Expected temperature > 0, got 0"):
        logprobs_from_logits(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match=r"Expected temperature > 0, got -1"):
        entropy(torch.zeros(1, 3), temperature=-1)
