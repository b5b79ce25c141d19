"""``textgym/…`` env ids, and one call to register your own text env.

``gym.make("textgym/Blackjack-v1", **kwargs)`` builds the base env with the keyword arguments
it accepts and the :class:`~textgym.wrappers.TextEnvWrapper` with the wrapper's options.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from textgym.curriculum import CurriculumProgress, ExploringStarts, ReverseCurriculum
from textgym.envs.classic import PRESETS, ReportSuccess
from textgym.envs.minigrid_text import BABYAI_LEVELS
from textgym.envs.pettingzoo_text import PETTINGZOO_GAMES
from textgym.envs.reasoning_gym_text import REASONING_GYM_TASKS
from textgym.envs.textarena_text import TEXTARENA_GAMES
from textgym.wrappers import WRAPPER_OPTIONS, TextEnvWrapper

__all__ = ["NAMESPACE", "WRAPPER_OPTIONS", "make_text_env", "register", "registered_ids"]

NAMESPACE = "textgym"
# Options that shape the generated action schema; a parser passed in replaces them.
_SCHEMA_OPTIONS = ("action_names", "action_field", "action_description")


def make_text_env(
    env_id: str | Callable[..., gym.Env[Any, Any]],
    render_mode: str | None = None,
    preset: str | None = None,
    reverse_curriculum: bool | CurriculumProgress = False,
    exploring_starts: bool = False,
    training_max_steps: int | None = None,
    **kwargs: Any,
) -> TextEnvWrapper:
    """Entry point of registered text envs: make the base env, then wrap it.

    Args:
        env_id: Base env id, or a callable returning the base env.
        render_mode: Passed to the base env.
        preset: Name of a built-in preset (formatter, action names, task prompt) to apply.
        reverse_curriculum: Start episodes near the goal of a tabular world and move the start
            back as the agent succeeds (:class:`~textgym.curriculum.ReverseCurriculum`): True,
            or a :class:`~textgym.curriculum.CurriculumProgress` to share between env copies.
            For training envs only.
        exploring_starts: Start every episode at a state drawn uniformly from all the states of
            a tabular world that can reach the goal
            (:class:`~textgym.curriculum.ExploringStarts`). For training envs only.
        training_max_steps: End episodes after this many moves (truncated), under the env's
            own turn limit: a short limit keeps a cold-start policy that wanders from filling
            a rollout with long episodes. For training envs only; scores keep the env's limit.
        **kwargs: Options of :class:`TextEnvWrapper` go to the wrapper; all others go to the
            base env (e.g. ``map_name="8x8"`` for FrozenLake).

    Example:
        >>> env = make_text_env("FrozenLake-v1", preset="FrozenLake-v1", is_slippery=False)
        >>> env.unwrapped.spec.kwargs["is_slippery"]
        False
    """
    if exploring_starts and reverse_curriculum is not False:
        raise ValueError("Choose one of reverse_curriculum and exploring_starts, not both")
    wrapper_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in WRAPPER_OPTIONS}
    spec = PRESETS[preset] if preset is not None else None
    if spec is not None:
        defaults: dict[str, Any] = {
            "formatter": spec.formatter(),
            "system_prompt": spec.system_prompt,
            **spec.options,
        }
        if wrapper_kwargs.get("parser") is not None:  # the given parser brings its own schema
            for option in _SCHEMA_OPTIONS:
                defaults.pop(option, None)
        wrapper_kwargs = {**defaults, **wrapper_kwargs}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    base = gym.make(env_id, **kwargs) if isinstance(env_id, str) else env_id(**kwargs)
    if reverse_curriculum is not False:
        progress = None if reverse_curriculum is True else reverse_curriculum
        base = ReverseCurriculum(base, progress)
    if exploring_starts:
        base = ExploringStarts(base)
    if training_max_steps is not None:
        if training_max_steps < 1:
            raise ValueError(f"training_max_steps must be >= 1, got {training_max_steps}")
        base = gym.wrappers.TimeLimit(base, training_max_steps)
    if spec is not None and spec.success is not None:
        base = ReportSuccess(base, spec.success)
    return TextEnvWrapper(base, **wrapper_kwargs)


def register(
    id: str,
    env: str | Callable[..., gym.Env[Any, Any]],
    formatter: Any = None,
    parser: Any = None,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    max_episode_steps: int | None = None,
    **wrapper_kwargs: Any,
) -> None:
    """Register a text env in one call, so ``gym.make(id)`` builds it.

    Args:
        id: The new id, e.g. ``"textgym/MyGrid-v0"`` or ``"mylab/MyGrid-v0"``.
        env: Base env id or a callable returning the base env.
        formatter: As for :class:`TextEnvWrapper`.
        parser: As for :class:`TextEnvWrapper`.
        env_kwargs: Default keyword arguments for the base env.
        max_episode_steps: Turn limit applied by ``gym.make`` (invalid replies count).
        **wrapper_kwargs: Other :class:`TextEnvWrapper` options (``system_prompt``, ...).

    Example:
        >>> import gymnasium as gym
        >>> register("mylab/Cart-v0", "CartPole-v1", "Pole angle: {o[2]:.3f}",
        ...          action_names=["left", "right"])
        >>> messages, info = gym.make("mylab/Cart-v0").reset(seed=0)
        >>> messages[-1]["content"]
        'Pole angle: -0.046'
    """
    unknown = set(wrapper_kwargs) - WRAPPER_OPTIONS
    if unknown:
        raise TypeError(
            f"Unknown TextEnvWrapper options {sorted(unknown)}; base env options go in env_kwargs"
        )
    kwargs = {"env_id": env, "formatter": formatter, "parser": parser, **wrapper_kwargs}
    kwargs.update(env_kwargs or {})
    gym.register(
        id=id,
        entry_point="textgym.registration:make_text_env",
        kwargs=kwargs,
        max_episode_steps=max_episode_steps,
    )


def registered_ids() -> list[str]:
    """Return the ids registered under the ``textgym/`` namespace, sorted.

    Example:
        >>> "textgym/Blackjack-v1" in registered_ids()
        True
    """
    return sorted(k for k in gym.registry if k.startswith(f"{NAMESPACE}/"))


def _register_builtin() -> None:
    for name, preset in PRESETS.items():
        gym.register(
            id=f"{NAMESPACE}/{name}",
            entry_point="textgym.registration:make_text_env",
            kwargs={"env_id": name, "preset": name},
            max_episode_steps=preset.max_episode_steps,
        )
    gym.register(
        id=f"{NAMESPACE}/Calculator-v0",
        entry_point="textgym.envs.calculator:make_calculator_text_env",
    )
    # Native grid worlds of RAGEN's: 100 turns, like FrozenLake's (RAGEN stops at 10 actions).
    gym.register(
        id=f"{NAMESPACE}/Sokoban-v0",
        entry_point="textgym.envs.sokoban:make_sokoban_text_env",
        max_episode_steps=100,
    )
    gym.register(
        id=f"{NAMESPACE}/FrozenLakeRandom-v0",
        entry_point="textgym.envs.frozen_lake_random:make_frozen_lake_random_text_env",
        max_episode_steps=100,
    )
    # Any OpenEnv server, over its WebSocket (the openenv extra); base_url= names the server.
    gym.register(
        id=f"{NAMESPACE}/OpenEnv-v0",
        entry_point="textgym.envs.openenv_client:make_openenv_text_env",
    )
    for task in REASONING_GYM_TASKS:  # listed without reasoning-gym, like the BabyAI levels
        gym.register(
            id=f"{NAMESPACE}/rg-{task}-v0",
            entry_point="textgym.envs.reasoning_gym_text:make_reasoning_gym_text_env",
            kwargs={"task": task},
        )
    for game in TEXTARENA_GAMES:  # listed without textarena too
        gym.register(
            id=f"{NAMESPACE}/ta-{game}",
            entry_point="textgym.envs.textarena_text:make_textarena_text_env",
            kwargs={"game": game},
            max_episode_steps=100,
        )
    for name in BABYAI_LEVELS:  # listed without minigrid; making one names the extra to install
        gym.register(
            id=f"{NAMESPACE}/{name}",
            entry_point="textgym.envs.minigrid_text:make_babyai_text_env",
            kwargs={"level": name},
        )
    for name, (*_, max_steps) in PETTINGZOO_GAMES.items():  # listed without pettingzoo too
        gym.register(
            id=f"{NAMESPACE}/{name}",
            entry_point="textgym.envs.pettingzoo_text:make_pettingzoo_text_env",
            kwargs={"game": name},
            max_episode_steps=max_steps,
        )


if f"{NAMESPACE}/Blackjack-v1" not in gym.registry:
    _register_builtin()
