"""Metrics for training runs: one JSON line per update in ``run_dir/metrics.jsonl``.

TensorBoard and Weights & Biases are optional mirrors; :func:`plot_learning_curves` draws runs.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textgym_agents.atomic import atomic_write_bytes

__all__ = [
    "METRICS_FILE",
    "REPORT_TO",
    "MetricsLogger",
    "episode_metrics",
    "episode_table",
    "plot_learning_curves",
    "read_metrics",
    "turn_metrics",
    "turn_table",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
REPORT_TO = ("jsonl", "tensorboard", "wandb")
_RESERVED = ("step", "time")


def _scalar(name: str, value: Any) -> bool | int | float | None:
    if not isinstance(value, (bool, int, float)) and hasattr(value, "item"):
        try:  # numpy and torch scalars, and one-element arrays/tensors
            value = value.item()
        except (ValueError, RuntimeError) as e:
            raise TypeError(f"Metric {name!r} must be a scalar, got {value!r}") from e
    if isinstance(value, float) and not math.isfinite(value):
        return None  # keeps the file valid JSON; readers see null
    if isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"Metric {name!r} must be a number, got {type(value).__name__}")


def _parse_lines(lines: list[bytes], source: Path) -> list[tuple[dict[str, Any], bytes]]:
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    parsed = []
    for i, line in enumerate(lines[: last + 1]):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if i == last:  # a run killed mid-write leaves a partial last line
                logger.warning("%s: skipping truncated last line %d", source, i + 1)
                break
            raise ValueError(f"{source}:{i + 1}: invalid metrics line: {e}") from e
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{source}:{i + 1}: expected an object with a 'step', got {line!r}")
        parsed.append((record, line))
    return parsed


def read_metrics(run_dir_or_file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` (or a run directory holding one); non-finite values are None.

    A truncated last line (a killed run) is skipped with a warning; other bad lines raise.

    Example:
        >>> import tempfile
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     m.log({"loss": 0.5}, step=1)
        >>> [(r["step"], r["loss"]) for r in read_metrics(m.run_dir)]
        [(1, 0.5)]
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / METRICS_FILE
    return [record for record, _ in _parse_lines(path.read_bytes().splitlines(), path)]


class MetricsLogger:
    """Append metrics to ``run_dir/metrics.jsonl`` and mirror them to TensorBoard or W&B.

    Args:
        run_dir: The run directory; created if missing. An existing ``metrics.jsonl`` is
            appended to (resume); a partial last line left by a killed run is dropped first.
        report_to: Any of ``"jsonl"``, ``"tensorboard"`` (``run_dir/tensorboard``) and
            ``"wandb"``. Missing optional packages are skipped with a warning.
        run_name: Name shown by W&B; defaults to the run directory's name.
        config: Hyper-parameters recorded by W&B (``config=``) and TensorBoard (text).

    Example:
        >>> import tempfile
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     m.log({"env/return_mean": 1.5, "loss": float("nan")}, step=1)
        >>> line = (m.run_dir / "metrics.jsonl").read_text()
        >>> '"env/return_mean": 1.5' in line, '"loss": null' in line
        (True, True)
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        report_to: Sequence[str] | str = ("jsonl",),
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        report_to = (report_to,) if isinstance(report_to, str) else tuple(report_to)
        unknown = [name for name in report_to if name not in REPORT_TO]
        if unknown:
            raise ValueError(f"Unknown report_to {unknown}; expected any of {list(REPORT_TO)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.run_name = run_name or self.run_dir.resolve().name
        self.config = dict(config or {})
        self._file: io.TextIOWrapper | None = None
        self._tb: Any = None
        self._wandb: Any = None
        self._closed = False
        if "jsonl" in report_to:
            self._drop_partial_line()
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if "tensorboard" in report_to:
            self._tb = self._open_tensorboard()
            if self._tb is not None and self.config:
                text = json.dumps(self.config, indent=2, default=str)
                self._tb.add_text("config", "    " + text.replace("\n", "\n    "))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                logger.warning(
                    "report_to='wandb' skipped: wandb is not installed (pip install wandb)"
                )
            else:
                self._wandb = wandb.init(
                    name=self.run_name, config=self.config, dir=str(self.run_dir)
                )

    def _open_tensorboard(self, purge_step: int | None = None) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.warning(
                "report_to='tensorboard' skipped: tensorboard is not installed "
                "(pip install tensorboard)"
            )
            return None
        return SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge_step)

    def _drop_partial_line(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            logger.warning("%s: dropping a truncated last line left by a killed run", self.path)
            os.truncate(self.path, keep)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (numbers, numpy/torch scalars) at ``step``; NaN/inf become null."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log() called after close()")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"Expected an int step, got {step!r}")
        clash = [key for key in _RESERVED if key in metrics]
        if clash:
            raise ValueError(f"Metric names {clash} are reserved; rename them")
        values = {str(key): _scalar(str(key), value) for key, value in metrics.items()}
        if self._file is not None:
            record = {"step": int(step), "time": time.time(), **values}
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()  # a killed run loses at most the line being written
        finite = {key: value for key, value in values.items() if value is not None}
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, int(step))
        if self._wandb is not None:
            self._wandb.log(finite, step=int(step))

    def truncate_after(self, step: int) -> int:
        """Drop lines with a step greater than ``step`` (resuming from an earlier checkpoint).

        The file is rewritten atomically; TensorBoard is told to purge events after ``step``.
        W&B history cannot be rewritten: it ignores steps below the last one it saw.

        Returns:
            The number of lines dropped.
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.truncate_after() called after close()")
        dropped = 0
        if self._file is not None:
            self._file.close()
            parsed = _parse_lines(self.path.read_bytes().splitlines(), self.path)
            kept = [line + b"\n" for record, line in parsed if record["step"] <= step]
            dropped = len(parsed) - len(kept)
            atomic_write_bytes(self.path, b"".join(kept))
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        if self._tb is not None:
            self._tb.close()
            self._tb = self._open_tensorboard(purge_step=step + 1)
        return dropped

    def close(self) -> None:
        """Flush and close every backend; calling it twice is fine."""
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- what one update reports about the rollout: tables first, so processes can pool them ----


def turn_table(turns: Sequence[Any]) -> torch.Tensor:
    """(N, 6) float64 rows of scored turns: invalid, reward, reply tokens, value, return, KL."""
    rows = [[t.invalid, t.reward, len(t.response_ids), t.value, t.returns, t.kl] for t in turns]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 6)


def turn_metrics(table: torch.Tensor) -> dict[str, float]:
    """Invalid-reply rate, mean reward and reply length, value statistics of a :func:`turn_table`.

    Example:
        >>> table = torch.tensor([[0, 1.0, 3, 0.5, 1.0, 0.0], [1, -1.0, 5, 0.0, -1.0, 0.0]])
        >>> m = turn_metrics(table.double())
        >>> m["env/invalid_rate"], m["reply/tokens_mean"], m["value/explained_var"]
        (0.5, 4.0, 0.4375)
    """
    from textgym_agents.ppo.core import explained_variance

    invalid, reward, tokens, value, returns, _ = table.numpy().T
    values = torch.tensor(value.tolist())  # float32, as the value head computes them
    return {
        "env/invalid_rate": float(np.mean(invalid)),
        "env/reward_mean": float(np.mean(reward)),
        "reply/tokens_mean": float(np.mean(tokens)),
        "value/mean": float(values.mean()),
        "value/explained_var": float(explained_variance(values, torch.tensor(returns.tolist()))),
    }


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
