"""The one episode runner: a :class:`~textgym.policy.Policy` plays a text env, batched over envs.

Evaluation and recording play through :func:`run_episodes` and get :class:`Episode` records;
training's rollout collector steps its vector env through the same parts
(:mod:`textgym.vector_steps`: autoreset handling, each env's own info, the episode tally), so a
turn and an episode are read the same way everywhere. :func:`reply_choices` /
:func:`reply_schemas` ask envs what they accept.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, overload

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from textgym.policy import JSONSchema, Policy, as_policy
from textgym.spaces import ChatMessages
from textgym.vector_steps import (
    Episode,
    EpisodeTally,
    Step,
    autoreset_mode,
    game_fields,
    step_envs,
)
from textgym.wrappers import Messages

__all__ = ["Episode", "Step", "reply_choices", "reply_schemas", "run_episodes"]


@overload
def reply_choices(env: VectorEnv) -> list[list[str] | None] | None: ...
@overload
def reply_choices(env: gym.Env[Any, Any]) -> list[str] | None: ...
def reply_choices(env: gym.Env[Any, Any] | VectorEnv) -> Any:
    """The valid replies of a text env (``reply_choices()``), or None when it takes free text.

    For a vector env: each env's list (None for an env without one), or None when no env
    lists any. Only text envs (chat-message observations) are asked: in an ``AsyncVectorEnv``
    a failed ``call`` shuts the workers down.

    Example:
        >>> import textgym
        >>> reply_choices(gym.make("textgym/Blackjack-v1"))
        ['{"action": "stick"}', '{"action": "hit"}']
        >>> reply_choices(gym.make_vec("textgym/Blackjack-v1", num_envs=2))[1]
        ['{"action": "stick"}', '{"action": "hit"}']
    """
    if not isinstance(env, VectorEnv):
        choices = _ask(env, "reply_choices")
        return list(choices) if choices else None
    results = _ask_all(env, "reply_choices")
    if results is None:
        return None
    choices = [list(c) if c else None for c in results]
    return choices if any(c is not None for c in choices) else None


@overload
def reply_schemas(env: VectorEnv) -> list[JSONSchema | None] | None: ...
@overload
def reply_schemas(env: gym.Env[Any, Any]) -> JSONSchema | None: ...
def reply_schemas(env: gym.Env[Any, Any] | VectorEnv) -> Any:
    """The reply JSON schema of a text env (``reply_schema()``), or None when it has none.

    For a vector env: each env's schema, or None when no env has one (only text envs are
    asked, as in :func:`reply_choices`).

    Example:
        >>> import textgym
        >>> reply_schemas(gym.make("textgym/Blackjack-v1"))["properties"]["action"]["enum"]
        ['stick', 'hit']
    """
    if not isinstance(env, VectorEnv):
        return _ask(env, "reply_schema")
    schemas = _ask_all(env, "reply_schema")
    return schemas if schemas is not None and any(s is not None for s in schemas) else None


def _ask(env: gym.Env[Any, Any], method: str) -> Any:
    if not isinstance(env.observation_space, ChatMessages) or not env.has_wrapper_attr(method):
        return None  # not a text env, or one that takes free text only
    return env.get_wrapper_attr(method)()


def _ask_all(envs: VectorEnv, method: str) -> list[Any] | None:
    if not isinstance(getattr(envs, "single_observation_space", None), ChatMessages):
        return None
    # Probe first: an AsyncVectorEnv worker whose env lacks the method raises and shuts down.
    if not all(envs.call("has_wrapper_attr", method)):
        return None  # a chat env that is not a TextEnvWrapper: free text only
    return list(envs.call(method))


def run_episodes(
    policy: Policy | Any,
    env: gym.Env[Any, Any] | Sequence[gym.Env[Any, Any]] | VectorEnv,
    n_episodes: int,
    *,
    seed: int | None = 0,
    greedy: bool = False,
    max_steps: int | None = None,
    record_steps: bool = False,
) -> Iterator[Episode]:
    """Play ``n_episodes`` episodes with ``policy``, one ``act_batch`` call per step for all envs.

    Each env's valid replies (``choices``) and reply schema (``schemas``) go to the policy when
    it wants them (looked up every step: with an action mask they follow the state). Episodes
    are yielded as they end.

    - A single env, or a list of envs played in lockstep: episode ``k`` is reset with
      ``seed + k`` and played by the next free env, so the episodes do not depend on how many
      envs play them.
    - A vector env is used as it is (autoreset ``NEXT_STEP`` or ``SAME_STEP``): it is reset
      once with ``seed`` (env ``i`` gets ``seed + i``) and, as in stable-baselines3's
      ``evaluate_policy``, env ``i`` contributes a fixed share of the episodes, so short
      episodes are not over-counted.

    Args:
        policy: A :class:`~textgym.policy.Policy`, or a callable ``messages -> reply``.
        env: A text env, a list of text envs, or a text vector env.
        n_episodes: Episodes to yield.
        seed: Seed of the first reset (None: unseeded).
        greedy: Passed to the policy's ``act_batch``.
        max_steps: Replies after which an episode is stopped and counted as truncated (single
            envs only; guards against envs without a time limit).
        record_steps: Keep every turn in :attr:`Episode.steps`.

    Yields:
        One :class:`Episode` per finished episode, ``n_episodes`` in all.

    Example:
        >>> import textgym
        >>> envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
        >>> episodes = list(run_episodes(lambda m: '{"action": "stick"}', envs, 4))
        >>> [(e.env_index, e.length, e.invalid) for e in episodes]
        [(0, 1, 0), (1, 1, 0), (0, 1, 0), (1, 1, 0)]
    """
    policy = as_policy(policy)
    for name, value in [("n_episodes", n_episodes), ("max_steps", max_steps)]:
        valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not (valid or (name == "max_steps" and value is None)):
            raise ValueError(f"Expected {name} to be an int >= 1, got {value!r}")
    lanes: _EnvLanes | _VectorLanes
    if isinstance(env, VectorEnv):
        if max_steps is not None:
            raise ValueError("max_steps applies to single envs; give the vector env a time limit")
        lanes = _VectorLanes(env, n_episodes, seed, record_steps)
    else:
        envs = [env] if isinstance(env, gym.Env) else list(env)
        lanes = _EnvLanes(envs, n_episodes, seed, record_steps, max_steps)
    while lanes.running():
        active = lanes.active()
        replies = _replies(policy, lanes, active, greedy) if active else []
        yield from lanes.step(active, replies)


def _replies(policy: Policy, lanes: Any, active: list[int], greedy: bool) -> list[str]:
    kwargs: dict[str, Any] = {}
    if policy.wants_choices and (choices := lanes.choices()) is not None:
        kwargs["choices"] = [choices[i] for i in active]
    if policy.wants_schemas and (schemas := lanes.schemas()) is not None:
        kwargs["schemas"] = [schemas[i] for i in active]
    replies = policy.act_batch([lanes.messages[i] for i in active], greedy=greedy, **kwargs)
    if isinstance(replies, str) or len(replies) != len(active):
        raise ValueError(
            f"Expected the policy's act_batch() to return a list of {len(active)} replies for "
            f"a batch of {len(active)} conversations, got {replies!r:.200}"
        )
    for reply in replies:
        if not isinstance(reply, str):
            raise TypeError(f"The policy must return the reply as str, got {type(reply).__name__}")
    return list(replies)


class _Lanes:
    """What both kinds of lanes keep per env: the episode's totals, seed, number and turns."""

    def __init__(self, n: int, record_steps: bool) -> None:
        self.tally = EpisodeTally(n)
        self.seeds: list[int | None] = [None] * n
        self.indices = [0] * n
        self.record_steps = record_steps
        self.turns: list[list[Step]] = [[] for _ in range(n)]

    def begin(self, i: int, seed: int | None, index: int) -> None:
        self.seeds[i], self.indices[i] = seed, index
        self.turns[i] = []

    def add(self, i: int, messages: Messages, reply: str, reward: float, info: Any) -> None:
        invalid = bool(info("invalid") or False)
        self.tally.add(i, reward, invalid)
        if self.record_steps:
            self.turns[i].append(Step(messages, reply, reward, invalid, info("env_action")))

    def close(self, i: int, info: Any, truncated: bool, index: int) -> Episode:
        steps = tuple(self.turns[i])
        self.turns[i] = []
        episode: Episode = self.tally.close(
            i,
            info("is_success"),
            truncated,
            seed=self.seeds[i],
            index=index,
            steps=steps,
            **game_fields(info),
        )
        return episode


