"""``textgym/Sokoban-v0``: push one box onto its target in a small generated room.

The world of RAGEN's ``SimpleSokoban`` (a 6 × 6 room, one box, gym-sokoban's rewards and
symbols), written here without gym-sokoban. Every room is solvable by construction: it is made
by playing backwards from a solved room (:func:`generate_room`), and :func:`solve_room` finds a
shortest solution by breadth-first search.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from textgym.formatters import Formatter
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "ACTION_NAMES",
    "BOX",
    "BOX_ON_TARGET",
    "BOX_ON_TARGET_REWARD",
    "FLOOR",
    "PLAYER",
    "PLAYER_ON_TARGET",
    "SOLVED_REWARD",
    "STEP_REWARD",
    "SYMBOLS",
    "SYSTEM_PROMPT",
    "TARGET",
    "WALL",
    "Room",
    "SokobanEnv",
    "SokobanFormatter",
    "draw_grid",
    "generate_room",
    "make_sokoban_text_env",
    "room_grid",
    "solve_room",
]

# Cell codes of the observation grid (gym-sokoban's, with RAGEN's player-on-target code 6) and
# the symbol each is drawn with (RAGEN's grid_lookup).
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
SYMBOLS = "#_O√XPS"
ACTION_NAMES = ("up", "down", "left", "right")
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (row, column) change of each action
# gym-sokoban's rewards, as RAGEN uses them: every step, the box pushed onto a target, all
# boxes on targets. (Its -1 for pushing a box off a target cannot happen with one box: the
# episode ends as soon as the box is on.)
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
SOLVED_REWARD = 10.0

SYSTEM_PROMPT = (
    "You are solving a Sokoban puzzle drawn as a grid: # wall, _ floor, O target, X box, "
    "√ box on the target, P you, S you standing on the target. Push the box onto the target. "
    "Each action moves you one cell; walking into the box pushes it one cell the same way if "
    "the cell beyond it is not a wall, and walking into a wall does nothing. You cannot pull "
    "the box, so a box pushed against a wall or into a corner may be stuck for good. Rows and "
    "columns count from 0 at the top left. Every action costs 0.1; pushing the box onto the "
    "target earns 1 more and 10 for solving the puzzle, which ends it."
)

Cell = tuple[int, int]
_LAYOUT_TRIES = 1000


class Room(NamedTuple):
    """A generated room: which cells are walls, and where the player, box and target are.

    Attributes:
        walls: Boolean array, True for a wall (the border is all walls).
        player: The player's (row, column).
        box: The box's (row, column), never the target's.
        target: The target's (row, column).
    """

    walls: np.ndarray
    player: Cell
    box: Cell
    target: Cell


def _step(cell: Cell, move: int) -> Cell:
    dr, dc = MOVES[move]
    return cell[0] + dr, cell[1] + dc


def _connected(walls: np.ndarray) -> bool:
    """Whether the floor cells form one 4-connected region."""
    floor = [tuple(int(v) for v in cell) for cell in np.argwhere(~walls)]
    if not floor:
        return False
    seen, todo = {floor[0]}, [floor[0]]
    while todo:
        cell = todo.pop()
        for move in range(4):
            nxt = _step(cell, move)
            if not walls[nxt] and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return len(seen) == len(floor)


def generate_room(
    rng: np.random.Generator,
    dim_room: Sequence[int] = (6, 6),
    internal_walls: int = 3,
    search_depth: int = 300,
) -> Room:
    """Generate a solvable one-box room by playing backwards from the solved room.

    Walls line the border; ``internal_walls`` more are drawn among the inner cells, keeping
    the floor connected. The box starts on the target (a random floor cell) and the player on
    another random floor cell. Then every state within ``search_depth`` reverse moves is
    visited, breadth first: a reverse move steps the player onto a free neighbouring cell,
    with or without pulling the box along if it stood right behind them. Each one undoes a
    legal forward move or push, so every visited state can be solved. The room is a visited
    state whose box is farthest from the target (Manhattan distance; ties drawn at random),
    as gym-sokoban keeps the best-scored state of its reverse search. A layout whose box
    cannot leave the target is drawn again. All draws come from ``rng``.

    Args:
        rng: The random generator (an env's ``np_random``).
        dim_room: (rows, columns), border included; at least 4 × 5 or 5 × 4.
        internal_walls: Inner cells made walls (fewer where the floor would split).
        search_depth: Reverse moves searched from the solved room; small values keep the box
            near the target (easy rooms), large ones (RAGEN's 300) reach every state.

    Returns:
        The :class:`Room`.

    Raises:
        RuntimeError: No layout in 1,000 draws let the box be pulled off the target (too
            many internal walls for the room).

    Example:
        >>> room = generate_room(np.random.default_rng(0))
        >>> print(draw_grid(room_grid(room)))
        # # # # # #
        # _ _ # # #
        # _ _ X P #
        # O _ _ # #
        # _ _ _ _ #
        # # # # # #
        >>> len(solve_room(room))
        5
    """
    rows, cols = _check_options(dim_room, internal_walls, search_depth)
    inner = (rows - 2) * (cols - 2)
    for _ in range(_LAYOUT_TRIES):
        walls = np.ones((rows, cols), dtype=bool)
        walls[1:-1, 1:-1] = False
        for index in rng.permutation(inner)[:internal_walls]:
            cell = (1 + int(index) // (cols - 2), 1 + int(index) % (cols - 2))
            walls[cell] = True
            if not _connected(walls):
                walls[cell] = False
        floor = [(int(r), int(c)) for r, c in np.argwhere(~walls)]
        target_index, player_index = rng.choice(len(floor), size=2, replace=False)
        target = floor[int(target_index)]
        states = _reverse_states(walls, (floor[int(player_index)], target), search_depth)
        distances = [abs(b[0] - target[0]) + abs(b[1] - target[1]) for _, b in states]
        farthest = max(distances)
        if farthest:
            best = [state for state, d in zip(states, distances, strict=True) if d == farthest]
            player, box = best[int(rng.integers(len(best)))]
            return Room(walls, player, box, target)
    raise RuntimeError(
        f"No layout of {_LAYOUT_TRIES} let the box leave its target; lower internal_walls "
        f"(got {internal_walls} in a {rows} × {cols} room)"
    )


def _check_options(
    dim_room: Sequence[int], internal_walls: int, search_depth: int
) -> tuple[int, int]:
    """Refuse rooms that cannot be generated; return (rows, columns)."""
    dim = tuple(int(v) for v in dim_room)
    # A pull needs three floor cells in a row, so the inside must be 3 cells long one way.
    if len(dim) != 2 or min(dim) < 4 or max(dim) < 5:
        raise ValueError(f"Expected dim_room (rows, columns) of at least 4 × 5, got {dim_room!r}")
    rows, cols = dim
    inner = (rows - 2) * (cols - 2)
    if not 0 <= internal_walls <= inner - 3:
        raise ValueError(
            f"Expected internal_walls from 0 to {inner - 3} in a {rows} × {cols} room, "
            f"got {internal_walls!r}"
        )
    if search_depth < 1:
        raise ValueError(f"Expected search_depth >= 1, got {search_depth!r}")
    return rows, cols


def _reverse_states(
    walls: np.ndarray, start: tuple[Cell, Cell], depth: int
) -> list[tuple[Cell, Cell]]:
    """Every (player, box) state within ``depth`` reverse moves of ``start``, sorted."""
    seen, layer = {start}, [start]
    for _ in range(depth):
        following = []
        for player, box in layer:
            for move in range(4):
                nxt = _step(player, move)
                if walls[nxt] or nxt == box:
                    continue
                pulled = box == (2 * player[0] - nxt[0], 2 * player[1] - nxt[1])
                for state in ((nxt, box), (nxt, player)) if pulled else ((nxt, box),):
                    if state not in seen:
                        seen.add(state)
                        following.append(state)
        if not following:
            break
        layer = following
    return sorted(seen)


def room_grid(room: Room) -> np.ndarray:
    """The observation grid of ``room``: cell codes ``0`` … ``6`` (:data:`SYMBOLS` order).

    Example:
        >>> walls = np.ones((4, 5), dtype=bool)
        >>> walls[1:-1, 1:-1] = False
        >>> room_grid(Room(walls, (1, 1), (1, 2), (2, 3))).tolist()[1:3]
        [[0, 5, 4, 1, 0], [0, 1, 1, 2, 0]]
    """
    grid = np.where(room.walls, WALL, FLOOR).astype(np.uint8)
    grid[room.target] = TARGET
    grid[room.box] = BOX_ON_TARGET if room.box == room.target else BOX
    grid[room.player] = PLAYER_ON_TARGET if room.player == room.target else PLAYER
    return grid


def draw_grid(grid: np.ndarray) -> str:
    """The grid as text, one row a line, cells separated by spaces (:data:`SYMBOLS`).

    Example:
        >>> print(draw_grid(np.array([[0, 0, 0], [0, 6, 4], [0, 1, 3]])))
        # # #
        # S X
        # _ √
    """
    return "\n".join(" ".join(SYMBOLS[int(code)] for code in row) for row in grid)


def solve_room(room: Room) -> list[int] | None:
    """A shortest solution of ``room`` (action indices), by BFS over (player, box) states.

    Returns None when the box can no longer reach the target (pushed into a corner).

    Example:
        >>> walls = np.ones((5, 6), dtype=bool)
        >>> walls[1:-1, 1:-1] = False
        >>> [ACTION_NAMES[a] for a in solve_room(Room(walls, (1, 3), (2, 2), (2, 1)))]
        ['down', 'left']
        >>> [ACTION_NAMES[a] for a in solve_room(Room(walls, (2, 1), (2, 2), (1, 2)))]
        ['down', 'right', 'up']
        >>> solve_room(Room(walls, (2, 2), (1, 1), (2, 3))) is None  # the box is in a corner
        True
    """
    start = (room.player, room.box)
    parents: dict[tuple[Cell, Cell], tuple[tuple[Cell, Cell], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, box = state
        if box == room.target:
            actions: list[int] = []
            link = parents[state]
            while link is not None:
                state, move = link
                actions.append(move)
                link = parents[state]
            return actions[::-1]
        for move in range(4):
            nxt, new_box = _step(player, move), box
            if room.walls[nxt]:
                continue
            if nxt == box:
                new_box = _step(box, move)
                if room.walls[new_box]:
                    continue
            if (nxt, new_box) not in parents:
                parents[(nxt, new_box)] = (state, move)
                queue.append((nxt, new_box))
    return None


class SokobanEnv(gym.Env[np.ndarray, int]):
    """One box, one target, a small walled room generated on every reset.

    Observation: the room as a ``uint8`` grid of cell codes ``0`` wall, ``1`` floor, ``2``
    target, ``3`` box on target, ``4`` box, ``5`` player, ``6`` player on target (drawn
    ``#_O√XPS``). Actions ``Discrete(4)``: up, down, left, right. Rewards (gym-sokoban's):
    -0.1 every step, +1 for pushing the box onto the target and +10 for solving the puzzle,
    which that push does (one box): the last step pays 10.9 and terminates the episode, with
    ``info["is_success"]`` True. There is no time limit inside: ``gym.make`` adds one. Each
    step's info has ``moved`` (the player moved) and ``pushed`` (the box moved). All
    randomness comes from ``self.np_random``.

    Example:
        >>> env = SokobanEnv()
        >>> obs, info = env.reset(seed=0)
        >>> print(draw_grid(obs))
        # # # # # #
        # _ _ # # #
        # _ _ X P #
        # O _ _ # #
        # _ _ _ _ #
        # # # # # #
        >>> [ACTION_NAMES[a] for a in solve_room(env.room)]
        ['left', 'left', 'up', 'left', 'down']
        >>> for a in (2, 2, 0, 2):
        ...     obs, reward, terminated, truncated, info = env.step(a)
        >>> obs, reward, terminated, truncated, info = env.step(1)
        >>> round(reward, 2), terminated, info["is_success"]
        (10.9, True, True)
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        dim_room: Sequence[int] = (6, 6),
        internal_walls: int = 3,
        search_depth: int = 300,
        render_mode: str | None = None,
    ) -> None:
        """Create the env.

        Args:
            dim_room: (rows, columns) of the room, border walls included.
            internal_walls: Walls drawn inside the border (see :func:`generate_room`).
            search_depth: Reverse moves that scatter the solved room (see
                :func:`generate_room`); more tend to put the box farther from the target.
            render_mode: None or ``"ansi"`` (``render()`` returns the drawn grid).
        """
        self.dim_room = _check_options(dim_room, internal_walls, search_depth)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"Expected render_mode to be None or 'ansi', got {render_mode!r}")
        self.internal_walls = internal_walls
        self.search_depth = search_depth
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0, PLAYER_ON_TARGET, self.dim_room, np.uint8)
        self.action_space = spaces.Discrete(4)
        self.room: Room | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Generate a new room from ``self.np_random``."""
        super().reset(seed=seed)
        self.room = generate_room(
            self.np_random, self.dim_room, self.internal_walls, self.search_depth
        )
        return room_grid(self.room), {}

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """Move (and push), then pay gym-sokoban's rewards."""
        if self.room is None:
            raise RuntimeError("Call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"Expected an action in {self.action_space}, got {action!r}")
        room = self.room
        if room.box == room.target:
            raise RuntimeError("The puzzle is solved; call reset() before step()")
        nxt, box, reward = _step(room.player, int(action)), room.box, STEP_REWARD
        if room.walls[nxt] or (nxt == box and room.walls[_step(box, int(action))]):
            nxt = room.player  # a wall, or a box against a wall: nothing moves
        elif nxt == box:
            box = _step(box, int(action))
        info: dict[str, Any] = {"moved": nxt != room.player, "pushed": box != room.box}
        self.room = room._replace(player=nxt, box=box)
        terminated = box == room.target
        if terminated:
            reward += BOX_ON_TARGET_REWARD + SOLVED_REWARD
            info["is_success"] = True
        return room_grid(self.room), reward, terminated, False, info

    def render(self) -> str | None:
        """Return the drawn grid (``render_mode="ansi"``), else None."""
        if self.render_mode != "ansi" or self.room is None:
            return None
        return draw_grid(room_grid(self.room))


class SokobanFormatter(Formatter):
    """The room drawn with RAGEN's symbols, after a line naming where everything is.

    Example:
        >>> grid = np.array([[0, 0, 0, 0, 0], [0, 5, 4, 1, 0], [0, 1, 1, 2, 0], [0] * 5])
        >>> print(SokobanFormatter()(grid, {}))
        You (P) are at row 1, column 1; the box (X) at row 1, column 2; the target (O) at row 2, column 3.
        # # # # #
        # P X _ #
        # _ _ O #
        # # # # #
    """  # noqa: E501

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Locate the player, the box and the target, then draw the grid."""
        grid = np.asarray(obs)

        def where(*codes: int) -> str:
            found = np.argwhere(np.isin(grid, codes))
            return f"row {int(found[0][0])}, column {int(found[0][1])}" if len(found) else "?"

        if np.any(grid == BOX_ON_TARGET):
            line = (
                f"You (P) are at {where(PLAYER)}; the box is on the target (√) at "
                f"{where(BOX_ON_TARGET)}: solved."
            )
        else:
            line = (
                f"You ({'S' if np.any(grid == PLAYER_ON_TARGET) else 'P'}) are at "
                f"{where(PLAYER, PLAYER_ON_TARGET)}; the box (X) at {where(BOX)}; "
                f"the target (O) at {where(TARGET, PLAYER_ON_TARGET)}."
            )
        return f"{line}\n{draw_grid(grid)}"


def make_sokoban_text_env(
    *,
    dim_room: Sequence[int] = (6, 6),
    internal_walls: int = 3,
    search_depth: int = 300,
    render_mode: str | None = None,
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/Sokoban-v0``: :class:`SokobanEnv` behind a ``TextEnvWrapper``.

    Args:
        dim_room: (rows, columns) of the room, border walls included.
        internal_walls: Walls drawn inside the border.
        search_depth: Reverse moves that scatter the solved room.
        render_mode: None or ``"ansi"``.
        **wrapper_kwargs: :class:`~textgym.wrappers.TextEnvWrapper` options; ``formatter``
            defaults to :class:`SokobanFormatter`, ``system_prompt`` to :data:`SYSTEM_PROMPT`
            and ``action_names`` to :data:`ACTION_NAMES`.

    Example:
        >>> env = make_sokoban_text_env()
        >>> messages, info = env.reset(seed=0)
        >>> print(messages[-1]["content"].splitlines()[0])
        You (P) are at row 2, column 4; the box (X) at row 2, column 3; the target (O) at row 3, column 1.
        >>> env.reply_choices()[0]
        '{"action": "up"}'
        >>> messages, reward, terminated, truncated, info = env.step("right")
        >>> round(float(reward), 2), info["moved"]
        (-0.1, False)
    """  # noqa: E501
    env = SokobanEnv(dim_room, internal_walls, search_depth, render_mode=render_mode)
    wrapper_kwargs.setdefault("formatter", SokobanFormatter())
    wrapper_kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
    if wrapper_kwargs.get("parser") is None:
        wrapper_kwargs.setdefault("action_names", ACTION_NAMES)
    return TextEnvWrapper(env, **wrapper_kwargs)
