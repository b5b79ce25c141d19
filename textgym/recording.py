"""Record text-env trajectories as a chat dataset, for supervised warm starts before RL.

Each turn is one row in TRL's conversational prompt-completion format: the exact messages the
model saw (``prompt``) and the reply that acted (``completion``), with the episode's return.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from textgym.checker import find_text_wrapper
from textgym.wrappers import TextEnvWrapper

if TYPE_CHECKING:
    from datasets import Dataset, Features

__all__ = ["COLUMNS", "record_trajectories"]

COLUMNS = (
    "prompt",
    "completion",
    "episode",
    "turn",
    "seed",
    "reward",
    "return",
    "action",
    "invalid",
)
"""Columns of a recorded dataset, in order."""


def _datasets() -> tuple[type[Dataset], Features]:
    """Import ``datasets`` (not a core dependency) and return ``Dataset`` and the row schema."""
    try:
        from datasets import Dataset, Features, List, Value
    except ImportError as e:
        raise ImportError(
            "record_trajectories returns a Hugging Face dataset and needs the 'datasets' package "
            f"({e}); install it with: pip install datasets (or pip install 'textgym[agents]')"
        ) from e
    message = {"role": Value("string"), "content": Value("string")}
    features = Features(
        {
            "prompt": List(message),
            "completion": List(message),
            "episode": Value("int64"),
            "turn": Value("int64"),
            "seed": Value("int64"),
            "reward": Value("float64"),
            "return": Value("float64"),
            "action": Value("string"),
            "invalid": Value("bool"),
        }
    )
    return Dataset, features


class _LastObservation(gym.Wrapper[Any, Any, Any, Any]):
    """Keeps the base env's latest observation, for an expert that reads the raw state."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.obs, info = self.env.reset(**kwargs)
        return self.obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        self.obs = result[0]
        return result


@dataclass
class _Slot:
    """One env and the episode it is playing."""

    env: gym.Env[Any, Any]
    text: TextEnvWrapper
    owned: bool
    capture: _LastObservation | None = None
    episode: int | None = None
    seed: int | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: float = 0.0


def record_trajectories(
    env: str | gym.Env[Any, Any],
    expert: Callable[[Any], Any] | Any,
    n_episodes: int,
    *,
    seed: int | None = 0,
    top_fraction: float | None = None,
    num_envs: int = 1,
    greedy: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Dataset:
    """Play ``n_episodes`` episodes of a text env and return every turn as a chat dataset.

    Args:
        env: A text env id (``"textgym/Blackjack-v1"``) or a text env instance.
        expert: Either a function of the base env's raw observation returning an env action
            (a scripted expert; its reply is the env's own example reply for that action,
            ``env.example_reply(action)``), or a policy with ``act(conversations)`` returning
            one reply per conversation (a ``PPOPolicy``; it gets ``choices=`` when its
            ``wants_choices`` is true). Expert replies must be valid; policy replies are kept
            as written, invalid ones included (see the ``invalid`` column).
        n_episodes: Episodes to play.
        seed: Episode ``k`` is reset with ``seed + k`` (None: unseeded).
        top_fraction: Keep only the best ``ceil(top_fraction * n_episodes)`` episodes by
            return (ties: lower episode id first), e.g. ``0.2`` for rejection sampling.
        num_envs: Envs played in lockstep (a policy replies to all of them in one call); an
            env instance is copied from its spec when ``num_envs > 1``.
        greedy: Pass ``greedy=True`` to the policy's ``act`` (policies only).
        env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.

    Returns:
        A ``datasets.Dataset`` with one row per turn, ordered by episode and turn, with the
        columns of :data:`COLUMNS`: ``prompt`` (the messages the model saw), ``completion``
        (``[{"role": "assistant", "content": reply}]``), ``episode``, ``turn``, ``seed``,
        ``reward`` (of the turn), ``return`` (of its episode), ``action`` (the env action as
        JSON, None for an invalid reply) and ``invalid``.

    Raises:
        ImportError: If ``datasets`` is not installed.
        ValueError: If the env cannot write a reply for an expert's action, or rejects it.

    Example:
        >>> import textgym
        >>> ds = record_trajectories("textgym/Blackjack-v1", lambda obs: 0, n_episodes=3)
        >>> ds.column_names
        ['prompt', 'completion', 'episode', 'turn', 'seed', 'reward', 'return', 'action', 'invalid']
        >>> [m["role"] for m in ds[0]["prompt"]], ds[0]["completion"]
        (['system', 'user'], [{'role': 'assistant', 'content': '{"action": "stick"}'}])
        >>> ds["seed"][:], ds["return"][:]
        ([0, 1, 2], [-1.0, 1.0, -1.0])
    """
    dataset_cls, features = _datasets()
    _check_args(n_episodes, seed, top_fraction, num_envs)
    is_policy = hasattr(expert, "act")
    if not is_policy and not callable(expert):
        raise TypeError(
            "Expected expert to be a function of the env observation returning an env action, "
            f"or a policy with act(conversations), got {type(expert).__name__}"
        )
    slots = _make_slots(env, num_envs, env_kwargs)
    try:
        if not is_policy:
            # The text wrapper keeps only the formatted text; a wrapper slipped under it for
            # the recording keeps the raw observation the expert reads.
            for slot in slots:
                slot.capture = _LastObservation(slot.text.env)
                slot.text.env = slot.capture
        rows = _play(slots, expert, is_policy, n_episodes, seed, greedy)
    finally:
        for slot in slots:
            if slot.capture is not None:
                slot.text.env = slot.capture.env
            if slot.owned:
                slot.env.close()
    if top_fraction is not None:
        returns = {row["episode"]: row["return"] for row in rows}
        keep = max(1, math.ceil(top_fraction * n_episodes))
        best = set(sorted(returns, key=lambda e: (-returns[e], e))[:keep])
        rows = [row for row in rows if row["episode"] in best]
    return dataset_cls.from_list(rows, features=features)


def _check_args(
    n_episodes: int, seed: int | None, top_fraction: float | None, num_envs: int
) -> None:
    if not (isinstance(n_episodes, int) and not isinstance(n_episodes, bool) and n_episodes >= 1):
        raise ValueError(f"Expected n_episodes to be an int >= 1, got {n_episodes!r}")
    if not (isinstance(num_envs, int) and not isinstance(num_envs, bool) and num_envs >= 1):
        raise ValueError(f"Expected num_envs to be an int >= 1, got {num_envs!r}")
    if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)):
        raise ValueError(f"Expected seed to be an int or None, got {seed!r}")
    if top_fraction is not None and not (
        isinstance(top_fraction, int | float) and 0 < top_fraction <= 1
    ):
        raise ValueError(f"Expected top_fraction in (0, 1] or None, got {top_fraction!r}")


