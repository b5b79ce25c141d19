"""Hand-written formatters, action names and task prompts for Gymnasium's classic envs.

Each :class:`TextPreset` holds what ``textgym/<Env>`` registers: the base env id, a formatter
a person would find clear, named actions and a system prompt describing the task.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, SupportsFloat

import gymnasium as gym

from textgym.formatters import Formatter

__all__ = [
    "PRESETS",
    "AcrobotFormatter",
    "BlackjackFormatter",
    "CartPoleFormatter",
    "CliffWalkingFormatter",
    "FrozenLakeFormatter",
    "FrozenLakeSurroundingsFormatter",
    "MountainCarFormatter",
    "PendulumFormatter",
    "TaxiFormatter",
    "TextPreset",
]


class BlackjackFormatter(Formatter):
    """Blackjack's ``(player_sum, dealer_card, usable_ace)`` in words.

    Example:
        >>> BlackjackFormatter()((15, 1, 1), {})
        'Your hand totals 15, counting an ace as 11. The dealer shows an ace.'
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe the player's total, the usable ace and the dealer's card."""
        total, dealer, usable_ace = (int(v) for v in obs)
        ace = ", counting an ace as 11" if usable_ace else ""
        card = "an ace" if dealer == 1 else f"a {dealer}"
        return f"Your hand totals {total}{ace}. The dealer shows {card}."


class _GridFormatter(Formatter):
    """Shared by the grid worlds: the agent's coordinates, then the map with its cell as ``P``."""

    NOTES: dict[str, str] = {"G": " You reached the goal."}  # said when standing on a cell

    def __init__(self) -> None:
        self.rows: list[str] = []

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Draw the map with the agent's position."""
        row, col = divmod(int(obs), len(self.rows[0]))
        where = f"You are at row {row}, column {col} (P on the map; rows and columns count from 0)."
        lines = [list(line) for line in self.rows]
        lines[row][col] = "P"
        drawn = "\n".join("".join(line) for line in lines)
        return f"{where}{self.NOTES.get(self.rows[row][col], '')}\n{drawn}"


class FrozenLakeFormatter(_GridFormatter):
    """FrozenLake's state index as a drawn map (any map size) and the agent's coordinates.

    Example:
        >>> import gymnasium as gym
        >>> fmt = FrozenLakeFormatter()
        >>> fmt.bind(gym.make("FrozenLake-v1"))
        >>> print(fmt(6, {}))
        You are at row 1, column 2 (P on the map; rows and columns count from 0).
        SFFF
        FHPH
        FFFH
        HFFG
    """

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Read the lake's map."""
        desc = env.unwrapped.desc  # type: ignore[attr-defined]
        self.rows = [b"".join(row).decode() for row in desc]

    NOTES = {"H": " You fell into a hole.", "G": " You reached the goal."}


class FrozenLakeSurroundingsFormatter(FrozenLakeFormatter):
    """FrozenLake's map, plus in words where the goal is and where each move leads.

    The plain map leaves a small model to find its own cell in a grid of letters; this one also
    says what each move reaches (in the action order left, down, right, up), so a rule such as
    "head for the goal, never step into a hole" is a matter of words next to the move's name.
    Pass it as the ``formatter`` of ``textgym/FrozenLake-v1``.

    Example:
        >>> import gymnasium as gym
        >>> fmt = FrozenLakeSurroundingsFormatter()
        >>> fmt.bind(gym.make("FrozenLake-v1"))
        >>> where, words, *drawn = fmt(6, {}).splitlines()
        >>> for sentence in words.split(". "):
        ...     print(sentence)
        The goal is 2 rows down and 1 column right
        Left is a hole, down is ice, right is a hole, up is ice.
        >>> drawn
        ['SFFF', 'FHPH', 'FFFH', 'HFFG']
    """

    WORDS = {"F": "ice", "S": "ice (the start)", "H": "a hole", "G": "the goal"}
    MOVES = (("Left", 0, -1), ("down", 1, 0), ("right", 0, 1), ("up", -1, 0))

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """The map with the agent, the goal's direction and what each move reaches."""
        where, drawn = super().format(obs, info).split("\n", 1)
        row, col = divmod(int(obs), len(self.rows[0]))
        goal = divmod("".join(self.rows).index("G"), len(self.rows[0]))
        if (row, col) == goal:
            return f"{where}\n{drawn}"
        rows, cols = goal[0] - row, goal[1] - col
        parts = [_steps(rows, "row", "down", "up"), _steps(cols, "column", "right", "left")]
        heading = "The goal is " + " and ".join(p for p in parts if p) + "."
        around = []
        for name, dr, dc in self.MOVES:
            r, c = row + dr, col + dc
            inside = 0 <= r < len(self.rows) and 0 <= c < len(self.rows[0])
            what = self.WORDS[self.rows[r][c]] if inside else "the edge (you stay)"
            around.append(f"{name} is {what}")
        return f"{where}\n{heading} {', '.join(around)}.\n{drawn}"


