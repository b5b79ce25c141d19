"""``evaluate``: mean and std of return, success rate and invalid-reply rate of a policy.

Batched over envs by :func:`textgym.episodes.run_episodes`; the result is a
:class:`textgym.evaluation.Evaluation` (also readable as the summary dict).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

from textgym.env_records import prompt_difference
from textgym.episodes import run_episodes
from textgym.evaluation import Evaluation
from textgym.policy import JSONSchema, Policy, PolicyBase, as_policy
from textgym.wrappers import Messages
from textgym_agents.memory import release_memory
from textgym_agents.ppo.rollout import as_vector_env

__all__ = ["evaluate", "warn_if_prompt_differs"]


class _Generating(PolicyBase):
    """An object with only ``generate(batch, greedy=...)`` (a scripted stand-in) as a Policy."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.wants_choices = bool(getattr(model, "wants_choices", False))
        self.wants_schemas = bool(getattr(model, "wants_schemas", False))

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[JSONSchema | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """The texts of one ``generate`` call (given only the hints the model wants)."""
        kwargs: dict[str, Any] = {}
        if choices is not None:
            kwargs["choices"] = choices
        if schemas is not None:
            kwargs["schemas"] = schemas
        return list(self.model.generate(list(batch), greedy=greedy, **kwargs).texts)


def evaluate(
    policy: Policy | Any,
    env: gym.Env[Any, Any] | VectorEnv,
    n_episodes: int = 100,
    *,
    greedy: bool = True,
    seed: int = 0,
    num_envs: int = 16,
) -> Evaluation:
    """Play ``n_episodes`` episodes and summarise them.

    Episodes run in batches: a vector env is used as it is; a single env that has a spec is
    copied into ``num_envs`` envs (one generation call per step for all of them). As in
    stable-baselines3's ``evaluate_policy``, env i plays a fixed share of the episodes, so
    short episodes are not over-counted.

    Args:
        policy: A :class:`~textgym_agents.PPOPolicy`, an :class:`~textgym_agents.Agent`, any
            :class:`textgym.Policy`, an object with ``generate(batch, greedy=...)``, or a
            callable ``messages -> reply``.
        env: A text env or text vector env.
        n_episodes: Episodes to play.
        greedy: Greedy decoding (else sampling with the policy's settings).
        seed: Seed of the first reset (env i gets ``seed + i``).
        num_envs: Copies of a single env to play in parallel.

    Returns:
        The :class:`~textgym.evaluation.Evaluation`; as a mapping (``result["mean_return"]``)
        it holds ``mean_return``, ``std_return``, ``mean_length``, ``invalid_rate`` (invalid
        replies per turn), ``episodes`` (the count) and, where the env reports ``is_success``,
        ``success_rate`` (an episode that ended without the key, cut short by a time limit,
        counts as failed).

    Example:
        >>> import textgym
        >>> result = evaluate(lambda m: '{"action": "stick"}', gym.make("textgym/Blackjack-v1"), 8)
        >>> result["episodes"], result.invalid_rate, len(result.episodes)
        (8, 0.0, 8)
    """
    if not (isinstance(n_episodes, int) and n_episodes >= 1):
        raise ValueError(f"n_episodes must be an int >= 1, got {n_episodes!r}")
    warn_if_prompt_differs(policy, env, stacklevel=3)
    if isinstance(policy, Policy) or not hasattr(policy, "generate"):
        actor = as_policy(policy)
    else:
        actor = _Generating(policy)
    envs, owned = _as_batched(env, min(num_envs, n_episodes))
    try:
        episodes = list(run_episodes(actor, envs, n_episodes, seed=seed, greedy=greedy))
    finally:
        if owned:
            envs.close()
        release_memory()  # the generation's freed caches: not the next phase's baseline
    return Evaluation.from_episodes(sorted(episodes, key=lambda e: (e.env_index, e.index)))


def warn_if_prompt_differs(policy: Any, env: Any, stacklevel: int = 2) -> str | None:
    """Warn when ``env`` prompts otherwise than the env ``policy`` was trained on.

    A policy tuned under one system prompt (or one set of action instructions) can fail under
    another: the calculator policy that solved 67.5% with its training prompt solved 0% under
    the registered default. Uses the policy's ``trained_env`` record (kept by training and
    ``save()``); silent for policies without one.

    Returns:
        The warning's text, or None when nothing differs (or nothing is known).
    """
    record = getattr(policy, "trained_env", None)
    if not isinstance(record, Mapping):
        return None
    difference = prompt_difference(record, env)
    if difference is None:
        return None
    spec = getattr(env, "spec", None)
    message = (
        f"The evaluation env ({spec.id if spec is not None else 'no id'}) is not the one this "
        f"policy was trained on ({record.get('id')}): {difference}. Evaluate on the training env "
        "(`textgym eval RUN` rebuilds it; in Python textgym.env_records.make_recorded_env("
        "policy.trained_env)) unless the change is what you are testing"
    )
    warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return message


def _as_batched(env: Any, num_envs: int) -> tuple[VectorEnv, bool]:
    if isinstance(env, VectorEnv):
        return env, False
    if env.spec is not None and num_envs > 1:
        spec = env.spec
        return gym.vector.SyncVectorEnv([lambda: gym.make(spec) for _ in range(num_envs)]), True
    return as_vector_env(env), False
