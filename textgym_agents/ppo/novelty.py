"""A count-based novelty bonus: reward for reaching observations the run has rarely seen.

Where successes are too rare for any estimator to see (FrozenLake: about one sampled episode in
100 reaches the goal), every episode otherwise has return 0 and carries no signal. With
``PPOConfig.novelty_bonus`` = c, a turn that leads to an observation seen n times so far (by its
anchor key, counted over the run) earns ``c / sqrt(n)`` on top of the env's reward in the
advantage estimate only (metrics, evaluation and the env's returns are untouched). Only the
first arrival at an observation within an episode earns it, so an episode cannot collect
bonuses by going back and forth (its bonus is bounded by the states it reaches), and the last
turn of an episode earns none: an episode that ends in a new state (a hole) is not rewarded
for it. Each process counts its own visits. The bonus fades as counts grow (the form of
MBIE-EB, Strehl & Littman 2008, and #Exploration, Tang et al. 2017).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from textgym_agents.ppo.buffer import Turn

__all__ = ["VisitCounts", "as_hashable"]


class VisitCounts:
    """How often the run has seen each anchor key; sets each turn's novelty ``bonus``.

    Example:
        >>> counts = VisitCounts(coef=1.0)
        >>> episode = [Turn([1], [2], 0.0, anchor=a) for a in "abbc"]
        >>> episode[-1].terminated = True
        >>> counts.assign([episode])  # a, b, b, c seen: b twice
        >>> [round(t.bonus, 4) for t in episode]  # to b (n=2); to b again: 0; to c; ended
        [0.7071, 0.0, 1.0, 0.0]
    """

    def __init__(self, coef: float) -> None:
        self.coef = coef
        self.counts: dict[Hashable, int] = {}

    def assign(self, episodes: Sequence[Sequence[Turn]]) -> None:
        """Count every turn's anchor, then set ``bonus`` of each turn from its successor's count.

        Args:
            episodes: The rollout's episodes in time order (the last of a stream may be
                unfinished; its last turn's successor is not in this rollout, so it earns 0).
        """
        for turns in episodes:
            for turn in turns:
                self.counts[turn.anchor] = self.counts.get(turn.anchor, 0) + 1
        for turns in episodes:
            seen = {turns[0].anchor} if turns else set()
            for turn, following in zip(turns, turns[1:], strict=False):
                new = following.anchor not in seen  # revisits within an episode earn nothing
                turn.bonus = self.coef / math.sqrt(self.counts[following.anchor]) if new else 0.0
                seen.add(following.anchor)
            if turns:
                turns[-1].bonus = 0.0

    def state(self) -> list[list[Any]]:
        """``[anchor, count]`` pairs for a checkpoint (anchors must be JSON: text by default)."""
        return [[anchor, count] for anchor, count in self.counts.items()]

    def load_state(self, pairs: Sequence[Sequence[Any]]) -> None:
        """Continue from :meth:`state` (lists, as JSON returns tuples, become tuples again)."""
        self.counts = {as_hashable(anchor): int(count) for anchor, count in pairs}


def as_hashable(value: Any) -> Hashable:
    """An anchor key read back from JSON: lists (JSON's tuples) become tuples again.

    Example:
        >>> as_hashable(["a", [1, 2]])
        ('a', (1, 2))
    """
    if isinstance(value, list):
        return tuple(as_hashable(v) for v in value)
    return value
