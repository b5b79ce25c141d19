"""Tracking a training run: the metrics log, per-update rollout statistics, learning curves.

:mod:`.metrics_log` writes and reads ``metrics.jsonl`` (mirrored to TensorBoard / W&B),
:mod:`.rollout_stats` turns a rollout into metrics, :mod:`.plotting` draws runs.
"""

from textgym_agents.tracking.metrics_log import METRICS_FILE, REPORT_TO, MetricsLogger, read_metrics
from textgym_agents.tracking.plotting import plot_learning_curves, plot_run, write_evaluations
from textgym_agents.tracking.rollout_stats import (
    episode_metrics,
    episode_table,
    turn_metrics,
    turn_table,
)

__all__ = [
    "METRICS_FILE",
    "REPORT_TO",
    "MetricsLogger",
    "episode_metrics",
    "episode_table",
    "plot_learning_curves",
    "plot_run",
    "read_metrics",
    "turn_metrics",
    "turn_table",
    "write_evaluations",
]
