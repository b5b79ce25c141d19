"""BabyAI-Text: MiniGrid/BabyAI levels as text envs, described in GLAM's BabyAI-Text style.

The formatter reads only the observation (no ``minigrid`` import); ``minigrid`` itself is
imported when a level is made, and is installed by ``pip install "textgym[minigrid]"``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from textgym.envs.classic import ReportSuccess
from textgym.extras import require
from textgym.formatters import Formatter
from textgym.wrappers import WRAPPER_OPTIONS, TextEnvWrapper

__all__ = [
    "ACTION_NAMES",
    "BABYAI_LEVELS",
    "FirstActions",
    "LastActions",
    "MiniGridFormatter",
    "describe_view",
    "make_babyai_text_env",
    "relative_position",
    "system_prompt",
]

logger = logging.getLogger(__name__)

# MiniGrid's actions in index order (minigrid.core.actions.Actions).
ACTION_NAMES = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
# textgym/<name> -> where the level comes from: a minigrid id, or a class of minigrid_levels.
BABYAI_LEVELS: dict[str, str] = {
    "BabyAI-GoToRedBall-v0": "BabyAI-GoToRedBall-v0",
    "BabyAI-GoToLocal-v0": "BabyAI-GoToLocal-v0",
    "BabyAI-PickupLocal-v0": "textgym.envs.minigrid_levels:PickupLocal",
    "BabyAI-PutNextLocal-v0": "BabyAI-PutNextLocal-v0",
    "BabyAI-OpenDoor-v0": "BabyAI-OpenDoor-v0",
}

# minigrid.core.constants, as plain tables so that formatting needs no minigrid import.
_OBJECTS = ("unseen", "empty", "wall", "floor", "door", "key", "ball", "box", "goal", "lava")
_COLORS = ("red", "green", "blue", "purple", "yellow", "grey")
_DOOR_STATES = ("open", "closed", "locked")
_CARRIABLE = frozenset({"key", "ball", "box"})


def relative_position(lateral: int, forward: int) -> str:
    """Say where a cell is in steps from the agent: sideways first, then forward.

    Args:
        lateral: Steps to the right (negative: to the left).
        forward: Steps ahead.

    Example:
        >>> relative_position(-1, 3)
        '1 step left and 3 steps forward'
        >>> relative_position(2, 0), relative_position(0, 1)
        ('2 steps right', '1 step forward')
    """
    parts = []
    if lateral:
        side = "left" if lateral < 0 else "right"
        parts.append(f"{_steps(abs(lateral))} {side}")
    if forward:
        parts.append(f"{_steps(forward)} forward")
    return " and ".join(parts)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _noun(type_idx: int, color_idx: int, state: int) -> str | None:
    """The object's name with its article, or None for cells that are not objects."""
    kind = _OBJECTS[type_idx] if type_idx < len(_OBJECTS) else None
    color = _COLORS[color_idx] if color_idx < len(_COLORS) else "unknown"
    if kind in _CARRIABLE:
        return f"a {color} {kind}"
    if kind == "door":
        door_state = _DOOR_STATES[state] if state < len(_DOOR_STATES) else "closed"
        article = "an" if door_state == "open" else "a"
        return f"{article} {door_state} {color} door"
    if kind == "goal":
        return "the goal"
    if kind == "lava":
        return "lava"
    return None  # unseen, empty, floor, wall (walls are described along the three lines)


def describe_view(image: np.ndarray) -> list[str]:
    """Sentences for MiniGrid's egocentric view: the nearest walls, then each object.

    ``image[x, y]`` holds ``(type, colour, state)``; the agent stands at the middle of the
    bottom row (``x = width // 2``, ``y = height - 1``) looking toward ``y = 0``. The walls
    named are the nearest seen wall straight ahead, straight left and straight right; then
    each visible key, ball, box, door, goal and lava cell, nearest first (fewest steps in all;
    ties from left to right, then nearer ahead first). The agent's own cell (what it carries)
    is not described here.

    Example:
        >>> import numpy as np
        >>> image = np.zeros((7, 7, 3), dtype=np.uint8)
        >>> image[:, :] = (1, 0, 0)  # empty floor everywhere
        >>> image[:, 4] = (2, 5, 0)  # a wall across the view, 2 steps ahead
        >>> image[2, 5] = (6, 0, 0)  # a red ball one step left and one forward
        >>> describe_view(image)
        ['You see a wall 2 steps forward.', 'You see a red ball 1 step left and 1 step forward.']
    """
    width, height = image.shape[0], image.shape[1]
    ax, ay = width // 2, height - 1
    sentences = []
    for dx, dy in ((0, -1), (-1, 0), (1, 0)):  # forward, left, right
        x, y = ax + dx, ay + dy
        while 0 <= x < width and 0 <= y < height and image[x, y, 0] != 0:
            if image[x, y, 0] == 2:
                where = relative_position(x - ax, ay - y)
                sentences.append(f"You see a wall {where}.")
                break
            x, y = x + dx, y + dy
    objects = []
    for x in range(width):
        for y in range(height):
            if (x, y) == (ax, ay):
                continue
            noun = _noun(*(int(v) for v in image[x, y]))
            if noun is not None:
                lateral, forward = x - ax, ay - y
                objects.append((abs(lateral) + forward, lateral, forward, noun))
    for _, lateral, forward, noun in sorted(objects):
        sentences.append(f"You see {noun} {relative_position(lateral, forward)}.")
    return sentences


