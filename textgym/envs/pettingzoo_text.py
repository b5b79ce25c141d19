"""PettingZoo games as text envs: tic-tac-toe and Connect Four, the board drawn, moves named.

``pettingzoo`` is imported when a game is made (``pip install "textgym[pettingzoo]"``); the
formatters read only the observation planes and the info of :class:`AECSeatEnv`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from textgym.envs.pettingzoo_seat import AECSeatEnv, Opponent
from textgym.envs.tictactoe_minimax import MinimaxOpponent
from textgym.extras import require
from textgym.formatters import Formatter
from textgym.wrappers import WRAPPER_OPTIONS, TextEnvWrapper

__all__ = [
    "CONNECT_FOUR_COLUMNS",
    "EXPLORING_OPENINGS",
    "GAME_OPPONENTS",
    "PETTINGZOO_GAMES",
    "TICTACTOE_CELLS",
    "ConnectFourFormatter",
    "TicTacToeFormatter",
    "make_pettingzoo_text_env",
    "pettingzoo_text_env",
]

# PettingZoo's tictactoe numbers cells down the columns (0 1 2 is the left column): cell names
# are column letter (a-c, left to right) then row number (1-3, top to bottom).
TICTACTOE_CELLS = tuple(f"{column}{row}" for column in "abc" for row in "123")
CONNECT_FOUR_COLUMNS = tuple(str(c) for c in range(1, 8))
_MARKS = ("X", "O")

TICTACTOE_PROMPT = (
    "You are playing tic-tac-toe on a 3 x 3 board against an opponent. Players take turns "
    "placing their mark (X moves first, then O) in an empty cell; the first to get three of "
    "their marks in a row, a column or a diagonal wins, and a full board without one is a "
    "draw. Cells are named by column (a, b, c from left to right) and row (1, 2, 3 from top to "
    "bottom): a1 is the top-left corner, b2 the centre. Each turn you see the board and the "
    "legal moves; reply with one of them."
)
CONNECT_FOUR_PROMPT = (
    "You are playing Connect Four against an opponent on a board of 6 rows and 7 columns. "
    "Players take turns dropping one of their discs (X moves first, then O) into a column "
    "that is not full; it falls to the lowest empty cell. The first to get four discs in a "
    "row horizontally, vertically or diagonally wins; a full board without one is a draw. "
    "Columns are numbered 1 to 7 from left to right. Each turn you see the board (the top row "
    "first) and the legal moves; reply with the column of one of them."
)


class _BoardFormatter(Formatter):
    """Who plays what, the opponent's last move, the board, the legal moves."""

    NAMES: tuple[str, ...] = ()
    MOVED = "played"

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Render one seat's view."""
        seat = int(info.get("seat_index", 0))
        mine, theirs = _MARKS[seat % 2], _MARKS[(seat + 1) % 2]
        lines = [f"You play {mine}; your opponent plays {theirs}."]
        if "opponent_action" in info:
            lines[0] += f" Your opponent {self.MOVED} {self.NAMES[int(info['opponent_action'])]}."
        else:
            lines[0] += " You move first."
        planes = np.asarray(obs)
        lines += self.board(planes[..., 0], planes[..., 1], mine, theirs)
        legal = [self.NAMES[a] for a in np.flatnonzero(np.asarray(info["action_mask"]))]
        lines.append(f"Legal moves: {', '.join(legal)}." if legal else "The game is over.")
        return "\n".join(lines)

    def board(self, mine: np.ndarray, theirs: np.ndarray, me: str, them: str) -> list[str]:
        """The board's lines."""
        raise NotImplementedError


class TicTacToeFormatter(_BoardFormatter):
    """A PettingZoo tic-tac-toe observation: the board in rows, the legal cells named.

    Example:
        >>> obs = np.zeros((3, 3, 2), dtype=np.int8)
        >>> obs[1, 1, 1] = 1  # the opponent took the centre (column b, row 2)
        >>> mask = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1], dtype=np.int8)
        >>> print(TicTacToeFormatter()(obs, {"seat_index": 1, "opponent_action": 4,
        ...                                  "action_mask": mask}))
        You play O; your opponent plays X. Your opponent played b2.
           a b c
        1  . . .
        2  . X .
        3  . . .
        Legal moves: a1, a2, a3, b1, b3, c1, c2, c3.
    """

    NAMES = TICTACTOE_CELLS

    def board(self, mine: np.ndarray, theirs: np.ndarray, me: str, them: str) -> list[str]:
        """Rows top to bottom; PettingZoo's planes are indexed [column, row]."""
        lines = ["   a b c"]
        for row in range(3):
            cells = [_cell(mine[col, row], theirs[col, row], me, them) for col in range(3)]
            lines.append(f"{row + 1}  {' '.join(cells)}")
        return lines


