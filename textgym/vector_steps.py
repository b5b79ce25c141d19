"""One step of a text vector env, and the running totals of each env's episode.

The two drivers that play text vector envs — :func:`textgym.episodes.run_episodes` (evaluation,
recording: a number of episodes) and ``textgym_agents``' rollout collector (training: a number
of steps) — share these parts, so a turn is read the same way in both:

- :func:`autoreset_mode` accepts Gymnasium's ``NEXT_STEP`` (the default: after an episode ends,
  that env's next step only resets it, so it gets no turn) and ``SAME_STEP`` (it resets at
  once; the ended episode's observation and info are in ``final_obs`` / ``final_info``);
- :func:`step_envs` steps the envs that have a turn and returns a :class:`VectorStep` that
  answers, per env, with the step's *own* info and final observation in either mode;
- :class:`EpisodeTally` adds up each env's current episode and closes it into an
  :class:`Episode` (of :class:`Step` turns when they are recorded; both are re-exported by
  :mod:`textgym.episodes`).

Example:
    >>> import gymnasium as gym, textgym
    >>> envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    >>> _ = envs.reset(seed=0)
    >>> tally = EpisodeTally(2)
    >>> step = step_envs(envs, autoreset_mode(envs), [0, 1], ['{"action": "stick"}', "?"])
    >>> for i in (0, 1):
    ...     tally.add(i, float(step.rewards[i]), bool(step.info(i, "invalid")))
    >>> [tally.close(i, None, step.truncated(i)).invalid for i in (0, 1)]
    [0, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from textgym.wrappers import Messages

__all__ = [
    "Episode",
    "EpisodeTally",
    "Step",
    "VectorStep",
    "GAME_INFO_KEYS",
    "autoreset_mode",
    "game_fields",
    "info_at",
    "step_envs",
]


@dataclass(frozen=True)
class Step:
    """One turn of an episode: the prompt, the reply to it and what the env made of it.

    Attributes:
        messages: The prompt the policy saw.
        reply: The reply text sent to the env.
        reward: The text env's reward (an invalid reply's penalty included).
        invalid: Whether the env rejected the reply.
        action: The env action the reply became (None when it was rejected and none was
            taken in its place).
    """

    messages: Messages
    reply: str
    reward: float
    invalid: bool
    action: Any = None


@dataclass(frozen=True)
class Episode:
    """One played episode.

    Attributes:
        seed: The seed of its reset (None: unseeded, or a vector env's later episode, which
            continues its env's random state).
        episode_return: Sum of the text env's rewards (invalid replies count with their penalty).
        length: Replies sent (``env.step`` calls).
        invalid: Replies the text env rejected.
        success: The final step's ``is_success``, or None when the env does not report it.
        truncated: Whether the episode was cut short rather than terminated.
        index: Its number in the run: episode ``k`` of single envs was reset with ``seed + k``;
            a vector env's episodes are numbered as they finish.
        env_index: Which env (of a vector env or a list of envs) played it.
        outcome: A game's result for the agent, the final step's ``info["outcome"]``
            (``"win"``, ``"draw"`` or ``"loss"``; None when the env does not report one).
        opponent: Who the agent played, the final step's ``info["opponent"]`` (a name such as
            ``"random"`` or ``"selfplay:12"``; None when not reported).
        steps: Every turn, when the runner was asked to record them (else empty).
    """

    seed: int | None
    episode_return: float
    length: int
    invalid: int
    success: bool | None
    truncated: bool
    index: int = 0
    env_index: int = 0
    outcome: str | None = None
    opponent: str | None = None
    steps: tuple[Step, ...] = field(default=(), repr=False)


GAME_INFO_KEYS = ("outcome", "opponent")
"""Final-step info keys an :class:`Episode` keeps (multi-player games report them)."""


def game_fields(info: Callable[[str], Any]) -> dict[str, str | None]:
    """The :data:`GAME_INFO_KEYS` of a final step, as str or None, from an info getter.

    Example:
        >>> game_fields({"outcome": "win", "is_success": True}.get)
        {'outcome': 'win', 'opponent': None}
    """
    return {key: None if (v := info(key)) is None else str(v) for key in GAME_INFO_KEYS}


def autoreset_mode(envs: VectorEnv) -> AutoresetMode:
    """The vector env's autoreset mode; ``DISABLED`` is refused (no one would reset the envs).

    Raises:
        ValueError: The envs do not reset themselves.
    """
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    mode = AutoresetMode(mode) if isinstance(mode, str) else mode
    if mode == AutoresetMode.DISABLED:
        raise ValueError(
            "Vector envs with autoreset_mode=DISABLED are not supported; use NEXT_STEP "
            "(Gymnasium's default) or SAME_STEP"
        )
    return mode  # type: ignore[no-any-return]


def info_at(infos: dict[str, Any], key: str, index: int) -> Any:
    """Env ``index``'s value of ``key`` in a vector env's batched infos (None if it has none)."""
    if key in infos and infos.get(f"_{key}", np.ones(index + 1, bool))[index]:
        return _pick(infos[key], index)
    return None


def _pick(value: Any, index: int) -> Any:
    # Vector envs batch a dict-valued info key (a Dict action, say) into a dict of arrays.
    if isinstance(value, dict):
        return {k: _pick(v, index) for k, v in value.items() if not k.startswith("_")}
    return value[index]


@dataclass
class VectorStep:
    """What one ``envs.step`` returned, read per env in either autoreset mode."""

    observations: tuple[Messages, ...]
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]
    mode: AutoresetMode
    actions: list[Any]  # what each env was sent (the replies, and the idle envs' actions)

    def done(self, i: int) -> bool:
        """Whether env ``i``'s episode ended at this step."""
        return bool(self.terminations[i]) or bool(self.truncations[i])

    def truncated(self, i: int) -> bool:
        """Whether it was cut short (truncated and not terminated)."""
        return bool(self.truncations[i]) and not bool(self.terminations[i])

    def own_infos(self, i: int) -> dict[str, Any]:
        """The batched infos holding env ``i``'s own info of this step.

        With ``SAME_STEP``, an env whose episode just ended has already reset: its entry in
        ``infos`` is the new episode's, and this step's own is in ``final_info``.
        """
        if self.done(i) and self.mode == AutoresetMode.SAME_STEP:
            return self.infos.get("final_info", self.infos)  # type: ignore[no-any-return]
        return self.infos

    def info(self, i: int, key: str) -> Any:
        """Env ``i``'s own value of info ``key`` at this step (None if it has none)."""
        return info_at(self.own_infos(i), key, i)

    def final_observation(self, i: int) -> Any:
        """Env ``i``'s observation after this step, before any reset (``final_obs``)."""
        if self.mode == AutoresetMode.SAME_STEP and self.done(i):
            return info_at(self.infos, "final_obs", i)
        return self.observations[i]

    def next_resetting(self, resetting: np.ndarray) -> np.ndarray:
        """Which envs only reset at the next step (``NEXT_STEP``: those that just ended)."""
        if self.mode == AutoresetMode.NEXT_STEP:
            return np.logical_or(self.terminations, self.truncations)
        return resetting


