"""Credit every valid reply: the all-choices advantages of ``PPOConfig.all_choices``.

With choice decoding the policy is an explicit distribution over a turn's valid replies, so the
update need not credit only the reply it sampled. :class:`ChoiceReturns` keeps the return-to-go
of each (observation, reply) the run played in its last ``window`` turns; a turn's advantage
for reply ``a`` is ``Q(s, a) - V(s)``: the mean return-to-go after ``a`` from the turn's
observation ``s`` (its anchor key, as GiGPO's) minus the mean return-to-go from ``s``. A reply
not played from ``s`` within the window gets advantage 0. The update then maximises the
clipped surrogate in expectation over the replies
(:func:`~textgym_agents.ppo.core.expected_policy_loss`), whose gradient at the rollout's
weights is ``Σ_a ∇π(a|s) · (Q(s, a) - V(s))`` (Mean Actor-Critic, Asadi et al. 2017,
arXiv:1709.00503). GiGPO's step groups compare the replies sampled from the same
observation within one group and one rollout; this compares them over the whole window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from textgym_agents.ppo.buffer import Turn
from textgym_agents.ppo.estimators import returns_to_go
from textgym_agents.ppo.novelty import as_hashable

__all__ = ["ChoiceReturns"]


class ChoiceReturns:
    """Returns-to-go of (observation, reply) over the last ``window`` turns; sets advantages.

    Example:
        >>> returns = ChoiceReturns(window=100)
        >>> episodes = []
        >>> for reply, reward in [(0, 1.0), (0, 0.0), (1, 0.0)]:  # from "s": a, a, b
        ...     turn = Turn([1], [10 + reply], reward, terminated=True, anchor="s")
        ...     turn.choice_ids = [[10], [11], [12]]
        ...     episodes.append([turn])
        >>> returns.assign(episodes, gamma=1.0, by_std=False)
        >>> [round(a, 4) for a in episodes[0][0].choice_advantages]  # Q - V; c never played
        [0.1667, -0.3333, 0.0]
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"Expected window >= 1, got {window}")
        self.window = window
        self.entries: deque[tuple[Hashable, tuple[int, ...], float]] = deque()
        self._reply_sums: dict[tuple[Hashable, tuple[int, ...]], list[float]] = {}
        self._state_sums: dict[Hashable, list[float]] = {}

    def _add(self, anchor: Hashable, reply: tuple[int, ...], ret: float, sign: int) -> None:
        for table, key in ((self._reply_sums, (anchor, reply)), (self._state_sums, anchor)):
            entry = table.setdefault(key, [0.0, 0])  # type: ignore[arg-type]
            entry[0] += sign * ret
            entry[1] += sign
            if entry[1] == 0:
                del table[key]  # type: ignore[arg-type]

    def record(self, anchor: Hashable, reply: Sequence[int], ret: float) -> None:
        """Keep one return-to-go of ``reply`` from ``anchor``; forget the oldest past the window."""
        entry = (anchor, tuple(reply), float(ret))
        self.entries.append(entry)
        self._add(*entry, sign=1)
        while len(self.entries) > self.window:
            self._add(*self.entries.popleft(), sign=-1)

    def value(self, anchor: Hashable) -> float | None:
        """``V(s)``: the mean return-to-go from ``anchor`` in the window (None if not in it)."""
        state = self._state_sums.get(anchor)
        return None if state is None else state[0] / state[1]

    def record_episodes(
        self, episodes: Sequence[Sequence[Turn]], gamma: float, *, choices_only: bool = False
    ) -> list[Turn]:
        """Record every turn with an anchor of the finished episodes; return the turns recorded.

        A turn's return-to-go is of ``reward + bonus`` with discount ``gamma``; an unfinished
        episode (cut by the rollout) has no return yet and is skipped. With ``choices_only``,
        only turns decoded by choices are recorded.
        """
        recorded = []
        for turns in episodes:
            if not turns or not turns[-1].done:
                continue
            rets = returns_to_go([t.reward + t.bonus for t in turns], gamma)
            for turn, ret in zip(turns, rets.tolist(), strict=True):
                if turn.anchor is not None and (turn.choice_ids is not None or not choices_only):
                    self.record(turn.anchor, turn.response_ids, ret)
                    recorded.append(turn)
        return recorded

    def advantages(self, anchor: Hashable, replies: Sequence[Sequence[int]]) -> list[float]:
        """``Q(s, a) - V(s)`` of each reply from ``anchor`` (0 for replies not in the window)."""
        value = self.value(anchor)
        if value is None:
            return [0.0] * len(replies)
        result = []
        for reply in replies:
            entry = self._reply_sums.get((anchor, tuple(reply)))
            result.append(0.0 if entry is None else entry[0] / entry[1] - value)
        return result

    def assign(self, episodes: Sequence[Sequence[Turn]], gamma: float, by_std: bool) -> None:
        """Record the finished episodes' choice turns, then set their ``choice_advantages``.

        A turn's return-to-go is of ``reward + bonus`` with discount ``gamma``. An unfinished
        episode (cut by the rollout) has no return yet: its turns get no all-choices
        advantages and keep the estimator's. With ``by_std`` every advantage is divided by
        the standard deviation of this rollout's credited advantages (those of turns with any
        nonzero one), so the update's step does not depend on the scale of the rewards.

        Args:
            episodes: The rollout's episodes, each a list of turns in time order.
            gamma: Discount of the returns-to-go.
            by_std: Scale the advantages by their spread over the rollout.
        """
        played = self.record_episodes(episodes, gamma, choices_only=True)
        rows = [self.advantages(turn.anchor, turn.choice_ids or []) for turn in played]
        scale = 1.0
        if by_std:  # the spread of the credited advantages, as PPO whitens its own
            credited = [a for row in rows if any(row) for a in row]
            scale = float(np.std(credited)) if len(credited) > 1 else 0.0
            scale = scale if scale > 1e-8 else 1.0
        for turn, row in zip(played, rows, strict=True):
            turn.choice_advantages = [a / scale for a in row]

    def state(self) -> list[list[Any]]:
        """The window's ``[anchor, reply, return]`` entries, oldest first, for a checkpoint."""
        return [[anchor, list(reply), ret] for anchor, reply, ret in self.entries]

    def load_state(self, entries: Sequence[Sequence[Any]]) -> None:
        """Continue from :meth:`state`."""
        self.entries.clear()
        self._reply_sums.clear()
        self._state_sums.clear()
        for anchor, reply, ret in entries:
            self.record(as_hashable(anchor), reply, ret)
