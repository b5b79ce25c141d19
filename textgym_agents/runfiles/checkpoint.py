"""Durable, pickle-free checkpoint files: tensors go to safetensors, everything else to JSON.

Every write is atomic (:mod:`textgym_agents.runfiles.atomic`: temp file or directory, fsync,
rename), so a killed run leaves either the previous checkpoint or the new one, never a half-written
file at a name that is read back. The manifest, written last, lists every file with its size and
SHA-256 hash (:mod:`textgym_agents.runfiles.integrity`): a checkpoint damaged later (a partial copy,
a full disk, bit rot) is recognised and skipped for the newest intact one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from textgym_agents.exceptions import CheckpointError
from textgym_agents.runfiles.atomic import (
    atomic_directory,
    atomic_write_json,
    load_tensors,
    remove_path,
    save_tensors,
)
from textgym_agents.runfiles.integrity import confined, file_listing, find_damage
from textgym_agents.runfiles.state_files import (
    optimizer_state_from_files,
    optimizer_state_to_files,
    rng_state,
    set_rng_state,
    state_from_files,
    state_to_files,
)

__all__ = [
    "check_intact",
    "checkpoint_damage",
    "checkpoint_dirs",
    "default_run_dir",
    "discard_checkpoints_after",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "optimizer_state_from_files",
    "optimizer_state_to_files",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "state_from_files",
    "state_to_files",
]

logger = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
_STEP_DIR = re.compile(r"step_(\d{8,})")
_LEFTOVER = re.compile(r"step_\d{8,}\.(tmp|old)-.*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _check_names(kind: str, names: Iterable[str]) -> None:
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{kind} names must match {_NAME.pattern!r} (they become file names), got {name!r}"
            )


def default_run_dir(env_id: str | None) -> Path:
    """``runs/<env>-<date>-<time>``: where a run goes when no output directory is given.

    ``env_id`` is a Gymnasium id (a ``module:`` prefix is dropped, ``/`` becomes ``-``); None
    names the run ``run``.

    Example:
        >>> path = default_run_dir("my_package:textgym/Blackjack-v1")
        >>> path.parent.name, path.name.startswith("textgym-Blackjack-v1-")
        ('runs', True)
    """
    name = env_id.split(":")[-1].replace("/", "-") if env_id else "run"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    *,
    tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    json_files: Mapping[str, Any] | None = None,
    keep: int | None = 3,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Atomically write ``run_dir/checkpoints/step_{step:08d}/`` and keep the newest ``keep``.

    Each entry of ``tensors`` becomes ``name.safetensors``, each of ``json_files`` ``name.json``;
    ``extra(tmp_dir)`` may write more files (e.g. a peft adapter) before the directory is
    renamed into place. A ``checkpoint.json`` manifest, written last, lists them with every
    file's size and SHA-256 hash (see :func:`checkpoint_damage`). Re-saving a step replaces it.
    Pruning never removes the checkpoint just written. Assumes one writer per run directory:
    it deletes leftovers of crashed saves. Later steps are not removed; when resuming from an
    earlier checkpoint, call :func:`discard_checkpoints_after` first.

    Example:
        >>> import tempfile, torch
        >>> run = tempfile.mkdtemp()
        >>> path = save_checkpoint(run, 7, tensors={"model": {"w": torch.ones(2)}},
        ...                        json_files={"trainer": {"step": 7}})
        >>> path.name, latest_checkpoint(run) == path
        ('step_00000007', True)
        >>> tensors, jsons = load_checkpoint(path); jsons
        {'trainer': {'step': 7}}
    """
    tensors, json_files = tensors or {}, json_files or {}
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"Expected a non-negative int step, got {step!r}")
    if keep is not None and keep < 1:
        raise ValueError(f"Expected keep >= 1 or None (keep all), got {keep!r}")
    _check_names("tensors", tensors)
    _check_names("json_files", json_files)
    if MANIFEST.removesuffix(".json") in json_files:
        raise ValueError(f"json_files name 'checkpoint' is reserved for the {MANIFEST} manifest")
    ckpt_dir = Path(run_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for leftover in ckpt_dir.iterdir():
        if _LEFTOVER.fullmatch(leftover.name):
            logger.warning("Removing %s left by an interrupted checkpoint save", leftover)
            remove_path(leftover)
    path = ckpt_dir / f"step_{step:08d}"
    with atomic_directory(path) as tmp:
        for name, group in tensors.items():
            save_tensors(tmp / f"{name}.safetensors", group)
        for name, obj in json_files.items():
            atomic_write_json(tmp / f"{name}.json", obj)
        if extra is not None:
            extra(tmp)
        manifest = {
            "step": step,
            "tensors": sorted(tensors),
            "json": sorted(json_files),
            "files": file_listing(tmp, exclude={MANIFEST}),
        }
        atomic_write_json(tmp / MANIFEST, manifest)
    if keep is not None:
        for old in list_checkpoints(run_dir)[:-keep]:
            if old != path:
                try:  # the new checkpoint is complete: failing to prune it must not stop a run
                    _delete_checkpoint(old)
                except OSError as e:
                    logger.warning("Could not remove the old checkpoint %s: %s", old, e)
    return path


def _delete_checkpoint(path: Path) -> None:
    # Rename first so a crash mid-delete never leaves a partial directory under a valid name.
    aside = path.with_name(f"{path.name}.old-{secrets.token_hex(4)}")
    os.rename(path, aside)
    shutil.rmtree(aside)


def checkpoint_dirs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every ``step_N`` directory of a run, complete or not, oldest step first."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP_DIR.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Return the complete checkpoints of a run, oldest step first (temp/aside dirs ignored).

    Complete means its manifest exists; :func:`checkpoint_damage` checks the files themselves.
    """
    return [p for p in checkpoint_dirs(run_dir) if (p / MANIFEST).is_file()]


def _read_manifest(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if not (path / MANIFEST).is_file():
        return None, f"{MANIFEST} is missing (an incomplete save or copy)"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{MANIFEST} is unreadable ({e})"
    if not isinstance(manifest, dict) or not all(
        isinstance(manifest.get(key), list) for key in ("tensors", "json")
    ):
        return None, f"{MANIFEST} does not list the checkpoint's tensors and JSON files"
    for name in manifest["tensors"] + manifest["json"]:
        if not isinstance(name, str) or "/" in name or confined(path, name) is None:
            return None, f"{MANIFEST} names {name!r}, which is not a file inside {path}"
    return manifest, None


def checkpoint_damage(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with a checkpoint directory, in words, or None if it is intact.

    Checks the manifest, then each listed file's size and SHA-256 hash. A checkpoint written
    before hashes were recorded is checked for the files its manifest names.

    Example:
        >>> import tempfile, torch
        >>> run = tempfile.mkdtemp()
        >>> path = save_checkpoint(run, 1, tensors={"model": {"w": torch.ones(4)}})
        >>> checkpoint_damage(path) is None
        True
        >>> with open(path / "model.safetensors", "r+b") as f:
        ...     _ = f.truncate(10)
        >>> checkpoint_damage(path)
        'model.safetensors is 10 bytes, expected 80 (truncated or replaced)'
    """
    path = Path(path)
    manifest, problem = _read_manifest(path)
    if manifest is None:
        return problem
    if "files" in manifest:
        return find_damage(path, manifest["files"])
    names = [f"{n}.safetensors" for n in manifest["tensors"]]
    names += [f"{n}.json" for n in manifest["json"]]
    missing = [name for name in names if not (path / name).is_file()]
    return f"{missing[0]} is missing" if missing else None


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """Return the newest intact checkpoint of a run, or None if it has no checkpoint at all.

    A damaged or incomplete newer checkpoint is skipped with a warning naming the file and the
    reason (see :func:`checkpoint_damage`).

    Raises:
        CheckpointError: The run has checkpoints but none of them is intact.
    """
    problems = []
    for path in reversed(checkpoint_dirs(run_dir)):
        problem = checkpoint_damage(path)
        if problem is None:
            if problems:
                logger.warning("Using %s, the newest intact checkpoint", path.name)
            return path
        logger.warning("Skipping damaged checkpoint %s: %s", path, problem)
        problems.append(f"{path.name}: {problem}")
    if problems:
        raise CheckpointError(
            f"No intact checkpoint in {Path(run_dir) / 'checkpoints'}: " + "; ".join(problems)
        )
    return None


def discard_checkpoints_after(run_dir: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete checkpoints with a step greater than ``step`` (resuming from an earlier one)."""
    removed = [p for p in checkpoint_dirs(run_dir) if int(p.name.split("_")[1]) > step]
    for path in removed:
        _delete_checkpoint(path)
    return removed


def check_intact(path: str | os.PathLike[str]) -> None:
    """Raise :class:`CheckpointError` naming the file and the reason if ``path`` is damaged.

    Example:
        >>> check_intact("no/such/checkpoint")
        Traceback (most recent call last):
        ...
        textgym_agents.exceptions.CheckpointError: Checkpoint no/such/checkpoint is damaged: ...
    """
    problem = checkpoint_damage(path)
    if problem is not None:
        raise CheckpointError(f"Checkpoint {path} is damaged: {problem}")


def load_checkpoint(
    path: str | os.PathLike[str], *, verified: bool = False
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """Read the tensors and JSON files listed in a checkpoint's manifest (extras are not read).

    Args:
        path: The checkpoint directory.
        verified: The caller has just checked every file against the manifest
            (:func:`check_intact`): do not hash them again.

    Raises:
        FileNotFoundError: ``path`` has no manifest (it is not a checkpoint).
        CheckpointError: The checkpoint is damaged; the message names the file and the reason.
    """
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint: {MANIFEST} is missing")
    if not verified:
        check_intact(path)
    manifest, _ = _read_manifest(path)
    assert manifest is not None  # checked above
    try:
        tensors = {n: load_tensors(path / f"{n}.safetensors") for n in manifest["tensors"]}
        jsons = {n: json.loads((path / f"{n}.json").read_text()) for n in manifest["json"]}
    except Exception as e:  # a file damaged in a way its listing cannot tell (an old manifest)
        raise CheckpointError(f"Checkpoint {path} cannot be read: {e}") from e
    return tensors, jsons