def step_envs(
    envs: VectorEnv,
    mode: AutoresetMode,
    active: Sequence[int],
    replies: Sequence[str],
    idle: Sequence[Any] | None = None,
) -> VectorStep:
    """Send ``replies`` to envs ``active`` (the others get ``idle[i]``, default ``""``); step.

    Envs not in ``active`` are resetting (``NEXT_STEP``) or idle; a text env ignores what it
    is sent while it resets.
    """
    actions = list(idle) if idle is not None else [""] * envs.num_envs
    for i, reply in zip(active, replies, strict=True):
        actions[i] = reply
    observations, rewards, terminations, truncations, infos = envs.step(actions)
    return VectorStep(tuple(observations), rewards, terminations, truncations, infos, mode, actions)


class EpisodeTally:
    """Running return, reply count and invalid replies of each env's current episode.

    With ``missing_success_fails`` (training's statistics), once any env has reported
    ``is_success``, an episode that ends without it (cut short by a time limit or by invalid
    replies) counts as a failure rather than being left out; without it (the episode runner),
    such an episode keeps ``success=None`` and :class:`~textgym.evaluation.Evaluation` counts
    it as failed.

    Attributes:
        returns: Sum of the rewards so far, per env.
        lengths: Replies sent so far, per env.
        invalid: Invalid replies so far, per env.
        reports_success: Whether an env has reported ``is_success``.
    """

    def __init__(self, num_envs: int, *, missing_success_fails: bool = False) -> None:
        """Zero totals for ``num_envs`` envs."""
        self.missing_success_fails = missing_success_fails
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=int)
        self.invalid = np.zeros(num_envs, dtype=int)
        self.reports_success = False

    def add(self, i: int, reward: float, invalid: bool) -> None:
        """Count one reply of env ``i``."""
        self.returns[i] += reward
        self.lengths[i] += 1
        self.invalid[i] += int(invalid)

    def clear(self, i: int | None = None) -> None:
        """Zero env ``i``'s totals (every env's with None)."""
        where = slice(None) if i is None else i
        self.returns[where] = 0
        self.lengths[where] = 0
        self.invalid[where] = 0

    def close(self, i: int, success: Any, truncated: bool, **fields: Any) -> Episode:
        """Env ``i``'s episode as an :class:`~textgym.episodes.Episode`; its totals restart.

        Args:
            i: The env (also the episode's ``env_index``).
            success: The last step's ``is_success`` (None when not reported).
            truncated: Whether the episode was cut short.
            **fields: Further :class:`~textgym.episodes.Episode` fields (seed, index, steps).
        """
        self.reports_success |= success is not None
        if success is None and self.reports_success and self.missing_success_fails:
            success = False
        episode = Episode(
            seed=fields.pop("seed", None),
            episode_return=float(self.returns[i]),
            length=int(self.lengths[i]),
            invalid=int(self.invalid[i]),
            success=None if success is None else bool(success),
            truncated=bool(truncated),
            env_index=i,
            **fields,
        )
        self.clear(i)
        return episode
