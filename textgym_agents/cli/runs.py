"""What the training commands know about run directories: their files, names and checkpoints.

A run directory (``textgym train --output DIR``) holds ``cli.json`` (what the command was asked
for), ``config.json``, ``metrics.jsonl``, ``checkpoints/step_*/`` and ``final/`` (the policy).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from textgym.cli_common import RUN_INFO_FILE, CLIError
from textgym.plugins import UnknownPolicyError
from textgym_agents.cli.common import import_agents

__all__ = [
    "episodes_done",
    "holds_run",
    "is_run_dir",
    "read_run_info",
    "read_trained_env",
    "resolve_policy",
    "resume_point",
]


def read_run_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``cli.json`` of the run that ``path`` (a run, policy or checkpoint dir) belongs to.

    ``{}`` when there is none.

    Raises:
        CLIError: The file exists but is not a JSON object (it names the file).
    """
    path = Path(path)
    candidates = [path]
    if path.name == "final":
        candidates.append(path.parent)
    elif path.parent.name == "checkpoints":
        candidates.append(path.parent.parent)
    for directory in candidates:
        file = directory / RUN_INFO_FILE
        if file.is_file():
            try:
                info = json.loads(file.read_text())
            except (OSError, ValueError) as e:
                raise CLIError(f"{file} is unreadable ({e}); fix or remove it") from None
            if not isinstance(info, dict):
                raise CLIError(f"{file} is not a JSON object; fix or remove it")
            return info
    return {}


def read_trained_env(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The env record (``textgym.env_records``) of the policy or run at ``path``, if any.

    Read from the saved policy's ``policy.json`` (a policy, ``final/`` or a checkpoint
    directory), else from the run's ``config.json``.
    """
    path = Path(path)
    candidates = [path / "policy.json", path / "final" / "policy.json", path / "config.json"]
    if path.name == "final":
        candidates.append(path.parent / "config.json")
    elif path.parent.name == "checkpoints":
        candidates.append(path.parent.parent / "config.json")
    for file in candidates:
        if not file.is_file():
            continue
        try:
            record = json.loads(file.read_text()).get("env")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(record, dict):
            return record
    return None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` looks like a run directory (metrics, cli.json or a PPO config.json)."""
    if (path / "metrics.jsonl").is_file() or (path / RUN_INFO_FILE).is_file():
        return True
    try:
        return "ppo" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def holds_run(path: Path) -> bool:
    """Whether a run was started in ``path`` (so a new one must not be written there)."""
    return any((path / name).exists() for name in ("config.json", "metrics.jsonl", "checkpoints"))


def episodes_done(checkpoint: Path) -> int:
    """The episodes a checkpoint had trained on (its ``trainer_state.json``)."""
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["episodes"])


def resume_point(target: str) -> tuple[Path, Path]:
    """``(run directory, checkpoint)`` for ``--resume`` (a run directory or a checkpoint)."""
    from textgym_agents.ppo.run import find_checkpoint

    path = Path(target)
    if not path.exists():
        raise CLIError(f"--resume: no such run directory: {target}")
    from textgym_agents.exceptions import CheckpointError

    try:
        checkpoint = find_checkpoint(path)
    except FileNotFoundError:
        raise CLIError(f"--resume: no checkpoint in {target}, nothing to resume") from None
    except CheckpointError as e:
        raise CLIError(f"--resume: {e}") from None
    return (path.parent.parent if checkpoint == path else path), checkpoint


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an invalid repo id
        return False


def resolve_policy(target: str) -> tuple[str, str | None, str]:
    """Say what ``target`` is: ``(kind, path or model name, label)``; kind is policy or model.

    A run directory gives its ``final/`` policy (or its latest checkpoint when it has none), a
    saved policy itself, a model directory, a ``.gguf`` file, ``embedded`` or a Hugging Face
    id in the local cache gives a model.

    Raises:
        UnknownPolicyError: ``target`` is none of these.
        CLIError: ``target`` is a run directory without a saved policy.
    """
    path = Path(target).expanduser()
    if path.is_dir():
        if (path / "policy.json").is_file():
            return "policy", str(path), target
        if (path / "final" / "policy.json").is_file():
            return "policy", str(path / "final"), target
        if (path / "checkpoints").is_dir():
            import_agents()
            from textgym_agents.exceptions import CheckpointError
            from textgym_agents.runfiles.checkpoint import latest_checkpoint

            try:
                latest = latest_checkpoint(path)
            except CheckpointError as e:
                raise CLIError(str(e)) from None
            if latest is not None:
                return "policy", str(latest), f"{target} ({latest.name})"
        if is_run_dir(path):
            raise CLIError(f"{target} is a run directory without a saved policy (no final/)")
        return "model", str(path.resolve()), target
    if path.is_file():
        if path.suffix == ".gguf":
            return "model", str(path.resolve()), target
        raise UnknownPolicyError(
            f"{target} is a file, not a run directory, a saved policy or a model"
        )
    if target == "embedded":
        return "model", None, target
    if not _in_hf_cache(target):
        raise UnknownPolicyError(
            f"no such run directory or model: {target} (a model name must be a local path, "
            "'embedded' or a Hugging Face id in the local cache)"
        )
    return "model", target, target
