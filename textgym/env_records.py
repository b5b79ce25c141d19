"""What an agent was trained on, as JSON: rebuild that env, and notice when another one differs.

A training run (and a saved policy) keeps an *env record*: the env id, its Gymnasium spec as
JSON (:meth:`gymnasium.envs.registration.EnvSpec.to_json`: entry point, kwargs — a custom
system prompt, a formatter or parser by importable name — and the wrappers applied outside
``gym.make``) and the system prompt the agent saw, action instructions included.
:func:`make_recorded_env` rebuilds the env from it; :func:`prompt_difference` says how another
env's prompt differs, since a policy tuned under one prompt can fail under another.

Example:
    >>> import gymnasium as gym, textgym
    >>> record = env_record(gym.make("textgym/Blackjack-v1"))
    >>> record["id"], "spec_error" in record
    ('textgym/Blackjack-v1', False)
    >>> env = make_recorded_env(record)
    >>> prompt_difference(record, env) is None
    True
    >>> other = gym.make("textgym/Blackjack-v1", system_prompt="Play blackjack.")
    >>> prompt_difference(record, other)[:52]
    'its system prompt differs from the one used in train'
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import VectorEnv

from textgym.checker import find_text_wrapper
from textgym.trust import check_env_spec

__all__ = [
    "TRAINING_ONLY",
    "check_record",
    "env_record",
    "make_recorded_env",
    "prompt_difference",
    "system_prompt_of",
]

TRAINING_ONLY = {
    "reverse_curriculum": "ReverseCurriculum",
    "exploring_starts": "ExploringStarts",
    "training_max_steps": "TimeLimit",
}
"""``gym.make`` options of textgym's envs that shape training episodes only, never the env a
policy is scored on (see :func:`~textgym.registration.make_text_env`), and the wrapper each
adds."""
_CONTEXT = 60  # characters of each prompt shown around the first difference


def _spec_of(env: gym.Env[Any, Any] | VectorEnv) -> EnvSpec | None:
    if isinstance(env, VectorEnv):
        envs = getattr(env, "envs", None)  # SyncVectorEnv: its sub-envs are at hand
        if envs:
            return envs[0].spec  # type: ignore[no-any-return]
        try:
            return env.get_attr("spec")[0]  # type: ignore[no-any-return]
        except Exception:  # an env that cannot send its spec back (not picklable)
            return env.spec
    return env.spec


def system_prompt_of(env: gym.Env[Any, Any] | VectorEnv) -> str | None:
    """The system prompt (with action instructions) a text env or text vector env shows.

    None when ``env`` is not a text env.
    """
    try:
        if isinstance(env, VectorEnv):
            # Probe first: an AsyncVectorEnv worker that raises AttributeError shuts down.
            if not all(env.call("has_wrapper_attr", "system_prompt")):
                return None
            prompt = env.get_attr("system_prompt")[0]
        else:
            prompt = find_text_wrapper(env).system_prompt
    except (AttributeError, ValueError):
        return None
    return prompt if isinstance(prompt, str) else None


def env_record(env: gym.Env[Any, Any] | VectorEnv) -> dict[str, Any]:
    """Describe ``env`` (or a vector env's sub-env) as JSON-ready data.

    Returns:
        ``{"id", "spec", "system_prompt"}``: ``spec`` is the spec's JSON text; when the spec
        holds an object JSON cannot describe (a formatter instance, a lambda), ``spec`` is None
        and ``spec_error`` says why (pass such parts by importable name to keep it). Options
        of training envs only (:data:`TRAINING_ONLY`) are left out of ``spec`` and listed in
        ``training_only``.
    """
    spec = _spec_of(env)
    record: dict[str, Any] = {"id": spec.id if spec is not None else None, "spec": None}
    if spec is not None and set(spec.kwargs) & set(TRAINING_ONLY):
        # The env a policy is evaluated on starts where the env does: the record leaves the
        # training-only options out and names them.
        record["training_only"] = sorted(set(spec.kwargs) & set(TRAINING_ONLY))
        kept = {k: v for k, v in spec.kwargs.items() if k not in TRAINING_ONLY}
        dropped = {TRAINING_ONLY[k] for k in record["training_only"]}
        wrappers = tuple(w for w in spec.additional_wrappers if w.name not in dropped)
        spec = dataclasses.replace(spec, kwargs=kept, additional_wrappers=wrappers)
    if spec is None:
        record["spec_error"] = "the env has no spec (it was not made with gym.make)"
    else:
        try:
            record["spec"] = spec.to_json()
        except (TypeError, ValueError) as e:
            record["spec_error"] = f"its spec is not JSON: {e}"
    record["system_prompt"] = system_prompt_of(env)
    return record


def _spec_in(record: Mapping[str, Any]) -> EnvSpec | None:
    if not record.get("spec"):
        return None
    try:
        return EnvSpec.from_json(record["spec"])
    except (TypeError, ValueError, gym.error.Error) as e:
        name = record.get("id")
        raise ValueError(f"The recorded env {name!r} has an unreadable spec: {e}") from e


def check_record(record: Mapping[str, Any], source: str) -> None:
    """Refuse an env record that names code textgym does not know (see :mod:`textgym.trust`).

    Nothing is built or imported. A record without a spec passes: nothing can be built from it.

    Raises:
        textgym.trust.UntrustedCodeError: The spec names an unregistered env id, another entry
            point than the registered one, a wrapper or importable name from elsewhere.
        ValueError: The spec is not a Gymnasium spec's JSON.
    """
    spec = _spec_in(record)
    if spec is not None:
        check_env_spec(spec, source)


def make_recorded_env(
    record: Mapping[str, Any], *, trust_code: bool = False, **kwargs: Any
) -> gym.Env[Any, Any]:
    """``gym.make`` the env an :func:`env_record` describes (``kwargs`` override its own).

    Args:
        record: The env record (from a run's ``config.json`` or a policy's ``policy.json``).
        trust_code: Build it even when it names code textgym does not know (a custom entry
            point, formatter or parser): only for records whose author you trust.
        **kwargs: Keyword arguments of ``gym.make`` that replace the recorded ones.

    Raises:
        ValueError: The record holds no spec (``spec_error`` says why it could not be kept).
        textgym.trust.UntrustedCodeError: Without ``trust_code``, the record names unknown code.
    """
    spec = _spec_in(record)
    if spec is None:
        reason = record.get("spec_error", "it holds no spec")
        raise ValueError(f"Cannot rebuild the recorded env {record.get('id')!r}: {reason}")
    if not trust_code:
        check_env_spec(spec, f"The env record of {record.get('id')!r}")
    return gym.make(spec, **kwargs)


def prompt_difference(record: Mapping[str, Any], env: gym.Env[Any, Any] | VectorEnv) -> str | None:
    """How ``env``'s system prompt differs from the recorded one, in words; None if the same.

    None too when either prompt is unknown (the record predates prompts, not a text env).
    """
    trained, now = record.get("system_prompt"), system_prompt_of(env)
    if not isinstance(trained, str) or now is None or trained == now:
        return None
    at = next(
        (i for i, (a, b) in enumerate(zip(trained, now, strict=False)) if a != b),
        min(len(trained), len(now)),
    )
    start = max(0, at - _CONTEXT // 2)
    return (
        f"its system prompt differs from the one used in training from character {at}: "
        f"trained on {json.dumps(trained[start : at + _CONTEXT])}..., "
        f"now {json.dumps(now[start : at + _CONTEXT])}..."
    )
