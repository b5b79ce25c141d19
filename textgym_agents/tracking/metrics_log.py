"""The metrics log of a training run: one JSON line per update in ``run_dir/metrics.jsonl``.

TensorBoard and Weights & Biases are optional mirrors; :func:`read_metrics` reads it back.
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

from textgym_agents.runfiles.atomic import atomic_write_bytes, open_log_file

__all__ = ["METRICS_FILE", "REPORT_TO", "MetricsLogger", "read_metrics"]

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
            self._file = self._open_for_append()
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

    def _open_for_append(self) -> io.TextIOWrapper:
        """Open ``metrics.jsonl`` to append, never through a link, after a torn last line.

        A writer killed mid-line leaves a partial last line: it is dropped before appending.
        """
        fd, _ = open_log_file(self.path)
        return open(fd, "a", encoding="utf-8", closefd=True)  # noqa: SIM115 - closed in close()

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
            self._file = self._open_for_append()
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