class ConnectFourFormatter(_BoardFormatter):
    """A PettingZoo Connect Four observation: the board top row first, the open columns named.

    Example:
        >>> obs = np.zeros((6, 7, 2), dtype=np.int8)
        >>> obs[5, 3, 1] = 1  # the opponent's disc at the bottom of column 4
        >>> mask = np.ones(7, dtype=np.int8)
        >>> print(ConnectFourFormatter()(obs, {"seat_index": 1, "opponent_action": 3,
        ...                                    "action_mask": mask}))
        You play O; your opponent plays X. Your opponent dropped a disc in column 4.
        1 2 3 4 5 6 7
        . . . . . . .
        . . . . . . .
        . . . . . . .
        . . . . . . .
        . . . . . . .
        . . . X . . .
        Legal moves: 1, 2, 3, 4, 5, 6, 7.
    """

    NAMES = CONNECT_FOUR_COLUMNS
    MOVED = "dropped a disc in column"

    def board(self, mine: np.ndarray, theirs: np.ndarray, me: str, them: str) -> list[str]:
        """Rows top to bottom; PettingZoo's planes are indexed [row, column], row 0 on top."""
        lines = [" ".join(CONNECT_FOUR_COLUMNS)]
        for row in range(mine.shape[0]):
            cells = [_cell(mine[row, c], theirs[row, c], me, them) for c in range(mine.shape[1])]
            lines.append(" ".join(cells))
        return lines


def _cell(mine: Any, theirs: Any, me: str, them: str) -> str:
    return me if mine else them if theirs else "."


# textgym/<id> -> (PettingZoo id, formatter, move names, system prompt, turn limit). The
# limit counts invalid replies too: a game's moves times max_invalid (3) leaves room for them.
PETTINGZOO_GAMES: dict[str, tuple[str, type[_BoardFormatter], tuple[str, ...], str, int]] = {
    "TicTacToe-v0": (
        "classic/tictactoe_v3",
        TicTacToeFormatter,
        TICTACTOE_CELLS,
        TICTACTOE_PROMPT,
        15,
    ),
    "ConnectFour-v0": (
        "classic/connect_four_v3",
        ConnectFourFormatter,
        CONNECT_FOUR_COLUMNS,
        CONNECT_FOUR_PROMPT,
        63,
    ),
}


# The most random moves an exploring start plays before the agent's first move, per game:
# about two thirds of the shortest decided game's length or more, so many starts leave a
# winning or a blocking move.
EXPLORING_OPENINGS: dict[str, int] = {"TicTacToe-v0": 6, "ConnectFour-v0": 20}

# Opponents a game's id takes by name besides "random", as a factory of the name: each env
# built gets a fresh one, so the envs of a vector env do not share a player's state.
GAME_OPPONENTS: dict[str, dict[str, Callable[[str], Opponent]]] = {
    # "minimax" is perfect play, "minimax:0.3" blunders a random move 30% of the time.
    "TicTacToe-v0": {"minimax": MinimaxOpponent.from_name},
}


