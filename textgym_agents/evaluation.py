"""``evaluate``: :func:`textgym.evaluate`, then the generation's freed memory handed back.

The evaluator itself (seeds, batching, the result) is textgym's, the same for every policy;
this adds what a model in this process needs around many generation calls.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from textgym import evaluation
from textgym.evaluation import Evaluation, warn_if_prompt_differs
from textgym_agents.model.memory import release_memory

__all__ = ["evaluate", "warn_if_prompt_differs"]


def evaluate(policy: Any, env: Any, n_episodes: int = 100, **kwargs: Any) -> Evaluation:
    """:func:`textgym.evaluate` (greedy by default), then :func:`release_memory`.

    Arguments and result are those of :func:`textgym.evaluate`. A
    :class:`~textgym_agents.PPOPolicy` carries its generation caches from turn to turn
    meanwhile (:meth:`~textgym_agents.PPOPolicy.carrying_caches`: its weights stay put).

    Example:
        >>> import gymnasium as gym, textgym
        >>> result = evaluate(lambda m: '{"action": "stick"}', gym.make("textgym/Blackjack-v1"), 8)
        >>> result["episodes"], result.invalid_rate, len(result.episodes)
        (8, 0.0, 8)
    """
    carrying = getattr(policy, "carrying_caches", None)
    try:
        with carrying() if carrying is not None else nullcontext():
            return evaluation.evaluate(policy, env, n_episodes, **kwargs)
    finally:
        release_memory()  # the generation's freed caches: not the next phase's baseline
