"""Per-turn records of a rollout, grouped into per-env streams for turn-level GAE.

A :class:`Turn` is one model reply: what the model saw (prompt ids), what it wrote (response
ids) and what the env paid. Scoring fills in log-probs and values; GAE fills in advantages.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from textgym_agents.ppo import core

__all__ = ["RolloutBuffer", "Turn", "TurnText"]


@dataclass(frozen=True)
class TurnText:
    """A turn as text, kept by the collector for the run's episode samples (``episodes.jsonl``).

    Attributes:
        messages: The chat prompt the model saw (a reference, not a copy).
        reply: The reply text sent to the env (reply prefix included).
        parse_error: Why the env rejected the reply (``info["parse_error"]``), else None.
        index: The turn's number in its episode (0: the first).
    """

    messages: Any
    reply: str
    parse_error: str | None = None
    index: int = 0


@dataclass
class Turn:
    """One model reply and its outcome.

    Attributes:
        prompt_ids: Token ids of the chat prompt the model saw (generation prompt included).
        response_ids: Token ids of the reply (EOS included when the model emitted it).
        reward: Env reward of the step (invalid-reply penalty included).
        terminated: The episode ended in a terminal state after this turn.
        truncated: The episode was cut after this turn (time limit, invalid replies).
        invalid: The env could not parse the reply.
        bootstrap_ids: Prompt ids of the state after this turn when its value is needed for
            bootstrapping: a truncated turn, or the last turn of a stream whose episode is
            still running when the rollout ends.
        choice_ids: With choice decoding, the token ids of every valid reply; the response is
            one of them and the turn has a single log-prob (that of the choice).
        group: With seed-shared groups (``PPOConfig.group_size``), the id of the episode's
            group within the rollout; -1 otherwise.
        anchor: GiGPO's anchor key of the observation this turn answered (None if unused).
        behaviour_logp: With exploration (``PPOConfig.explore_eps``), the log-prob of the
            reply under the mixture it was drawn from; the update weights the turn by
            ``π_old / μ``. None: drawn from the policy itself.
        text: The prompt and reply as text (:class:`TurnText`), when a collector played it.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    terminated: bool = False
    truncated: bool = False
    invalid: bool = False
    bootstrap_ids: list[int] | None = None
    choice_ids: list[list[int]] | None = None
    group: int = -1
    anchor: Hashable = None
    behaviour_logp: float | None = None
    bonus: float = 0.0  # novelty bonus (PPOConfig.novelty_bonus), added to the reward in estimates
    text: TurnText | None = None
    # Filled by scoring (or by the rollout where it computed them): per-token log-probs (T,)
    # under the rollout policy and the reference, the critic's value of the prompt and, for
    # bootstrapped turns, the value of bootstrap_ids.
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    value: float | None = None
    bootstrap_value: float | None = None  # None: not set (0.0 wherever it is read)
    # Choice turns under PPOConfig.all_choices: the log-prob of every choice under the
    # rollout policy, and each choice's advantage (ppo/choice_credit.py).
    old_choice_logps: torch.Tensor | None = None
    choice_advantages: list[float] | None = None
    # Filled by GAE.
    advantage: float = 0.0
    returns: float = 0.0
    kl: float = 0.0

    def __post_init__(self) -> None:
        if not self.response_ids:
            raise ValueError("A turn needs at least one response token")
        if not self.prompt_ids:
            raise ValueError("A turn needs at least one prompt token")

    @property
    def scored_tokens(self) -> int:
        """Log-probs PPO keeps for this turn: one per reply token, or one for a choice."""
        return 1 if self.choice_ids is not None else len(self.response_ids)

    @property
    def done(self) -> bool:
        """The episode ended (either way) after this turn."""
        return self.terminated or self.truncated


