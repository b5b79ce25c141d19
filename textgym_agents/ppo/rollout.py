"""Batched rollouts: one generation call per step for all envs of a vector env.

Handles Gymnasium's autoreset modes (``NEXT_STEP``: the step after an episode ends only resets
that env, so nothing is generated for it; ``SAME_STEP``: the final observation is in
``info["final_obs"]``) and keeps per-episode statistics.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv

from textgym.episodes import reply_choices, reply_schemas
from textgym_agents.ppo.buffer import RolloutBuffer, Turn

__all__ = ["EpisodeStats", "RolloutCollector", "as_vector_env", "reply_choices", "reply_schemas"]


def as_vector_env(env: gym.Env[Any, Any] | VectorEnv) -> VectorEnv:
    """Return ``env`` if it is a vector env, else a one-env ``SyncVectorEnv`` around it."""
    if isinstance(env, VectorEnv):
        return env
    if isinstance(env, gym.Env):
        return gym.vector.SyncVectorEnv([lambda: env])
    raise TypeError(f"Expected a gymnasium Env or VectorEnv, got {type(env).__name__}")


@dataclass
class EpisodeStats:
    """One finished episode."""

    episode_return: float
    length: int
    invalid: int
    success: bool | None
    stream: int = 0


def _info_at(infos: dict[str, Any], key: str, index: int) -> Any:
    if key in infos and infos.get(f"_{key}", np.ones(index + 1, bool))[index]:
        return infos[key][index]
    return None


class RolloutCollector:
    """Steps a vector env with a policy and records turns into a :class:`RolloutBuffer`."""

    def __init__(self, envs: VectorEnv, seed: int, max_episode_history: int = 10_000) -> None:
        """Create the collector; the envs are reset with ``seed`` on the first rollout."""
        self.envs = envs
        self.seed = seed
        mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        if self.mode == AutoresetMode.DISABLED:
            raise ValueError(
                "Vector envs with autoreset_mode=DISABLED are not supported; use NEXT_STEP "
                "(Gymnasium's default) or SAME_STEP"
            )
        n = envs.num_envs
        self.observations: tuple[Any, ...] | None = None
        self.resetting = np.zeros(n, dtype=bool)  # NEXT_STEP: this env's next step is a reset
        self.returns = np.zeros(n)
        self.lengths = np.zeros(n, dtype=int)
        self.invalid = np.zeros(n, dtype=int)
        # Bounded so a long run's memory stays flat; the trainer drains it every update.
        self.finished: deque[EpisodeStats] = deque(maxlen=max_episode_history)
        # Once an env reports is_success, an episode that ends without it (cut short by
        # invalid replies, say) counts as a failure rather than being left out.
        self.reports_success = False

    def reset(self, seed: int | list[int] | None = None) -> None:
        """Start fresh episodes in every env (``seed``: one int, or one per env)."""
        observations, _ = self.envs.reset(seed=self.seed if seed is None else seed)
        self.observations = tuple(observations)
        self.resetting[:] = False
        self.returns[:] = 0
        self.lengths[:] = 0
        self.invalid[:] = 0

    def collect(self, policy: Any, num_steps: int, buffer: RolloutBuffer) -> None:
        """Run ``num_steps`` env steps that have a model turn, adding each turn to ``buffer``."""
        if self.observations is None:
            self.reset()
        steps = 0
        while steps < num_steps:
            active = [i for i in range(self.envs.num_envs) if not self.resetting[i]]
            # A step in which every env only resets generates nothing and does not count.
            steps += bool(active)
            idle = [""] * self.envs.num_envs  # ignored by envs that are resetting
            _, terminations, truncations = self._play_step(policy, active, idle, buffer)
            if self.mode == AutoresetMode.NEXT_STEP:
                self.resetting = np.logical_or(terminations, truncations)
        for i in range(self.envs.num_envs):
            if not self.resetting[i]:
                buffer.set_bootstrap(i, policy.encode(self.observations[i]))

    def _play_step(
        self, policy: Any, active: list[int], idle_actions: list[Any], buffer: RolloutBuffer
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """One generation call for envs ``active`` and one env step; records their turns.

        Envs not in ``active`` are sent ``idle_actions[i]``. Each turn is added to ``buffer``
        (stream ``i``) and to the episode statistics, after :meth:`_annotate`. Returns the
        replies sent (per env) and the step's terminations and truncations.
        """
        seen = [self.observations[i] for i in active]  # type: ignore[index]
        generation = policy.generate(seen, **self._decoding_kwargs(policy, active))
        actions = list(idle_actions)
        for k, i in enumerate(active):
            actions[i] = generation.texts[k]
        observations, rewards, terminations, truncations, infos = self.envs.step(actions)
        observations = tuple(observations)
        for k, i in enumerate(active):
            own = self._own_infos(infos, bool(terminations[i]) or bool(truncations[i]))
            turn = Turn(
                prompt_ids=generation.prompt_ids[k],
                response_ids=generation.response_ids[k],
                reward=float(rewards[i]),
                terminated=bool(terminations[i]),
                truncated=bool(truncations[i]) and not bool(terminations[i]),
                invalid=bool(_info_at(own, "invalid", i) or False),
                choice_ids=generation.choice_ids[k] if generation.choice_ids else None,
            )
            if getattr(generation, "logps", None) is not None:  # scored by the rollout
                turn.old_logps = torch.tensor([generation.logps[k]])
                if generation.values is not None:  # None: critic-free
                    turn.value = float(generation.values[k])
            if turn.truncated:
                turn.bootstrap_ids = policy.encode(self._final_obs(observations, infos, i))
            self._annotate(turn, i, seen[k])
            buffer.add(i, turn)
            self._track(i, turn, own)
        self.observations = observations
        return actions, terminations, truncations

    def _annotate(self, turn: Turn, i: int, observation: Any) -> None:
        """Add what a subclass records per turn (env ``i`` answered ``observation``)."""

    def _decoding_kwargs(self, policy: Any, active: list[int]) -> dict[str, Any]:
        """The valid replies or reply schemas of envs ``active``, if the policy uses them."""
        kwargs = {}
        choices = self.choices() if getattr(policy, "wants_choices", False) else None
        if choices:
            kwargs["choices"] = [choices[i] for i in active]
        schemas = self.schemas() if getattr(policy, "wants_schemas", False) else None
        if schemas:
            kwargs["schemas"] = [schemas[i] for i in active]
        return kwargs

    def _final_obs(self, observations: tuple[Any, ...], infos: dict[str, Any], i: int) -> Any:
        """Env ``i``'s observation after its episode ended (SAME_STEP: in ``final_obs``)."""
        if self.mode == AutoresetMode.SAME_STEP:
            return _info_at(infos, "final_obs", i)
        return observations[i]

    def _own_infos(self, infos: dict[str, Any], done: bool) -> dict[str, Any]:
        """The infos of this step for an env whose episode ended (``done``) or goes on.

        With SAME_STEP autoreset, an env whose episode just ended has already reset: its
        ``infos`` entry is the new episode's, and the step's own is in ``final_info``.
        """
        if done and self.mode == AutoresetMode.SAME_STEP:
            return infos.get("final_info", infos)
        return infos

    def choices(self) -> list[list[str] | None] | None:
        """Each env's valid replies for choice decoding, in its current state.

        Asked before every generation: with an action mask they change from turn to turn
        (``TextEnvWrapper(action_mask=True)``); the turn keeps the set it was sampled from.
        """
        return reply_choices(self.envs)

    def schemas(self) -> list[dict[str, Any] | None] | None:
        """Each env's reply JSON schema for constrained decoding, in its current state."""
        return reply_schemas(self.envs)

    def _track(self, i: int, turn: Turn, infos: dict[str, Any]) -> None:
        self.returns[i] += turn.reward
        self.lengths[i] += 1
        self.invalid[i] += int(turn.invalid)
        if turn.done:  # infos: this step's own (see _own_infos)
            success = _info_at(infos, "is_success", i)
            self.reports_success |= success is not None
            if success is None and self.reports_success:
                success = False
            self.finished.append(
                EpisodeStats(
                    float(self.returns[i]),
                    int(self.lengths[i]),
                    int(self.invalid[i]),
                    None if success is None else bool(success),
                    stream=i,
                )
            )
            self.returns[i] = 0
            self.lengths[i] = 0
            self.invalid[i] = 0

    def drain(self) -> list[EpisodeStats]:
        """Return and forget the episodes finished since the last call."""
        finished = list(self.finished)
        self.finished.clear()
        return finished
