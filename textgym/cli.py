"""The ``textgym`` command: list and play text envs, train, evaluate and plot LLM agents.

    textgym envs                                  # registered text envs and their replies
    textgym play textgym/Blackjack-v1             # play as the model would, from the terminal
    textgym train textgym/Blackjack-v1            # PPO with LoRA; writes runs/<env>-<time>/
    textgym eval runs/Blackjack-v1-20250101-120000
    textgym plot runs/a runs/b --output curves.png

``envs`` and ``play`` need only the core package; ``train``, ``eval``, ``plot`` and
``play --policy`` import :mod:`textgym_agents` (``pip install 'textgym[agents]'``).
Exit codes: 0 success, 1 failure (one line on stderr), 2 usage error, 130 interrupted,
143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from textgym import cli_data, cli_eval, cli_train
from textgym.cli_common import (
    DEFAULT_ENV,
    CLIError,
    UsageError,
    add_command,
    add_env_arg,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    read_run_info,
    reply_choices,
    text_wrapper,
)

__all__ = ["main"]

EPILOG = """\
commands need only the core package except train, eval, plot, sft and play/record --policy,
which need the agents extra (pip install 'textgym[agents]'); record needs datasets.

examples:
  textgym envs
  textgym play textgym/FrozenLake-v1 -e is_slippery=false
  textgym train --episodes 300 --output runs/bj
  textgym eval runs/bj embedded
  textgym play textgym/Blackjack-v1 --policy runs/bj
  textgym plot runs/bj runs/bj-lr1e-4 --output curves.png
  textgym record textgym/Blackjack-v1 --expert benchmarks.warm_start:blackjack_expert \\
      --output data/bj
  textgym sft data/bj --output runs/bj-sft

exit codes: 0 ok, 1 failure (one line on stderr; --debug shows the traceback),
2 usage error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM); a training run saves a
checkpoint first.
"""
ENVS_EPILOG = """\
examples:
  textgym envs
  textgym envs textgym/Taxi-v4 --verbose     # the full system prompt and first observation
  textgym envs --json
"""
PLAY_EPILOG = """\
You see exactly what the model sees: the system prompt, each observation, the errors of
invalid replies. Type the reply (a line ending in \\ continues on the next line) or, where
the env lists its valid replies, the number of one. End of input (Ctrl-D) stops.