class MiniGridFormatter(Formatter):
    """A MiniGrid observation in BabyAI-Text sentences: mission, view, carried object, actions.

    The message has one line each for: ``Mission: <mission>``; each sentence of
    :func:`describe_view`; ``You carry <a colour type>.`` or ``You carry nothing.``; and, when
    ``last_actions`` > 0, ``Your last actions: <a>, <b>.`` (oldest first; ``none`` before the
    first action), read from ``info["last_actions"]`` that :class:`LastActions` adds.

    Example:
        >>> import numpy as np
        >>> image = np.zeros((7, 7, 3), dtype=np.uint8)
        >>> image[:, :] = (1, 0, 0)
        >>> image[3, 4] = (4, 1, 1)  # a closed green door 2 steps ahead
        >>> image[3, 6] = (5, 2, 0)  # the agent's cell: it carries a blue key
        >>> obs = {"image": image, "direction": 0, "mission": "open the green door"}
        >>> print(MiniGridFormatter(last_actions=2)(obs, {"last_actions": ("pick up",)}))
        Mission: open the green door
        You see a closed green door 2 steps forward.
        You carry a blue key.
        Your last actions: pick up.
    """

    def __init__(self, last_actions: int = 0) -> None:
        """Create the formatter.

        Args:
            last_actions: Show this many of the last actions (0: no actions line).
        """
        if not (isinstance(last_actions, int) and last_actions >= 0):
            raise ValueError(f"Expected last_actions to be an int >= 0, got {last_actions!r}")
        self.last_actions = last_actions

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Describe ``obs``; ``info["last_actions"]`` gives the actions line."""
        image = np.asarray(obs["image"])
        lines = [f"Mission: {obs['mission']}", *describe_view(image)]
        carried = _noun(*(int(v) for v in image[image.shape[0] // 2, image.shape[1] - 1]))
        carried = carried if carried is not None and carried[0] == "a" else None
        lines.append(f"You carry {carried or 'nothing'}.")
        if self.last_actions:
            recent = list(info.get("last_actions", ()))[-self.last_actions :]
            lines.append(f"Your last actions: {', '.join(recent) or 'none'}.")
        return "\n".join(lines)


class FirstActions(gym.ActionWrapper[Any, Any, Any]):
    """Offer only the first ``n`` actions of a Discrete action space (BabyAI without ``done``).

    Example:
        >>> env = FirstActions(gym.make("Taxi-v4"), 4)
        >>> env.action_space
        Discrete(4)
    """

    def __init__(self, env: gym.Env[Any, Any], n: int) -> None:
        super().__init__(env)
        space = env.action_space
        if not (isinstance(space, gym.spaces.Discrete) and 1 <= n <= space.n):
            raise ValueError(f"Expected a Discrete space of at least {n} actions, got {space}")
        self.action_space = gym.spaces.Discrete(n, start=int(space.start))

    def action(self, action: Any) -> Any:
        """The same action: only the space is smaller."""
        return action


class LastActions(gym.Wrapper[Any, Any, Any, Any]):
    """Add ``info["last_actions"]``: the names of the last ``k`` actions taken, oldest first.

    Example:
        >>> env = LastActions(gym.make("FrozenLake-v1"), 2, ["left", "down", "right", "up"])
        >>> env.reset(seed=0)[1]["last_actions"]
        ()
        >>> [env.step(a)[4]["last_actions"] for a in (1, 2, 2)][-1]
        ('right', 'right')
    """

    def __init__(self, env: gym.Env[Any, Any], k: int, names: Sequence[str]) -> None:
        super().__init__(env)
        self.names = tuple(names)
        self._taken: deque[str] = deque(maxlen=k)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the env and forget the actions."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._taken.clear()
        return obs, {**info, "last_actions": ()}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env and remember the action's name."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._taken.append(self.names[int(action)])
        return obs, reward, terminated, truncated, {**info, "last_actions": tuple(self._taken)}


class _QuietReset(gym.Wrapper[Any, Any, Any, Any]):
    """BabyAI prints "Sampling rejected: ..." while it generates a level: log it instead."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the env with its prints sent to the debug log (``textgym envs --json``)."""
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            result = self.env.reset(seed=seed, options=options)
        for line in printed.getvalue().splitlines():
            logger.debug("%s", line)
        return result


