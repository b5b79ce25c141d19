"""Evaluate a policy on a text env: :func:`evaluate_callable` and its :class:`Evaluation` result.

Any :class:`~textgym.policy.Policy` or plain ``messages -> reply`` callable (a function, a
scripted bot, :class:`~textgym.chat_api.ChatCompletionsPolicy`) plays through the episode runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.episodes import Episode, run_episodes
from textgym.policy import Policy, as_policy
from textgym.wrappers import Messages

__all__ = ["Episode", "Evaluation", "evaluate_callable"]


@dataclass(frozen=True, eq=False)
class Evaluation(Mapping[str, Any]):
    """Summary of played episodes: what :func:`evaluate_callable` and ``evaluate`` return.

    As a mapping it is the summary of :meth:`as_dict` (``result["mean_return"]``,
    ``result.get("success_rate")``, ``{**result}``), where ``"episodes"`` is the count.

    Attributes:
        episodes: Every episode, in play order.
        mean_return: Mean episode return.
        std_return: Standard deviation of the returns (population).
        mean_length: Mean replies per episode.
        invalid_rate: Invalid replies per reply, over all episodes.
        success_rate: Share of successful episodes, or None when the env never reports
            ``is_success`` (an episode that ends without the key counts as failed).

    Example:
        >>> result = Evaluation.from_episodes([Episode(0, 1.0, 2, 1, True, False)])
        >>> result["mean_return"], result.invalid_rate, dict(result)["episodes"]
        (1.0, 0.5, 1)
    """

    episodes: list[Episode] = field(repr=False)
    mean_return: float
    std_return: float
    mean_length: float
    invalid_rate: float
    success_rate: float | None

    @classmethod
    def from_episodes(cls, episodes: Iterable[Episode]) -> Evaluation:
        """Summarise ``episodes`` (at least one)."""
        episodes = list(episodes)
        if not episodes:
            raise ValueError("Expected at least one episode to summarise, got none")
        returns = np.array([e.episode_return for e in episodes], dtype=float)
        replies = sum(e.length for e in episodes)
        reported = any(e.success is not None for e in episodes)
        return cls(
            episodes=episodes,
            mean_return=float(returns.mean()),
            std_return=float(returns.std()),
            mean_length=replies / len(episodes),
            invalid_rate=sum(e.invalid for e in episodes) / max(replies, 1),
            success_rate=(
                sum(bool(e.success) for e in episodes) / len(episodes) if reported else None
            ),
        )

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready numbers; ``success_rate`` only where the env reports it."""
        summary: dict[str, Any] = {
            "mean_return": self.mean_return,
            "std_return": self.std_return,
            "mean_length": self.mean_length,
            "invalid_rate": self.invalid_rate,
            "episodes": len(self.episodes),
        }
        if self.success_rate is not None:
            summary["success_rate"] = self.success_rate
        return summary

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __str__(self) -> str:
        n = len(self.episodes)
        text = (
            f"{n} episode{'' if n == 1 else 's'}: return {self.mean_return:+.3f} "
            f"± {self.std_return:.3f}, length {self.mean_length:.2f}, "
            f"invalid replies {self.invalid_rate:.1%}"
        )
        if self.success_rate is not None:
            text += f", success {self.success_rate:.1%}"
        return text


def evaluate_callable(
    policy: Policy | Callable[[Messages], str],
    env: gym.Env[Messages, str],
    n_episodes: int = 10,
    *,
    seed: int = 0,
    max_steps: int = 1000,
    on_episode: Callable[[Episode], None] | None = None,
) -> Evaluation:
    """Play ``n_episodes`` with ``policy`` on a text env and summarise them.

    Each step is ``reply = policy(messages)``; ``env.step(reply)``. The policy sees the same
    prompt a trained model sees; its reply is untrusted text the env parses.

    Args:
        policy: A :class:`~textgym.policy.Policy` or any callable from chat messages to reply
            text (a function, a scripted bot, :class:`~textgym.chat_api.ChatCompletionsPolicy`).
        env: A text env.
        n_episodes: Episodes to play; episode i resets with ``seed + i``.
        seed: Seed of the first episode.
        max_steps: Replies after which an episode without an end is stopped (counted as
            truncated); guards against envs without a time limit.
        on_episode: Called with each finished :class:`Episode` (progress, logging).

    Returns:
        The :class:`Evaluation`.

    Example:
        >>> import textgym
        >>> env = gym.make("textgym/Blackjack-v1")
        >>> result = evaluate_callable(lambda messages: '{"action": "stick"}', env, 4)
        >>> result.mean_return, result.invalid_rate, result.success_rate
        (0.0, 0.0, 0.5)
        >>> print(result)
        4 episodes: return +0.000 ± 1.000, length 1.00, invalid replies 0.0%, success 50.0%
    """
    actor = as_policy(policy)
    episodes = []
    for episode in run_episodes(actor, env, n_episodes, seed=seed, max_steps=max_steps):
        episodes.append(episode)
        if on_episode is not None:
            on_episode(episode)
    return Evaluation.from_episodes(sorted(episodes, key=lambda e: e.index))