examples:
  textgym play textgym/Blackjack-v1
  textgym play textgym/FrozenLake-v1 -e is_slippery=false --episodes 3
  textgym play textgym/Blackjack-v1 --policy runs/bj --episodes 5 --delay 1
  echo '{"action": "stick"}' | textgym play textgym/Blackjack-v1
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``textgym`` parser; the PPOConfig flags of ``train`` only when ``command`` is train."""
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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    envs = add_command(
        commands,
        "envs",
        common,
        help="list the registered text envs and the replies they take",
        description="List the registered text envs with their action schemas.",
        epilog=ENVS_EPILOG,
    )
    envs.add_argument("ids", nargs="*", metavar="ENV_ID", help="envs to show (default: all)")
    envs.add_argument("-v", "--verbose", action="store_true", help="show the full prompt")
    envs.add_argument("--json", action="store_true", help="print JSON")
    envs.set_defaults(run=run_envs, parser=envs)

    play = add_command(
        commands,
        "play",
        common,
        help="play a text env in the terminal, as the model sees it",
        description="Play a text env in the terminal, or watch a trained policy play it.",
        epilog=PLAY_EPILOG,
    )
    play.add_argument(
        "env", nargs="?", metavar="ENV_ID", help=f"default: the --policy run's, else {DEFAULT_ENV}"
    )
    play.add_argument("--episodes", type=positive_int, default=1, help="episodes (default: 1)")
    play.add_argument("--seed", type=int, default=None, help="seed of the first episode")
    play.add_argument(
        "--policy", metavar="RUN_DIR|MODEL", help="let this run, policy or model play"
    )
    play.add_argument("--sample", action="store_true", help="the policy samples (not greedy)")
    play.add_argument("--delay", type=float, default=0.0, help="seconds between policy turns")
    add_env_arg(play)
    play.set_defaults(run=run_play, parser=play)

    cli_train.add_parser(commands, common, train_flags=command == "train")
    cli_eval.add_parsers(commands, common)
    cli_data.add_parsers(commands, common)
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


# --- envs ------------------------------------------------------------------------------------


def _describe_env(env_id: str, verbose: bool) -> dict[str, Any]:
    env = make_env(env_id)
    try:
        wrapper = text_wrapper(env)
        base = env.spec.kwargs.get("env_id") if env.spec is not None else None
        row: dict[str, Any] = {
            "id": env_id,
            "base": base if isinstance(base, str) else type(env.unwrapped).__name__,
            "max_episode_steps": env.spec.max_episode_steps if env.spec else None,
            "reply_choices": reply_choices(env),
            "instructions": wrapper.parser.instructions() if wrapper is not None else "",
        }
        if verbose:
            messages, _ = env.reset(seed=0)
            row["messages"] = messages
        return row
    finally:
        env.close()


def run_envs(args: argparse.Namespace) -> int:
    """``textgym envs``: each registered text env with the replies it accepts."""
    from textgym.registration import registered_ids

    rows = [_describe_env(env_id, args.verbose) for env_id in args.ids or registered_ids()]
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for row in rows:
        limit = f", at most {row['max_episode_steps']} turns" if row["max_episode_steps"] else ""
        print(f"{row['id']}  ({row['base']}{limit})")
        if row["reply_choices"] and not args.verbose:
            print("  replies: " + " | ".join(row["reply_choices"]))
        elif not args.verbose:
            print(_indent("free text: " + row["instructions"], "  ", "    "))
        for message in row.get("messages", []):
            print(_indent(message["content"], f"  [{message['role']}] ", "    "))
        if args.verbose:
            print()
    if not args.ids:
        print(f"\n{len(rows)} text envs. Prompt: textgym envs ID -v. Play one: textgym play ID")
    return 0


def _indent(text: str, first: str, rest: str) -> str:
    lines = text.splitlines() or [""]
    return "\n".join([first + lines[0], *(rest + line for line in lines[1:])])


# --- play ------------------------------------------------------------------------------------


def _read_reply(choices: list[str] | None) -> str | None:
    """A reply typed by the person (a number picks a listed reply); None at end of input."""
    try:
        line = input("[assistant] > ")
        while line.endswith("\\"):
            line = line[:-1] + "\n" + input("... ")
    except EOFError:
        print()
        return None
    if choices and line.strip().isdigit() and 1 <= int(line) <= len(choices):
        line = choices[int(line) - 1]
        print(line)
    elif not sys.stdin.isatty():
        print(line)  # echo piped input so the transcript reads like a conversation
    return line


def _show(message: dict[str, str], note: str = "") -> None:
    print(f"\n[{message['role']}]{note}\n{message['content']}")


def run_play(args: argparse.Namespace) -> int:
    """``textgym play``: a person (or ``--policy``) plays the text env in the terminal."""
    info = read_run_info(args.policy) if args.policy else {}
    env_id = args.env or info.get("env") or DEFAULT_ENV
    env_args = dict(info.get("env_args", {})) if env_id == info.get("env") else {}
    env_args.update(parse_env_args(args.env_arg))
    env = make_env(env_id, env_args)
    choices = reply_choices(env)
    policy = None
    if args.policy:
        from textgym.cli_eval import load_policy

        policy, label = load_policy(args.policy, choices)
        print(f"{label} plays {env_id}", flush=True)
    returns = []
    for episode in range(args.episodes):
        seed = None if args.seed is None else args.seed + episode
        messages, _ = env.reset(seed=seed)
        print(f"\n=== episode {episode + 1} of {args.episodes} ===")
        for message in messages:
            _show(message)
        if choices and policy is None:
            listed = "  ".join(f"{i}) {c}" for i, c in enumerate(choices, 1))
            print(f"\n(type a reply, or the number of a valid one: {listed})")
        total, done = 0.0, False
        while not done:
            if policy is None:
                print()
                reply = _read_reply(choices)
                if reply is None:
                    print("(end of input)")
                    return 0
            else:
                time.sleep(args.delay)
                kwargs = {"choices": choices} if policy.wants_choices else {}
                if getattr(policy, "wants_schemas", False):
                    kwargs["schemas"] = env.get_wrapper_attr("reply_schema")()
                reply = policy.act(messages, greedy=not args.sample, **kwargs)
                _show({"role": "assistant", "content": reply})
            messages, reward, terminated, truncated, step_info = env.step(reply)
            total += float(reward)
            invalid = ", invalid reply" if step_info.get("invalid") else ""
            print(f"(reward {float(reward):+g}, return {total:+g}{invalid})")
            done = terminated or truncated
            note = " (the final observation; the model does not reply to it)" if done else ""
            _show(messages[-1], note)
        end = "terminated" if terminated else "truncated"
        print(f"\n(episode {episode + 1} over, {end}: return {total:+g})")
        returns.append(total)
    if len(returns) > 1:
        print(f"(mean return over {len(returns)} episodes: {sum(returns) / len(returns):+.3f})")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
