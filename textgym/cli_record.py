"""``textgym record``: play a text env with an expert or a policy, save its turns as a dataset.

A scripted expert needs the core package and ``datasets``; ``record --policy`` loads the policy
through a :class:`~textgym.plugins.PolicyLoader` (the agents extra installs one).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textgym.cli_common import (
    DEFAULT_ENV,
    CLIError,
    UsageError,
    add_env_arg,
    add_trust_arg,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    recorded_env,
    text_wrapper,
    write_run_info,
)
from textgym.plugins import find_policy_loader

__all__ = [
    "RECORD",
    "RecordCommand",
    "fresh_output",
    "load_expert",
    "positive_float",
    "run_record",
]

RECORD_EPILOG = """\
An expert is a function of the base env's raw observation that returns an env action (its
reply is the env's own example reply for that action), given as MODULE:FUNCTION (the current
directory is importable), or 'random' (uniform env actions). --policy records what a run,
a saved policy or a model replies instead (invalid replies included, marked in the 'invalid'
column). --top-fraction keeps only the best episodes by return (rejection sampling).

examples:
  textgym record textgym/Blackjack-v1 --expert mylab.experts:basic_strategy --output data/bj
  textgym record textgym/FrozenLake-v1 -e is_slippery=false --expert random --episodes 2000 \\
      --top-fraction 0.05 --output data/frozenlake-lucky
  textgym record --policy runs/bj --episodes 400 --top-fraction 0.2 --output data/bj-best

The output directory is a Hugging Face dataset (datasets.load_from_disk) of chat messages,
one row per turn, plus cli.json naming the env, which `textgym sft` reads.
"""


class RecordCommand:
    """``textgym record``: an expert's or a policy's episodes as a chat dataset."""

    name = "record"
    help = "record an expert's or a policy's episodes as a chat dataset"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the env, who plays (``--expert`` or ``--policy``) and what is kept."""
        parser.description = (
            "Play a text env with an expert or a policy; save every turn as a dataset."
        )
        parser.epilog = RECORD_EPILOG
        parser.add_argument(
            "env", nargs="?", metavar="ENV_ID", help=f"text env (default: {DEFAULT_ENV})"
        )
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--expert", metavar="MODULE:FUNCTION|random", help="a scripted expert")
        who.add_argument("--policy", metavar="RUN_DIR|MODEL", help="a run, saved policy or model")
        parser.add_argument("--output", metavar="DIR", required=True, help="dataset directory")
        parser.add_argument("--episodes", type=positive_int, default=500, help="default: 500")
        parser.add_argument("--seed", type=int, default=0, help="episode k is seeded seed+k")
        parser.add_argument(
            "--top-fraction", type=_fraction, help="keep only this best fraction of the episodes"
        )
        parser.add_argument(
            "--num-envs", type=positive_int, default=16, help="envs a policy plays at once"
        )
        parser.add_argument("--greedy", action="store_true", help="the policy replies greedily")
        add_env_arg(parser)
        add_trust_arg(parser)

    def run(self, args: argparse.Namespace) -> int:
        """Record (see :func:`run_record`)."""
        return run_record(args)


RECORD = RecordCommand()


def positive_float(text: str) -> float:
    """Parse a finite number > 0 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def fresh_output(path: str) -> Path:
    """``path`` as the output directory of a command; it must be missing or empty."""
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CLIError(f"{out} already exists and is not empty; pick another --output")
    return out


def load_expert(spec: str, env: Any, seed: int) -> Callable[[Any], Any]:
    """The expert ``spec`` names: ``random`` or ``MODULE:FUNCTION`` (cwd importable).

    Example:
        >>> import gymnasium as gym, textgym
        >>> load_expert("random", gym.make("textgym/Blackjack-v1"), seed=0)(None) in (0, 1)
        True
        >>> load_expert("json:loads", None, 0)('"hit"')
        'hit'
    """
    if spec == "random":
        wrapper = text_wrapper(env)
        space = (wrapper.env if wrapper is not None else env).action_space
        space.seed(seed)
        return lambda obs: space.sample()
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise UsageError(f"--expert expects MODULE:FUNCTION or 'random', got {spec!r}")
    if os.getcwd() not in sys.path:  # the `textgym` script's sys.path lacks the cwd
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise CLIError(f"--expert: cannot import {module_name}: {one_line(e)}") from e
    expert = module
    for part in name.split("."):
        expert = getattr(expert, part, None)
    if not callable(expert):
        raise CLIError(f"--expert: {module_name} has no function {name}")
    return expert  # type: ignore[return-value]


def run_record(args: argparse.Namespace) -> int:
    """``textgym record``: play the env with the expert or policy and save the dataset."""
    from textgym.recording import record_trajectories

    loader, info = find_policy_loader(args.policy) if args.policy else (None, {})
    env_id, env_args = recorded_env(
        info, args.env, parse_env_args(args.env_arg), f"{args.policy} (cli.json)", args.trust_run
    )
    out = fresh_output(args.output)
    env = make_env(env_id, env_args)
    if loader is not None:
        # trust_code only when asked for: loaders written before the keyword still work
        trust = {"trust_code": True} if args.trust_run else {}
        expert, label = loader.load(args.policy, env, **trust)
        num_envs = args.num_envs
    else:
        expert, label, num_envs = load_expert(args.expert, env, args.seed), args.expert, 1
    env.close()
    print(f"Recording {args.episodes} episodes of {env_id} with {label}...", flush=True)
    try:
        dataset = record_trajectories(
            env_id,
            expert,
            args.episodes,
            seed=args.seed,
            top_fraction=args.top_fraction,
            num_envs=num_envs,
            greedy=args.greedy,
            env_kwargs=env_args,
        )
    except ImportError as e:
        raise CLIError(one_line(e)) from e
    import datasets

    datasets.disable_progress_bars()  # the command prints its own summary
    dataset.save_to_disk(os.fspath(out))
    episodes = sorted(set(dataset["episode"]))
    returns = dict(zip(dataset["episode"], dataset["return"], strict=True))
    mean = sum(returns.values()) / len(returns)
    invalid = sum(dataset["invalid"])
    write_run_info(
        out,
        {
            "env": env_id,
            "env_args": env_args,
            "expert": label,
            "episodes": args.episodes,
            "seed": args.seed,
            "top_fraction": args.top_fraction,
        },
    )
    kept = f" (the best {len(episodes)})" if args.top_fraction else ""
    print(
        f"Wrote {len(dataset)} turns of {len(episodes)} episodes{kept} to {out}: mean return "
        f"{mean:+.3f}, {invalid} invalid replies\nNext: textgym sft {out} --output runs/sft"
    )
    return 0
