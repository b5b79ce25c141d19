"""``textgym record`` and ``textgym sft``: record demonstrations, fine-tune a policy on them.

``record`` with a scripted expert needs the core package and ``datasets``; ``record --policy``
and ``sft`` import the training stack when they run.
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
    add_command,
    add_env_arg,
    count,
    import_agents,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    read_run_info,
    reply_choices,
    text_wrapper,
    write_run_info,
)

__all__ = ["add_parsers", "load_expert", "run_record", "run_sft"]

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
SFT_EPILOG = """\
examples:
  textgym sft data/blackjack-expert --output runs/bj-sft            # embedded model
  textgym sft data/bj-best --policy runs/bj --epochs 2 --output runs/bj-sft2
  textgym sft data/blackjack-expert --deduplicate --gradient-checkpointing --output runs/s

Trains the policy's LoRA adapter with TRL's SFTTrainer (loss on the replies only) and saves
the policy to --output, evaluated greedily before and after on the dataset's env.
"""


def add_parsers(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``record`` and ``sft`` commands."""
    record = add_command(
        subparsers,
        "record",
        common,
        help="record an expert's or a policy's episodes as a chat dataset",
        description="Play a text env with an expert or a policy; save every turn as a dataset.",
        epilog=RECORD_EPILOG,
    )
    record.add_argument(
        "env", nargs="?", metavar="ENV_ID", help=f"text env (default: {DEFAULT_ENV})"
    )
    who = record.add_mutually_exclusive_group(required=True)
    who.add_argument("--expert", metavar="MODULE:FUNCTION|random", help="a scripted expert")
    who.add_argument("--policy", metavar="RUN_DIR|MODEL", help="a run, saved policy or model")
    record.add_argument("--output", metavar="DIR", required=True, help="dataset directory")
    record.add_argument("--episodes", type=positive_int, default=500, help="default: 500")
    record.add_argument("--seed", type=int, default=0, help="episode k is seeded seed+k")
    record.add_argument(
        "--top-fraction", type=_fraction, help="keep only this best fraction of the episodes"
    )
    record.add_argument(
        "--num-envs", type=positive_int, default=16, help="envs a policy plays at once"
    )
    record.add_argument("--greedy", action="store_true", help="the policy replies greedily")
    add_env_arg(record)
    record.set_defaults(run=run_record, parser=record)

    sft = add_command(
        subparsers,
        "sft",
        common,
        help="fine-tune a policy on a recorded dataset (TRL SFTTrainer, LoRA)",
        description="Supervised warm start: fine-tune a policy's LoRA adapter on a dataset.",
        epilog=SFT_EPILOG,
    )
    sft.add_argument("dataset", metavar="DATASET", help="a directory written by textgym record")
    start = sft.add_mutually_exclusive_group()
    start.add_argument("--model", help="base model (default: embedded)")
    start.add_argument("--policy", metavar="RUN_DIR", help="continue a run or saved policy")
    sft.add_argument("--output", metavar="DIR", required=True, help="where the policy is saved")
    sft.add_argument("--env", metavar="ENV_ID", help="env to evaluate on (default: the dataset's)")
    sft.add_argument("--epochs", type=_positive_float, default=1.0, help="default: 1")
    sft.add_argument("--learning-rate", type=_positive_float, default=2e-4, help="default: 2e-4")
    sft.add_argument("--batch-size", type=positive_int, default=8, help="default: 8")
    sft.add_argument("--max-length", type=positive_int, default=1024, help="default: 1024")
    sft.add_argument("--seed", type=int, default=0, help="default: 0")
    sft.add_argument(
        "--deduplicate", action="store_true", help="train on each distinct (prompt, reply) once"
    )
    sft.add_argument(
        "--gradient-checkpointing", action="store_true", help="less memory, more compute"
    )
    sft.add_argument(
        "--eval-episodes", type=count, default=50, help="greedy evaluation before and after"
    )
    sft.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_env_arg(sft)
    sft.set_defaults(run=run_sft, parser=sft)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _fresh_output(path: str) -> Path:
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

    info = read_run_info(args.policy) if args.policy else {}
    env_id = args.env or info.get("env") or DEFAULT_ENV
    env_args = dict(info.get("env_args", {})) if env_id == info.get("env") else {}
    env_args.update(parse_env_args(args.env_arg))
    out = _fresh_output(args.output)
    env = make_env(env_id, env_args)
    if args.policy:
        from textgym.cli_eval import load_policy

        expert, label = load_policy(args.policy, reply_choices(env))
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


def run_sft(args: argparse.Namespace) -> int:
    """``textgym sft``: fine-tune a policy on the dataset, evaluate before and after, save."""
    if not Path(args.dataset).is_dir():
        raise CLIError(f"no such dataset directory: {args.dataset}")
    out = _fresh_output(args.output)
    info = read_run_info(args.dataset)
    env_id = args.env or info.get("env")
    env_args = dict(info.get("env_args", {})) if env_id == info.get("env") else {}
    env_args.update(parse_env_args(args.env_arg))
    env = make_env(env_id, env_args) if env_id else None
    choices = reply_choices(env) if env is not None else None
    agents = import_agents()
    from textgym.cli_eval import evaluate_policy, format_table, load_policy

    policy, label = load_policy(args.policy or args.model or "embedded", choices)
    results = []
    if env is not None and args.eval_episodes:
        print(f"Evaluating {label} on {args.eval_episodes} episodes...", flush=True)
        results.append((label, env_id, evaluate_policy(agents, policy, env, args.eval_episodes)))
    print(f"Fine-tuning {label} on {args.dataset}...", flush=True)
    try:
        metrics = agents.sft_warm_start(
            policy,
            args.dataset,
            epochs=args.epochs,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            max_length=args.max_length,
            gradient_checkpointing=args.gradient_checkpointing,
            deduplicate=args.deduplicate,
            seed=args.seed,
            progress=not args.no_progress,
        )
    except ValueError as e:
        raise CLIError(f"{args.dataset}: {one_line(e)}") from e
    print(
        f"SFT: {metrics['sft/steps']:.0f} steps on {metrics['sft/rows']:.0f} replies in "
        f"{metrics['sft/seconds']:.0f} s, loss {metrics['sft/loss_first']:.3f} -> "
        f"{metrics['sft/loss_last']:.3f}"
    )
    if env is not None and args.eval_episodes:
        print(f"Evaluating the fine-tuned policy on {args.eval_episodes} episodes...", flush=True)
        result = evaluate_policy(agents, policy, env, args.eval_episodes)
        results.append(("fine-tuned", env_id, result))
        print(format_table(results))
    policy.save(out)
    base = read_run_info(args.policy) if args.policy else {}
    write_run_info(
        out,
        {
            "env": env_id or base.get("env"),
            "env_args": env_args,
            "model": base.get("model") if args.policy else policy.base_info.get("name_or_path"),
            "sft": {"dataset": args.dataset, **metrics},
        },
    )
    target = f" {env_id}" if env_id else ""
    print(
        f"Policy written to {out}\nNext: textgym eval {out} | textgym play{target} --policy {out}"
    )
    return 0
