"""Learning curves: one subplot per metric, one line per run, from ``metrics.jsonl`` files."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textgym_agents.runfiles.atomic import atomic_write_bytes
from textgym_agents.tracking.metrics_log import METRICS_FILE, read_metrics

__all__ = [
    "EVALUATIONS_FILE",
    "curve_settings",
    "learning_curve_figure",
    "plot_learning_curves",
    "plot_run",
    "png_bytes",
    "write_evaluations",
]

EVALUATIONS_FILE = "evaluations.json"
"""Greedy evaluations of a run (``textgym train``'s before and after), drawn on its curve."""
_X_LABELS = {"step": "update", "env/episodes": "training episodes"}
_EVALUATED = {  # curve metric -> (evaluation value, its standard error)
    "env/return_mean": ("mean_return", "se"),
    "env/success_rate": ("success_rate", "success_se"),
    "env/invalid_rate": ("invalid_rate", None),
}


def _moving_average(ys: np.ndarray, window: int) -> np.ndarray:
    # Trailing mean over the last `window` points (fewer at the start) so curves keep their length.
    cumsum = np.concatenate([[0.0], np.cumsum(ys)])
    end = np.arange(1, len(ys) + 1)
    start = np.maximum(end - window, 0)
    return (cumsum[end] - cumsum[start]) / (end - start)


def _series(records: list[dict[str, Any]], x_key: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [
        (r[x_key], r[key]) for r in records if r.get(x_key) is not None and r.get(key) is not None
    ]
    points.sort(key=lambda p: p[0])  # stable, so a resumed run with repeated steps stays ordered
    return np.array([x for x, _ in points], float), np.array([y for _, y in points], float)


def _run_dir(run: str | os.PathLike[str]) -> Path:
    """The run directory of a run given as its directory or its ``metrics.jsonl``."""
    path = Path(run).resolve()
    return path.parent if path.name == METRICS_FILE else path


def _default_label(run: str | os.PathLike[str]) -> str:
    return _run_dir(run).name


def plot_learning_curves(
    runs: Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    keys: Sequence[str] = ("env/return_mean", "env/invalid_rate"),
    labels: Sequence[str] | None = None,
    smooth: int = 1,
    references: Mapping[str, float | Mapping[str, float]] | None = None,
    x_key: str = "step",
) -> Path:
    """Draw one subplot per metric and one line per run into a PNG (written atomically).

    The x axis is ``"step"`` (the update counter, in every line) unless ``x_key`` names another
    logged value: ``x_key="env/episodes"`` compares runs that collect different amounts of
    experience per update, and shows their greedy evaluations (:data:`EVALUATIONS_FILE`).
    Missing metrics are noted in the subplot instead of failing.

    Args:
        runs: Run directories or ``metrics.jsonl`` files.
        out_path: Where to write the PNG.
        keys: Metrics to draw, one subplot each.
        labels: Legend names, one per run; defaults to the run directory names.
        smooth: Trailing moving-average window (1 = raw values).
        references: Horizontal reference lines per metric: a value, or a mapping from a
            label to a value (e.g. ``{"random": -0.39, "basic strategy": -0.045}``).
        x_key: The logged value used as x.

    Example:
        >>> import tempfile, pathlib
        >>> from textgym_agents.tracking.metrics_log import MetricsLogger
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     for step in range(5):
        ...         m.log({"env/return_mean": step**0.5}, step=step)
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "curves.png"
        >>> plot_learning_curves([m.run_dir], out, smooth=2).read_bytes()[1:4]
        b'PNG'
    """
    fig = learning_curve_figure(runs, keys, labels, smooth, references, x_key)
    out_path = Path(out_path)
    atomic_write_bytes(out_path, png_bytes(fig))
    return out_path


def png_bytes(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def learning_curve_figure(
    runs: Sequence[str | os.PathLike[str]],
    keys: Sequence[str] = ("env/return_mean", "env/invalid_rate"),
    labels: Sequence[str] | None = None,
    smooth: int = 1,
    references: Mapping[str, float | Mapping[str, float]] | None = None,
    x_key: str = "step",
) -> Any:
    """The figure :func:`plot_learning_curves` saves: a ``matplotlib.figure.Figure``.

    Example:
        >>> import tempfile
        >>> from textgym_agents.tracking.metrics_log import MetricsLogger
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     m.log({"env/episodes": 4, "env/return_mean": 0.5}, step=1)
        >>> fig = learning_curve_figure([m.run_dir], ["env/return_mean"], x_key="env/episodes")
        >>> [ax.get_xlabel() for ax in fig.axes]
        ['training episodes']
    """
    from matplotlib.figure import Figure  # no pyplot: leaves the global backend alone
    from matplotlib.ticker import MaxNLocator

    if not runs:
        raise ValueError("Expected at least one run directory or metrics file, got none")
    if not keys:
        raise ValueError("Expected at least one metric key to plot, got none")
    if smooth < 1:
        raise ValueError(f"Expected smooth >= 1 (1 = no smoothing), got {smooth}")
    labels = [_default_label(run) for run in runs] if labels is None else list(labels)
    if len(labels) != len(runs):
        raise ValueError(f"Expected {len(runs)} labels (one per run), got {len(labels)}")
    data = [read_metrics(run) for run in runs]
    evaluations = [_read_evaluations(run) for run in runs]
    references = references or {}
    ncols = min(len(keys), 2)
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(5.5 * ncols, 3.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, key in zip(axes, keys, strict=False):
        missing = []
        for i, (records, label) in enumerate(zip(data, labels, strict=True)):
            xs, ys = _series(records, x_key, key)
            if len(xs) == 0:
                missing.append(label)
                continue
            # A fixed colour per run keeps runs recognisable across subplots with gaps.
            marker = "o" if len(xs) <= 40 else None  # a short run's single updates stay visible
            ys = _moving_average(ys, smooth)
            ax.plot(xs, ys, color=f"C{i % 10}", marker=marker, markersize=3, label=label)
        for i, points in enumerate(evaluations):
            _draw_evaluations(ax, points, key, x_key, f"C{i % 10}")
        lines = references.get(key, {})
        if not isinstance(lines, Mapping):
            lines = {"reference": lines}
        for j, (name, value) in enumerate(lines.items()):
            style = ("--", ":", "-.")[j % 3]
            ax.axhline(value, linestyle=style, color="0.45", label=f"{name} ({value:g})")
        if missing:
            note = f"no '{key}' in: " + ", ".join(missing)
            where = (0.5, 0.5, "center") if len(missing) == len(runs) else (0.02, 0.02, "left")
            ax.text(
                *where[:2],
                note,
                transform=ax.transAxes,
                ha=where[2],
                fontsize="small",
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
            )
        suffix = f" (moving average of {smooth})" if smooth > 1 else ""
        ax.set_title(key + suffix)
        ax.set_xlabel(_X_LABELS.get(x_key, x_key))
        ax.set_ylabel(key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates and episodes are whole
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)

    return fig


def write_evaluations(run_dir: str | os.PathLike[str], points: Sequence[Mapping[str, Any]]) -> Path:
    """Write a run's greedy evaluations (:data:`EVALUATIONS_FILE`) for :func:`plot_run`.

    Each point holds ``name``, ``episodes`` (training episodes done when it was measured),
    ``mean_return`` and ``se``, and where the env has them ``success_rate``, ``success_se``
    and ``invalid_rate``.
    """
    from textgym_agents.runfiles.atomic import atomic_write_json

    path = Path(run_dir) / EVALUATIONS_FILE
    atomic_write_json(path, [dict(point) for point in points])
    return path


def plot_run(run_dir: str | os.PathLike[str]) -> Path:
    """A run's ``learning_curve.png``: return, success and invalid rates against episodes.

    Only the metrics the run logged get a subplot; the greedy evaluations of
    :data:`EVALUATIONS_FILE`, where there are any, are drawn as points with standard-error bars.

    Example:
        >>> import tempfile
        >>> from textgym_agents.tracking.metrics_log import MetricsLogger
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     for step in range(1, 4):
        ...         m.log({"env/episodes": 4 * step, "env/return_mean": step / 3}, step=step)
        >>> _ = write_evaluations(m.run_dir, [{"name": "base model", "episodes": 0,
        ...                                    "mean_return": 0.1, "se": 0.05}])
        >>> plot_run(m.run_dir).name
        'learning_curve.png'
    """
    run_dir = Path(run_dir)
    keys, x_key = curve_settings([run_dir])
    return plot_learning_curves([run_dir], run_dir / "learning_curve.png", keys, x_key=x_key)


def curve_settings(runs: Sequence[str | os.PathLike[str]]) -> tuple[list[str], str]:
    """The metrics and x axis a run's curve shows: what the runs logged, against episodes.

    Keys: the return, success rate and invalid-reply rate, those that any run logged (the
    return alone if none). X: ``env/episodes`` when every run logged it, else ``step``.

    Example:
        >>> import tempfile
        >>> from textgym_agents.tracking.metrics_log import MetricsLogger
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     m.log({"env/episodes": 4, "env/return_mean": 0.5, "env/invalid_rate": 0}, step=1)
        >>> curve_settings([m.run_dir])
        (['env/return_mean', 'env/invalid_rate'], 'env/episodes')
    """
    data = [read_metrics(run) for run in runs]
    keys = [k for k in _EVALUATED if any(r.get(k) is not None for rs in data for r in rs)]
    by_episodes = all(any(r.get("env/episodes") is not None for r in rs) for rs in data)
    return keys or ["env/return_mean"], "env/episodes" if by_episodes else "step"


def _read_evaluations(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = _run_dir(run) / EVALUATIONS_FILE
    try:
        points = json.loads(path.read_text())
    except (OSError, ValueError):  # none, or unreadable: the curve alone
        return []
    return [p for p in points if isinstance(p, dict)] if isinstance(points, list) else []


def _draw_evaluations(
    ax: Any, points: list[dict[str, Any]], key: str, x_key: str, color: str
) -> None:
    """Greedy evaluations as points with standard-error bars (x: training episodes done)."""
    if key not in _EVALUATED or x_key != "env/episodes":
        return
    value, error = _EVALUATED[key]
    shown = [p for p in points if isinstance(p.get(value), int | float)]
    if not shown:
        return
    xs = [float(p.get("episodes", 0)) for p in shown]
    ys = [float(p[value]) for p in shown]
    errors = [float(p.get(error) or 0.0) if error else 0.0 for p in shown]
    ax.errorbar(xs, ys, yerr=errors, fmt="D", color=color, capsize=4, label="greedy evaluation")
