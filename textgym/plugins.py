"""Plugins of the ``textgym`` command: subcommands and policy loaders found through entry points.

The core package never imports the training stack; the stack (or any package) adds commands to
``textgym`` and teaches ``play``/``record --policy`` to load its policies, the way pytest and
mkdocs find their plugins.

Two entry-point groups, declared in the plugin's ``pyproject.toml``::

    [project.entry-points."textgym.commands"]
    train = "textgym_agents.cli.train:command"     # NAME = a Command (or a class making one)

    [project.entry-points."textgym.policies"]
    textgym_agents = "textgym_agents.cli.policies:loader"   # a PolicyLoader (or a class)

The entry point's name is the subcommand's name, so ``textgym envs`` loads no plugin at all and
``textgym train`` loads only ``train``; ``textgym --help`` loads them all to show their help.
A plugin module should therefore import its heavy dependencies inside ``configure``/``run``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from textgym.cli_common import CLIError

__all__ = [
    "AGENTS_HINT",
    "COMMANDS_GROUP",
    "POLICIES_GROUP",
    "Command",
    "FunctionCommand",
    "PolicyLoader",
    "UnknownPolicyError",
    "command_entry_points",
    "find_policy_loader",
    "load_command",
    "missing_command_hint",
    "policy_loaders",
]

COMMANDS_GROUP = "textgym.commands"
"""Entry-point group of subcommands: each entry point names one :class:`Command`."""
POLICIES_GROUP = "textgym.policies"
"""Entry-point group of :class:`PolicyLoader` s, used by ``play`` and ``record --policy``."""
AGENTS_HINT = "install the training stack with: pip install 'textgym[agents]'"
# Commands the agents extra provides: named only to turn "invalid choice" into an install hint.
AGENTS_COMMANDS = ("eval", "plot", "sft", "train")


@runtime_checkable
class Command(Protocol):
    """A ``textgym`` subcommand: its name, one line of help, its arguments and what it does.

    ``textgym`` makes the subparser (with ``--debug`` and its help formatting) and calls
    :meth:`configure` only when this command is the one being run or its help is shown, so
    ``configure`` may import heavy modules. Errors: raise :class:`~textgym.cli_common.CLIError`
    for a one-line failure (exit 1), :class:`~textgym.cli_common.UsageError` for a bad option
    value (exit 2); any other exception is shown in one line too (``--debug``: traceback).

    Example:
        >>> import argparse
        >>> class Hello:
        ...     name, help = "hello", "say hello"
        ...     def configure(self, parser):
        ...         parser.add_argument("who")
        ...     def run(self, args):
        ...         print(f"hello {args.who}")
        ...         return 0
        >>> isinstance(Hello(), Command)
        True
    """

    name: str
    """The subcommand, ``textgym NAME``; equal to its entry point's name."""
    help: str
    """One line shown by ``textgym --help``."""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the arguments; may set ``parser.description``, ``epilog`` and ``usage`` too."""
        ...

    def run(self, args: argparse.Namespace) -> int | None:
        """Do the command with the parsed ``args``; return the exit code (None means 0)."""
        ...


@dataclass(frozen=True)
class FunctionCommand:
    """A :class:`Command` made of two functions, for plugins that need no class of their own.

    Example:
        >>> hello = FunctionCommand(
        ...     "hello", "say hello", lambda p: p.add_argument("who"), lambda a: print(a.who)
        ... )
        >>> isinstance(hello, Command)
        True
    """

    name: str
    help: str
    configure_parser: Callable[[argparse.ArgumentParser], Any]
    run_command: Callable[[argparse.Namespace], int | None]

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the arguments (``configure_parser(parser)``)."""
        self.configure_parser(parser)

    def run(self, args: argparse.Namespace) -> int | None:
        """Run the command (``run_command(args)``)."""
        return self.run_command(args)


