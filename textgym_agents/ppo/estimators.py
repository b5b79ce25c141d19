"""Critic-free advantage estimators: GRPO, RLOO, GiGPO and REINFORCE with normalised returns.

Each works on whole episodes (:class:`Trajectory`: the turns' rewards, the group the episode
belongs to and the anchor key of each turn's observation) and returns one advantage per turn.
Plain numpy, no model code, so every estimator can be checked against a naive loop
(tests/textgym_agents/ppo/test_estimators.py). docs/estimators.md explains when to use which.

- **GRPO** (Shao et al. 2024): ``A = (R - mean_group(R)) / std_group(R)``, the same for every
  turn of the episode; ``R`` is the undiscounted episode return.
- **RLOO** (Ahmadian et al. 2024): ``A = R - mean of the other G - 1 returns of the group``.
- **GiGPO** (Feng et al. 2025, arXiv 2505.10978): GRPO's episode advantage plus
  ``omega * A_step``; turns of one group whose observations have the same anchor key form a
  step group, and ``A_step`` is the turn's discounted return-to-go minus its step group's mean
  (over the step group's std), 0 for a step group of one.
- **REINFORCE** with batch-normalised returns-to-go (GEM's ReBN): no groups needed.

Standard deviations are the unbiased (``ddof=1``) ones, as ``torch.std`` in TRL's and
verl's GRPO; :data:`EPS` keeps a group whose returns are all equal at advantage 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "EPS",
    "Trajectory",
    "assign_critic_free",
    "estimate",
    "group_relative",
    "normalize",
    "returns_to_go",
    "step_relative",
]

EPS = 1e-6
"""Added to a standard deviation before dividing by it."""


@dataclass
class Trajectory:
    """One finished episode as the estimators see it.

    Attributes:
        rewards: Reward of each turn (env reward, minus the KL penalty when one is on).
        group: Id of the episode's group (episodes of one group started from one seed).
        anchors: Anchor key of the observation each turn answered (GiGPO's step groups);
            empty when not needed.
    """

    rewards: Sequence[float]
    group: int = 0
    anchors: Sequence[Hashable] = field(default_factory=list)


def returns_to_go(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """Discounted return from each turn to the end of the episode.

    Example:
        >>> returns_to_go([0.0, 0.0, 1.0], gamma=0.5).tolist()
        [0.25, 0.5, 1.0]
    """
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def normalize(values: np.ndarray, by_std: bool = True) -> np.ndarray:
    """``values`` minus their mean, over their std (``ddof=1``) when ``by_std``; 0 for one value.

    Example:
        >>> normalize(np.array([1.0, 3.0])).round(4).tolist()
        [-0.7071, 0.7071]
        >>> normalize(np.array([5.0])).tolist()
        [0.0]
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return np.zeros_like(values)
    centred = values - values.mean()
    return centred / (values.std(ddof=1) + EPS) if by_std else centred


def group_relative(
    values: Sequence[float],
    keys: Sequence[Hashable],
    *,
    leave_one_out: bool = False,
    by_std: bool = True,
) -> np.ndarray:
    """Each value relative to the others with the same key (its group).

    Args:
        values: One value per member, shape ``(N,)``.
        keys: The group of each member.
        leave_one_out: RLOO: subtract the mean of the *other* members (never divided by std).
        by_std: Without ``leave_one_out``, divide by the group's std (GRPO) or not.

    Returns:
        Shape ``(N,)``; 0 for a member alone in its group.

    Example:
        >>> group_relative([1.0, 0.0, 5.0], ["a", "a", "b"], by_std=False).tolist()
        [0.5, -0.5, 0.0]
        >>> group_relative([1.0, 0.0, 2.0], [0, 0, 0], leave_one_out=True).tolist()
        [0.0, -1.5, 1.5]
    """
    values = np.asarray(values, dtype=np.float64)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, key in enumerate(keys):
        members[key].append(index)
    out = np.zeros_like(values)
    for indices in members.values():
        group = values[indices]
        n = len(group)
        if n < 2:
            continue
        if leave_one_out:
            out[indices] = group - (group.sum() - group) / (n - 1)
        else:
            out[indices] = normalize(group, by_std)
    return out


def step_relative(
    step_returns: Sequence[float],
    groups: Sequence[int],
    anchors: Sequence[Hashable],
    by_std: bool = True,
) -> np.ndarray:
    """GiGPO's step advantage: each turn's return-to-go against its (group, anchor) step group.

    Example:
        >>> step_relative([1.0, 0.0, 1.0], [0, 0, 1], ["s", "s", "s"], by_std=False).tolist()
        [0.5, -0.5, 0.0]
    """
    keys = list(zip(groups, anchors, strict=True))
    return group_relative(step_returns, keys, by_std=by_std)


def estimate(
    trajectories: Sequence[Trajectory],
    estimator: str,
    *,
    by_std: bool = True,
    step_weight: float = 1.0,
    step_gamma: float = 0.95,
    gamma: float = 1.0,
) -> list[np.ndarray]:
    """Per-turn advantages of each trajectory under ``estimator``.

    Args:
        trajectories: Finished episodes.
        estimator: ``"grpo"``, ``"rloo"``, ``"gigpo"`` or ``"reinforce"``.
        by_std: Divide by the group's (GRPO, GiGPO) or batch's (REINFORCE) std.
        step_weight: GiGPO's omega.
        step_gamma: GiGPO's discount of the step returns.
        gamma: REINFORCE's discount of the returns-to-go.

    Returns:
        One array per trajectory, shape ``(len(rewards),)``.

    Example:
        >>> episodes = [Trajectory([0.0, 1.0], group=0), Trajectory([-1.0], group=0)]
        >>> [a.round(3).tolist() for a in estimate(episodes, "rloo")]
        [[2.0, 2.0], [-2.0]]
    """
    lengths = [len(t.rewards) for t in trajectories]
    if estimator == "reinforce":
        flat = np.concatenate([returns_to_go(t.rewards, gamma) for t in trajectories] or [[]])
        return _split(normalize(flat, by_std), lengths)
    if estimator not in ("grpo", "rloo", "gigpo"):
        raise ValueError(f"Unknown critic-free estimator {estimator!r}")
    episode_returns = [float(np.sum(t.rewards)) for t in trajectories]
    groups = [t.group for t in trajectories]
    episode = group_relative(
        episode_returns, groups, leave_one_out=estimator == "rloo", by_std=by_std
    )
    per_turn = np.repeat(episode, lengths)
    if estimator == "gigpo":
        for t, n in zip(trajectories, lengths, strict=True):
            if len(t.anchors) != n:
                raise ValueError(f"GiGPO needs one anchor per turn, got {len(t.anchors)} for {n}")
        step_returns = np.concatenate([returns_to_go(t.rewards, step_gamma) for t in trajectories])
        step_groups = np.repeat(groups, lengths).tolist()
        anchors = [anchor for t in trajectories for anchor in t.anchors]
        per_turn = per_turn + step_weight * step_relative(
            step_returns, step_groups, anchors, by_std
        )
    return _split(per_turn, lengths)


def _split(flat: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1]) if lengths else []