def system_prompt(view_size: int = 7, done_action: bool = False) -> str:
    """The task description of the BabyAI text envs.

    Example:
        >>> system_prompt().split(". ")[1]
        'Each turn you read your mission and what you see: up to 6 steps ahead and 3 steps to either side, walls and closed doors blocking the view'
    """  # noqa: E501
    done = " 'done' says that you have completed the mission." if done_action else ""
    return (
        "You are an agent in a grid world of rooms with walls, doors, keys, balls and boxes. "
        f"Each turn you read your mission and what you see: up to {view_size - 1} steps ahead "
        f"and {view_size // 2} steps to either side, walls and closed doors blocking the view. "
        "Positions are counted in steps from where you stand. 'turn left' and 'turn right' "
        "turn you 90 degrees where you stand; 'go forward' moves you one step ahead; 'pick "
        "up' takes the object right in front of you (you carry one at a time); 'drop' puts "
        "what you carry down right in front of you; 'toggle' opens or closes the door right "
        "in front of you. To go to an object, stand next to it and face it." + done
    )


def make_babyai_text_env(
    level: str,
    *,
    last_actions: int = 0,
    done_action: bool | None = None,
    render_mode: str | None = None,
    **kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/<level>``: a BabyAI level behind :class:`MiniGridFormatter`.

    Needs the ``minigrid`` package (``pip install "textgym[minigrid]"``); without it this
    raises :class:`~textgym.extras.MissingExtraError` saying so.

    Args:
        level: A key of :data:`BABYAI_LEVELS`, e.g. ``"BabyAI-GoToRedBall-v0"``.
        last_actions: Show the last this many actions in each observation (0: none).
        done_action: Offer the ``done`` action; None follows minigrid's
            ``BABYAI_DONE_ACTIONS`` environment variable (off by default: the levels ignore it).
        render_mode: Passed to the level.
        **kwargs: :class:`TextEnvWrapper` options go to the wrapper (``history=2``); the
            rest to the level (``room_size=6``).

    Example:
        >>> import textgym
        >>> env = gym.make("textgym/BabyAI-GoToRedBall-v0", last_actions=2)
        >>> messages, info = env.reset(seed=0)
        >>> print(messages[-1]["content"].splitlines()[1])
        You see a wall 6 steps forward.
        >>> messages, reward, terminated, truncated, info = env.step('{"action": "go forward"}')
        >>> print(messages[-1]["content"].splitlines()[-1])
        Your last actions: go forward.
    """
    if level not in BABYAI_LEVELS:
        raise ValueError(f"Expected level to be one of {sorted(BABYAI_LEVELS)}, got {level!r}")
    require("minigrid", "minigrid", f"textgym/{level}")  # importing it registers its levels
    if done_action is None:
        done_action = bool(os.environ.get("BABYAI_DONE_ACTIONS"))
    wrapper_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in WRAPPER_OPTIONS}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    source = BABYAI_LEVELS[level]
    if source.startswith("textgym.envs.minigrid_levels:"):
        from textgym.envs import minigrid_levels  # imports minigrid

        base: gym.Env[Any, Any] = getattr(minigrid_levels, source.partition(":")[2])(**kwargs)
    else:
        base = gym.make(source, **kwargs)
    names = ACTION_NAMES if done_action else ACTION_NAMES[:-1]
    base = ReportSuccess(FirstActions(_QuietReset(base), len(names)), "paid")
    if last_actions:
        base = LastActions(base, last_actions, names)
    view_size = int(base.unwrapped.agent_view_size)  # type: ignore[attr-defined]
    defaults = {
        "formatter": MiniGridFormatter(last_actions),
        "system_prompt": system_prompt(view_size, done_action),
        "action_names": names,
    }
    return TextEnvWrapper(base, **{**defaults, **wrapper_kwargs})
