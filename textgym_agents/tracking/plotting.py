"""Learning curves: one subplot per metric, one line per run, from ``metrics.jsonl`` files."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textgym_agents.runfiles.atomic import atomic_write_bytes
from textgym_agents.tracking.metrics_log import METRICS_FILE, read_metrics

__all__ = ["plot_learning_curves"]


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


def _default_label(run: str | os.PathLike[str]) -> str:
    path = Path(run).resolve()
    return path.parent.name if path.name == METRICS_FILE else path.name


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
    experience per update. Missing metrics are noted in the subplot instead of failing.

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
    from matplotlib.figure import Figure  # no pyplot: leaves the global backend alone

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
            ax.plot(xs, _moving_average(ys, smooth), color=f"C{i % 10}", label=label)
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
        ax.set_xlabel(x_key)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    out_path = Path(out_path)
    atomic_write_bytes(out_path, buffer.getvalue())
    return out_path
