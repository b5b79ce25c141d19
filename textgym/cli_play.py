"""``textgym envs`` and ``textgym play``: list the text envs, play one as the model sees it.

Both need only the core package; ``play --policy`` loads the policy through a
:class:`~textgym.plugins.PolicyLoader` (the agents extra installs one).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from textgym.cli_common import (
    DEFAULT_ENV,
    CLIError,
    add_env_arg,
    add_trust_arg,
    make_env,
    parse_env_args,
    positive_int,
    recorded_env,
    reply_choices,
    text_wrapper,
)
from textgym.extras import MissingExtraError
from textgym.plugins import find_policy_loader

__all__ = ["ENVS", "PLAY", "EnvsCommand", "PlayCommand", "run_envs", "run_play"]

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


class EnvsCommand:
    """``textgym envs``: the registered text envs and the replies they take."""

    name = "envs"
    help = "list the registered text envs and the replies they take"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the ids to show, ``--verbose`` and ``--json``."""
        parser.description = "List the registered text envs with their action schemas."
        parser.epilog = ENVS_EPILOG
        parser.add_argument("ids", nargs="*", metavar="ENV_ID", help="envs to show (default: all)")
        parser.add_argument("-v", "--verbose", action="store_true", help="show the full prompt")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def run(self, args: argparse.Namespace) -> int:
        """List the envs (see :func:`run_envs`)."""
        return run_envs(args)


class PlayCommand:
    """``textgym play``: a person, or a ``--policy``, plays a text env in the terminal."""

    name = "play"
    help = "play a text env in the terminal, as the model sees it"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the env, episodes, seed and the ``--policy`` options."""
        parser.description = "Play a text env in the terminal, or watch a trained policy play it."
        parser.epilog = PLAY_EPILOG
        parser.add_argument(
            "env",
            nargs="?",
            metavar="ENV_ID",
            help=f"default: the --policy run's, else {DEFAULT_ENV}",
        )
        parser.add_argument(
            "--episodes", type=positive_int, default=1, help="episodes (default: 1)"
        )
        parser.add_argument("--seed", type=int, default=None, help="seed of the first episode")
        parser.add_argument(
            "--policy", metavar="RUN_DIR|MODEL", help="let this run, policy or model play"
        )
        parser.add_argument("--sample", action="store_true", help="the policy samples (not greedy)")
        parser.add_argument("--delay", type=float, default=0.0, help="seconds between policy turns")
        add_env_arg(parser)
        add_trust_arg(parser)

    def run(self, args: argparse.Namespace) -> int:
        """Play (see :func:`run_play`)."""
        return run_play(args)


ENVS = EnvsCommand()
PLAY = PlayCommand()


# --- envs ------------------------------------------------------------------------------------


def _describe_env(env_id: str, verbose: bool) -> dict[str, Any]:
    try:
        env = make_env(env_id)
    except CLIError as e:
        if not isinstance(e.__cause__, MissingExtraError | ConnectionError):
            raise  # an extra to install, or a server to start (textgym/OpenEnv-v0)
        # Listed anyway, with the line that installs what it needs.
        return {
            "id": env_id,
            "base": env_id.split("/")[-1],
            "max_episode_steps": None,
            "reply_choices": None,
            "instructions": "",
            "unavailable": str(e.__cause__),
        }
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
        if "unavailable" in row:
            print(f"  unavailable: {row['unavailable']}")
        elif row["reply_choices"] and not args.verbose:
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
    loader, info = find_policy_loader(args.policy) if args.policy else (None, {})
    env_id, env_args = recorded_env(
        info, args.env, parse_env_args(args.env_arg), f"{args.policy} (cli.json)", args.trust_run
    )
    env = make_env(env_id, env_args)
    choices = reply_choices(env)
    policy = None
    if loader is not None:
        # trust_code only when asked for: loaders written before the keyword still work
        trust = {"trust_code": True} if args.trust_run else {}
        policy, label = loader.load(args.policy, env, **trust)
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
                kwargs = {"choices": [choices]} if policy.wants_choices else {}
                if policy.wants_schemas:
                    kwargs["schemas"] = [env.get_wrapper_attr("reply_schema")()]
                reply = policy.act_batch([messages], greedy=not args.sample, **kwargs)[0]
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