class _EnvLanes:
    """Single envs stepped one by one; each free env starts the next seeded episode."""

    def __init__(
        self,
        envs: list[gym.Env[Any, Any]],
        n_episodes: int,
        seed: int | None,
        record_steps: bool,
        max_steps: int | None,
    ) -> None:
        for env in envs:
            if not isinstance(env, gym.Env):
                raise TypeError(f"Expected a text env or a vector env, got {type(env).__name__}")
        self.envs, self.n_episodes, self.seed = envs, n_episodes, seed
        self.max_steps = max_steps
        self.lanes = _Lanes(len(envs), record_steps)
        self.playing = [False] * len(envs)
        self.messages: list[Messages] = [[] for _ in envs]
        self.started = 0
        for i in range(len(envs)):
            self._start(i)

    def _start(self, i: int) -> None:
        self.playing[i] = self.started < self.n_episodes
        if self.playing[i]:
            seed = None if self.seed is None else self.seed + self.started
            self.messages[i], _ = self.envs[i].reset(seed=seed)
            self.lanes.begin(i, seed, self.started)
            self.started += 1

    def running(self) -> bool:
        return any(self.playing)

    def active(self) -> list[int]:
        return [i for i, playing in enumerate(self.playing) if playing]

    # Asked every step: with an action mask the valid replies change with the state.
    def choices(self) -> list[list[str] | None] | None:
        found = [reply_choices(env) for env in self.envs]
        return found if any(c is not None for c in found) else None

    def schemas(self) -> list[JSONSchema | None] | None:
        found = [reply_schemas(env) for env in self.envs]
        return found if any(s is not None for s in found) else None

    def step(self, active: list[int], replies: list[str]) -> list[Episode]:
        finished = []
        for i, reply in zip(active, replies, strict=True):
            messages, reward, terminated, truncated, info = self.envs[i].step(reply)
            self.lanes.add(i, self.messages[i], reply, float(reward), info.get)
            self.messages[i] = messages
            cut = self.max_steps is not None and int(self.lanes.tally.lengths[i]) >= self.max_steps
            truncated = bool(truncated) or (cut and not terminated)
            if terminated or truncated:
                index = self.lanes.indices[i]
                finished.append(self.lanes.close(i, info.get, truncated, index))
                self._start(i)
        return finished