def assign_critic_free(
    episodes: Sequence[Sequence[Any]],
    config: Any,
    beta: float = 0.0,
    gather: Callable[[np.ndarray], tuple[np.ndarray, int]] | None = None,
) -> None:
    """Set ``advantage`` and ``returns`` of every turn of ``episodes`` by ``config``'s estimator.

    An episode the rollout cut before it ended (its last turn neither terminated nor
    truncated: REINFORCE without groups stops after ``num_steps`` turns) has no return yet, so
    its turns get advantage 0 — no credit either way — and stay out of the batch statistics;
    the next rollout credits the rest of it, whose returns-to-go need only its own turns.

    Args:
        episodes: Episodes, each a list of scored :class:`~textgym_agents.ppo.buffer.Turn`
            (``kl`` set) in time order; the last may be unfinished. A turn's reward is
            ``reward + bonus`` (the novelty bonus, 0 unless ``novelty_bonus`` is set).
        config: The :class:`~textgym_agents.PPOConfig` (``advantage_estimator``,
            ``normalize_by_std``, ``step_advantage_weight``, ``step_gamma``, ``gamma``).
        beta: KL penalty coefficient: a turn's reward is ``reward - beta * kl``.
        gather: For REINFORCE under several processes: returns every process's values
            concatenated and where this process's start, so the batch statistics are global
            (None: this process's batch is the whole batch).
            (Groups never straddle processes, so the group estimators need no gathering.)
    """
    for turns in episodes:
        if turns and not turns[-1].done:  # cut by the rollout: no return to credit yet
            for turn in turns:
                turn.advantage, turn.returns = 0.0, 0.0
    episodes = [turns for turns in episodes if turns and turns[-1].done]
    trajectories = [
        Trajectory(
            rewards=[t.reward + t.bonus - beta * t.kl for t in turns],
            group=turns[0].group,
            anchors=[t.anchor for t in turns],
        )
        for turns in episodes
    ]
    estimator = config.advantage_estimator
    gamma = config.step_gamma if estimator == "gigpo" else config.gamma
    returns = [returns_to_go(t.rewards, gamma) for t in trajectories]
    if estimator == "reinforce":  # normalised over the batch: every process's, if gathered
        mine = np.concatenate(returns or [np.zeros(0)])
        every, start = gather(mine) if gather is not None else (mine, 0)
        flat = normalize(every, config.normalize_by_std)[start : start + len(mine)]
        advantages = _split(flat, [len(t.rewards) for t in trajectories])
    else:
        advantages = estimate(
            trajectories,
            estimator,
            by_std=config.normalize_by_std,
            step_weight=config.step_advantage_weight,
            step_gamma=config.step_gamma,
            gamma=config.gamma,
        )
    for turns, advantage, ret in zip(episodes, advantages, returns, strict=True):
        for turn, a, r in zip(turns, advantage.tolist(), ret.tolist(), strict=True):
            turn.advantage, turn.returns = a, r
