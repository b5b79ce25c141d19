"""A saved :class:`~textgym_agents.policy.PPOPolicy` on disk: writing and reading its files.

A policy directory holds the LoRA adapter (peft format), the fp32 value head and
``policy.json`` (how to reload the base model, the config); checkpoints embed the same files.
A saved policy also holds ``files.json``, written last: each file's size and SHA-256 hash, so a
damaged copy is refused with a message naming the file (:mod:`textgym_agents.runfiles.integrity`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from textgym.env_records import check_record
from textgym_agents.exceptions import CheckpointError
from textgym_agents.model.adapters import ValueHead, hidden_size_of, load_adapter
from textgym_agents.model.loading import load_model, resolve_precision
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.runfiles.atomic import (
    atomic_directory,
    atomic_write_json,
    load_tensors,
    save_tensors,
)
from textgym_agents.runfiles.checkpoint import MANIFEST, checkpoint_damage
from textgym_agents.runfiles.integrity import file_listing, find_damage

if TYPE_CHECKING:
    from textgym_agents.policy import PPOPolicy

__all__ = [
    "ADAPTER_DIR",
    "FILES_MANIFEST",
    "POLICY_FILE",
    "VALUE_HEAD_FILE",
    "PolicyParts",
    "load_policy_parts",
    "policy_damage",
    "save_policy",
    "save_policy_files",
]

POLICY_FILE = "policy.json"
VALUE_HEAD_FILE = "value_head.safetensors"
ADAPTER_DIR = "adapter"
FILES_MANIFEST = "files.json"


class PolicyParts(NamedTuple):
    """What :func:`load_policy_parts` reads: the arguments that rebuild a ``PPOPolicy``."""

    model: nn.Module  # the base model with the saved adapter (a PeftModel)
    tokenizer: Any
    value_head: ValueHead
    config: PPOConfig
    base_info: dict[str, Any]
    trained_env: dict[str, Any] | None  # textgym.env_records.env_record of its training env


def save_policy(policy: PPOPolicy, path: str | Path) -> Path:
    """Write ``policy``'s files into a new directory ``path``, atomically.

    Args:
        policy: The policy to save.
        path: The directory to create (replaced whole if it exists).

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    with atomic_directory(path) as tmp:
        save_policy_files(policy, tmp)
        listing = file_listing(tmp)
        atomic_write_json(tmp / FILES_MANIFEST, {"format": 1, "files": listing})
    return path


def policy_damage(path: str | Path) -> str | None:
    """What is wrong with a saved policy or checkpoint directory, in words, or None.

    Uses the directory's ``files.json`` (a saved policy) or ``checkpoint.json`` (a
    checkpoint); a policy saved before hashes were recorded is checked for its files only.
    """
    path = Path(path)
    if (path / MANIFEST).is_file():
        return checkpoint_damage(path)
    if (path / FILES_MANIFEST).is_file():
        try:
            listing = json.loads((path / FILES_MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{FILES_MANIFEST} is unreadable ({e!r})"
        return find_damage(path, listing)
    for name in (VALUE_HEAD_FILE, f"{ADAPTER_DIR}/adapter_config.json"):
        if not (path / name).is_file():
            return f"{name} is missing"
    return None


def save_policy_files(policy: PPOPolicy, directory: Path) -> None:
    """Write the adapter, the value head and ``policy.json`` into an existing directory.

    Args:
        policy: The policy to save; its ``base_info`` must name the base model.
        directory: Where the files go (a checkpoint writes them beside its own).

    Raises:
        ValueError: When the base model has no name or path to reload it from.
    """
    if not policy.base_info.get("name_or_path"):
        raise ValueError(
            "The base model has no name or path to reload it from; save it first "
            "(model.save_pretrained(dir)) and build the policy with "
            "PPOPolicy.from_pretrained(dir)"
        )
    # The learner's adapter alone: a self-play pool's snapshots are extra adapters.
    learner = policy.model.active_adapter
    policy.model.save_pretrained(directory / ADAPTER_DIR, selected_adapters=[learner])
    save_tensors(directory / VALUE_HEAD_FILE, dict(policy.value_head.state_dict()))
    info = {"base": policy.base_info, "config": policy.config.to_dict(), "format": 1}
    if policy.trained_env is not None:
        info["env"] = policy.trained_env
    atomic_write_json(directory / POLICY_FILE, info)


def load_policy_parts(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    trust_code: bool = False,
) -> PolicyParts:
    """Read a directory written by :func:`save_policy` (or a checkpoint directory).

    Args:
        path: The policy or checkpoint directory.
        device: Device of the base model (default CUDA when present, else CPU).
        dtype: Compute dtype of the base model; None: the one it was saved with.
        trust_code: Accept a recorded training env that names code textgym does not know
            (:mod:`textgym.trust`); only for policies whose author you trust.

    Returns:
        The base model with the adapter, its tokenizer, the value head (fp32), the config and
        the base model's reload info.

    Raises:
        FileNotFoundError: When ``path`` holds no ``policy.json``.
        CheckpointError: When a file of the policy is missing, truncated, changed or unreadable
            (the message names it).
        textgym.trust.UntrustedCodeError: Without ``trust_code``, the recorded training env
            names an unregistered env id, entry point, wrapper, formatter or parser.
    """
    path = Path(path)
    if not (path / POLICY_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a saved policy: {POLICY_FILE} is missing")
    problem = policy_damage(path)
    if problem is not None:
        raise CheckpointError(f"The policy {path} is damaged: {problem}")
    try:
        info = json.loads((path / POLICY_FILE).read_text())
    except ValueError as e:
        raise CheckpointError(f"The policy {path} is damaged: {POLICY_FILE}: {e}") from e
    trained_env = info.get("env") if isinstance(info.get("env"), dict) else None
    if trained_env is not None and not trust_code:  # checked before anything is loaded
        check_record(trained_env, f"The policy {path} ({POLICY_FILE})")
    base = info.get("base", {})
    precision = resolve_precision(dtype or base.get("dtype"), device)
    model, tokenizer = load_model(
        base.get("name_or_path"),
        gguf_file=base.get("gguf_file"),
        dtype=precision.dtype,
        device=device,
    )
    base = {**base, "dtype": precision.name, "precision": precision.to_dict()}
    try:  # damage that no listing records (a policy saved without one) still gets a message
        peft_model = load_adapter(model, path / ADAPTER_DIR)
        head_state = load_tensors(path / VALUE_HEAD_FILE)
    except Exception as e:
        raise CheckpointError(f"The policy {path} cannot be read: {e}") from e
    value_head = ValueHead(hidden_size_of(peft_model))
    value_head.load_state_dict({k: v.float() for k, v in head_state.items()})
    # Where rollouts ran is a property of the machine, not of the policy: a loaded policy
    # generates with HF until told otherwise (a saved "vllm" would start a server to evaluate).
    config = PPOConfig.from_dict({**info.get("config", {}), "rollout_engine": "hf"})
    return PolicyParts(peft_model, tokenizer, value_head, config, base, trained_env)
