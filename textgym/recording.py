"""Record text-env trajectories as a chat dataset, for supervised warm starts before RL.

Each turn is one row in TRL's conversational prompt-completion format: the exact messages the
model saw (``prompt``) and the reply that acted (``completion``), with the episode's return.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from pydantic import BaseModel

from textgym.checker import find_text_wrapper
from textgym.episodes import Episode, run_episodes
from textgym.policy import JSONSchema, Policy, PolicyBase
from textgym.wrappers import Messages

if TYPE_CHECKING:
    from datasets import Dataset, Features

__all__ = ["COLUMNS", "plain_json", "record_trajectories"]

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
    """Keeps the latest observation of the env it wraps (``obs``)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.obs, info = self.env.reset(**kwargs)
        return self.obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        self.obs = result[0]
        return result


def record_trajectories(
    env: str | gym.Env[Any, Any],
    expert: Callable[[Any], Any] | Policy,
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
            ``env.example_reply(action)``), or a :class:`~textgym.policy.Policy` (a
            ``PPOPolicy``; it gets each env's valid replies and reply schema when it wants
            them). Expert replies must be valid; policy replies are kept as written, invalid
            ones included (see the ``invalid`` column).
        n_episodes: Episodes to play.
        seed: Episode ``k`` is reset with ``seed + k`` (None: unseeded).
        top_fraction: Keep only the best ``ceil(top_fraction * n_episodes)`` episodes by
            return (ties: lower episode id first), e.g. ``0.2`` for rejection sampling.
        num_envs: Envs played in lockstep (a policy replies to all of them in one call); an
            env instance is copied from its spec when ``num_envs > 1``.
        greedy: Passed to the policy's ``act_batch`` (policies only).
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
    if not isinstance(expert, Policy) and not callable(expert):
        raise TypeError(
            "Expected expert to be a function of the env observation returning an env action, "
            f"or a textgym Policy (act_batch), got {type(expert).__name__}"
        )
    envs, owned = _make_envs(env, num_envs, env_kwargs)
    scripted = None if isinstance(expert, Policy) else _ScriptedExpert(expert, envs)
    try:
        policy, played = (expert, envs) if scripted is None else (scripted, scripted.envs)
        run = run_episodes(policy, played, n_episodes, seed=seed, greedy=greedy, record_steps=True)
        episodes = list(run)
    finally:
        if scripted is not None:
            scripted.detach()
        if owned:
            for e in envs:
                e.close()
    episodes.sort(key=lambda e: e.index)
    if top_fraction is not None:
        keep = max(1, math.ceil(top_fraction * n_episodes))
        best = sorted(episodes, key=lambda e: (-e.episode_return, e.index))[:keep]
        episodes = sorted(best, key=lambda e: e.index)
    return dataset_cls.from_list([row for e in episodes for row in _rows(e)], features=features)


def _rows(episode: Episode) -> list[dict[str, Any]]:
    return [
        {
            "prompt": [dict(m) for m in step.messages],
            "completion": [{"role": "assistant", "content": step.reply}],
            "episode": episode.index,
            "turn": turn,
            "seed": episode.seed,
            "reward": step.reward,
            "return": episode.episode_return,
            "action": None if step.action is None else json.dumps(plain_json(step.action)),
            "invalid": step.invalid,
        }
        for turn, step in enumerate(episode.steps)
    ]


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


def _make_envs(
    env: str | gym.Env[Any, Any], num_envs: int, env_kwargs: Mapping[str, Any] | None
) -> tuple[list[gym.Env[Any, Any]], bool]:
    """The envs to play (``num_envs`` of them) and whether they are ours to close."""
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
        for e in envs:
            find_text_wrapper(e)
    except ValueError:
        if owned:
            for e in envs:
                e.close()
        raise
    return envs, owned


class _ScriptedExpert(PolicyBase):
    """A function of the raw env observation as a policy: it replies with the env's own words.

    The text wrapper keeps only the formatted text, so a wrapper slipped under it for the
    recording keeps the raw observation the expert reads (:meth:`detach` removes it again). A
    wrapper on top of each env keeps the prompt it showed last, which tells whose prompt each
    conversation of a batch is: :attr:`envs` are the envs to play.
    """

    def __init__(self, expert: Callable[[Any], Any], envs: Sequence[gym.Env[Any, Any]]) -> None:
        self.expert = expert
        self.texts = [find_text_wrapper(e) for e in envs]
        self.captures = []
        for text in self.texts:
            capture = _LastObservation(text.env)
            text.env = capture
            self.captures.append(capture)
        self.envs = [_LastObservation(e) for e in envs]

    def detach(self) -> None:
        """Take the observation wrappers out of the text wrappers again."""
        for text, capture in zip(self.texts, self.captures, strict=True):
            text.env = capture.env

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[JSONSchema | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """The example reply for the expert's action in each conversation's env."""
        return [self._reply(self._env_of(messages)) for messages in batch]

    def _env_of(self, messages: Messages) -> int:
        for i, env in enumerate(self.envs):
            if env.obs is messages:
                return i
        raise RuntimeError("A conversation that none of the recorded envs showed")

    def _reply(self, i: int) -> str:
        text, action = self.texts[i], self.expert(self.captures[i].obs)
        space = text.env.action_space
        if not space.contains(action):
            raise ValueError(
                f"The expert returned {action!r}, which is not in the action space {space}"
            )
        reply = text.example_reply(action)
        if reply is None:
            raise ValueError(
                f"The env's parser ({type(text.parser).__name__}) cannot write a reply for the "
                f"expert's action {action!r}; record with a policy (an object with act_batch()) "
                "instead"
            )
        _, error = text.parse_reply(reply)
        if error is not None:
            raise ValueError(
                f"The env rejected its own example reply {reply!r} for the expert's action "
                f"{action!r}: {error}"
            )
        return reply


def plain_json(value: Any) -> Any:
    """A value as plain JSON-ready Python (numpy scalars and arrays, tuples, Pydantic models).

    Non-finite floats become strings ("nan", "inf"), which JSON cannot hold.

    Example:
        >>> plain_json({"action": np.int64(1), "pos": (np.float32(0.5), 2), "x": float("inf")})
        {'action': 1, 'pos': [0.5, 2], 'x': 'inf'}
    """
    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
