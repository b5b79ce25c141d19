"""Batched rollouts: one generation call per step for all envs of a vector env.

Steps the envs through :mod:`textgym.vector_steps`, as evaluation and recording do
(Gymnasium's autoreset modes: ``NEXT_STEP``, the step after an episode ends only resets that
env, so nothing is generated for it; ``SAME_STEP``, the final observation is in
``info["final_obs"]``), and keeps the finished episodes as :class:`textgym.episodes.Episode`.
:func:`cap_episode_turns` gives every env of a training run a turn limit, so that an env whose
episodes never end still lets training finish.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv, VectorEnv

from textgym.episodes import Episode, reply_choices, reply_schemas
from textgym.vector_steps import EpisodeTally, autoreset_mode, game_fields, step_envs
from textgym_agents.ppo.buffer import RolloutBuffer, Turn, TurnText

__all__ = [
    "TURN_CAP_INFO",
    "EpisodeTurnCap",
    "RolloutCollector",
    "as_vector_env",
    "cap_episode_turns",
    "read_generation",
    "reply_choices",
    "reply_schemas",
]

logger = logging.getLogger(__name__)

TURN_CAP_INFO = "episode_turn_cap"
"""Info key of the step at which :class:`EpisodeTurnCap` cut an episode (its value: the cap)."""


def read_generation(turn: Turn, generation: Any, row: int) -> Turn:
    """Copy onto ``turn`` what generating its reply (row ``row``) measured, and return it.

    The choices it was drawn from, the log-prob of the mixture that drew it (exploration), its
    log-prob under the choice distribution and the critic's value of its prompt, where the
    generation has them: the update then needs no pass of its own for them.

    Example:
        >>> from types import SimpleNamespace
        >>> turn = read_generation(Turn([1], [2], 0.0), SimpleNamespace(values=[0.5]), 0)
        >>> turn.value, turn.old_logps
        (0.5, None)
    """
    if getattr(generation, "choice_ids", None):
        turn.choice_ids = generation.choice_ids[row]
    if getattr(generation, "behaviour_logps", None) is not None:  # explored
        turn.behaviour_logp = generation.behaviour_logps[row]
    if getattr(generation, "logps", None) is not None:  # scored by the rollout
        turn.old_logps = torch.tensor([generation.logps[row]])
    if getattr(generation, "choice_logps", None) is not None:
        turn.old_choice_logps = generation.choice_logps[row]
    if getattr(generation, "values", None) is not None:  # None: critic-free
        turn.value = float(generation.values[row])
    return turn


def as_vector_env(env: gym.Env[Any, Any] | VectorEnv) -> VectorEnv:
    """Return ``env`` if it is a vector env, else a one-env ``SyncVectorEnv`` around it."""
    if isinstance(env, VectorEnv):
        return env
    if isinstance(env, gym.Env):
        return gym.vector.SyncVectorEnv([lambda: env])
    raise TypeError(f"Expected a gymnasium Env or VectorEnv, got {type(env).__name__}")


class EpisodeTurnCap(gym.Wrapper[Any, Any, Any, Any]):
    """Truncate an episode that is still running after ``max_turns`` steps.

    Gymnasium's ``TimeLimit``, as a safety net that training adds: the step that reaches the
    cap returns ``truncated=True`` (unless the env ended the episode there itself) and
    ``info[TURN_CAP_INFO] = max_turns``; an env's own, shorter limit ends episodes first. The
    env's ``spec`` is passed through unchanged, so the env a run records (and a policy
    remembers) is the env as given.

    Example:
        >>> import textgym
        >>> env = EpisodeTurnCap(gym.make("textgym/Blackjack-v1"), max_turns=1)
        >>> _ = env.reset(seed=0)
        >>> *_, truncated, info = env.step("not an action")  # invalid: the hand goes on
        >>> truncated, info[TURN_CAP_INFO]
        (True, 1)
    """

    def __init__(self, env: gym.Env[Any, Any], max_turns: int) -> None:
        """Wrap ``env``; ``max_turns`` is an int >= 1."""
        if not (isinstance(max_turns, int) and not isinstance(max_turns, bool) and max_turns >= 1):
            raise ValueError(f"Expected max_turns to be an int >= 1, got {max_turns!r}")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0  # steps of the current episode

    @property
    def spec(self) -> Any:
        """The wrapped env's spec (the cap is a training setting, not part of the env)."""
        return self.env.spec

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset the env and the turn count."""
        self.turns = 0
        return self.env.reset(**kwargs)  # type: ignore[no-any-return]

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step the env; truncate the episode if this step reaches the cap."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        if self.turns >= self.max_turns and not (terminated or truncated):
            truncated = True
            info = {**info, TURN_CAP_INFO: self.max_turns}
        return observation, reward, terminated, truncated, info


def cap_episode_turns(envs: VectorEnv, max_turns: int) -> bool:
    """Give every env of ``envs`` an :class:`EpisodeTurnCap` of ``max_turns``; True if done.

    The sub-envs of the :class:`~gymnasium.vector.SyncVectorEnv` under ``envs`` (a single env
    made into one by :func:`as_vector_env`, or ``gym.make_vec``'s default) are wrapped in
    place; a sub-env already capped gets the new cap. An ``AsyncVectorEnv``'s envs live in
    worker processes and cannot be wrapped: a warning says so and False is returned.
    """
    base = envs.unwrapped
    if not isinstance(base, SyncVectorEnv):
        logger.warning(
            "max_episode_turns=%d cannot be applied to the envs of a %s (only a single env or "
            "a SyncVectorEnv); give each env a time limit (gym.make(..., max_episode_steps=N)) "
            "if its episodes may never end",
            max_turns,
            type(base).__name__,
        )
        return False
    for i, env in enumerate(base.envs):
        if isinstance(env, EpisodeTurnCap):
            env.max_turns = max_turns
        else:
            base.envs[i] = EpisodeTurnCap(env, max_turns)
    return True


class RolloutCollector:
    """Steps a vector env with a policy and records turns into a :class:`RolloutBuffer`."""

    def __init__(
        self,
        envs: VectorEnv,
        seed: int,
        max_episode_history: int = 10_000,
        anchor_key: Callable[[Any], Hashable] | None = None,
    ) -> None:
        """Create the collector; the envs are reset with ``seed`` on the first rollout.

        With ``anchor_key``, each turn records the anchor key of the observation it answered
        (GiGPO's step groups, the novelty bonus's counts).
        """
        self.envs = envs
        self.anchor_key = anchor_key
        self.seed = seed
        self.mode = autoreset_mode(envs)
        n = envs.num_envs
        self.observations: tuple[Any, ...] | None = None
        self.resetting = np.zeros(n, dtype=bool)  # NEXT_STEP: this env's next step is a reset
        self.tally = EpisodeTally(n, missing_success_fails=True)  # each env's current episode
        # Bounded so a long run's memory stays flat; the trainer drains it every update.
        self.finished: deque[Episode] = deque(maxlen=max_episode_history)
        self.capped = 0  # episodes cut by EpisodeTurnCap (not ended by the env)

    def reset(self, seed: int | list[int] | None = None) -> None:
        """Start fresh episodes in every env (``seed``: one int, or one per env)."""
        observations, _ = self.envs.reset(seed=self.seed if seed is None else seed)
        self.observations = tuple(observations)
        self.resetting[:] = False
        self.tally.clear()

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
            self._play_step(policy, active, idle, buffer)
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
        step = step_envs(self.envs, self.mode, active, generation.texts, idle_actions)
        for k, i in enumerate(active):
            turn = Turn(
                prompt_ids=generation.prompt_ids[k],
                response_ids=generation.response_ids[k],
                reward=float(step.rewards[i]),
                terminated=bool(step.terminations[i]),
                truncated=step.truncated(i),
                invalid=bool(step.info(i, "invalid") or False),
                # References to what exists anyway: the episode samples of the run files.
                text=TurnText(
                    seen[k],
                    step.actions[i],
                    step.info(i, "parse_error"),
                    int(self.tally.lengths[i]),
                ),
            )
            read_generation(turn, generation, k)
            if turn.truncated:
                turn.bootstrap_ids = policy.encode(step.final_observation(i))
            if self.anchor_key is not None:
                turn.anchor = self.anchor_key(seen[k])
            self._annotate(turn, i, seen[k])
            buffer.add(i, turn)
            self.tally.add(i, turn.reward, turn.invalid)
            if turn.truncated and step.info(i, TURN_CAP_INFO) is not None:
                self._capped(i, int(step.info(i, TURN_CAP_INFO)))
            if turn.done:
                success = step.info(i, "is_success")
                game = game_fields(functools.partial(step.info, i))  # outcome, opponent
                self.finished.append(self.tally.close(i, success, turn.truncated, **game))
        self.observations = step.observations
        self.resetting = step.next_resetting(self.resetting)
        return step.actions, step.terminations, step.truncations

    def _capped(self, i: int, cap: int) -> None:
        """Count an episode cut by the turn cap; warn the first time."""
        self.capped += 1
        if self.capped == 1:
            logger.warning(
                "Env %d played max_episode_turns=%d turns without ending its episode; the "
                "episode was cut there (truncated, its value bootstrapped), as every such "
                "episode will be. Raise max_episode_turns if the env's episodes are meant to "
                "be longer.",
                i,
                cap,
            )

    def _annotate(self, turn: Turn, i: int, observation: Any) -> None:
        """Add what a subclass records per turn (env ``i`` answered ``observation``)."""

    def _decoding_kwargs(self, policy: Any, active: list[int]) -> dict[str, Any]:
        """The valid replies or reply schemas of envs ``active``, if the policy uses them."""
        kwargs = {}
        choices = self.choices() if getattr(policy, "wants_choices", False) else None
        if choices:
            kwargs["choices"] = [choices[i] for i in active]
            explore = getattr(getattr(policy, "config", None), "explore_eps", 0.0)
            if explore:
                kwargs["explore"] = explore
        schemas = self.schemas() if getattr(policy, "wants_schemas", False) else None
        if schemas:
            kwargs["schemas"] = [schemas[i] for i in active]
        return kwargs

    def choices(self) -> list[list[str] | None] | None:
        """Each env's valid replies for choice decoding, in its current state.

        Asked before every generation: with an action mask they change from turn to turn
        (``TextEnvWrapper(action_mask=True)``); the turn keeps the set it was sampled from.
        """
        return reply_choices(self.envs)

    def schemas(self) -> list[dict[str, Any] | None] | None:
        """Each env's reply JSON schema for constrained decoding, in its current state."""
        return reply_schemas(self.envs)

    def drain(self) -> list[Episode]:
        """Return and forget the episodes finished since the last call."""
        finished = list(self.finished)
        self.finished.clear()
        return finished
