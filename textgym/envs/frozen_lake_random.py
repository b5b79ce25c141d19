"""``textgym/FrozenLakeRandom-v0``: FrozenLake on a new random map every episode.

The world of RAGEN's FrozenLake: Gymnasium's ``generate_random_map`` draws a 4 × 4 lake
(each cell frozen with probability ``p``, always with a path from start to goal) on every
reset, and Gymnasium's :class:`~gymnasium.envs.toy_text.frozen_lake.FrozenLakeEnv` plays it,
with a slip probability of your choice instead of Gymnasium's fixed 2/3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from textgym.formatters import Formatter
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "ACTION_NAMES",
    "CELLS",
    "RandomFrozenLakeEnv",
    "RandomFrozenLakeFormatter",
    "draw_lake",
    "make_frozen_lake_random_text_env",
    "system_prompt",
]

CELLS = "SFHG"  # the map's cell codes 0 … 3: start, frozen, hole, goal
ACTION_NAMES = ("left", "down", "right", "up")  # Gymnasium's FrozenLake order
_NOTES = {"H": " You fell into a hole.", "G": " You reached the goal."}


class RandomFrozenLakeEnv(gym.Env[dict[str, Any], int]):
    """FrozenLake whose map is drawn anew on every reset, from ``self.np_random``.

    Observation: a Dict of ``map``, the lake as an ``int8`` grid of :data:`CELLS` codes
    (``0`` start, ``1`` frozen, ``2`` hole, ``3`` goal), and ``position``, the player's cell
    as ``row * size + column`` (Gymnasium's FrozenLake observation). Actions ``Discrete(4)``:
    left, down, right, up. With ``slip_probability`` q the player moves as chosen with
    probability 1 - q and slides to either side of that direction with q / 2 each
    (Gymnasium's ``is_slippery=True`` is q = 2/3); q = 0 is not slippery. Reward 1 on
    reaching the goal; the goal or a hole ends the episode, with ``info["is_success"]``.
    There is no time limit inside: ``gym.make`` adds one.

    Example:
        >>> env = RandomFrozenLakeEnv()
        >>> obs, info = env.reset(seed=0)
        >>> print(draw_lake(obs["map"], int(obs["position"])))
        PFHF
        FFFF
        FFFH
        FFFG
        >>> for a in (1, 1, 1, 2, 2):
        ...     obs, reward, terminated, truncated, info = env.step(a)
        >>> obs, reward, terminated, truncated, info = env.step(2)
        >>> reward, terminated, info["is_success"]
        (1.0, True, True)
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        slip_probability: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        """Create the env.

        Args:
            size: The lake's rows and columns.
            p: Probability that a cell is frozen (Gymnasium's ``generate_random_map``).
            slip_probability: Probability of sliding to one side of the chosen direction
                (half each side); 0 is not slippery, 2/3 is Gymnasium's (and RAGEN's) slippery.
            render_mode: None or ``"ansi"`` (``render()`` returns the drawn map).
        """
        if not (isinstance(size, int) and size >= 2):
            raise ValueError(f"Expected size to be an int >= 2, got {size!r}")
        if not 0 < p <= 1:
            raise ValueError(f"Expected p in (0, 1], got {p!r}")
        if not 0 <= slip_probability <= 1:
            raise ValueError(f"Expected slip_probability in [0, 1], got {slip_probability!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"Expected render_mode to be None or 'ansi', got {render_mode!r}")
        self.size, self.p = size, float(p)
        self.slip_probability = float(slip_probability)
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "map": spaces.Box(0, len(CELLS) - 1, (size, size), np.int8),
                "position": spaces.Discrete(size * size),
            }
        )
        self.action_space = spaces.Discrete(4)
        self.lake: FrozenLakeEnv | None = None
        self._map = np.zeros((size, size), dtype=np.int8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Draw a new map from ``self.np_random`` and start on it."""
        super().reset(seed=seed)
        desc = generate_random_map(self.size, self.p, seed=int(self.np_random.integers(2**31)))
        slippery = self.slip_probability > 0
        self.lake = FrozenLakeEnv(
            desc=desc, is_slippery=slippery, success_rate=1.0 - self.slip_probability
        )
        self.lake.np_random = self.np_random  # one generator: the slips come from this env too
        position, info = self.lake.reset()
        self._map = np.array([[CELLS.index(c) for c in row] for row in desc], dtype=np.int8)
        return self._obs(position), {"prob": float(info["prob"])}

    def step(self, action: int) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Step Gymnasium's FrozenLake on this episode's map."""
        if self.lake is None:
            raise RuntimeError("Call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"Expected an action in {self.action_space}, got {action!r}")
        position, reward, terminated, truncated, info = self.lake.step(int(action))
        info = {"prob": float(info["prob"])}
        if terminated:
            info["is_success"] = float(reward) > 0
        return self._obs(position), float(reward), terminated, truncated, info

    def render(self) -> str | None:
        """Return the drawn map with the player (``render_mode="ansi"``), else None."""
        if self.render_mode != "ansi" or self.lake is None:
            return None
        return draw_lake(self._map, int(self.lake.s))

    def _obs(self, position: Any) -> dict[str, Any]:
        return {"map": self._map.copy(), "position": int(position)}


def draw_lake(cells: np.ndarray, position: int) -> str:
    """The map as text, one row a line, with the player's cell drawn ``P``.

    Example:
        >>> print(draw_lake(np.array([[0, 1], [2, 3]]), 1))
        SP
        HG
    """
    rows = [[CELLS[int(code)] for code in row] for row in cells]
    row, col = divmod(position, len(rows[0]))
    rows[row][col] = "P"
    return "\n".join("".join(line) for line in rows)


class RandomFrozenLakeFormatter(Formatter):
    """The player's coordinates, then this episode's map, as ``textgym/FrozenLake-v1`` shows it.

    Example:
        >>> obs = {"map": np.array([[0, 1, 1], [1, 2, 1], [1, 1, 3]]), "position": 5}
        >>> print(RandomFrozenLakeFormatter()(obs, {}))
        You are at row 1, column 2 (P on the map; rows and columns count from 0).
        SFF
        FHP
        FFG
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Say where the player is and draw the map."""
        cells, position = np.asarray(obs["map"]), int(obs["position"])
        row, col = divmod(position, cells.shape[1])
        note = _NOTES.get(CELLS[int(cells[row, col])], "")
        where = f"You are at row {row}, column {col} (P on the map; rows and columns count from 0)."
        return f"{where}{note}\n{draw_lake(cells, position)}"


def system_prompt(slip_probability: float) -> str:
    """The task prompt, its sentence on slipping made for ``slip_probability``.

    Example:
        >>> system_prompt(0.0).split(". ")[-1]
        'The ice is not slippery: you always move the way you choose.'
        >>> print(system_prompt(2 / 3).split(". ")[-1])
        The ice is slippery: you move the way you choose with probability 0.33 and slide to either side of it otherwise.
    """  # noqa: E501
    if slip_probability > 0:
        slip = (
            f"The ice is slippery: you move the way you choose with probability "
            f"{1 - slip_probability:.2f} and slide to either side of it otherwise."
        )
    else:
        slip = "The ice is not slippery: you always move the way you choose."
    return (
        "You walk on a frozen lake drawn as a grid, a new lake every game: S start, F frozen "
        "ice (safe), H hole (falling in ends the game), G goal, P you. Reach G without falling "
        "into a hole; reaching it earns 1. Actions move you one cell; moving into the edge "
        f"leaves you where you are. {slip}"
    )


def make_frozen_lake_random_text_env(
    *,
    size: int = 4,
    p: float = 0.8,
    slip_probability: float = 0.0,
    render_mode: str | None = None,
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/FrozenLakeRandom-v0``: :class:`RandomFrozenLakeEnv` behind a text wrapper.

    Args:
        size: The lake's rows and columns.
        p: Probability that a cell is frozen.
        slip_probability: Probability of sliding to one side of the chosen direction.
        render_mode: None or ``"ansi"``.
        **wrapper_kwargs: :class:`~textgym.wrappers.TextEnvWrapper` options; ``formatter``
            defaults to :class:`RandomFrozenLakeFormatter`, ``system_prompt`` to
            :func:`system_prompt` and ``action_names`` to :data:`ACTION_NAMES`.

    Example:
        >>> env = make_frozen_lake_random_text_env()
        >>> messages, info = env.reset(seed=1)
        >>> print(messages[-1]["content"])
        You are at row 0, column 0 (P on the map; rows and columns count from 0).
        PFFF
        FHHH
        FFFF
        FFFG
        >>> env.reply_choices()
        ['{"action": "left"}', '{"action": "down"}', '{"action": "right"}', '{"action": "up"}']
    """
    env = RandomFrozenLakeEnv(size, p, slip_probability, render_mode=render_mode)
    wrapper_kwargs.setdefault("formatter", RandomFrozenLakeFormatter())
    wrapper_kwargs.setdefault("system_prompt", system_prompt(slip_probability))
    if wrapper_kwargs.get("parser") is None:
        wrapper_kwargs.setdefault("action_names", ACTION_NAMES)
    return TextEnvWrapper(env, **wrapper_kwargs)