def _steps(n: int, unit: str, forward: str, back: str) -> str:
    """``2 rows down``, ``1 column left``; empty for 0."""
    if n == 0:
        return ""
    return f"{abs(n)} {unit}{'s' if abs(n) != 1 else ''} {forward if n > 0 else back}"


class CliffWalkingFormatter(_GridFormatter):
    """CliffWalking's state index as a drawn 4 × 12 grid.

    Example:
        >>> import gymnasium as gym
        >>> fmt = CliffWalkingFormatter()
        >>> fmt.bind(gym.make("CliffWalking-v1"))
        >>> print(fmt(36, {}))
        You are at row 3, column 0 (P on the map; rows and columns count from 0).
        ............
        ............
        ............
        PCCCCCCCCCCG
    """

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Read the grid's shape and the cliff cells."""
        n_rows, n_cols = env.unwrapped.shape  # type: ignore[attr-defined]
        cliff = env.unwrapped._cliff  # type: ignore[attr-defined]
        self.rows = [
            "".join("C" if cliff[r, c] else "." for c in range(n_cols)) for r in range(n_rows)
        ]
        self.rows[-1] = self.rows[-1][:-1] + "G"


class TaxiFormatter(Formatter):
    """Taxi's encoded state as the taxi's position, the passenger and the destination.

    Example:
        >>> import gymnasium as gym
        >>> fmt = TaxiFormatter()
        >>> fmt.bind(gym.make("Taxi-v4"))
        >>> print(fmt(328, {}))
        The taxi is at row 3, column 1 (T on the map).
        The passenger waits at Y (row 4, column 0) and wants to go to R (row 0, column 0).
        +---------+
        |R: | : :G|
        | : | : : |
        | : : : : |
        | |T: | : |
        |Y| : |B: |
        +---------+
    """

    _NAMES = "RGYB"

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.locs: list[tuple[int, int]] = []

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Read the map and the four stands."""
        raw = env.unwrapped
        self.rows = [b"".join(row).decode() for row in raw.desc]  # type: ignore[attr-defined]
        self.locs = [tuple(int(v) for v in loc) for loc in raw.locs]  # type: ignore[attr-defined]

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe the taxi, the passenger and the destination, and draw the map."""
        # Taxi encodes ((row * 5 + col) * 5 + passenger) * 4 + destination.
        rest, destination = divmod(int(obs), 4)
        rest, passenger = divmod(rest, 5)
        taxi_row, taxi_col = divmod(rest, 5)
        lines = [list(line) for line in self.rows]
        lines[1 + taxi_row][1 + 2 * taxi_col] = "T"
        goal = self._stand(destination)
        if passenger == 4:
            who = f"The passenger is in the taxi and wants to go to {goal}."
        else:
            who = f"The passenger waits at {self._stand(passenger)} and wants to go to {goal}."
        drawn = "\n".join("".join(line) for line in lines)
        return f"The taxi is at row {taxi_row}, column {taxi_col} (T on the map).\n{who}\n{drawn}"

    def _stand(self, index: int) -> str:
        row, col = self.locs[index]
        return f"{self._NAMES[index]} (row {row}, column {col})"


class CartPoleFormatter(Formatter):
    """CartPole's four numbers with their meaning and limits.

    Example:
        >>> import numpy as np
        >>> print(CartPoleFormatter()(np.array([0.0137, -0.0230, -0.0459, -0.0483]), {}))
        Cart position: 0.014 (the episode ends beyond ±2.4)
        Cart velocity: -0.023
        Pole angle: -2.6 degrees (the episode ends beyond ±12; positive leans right)
        Pole angular velocity: -0.048
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe the cart and the pole."""
        x, x_dot, theta, theta_dot = (float(v) for v in obs)
        return "\n".join(
            [
                f"Cart position: {_num(x)} (the episode ends beyond ±2.4)",
                f"Cart velocity: {_num(x_dot)}",
                f"Pole angle: {_num(math.degrees(theta), 1)} degrees "
                "(the episode ends beyond ±12; positive leans right)",
                f"Pole angular velocity: {_num(theta_dot)}",
            ]
        )


