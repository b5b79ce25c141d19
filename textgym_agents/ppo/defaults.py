"""The training defaults of ``textgym train``: a quick CPU run, and the decoding each env suits.

They sit next to :class:`~textgym_agents.ppo.config.PPOConfig`, so a change to the config or to
its defaults is made in one package; nothing here imports torch.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CHOICE_DEFAULTS",
    "DEFAULT_EPISODES",
    "DEFAULT_EVAL_EPISODES",
    "DEFAULT_NUM_ENVS",
    "DEFAULT_TRAIN_ENV",
    "ENV_DEFAULT_NOTES",
    "ENV_RECIPES",
    "JSON_REPLY_DEFAULTS",
    "RUN_DEFAULTS",
    "env_defaults",
    "flat_json_replies",
    "reply_hints",
    "recipe_of",
    "reply_prefix_of",
    "run_defaults",
]

DEFAULT_EPISODES = 500
"""Episodes ``textgym train`` trains for unless told."""
DEFAULT_EVAL_EPISODES = 50
"""Greedy evaluation episodes before and after training."""
DEFAULT_NUM_ENVS = 16
"""Envs played in parallel by training and evaluation."""
DEFAULT_TRAIN_ENV = "textgym/Calculator-v0"
"""What ``textgym train`` trains on unless told: the env the embedded model learns fastest
(docs/results.md, "The first run")."""
# Per env id: episodes, envs, evaluation episodes, where training episodes start
# (``exploring_starts``, tabular worlds), their move limit (``training_max_steps``) and env
# options (``env_args``, under ``-e``) of a run that shows learning on a laptop CPU (measured:
# docs/results.md); other envs get the DEFAULT_* numbers above, the env's starts, its own turn
# limit and its own options. Tic-tac-toe trains (and is scored) against perfect play that moves
# at random half the time: it both punishes a missed block and lets a win happen.
RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "textgym/Calculator-v0": {"episodes": 64, "num_envs": 8, "eval_episodes": 32},
    "textgym/Blackjack-v1": {"episodes": 6000},
    "textgym/FrozenLake-v1": {"episodes": 512, "num_envs": 8, "exploring_starts": True},
    "textgym/TicTacToe-v0": {"episodes": 1024, "env_args": {"opponent": "minimax:0.5"}},
}

# Per env id: the PPOConfig settings measured to learn there from cold start (docs/results.md),
# used by ``PPOConfig.for_env`` over the decoding defaults and under what the user sets.
# Blackjack: GiGPO's same-state groups with an annealed rate reach -0.050 to -0.056 (basic
# strategy: -0.043) in 6,000 hands, where GAE-PPO at these settings ends near -0.13 and the
# decoding defaults alone stay at always stick (-0.183). Calculator: 5e-4 solved more held-out
# questions after 64 episodes than 2e-4 on both seeds tried (75.0%/90.6% vs 65.6%/78.1%);
# 1e-3 fell apart into invalid replies; replaying 16 better-than-expected turns per update
# (self-imitation) took float32 seeds 0-4 from 62.5-87.5% to 71.9-96.9% of the 32 held-out
# questions (on 200: every seed up, mean 76.5% -> 81.0%), where 8 lost seed 0. FrozenLake
# (with exploring starts, RUN_DEFAULTS): the greedy policy solved the non-slippery lake on 5
# seeds of 5 within 192-496 episodes, where from the env's own start nothing had ever been
# solved in 256. Tic-tac-toe: GiGPO in groups of 4 took non-losses against random play from
# 63.6% to 79.8% and 68.4% in 1,024 games (two seeds; random openings, exploring starts, did
# worse: 72.6% and 57.6%).
ENV_RECIPES: dict[str, dict[str, Any]] = {
    "textgym/Calculator-v0": {"learning_rate": 5e-4, "self_imitation": 16},
    "textgym/Blackjack-v1": {
        "advantage_estimator": "gigpo",
        "group_size": 4,
        "learning_rate": 3e-4,
        "ent_coef": 0.6,
        "anneal_lr": True,
    },
    "textgym/FrozenLake-v1": {
        "advantage_estimator": "gigpo",
        "group_size": 4,
        "learning_rate": 3e-4,
        "ent_coef": 0.1,
        "explore_eps": 0.3,
    },
    "textgym/TicTacToe-v0": {"advantage_estimator": "gigpo", "group_size": 4},
}

# With choice decoding: explore. Zero-shot the embedded model puts ~95% on one Blackjack reply,
# and at temperature 1 without an entropy bonus PPO collapses onto it within a few updates
# (docs/results.md, "Blackjack at the default settings"); these keep the choice entropy up.
CHOICE_DEFAULTS: dict[str, Any] = {"temperature": 2.0, "ent_coef": 0.3, "learning_rate": 1e-4}
# Free-text replies to an env whose replies are flat JSON objects (the calculator's tool call or
# answer): the model continues '{"' and stops at the object's end, which a 135M model then
# writes valid most of the time; at temperature 1.0 most sampled replies are not valid JSON.
JSON_REPLY_DEFAULTS: dict[str, Any] = {
    "reply_prefix": '{"',
    "stop_strings": ["}"],
    "max_new_tokens": 40,
    "temperature": 0.7,
    "micro_batch_tokens": 512,  # history-long prompts: the update's memory and speed, measured
}
# What the per-env defaults of :func:`env_defaults` mean, for the help of these flags.
ENV_DEFAULT_NOTES = {
    "decoding": "'choices' where the env lists its valid replies, else 'free'",
    "reply_prefix": 'with choices, the start all valid replies share, e.g. \'{"action": "\'; '
    "free text to flat JSON replies: '{\"'",
    "stop_strings": "free text to flat JSON replies: ['}']",
    "max_new_tokens": "40 for free text to flat JSON replies, else 24",
    "temperature": "2.0 with choices, 0.7 for free text to flat JSON replies, else 1.0",
    "micro_batch_tokens": "512 for free text to flat JSON replies, else 1024",
    "ent_coef": "0.3 with choices, else 0.0",
    "learning_rate": "0.0001 with choices, else 0.0002",
}


def reply_prefix_of(choices: Sequence[str] | None) -> str:
    """The text all valid replies start with, cut back so it never splits a word.

    Example:
        >>> reply_prefix_of(['{"action": "stick"}', '{"action": "hit"}'])
        '{"action": "'
        >>> reply_prefix_of(["hit", "hold"])
        ''
    """
    if not choices or len(choices) < 2:
        return ""
    return re.sub(r"\w+$", "", os.path.commonprefix(list(choices)))


_SCALARS = {"string", "number", "integer", "boolean", "null"}


def _flat_object(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") != "object" or not schema.get("properties"):
        return False
    for prop in schema["properties"].values():
        options = prop.get("anyOf", [prop])
        for option in options:
            kind = option.get("type")
            if kind is None and not ("const" in option or "enum" in option):
                return False  # a $ref or an untyped value: may nest
            if kind is not None and not set([kind] if isinstance(kind, str) else kind) <= _SCALARS:
                return False
    return True


def flat_json_replies(schema: Mapping[str, Any] | None) -> bool:
    """Whether every reply the schema allows is a JSON object of scalars (no nesting).

    Such a reply starts with ``{"`` and ends at its first ``}`` (unless a string value holds
    one), so free text can be started and stopped there (:data:`JSON_REPLY_DEFAULTS`).

    Example:
        >>> flat_json_replies({"type": "object", "properties": {"answer": {"type": "number"}}})
        True
        >>> flat_json_replies({"type": "object", "properties": {"xy": {"type": "array"}}})
        False
        >>> flat_json_replies(None)
        False
    """
    if not schema:
        return False
    branches = schema.get("anyOf", schema.get("oneOf", [schema]))
    return all(_flat_object(branch) for branch in branches)


def reply_hints(env: Any) -> tuple[list[str] | None, Mapping[str, Any] | None]:
    """``(valid replies, reply JSON schema)`` of a text env, vector env or registered env id.

    What :func:`env_defaults` decides from. For a vector env, the first env that has each.

    Example:
        >>> import textgym
        >>> choices, schema = reply_hints("textgym/Blackjack-v1")
        >>> choices, sorted(schema["properties"])
        (['{"action": "stick"}', '{"action": "hit"}'], ['action'])
    """
    import gymnasium as gym
    from gymnasium.vector import VectorEnv

    from textgym.episodes import reply_choices, reply_schemas

    probe = gym.make(env) if isinstance(env, str) else env
    try:
        if isinstance(probe, VectorEnv):
            choices = next((c for c in reply_choices(probe) or [] if c), None)
            schema = next((s for s in reply_schemas(probe) or [] if s), None)
            return choices, schema
        return reply_choices(probe), reply_schemas(probe)
    finally:
        if probe is not env:
            probe.close()


def run_defaults(env_id: str) -> dict[str, Any]:
    """What ``textgym train`` runs on ``env_id`` unless told: episodes, envs, evaluations, starts.

    ``training_max_steps`` None: training episodes end at the env's own turn limit;
    ``env_args``: the env's options, under those given with ``-e``.

    Example:
        >>> run_defaults("textgym/Calculator-v0")["episodes"]
        64
        >>> run_defaults("textgym/FrozenLake-v1")["exploring_starts"]
        True
        >>> run_defaults("textgym/CliffWalking-v1") == {
        ...     "episodes": DEFAULT_EPISODES,
        ...     "num_envs": DEFAULT_NUM_ENVS,
        ...     "eval_episodes": DEFAULT_EVAL_EPISODES,
        ...     "exploring_starts": False,
        ...     "training_max_steps": None,
        ...     "env_args": {},
        ... }
        True
        >>> run_defaults("textgym/TicTacToe-v0")["env_args"]
        {'opponent': 'minimax:0.5'}
    """
    values: dict[str, Any] = {
        "episodes": DEFAULT_EPISODES,
        "num_envs": DEFAULT_NUM_ENVS,
        "eval_episodes": DEFAULT_EVAL_EPISODES,
        "exploring_starts": False,
        "training_max_steps": None,
        "env_args": {},
    }
    values.update(copy.deepcopy(RUN_DEFAULTS.get(env_id, {})))
    return values


def recipe_of(
    env: Any, given: Mapping[str, Any] | None = None, num_envs: int | None = None
) -> dict[str, Any]:
    """The measured settings of :data:`ENV_RECIPES` for an env, vector env or env id ({} if none).

    A recipe whose groups do not fit the run's ``num_envs`` (a vector env's own, or the one
    given), with the ``given`` settings over it, is left out with a warning: a group estimator
    needs ``num_envs`` to be a multiple of ``group_size``. Where the ``given`` settings choose a
    critic-free estimator, a recipe's ``self_imitation`` (measured with the critic) is left out.

    Example:
        >>> recipe_of("textgym/Blackjack-v1")["advantage_estimator"]
        'gigpo'
        >>> recipe_of("textgym/Blackjack-v1", {"group_size": 2}, num_envs=2)["learning_rate"]
        0.0003
        >>> recipe_of("textgym/Calculator-v0")
        {'learning_rate': 0.0005, 'self_imitation': 16}
        >>> recipe_of("textgym/Calculator-v0", {"advantage_estimator": "grpo"})
        {'learning_rate': 0.0005}
        >>> recipe_of("textgym/CliffWalking-v1")
        {}
    """
    spec = env if isinstance(env, str) else getattr(getattr(env, "spec", None), "id", None)
    recipe = dict(ENV_RECIPES.get(spec, {})) if isinstance(spec, str) else {}
    num_envs = num_envs or getattr(env, "num_envs", None)
    settings = {**recipe, **(given or {})}
    critic_free = settings.get("advantage_estimator", "gae") != "gae"
    group_size = settings.get("group_size", 1)
    if recipe and num_envs and critic_free and num_envs % group_size:
        warnings.warn(
            f"{spec}'s measured settings ({recipe}) are left out: their groups of {group_size} "
            f"need num_envs to be a multiple of {group_size}, not {num_envs}",
            stacklevel=3,
        )
        return {}
    if critic_free:
        recipe.pop("self_imitation", None)
    return recipe


def env_defaults(
    choices: Sequence[str] | None,
    given: Mapping[str, Any],
    *,
    schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Settings used unless given, over ``PPOConfig``'s own defaults: the decoding the env suits.

    Where the env lists its valid replies, ``decoding="choices"`` with the replies' common
    start as ``reply_prefix``: every reply is valid and a turn is one forward pass, and
    :data:`CHOICE_DEFAULTS` (temperature 2 over the choices, an entropy bonus) explore. Elsewhere,
    free text; where the env's reply ``schema`` allows only flat JSON objects
    (:func:`flat_json_replies`), free text that starts at ``{"`` and stops at ``}``
    (:data:`JSON_REPLY_DEFAULTS`). With ``decoding="free"`` asked for on an env with choices,
    the prefix and a stop at its closing quote make each reply a short completion
    (examples/blackjack_text_env.py).

    Example:
        >>> defaults = env_defaults(['{"action": "stick"}', '{"action": "hit"}'], {"num_steps": 8})
        >>> defaults["decoding"], defaults["reply_prefix"], "num_steps" in defaults
        ('choices', '{"action": "', False)
        >>> defaults["temperature"], defaults["ent_coef"]  # explore over the valid replies
        (2.0, 0.3)
        >>> answer = {"type": "object", "properties": {"answer": {"type": "number"}}}
        >>> defaults = env_defaults(None, {}, schema=answer)
        >>> defaults["decoding"], defaults["reply_prefix"], defaults["stop_strings"]
        ('free', '{"', ['}'])
    """
    values: dict[str, Any] = {}
    values["decoding"] = decoding = given.get("decoding", "choices" if choices else "free")
    if decoding == "choices":
        values.update(CHOICE_DEFAULTS)
    prefix = reply_prefix_of(choices)
    if prefix and decoding in ("choices", "constrained", "auto"):
        values["reply_prefix"] = prefix
    elif prefix and decoding == "free" and prefix[-1] in "\"'":
        values.update(reply_prefix=prefix, stop_strings=[prefix[-1]], max_new_tokens=8)
    elif not choices and decoding == "free" and flat_json_replies(schema):
        values.update(JSON_REPLY_DEFAULTS)
    return {key: value for key, value in values.items() if key not in given}
