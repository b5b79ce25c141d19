"""The training defaults of ``textgym train``: a quick CPU run, and the decoding each env suits.

They sit next to :class:`~textgym_agents.ppo.config.PPOConfig`, so a change to the config or to
its defaults is made in one package; nothing here imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CHOICE_DEFAULTS",
    "DEFAULT_EPISODES",
    "DEFAULT_EVAL_EPISODES",
    "DEFAULT_NUM_ENVS",
    "ENV_DEFAULT_NOTES",
    "QUICK_DEFAULTS",
    "env_defaults",
    "reply_prefix_of",
]

DEFAULT_EPISODES = 500
"""Episodes ``textgym train`` trains for unless told."""
DEFAULT_EVAL_EPISODES = 50
"""Greedy evaluation episodes before and after training."""
DEFAULT_NUM_ENVS = 16
"""Envs played in parallel by training and evaluation."""

# Training settings that finish in minutes on a laptop CPU with the embedded 135M model
# (those of examples/blackjack_text_env.py); every one can be overridden.
QUICK_DEFAULTS: dict[str, Any] = {
    "num_steps": 4,
    "minibatch_size": 32,
    "micro_batch_size": 16,
    "learning_rate": 2e-4,
    "kl_coef": 0.0,
}
# With choice decoding: explore. Zero-shot the embedded model puts ~95% on one Blackjack reply,
# and at temperature 1 without an entropy bonus PPO collapses onto it within a few updates
# (docs/design.md, "Open problem"); these keep the choice entropy up.
CHOICE_DEFAULTS: dict[str, Any] = {"temperature": 2.0, "ent_coef": 0.3, "learning_rate": 1e-4}
# What the per-env defaults of :func:`env_defaults` mean, for the help of these flags.
ENV_DEFAULT_NOTES = {
    "decoding": "'choices' where the env lists its valid replies, else 'free'",
    "reply_prefix": 'with choices, the start all valid replies share, e.g. \'{"action": "\'',
    "temperature": "2.0 with choices, else 1.0",
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


def env_defaults(choices: Sequence[str] | None, given: Mapping[str, Any]) -> dict[str, Any]:
    """Settings used unless given: :data:`QUICK_DEFAULTS` and the decoding that suits the env.

    Where the env lists its valid replies, ``decoding="choices"`` with the replies' common
    start as ``reply_prefix``: every reply is valid and a turn is one forward pass, and
    :data:`CHOICE_DEFAULTS` (temperature 2 over the choices, an entropy bonus) explore. Elsewhere,
    free text. With ``decoding="free"`` asked for on such an env, the prefix and a stop at its
    closing quote make each reply a short completion (examples/blackjack_text_env.py).

    Example:
        >>> defaults = env_defaults(['{"action": "stick"}', '{"action": "hit"}'], {"num_steps": 8})
        >>> defaults["decoding"], defaults["reply_prefix"], "num_steps" in defaults
        ('choices', '{"action": "', False)
        >>> defaults["temperature"], defaults["ent_coef"]  # explore over the valid replies
        (2.0, 0.3)
    """
    values = dict(QUICK_DEFAULTS)
    minibatch = given.get("minibatch_size")
    if isinstance(minibatch, int) and minibatch >= 1:  # keep micro <= minibatch
        values["micro_batch_size"] = min(values["micro_batch_size"], minibatch)
    values["decoding"] = decoding = given.get("decoding", "choices" if choices else "free")
    if decoding == "choices":
        values.update(CHOICE_DEFAULTS)
    prefix = reply_prefix_of(choices)
    if prefix and decoding in ("choices", "constrained", "auto"):
        values["reply_prefix"] = prefix
    elif prefix and decoding == "free" and prefix[-1] in "\"'":
        values.update(reply_prefix=prefix, stop_strings=[prefix[-1]], max_new_tokens=8)
    return {key: value for key, value in values.items() if key not in given}
