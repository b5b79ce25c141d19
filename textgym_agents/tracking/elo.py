"""Standard Elo ratings for two-player games: the learner's strength against its opponents.

Ratings start at :data:`INITIAL_RATING`; each finished game moves both players by
``k * (score - expected)``, ``score`` being 1 for a win, 0.5 for a draw and 0 for a loss.
"""

from __future__ import annotations

import math

__all__ = ["DEFAULT_K", "INITIAL_RATING", "SCORES", "elo_expected", "elo_update"]

INITIAL_RATING = 1000.0
"""The rating of a new player (the first snapshot of a self-play pool, and the learner)."""

DEFAULT_K = 16.0
"""How far one game moves a rating (FIDE uses 10-40; 16 suits thousands of games)."""

SCORES = {"win": 1.0, "draw": 0.5, "loss": 0.0}
"""A game's score for the player whose outcome it is."""


def elo_expected(rating: float, opponent: float) -> float:
    """Expected score of a player rated ``rating`` against one rated ``opponent``.

    ``1 / (1 + 10 ** ((opponent - rating) / 400))``: 0.5 between equals, about 0.76 for a
    200-point favourite.

    Example:
        >>> elo_expected(1000, 1000), round(elo_expected(1200, 1000), 4)
        (0.5, 0.7597)
    """
    return 1.0 / (1.0 + math.pow(10.0, (opponent - rating) / 400.0))


def elo_update(
    rating: float, opponent: float, outcome: str, k: float = DEFAULT_K
) -> tuple[float, float]:
    """Both ratings after one game; ``outcome`` (``"win"``, ``"draw"``, ``"loss"``) is the first's.

    The change is zero-sum: the first player gains ``k * (score - expected)`` and the
    opponent loses as much.

    Example:
        >>> elo_update(1000, 1000, "win")
        (1008.0, 992.0)
        >>> [round(r, 2) for r in elo_update(1200, 1000, "draw")]
        [1195.84, 1004.16]
    """
    if outcome not in SCORES:
        raise ValueError(f"Expected outcome to be one of {sorted(SCORES)}, got {outcome!r}")
    if not (isinstance(k, (int, float)) and k > 0):
        raise ValueError(f"Expected k to be a positive number, got {k!r}")
    change = k * (SCORES[outcome] - elo_expected(rating, opponent))
    return rating + change, opponent - change
