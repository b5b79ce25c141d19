"""Durable, pickle-free checkpoint files: tensors go to safetensors, everything else to JSON.

Every write is atomic (:mod:`textgym_agents.atomic`: temp file or directory, fsync, rename), so
a killed run leaves either the previous checkpoint or the new one, never a half-written file at
a name that is read back. The manifest, written last, lists every file with its size and
SHA-256 hash (:mod:`textgym_agents.integrity`): a checkpoint damaged later (a partial copy, a
full disk, bit rot) is recognised and skipped for the newest intact one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textgym_agents.atomic import (
    atomic_directory,
    atomic_write_json,
    load_tensors,
    remove_path,
    save_tensors,
)
from textgym_agents.exceptions import CheckpointError
from textgym_agents.integrity import file_listing, find_damage

__all__ = [
    "check_intact",
    "checkpoint_damage",
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
_TAGS = ("__tuple__", "__tensor__", "__ndarray__", "__dict__")


def _encode(obj: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key, n = name or "tensor", 1
        while key in tensors:  # paths can collide when dict keys contain dots
            key, n = f"{name}#{n}", n + 1
        tensors[key] = obj
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype), "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, f"{name}.{i}".lstrip("."), tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{name}.{k}".lstrip("."), tensors) for k, v in obj.items()}
        return {
            "__dict__": [
                [_encode(k, "", {}), _encode(v, f"{name}.{k}".lstrip("."), tensors)]
                for k, v in obj.items()
            ]
        }
    raise TypeError(f"Cannot store {type(obj).__name__} at {name!r} without pickle")


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__ndarray__" in obj:
        return np.array(obj["__ndarray__"], dtype=obj["dtype"]).reshape(obj["shape"])
    if "__dict__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def state_to_files(state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a nested state (dicts, lists, tuples, numbers, tensors, arrays) into tensors + JSON.

    Tensors are named by their path (``"state.0.exp_avg"``); tuples, non-string dict keys and
    numpy arrays are tagged in the JSON so :func:`state_from_files` rebuilds the same types.

    Example:
        >>> import torch
        >>> tensors, meta = state_to_files({"w": torch.ones(2), "betas": (0.9, 0.99), 3: None})
        >>> list(tensors), state_from_files(tensors, meta)["betas"]
        (['w'], (0.9, 0.99))
    """
    tensors: dict[str, torch.Tensor] = {}
    return tensors, {"tree": _encode(state, "", tensors)}


def state_from_files(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> Any:
    """Rebuild the state written by :func:`state_to_files`."""
    return _decode(meta["tree"], tensors)


def optimizer_state_to_files(
    state_dict: Mapping[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Flatten a ``torch.optim`` state_dict into tensors (per-param state) and JSON (the rest).

    Example:
        >>> import torch
        >>> w = torch.nn.Parameter(torch.ones(2)); opt = torch.optim.AdamW([w])
        >>> w.grad = torch.ones(2); opt.step()
        >>> tensors, meta = optimizer_state_to_files(opt.state_dict())
        >>> sorted(tensors)
        ['state.0.exp_avg', 'state.0.exp_avg_sq', 'state.0.step']
        >>> opt.load_state_dict(optimizer_state_from_files(tensors, meta))
    """
    if not {"state", "param_groups"} <= set(state_dict):
        raise ValueError(
            f"Expected an optimizer state_dict with 'state' and 'param_groups', got keys "
            f"{sorted(state_dict)}"
        )
    return state_to_files(dict(state_dict))


def optimizer_state_from_files(
    tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """Rebuild the state_dict for ``optimizer.load_state_dict`` (see above)."""
    return state_from_files(tensors, meta)


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Capture the python ``random``, numpy global and torch (CPU and CUDA) RNG states.

    Example:
        >>> import random
        >>> tensors, meta = rng_state(); a = random.random()
        >>> set_rng_state(tensors, meta); random.random() == a
        True
    """
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state_to_files(state)


def set_rng_state(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    """Restore the RNG states captured by :func:`rng_state`."""
    state = state_from_files(tensors, meta)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if state["cuda"]:
        if not torch.cuda.is_available():
            logger.warning("Checkpoint has CUDA RNG states but CUDA is unavailable; skipped")
        elif len(state["cuda"]) != torch.cuda.device_count():
            logger.warning(
                "Checkpoint has %d CUDA RNG states for %d devices; CUDA RNG not restored",
                len(state["cuda"]),
                torch.cuda.device_count(),
            )
        else:
            torch.cuda.set_rng_state_all(state["cuda"])


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
