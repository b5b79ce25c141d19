"""The SFT warm start by precision: seconds and what it learns, fp32 vs bf16, in one run.

The warm-start benchmark's SFT arm (``warm_start.py``: basic-strategy Blackjack hands recorded
through the text env, ``sft_warm_start`` with its settings, choice decoding) under three
precisions, each on a fresh copy of the embedded model:

- ``float32``: the base model in fp32 (the machine without fast bf16),
- ``bf16, LoRA fp32``: a bf16 base, the adapter's products in fp32 (as TRL's SFT runs it without
  mixed precision),
- ``bf16, mixed``: a bf16 base under ``PPOConfig.mixed_precision`` (the default on a machine
  with fast bf16): the LoRA products in bf16 too, fp32 master weights.

Each arm reports SFT's seconds, its first and last loss, and the exact expected return of the
greedy policy it leaves (``blackjack_exact``: the whole decision table, no sampling noise),
with the share of states where it plays basic strategy. "Learning must not get worse": the
bf16 arms should match fp32 within the spread SFT's own randomness gives.

    python benchmarks/sft_speed.py [--demo-hands 500] [--epochs 2] [--arms float32,bf16,mixed]

Pin it to one core for comparable times (``taskset -c 0 env OMP_NUM_THREADS=1 ...``).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch

import textgym  # noqa: F401
from textgym import record_trajectories
from textgym.envs import blackjack_exact
from textgym_agents import PPOConfig, PPOPolicy, sft_warm_start

try:
    from blackjack_learning import basic_agreement, greedy_table
    from warm_start import ENV, blackjack_expert
except ImportError:  # imported as benchmarks.sft_speed
    from benchmarks.blackjack_learning import basic_agreement, greedy_table
    from benchmarks.warm_start import ENV, blackjack_expert

ARMS = {
    "float32": ("float32", False),
    "bf16": ("bfloat16", False),
    "mixed": ("bfloat16", True),
}
NAMES = {"float32": "float32", "bf16": "bf16, LoRA fp32", "mixed": "bf16, mixed"}


def run_arm(arm: str, demos, args) -> dict:
    """SFT one fresh policy under ``arm``'s precision; its time, losses and exact return."""
    dtype, mixed = ARMS[arm]
    torch.manual_seed(args.seed)
    config = PPOConfig(
        decoding="choices", reply_prefix='{"action": "', mixed_precision=mixed, progress=False
    )
    policy = PPOPolicy.from_pretrained(args.model, config=config, dtype=dtype)
    sft = sft_warm_start(
        policy,
        demos,
        epochs=args.epochs,
        learning_rate=args.lr,
        deduplicate=True,
        seed=args.seed,
    )
    env = gym.make(ENV)
    table = greedy_table(policy, env)
    env.close()
    return {
        "seconds": sft["sft/seconds"],
        "steps": int(sft["sft/steps"]),
        "rows": int(sft["sft/rows"]),
        "loss_first": sft["sft/loss_first"],
        "loss_last": sft["sft/loss_last"],
        "exact": blackjack_exact.expected_return(lambda *s: table[s]),
        "basic": basic_agreement(table),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-hands", type=int, default=500)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--lr", type=float, default=2e-4, help="warm_start.py's --sft-lr")
    parser.add_argument("--arms", default="float32,bf16,mixed", help=f"of {', '.join(ARMS)}")
    parser.add_argument("--model", default=None, help="model path (default: embedded)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    demos = record_trajectories(ENV, blackjack_expert, args.demo_hands, seed=args.seed)
    results = {}
    for arm in arms:
        results[arm] = run_arm(arm, demos, args)
        print(f"{arm}: {results[arm]}", flush=True)
    first = results[arms[0]]
    print(
        f"\nSFT on {args.demo_hands} basic-strategy hands ({first['rows']} distinct rows), "
        f"{args.epochs:g} epochs, {torch.get_num_threads()} threads"
    )
    print(
        f"{'arm':<17}{'steps':>6}{'seconds':>9}{'speed':>8}{'loss':>16}{'exact':>9}{'= basic':>9}"
    )
    for arm, r in results.items():
        loss = f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        print(
            f"{NAMES[arm]:<17}{r['steps']:>6}{r['seconds']:>9.1f}"
            f"{first['seconds'] / r['seconds']:>7.2f}x{loss:>16}{r['exact']:>+9.4f}"
            f"{r['basic']:>9.0%}"
        )


if __name__ == "__main__":
    main()
