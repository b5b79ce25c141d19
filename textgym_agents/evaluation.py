"""``evaluate``: mean and std of return, success rate and invalid-reply rate of a policy."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from textgym_agents.ppo.buffer import RolloutBuffer
from textgym_agents.ppo.rollout import RolloutCollector, as_vector_env

__all__ = ["evaluate"]


class _NoTraining:
    """Adapts a policy so the rollout collector generates greedily or by sampling."""

    def __init__(self, policy: Any, greedy: bool) -> None:
        self.policy, self.greedy = policy, greedy

    @property
    def wants_choices(self) -> bool:
        return getattr(self.policy, "wants_choices", False)

    @property
    def wants_schemas(self) -> bool:
        return getattr(self.policy, "wants_schemas", False)

    def generate(self, batch: Any, **kwargs: Any) -> Any:
        return self.policy.generate(batch, greedy=self.greedy, **kwargs)

    def encode(self, messages: Any) -> list[int]:
        return self.policy.encode(messages)


def evaluate(
    policy: Any,
    env: gym.Env[Any, Any] | VectorEnv,
    n_episodes: int = 100,
    *,
    greedy: bool = True,
    seed: int = 0,
    num_envs: int = 16,
) -> dict[str, float]:
    """Play ``n_episodes`` episodes and summarise them.

    Episodes run in batches: a vector env is used as it is; a single env that has a spec is
    copied into ``num_envs`` envs (one generation call per step for all of them). As in
    stable-baselines3's ``evaluate_policy``, env i plays a fixed share of the episodes, so
    short episodes are not over-counted.

    Args:
        policy: A :class:`~textgym_agents.PPOPolicy` (anything with ``generate``/``encode``).
        env: A text env or text vector env.
        n_episodes: Episodes to play.
        greedy: Greedy decoding (else sampling with the policy's settings).
        seed: Seed of the first reset (env i gets ``seed + i``).
        num_envs: Copies of a single env to play in parallel.

    Returns:
        ``mean_return``, ``std_return``, ``mean_length``, ``invalid_rate`` (invalid replies
        per turn), ``episodes`` and, where the env reports ``is_success``, ``success_rate``
        (an episode that ended without the key, cut short by a time limit, counts as failed).
    """
    if not (isinstance(n_episodes, int) and n_episodes >= 1):
        raise ValueError(f"n_episodes must be an int >= 1, got {n_episodes!r}")
    envs, owned = _as_batched(env, min(num_envs, n_episodes))
    try:
        collector = RolloutCollector(envs, seed)
        n = envs.num_envs
        targets = np.array([(n_episodes + i) // n for i in range(n)])
        finished: list[list[Any]] = [[] for _ in range(n)]
        buffer = RolloutBuffer()
        actor = _NoTraining(policy, greedy)
        collector.reset()
        while any(len(f) < t for f, t in zip(finished, targets, strict=True)):
            collector.collect(actor, 1, buffer)
            buffer.clear()
            for stats in collector.drain():
                if len(finished[stats.stream]) < targets[stats.stream]:
                    finished[stats.stream].append(stats)
    finally:
        if owned:
            envs.close()
    episodes = [e for f in finished for e in f]
    returns = np.array([e.episode_return for e in episodes])
    result = {
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "mean_length": float(np.mean([e.length for e in episodes])),
        "invalid_rate": sum(e.invalid for e in episodes) / max(sum(e.length for e in episodes), 1),
        "episodes": len(episodes),
    }
    if any(e.success is not None for e in episodes):
        # An episode that ended without the key (cut short by a TimeLimit, say) failed.
        result["success_rate"] = float(np.mean([bool(e.success) for e in episodes]))
    return result


def _as_batched(env: Any, num_envs: int) -> tuple[VectorEnv, bool]:
    if isinstance(env, VectorEnv):
        return env, False
    if env.spec is not None and num_envs > 1:
        spec = env.spec
        return gym.vector.SyncVectorEnv([lambda: gym.make(spec) for _ in range(num_envs)]), True
    return as_vector_env(env), False
