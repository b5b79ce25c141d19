"""Importable names (``"module:Name"``) for formatters, parsers and functions.

An env spec can only hold JSON, so the wrapper records a formatter or parser by the name it
can be imported under (:func:`reference_of`) and builds it back from that name (:func:`resolve`).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

__all__ = ["is_reference", "reference_of", "resolve"]

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_REFERENCE = re.compile(rf"({_DOTTED}):({_DOTTED})")


def is_reference(text: Any) -> bool:
    """Say whether ``text`` has the form of an importable name, ``"package.module:Name"``.

    Example:
        >>> is_reference("textgym.envs.classic:BlackjackFormatter"), is_reference("Hand {o[0]}")
        (True, False)
    """
    return isinstance(text, str) and _REFERENCE.fullmatch(text) is not None


def resolve(reference: str) -> Any:
    """Import the object an importable name stands for.

    Raises:
        ValueError: If ``reference`` is not of the form ``"module:Name"`` or does not import.

    Example:
        >>> resolve("textgym.envs.classic:BlackjackFormatter").__name__
        'BlackjackFormatter'
    """
    match = _REFERENCE.fullmatch(reference) if isinstance(reference, str) else None
    if match is None:
        raise ValueError(f"Expected an importable name 'module:Name', got {reference!r}")
    module_name, qualname = match.groups()
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"Cannot import {reference!r}: {e}") from e
    return obj


def reference_of(obj: Any, base: type | tuple[type, ...] = ()) -> str | None:
    """Return the importable name that builds ``obj`` again, or None when there is none.

    A function or class has a name when importing ``obj.__module__`` and looking up its
    ``__qualname__`` gives ``obj`` back (not a lambda, a local function or a class made at
    run time). An instance of one of the ``base`` classes is named by its class when calling
    the class without arguments builds an equal object (an unconfigured formatter or parser);
    the check builds one, so a formatter or parser should be cheap to build.

    Example:
        >>> from textgym.envs.classic import BlackjackFormatter
        >>> from textgym.formatters import Formatter, GenericFormatter
        >>> reference_of(BlackjackFormatter(), Formatter)
        'textgym.envs.classic:BlackjackFormatter'
        >>> reference_of(GenericFormatter(labels=["x"]), Formatter) is None
        True
        >>> reference_of(lambda obs, info: "") is None
        True
    """
    if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__"):
        return _importable_name(obj)
    if base and isinstance(obj, base):
        cls = type(obj)
        name = _importable_name(cls)
        try:
            same = name is not None and cls() == obj
        except Exception:  # a class that needs arguments cannot be named alone
            return None
        return name if same else None
    return None


def _importable_name(obj: Any) -> str | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)):
        return None
    name = f"{module}:{qualname}"
    if not is_reference(name):  # "<lambda>", "make.<locals>.fmt"
        return None
    try:
        return name if resolve(name) is obj else None
    except ValueError:
        return None
