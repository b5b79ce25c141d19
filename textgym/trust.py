"""Data, never code: what a run directory or a saved policy may make textgym build.

Run directories, datasets and saved policies get shared, and they describe the env they were
made on as JSON: an env id, its Gymnasium spec (entry point, keyword arguments, wrappers) and
formatters or parsers by importable name (``"module:Name"``). ``gym.make`` imports and calls
whatever such names point at, so rebuilding an env from a file that someone else wrote could
run their code. Before anything is built from such a file, :func:`check_env_spec` and
:func:`check_env_args` accept only names the package knows:

- an env id registered in this process (``gym.registry``), without a ``module:`` prefix, and
  for a recorded spec the entry point that id is registered with;
- wrappers applied outside ``gym.make`` from ``textgym`` or ``gymnasium.wrappers`` (except the
  ones that write files or open windows);
- keyword arguments of JSON types in which every string that names an importable object names
  one in ``textgym``, or one that the env's own registration names.

Anything else raises :class:`UntrustedCodeError`, which names what it refused and how to opt
in: ``trust_code=True`` in Python, ``--trust-run`` on the command line (named after
``trust_remote_code`` in Hugging Face libraries). Use it for files whose author you trust.

Example:
    >>> import textgym
    >>> check_env_args("textgym/Blackjack-v1", {"history": 2}, "runs/bj/cli.json")
    >>> check_env_args("textgym/Blackjack-v1", {"formatter": "os:system"}, "runs/bj/cli.json")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    textgym.trust.UntrustedCodeError: runs/bj/cli.json names code that textgym does not know: \
the importable name 'os:system' (in formatter). ... pass --trust-run (in Python: trust_code=True).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

__all__ = ["TRUST_HINT", "UntrustedCodeError", "check_env_args", "check_env_spec", "untrusted"]

TRUST_HINT = "If you trust whoever wrote it, pass --trust-run (in Python: trust_code=True)."
# "module.sub:Name" or a Gymnasium "module:Env-v0" id: a string gym.make or resolve() imports.
_IMPORTABLE = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*:[A-Za-z_][\w.\-/]*")
_TRUSTED_PACKAGE = "textgym"
# Gymnasium wrappers that write files or open windows: not built from someone else's data.
_SIDE_EFFECT_WRAPPERS = {"RecordVideo", "HumanRendering"}


class UntrustedCodeError(ValueError):
    """A run directory, dataset or saved policy names code that textgym does not know.

    The message names each refused entry point or importable name and how to opt in.
    """


def _module_of(name: str) -> str:
    return name.split(":", 1)[0]


def _in_package(name: str, package: str) -> bool:
    module = _module_of(name)
    return module == package or module.startswith(package + ".")


def _importable(text: str) -> bool:
    """Whether ``text`` is a ``module:name`` whose top-level module exists (so it imports)."""
    match = _IMPORTABLE.fullmatch(text)
    if match is None:
        return False
    try:  # a top-level lookup imports nothing
        return importlib.util.find_spec(match.group(1)) is not None
    except (ImportError, ValueError):
        return False


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """``(where, string)`` for every string in a JSON value; other types raise TypeError."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a key of {where or 'the arguments'} is not a string: {key!r}")
            yield where, key
            yield from _strings(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")
    elif not (value is None or isinstance(value, bool | int | float)):
        raise TypeError(f"{where or 'the arguments'} holds a {type(value).__name__}, not JSON")


def _registered(env_id: str) -> EnvSpec | None:
    try:
        return gym.registry.get(env_id)
    except Exception:  # an id gymnasium cannot parse
        return None


def _registered_names() -> set[str]:
    """Every string in the keyword arguments of the envs registered in this process.

    A formatter or parser that a registration names (``textgym.register(...,
    formatter="mylab.fmt:Grid")``) was named by code the user runs, not by a file.
    """
    names: set[str] = set()
    for spec in list(gym.registry.values()):
        try:
            names.update(text for _, text in _strings(spec.kwargs or {}, ""))
        except TypeError:  # a registration with non-JSON defaults: its strings still count
            continue
    return names


def untrusted(
    env_id: str,
    kwargs: Mapping[str, Any] | None,
    *,
    entry_point: Any = None,
    wrappers: Any = (),
) -> list[str]:
    """What in an env description textgym would refuse to build, in words (empty: nothing).

    Args:
        env_id: The env id.
        kwargs: Its keyword arguments (JSON values).
        entry_point: The recorded entry point, for a recorded spec (None: ``gym.make(env_id)``).
        wrappers: The recorded spec's ``additional_wrappers`` (``WrapperSpec`` s).

    Example:
        >>> import textgym
        >>> untrusted("textgym/Blackjack-v1", {"parser": "textgym.parsers:JSONActionParser"})
        []
        >>> untrusted("mylab:Cart-v0", {})
        ["the env id 'mylab:Cart-v0' (not registered here)"]
    """
    found: list[str] = []
    registered = _registered(env_id) if isinstance(env_id, str) else None
    if registered is None:
        found.append(f"the env id {env_id!r} (not registered here)")
    elif entry_point is not None and entry_point != registered.entry_point:
        found.append(
            f"the entry point {entry_point!r} (the registered one of {env_id} is "
            f"{registered.entry_point!r})"
        )
    known = _registered_names()
    sources = [("", kwargs or {})]
    for wrapper in wrappers or ():
        name, point = getattr(wrapper, "name", None), getattr(wrapper, "entry_point", None)
        allowed = isinstance(point, str) and (
            _in_package(point, _TRUSTED_PACKAGE)
            or (_in_package(point, "gymnasium.wrappers") and name not in _SIDE_EFFECT_WRAPPERS)
        )
        if not allowed:
            found.append(f"the wrapper entry point {point!r}")
        sources.append((f"wrapper {name}", getattr(wrapper, "kwargs", None) or {}))
    for prefix, values in sources:
        try:
            strings = list(_strings(values, ""))
        except TypeError as e:
            found.append(f"{prefix + ': ' if prefix else ''}{e}")
            continue
        for where, text in strings:
            if _importable(text) and not _in_package(text, _TRUSTED_PACKAGE) and text not in known:
                place = " ".join(p for p in (prefix, where) if p)
                found.append(f"the importable name {text!r}" + (f" (in {place})" if place else ""))
    return found


def _refuse(found: list[str], source: str) -> None:
    if found:
        raise UntrustedCodeError(
            f"{source} names code that textgym does not know: {'; '.join(found)}. A run "
            "directory, dataset or saved policy is data: it may name registered env ids and "
            f"textgym's own formatters and parsers. {TRUST_HINT}"
        )


def check_env_args(env_id: str, kwargs: Mapping[str, Any] | None, source: str) -> None:
    """Refuse ``gym.make(env_id, **kwargs)`` read from a file unless it names only known code.

    Args:
        env_id: The env id read from ``source``.
        kwargs: The keyword arguments read from ``source``.
        source: The file they were read from, named in the error.

    Raises:
        UntrustedCodeError: The id is not registered, or an argument names code textgym does
            not know (see the module's docstring).
    """
    _refuse(untrusted(env_id, kwargs), source)


def check_env_spec(spec: EnvSpec, source: str) -> None:
    """Refuse ``gym.make(spec)`` of a spec read from a file unless it names only known code.

    Raises:
        UntrustedCodeError: See :func:`check_env_args`; also an entry point other than the
            registered one, and a wrapper from outside textgym and ``gymnasium.wrappers``.
    """
    found = untrusted(
        spec.id,
        spec.kwargs,
        entry_point=spec.entry_point,
        wrappers=spec.additional_wrappers,
    )
    _refuse(found, source)
