"""Evaluate a policy on a text env: :func:`evaluate` and its :class:`Evaluation` result.

Any :class:`~textgym.policy.Policy` (a trained model, an API model) or plain
``messages -> reply`` callable (a function, a scripted bot) plays through the episode runner.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from textgym.env_records import prompt_difference
from textgym.episodes import Episode, run_episodes
from textgym.policy import CallablePolicy, Policy, as_policy
from textgym.wrappers import Messages

__all__ = ["Episode", "Evaluation", "evaluate", "warn_if_prompt_differs"]


@dataclass(frozen=True, eq=False)
class Evaluation(Mapping[str, Any]):
    """Summary of played episodes: what :func:`evaluate` returns.

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


def evaluate(
    policy: Policy | Callable[[Messages], str],
    env: gym.Env[Any, Any] | VectorEnv,
    n_episodes: int = 100,
    *,
    greedy: bool = True,
    seed: int = 0,
    num_envs: int = 16,
    max_steps: int | None = 1000,
    on_episode: Callable[[Episode], None] | None = None,
) -> Evaluation:
    """Play ``n_episodes`` episodes with ``policy`` on a text env and summarise them.

    The one evaluator, for every kind of policy: a trained ``textgym_agents.PPOPolicy``, an
    ``Agent``, an API model (:class:`~textgym.chat_api.ChatCompletionsPolicy`), a scripted bot
    or any callable ``messages -> reply``. The policy sees the prompt a trained model sees; its
    reply is untrusted text the env parses.

    A single env is the env played: episode ``k`` resets with ``seed + k``, and to batch the
    policy's calls the episodes are shared between it and up to ``num_envs - 1`` copies made
    from its spec (``gym.make(env.spec)``), so the episodes and the result do not depend on
    ``num_envs``; a plain callable (one reply per call) plays them one after another on the
    env passed, as the plain ``env.step`` loop does. An env that cannot be copied (a wrapper
    whose arguments its spec does not record) plays every episode itself, with a warning. A
    vector env is used as it is (reset once with ``seed``; env ``i`` contributes a fixed share
    of the episodes, as in stable-baselines3's ``evaluate_policy``). A policy that records the
    env it was trained on (``trained_env``) gets a warning when this env prompts otherwise.

    Args:
        policy: A :class:`~textgym.policy.Policy` or a callable ``messages -> reply``.
        env: A text env or text vector env.
        n_episodes: Episodes to play.
        greedy: Ask the policy for its most likely reply (else a sampled one).
        seed: Seed of the first episode.
        num_envs: Most episodes of a single env played at once.
        max_steps: Replies after which an episode of a single env is stopped (counted as
            truncated); guards against envs without a time limit. Vector envs need a time
            limit of their own.
        on_episode: Called with each finished :class:`Episode` (progress, logging).

    Returns:
        The :class:`Evaluation`, episodes in the order of their seeds.

    Example:
        >>> import textgym
        >>> env = gym.make("textgym/Blackjack-v1")
        >>> result = evaluate(lambda messages: '{"action": "stick"}', env, 4)
        >>> result.mean_return, result.invalid_rate, result.success_rate
        (0.0, 0.0, 0.5)
        >>> print(result)
        4 episodes: return +0.000 ± 1.000, length 1.00, invalid replies 0.0%, success 50.0%
        >>> evaluate(lambda m: '{"action": "stick"}', env, 4, num_envs=1).episodes == (
        ...     result.episodes)  # the same episodes, however many play at once
        True
    """
    if not (isinstance(n_episodes, int) and not isinstance(n_episodes, bool) and n_episodes >= 1):
        raise ValueError(f"Expected n_episodes to be an int >= 1, got {n_episodes!r}")
    if not (isinstance(num_envs, int) and not isinstance(num_envs, bool) and num_envs >= 1):
        raise ValueError(f"Expected num_envs to be an int >= 1, got {num_envs!r}")
    warn_if_prompt_differs(policy, env, stacklevel=3)
    actor = as_policy(policy)
    vector = isinstance(env, VectorEnv)
    # A plain callable answers one conversation per call: copies would only reorder its calls.
    batched = not isinstance(actor, CallablePolicy)
    lanes = env if vector else _lanes(env, min(num_envs, n_episodes) if batched else 1)
    episodes = []
    try:
        steps = None if vector else max_steps
        for episode in run_episodes(actor, lanes, n_episodes, seed=seed, greedy=greedy,
                                    max_steps=steps):  # fmt: skip
            episodes.append(episode)
            if on_episode is not None:
                on_episode(episode)
    finally:
        if not vector:
            for copy in lanes[1:]:
                copy.close()
    order = (lambda e: (e.env_index, e.index)) if vector else (lambda e: e.index)
    return Evaluation.from_episodes(sorted(episodes, key=order))


def _lanes(env: gym.Env[Any, Any], count: int) -> list[gym.Env[Any, Any]]:
    """``env`` and ``count - 1`` copies made from its spec (just ``env`` if it has none)."""
    lanes = [env]
    spec = getattr(env, "spec", None)
    if count <= 1 or spec is None:
        return lanes
    try:
        for _ in range(count - 1):
            lanes.append(gym.make(spec))
    except Exception as error:  # noqa: BLE001 - any failure: play on the env passed alone
        for copy in lanes[1:]:
            copy.close()
        warnings.warn(
            f"Could not copy the env from its spec to play {count} episodes at once "
            f"({type(error).__name__}: {error}); the env passed plays them one at a time",
            UserWarning,
            stacklevel=3,
        )
        return [env]
    return lanes


def warn_if_prompt_differs(policy: Any, env: Any, stacklevel: int = 2) -> str | None:
    """Warn when ``env`` prompts otherwise than the env ``policy`` was trained on.

    A policy tuned under one system prompt (or one set of action instructions) can fail under
    another: the calculator policy that solved 67.5% with its training prompt solved 0% under
    the registered default. Uses the policy's ``trained_env`` record (kept by training and
    ``save()``); silent for policies without one.

    Returns:
        The warning's text, or None when nothing differs (or nothing is known).
    """
    record = getattr(policy, "trained_env", None)
    if not isinstance(record, Mapping):
        return None
    difference = prompt_difference(record, env)
    if difference is None:
        return None
    spec = getattr(env, "spec", None)
    message = (
        f"The evaluation env ({spec.id if spec is not None else 'no id'}) is not the one this "
        f"policy was trained on ({record.get('id')}): {difference}. Evaluate on the training env "
        "(`textgym eval RUN` rebuilds it; in Python textgym.env_records.make_recorded_env("
        "policy.trained_env)) unless the change is what you are testing"
    )
    warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return message
