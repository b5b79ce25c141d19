"""Tracking a training run: the metrics log, per-update rollout statistics, learning curves.

:mod:`.metrics_log` writes and reads ``metrics.jsonl`` (mirrored to TensorBoard / W&B),
:mod:`.rollout_stats` turns a rollout into metrics, :mod:`.plotting` draws runs,
:mod:`.episode_samples` keeps a few episodes per update and :mod:`.run_page` shows a run as
one HTML page. The names below are imported on first use (PEP 562), so reading a run
(``textgym view``) does not import the training stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textgym_agents.tracking.metrics_log import (
        METRICS_FILE,
        REPORT_TO,
        MetricsLogger,
        read_metrics,
    )
    from textgym_agents.tracking.plotting import plot_learning_curves, plot_run, write_evaluations
    from textgym_agents.tracking.rollout_stats import (
        episode_metrics,
        episode_table,
        turn_metrics,
        turn_table,
    )

_EXPORTS = {
    "METRICS_FILE": "textgym_agents.tracking.metrics_log",
    "REPORT_TO": "textgym_agents.tracking.metrics_log",
    "MetricsLogger": "textgym_agents.tracking.metrics_log",
    "read_metrics": "textgym_agents.tracking.metrics_log",
    "plot_learning_curves": "textgym_agents.tracking.plotting",
    "plot_run": "textgym_agents.tracking.plotting",
    "write_evaluations": "textgym_agents.tracking.plotting",
    "episode_metrics": "textgym_agents.tracking.rollout_stats",
    "episode_table": "textgym_agents.tracking.rollout_stats",
    "turn_metrics": "textgym_agents.tracking.rollout_stats",
    "turn_table": "textgym_agents.tracking.rollout_stats",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'textgym_agents.tracking' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once; later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