def _make_slots(
    env: str | gym.Env[Any, Any], num_envs: int, env_kwargs: Mapping[str, Any] | None
) -> list[_Slot]:
    if isinstance(env, str):
        envs = [gym.make(env, **dict(env_kwargs or {})) for _ in range(num_envs)]
        owned = True
    elif isinstance(env, gym.Env):
        if env_kwargs:
            raise ValueError("env_kwargs only apply when env is an env id, not an env instance")
        if num_envs > 1 and env.spec is None:
            raise ValueError("num_envs > 1 copies the env from its spec, but this env has none")
        envs = [env] if num_envs == 1 else [gym.make(env.spec) for _ in range(num_envs)]  # type: ignore[arg-type]
        owned = num_envs > 1
    else:
        raise TypeError(f"Expected a text env or an env id, got {type(env).__name__}")
    try:
        return [_Slot(e, find_text_wrapper(e), owned) for e in envs]
    except ValueError:
        if owned:
            for e in envs:
                e.close()
        raise


def _play(
    slots: list[_Slot],
    expert: Any,
    is_policy: bool,
    n_episodes: int,
    seed: int | None,
    greedy: bool,
) -> list[dict[str, Any]]:
    """Run the episodes (each slot starts the next one when its episode ends); return rows."""
    next_episode = 0
    finished: list[dict[str, Any]] = []

    def start(slot: _Slot) -> None:
        nonlocal next_episode
        slot.episode = None
        if next_episode < n_episodes:
            slot.episode, slot.seed = next_episode, None if seed is None else seed + next_episode
            slot.messages, _ = slot.env.reset(seed=slot.seed)
            slot.rows, slot.total = [], 0.0
            next_episode += 1

    for slot in slots:
        start(slot)
    while active := [slot for slot in slots if slot.episode is not None]:
        if is_policy:
            replies, actions = _policy_replies(expert, active, greedy), None
        else:
            actions = [expert(slot.capture.obs) for slot in active]  # type: ignore[union-attr]
            replies = [
                _example_reply(slot.text, action)
                for slot, action in zip(active, actions, strict=True)
            ]
        for k, (slot, reply) in enumerate(zip(active, replies, strict=True)):
            messages, reward, terminated, truncated, info = slot.env.step(reply)
            if info["invalid"] and not is_policy:
                raise ValueError(
                    f"The env rejected its own example reply {reply!r} for the expert's action "
                    f"{actions[k]!r}: {info['parse_error']}"  # type: ignore[index]
                )
            action = info.get("env_action") if not info["invalid"] else None
            slot.rows.append(
                {
                    "prompt": [dict(m) for m in slot.messages],
                    "completion": [{"role": "assistant", "content": reply}],
                    "episode": slot.episode,
                    "turn": len(slot.rows),
                    "seed": slot.seed,
                    "reward": float(reward),
                    "return": 0.0,  # set when the episode ends
                    "action": None if action is None else json.dumps(_plain(action)),
                    "invalid": bool(info["invalid"]),
                }
            )
            slot.total += float(reward)
            slot.messages = messages
            if terminated or truncated:
                for row in slot.rows:
                    row["return"] = slot.total
                finished.extend(slot.rows)
                start(slot)
    finished.sort(key=lambda row: (row["episode"], row["turn"]))
    return finished


def _example_reply(text: TextEnvWrapper, action: Any) -> str:
    space = text.env.action_space
    if not space.contains(action):
        raise ValueError(
            f"The expert returned {action!r}, which is not in the action space {space}"
        )
    reply = text.example_reply(action)
    if reply is None:
        raise ValueError(
            f"The env's parser ({type(text.parser).__name__}) cannot write a reply for the "
            f"expert's action {action!r}; record with a policy (an object with act()) instead"
        )
    return reply


def _policy_replies(policy: Any, active: list[_Slot], greedy: bool) -> list[str]:
    kwargs: dict[str, Any] = {"greedy": True} if greedy else {}
    if getattr(policy, "wants_choices", False):
        kwargs["choices"] = [slot.text.reply_choices() for slot in active]
    replies = policy.act([slot.messages for slot in active], **kwargs)
    if isinstance(replies, str) or len(replies) != len(active):
        raise ValueError(
            f"Expected the policy's act() to return a list of {len(active)} replies for a batch "
            f"of {len(active)} conversations, got {replies!r:.200}"
        )
    if not all(isinstance(r, str) for r in replies):
        raise TypeError(f"Expected the policy's replies as str, got {replies!r:.200}")
    return list(replies)


def _plain(value: Any) -> Any:
    """An env action as plain JSON-ready Python values (numpy scalars and arrays included)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
