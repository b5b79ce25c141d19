"""Settings of ``textgym train``: a flag per ``PPOConfig`` field, and config files.

The functions take the config class as an argument (tests pass a stand-in); the defaults they
show come from :mod:`textgym_agents.ppo.defaults`. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from textgym.cli_common import UsageError
from textgym_agents.ppo.defaults import ENV_DEFAULT_NOTES

__all__ = [
    "FLAG_PREFIX",
    "TRAIN_FILE_KEYS",
    "add_config_flags",
    "check_values",
    "default_text",
    "flag_values",
    "read_config_file",
]

FLAG_PREFIX = "ppo:"  # argparse dest of a PPOConfig flag: never clashes with the CLI's own
# Keys of a config file that are `textgym train` options rather than PPOConfig fields.
TRAIN_FILE_KEYS: dict[str, Any] = {
    "env": str,
    "model": str | None,
    "episodes": int,
    "num_envs": int,
    "eval_episodes": int,
    "env_args": dict,
}


def _fields(config_cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(config_cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(config_cls) if f.init]


def _split_optional(hint: Any) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), True
    return hint, False


def _describe(hint: Any) -> str:
    inner, optional = _split_optional(hint)
    origin = typing.get_origin(inner)
    if origin is list:
        (item,) = typing.get_args(inner) or (Any,)
        text = f"a list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    else:
        names = {bool: "true or false", int: "an int", float: "a number", str: "a string"}
        names[dict] = "a mapping"
        text = names.get(origin or inner, "a JSON value")
    return f"{text} or none" if optional else text


def default_text(field: dataclasses.Field[Any]) -> str:
    """A field's default as ``textgym train`` sets it, in words where it depends on the env."""
    if field.name in ENV_DEFAULT_NOTES:
        return ENV_DEFAULT_NOTES[field.name]
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "required"


def _converter(hint: Any) -> Any:
    """An argparse ``type=`` for one value of a field of type ``hint``."""
    inner, optional = _split_optional(hint)

    def convert(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            if inner is bool:
                return {"true": True, "false": False}[text.lower()]
            if inner in (int, float, str):
                return inner(text)
            return json.loads(text)
        except (ValueError, KeyError) as e:
            raise argparse.ArgumentTypeError(f"expected {_describe(hint)}, got {text!r}") from e

    convert.__name__ = _describe(hint)
    return convert


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add ``--field-name`` for every field of the dataclass ``config_cls``, with its help.

    Flags default to "not given" (``argparse.SUPPRESS``), so :func:`flag_values` returns only
    what was typed and a config file or the env defaults decide the rest.
    """
    parser.add_argument_group(
        f"{config_cls.__name__} settings",
        "Every field of the training config, in the groups below; flags override --config\n"
        "FILE, which overrides these defaults. Values: numbers, true/false (or --flag/\n"
        "--no-flag), none for optional ones, lists as several words (--stop-strings '\"' '}').",
    )
    sections = getattr(config_cls, "sections", dict)()
    section_of = {name: title for title, names in sections.items() for name in names}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field, hint in _fields(config_cls):
        title = section_of.get(field.name, "other")
        if title not in groups:
            groups[title] = parser.add_argument_group(f"{config_cls.__name__}: {title}")
        group = groups[title]
        inner, optional = _split_optional(hint)
        help_text = f"{field.metadata.get('help', '')} (default: {default_text(field)})"
        kwargs: dict[str, Any] = {
            "dest": FLAG_PREFIX + field.name,
            "default": argparse.SUPPRESS,
            "help": help_text.replace("%", "%%"),  # argparse formats help with %
        }
        flag = "--" + field.name.replace("_", "-")
        if inner is bool and not optional:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(inner) is list:
            (item,) = typing.get_args(inner) or (str,)
            kwargs.update(nargs="*", type=_converter(item), metavar=field.name.upper())
        else:
            kwargs.update(type=_converter(hint), metavar=field.name.upper())
        group.add_argument(flag, **kwargs)


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The PPOConfig values given as flags (field name -> value)."""
    return {
        key.removeprefix(FLAG_PREFIX): value
        for key, value in vars(args).items()
        if key.startswith(FLAG_PREFIX)
    }


def _check(name: str, value: Any, hint: Any) -> Any:
    """Return ``value`` if it fits ``hint`` (ints accepted as floats), else raise ValueError."""
    inner, optional = _split_optional(hint)
    if value is None and optional:
        return None
    origin = typing.get_origin(inner) or inner
    ok: bool
    if origin is bool:
        ok = isinstance(value, bool)
    elif origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif origin is float:
        if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif origin is str:
        ok = isinstance(value, str)
    elif origin is list:
        value = [value] if isinstance(value, str) else value
        (item,) = typing.get_args(inner) or (Any,)
        ok = isinstance(value, list)
        value = [_check(name, v, item) for v in value] if ok else value
    elif origin is dict:
        ok = isinstance(value, dict)
    else:
        ok = True
    if not ok:
        raise ValueError(f"{name} must be {_describe(hint)}, got {value!r}")
    return value


def check_values(values: Mapping[str, Any], config_cls: type) -> dict[str, Any]:
    """Check the types of PPOConfig values; unknown names get a close-match hint."""
    hints = {f.name: hint for f, hint in _fields(config_cls)}
    checked = {}
    for name, value in values.items():
        if name not in hints:
            raise ValueError(f"unknown setting {name!r}{_did_you_mean(name, hints)}")
        checked[name] = _check(name, value, hints[name])
    return checked


def _did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_config_file(path: str | os.PathLike[str], config_cls: type) -> tuple[dict, dict]:
    """Read a YAML or JSON config file into ``(PPOConfig values, train option values)``.

    Keys are PPOConfig field names (``learning_rate`` or ``learning-rate``) and, optionally,
    the train options ``env``, ``model``, ``episodes``, ``num_envs``, ``eval_episodes`` and
    ``env_args``. A run's ``config.json`` works too: its ``ppo`` settings and base model.

    Raises:
        UsageError: The file is missing, unreadable, or has an unknown key or a bad value.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--config: cannot read {path}: {e.strerror or e}") from e
    try:
        data = _parse(text, path)
    except ValueError as e:
        raise UsageError(f"--config {path}: {' '.join(str(e).split())}") from e
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings, got {data!r:.80}")
    train: dict[str, Any] = {}
    if isinstance(data.get("ppo"), dict):  # a run directory's config.json
        base = data.get("base") or {}
        if isinstance(base, dict) and base.get("name_or_path"):
            train["model"] = base["name_or_path"]
        data = data["ppo"]
    values = {str(k).replace("-", "_"): v for k, v in data.items()}
    try:
        for key in [k for k in values if k in TRAIN_FILE_KEYS]:
            train[key] = _check(key, values.pop(key), TRAIN_FILE_KEYS[key])
        hints = {f.name for f, _ in _fields(config_cls)}
        for key in values:
            if key not in hints:
                known = [*hints, *TRAIN_FILE_KEYS]
                raise ValueError(f"unknown setting {key!r}{_did_you_mean(key, known)}")
        return check_values(values, config_cls), train
    except ValueError as e:
        raise UsageError(f"--config {path}: {e}") from e


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        if path.suffix.lower() in (".yaml", ".yml"):
            raise ValueError("reading YAML needs PyYAML: pip install pyyaml") from None
        return json.loads(text)
    try:
        return yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ValueError(f"invalid YAML: {e}") from e
