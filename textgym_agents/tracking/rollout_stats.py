"""What one update reports about its rollout: tables of turns and episodes, then metrics.

Tables come first (float64 rows), so the processes of a run can pool them before the means.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from textgym_agents.ppo.core import explained_variance

__all__ = [
    "OUTCOMES",
    "episode_metrics",
    "episode_table",
    "game_metrics",
    "game_records",
    "gathered_games",
    "opponent_kind",
    "turn_metrics",
    "turn_table",
]


def turn_table(turns: Sequence[Any]) -> torch.Tensor:
    """(N, 6) float64 rows of scored turns: invalid, reward, reply tokens, value, return, KL."""
    rows = [
        [t.invalid, t.reward, len(t.response_ids), t.value or 0.0, t.returns, t.kl] for t in turns
    ]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 6)


def turn_metrics(table: torch.Tensor, values: bool = True) -> dict[str, float]:
    """Invalid-reply rate, mean reward and reply length, value statistics of a :func:`turn_table`.

    ``values=False`` (a critic-free run) leaves the ``value/`` statistics out rather than 0.

    Example:
        >>> table = torch.tensor([[0, 1.0, 3, 0.5, 1.0, 0.0], [1, -1.0, 5, 0.0, -1.0, 0.0]])
        >>> m = turn_metrics(table.double())
        >>> m["env/invalid_rate"], m["reply/tokens_mean"], m["value/explained_var"]
        (0.5, 4.0, 0.4375)
    """
    invalid, reward, tokens, value, returns, _ = table.numpy().T
    metrics = {
        "env/invalid_rate": float(np.mean(invalid)),
        "env/reward_mean": float(np.mean(reward)),
        "reply/tokens_mean": float(np.mean(tokens)),
    }
    if values:
        predicted = torch.tensor(value.tolist())  # float32, as the value head computes them
        metrics["value/mean"] = float(predicted.mean())
        target = torch.tensor(returns.tolist())
        metrics["value/explained_var"] = float(explained_variance(predicted, target))
    return metrics


def episode_table(episodes: Sequence[Any]) -> torch.Tensor:
    """(N, 3) float64 rows of finished episodes: return, length, success (1, 0 or NaN)."""
    rows = [
        [e.episode_return, e.length, math.nan if e.success is None else float(e.success)]
        for e in episodes
    ]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 3)


def episode_metrics(table: torch.Tensor) -> dict[str, float]:
    """Return mean and std, mean length and success rate (where reported) of an episode table.

    Example:
        >>> table = torch.tensor([[1.0, 2, 1], [0.0, 4, math.nan]], dtype=torch.float64)
        >>> sorted(episode_metrics(table).items())[:3]
        [('env/episode_length', 3.0), ('env/return_mean', 0.5), ('env/return_std', 0.5)]
        >>> episode_metrics(table)["env/success_rate"]  # the episode without a report is left out
        1.0
    """
    if not len(table):
        return {}
    returns, lengths, success = table.numpy().T
    metrics = {
        "env/return_mean": float(returns.mean()),
        "env/return_std": float(returns.std()),
        "env/episode_length": float(np.mean(lengths)),
    }
    success = success[~np.isnan(success)]
    if len(success):
        metrics["env/success_rate"] = float(np.mean(success))
    return metrics


OUTCOMES = ("win", "draw", "loss")


def game_records(episodes: Sequence[Any]) -> list[tuple[str | None, str]]:
    """``(opponent, outcome)`` of the episodes that report an outcome (multi-player games)."""
    return [
        (e.opponent, e.outcome)
        for e in episodes
        if getattr(e, "outcome", None) in OUTCOMES  # an unknown result is left out
    ]


def opponent_kind(opponent: str | None) -> str:
    """The kind of an opponent name: the part before ``":"`` (``"selfplay:12"`` → ``"selfplay"``).

    Example:
        >>> opponent_kind("selfplay:12"), opponent_kind("random"), opponent_kind(None)
        ('selfplay', 'random', 'unknown')
    """
    return "unknown" if opponent is None else opponent.split(":", 1)[0]


def game_metrics(games: Sequence[tuple[str | None, str]]) -> dict[str, float]:
    """Win, draw and loss rates of finished games, overall and per opponent kind.

    ``env/win_rate``, ``env/draw_rate``, ``env/loss_rate`` over all games, and
    ``env/win_rate/<kind>`` (and draw, loss, ``env/games/<kind>``) per :func:`opponent_kind`.
    Nothing when no game finished.

    Example:
        >>> games = [("random", "win"), ("random", "loss"), ("selfplay:4", "draw")]
        >>> m = game_metrics(games)
        >>> m["env/win_rate"], m["env/win_rate/random"], m["env/draw_rate/selfplay"]
        (0.3333333333333333, 0.5, 1.0)
    """
    if not games:
        return {}
    groups: dict[str, list[str]] = {"": [outcome for _, outcome in games]}
    for opponent, outcome in games:
        groups.setdefault("/" + opponent_kind(opponent), []).append(outcome)
    metrics: dict[str, float] = {}
    for suffix, outcomes in groups.items():
        for outcome in OUTCOMES:
            metrics[f"env/{outcome}_rate{suffix}"] = outcomes.count(outcome) / len(outcomes)
        if suffix:
            metrics[f"env/games{suffix}"] = float(len(outcomes))
    return metrics


def gathered_games(process: Any, episodes: Sequence[Any]) -> list[tuple[str | None, str]]:
    """Every process's :func:`game_records`, in rank order: a run's game metrics are global.

    ``process`` is a :mod:`textgym_agents.distributed` handle (``trainer.process``).
    """
    parts = process.gather_bytes(json.dumps(game_records(episodes)).encode())
    return [(opponent, outcome) for part in parts for opponent, outcome in json.loads(part)]
