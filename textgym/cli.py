"""The ``textgym`` command: list and play text envs, record datasets; plugins add the rest.

    textgym envs                                  # registered text envs and their replies
    textgym play textgym/Blackjack-v1             # play as the model would, from the terminal
    textgym record textgym/Blackjack-v1 --expert mylab.experts:basic_strategy --output data/bj
    textgym serve textgym/Blackjack-v1            # an OpenEnv server (the openenv extra)
    textgym train textgym/Blackjack-v1            # from the agents extra (a plugin)

``envs``, ``play``, ``record`` and ``serve`` are built in and need only the core package
(``serve`` also the openenv extra). Other commands
(``train``, ``eval``, ``plot``, ``sft`` of ``pip install 'textgym[agents]'``) are
:class:`~textgym.plugins.Command` plugins found through the ``textgym.commands`` entry points;
this module never imports them by name. Exit codes: 0 success, 1 failure (one line on stderr),
2 usage error, 130 interrupted, 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint

from textgym.cli_common import CLIError, UsageError, add_command, one_line
from textgym.cli_play import ENVS, PLAY
from textgym.cli_record import RECORD
from textgym.cli_serve import SERVE
from textgym.plugins import Command, command_entry_points, load_command, missing_command_hint

__all__ = ["BUILTIN_COMMANDS", "build_parser", "main"]

BUILTIN_COMMANDS: tuple[Command, ...] = (ENVS, PLAY, RECORD, SERVE)
"""The commands of the core package; plugins cannot replace them."""

EPILOG = """\
envs, play, record and serve need only the core package (record needs datasets, serve the
openenv extra); train, eval, plot
and sft, and play/record --policy, come with the agents extra (pip install 'textgym[agents]').

examples:
  textgym envs
  textgym play textgym/FrozenLake-v1 -e is_slippery=false
  textgym train --episodes 300 --output runs/bj
  textgym eval runs/bj embedded
  textgym play textgym/Blackjack-v1 --policy runs/bj
  textgym plot runs/bj runs/bj-lr1e-4 --output curves.png
  textgym serve textgym/Blackjack-v1 --port 8000
  textgym record textgym/Blackjack-v1 --expert benchmarks.warm_start:blackjack_expert \\
      --output data/bj
  textgym sft data/bj --output runs/bj-sft

exit codes: 0 ok, 1 failure (one line on stderr; --debug shows the traceback),
2 usage error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM); a training run saves a
checkpoint first.
"""


def _commands(selected: str | None) -> list[Command]:
    """The commands to put in the parser: only ``selected`` when it is known, else all.

    Loading a plugin imports its module, so a known command loads no other plugin; listing
    them all (``textgym --help``, an unknown command) loads every plugin, and one that fails
    to import is listed with the reason instead of breaking the listing.
    """
    builtin = {command.name: command for command in BUILTIN_COMMANDS}
    plugins: dict[str, EntryPoint] = {
        name: ep for name, ep in command_entry_points().items() if name not in builtin
    }
    if selected in builtin:
        return [builtin[selected]]
    if selected in plugins:
        return [load_command(plugins[selected])]
    hint = missing_command_hint(selected) if selected is not None else None
    if hint is not None:
        raise CLIError(hint)
    listed = list(builtin.values())
    for name, entry_point in plugins.items():
        try:
            listed.append(load_command(entry_point))
        except CLIError as e:
            listed.append(_Unavailable(name, one_line(e)))
    return listed


class _Unavailable:
    """A plugin command that failed to load, listed in ``--help`` with the reason."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.help, self.reason = name, f"(unavailable: {reason})", reason

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Nothing to add: the command cannot run."""

    def run(self, args: argparse.Namespace) -> int:
        """Fail with the reason it could not be loaded."""
        raise CLIError(self.reason)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``textgym`` parser; with a known ``command``, only that command is set up.

    Raises:
        CLIError: ``command`` is a plugin that cannot be loaded, or one a missing extra
            provides (the message says what to install).
    """
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser = argparse.ArgumentParser(
        prog="textgym",
        description="Gymnasium envs as text envs for LLM agents: list, play, train, evaluate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,  # an abbreviation could turn ambiguous when a setting is added
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listed = _commands(command)
    for each in listed:
        sub = add_command(subparsers, each.name, common, help=each.help)
        if each.name == command:  # set up only what runs: a plugin's configure may import torch
            each.configure(sub)
        sub.set_defaults(run=each.run, parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``textgym`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    debug = "--debug" in argv
    try:
        parser = build_parser(command)
        args, extras = parser.parse_known_args(argv)
        if extras:
            _unrecognized(args.parser, extras)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    except CLIError as e:
        return _fail(command, e, debug)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print(f"textgym {args.command}: interrupted", file=sys.stderr)
        return 130
    except UsageError as e:
        args.parser.print_usage(sys.stderr)
        print(f"textgym {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `textgym envs | head`
        sys.stdout = None  # type: ignore[assignment]  # nothing left to flush
        return 0
    except Exception as e:
        return _fail(args.command, e, args.debug)


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> None:
    """Exit with a usage error naming the unknown arguments, with close matches."""
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    hints = {}
    for arg in extras:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1) if flag.startswith("--") else []
        if close:
            hints[flag] = close[0]
    if len(hints) == 1:
        hint = f"; did you mean {next(iter(hints.values()))}?"
    else:
        hint = "".join(f"; {flag}: did you mean {close}?" for flag, close in hints.items())
    parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _fail(command: str | None, error: Exception, debug: bool) -> int:
    if debug:
        raise error
    hint = "" if isinstance(error, CLIError) else " (--debug shows the traceback)"
    print(f"textgym {command or ''}: error: {one_line(error)}{hint}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
