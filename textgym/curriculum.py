"""Where training episodes of tabular worlds start: near the goal first, or anywhere.

A cold-start agent on FrozenLake reaches the goal in about one sampled episode in a hundred, so
almost every episode ends with the same return and no advantage estimator sees a difference
between moves. :class:`ReverseCurriculum` starts training episodes a few moves from the goal,
where random moves often succeed, and moves the start back as the agent succeeds, until
episodes start where the env itself starts them (after Florensa et al., "Reverse Curriculum
Generation for Reinforcement Learning", 2017). :class:`ExploringStarts` starts every episode
at a state drawn uniformly from all those that can reach the goal, so the states that need
different moves share every batch from the first update.

It works on Gymnasium's toy-text worlds (FrozenLake, CliffWalking, Taxi): they publish their
whole model as ``env.unwrapped.P`` (``P[s][a]`` lists ``(probability, next state, reward,
terminated)``) and keep their state in ``env.unwrapped.s``, so the distance of every state to
the goal is known and a start state can be set. The goal states are those entered by a
terminating transition with the highest reward among terminating transitions (FrozenLake's
goal pays 1, its holes 0; CliffWalking and Taxi terminate only at their goal).

Use it for training envs only: evaluate on the env's own start states.

    >>> import gymnasium as gym
    >>> env = ReverseCurriculum(gym.make("FrozenLake-v1", is_slippery=False))
    >>> obs, info = env.reset(seed=0)
    >>> obs, info["curriculum_level"], env.distances[obs]  # one move from the goal
    (14, 1, 1)
    >>> env.step(2)[1:3]  # right: the goal
    (1, True)
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from textgym.atomic import atomic_write_json

__all__ = [
    "CurriculumProgress",
    "ExploringStarts",
    "ReverseCurriculum",
    "goal_distances",
    "is_tabular",
]


def is_tabular(env: gym.Env[Any, Any]) -> bool:
    """Whether an env (under any wrappers) publishes its model, as the toy-text worlds do.

    Example:
        >>> is_tabular(gym.make("FrozenLake-v1")), is_tabular(gym.make("CartPole-v1"))
        (True, False)
    """
    return all(hasattr(env.unwrapped, key) for key in ("P", "initial_state_distrib"))


class CurriculumProgress:
    """How far back a :class:`ReverseCurriculum` starts episodes; shareable between env copies.

    Level ``L`` starts episodes uniformly among the states at most ``L`` moves from the goal.
    When ``promote_at`` of the last ``window`` episodes started at the current level reached the
    goal, the level goes up by one; when fewer than ``demote_below`` did, it goes down by one
    (never below 1). Either way the window starts afresh: episodes started at another level do
    not count. Above the largest distance the curriculum is over and episodes start as the env
    starts them.

    The copies of a synchronous vector env (``gym.make_vec(..., reverse_curriculum=progress)``)
    can share one object, so every copy's episodes count towards the same level.

    Args:
        window: Episodes per decision.
        promote_at: Success rate over the window that moves the start back.
        demote_below: Success rate over the window under which the start moves forward again
            (0: never).
        level: The starting level (1: one move from the goal).

    Example:
        >>> progress = CurriculumProgress(window=2, promote_at=0.5)
        >>> progress.record(True, level=1); progress.level
        1
        >>> progress.record(False, level=1); progress.level
        2
    """

    def __init__(
        self, window: int = 16, promote_at: float = 0.5, demote_below: float = 0.0, level: int = 1
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if not 0.0 < promote_at <= 1.0:
            raise ValueError(f"promote_at must be in (0, 1], got {promote_at}")
        if not 0.0 <= demote_below < promote_at:
            raise ValueError(f"demote_below must be in [0, promote_at), got {demote_below}")
        if level < 1:
            raise ValueError(f"level must be at least 1, got {level}")
        self.window = window
        self.promote_at = promote_at
        self.demote_below = demote_below
        self.level = level
        self.outcomes: deque[bool] = deque(maxlen=window)

    def record(self, success: bool, level: int) -> None:
        """Count an episode that started at ``level``; promote when the window is good enough."""
        if level != self.level:
            return
        self.outcomes.append(bool(success))
        if len(self.outcomes) < self.window:
            return
        rate = float(np.mean(self.outcomes))
        if rate >= self.promote_at:
            self.level += 1
            self.outcomes.clear()
        elif rate < self.demote_below and self.level > 1:
            self.level -= 1
            self.outcomes.clear()

    def state_dict(self) -> dict[str, Any]:
        """The level and the current window's outcomes, for a checkpoint."""
        return {"level": self.level, "outcomes": list(self.outcomes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.level = int(state["level"])
        self.outcomes = deque((bool(o) for o in state["outcomes"]), maxlen=self.window)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`state_dict` to ``path`` as JSON, atomically (after every update, say).

        Example:
            >>> import tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "curriculum.json"
            >>> CurriculumProgress(level=3).save(path)
            >>> restored = CurriculumProgress()
            >>> restored.load(path); restored.level
            3
        """
        atomic_write_json(path, self.state_dict())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore the state :meth:`save` wrote (``OSError``/``ValueError`` if unreadable)."""
        try:
            self.load_state_dict(json.loads(Path(path).read_text()))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a curriculum state: {e!r}") from e

    def __repr__(self) -> str:
        return f"CurriculumProgress(level={self.level}, outcomes={list(self.outcomes)})"


def goal_distances(
    transitions: Mapping[int, Mapping[int, Iterable[tuple[float, Any, float, bool]]]],
    initial: np.ndarray,
) -> tuple[dict[int, int], set[int]]:
    """Fewest moves from each reachable state to a goal, over moves with nonzero probability.

    Args:
        transitions: A toy-text env's ``P``.
        initial: Its initial-state distribution.

    Returns:
        ``(distances, goals)``: the distance of every non-terminal state that can be reached
        from a start state and can reach a goal; the goal states.

    Example:
        >>> env = gym.make("FrozenLake-v1", is_slippery=False).unwrapped
        >>> distances, goals = goal_distances(env.P, env.initial_state_distrib)
        >>> goals, distances[0], distances[14], 5 in distances  # 5 is a hole
        ({15}, 6, 1, False)
    """
    ending = [
        (int(s2), float(r))
        for moves in transitions.values()
        for outcomes in moves.values()
        for p, s2, r, done in outcomes
        if done and p > 0
    ]
    if not ending:
        raise ValueError("No transition ends an episode: there is no goal to start near")
    best = max(r for _, r in ending)
    goals = {s2 for s2, r in ending if r == best}
    failures = {s2 for s2, r in ending if r != best} - goals
    successors: dict[int, set[int]] = {}
    for s, moves in transitions.items():
        for outcomes in moves.values():
            for p, s2, *_ in outcomes:
                if p > 0:
                    successors.setdefault(int(s), set()).add(int(s2))
    # Reachable from a start state without passing through a terminal state.
    reachable = {int(s) for s in np.flatnonzero(np.asarray(initial) > 0)}
    frontier = list(reachable)
    while frontier:
        s = frontier.pop()
        if s in goals or s in failures:
            continue
        for s2 in successors.get(s, ()):
            if s2 not in reachable:
                reachable.add(s2)
                frontier.append(s2)
    predecessors: dict[int, set[int]] = {}
    for s, nexts in successors.items():
        if s in reachable and s not in goals and s not in failures:
            for s2 in nexts:
                predecessors.setdefault(s2, set()).add(s)
    distances: dict[int, int] = {}
    frontier, depth = sorted(goals), 0
    seen = set(goals)
    while frontier:
        depth += 1
        step = sorted({s for s2 in frontier for s in predecessors.get(s2, ())} - seen)
        seen.update(step)
        distances.update(dict.fromkeys(step, depth))
        frontier = step
    return distances, goals


def _start_states(env: gym.Env[Any, Any], wrapper: str) -> tuple[dict[int, int], set[int]]:
    """:func:`goal_distances` of a tabular env, or a clear error where it has no model or goal."""
    base = env.unwrapped
    if not is_tabular(env):
        raise TypeError(
            f"{wrapper} needs a tabular toy-text env (P, initial_state_distrib); "
            f"{base!r} lacks them"
        )
    distances, goals = goal_distances(base.P, base.initial_state_distrib)  # type: ignore[attr-defined]
    if not distances:
        raise ValueError(f"No state of {base!r} can reach a goal")
    return distances, goals


def _move_to(env: gym.Env[Any, Any], states: list[int]) -> int:
    """Put the agent on one of ``states``, drawn uniformly with the env's own generator."""
    state = states[int(env.unwrapped.np_random.integers(len(states)))]
    env.unwrapped.s = state  # type: ignore[attr-defined]
    return state


class ReverseCurriculum(gym.Wrapper[Any, Any, Any, Any]):
    """Start episodes near the goal of a tabular world; move the start back as the agent succeeds.

    Each reset resets the env (so its random generator follows the seed), then, while the
    curriculum runs, moves the agent to a state drawn uniformly from those at most
    ``progress.level`` moves from the goal (drawn with the env's generator: a seed gives the
    same start, as groups of same-seed episodes need). Every finished episode is recorded in
    ``progress`` (one cut off from outside, by a time limit, as a failure at the next reset);
    ``info["curriculum_level"]`` says the level an episode started at (0 once the curriculum is
    over and the env's own start is used). Episodes from the env's own start are recorded only
    when ``progress.demote_below`` is set, so that failing there sends the start forward again.

    Args:
        env: A toy-text env (``unwrapped.P``, ``unwrapped.s``, ``unwrapped.initial_state_distrib``).
        progress: The level to follow, shared or not; defaults to a new
            :class:`CurriculumProgress`.

    Example:
        >>> progress = CurriculumProgress(level=7)  # FrozenLake 4x4: at most 6 moves
        >>> env = ReverseCurriculum(gym.make("FrozenLake-v1"), progress)
        >>> env.reset(seed=0)
        (0, {'prob': 1, 'curriculum_level': 0})
    """

    def __init__(self, env: gym.Env[Any, Any], progress: CurriculumProgress | None = None) -> None:
        super().__init__(env)
        self.progress = CurriculumProgress() if progress is None else progress
        self.distances, self.goals = _start_states(env, "ReverseCurriculum")
        self.max_distance = max(self.distances.values())
        self._level = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the env, then move the agent to a start state of the current level."""
        if self._level:  # the last episode was cut off from outside (a time limit): a failure
            self.progress.record(False, self._level)
        obs, info = self.env.reset(seed=seed, options=options)
        level = self.progress.level
        own_start = level > self.max_distance
        # Past the farthest state episodes start where the env starts them; they still count
        # where a failing window can send the start forward again.
        self._level = 0 if own_start and not self.progress.demote_below else level
        if not own_start:
            obs = _move_to(self.env, sorted(s for s, d in self.distances.items() if d <= level))
        return obs, {**info, "curriculum_level": 0 if own_start else level}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; at the end of an episode, record whether it reached the goal."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if (terminated or truncated) and self._level:
            self.progress.record(terminated and int(obs) in self.goals, self._level)
            self._level = 0
        return obs, reward, terminated, truncated, info


class ExploringStarts(gym.Wrapper[Any, Any, Any, Any]):
    """Start every episode at a state drawn uniformly from all states that can reach the goal.

    The "exploring starts" of Monte Carlo control (Sutton and Barto, *Reinforcement Learning*,
    section 5.3): training episodes begin all over the world, the env's own start among them,
    so from the first update some reach the goal (those started near it), and the states that
    need different moves all appear in every batch. Unlike :class:`ReverseCurriculum` nothing
    moves with the agent's success, so a policy cannot first learn one move everywhere from
    starts that all need it. Each reset resets the env (its generator follows the seed), then
    draws the start with the env's generator: a seed gives the same start.

    Use it for training envs only: evaluate on the env's own start states.

    Args:
        env: A toy-text env (``unwrapped.P``, ``unwrapped.s``, ``unwrapped.initial_state_distrib``).

    Example:
        >>> env = ExploringStarts(gym.make("FrozenLake-v1", is_slippery=False))
        >>> sorted({env.reset(seed=seed)[0] for seed in range(200)})  # not the holes or the goal
        [0, 1, 2, 3, 4, 6, 8, 9, 10, 13, 14]
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.starts = sorted(_start_states(env, "ExploringStarts")[0])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the env, then move the agent to a start drawn uniformly from :attr:`starts`."""
        _, info = self.env.reset(seed=seed, options=options)
        return _move_to(self.env, self.starts), info
