"""What the training commands share: importing the training stack, loading a model as a policy.

The modules of :mod:`textgym_agents.cli` import torch only inside their functions, so listing
the ``textgym`` commands stays fast.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from textgym.cli_common import CLIError, one_line
from textgym.plugins import AGENTS_HINT

__all__ = ["from_pretrained", "import_agents"]


def import_agents() -> ModuleType:
    """Import :mod:`textgym_agents` with torch and transformers, or explain how to install them.

    Raises:
        CLIError: The training stack cannot be imported (the message has the install hint).
    """
    # Nothing is downloaded: a model name must be a local path or already in the HF cache
    # (HF_HUB_OFFLINE=0 in the environment allows downloads). The command prints its own
    # progress, so the libraries' loading bars and deprecation notices are left out.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        importlib.import_module("textgym_agents.policy")  # torch, transformers, peft
        return importlib.import_module("textgym_agents")
    except ImportError as e:
        raise CLIError(
            f"this command needs the training stack, which could not be imported ({e}); "
            f"{AGENTS_HINT}"
        ) from e


def from_pretrained(agents: Any, model: str | None, config: Any, dtype: str = "auto") -> Any:
    """``PPOPolicy.from_pretrained`` with a one-line error."""
    try:
        return agents.PPOPolicy.from_pretrained(model, config=config, dtype=dtype)
    except (OSError, ValueError) as e:
        raise CLIError(f"could not load the model {model or 'embedded'}: {one_line(e)}") from e