class PolicyLoader(Protocol):
    """Loads what ``--policy TARGET`` names (a run directory, a saved policy, a model...).

    ``play --policy`` and ``record --policy`` first ask :meth:`run_info` which env the target
    was trained on (so the command can default to it), then :meth:`load` it for the env they
    made. A loader raises :class:`UnknownPolicyError` from :meth:`run_info` for a target it
    does not recognise, so the next loader (in entry-point name order) is asked.
    """

    def run_info(self, target: str) -> Mapping[str, Any]:
        """What the target's run recorded, e.g. ``{"env": ID, "env_args": {...}}`` (or ``{}``)."""
        ...

    def load(
        self, target: str, env: gym.Env[Any, Any], *, trust_code: bool = False
    ) -> tuple[Any, str]:
        """``(policy, label)`` for ``env``; ``label`` names it in the command's output.

        A saved policy that names code textgym does not know (:mod:`textgym.trust`) is refused
        unless ``trust_code`` (``--trust-run``), with a :class:`~textgym.cli_common.CLIError`.
        ``play`` and ``record`` pass ``trust_code`` only when it is true, so a loader without
        the keyword keeps working for files that need no opt-in.

        The policy is a :class:`textgym.policy.Policy` (what ``play`` and
        :func:`~textgym.recording.record_trajectories` call): ``act_batch(batch, choices=...,
        schemas=..., greedy=...)``, given the valid replies when its ``wants_choices`` is true
        and the reply schemas when ``wants_schemas`` is.
        """
        ...


class UnknownPolicyError(CLIError):
    """A :class:`PolicyLoader` does not recognise the ``--policy`` target."""


def _load(entry_point: EntryPoint, what: str) -> Any:
    """Load an entry point; an object that is a class is instantiated."""
    try:
        value = entry_point.load()
    except ImportError as e:
        raise CLIError(
            f"{what} could not be imported ({' '.join(str(e).split())}); {AGENTS_HINT}"
        ) from e
    return value() if isinstance(value, type) else value


def command_entry_points() -> dict[str, EntryPoint]:
    """The installed ``textgym.commands`` entry points by command name (none loaded)."""
    return {ep.name: ep for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)}


def load_command(entry_point: EntryPoint) -> Command:
    """Load the :class:`Command` an entry point names, checking its surface and name.

    Raises:
        CLIError: It cannot be imported (with the install hint), or is not a Command named
            like its entry point.
    """
    command = _load(entry_point, f"the command {entry_point.name!r} ({entry_point.value})")
    if not isinstance(command, Command):
        raise CLIError(
            f"entry point {entry_point.name} = {entry_point.value} of {COMMANDS_GROUP} is not a "
            f"textgym Command (name, help, configure, run), got {type(command).__name__}"
        )
    if command.name != entry_point.name:
        raise CLIError(
            f"entry point {entry_point.name} = {entry_point.value} of {COMMANDS_GROUP} names "
            f"the command {command.name!r}; expected {entry_point.name!r}"
        )
    return command


def missing_command_hint(name: str) -> str | None:
    """The install hint for a command that a missing extra would provide, else None."""
    if name in AGENTS_COMMANDS:
        return f"`textgym {name}` comes with the training stack, which is not installed; " + (
            AGENTS_HINT
        )
    return None


def policy_loaders() -> list[EntryPoint]:
    """The installed ``textgym.policies`` entry points, in name order (none loaded)."""
    return sorted(entry_points(group=POLICIES_GROUP), key=lambda ep: ep.name)


def find_policy_loader(target: str) -> tuple[PolicyLoader, Mapping[str, Any]]:
    """The first installed loader that recognises ``target``, with the target's run info.

    Raises:
        CLIError: No loader is installed (the install hint), or none recognises ``target``
            (the first loader's explanation).
    """
    found = policy_loaders()
    if not found:
        raise CLIError(f"--policy needs a policy loader, and none is installed; {AGENTS_HINT}")
    unknown: list[UnknownPolicyError] = []
    for entry_point in found:
        loader = _load(entry_point, f"the policy loader {entry_point.name!r}")
        try:
            return loader, loader.run_info(target)
        except UnknownPolicyError as e:
            unknown.append(e)
    raise unknown[0]
