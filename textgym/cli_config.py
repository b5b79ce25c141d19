"""Settings of ``textgym train``: a flag per ``PPOConfig`` field, config files, env defaults.

The functions take the config class as an argument, so this module imports no training code:
the ``train`` parser is only built (and torch only imported) when ``train`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from textgym.cli_common import UsageError

__all__ = [
    "FLAG_PREFIX",
    "CHOICE_DEFAULTS",
    "QUICK_DEFAULTS",
    "TRAIN_FILE_KEYS",
    "add_config_flags",
    "check_values",
    "env_defaults",
    "flag_values",
    "read_config_file",
    "reply_prefix_of",
]

FLAG_PREFIX = "ppo:"  # argparse dest of a PPOConfig flag: never clashes with the CLI's own
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


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.name in ENV_DEFAULT_NOTES:
        return ENV_DEFAULT_NOTES[field.name]
    if field.name in QUICK_DEFAULTS:
        return repr(QUICK_DEFAULTS[field.name])
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
    group = parser.add_argument_group(
        f"{config_cls.__name__} settings",
        "Every field of the training config; flags override --config FILE, which overrides\n"
        "these defaults. Values: numbers, true/false (or --flag/--no-flag), none for optional\n"
        "ones, lists as several words (--stop-strings '\"' '}').",
    )
    for field, hint in _fields(config_cls):
        inner, optional = _split_optional(hint)
        help_text = f"{field.metadata.get('help', '')} (default: {_default_text(field)})"
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