class MountainCarFormatter(Formatter):
    """MountainCar's position and velocity, with the goal.

    Example:
        >>> import numpy as np
        >>> print(MountainCarFormatter()(np.array([-0.5234, 0.0012]), {}))
        Car position: -0.523 (the goal is at 0.5; the valley bottom is near -0.52)
        Car velocity: 0.001 (positive moves right)
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe the car."""
        position, velocity = (float(v) for v in obs)
        return (
            f"Car position: {_num(position)} "
            "(the goal is at 0.5; the valley bottom is near -0.52)\n"
            f"Car velocity: {_num(velocity)} (positive moves right)"
        )


class AcrobotFormatter(Formatter):
    """Acrobot's cosines and sines as joint angles in degrees, plus the tip's height.

    Example:
        >>> import numpy as np
        >>> print(AcrobotFormatter()(np.array([1.0, 0.0, 1.0, 0.0, 0.1, -0.2]), {}))
        First link angle: 0.0 degrees (0 hangs straight down)
        Second link angle, relative to the first: 0.0 degrees
        Angular velocities: 0.1 and -0.2 rad/s
        Tip height: -2.0 (swing it above 1.0)
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe both links and the tip height."""
        cos1, sin1, cos2, sin2, omega1, omega2 = (float(v) for v in obs)
        theta1, theta2 = math.atan2(sin1, cos1), math.atan2(sin2, cos2)
        deg1, deg2 = _num(math.degrees(theta1), 1), _num(math.degrees(theta2), 1)
        height = -math.cos(theta1) - math.cos(theta1 + theta2)
        return "\n".join(
            [
                f"First link angle: {deg1} degrees (0 hangs straight down)",
                f"Second link angle, relative to the first: {deg2} degrees",
                f"Angular velocities: {_num(omega1)} and {_num(omega2)} rad/s",
                f"Tip height: {_num(height, 2)} (swing it above 1.0)",
            ]
        )


class PendulumFormatter(Formatter):
    """Pendulum's cosine, sine and angular velocity as an angle from upright.

    Example:
        >>> import numpy as np
        >>> print(PendulumFormatter()(np.array([0.0, 1.0, -0.5]), {}))
        Angle from upright: 90.0 degrees (positive is counter-clockwise)
        Angular velocity: -0.5 rad/s
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe the pendulum."""
        cos, sin, omega = (float(v) for v in obs)
        angle = math.degrees(math.atan2(sin, cos))
        return (
            f"Angle from upright: {_num(angle, 1)} degrees (positive is counter-clockwise)\n"
            f"Angular velocity: {_num(omega)} rad/s"
        )


def _num(value: float, decimals: int = 3) -> str:
    return repr(round(float(value), decimals) + 0.0)


class ReportSuccess(gym.Wrapper[Any, Any, Any, Any]):
    """Add ``info["is_success"]`` at the end of each episode, as stable-baselines3 reads it.

    ``rule="terminated"``: an episode succeeds when it terminates (CliffWalking, Taxi,
    MountainCar and Acrobot terminate only at their goal); ``rule="paid"``: when it terminates
    with a positive reward (FrozenLake's goal, a won Blackjack hand). A truncated episode fails;
    a ``TimeLimit`` outside this wrapper (``gym.make``'s ``max_episode_steps``) truncates without
    the key, which ``textgym_agents.evaluate`` counts as a failure.

    Example:
        >>> env = ReportSuccess(gym.make("FrozenLake-v1", is_slippery=False), "paid")
        >>> _ = env.reset(seed=0)
        >>> [env.step(a)[4].get("is_success") for a in (2, 2, 1, 1, 1, 2)]
        [None, None, None, None, None, True]
    """

    RULES = ("terminated", "paid")

    def __init__(self, env: gym.Env[Any, Any], rule: str) -> None:
        if rule not in self.RULES:
            raise ValueError(f"Expected rule to be one of {self.RULES}, got {rule!r}")
        super().__init__(env)
        self.rule = rule

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; on the last step of an episode, say whether it succeeded."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            paid = float(reward) > 0 or self.rule == "terminated"
            info = {**info, "is_success": bool(terminated and paid)}
        return obs, reward, terminated, truncated, info