def pettingzoo_text_env(
    game: Any,
    formatter: Any = None,
    *,
    opponent: Any = "random",
    seat: str | int = "alternate",
    opening_moves: int = 0,
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    """A text env for one seat of any PettingZoo AEC game, the opponent playing the others.

    The seat's legal moves come from PettingZoo's action mask (``action_mask=True``): replies
    naming an illegal move are invalid, and the listed valid replies are the legal moves.

    Args:
        game: A PettingZoo AEC env (``pettingzoo.make("aec", ...)``, with its wrappers).
        formatter: As for :class:`TextEnvWrapper` (it reads :class:`AECSeatEnv`'s
            observation and info).
        opponent: ``"random"``, a callable ``(observation, info) -> action``, or an
            :class:`~textgym.envs.pettingzoo_seat.Opponent` such as ``TextOpponent(policy)``.
        seat: ``"alternate"``, ``"random"``, a seat index or an agent name (see
            :class:`AECSeatEnv`).
        opening_moves: Random moves before the agent's first (see :class:`AECSeatEnv`).
        **wrapper_kwargs: Other :class:`TextEnvWrapper` options (``action_names``, ...).

    Example:
        >>> import pettingzoo
        >>> game = pettingzoo.make("aec", "classic/tictactoe_v3")
        >>> env = pettingzoo_text_env(game, TicTacToeFormatter(),
        ...                           action_names=TICTACTOE_CELLS, seat=0)
        >>> messages, info = env.reset(seed=0)
        >>> env.reply_choices()[:2]
        ['{"action": "a1"}', '{"action": "a2"}']
    """
    seat_env = AECSeatEnv(game, opponent, seat=seat, opening_moves=opening_moves)
    env = TextEnvWrapper(seat_env, formatter, action_mask=True, **wrapper_kwargs)
    seat_env.opponent.bind(env)
    return env


def make_pettingzoo_text_env(
    game: str,
    *,
    opponent: Any = "random",
    seat: str | int = "alternate",
    render_mode: str | None = None,
    exploring_starts: bool = False,
    **kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/<game>`` (``TicTacToe-v0``, ``ConnectFour-v0``).

    Needs ``pettingzoo`` (``pip install "textgym[pettingzoo]"``); without it this raises
    :class:`~textgym.extras.MissingExtraError` saying so.

    Args:
        game: A key of :data:`PETTINGZOO_GAMES`.
        opponent: Who plays the other seat (see :func:`pettingzoo_text_env`), or the name of
            one of the game's :data:`GAME_OPPONENTS`: for tic-tac-toe ``"minimax"`` (perfect
            play) or ``"minimax:<epsilon>"`` (a random move with probability epsilon).
        seat: The agent's seat (see :class:`AECSeatEnv`).
        render_mode: Passed to the PettingZoo game.
        exploring_starts: Start every game after a random opening of 0 to
            :data:`EXPLORING_OPENINGS` moves (``AECSeatEnv(opening_moves=...)``), so training
            meets mid-game positions from the first update. For training envs only.
        **kwargs: :class:`TextEnvWrapper` options go to the wrapper (``history=2``).

    Example:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/TicTacToe-v0", seat=0)
        >>> messages, info = env.reset(seed=0)
        >>> messages, reward, terminated, truncated, info = env.step('{"move": "b2"}')
        >>> print(messages[-1]["content"].splitlines()[0])
        You play X; your opponent plays O. Your opponent played a3.
    """
    if game not in PETTINGZOO_GAMES:
        raise ValueError(f"Expected game to be one of {sorted(PETTINGZOO_GAMES)}, got {game!r}")
    unknown = set(kwargs) - WRAPPER_OPTIONS
    if unknown:
        raise TypeError(f"Unknown options for textgym/{game}: {sorted(unknown)}")
    game_id, formatter, names, prompt, _ = PETTINGZOO_GAMES[game]
    named = GAME_OPPONENTS.get(game, {})
    if isinstance(opponent, str) and opponent != "random":
        kind = opponent.partition(":")[0]
        if kind not in named:
            raise ValueError(
                f"Expected opponent of textgym/{game} to be one of {['random', *named]}, an "
                f"Opponent or a callable, got {opponent!r}"
            )
        opponent = named[kind](opponent)
    pettingzoo = require("pettingzoo", "pettingzoo", f"textgym/{game}")
    require("pygame", "pettingzoo", f"textgym/{game}")  # PettingZoo's classic games import it
    defaults = {"system_prompt": prompt, "action_names": names, "action_field": "move"}
    return pettingzoo_text_env(
        pettingzoo.make("aec", game_id, render_mode=render_mode),
        formatter(),
        opponent=opponent,
        seat=seat,
        opening_moves=EXPLORING_OPENINGS[game] if exploring_starts else 0,
        **{**defaults, **kwargs},
    )
