"""The ``textgym.policies`` loader of the agents extra: ``play``/``record --policy RUN_DIR``.

``textgym`` finds :data:`loader` through its entry point, so the core package loads a trained
policy without importing this package by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym

from textgym_agents.cli.runs import read_run_info, resolve_policy

__all__ = ["PPOPolicyLoader", "loader"]


class PPOPolicyLoader:
    """Loads a run directory, a saved :class:`~textgym_agents.PPOPolicy` or a model.

    Implements :class:`textgym.plugins.PolicyLoader`; a fresh model gets the decoding that
    suits the env (:func:`~textgym_agents.ppo.defaults.env_defaults`).
    """

    def run_info(self, target: str) -> Mapping[str, Any]:
        """The ``cli.json`` of the target's run (``{}`` for a model).

        Raises:
            textgym.plugins.UnknownPolicyError: ``target`` is no run, policy or model.
        """
        resolve_policy(target)
        return read_run_info(target) if Path(target).exists() else {}

    def load(
        self, target: str, env: gym.Env[Any, Any], *, trust_code: bool = False
    ) -> tuple[Any, str]:
        """``(policy, label)`` for ``env`` (torch is imported here)."""
        from textgym_agents.cli.evaluate import load_policy

        return load_policy(target, env, trust_code=trust_code)


loader = PPOPolicyLoader()
"""The entry point ``textgym_agents`` of the ``textgym.policies`` group."""
