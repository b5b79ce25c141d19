"""Self-imitation: replay the run's past replies that did better than the critic expected.

At this budget a run samples the rare correct reply of a question form a few times and may
then lose it while other forms move the shared weights (the calculator: three runs in ten lost
the square roots the base model solved). With ``PPOConfig.self_imitation`` = k, every turn of
a finished episode whose return-to-go R beat the critic's value V of its prompt when it was
played is kept (the most recent ``self_imitation_capacity``; a poor outcome counts too where
the critic expected worse), and each update draws k of them at random and trains on those
whose R still beats the critic's value *now*, beside the rollout's turns, with advantage
``R - V``: a reply the policy already expects to do that well gets no push (Self-Imitation
Learning, Oh et al. 2018, arXiv 1806.05635). The replayed turns are scored at the current
weights, so their PPO ratio starts at 1 (up to rounding) and the clip stops pushing a reply
once its ratio passes ``1 + clip_range`` in an update.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from textgym_agents.ppo.buffer import Turn
from textgym_agents.ppo.estimators import returns_to_go

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


class SelfImitationReplay:
    """The run's turns that returned more than their value; draws turns to replay from them.

    Example:
        >>> replay = SelfImitationReplay(capacity=4)
        >>> won = [Turn([1], [2], 0.0), Turn([1, 2], [3], 1.0, terminated=True)]
        >>> lost = [Turn([1], [4], -1.0, terminated=True)]
        >>> for turn in won + lost:
        ...     turn.value = 0.5
        >>> replay.add([won, lost], gamma=1.0)  # both turns of the won episode beat 0.5
        >>> len(replay)
        2
        >>> [(t.response_ids, t.returns) for t in replay.sample(5, np.random.default_rng(0))]
        [([2], 1.0), ([3], 1.0)]
    """

    def __init__(self, capacity: int) -> None:
        self.kept: deque[_Kept] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.kept)

    def add(self, episodes: Sequence[Sequence[Turn]], gamma: float) -> None:
        """Keep the turns of the finished (terminated) episodes whose return beat their value.

        Args:
            episodes: The rollout's episodes in time order (``RolloutBuffer.episodes()``),
                their turns scored (``value`` set). Unfinished and truncated episodes are
                skipped: their return is not known without a bootstrap.
            gamma: Discount of the returns-to-go.
        """
        for turns in episodes:
            if not turns or not turns[-1].terminated:
                continue
            returns = returns_to_go([t.reward for t in turns], gamma).tolist()
            for turn, ret in zip(turns, returns, strict=True):
                if turn.value is not None and ret > turn.value:
                    choices = turn.choice_ids and [list(c) for c in turn.choice_ids]
                    kept = _Kept(list(turn.prompt_ids), list(turn.response_ids), choices, ret)
                    self.kept.append(kept)

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
            turns.append(turn)
        return turns

    def state(self) -> dict[str, Any]:
        """The kept turns, for a checkpoint (JSON)."""
        return {"turns": [[k.prompt_ids, k.response_ids, k.choice_ids, k.ret] for k in self.kept]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (the capacity stays this replay's own)."""
        self.kept.clear()
        for prompt_ids, response_ids, choice_ids, ret in state.get("turns", []):
            self.kept.append(_Kept(prompt_ids, response_ids, choice_ids, float(ret)))