@dataclass
class RolloutBuffer:
    """Turns of one rollout, kept per stream (one stream per env) in time order.

    Example:
        >>> buffer = RolloutBuffer()
        >>> buffer.add(0, Turn([1, 2], [3], reward=1.0, terminated=True))
        >>> buffer.add(1, Turn([1, 2], [4, 5], reward=0.0))
        >>> len(buffer), buffer.num_tokens
        (2, 3)
    """

    streams: dict[int, list[Turn]] = field(default_factory=dict)

    def add(self, stream: int, turn: Turn) -> None:
        """Append a turn to a stream."""
        self.streams.setdefault(stream, []).append(turn)

    def set_bootstrap(self, stream: int, prompt_ids: list[int]) -> None:
        """Mark the stream's last turn as unfinished: bootstrap from ``prompt_ids``."""
        turns = self.streams.get(stream)
        if turns and not turns[-1].done:
            turns[-1].bootstrap_ids = list(prompt_ids)

    def turns(self) -> list[Turn]:
        """All turns, stream by stream, each stream in time order."""
        return [turn for stream in sorted(self.streams) for turn in self.streams[stream]]

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.turns())

    def __len__(self) -> int:
        return sum(len(turns) for turns in self.streams.values())

    @property
    def num_tokens(self) -> int:
        """Response tokens in the buffer."""
        return sum(len(t.response_ids) for t in self)

    def clear(self) -> None:
        """Drop every turn (the buffer holds one rollout at a time)."""
        self.streams.clear()

    def episodes(self) -> list[list[Turn]]:
        """The turns cut into episodes, stream by stream; an unfinished tail is one too.

        Example:
            >>> buffer = RolloutBuffer()
            >>> for reward, done in [(0.0, False), (1.0, True), (2.0, False)]:
            ...     buffer.add(0, Turn([1], [2], reward=reward, terminated=done))
            >>> [[t.reward for t in e] for e in buffer.episodes()]
            [[0.0, 1.0], [2.0]]
        """
        episodes: list[list[Turn]] = []
        for stream in sorted(self.streams):
            current: list[Turn] = []
            for turn in self.streams[stream]:
                current.append(turn)
                if turn.done:
                    episodes.append(current)
                    current = []
            if current:
                episodes.append(current)
        return episodes

    def compute_kl(self, kl_estimator: str = "k1") -> None:
        """Set each scored turn's ``kl``: its summed per-token KL to the reference."""
        for turn in self:
            turn.kl = float(core.kl_penalty(turn.old_logps, turn.ref_logps, kl_estimator).sum())

    def compute_advantages(
        self, beta: float, gamma: float, lam: float, kl_estimator: str | None = "k1"
    ) -> None:
        """Turn-level GAE per stream on the env reward minus ``beta`` times the turn's KL.

        Needs scored turns (``old_logps``, ``ref_logps``, ``value``, ``bootstrap_value``; only
        ``value`` and ``bootstrap_value`` with ``kl_estimator=None``, which sets every KL to 0);
        sets each turn's ``kl``, ``advantage`` and ``returns``. Bootstraps from the next turn's
        value, or from ``bootstrap_value`` after a truncation or at the end of an unfinished
        stream.
        """
        if kl_estimator is None:
            for turn in self:
                turn.kl = 0.0
        else:
            self.compute_kl(kl_estimator)
        for turns in self.streams.values():
            rewards = torch.tensor([t.reward + t.bonus - beta * t.kl for t in turns])
            values = torch.tensor([t.value for t in turns])
            next_values = torch.tensor(
                [
                    turns[k + 1].value
                    if k + 1 < len(turns) and not t.done
                    else (t.bootstrap_value or 0.0)  # unset where terminated: never read
                    for k, t in enumerate(turns)
                ]
            )
            terminated = torch.tensor([t.terminated for t in turns])
            truncated = torch.tensor([t.truncated for t in turns])
            advantages, returns = core.compute_gae(
                rewards, values, next_values, terminated, truncated, gamma, lam
            )
            for turn, advantage, ret in zip(
                turns, advantages.tolist(), returns.tolist(), strict=True
            ):
                turn.advantage, turn.returns = advantage, ret