@dataclass(frozen=True)
class TextPreset:
    """What a registered ``textgym/<Env>`` id wraps and how.

    ``options`` are :class:`~textgym.wrappers.TextEnvWrapper` options; ``success`` is the
    :class:`ReportSuccess` rule for envs with a goal (None: no success rate);
    ``max_episode_steps`` a turn limit for base envs registered without one (None: the base
    env's own).
    """

    env_id: str
    formatter: type[Formatter]
    system_prompt: str
    options: dict[str, Any] = field(default_factory=dict)
    success: str | None = None
    max_episode_steps: int | None = None


_GRID_ACTIONS = "Actions move you one cell; moving into the edge leaves you where you are."

PRESETS: dict[str, TextPreset] = {
    "Blackjack-v1": TextPreset(
        "Blackjack-v1",
        BlackjackFormatter,
        "You are playing blackjack against the dealer. Finish with a hand total closer to 21 "
        "than the dealer's without going over 21. 'hit' takes another card; 'stick' ends your "
        "turn. Face cards count 10 and an ace counts 1 or 11.",
        {"action_names": ("stick", "hit")},
        success="paid",
    ),
    "FrozenLake-v1": TextPreset(
        "FrozenLake-v1",
        FrozenLakeFormatter,
        "You walk on a frozen lake drawn as a grid: S start, F frozen ice (safe), H hole "
        "(falling in ends the game), G goal, P you. Reach G without falling into a hole; the "
        f"ice may be slippery. {_GRID_ACTIONS}",
        {"action_names": ("left", "down", "right", "up")},
        success="paid",
    ),
    "FrozenLake8x8-v1": TextPreset(
        "FrozenLake8x8-v1",
        FrozenLakeFormatter,
        "You walk on a frozen lake drawn as a grid: S start, F frozen ice (safe), H hole "
        "(falling in ends the game), G goal, P you. Reach G without falling into a hole; the "
        f"ice may be slippery. {_GRID_ACTIONS}",
        {"action_names": ("left", "down", "right", "up")},
        success="paid",
    ),
    "CliffWalking-v1": TextPreset(
        "CliffWalking-v1",
        CliffWalkingFormatter,
        "You walk on a grid from the bottom-left corner to the goal G at the bottom right. "
        "Cells marked C are a cliff: stepping on one costs -100 and sends you back to the "
        f"start. Every step costs -1, so take a short, safe path. {_GRID_ACTIONS}",
        {"action_names": ("up", "right", "down", "left")},
        success="terminated",
        # Gymnasium's CliffWalking has no time limit: a policy that never reaches the goal
        # (a cold-start greedy one walking into the edge) would play one episode forever.
        max_episode_steps=100,
    ),
    "Taxi-v4": TextPreset(
        "Taxi-v4",
        TaxiFormatter,
        "You drive a taxi on a 5 × 5 grid drawn with walls ('|' blocks east-west moves). Pick "
        "up the passenger at their stand and drop them off at the destination stand. Every "
        "move costs -1, a delivery earns +20 and an illegal pickup or dropoff costs -10.",
        {"action_names": ("south", "north", "east", "west", "pickup", "dropoff")},
        success="terminated",
    ),
    "CartPole-v1": TextPreset(
        "CartPole-v1",
        CartPoleFormatter,
        "You balance a pole on a cart by pushing the cart left or right. You earn +1 for every "
        "step the pole stays up; the episode ends when the pole leans past 12 degrees or the "
        "cart leaves the track. Push toward the side the pole is falling to.",
        {"action_names": ("left", "right")},
    ),
    "MountainCar-v0": TextPreset(
        "MountainCar-v0",
        MountainCarFormatter,
        "You drive an underpowered car in a valley and must reach the flag on the right hill "
        "at position 0.5. The engine is too weak to climb directly: rock back and forth to "
        "build momentum. Every step costs -1.",
        {"action_names": ("left", "none", "right")},
        success="terminated",
    ),
    "Acrobot-v1": TextPreset(
        "Acrobot-v1",
        AcrobotFormatter,
        "You control the joint between the two links of a hanging pendulum (the acrobot). "
        "Apply a negative, zero or positive torque to swing the tip above the height 1.0. "
        "Every step costs -1 until you succeed.",
        {"action_names": ("negative", "none", "positive")},
        success="terminated",
    ),
    "Pendulum-v1": TextPreset(
        "Pendulum-v1",
        PendulumFormatter,
        "You swing up an inverted pendulum and keep it upright by applying torque to its "
        "pivot. The reward is highest when the pendulum is upright, still, and you use little "
        "torque.",
        {"action_field": "torque", "action_description": "Torque on the pivot, in N·m"},
    ),
}
