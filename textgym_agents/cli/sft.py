"""``textgym sft``: fine-tune a policy's LoRA adapter on a recorded dataset (TRL SFTTrainer).

The ``sft`` entry point of ``textgym.commands``; torch is imported when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from textgym.cli_common import (
    CLIError,
    add_env_arg,
    add_trust_arg,
    count,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    recorded_env,
    write_run_info,
)
from textgym.cli_record import fresh_output, positive_float
from textgym.plugins import FunctionCommand
from textgym_agents.cli.common import import_agents
from textgym_agents.cli.evaluate import (
    check_policy_files,
    evaluate_policy,
    format_table,
    load_policy,
)
from textgym_agents.cli.runs import read_run_info

__all__ = ["command", "configure", "run_sft"]

SFT_EPILOG = """\
examples:
  textgym sft data/blackjack-expert --output runs/bj-sft            # embedded model
  textgym sft data/bj-best --policy runs/bj --epochs 2 --output runs/bj-sft2
  textgym sft data/blackjack-expert --deduplicate --gradient-checkpointing --output runs/s

Trains the policy's LoRA adapter with TRL's SFTTrainer (loss on the replies only) and saves
the policy to --output, evaluated greedily before and after on the dataset's env.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the dataset, the starting model or policy and the fine-tuning settings."""
    parser.description = "Supervised warm start: fine-tune a policy's LoRA adapter on a dataset."
    parser.epilog = SFT_EPILOG
    parser.add_argument("dataset", metavar="DATASET", help="a directory written by textgym record")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--model", help="base model (default: embedded)")
    start.add_argument("--policy", metavar="RUN_DIR", help="continue a run or saved policy")
    parser.add_argument("--output", metavar="DIR", required=True, help="where the policy is saved")
    parser.add_argument(
        "--env", metavar="ENV_ID", help="env to evaluate on (default: the dataset's)"
    )
    parser.add_argument("--epochs", type=positive_float, default=1.0, help="default: 1")
    parser.add_argument("--learning-rate", type=positive_float, default=2e-4, help="default: 2e-4")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="default: 8")
    parser.add_argument("--max-length", type=positive_int, default=1024, help="default: 1024")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument(
        "--deduplicate", action="store_true", help="train on each distinct (prompt, reply) once"
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="less memory, more compute"
    )
    parser.add_argument(
        "--eval-episodes", type=count, default=50, help="greedy evaluation before and after"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_env_arg(parser)
    add_trust_arg(parser)


def run_sft(args: argparse.Namespace) -> int:
    """``textgym sft``: fine-tune a policy on the dataset, evaluate before and after, save."""
    if not Path(args.dataset).is_dir():
        raise CLIError(f"no such dataset directory: {args.dataset}")
    out = fresh_output(args.output)
    info = read_run_info(args.dataset)
    env_id, env_args = None, parse_env_args(args.env_arg)
    if args.env or info.get("env"):
        source = f"{args.dataset} (cli.json)"
        env_id, env_args = recorded_env(info, args.env, env_args, source, args.trust_run)
    if args.policy:
        check_policy_files(args.policy)  # before anything is built from its run's files
    env = make_env(env_id, env_args) if env_id else None
    agents = import_agents()
    target = args.policy or args.model or "embedded"
    policy, label = load_policy(target, env, trust_code=args.trust_run)
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


command = FunctionCommand(
    "sft", "fine-tune a policy on a recorded dataset (TRL SFTTrainer, LoRA)", configure, run_sft
)
"""``textgym sft``, the ``sft`` entry point of ``textgym.commands``."""
