"""A perfect tic-tac-toe player: full minimax, a random choice among equally good moves.

Used as ``gym.make("textgym/TicTacToe-v0", opponent="minimax")`` (each env gets its own
player) and by ``benchmarks/tictactoe.py`` as the reference a learner can at best draw with.
The game tree is small (5,478 positions), so every position's value is solved once and cached.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from textgym.envs.pettingzoo_seat import Opponent

__all__ = ["LINES", "MinimaxOpponent", "best_moves", "position_value"]

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
"""The eight lines of PettingZoo's cells 0-8 (three in a row along either board axis and the
two diagonals; the set is the same whichever axis PettingZoo numbers first)."""


def _winner(board: tuple[int, ...]) -> int:
    for a, b, c in LINES:
        if board[a] != 0 and board[a] == board[b] == board[c]:
            return board[a]
    return 0


@functools.cache
def position_value(board: tuple[int, ...]) -> int:
    """The game value for the player to move: 1 win, 0 draw, -1 loss under perfect play.

    ``board`` has 9 cells: 1 the mover's marks, -1 the other player's, 0 empty.

    Example:
        >>> position_value((0,) * 9)  # tic-tac-toe is a draw
        0
        >>> position_value((1, 1, 0, -1, -1, 0, 0, 0, 0))  # the mover completes the top line
        1
    """
    if _winner(board) != 0:  # the player who just moved won
        return -1
    values = [_after(board, cell) for cell in range(9) if board[cell] == 0]
    return max(values) if values else 0


def _after(board: tuple[int, ...], cell: int) -> int:
    """The mover's value of playing ``cell``: minus the value for the opponent after it."""
    moved = tuple(-v for v in board[:cell] + (1,) + board[cell + 1 :])
    return -position_value(moved)


def best_moves(board: tuple[int, ...]) -> list[int]:
    """Every empty cell that keeps the best value for the mover (see :func:`position_value`).

    Example:
        >>> best_moves((1, 1, 0, -1, -1, 0, 0, 0, 0))  # win now; 5 would only block
        [2]
        >>> best_moves((-1, 0, 0, 0, 0, 0, 0, 0, 0))  # against a corner only the centre draws
        [4]
    """
    empty = [cell for cell in range(9) if board[cell] == 0]
    if not empty or _winner(board) != 0:
        raise ValueError(f"No move to make: the game is over on {board}")
    values = {cell: _after(board, cell) for cell in empty}
    best = max(values.values())
    return [cell for cell in empty if values[cell] == best]


class MinimaxOpponent(Opponent):
    """Perfect play on PettingZoo's ``tictactoe_v3``; ties between best moves broken at random.

    The random tie-break (seeded by the env's reset) makes games against it differ, so a
    greedy learner is not scored on the same two games over and over. Nobody beats it: the
    best a player can get is a draw. With ``epsilon > 0`` it blunders: each move is a uniformly
    random legal one with probability ``epsilon`` (a training opponent between random and
    perfect). Every move draws the same random numbers whatever the board, so games reset with
    one seed meet the same opponent luck (the seed-shared groups of the group estimators).

    Args:
        epsilon: Probability of a random legal move instead of a best one, in [0, 1].

    Example:
        >>> opponent = MinimaxOpponent()
        >>> opponent.reset(seed=0)
        >>> obs = np.zeros((3, 3, 2), dtype=np.int8)
        >>> obs[0, 0, 1] = 1  # the other player took cell 0 (a corner)
        >>> mask = np.array([0] + [1] * 8, dtype=np.int8)
        >>> int(opponent.act(obs, {"action_mask": mask}))  # only the centre holds the draw
        4
    """

    def __init__(self, epsilon: float = 0.0) -> None:
        number = isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool)
        if not (number and 0.0 <= epsilon <= 1.0):
            raise ValueError(f"Expected epsilon to be a probability in [0, 1], got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.name = "minimax" if self.epsilon == 0 else f"minimax:{self.epsilon:g}"
        self._rng = np.random.default_rng()

    def reset(self, seed: int | None = None) -> None:
        """Reseed the tie-break."""
        self._rng = np.random.default_rng(seed)

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """A best move of the seat's view (planes: its own marks, then the other player's)."""
        planes = np.asarray(observation)
        if planes.shape != (3, 3, 2):
            raise ValueError(f"Expected a (3, 3, 2) tic-tac-toe observation, got {planes.shape}")
        board = tuple(int(v) for v in planes[..., 0].reshape(9) - planes[..., 1].reshape(9))
        legal = np.flatnonzero(np.asarray(info["action_mask"])).tolist()
        moves = best_moves(board)
        if not set(moves) <= set(legal):
            raise ValueError(f"The action mask {info['action_mask']} disagrees with the board")
        blunder, pick = self._rng.random(), self._rng.random()  # two draws on every move
        if blunder < self.epsilon:
            moves = legal
        return np.int64(moves[int(pick * len(moves))])

    @classmethod
    def from_name(cls, name: str) -> MinimaxOpponent:
        """``"minimax"`` (perfect) or ``"minimax:<epsilon>"`` (blundering), as env kwargs take.

        Example:
            >>> MinimaxOpponent.from_name("minimax:0.25").epsilon
            0.25
        """
        kind, _, epsilon = name.partition(":")
        if kind != "minimax":
            raise ValueError(f"Expected 'minimax' or 'minimax:<epsilon>', got {name!r}")
        try:
            return cls(float(epsilon) if epsilon else 0.0)
        except ValueError as e:
            raise ValueError(f"Expected 'minimax' or 'minimax:<epsilon>', got {name!r}: {e}") from e
