"""Critic-free estimators against hand-computed numbers and naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from textgym_agents.ppo.buffer import Turn
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.ppo.estimators import (
    EPS,
    Trajectory,
    assign_critic_free,
    estimate,
    returns_to_go,
)

# Two groups of unequal members: group 0 has three episodes of lengths 2, 1, 3; group 1 two.
BUFFER = [
    Trajectory([0.0, 1.0], group=0, anchors=["s0", "a"]),
    Trajectory([-1.0], group=0, anchors=["s0"]),
    Trajectory([0.0, 0.0, 2.0], group=0, anchors=["s0", "a", "b"]),
    Trajectory([1.0], group=1, anchors=["t0"]),
    Trajectory([0.5, 0.5], group=1, anchors=["t0", "a"]),
]


def naive_rtg(rewards, gamma):
    return [sum(gamma**k * r for k, r in enumerate(rewards[t:])) for t in range(len(rewards))]


def naive_group(values, keys, loo=False, std=True):
    out = []
    for i, (v, k) in enumerate(zip(values, keys, strict=True)):
        mates = [values[j] for j, kj in enumerate(keys) if kj == k]
        if len(mates) < 2:
            out.append(0.0)
        elif loo:
            others = [values[j] for j, kj in enumerate(keys) if kj == k and j != i]
            out.append(v - sum(others) / len(others))
        else:
            mean = sum(mates) / len(mates)
            sd = math.sqrt(sum((m - mean) ** 2 for m in mates) / (len(mates) - 1))
            out.append((v - mean) / (sd + EPS) if std else v - mean)
    return out


def test_grpo_by_hand():
    """Group 0 returns 1, -1, 2 (mean 2/3, std 1.5275); group 1: 1, 1 (all equal -> 0)."""
    advantages = estimate(BUFFER, "grpo")
    std = np.std([1.0, -1.0, 2.0], ddof=1)
    assert advantages[0] == pytest.approx([(1 - 2 / 3) / std] * 2, abs=1e-5)
    assert advantages[1] == pytest.approx([(-1 - 2 / 3) / std], abs=1e-5)
    assert advantages[3].tolist() == [0.0] and advantages[4].tolist() == [0.0, 0.0]


def test_grpo_without_std_by_hand():
    advantages = estimate(BUFFER, "grpo", by_std=False)
    assert advantages[2] == pytest.approx([2 - 2 / 3] * 3)
    assert advantages[1] == pytest.approx([-1 - 2 / 3])


def test_rloo_leave_one_out_by_hand():
    advantages = estimate(BUFFER, "rloo")
    assert advantages[0] == pytest.approx([1 - (-1 + 2) / 2] * 2)  # 0.5
    assert advantages[1] == pytest.approx([-1 - (1 + 2) / 2])  # -2.5
    assert advantages[2] == pytest.approx([2 - (1 - 1) / 2] * 3)  # 2.0
    assert advantages[4] == pytest.approx([0.0, 0.0])  # 1 vs 1


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("by_std", [True, False])
def test_episode_estimators_match_naive_loop(estimator, by_std):
    rng = np.random.default_rng(0)
    trajectories = [
        Trajectory(rng.normal(size=int(rng.integers(1, 5))).tolist(), group=int(rng.integers(4)))
        for _ in range(30)
    ]
    returns = [sum(t.rewards) for t in trajectories]
    naive = naive_group(returns, [t.group for t in trajectories], estimator == "rloo", by_std)
    got = estimate(trajectories, estimator, by_std=by_std)
    for t, a, expected in zip(trajectories, got, naive, strict=True):
        assert np.allclose(a, [expected] * len(t.rewards))


def test_gigpo_repeated_state_singletons_and_discount_by_hand():
    """State "a" is reached by episodes 0 and 2 of group 0 (a step group of two); "b" only
    once (a singleton: step advantage 0); "s0" is the first state of all three; gamma 0.5."""
    gamma = 0.5
    advantages = estimate(BUFFER, "gigpo", by_std=False, step_gamma=gamma, step_weight=0.5)
    episode = estimate(BUFFER, "grpo", by_std=False)
    # Returns-to-go with gamma 0.5: ep0 [0.5, 1], ep1 [-1], ep2 [0.5, 1, 2].
    s0 = [0.5, -1.0, 0.5]
    a = [1.0, 1.0]
    assert advantages[0][0] == pytest.approx(episode[0][0] + 0.5 * (0.5 - np.mean(s0)))
    assert advantages[0][1] == pytest.approx(episode[0][1] + 0.5 * (1.0 - np.mean(a)))
    assert advantages[1][0] == pytest.approx(episode[1][0] + 0.5 * (-1.0 - np.mean(s0)))
    assert advantages[2][2] == pytest.approx(episode[2][2])  # "b" is a singleton
    # Group 1's "a" is not group 0's "a": anchors only match within a group.
    assert advantages[4][1] == pytest.approx(episode[4][1])


@pytest.mark.parametrize("by_std", [True, False])
def test_gigpo_matches_naive_loop(by_std):
    rng = np.random.default_rng(1)
    trajectories = []
    for _ in range(24):
        n = int(rng.integers(1, 6))
        anchors = [f"s{int(x)}" for x in rng.integers(0, 3, size=n)]  # states repeat often
        trajectories.append(Trajectory(rng.normal(size=n).tolist(), int(rng.integers(3)), anchors))
    gamma, omega = 0.9, 0.7
    got = estimate(trajectories, "gigpo", by_std=by_std, step_gamma=gamma, step_weight=omega)
    returns = [sum(t.rewards) for t in trajectories]
    episode = naive_group(returns, [t.group for t in trajectories], std=by_std)
    rtg = [x for t in trajectories for x in naive_rtg(t.rewards, gamma)]
    keys = [(t.group, a) for t in trajectories for a in t.anchors]
    step = naive_group(rtg, keys, std=by_std)
    pairs = zip(trajectories, episode, strict=True)
    expected = [e + omega * step.pop(0) for t, e in pairs for _ in t.rewards]
    assert np.allclose(np.concatenate(got), expected)


def test_reinforce_normalises_returns_to_go_over_the_batch():
    rtg = np.concatenate([naive_rtg(t.rewards, 0.9) for t in BUFFER])
    got = np.concatenate(estimate(BUFFER, "reinforce", gamma=0.9))
    assert np.allclose(got, (rtg - rtg.mean()) / (rtg.std(ddof=1) + EPS))
    centred = np.concatenate(estimate(BUFFER, "reinforce", gamma=0.9, by_std=False))
    assert np.allclose(centred, rtg - rtg.mean())


def test_returns_to_go_matches_naive_loop():
    rewards = [0.3, -1.0, 2.0, 0.0]
    assert np.allclose(returns_to_go(rewards, 0.8), naive_rtg(rewards, 0.8))


def test_gigpo_needs_one_anchor_per_turn():
    with pytest.raises(ValueError, match="one anchor per turn"):
        estimate([Trajectory([1.0, 2.0], anchors=["x"])], "gigpo")


def test_unknown_estimator():
    with pytest.raises(ValueError, match="Unknown critic-free estimator 'gae'"):
        estimate(BUFFER, "gae")


def test_assign_subtracts_the_kl_penalty_and_sets_returns():
    """Rewards enter as reward - beta * kl; each turn's ``returns`` is its return-to-go."""
    episodes = [
        [Turn([1], [2], reward=1.0, group=0), Turn([1], [2], reward=0.0, terminated=True, group=0)],
        [Turn([1], [2], reward=0.0, terminated=True, group=0)],
    ]
    episodes[0][0].kl = 2.0
    config = PPOConfig(advantage_estimator="rloo", group_size=2, gamma=1.0)
    assign_critic_free(episodes, config, beta=0.25)
    # Episode returns: 1 - 0.5 = 0.5 and 0; RLOO: +0.5 and -0.5.
    assert [t.advantage for t in episodes[0]] == pytest.approx([0.5, 0.5])
    assert episodes[1][0].advantage == pytest.approx(-0.5)
    assert [t.returns for t in episodes[0]] == pytest.approx([0.5, 0.0])


