"""Self-imitation: replay the run's past replies that did better than expected.

At this budget a run samples the rare correct reply of a question form a few times and may
then lose it while other forms move the shared weights (the calculator: three runs in ten lost
the square roots the base model solved). With ``PPOConfig.self_imitation`` = k, every turn of
a finished episode whose return-to-go R beat the value V expected of its prompt when it was
played is kept (the most recent ``self_imitation_capacity``; a poor outcome counts too where
less was expected), and each update draws k of them at random and trains on those whose R
still beats the value expected *now*, beside the rollout's turns, with advantage ``R - V``: a
reply the policy already does that well with gets no push (Self-Imitation Learning, Oh et al.
2018, arXiv 1806.05635). V is the critic's value under GAE; without a critic (the group
estimators) it is the mean return-to-go from the turn's observation (its anchor key, as
GiGPO's) over the run's recent turns
(:meth:`~textgym_agents.ppo.choice_credit.ChoiceReturns.value`), so a reply stops being
replayed once the play from its observation does as well on average. The replayed turns are
scored at the current weights, so their PPO ratio starts at 1 (up to rounding) and the clip
stops pushing a reply once its ratio passes ``1 + clip_range`` in an update.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from textgym_agents.ppo.buffer import Turn
from textgym_agents.ppo.estimators import returns_to_go
from textgym_agents.ppo.novelty import as_hashable

__all__ = ["SCALE_FLOOR", "SelfImitationReplay"]

SCALE_FLOOR = 0.1
"""Least scale (in return units) replayed advantages are divided by: where a batch's advantages
are nearly equal, the scale its whitening divides by nears 0 and would multiply them unbounded."""


@dataclass(frozen=True)
class _Kept:
    prompt_ids: list[int]
    response_ids: list[int]
    choice_ids: list[list[int]] | None
    ret: float
    anchor: Hashable = None


class SelfImitationReplay:
    """The run's turns that returned more than their value; draws turns to replay from them.

    Example:
        >>> replay = SelfImitationReplay(capacity=4)
        >>> won = [Turn([1], [2], 0.0), Turn([1, 2], [3], 1.0, terminated=True)]
        >>> lost = [Turn([1], [4], -1.0, terminated=True)]
        >>> for turn in won + lost:
        ...     turn.value = 0.5
        >>> replay.add([won, lost], gamma=1.0)  # R - V; both turns of the won episode beat 0.5
        [0.5, 0.5, -1.5]
        >>> len(replay)
        2
        >>> [(t.response_ids, t.returns) for t in replay.sample(5, np.random.default_rng(0))]
        [([2], 1.0), ([3], 1.0)]
    """

    def __init__(self, capacity: int) -> None:
        self.kept: deque[_Kept] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.kept)

    def add(
        self,
        episodes: Sequence[Sequence[Turn]],
        gamma: float,
        value_of: Callable[[Turn], float | None] | None = None,
    ) -> list[float]:
        """Keep the turns of the finished (terminated) episodes whose return beat their value.

        Args:
            episodes: The rollout's episodes in time order (``RolloutBuffer.episodes()``).
                Unfinished and truncated episodes are skipped: their return is not known
                without a bootstrap.
            gamma: Discount of the returns-to-go (of ``reward + bonus``, as the estimators').
            value_of: The value expected of a turn (None: unknown, the turn is not kept);
                default its ``value``, the critic's when it was scored.

        Returns:
            ``R - V`` of every turn of those episodes with a value: how much better than
            expected each did (the spread a run without a critic scales replayed advantages by).
        """
        value_of = value_of or (lambda turn: turn.value)
        gaps = []
        for turns in episodes:
            if not turns or not turns[-1].terminated:
                continue
            returns = returns_to_go([t.reward + t.bonus for t in turns], gamma).tolist()
            for turn, ret in zip(turns, returns, strict=True):
                value = value_of(turn)
                if value is None:
                    continue
                gaps.append(ret - value)
                if ret > value:
                    choices = turn.choice_ids and [list(c) for c in turn.choice_ids]
                    kept = _Kept(
                        list(turn.prompt_ids), list(turn.response_ids), choices, ret, turn.anchor
                    )
                    self.kept.append(kept)
        return gaps

    def sample(self, k: int, rng: np.random.Generator) -> list[Turn]:
        """Up to ``k`` distinct kept turns, as fresh unscored turns with ``returns`` = R."""
        if not self.kept or k <= 0:
            return []
        picks = rng.choice(len(self.kept), size=min(k, len(self.kept)), replace=False)
        turns = []
        for i in picks.tolist():
            kept = self.kept[i]
            turn = Turn(list(kept.prompt_ids), list(kept.response_ids), 0.0, terminated=True)
            turn.choice_ids = kept.choice_ids
            turn.returns = kept.ret
            turn.anchor = kept.anchor
            turns.append(turn)
        return turns

    def state(self) -> dict[str, Any]:
        """The kept turns, for a checkpoint (JSON)."""
        return {
            "turns": [
                [k.prompt_ids, k.response_ids, k.choice_ids, k.ret, k.anchor] for k in self.kept
            ]
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (the capacity stays this replay's own)."""
        self.kept.clear()
        for prompt_ids, response_ids, choice_ids, ret, *anchor in state.get("turns", []):
            key = as_hashable(anchor[0]) if anchor else None
            self.kept.append(_Kept(prompt_ids, response_ids, choice_ids, float(ret), key))
