"""Optional dependencies: import them on first use, or fail with the line that installs them.

The core package needs only gymnasium, pydantic and numpy; envs built on other packages
(``textgym[minigrid]``) import them when an env is made, so their ids can be listed without.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "install_hint", "require"]


class MissingExtraError(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it.

    Example:
        >>> e = MissingExtraError("minigrid", "minigrid", "textgym/BabyAI-GoToRedBall-v0")
        >>> str(e)
        'textgym/BabyAI-GoToRedBall-v0 needs the minigrid package: pip install "textgym[minigrid]"'
    """

    def __init__(self, module: str, extra: str, needed_by: str = "This env") -> None:
        super().__init__(f"{needed_by} needs the {module} package: {install_hint(extra)}")
        self.name = module
        self.extra = extra


def install_hint(extra: str) -> str:
    """The command that installs an extra.

    Example:
        >>> install_hint("minigrid")
        'pip install "textgym[minigrid]"'
    """
    return f'pip install "textgym[{extra}]"'


def require(module: str, extra: str, needed_by: str = "This env") -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra to install.

    Args:
        module: The module to import, e.g. ``"minigrid"``.
        extra: The ``textgym`` extra that installs it.
        needed_by: What needs it, for the message (an env id).

    Example:
        >>> require("json", "none").__name__
        'json'
        >>> require("no_such_module_here", "minigrid")
        Traceback (most recent call last):
        ...
        textgym.extras.MissingExtraError: This env needs the no_such_module_here package: pip install "textgym[minigrid]"
    """  # noqa: E501
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(module, extra, needed_by) from e
