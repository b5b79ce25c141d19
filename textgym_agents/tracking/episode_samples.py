"""A few training episodes per update, turn by turn, in ``run_dir/episodes.jsonl``.

What the model saw, what it replied, whether the env parsed it, the reward and the advantage
each turn got; capped in bytes per record and per file, keeping the first and latest updates.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textgym_agents.runfiles.atomic import atomic_write_bytes, open_log_file, read_fd

__all__ = [
    "EPISODES_FILE",
    "MAX_FILE_BYTES",
    "MAX_RECORD_BYTES",
    "EpisodeSampleLog",
    "fit_record",
    "read_episode_samples",
    "sample_episodes",
]

logger = logging.getLogger(__name__)

EPISODES_FILE = "episodes.jsonl"
MAX_RECORD_BYTES = 32 * 1024
"""Largest record (one episode): longer texts are cut, then middle turns are left out."""
MAX_FILE_BYTES = 8 * 1024 * 1024
"""Largest ``episodes.jsonl``: past it, middle updates are dropped (first and latest kept)."""
_CUT_LENGTHS = (4096, 1024, 256, 64)  # characters a text keeps, tried in turn


def sample_episodes(
    streams: Mapping[int, Sequence[Any]],
    k: int,
    rng: np.random.Generator,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Up to ``k`` episodes of a rollout's turns as JSON-ready records.

    A stream's turns are cut into episodes where a turn ends one; whole episodes (first turn
    to last) are picked before pieces cut by the rollout's start or end. Turns without
    :class:`~textgym_agents.ppo.buffer.TurnText` (a buffer filled by hand) are never picked.

    Args:
        streams: The buffer's turns per env (``RolloutBuffer.streams``), with advantages.
        k: Episodes to pick.
        rng: Picks them; pass a generator of its own so that training's draws do not change.
        **fields: Added to every record (``update``, ``episodes_done``).

    Example:
        >>> from textgym_agents.ppo.buffer import Turn, TurnText
        >>> seen = [{"role": "user", "content": "2+2?"}]
        >>> turn = Turn([1], [2], reward=1.0, terminated=True, text=TurnText(seen, "4"))
        >>> turn.advantage = 0.5
        >>> (record,) = sample_episodes({0: [turn]}, 2, np.random.default_rng(0), update=1)
        >>> record["update"], record["complete"], record["turns"][0]["reply"]
        (1, True, '4')
    """
    pieces = []
    for env_index, turns in sorted(streams.items()):
        piece: list[Any] = []
        for turn in turns:
            piece.append(turn)
            if turn.done:
                pieces.append((env_index, piece))
                piece = []
        if piece:
            pieces.append((env_index, piece))
    pieces = [(i, p) for i, p in pieces if all(t.text is not None for t in p)]
    whole = [(i, p) for i, p in pieces if p[0].text.index == 0 and p[-1].done]
    rest = [(i, p) for i, p in pieces if not (p[0].text.index == 0 and p[-1].done)]
    picked = []
    for group in (whole, rest):
        take = min(k - len(picked), len(group))
        if take > 0:
            picked += [group[j] for j in sorted(rng.choice(len(group), take, replace=False))]
    return [_record(env_index, piece, fields) for env_index, piece in picked]