class _VectorLanes:
    """A vector env with autoreset; env ``i`` contributes its fixed share of the episodes."""

    def __init__(self, envs: VectorEnv, n_episodes: int, seed: int | None, record: bool) -> None:
        self.mode = autoreset_mode(envs)
        n = envs.num_envs
        self.envs = envs
        self.targets = [(n_episodes + i) // n for i in range(n)]
        self.counted = [0] * n
        self.finished = 0
        observations, _ = envs.reset(seed=seed)
        self.messages: list[Messages] = list(observations)
        self.lanes = _Lanes(n, record)
        for i in range(n):
            self.lanes.begin(i, None if seed is None else seed + i, -1)
        self.resetting = np.zeros(n, dtype=bool)  # NEXT_STEP: this env's next step is a reset

    def running(self) -> bool:
        return any(c < t for c, t in zip(self.counted, self.targets, strict=True))

    def active(self) -> list[int]:
        return [i for i in range(self.envs.num_envs) if not self.resetting[i]]

    def choices(self) -> list[list[str] | None] | None:
        return reply_choices(self.envs)  # every step, as the envs' states change

    def schemas(self) -> list[JSONSchema | None] | None:
        return reply_schemas(self.envs)

    def step(self, active: list[int], replies: list[str]) -> list[Episode]:
        step = step_envs(self.envs, self.mode, active, replies)
        finished = []
        for i, reply in zip(active, replies, strict=True):
            info = functools.partial(step.info, i)
            self.lanes.add(i, self.messages[i], reply, float(step.rewards[i]), info)
            if step.done(i):
                episode = self.lanes.close(i, info, step.truncated(i), self.finished)
                if self.counted[i] < self.targets[i]:
                    self.counted[i] += 1
                    finished.append(episode)
                    self.finished += 1
                self.lanes.begin(i, None, -1)  # later episodes continue the env's RNG
        self.resetting = step.next_resetting(self.resetting)
        self.messages = list(step.observations)
        return finished
