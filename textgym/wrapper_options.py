"""Checks and defaults of :class:`~textgym.wrappers.TextEnvWrapper`'s options.

Example:
    >>> import numpy as np
    >>> json_like((np.int64(3), [np.float32(0.5)]))
    [3, [0.5]]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["INVALID_MODES", "check_options", "json_like", "system_prompt_text"]

INVALID_MODES = ("penalize", "default_action", "raise")


def json_like(value: Any) -> Any:
    """Tuples as lists and numpy scalars as Python numbers, as they come back from JSON."""
    if isinstance(value, tuple | list):
        return [json_like(v) for v in value]
    if isinstance(value, Mapping):
        return {k: json_like(v) for k, v in value.items()}
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


def check_options(
    on_invalid: str, history: int, invalid_penalty: float, max_invalid: int, max_reply_chars: int
) -> None:
    """Refuse wrapper options out of range, naming the option, the value and the rule."""
    if on_invalid not in INVALID_MODES:
        raise ValueError(f"Expected on_invalid to be one of {INVALID_MODES}, got {on_invalid!r}")
    if not (isinstance(history, int) and history >= 0):
        raise ValueError(f"Expected history to be an int >= 0, got {history!r}")
    if not invalid_penalty >= 0:
        raise ValueError(
            "Expected invalid_penalty >= 0 (it is subtracted from the reward), "
            f"got {invalid_penalty!r}"
        )
    if not (isinstance(max_invalid, int) and max_invalid >= 1):
        raise ValueError(f"Expected max_invalid to be an int >= 1, got {max_invalid!r}")
    if not (isinstance(max_reply_chars, int) and max_reply_chars >= 1):
        raise ValueError(f"Expected max_reply_chars to be an int >= 1, got {max_reply_chars!r}")


def system_prompt_text(system_prompt: str | None, env: gym.Env[Any, Any], instructions: str) -> str:
    """The system message: the task description (a default naming the env) + instructions."""
    if system_prompt is None:
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        system_prompt = (
            f"You are an agent acting in the environment {name}. Each turn you see an "
            "observation; reply with your next action."
        )
    elif not isinstance(system_prompt, str):
        raise TypeError(f"Expected system_prompt as str, got {type(system_prompt).__name__}")
    return f"{system_prompt}\n\n{instructions}" if instructions else system_prompt