def _record(env_index: int, turns: list[Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    rows = []
    for turn in turns:
        text = turn.text
        messages = _messages(text.messages)
        row: dict[str, Any] = {"turn": text.index}
        if text.index == 0 or not rows:  # the first turn shows the whole prompt
            row["messages"] = messages
        else:  # later ones what is new: the last user message
            row["messages"] = [m for m in messages if m["role"] == "user"][-1:] or messages[-1:]
        row.update(
            reply=str(text.reply),
            invalid=bool(turn.invalid),
            parse_error=None if text.parse_error is None else str(text.parse_error),
            reward=float(turn.reward),
            advantage=float(turn.advantage),
        )
        rows.append(row)
    return {
        **fields,
        "env_index": int(env_index),
        "complete": turns[0].text.index == 0 and turns[-1].done,
        "return": float(sum(t.reward for t in turns)),
        "turns": rows,
    }


def _messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages as ``role``/``content`` strings; a plain prompt is one user message."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    out = []
    for message in messages:
        if isinstance(message, Mapping):
            out.append({"role": str(message.get("role")), "content": str(message.get("content"))})
        else:
            out.append({"role": "user", "content": str(message)})
    return out


def fit_record(record: dict[str, Any], max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """One JSON line of at most ``max_bytes``: long texts are cut, then middle turns.

    A cut text ends in ``… [N characters cut]``; left-out turns are counted in
    ``turns_cut``. A record that still does not fit keeps its fields and no turns.

    Example:
        >>> record = {"update": 1, "turns": [{"reply": "x" * 10_000}]}
        >>> line = fit_record(record, max_bytes=2_000)
        >>> len(line) <= 2_000, b"characters cut]" in line
        (True, True)
    """
    line = _line(record)
    for limit in _CUT_LENGTHS:
        if len(line) <= max_bytes:
            return line
        line = _line(_cut_texts(record, limit))
    record = _cut_texts(record, _CUT_LENGTHS[-1])
    turns = record.get("turns", [])
    for keep in range(len(turns) - 1, -1, -1):  # the first turn and the latest ones
        if len(line) <= max_bytes:
            return line
        kept = turns[:1] + turns[len(turns) - keep + 1 :] if keep else []
        line = _line({**record, "turns": kept, "turns_cut": len(turns) - len(kept)})
    return line


def _line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def _cut_texts(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"… [{len(value) - limit} characters cut]"
    if isinstance(value, Mapping):
        return {key: _cut_texts(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_texts(item, limit) for item in value]
    return value


class EpisodeSampleLog:
    """Appends episode records to ``run_dir/episodes.jsonl`` within a size cap.

    Past ``max_bytes`` the file is rewritten (atomically) with the first records up to half
    the cap and the latest ones up to a quarter of it, so the first updates stay comparable
    with the latest and rewrites are rare. The file is opened without following a link. A
    failed write logs a warning and stops the log; training goes on.

    Args:
        run_dir: The run directory; an existing file is appended to (resume).
        max_bytes: The file's cap.
        max_record_bytes: Each record's cap (see :func:`fit_record`).

    Example:
        >>> import tempfile
        >>> log = EpisodeSampleLog(tempfile.mkdtemp(), max_bytes=400, max_record_bytes=100)
        >>> for update in range(1, 31):
        ...     log.append([{"update": update, "turns": []}])
        >>> [r["update"] for r in read_episode_samples(log.path.parent)]
        [1, 2, 3, 4, 5, 6, 7, 28, 29, 30]
        >>> log.close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        max_bytes: int = MAX_FILE_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if not 0 < max_record_bytes <= max_bytes // 4:
            raise ValueError(
                f"Expected 0 < max_record_bytes <= max_bytes / 4, got {max_record_bytes} and "
                f"{max_bytes}"
            )
        self.path = Path(run_dir) / EPISODES_FILE
        self.max_bytes = max_bytes
        self.max_record_bytes = max_record_bytes
        self._fd: int | None = None
        self._updates: list[int] = []  # the update of each line in the file
        self._size = 0
        self._failed = False
        self._try(self._open, "open")

    def _open(self) -> None:
        self._fd, data = open_log_file(self.path)
        self._updates = [_update_of(line) for line in data.splitlines()]
        self._size = len(data)

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Write ``records`` (one line each, capped), dropping middle lines past the cap."""
        if self._failed or self._fd is None:
            return
        lines = [fit_record(dict(r), self.max_record_bytes) for r in records]
        self._try(lambda: self._append(lines), "write")

    def _append(self, lines: list[bytes]) -> None:
        new = sum(len(line) for line in lines)
        if self._size + new > self.max_bytes:
            self._rewrite(self._read_lines() + lines)
            return
        os.write(self._fd, b"".join(lines))  # type: ignore[arg-type]
        self._updates += [_update_of(line) for line in lines]
        self._size += new

    def _read_lines(self) -> list[bytes]:
        os.lseek(self._fd, 0, os.SEEK_SET)  # type: ignore[arg-type]
        data = read_fd(self._fd)  # type: ignore[arg-type]
        return [line + b"\n" for line in data.splitlines()]

    def _rewrite(self, lines: list[bytes]) -> None:
        head, size = 0, 0
        while head < len(lines) and size + len(lines[head]) <= self.max_bytes // 2:
            size += len(lines[head])
            head += 1
        tail, size = len(lines), 0
        while tail > head and size + len(lines[tail - 1]) <= self.max_bytes // 4:
            size += len(lines[tail - 1])
            tail -= 1
        self._replace(lines[:head] + lines[tail:])

    def _replace(self, lines: list[bytes]) -> None:
        atomic_write_bytes(self.path, b"".join(lines))
        self.close()
        self._open()

    def truncate_after(self, update: int) -> None:
        """Drop the records of updates after ``update`` (a run resumed from an earlier one)."""
        if self._failed or self._fd is None:
            return
        if any(u > update for u in self._updates):
            self._try(
                lambda: self._replace([x for x in self._read_lines() if _update_of(x) <= update]),
                "rewrite",
            )

    def _try(self, action: Any, what: str) -> None:
        try:
            action()
        except (OSError, ValueError) as e:
            self._failed = True
            logger.warning("Could not %s %s (%s); no more episode samples", what, self.path, e)
            self.close()

    def close(self) -> None:
        """Close the file; calling it twice is fine."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> EpisodeSampleLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _update_of(line: bytes) -> int:
    try:
        update = json.loads(line).get("update", 0)
    except (ValueError, AttributeError):
        return 0
    return update if isinstance(update, int) else 0


def read_episode_samples(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``run_dir/episodes.jsonl`` (none if it is missing); bad lines are skipped.

    Only JSON is parsed: nothing in the file is executed or imported.

    Example:
        >>> import tempfile
        >>> read_episode_samples(tempfile.mkdtemp())
        []
    """
    path = Path(run_dir) / EPISODES_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(data.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            logger.warning("%s:%d: skipping a line that is not JSON", path, number)
            continue
        if isinstance(record, dict) and isinstance(record.get("turns", []), list):
            records.append(record)
    return records
