"""Pieces shared by the ``textgym`` commands and their plugins: errors, argument types, envs.

Plugin commands (:mod:`textgym.plugins`) use these too, so every command fails the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from textgym.atomic import atomic_write_json
from textgym.checker import find_text_wrapper
from textgym.episodes import reply_choices
from textgym.spaces import ChatMessages
from textgym.trust import UntrustedCodeError, check_env_args
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "DEFAULT_ENV",
    "RUN_INFO_FILE",
    "CLIError",
    "UsageError",
    "add_command",
    "add_env_arg",
    "add_trust_arg",
    "count",
    "make_env",
    "one_line",
    "parse_env_args",
    "positive_int",
    "recorded_env",
    "recorded_env_args",
    "reply_choices",
    "text_wrapper",
    "write_run_info",
]

DEFAULT_ENV = "textgym/Blackjack-v1"
RUN_INFO_FILE = "cli.json"  # what a command was asked for (env, its args), so others reuse it


class CLIError(Exception):
    """A failure explained in one line on stderr (exit code 1)."""


class UsageError(CLIError):
    """A bad option value found after parsing (exit code 2, like argparse's own errors)."""


def count(text: str) -> int:
    """Parse an int >= 0 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """Parse an int >= 1 (an argparse type)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def add_env_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``-e/--env-arg KEY=VALUE`` (repeatable), read by :func:`parse_env_args`."""
    parser.add_argument(
        "-e",
        "--env-arg",
        action="append",
        metavar="KEY=VALUE",
        help="env option (VALUE read as JSON, else text), e.g. -e is_slippery=false; repeatable",
    )


def add_trust_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--trust-run``: build what a run directory names even when it is not known code."""
    parser.add_argument(
        "--trust-run",
        action="store_true",
        help="build the env (entry point, formatter, parser) that a run directory, dataset or "
        "saved policy names even when textgym does not know it; only for files you trust",
    )


def recorded_env(
    info: Mapping[str, Any],
    env_id: str | None,
    env_args: Mapping[str, Any],
    source: str,
    trust: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The env id and arguments to make: the command line's, completed by a ``cli.json``.

    The id is ``env_id`` when given, else ``info["env"]``, else :data:`DEFAULT_ENV`; the
    arguments are ``info["env_args"]`` when the id is the recorded one, updated by
    ``env_args`` (``-e KEY=VALUE``, which win). What was read from ``info`` must name only
    code textgym knows (:mod:`textgym.trust`) unless ``trust``.

    Raises:
        CLIError: The file names unknown code (the message says how to opt in).

    Example:
        >>> import textgym
        >>> recorded_env({"env": "textgym/Blackjack-v1", "env_args": {"history": 2}}, None, {}, "x")
        ('textgym/Blackjack-v1', {'history': 2})
    """
    chosen = env_id or info.get("env") or DEFAULT_ENV
    args = recorded_env_args(info, chosen, source, trust)
    args.update(env_args)
    return chosen, args


def recorded_env_args(
    info: Mapping[str, Any], env_id: str, source: str, trust: bool = False
) -> dict[str, Any]:
    """The env arguments a ``cli.json`` holds for ``env_id`` (``{}`` for another env).

    Raises:
        CLIError: Unless ``trust``, the arguments name code textgym does not know.
    """
    if env_id != info.get("env"):
        return {}
    args = dict(info.get("env_args") or {})
    if not trust:
        try:
            check_env_args(env_id, args, source)
        except UntrustedCodeError as e:
            raise CLIError(str(e)) from None
    return args


def parse_env_args(items: Sequence[str] | None) -> dict[str, Any]:
    """Turn ``KEY=VALUE`` strings into env keyword arguments (VALUE as JSON, else as text).

    Example:
        >>> parse_env_args(["is_slippery=false", "map_name=8x8", "history=2"])
        {'is_slippery': False, 'map_name': '8x8', 'history': 2}
    """
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--env-arg expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        result[key.strip()] = value
    return result


def make_env(env_id: str, env_args: Mapping[str, Any] | None = None) -> gym.Env[Any, Any]:
    """``gym.make`` a text env, with one-line errors for unknown ids and bad arguments."""
    try:
        env = gym.make(env_id, **dict(env_args or {}))
    except gym.error.Error as e:
        raise CLIError(f"{e} (`textgym envs` lists the text envs)") from e
    except (TypeError, ValueError, ModuleNotFoundError, ConnectionError) as e:
        raise CLIError(f"could not make {env_id}: {e}") from e
    if not isinstance(env.observation_space, ChatMessages):
        env.close()
        hint = f"; try textgym/{env_id}" if f"textgym/{env_id}" in gym.registry else ""
        raise CLIError(f"{env_id} is not a text env (its observations are not chat messages){hint}")
    return env


def text_wrapper(env: gym.Env[Any, Any]) -> TextEnvWrapper | None:
    """The :class:`TextEnvWrapper` inside ``env``'s wrapper stack, if there is one."""
    try:
        return find_text_wrapper(env)
    except ValueError:
        return None


def add_command(
    subparsers: Any, name: str, common: argparse.ArgumentParser, **kwargs: Any
) -> argparse.ArgumentParser:
    """Add a subcommand with the settings every ``textgym`` command shares."""
    return subparsers.add_parser(  # type: ignore[no-any-return]
        name,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an abbreviation could turn ambiguous when a setting is added
        **kwargs,
    )


def write_run_info(run_dir: Path, info: Mapping[str, Any]) -> None:
    """Write ``cli.json`` atomically, so a crash never leaves half of it."""
    atomic_write_json(run_dir / RUN_INFO_FILE, dict(info))


def one_line(error: BaseException) -> str:
    """An exception as one line: its message with whitespace collapsed (or its type)."""
    text = " ".join(str(error).split())
    if isinstance(error, KeyError | AttributeError) or not text:
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text
