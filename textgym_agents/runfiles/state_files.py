"""Nested training state as files without pickle: tensors for safetensors, the rest as JSON.

Used by :mod:`textgym_agents.runfiles.checkpoint` for the optimizer and RNG states of a checkpoint.
Tuples, non-string dict keys and numpy arrays are tagged in the JSON so that they come back as
the same types.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = [
    "optimizer_state_from_files",
    "optimizer_state_to_files",
    "rng_state",
    "set_rng_state",
    "state_from_files",
    "state_to_files",
]

logger = logging.getLogger(__name__)

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
