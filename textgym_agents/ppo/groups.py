"""Seed-shared groups: rollouts of whole rounds in which the G envs of a group share a seed.

GRPO, RLOO and GiGPO compare episodes that started from the *same* state. Any Gymnasium env
gives that through ``reset(seed=...)``, with no env copying, so :class:`GroupRolloutCollector`
plays *rounds*: it resets every env, those of group ``g`` with one fresh seed, and steps until
every env's episode has ended. An env whose episode has ended idles (it gets no model call)
until the round is over; the vector env still steps it, with its last reply, on a throwaway
episode that the next round's reset discards and that nothing records. A rollout is whole
rounds (at least ``num_steps`` steps with a model call), so every episode it holds is complete
and no group is ever split across updates, checkpoints or processes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from textgym_agents.ppo.buffer import RolloutBuffer, Turn
from textgym_agents.ppo.rollout import RolloutCollector

__all__ = ["GroupRolloutCollector", "default_anchor", "group_seeds"]

AnchorKey = Callable[[Any], Hashable]


def default_anchor(observation: Any) -> Hashable:
    """GiGPO's anchor key: the text of the current observation, without the history window.

    For a text env's chat messages that is the last message's content (the formatter's
    output for the current state); anything else is keyed by its ``repr``.

    Example:
        >>> default_anchor([{"role": "system", "content": "Rules"},
        ...                 {"role": "user", "content": "Your hand totals 20."}])
        'Your hand totals 20.'
    """
    if isinstance(observation, list | tuple) and observation and isinstance(observation[-1], dict):
        return str(observation[-1].get("content", ""))
    return repr(observation)


def group_seeds(seed: int, round_index: int, num_envs: int, group_size: int) -> list[int]:
    """One reset seed per env for a round: equal within a group, fresh per group and round.

    Example:
        >>> seeds = group_seeds(0, 0, num_envs=4, group_size=2)
        >>> seeds[0] == seeds[1], seeds[1] == seeds[2]
        (True, False)
        >>> seeds == group_seeds(0, 0, 4, 2), seeds == group_seeds(0, 1, 4, 2)
        (True, False)
    """
    seeds = []
    for group in range(num_envs // group_size):
        state = np.random.SeedSequence([seed, round_index, group]).generate_state(1)
        seeds += [int(state[0])] * group_size
    return seeds


class GroupRolloutCollector(RolloutCollector):
    """A :class:`RolloutCollector` that plays seed-shared rounds (see the module docstring).

    Each :class:`Turn` records its ``group`` (unique within the rollout) and the ``anchor``
    key of the observation it answered.
    """

    def __init__(
        self,
        envs: VectorEnv,
        seed: int,
        group_size: int,
        anchor_key: AnchorKey | None = None,
        max_episode_history: int = 10_000,
    ) -> None:
        """Create the collector.

        Args:
            envs: The vector env; ``num_envs`` must be a multiple of ``group_size``.
            seed: Base of the per-round, per-group seeds (:func:`group_seeds`).
            group_size: G, envs per group.
            anchor_key: Maps an observation to GiGPO's anchor key (default:
                :func:`default_anchor`); override it for envs whose text hides state.
            max_episode_history: As for :class:`RolloutCollector`.
        """
        if envs.num_envs % group_size:
            raise ValueError(
                f"num_envs ({envs.num_envs}) must be a multiple of group_size ({group_size}): "
                f"use {group_size * max(1, round(envs.num_envs / group_size))} envs or a "
                f"group_size that divides {envs.num_envs}"
            )
        super().__init__(envs, seed, max_episode_history, anchor_key or default_anchor)
        self.group_size = group_size
        self.rounds = 0  # rounds played; the next round's seeds follow from it
        self._groups: list[int] = []  # each env's group id in the current round

    def reset(self, seed: int | list[int] | None = None) -> None:
        """Start the next round (an int ``seed``: the base seed from now on)."""
        if isinstance(seed, int):
            self.seed = seed
        super().reset(group_seeds(self.seed, self.rounds, self.envs.num_envs, self.group_size))

    def collect(self, policy: Any, num_steps: int, buffer: RolloutBuffer) -> None:
        """Play whole rounds until at least ``num_steps`` steps had a model call."""
        steps = 0
        while steps < num_steps:
            steps += self._round(policy, buffer)

    def _round(self, policy: Any, buffer: RolloutBuffer) -> int:
        self.reset()
        n = self.envs.num_envs
        first = self.rounds * (n // self.group_size)  # group ids unique in the rollout
        self._groups = [first + i // self.group_size for i in range(n)]
        self.rounds += 1
        ended = np.zeros(n, dtype=bool)
        last_action = [""] * n
        steps = 0
        while not ended.all():
            active = np.flatnonzero(~ended).tolist()
            steps += 1
            # Idle envs replay their last reply (see the module docstring), or a reply valid in
            # their throwaway episode's state when it lists them (an action mask may forbid
            # the last one there, and an env with on_invalid="raise" would stop the rollout).
            if ended.any() and (choices := self.choices()) is not None:
                for i in np.flatnonzero(ended):
                    valid = choices[i]
                    if valid and last_action[i] not in valid:
                        last_action[i] = valid[0]
            sent, terminations, truncations = self._play_step(policy, active, last_action, buffer)
            for i in active:
                last_action[i] = sent[i]
            ended |= np.logical_or(terminations, truncations)
        return steps

    def _annotate(self, turn: Turn, i: int, observation: Any) -> None:
        turn.group = self._groups[i]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the rounds played (no round is ever in flight then)."""
        return {"rounds": self.rounds, "seed": self.seed}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue after :meth:`state`: the next round gets the seeds it would have had."""
        self.rounds = int(state["rounds"])
        self.seed = int(state["seed"])