def test_reinforce_uses_the_gathered_batch():
    """Under several processes the batch statistics are those of every process's turns."""
    episodes = [[Turn([1], [2], reward=1.0, terminated=True)]]
    config = PPOConfig(advantage_estimator="reinforce", normalize_by_std=False)
    other_process = np.array([3.0, 5.0])

    def gather(mine):
        return np.concatenate([other_process, mine]), len(other_process)

    assign_critic_free(episodes, config, gather=gather)
    assert episodes[0][0].advantage == pytest.approx(1.0 - 3.0)  # mean of 3, 5, 1


def test_reinforce_gives_no_credit_to_an_episode_the_rollout_cut():
    """A 'hit' just before a rollout boundary is not credited as if its episode had ended."""
    finished = [Turn([1], [2], reward=0.0), Turn([1], [2], reward=1.0, terminated=True)]
    lost = [Turn([1], [2], reward=-1.0, terminated=True)]
    cut = [Turn([1], [2], reward=0.0)]  # the rollout stopped here: no return yet
    config = PPOConfig(advantage_estimator="reinforce", normalize_by_std=False)
    assign_critic_free([finished, lost, cut], config)
    assert [cut[0].advantage, cut[0].returns] == [0.0, 0.0]
    # Normalised over the finished turns only: returns-to-go 1, 1, -1 (mean 1/3).
    assert [t.advantage for t in finished + lost] == pytest.approx([2 / 3, 2 / 3, -4 / 3])
