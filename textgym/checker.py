"""``check_text_env``: Gymnasium's env checker plus the text layer's own round trips."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import check_env, data_equivalence

from textgym.parsers import ActionParseError
from textgym.wrappers import TextEnvWrapper

__all__ = ["check_text_env", "find_text_wrapper", "prompt_parts"]


def find_text_wrapper(env: gym.Env[Any, Any]) -> TextEnvWrapper:
    """Return the :class:`TextEnvWrapper` inside a wrapper stack.

    Raises:
        ValueError: If there is none.
    """
    current: Any = env
    while not isinstance(current, TextEnvWrapper):
        if not isinstance(current, gym.Wrapper):
            raise ValueError(f"Expected an env wrapped by TextEnvWrapper, got {env}")
        current = current.env
    return current


def prompt_parts(env: gym.Env[Any, Any]) -> tuple[str, str, Any, float]:
    """``(system prompt, reply instructions, parser, invalid penalty)`` of a text env.

    From its ``TextEnvWrapper``, else from an env that declares them (``prompt_parts()``: an
    OpenEnv server's env, ``textgym/OpenEnv-v0``).

    Raises:
        ValueError: If the env has neither.

    Example:
        >>> import textgym
        >>> system, instructions, parser, penalty = prompt_parts(gym.make("textgym/Blackjack-v1"))
        >>> system.endswith(instructions), penalty
        (True, 1.0)
    """
    try:
        text_env = find_text_wrapper(env)
    except ValueError:
        if env.has_wrapper_attr("prompt_parts"):
            return env.get_wrapper_attr("prompt_parts")()  # type: ignore[no-any-return]
        raise
    parser = text_env.parser
    return text_env.system_prompt, parser.instructions(), parser, text_env.invalid_penalty


def check_text_env(
    env: gym.Env[Any, Any],
    *,
    n_samples: int = 50,
    actions: Iterable[Any] | None = None,
    seed: int = 0,
    skip_render_check: bool = False,
) -> int:
    """Check a text env: Gymnasium's ``check_env``, then parse/format round trips.

    For sampled env actions (or the given ``actions``), the parser's example reply for the
    action must parse back to an equal action that the env's action space contains; every
    choice of a finite action set must parse to a distinct action; the example reply must be
    accepted by ``env.step`` as valid. With an action mask, the replies listed after reset must
    be legal and the stepped action is sampled from the legal ones.

    Args:
        env: A text env (a :class:`TextEnvWrapper`, possibly wrapped further).
        n_samples: Number of env actions sampled for round trips (when ``actions`` is None).
        actions: Explicit env actions to round-trip instead of samples.
        seed: Seed for the env and the action sampling.
        skip_render_check: Passed to Gymnasium's checker.

    Returns:
        The number of round trips checked.

    Raises:
        AssertionError: Naming the first check that failed.

    Example:
        >>> import gymnasium as gym
        >>> import textgym
        >>> check_text_env(gym.make("textgym/Blackjack-v1"), n_samples=10)
        10
    """
    check_env(env, skip_render_check=skip_render_check)
    text_env = find_text_wrapper(env)
    parser, action_space = text_env.parser, text_env.env.action_space
    if actions is None:
        action_space.seed(seed)
        actions = [action_space.sample() for _ in range(n_samples)]

    checked = 0
    for action in actions:
        reply = parser.example(action)
        if reply is None:
            continue
        try:
            parsed = parser.parse(reply)
        except ActionParseError as e:
            raise AssertionError(
                f"Example reply {reply!r} for action {action!r} does not parse: {e}"
            ) from e
        assert action_space.contains(parsed), (
            f"Reply {reply!r} parsed to {parsed!r}, outside {action_space}"
        )
        assert data_equivalence(parsed, action) or _close(parsed, action), (
            f"Reply {reply!r} for action {action!r} parsed back to {parsed!r}"
        )
        checked += 1

    choices = parser.choices()
    if choices is not None:
        parsed_choices = [parser.parse(c) for c in choices]
        assert len({repr(p) for p in parsed_choices}) == len(choices), (
            f"The choices {choices} do not parse to distinct actions"
        )

    _check_valid_step(env, text_env, seed)
    return checked


def _check_valid_step(env: gym.Env[Any, Any], text_env: TextEnvWrapper, seed: int) -> None:
    messages, _ = env.reset(seed=seed)
    assert env.observation_space.contains(messages), "reset() returned messages outside the space"
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user", (
        "The prompt must start with the system message and end with a user message"
    )
    space, mask = text_env.env.action_space, text_env.action_masks()
    space.seed(seed)
    if mask is not None:  # state-dependent replies: each listed one is legal now
        for choice in text_env.reply_choices() or []:
            error = text_env.parse_reply(choice)[1]
            assert error is None, f"The listed valid reply {choice!r} is invalid: {error}"
    reply = text_env.parser.example(space.sample() if mask is None else space.sample(mask=mask))
    if reply is not None:
        _, _, _, _, info = env.step(reply)
        assert not info["invalid"], (
            f"The example reply {reply!r} was invalid: {info['parse_error']}"
        )


def _close(a: Any, b: Any) -> bool:
    """Float actions may lose precision in JSON (float32 → decimal → float32)."""
    try:
        import numpy as np

        return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), atol=1e-6))
    except (TypeError, ValueError):
        return False
