"""A training callback that scores the policy every so many episodes: a learning curve on disk.

Used by ``learning_suite.py`` and ``tictactoe.py``, with the two steps of a benchmark cell they
share: its config (:func:`cell_config`) and its resumable training (:func:`train_cell`). Each
point is one JSON line (``{"episodes": N, ...}``) appended to a file, so an interrupted run
that resumes from its checkpoint continues the same curve from its last point.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from textgym_agents import PPOConfig
from textgym_agents.runfiles.checkpoint import latest_checkpoint
from textgym_agents.tracking.metrics_log import read_metrics


class CurvePoints:
    """Call ``measure()`` once at least ``every`` training episodes passed since the last point.

    Args:
        path: The JSON-lines file of the points (read back to continue a resumed curve).
        every: Training episodes between points.
        measure: Scores the policy now; returns the point's fields.
        report: Called with the episodes done and the point (to print it), if given.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "curve.jsonl"
        >>> points = CurvePoints(path, 10, lambda: {"return": 1.0})
        >>> for done in (4, 12, 16, 25):
        ...     points({"env/episodes": done})
        >>> [json.loads(line)["episodes"] for line in path.read_text().splitlines()]
        [12, 25]
        >>> CurvePoints(path, 10, lambda: {}).last  # a resumed run continues from here
        25
        >>> CurvePoints(path, 10, lambda: {}).point  # and knows its last point
        {'episodes': 25, 'return': 1.0}
    """

    def __init__(
        self,
        path: str | Path,
        every: int,
        measure: Callable[[], dict[str, Any]],
        report: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.every = every
        self.measure = measure
        self.report = report
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        self.point: dict[str, Any] | None = json.loads(lines[-1]) if lines else None

    @property
    def last(self) -> int:
        """Training episodes at the last point (0 before the first)."""
        return self.point["episodes"] if self.point else 0

    def __call__(self, metrics: dict[str, float]) -> None:
        """The trainer's callback: score the policy if a point is due."""
        done = int(metrics["env/episodes"])
        if done < self.last + self.every:
            return
        found = self.measure()
        self.point = {"episodes": done, **found}
        with self.path.open("a") as out:
            out.write(json.dumps(self.point) + "\n")
        if self.report is not None:
            self.report(done, found)


def cell_config(envs: Any, seed: int, estimator: str, group_size: int, settings: str) -> PPOConfig:
    """``textgym train``'s per-env defaults with the cell's seed, estimator and ``settings``.

    ``group_size`` applies to the group estimators (not ``"gae"``); ``settings`` is the JSON of
    further :class:`~textgym_agents.PPOConfig` fields, which win. A cell checkpoints after every
    update (``save_every`` 1): its updates take minutes, a checkpoint a second, and a session
    can end at any time.

    Example:
        >>> import gymnasium as gym, textgym
        >>> envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4)
        >>> config = cell_config(envs, 1, "gigpo", 4, '{"learning_rate": 1e-4}')
        >>> config.save_every, config.group_size, config.learning_rate
        (1, 4, 0.0001)
    """
    given: dict[str, Any] = {"seed": seed, "advantage_estimator": estimator, "save_every": 1}
    if estimator != "gae":
        given["group_size"] = group_size
    given.update(json.loads(settings))
    return PPOConfig.for_env(envs, **given, progress=False)


def train_cell(
    trainer: Any, run_dir: Path, episodes: int, curve: Callable[[dict[str, float]], None]
) -> tuple[dict[str, float], float, int]:
    """Train to ``episodes`` (resuming from ``run_dir``'s last checkpoint), scoring on ``curve``.

    Returns:
        The last metrics, the seconds of training over the whole run (the updates of every start,
        summed from the ``time/*`` columns of its ``metrics.jsonl``: the curve's evaluations
        left out) and the episodes the run has played.
    """
    resume = latest_checkpoint(run_dir) if run_dir.exists() else None
    metrics = trainer.train(episodes, resume_from=resume, callback=curve)
    return metrics, training_seconds(read_metrics(run_dir)), int(metrics["env/episodes"])


def training_seconds(rows: Iterable[Mapping[str, Any]]) -> float:
    """Seconds of training in a run's ``metrics.jsonl`` rows: their ``time/*`` columns summed.

    Example:
        >>> training_seconds([{"time/rollout_s": 2.0, "time/update_s": 3.0, "loss": 9.0}])
        5.0
    """
    return sum(
        value or 0.0 for row in rows for key, value in row.items() if key.startswith("time/")
    )
