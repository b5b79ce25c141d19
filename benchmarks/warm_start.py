"""Warm start before PPO: cold PPO vs SFT on demonstrations vs SFT + PPO, measured in one run.

Blackjack with the embedded model. Demonstrations are basic-strategy hands recorded through
the text env (``textgym.record_trajectories``); SFT is ``textgym_agents.sft_warm_start`` (TRL
SFTTrainer on the policy's LoRA adapter). Cold PPO and SFT + PPO get the same wall time:
recording and SFT count against the SFT + PPO budget. Every policy is evaluated greedily on
the same hands (and the scripted references of ``blackjack_learning.py`` with them).

    python benchmarks/warm_start.py [--minutes 30] [--demo-hands 500] [--eval-hands 1000]
                                    [--decoding free|choices] [--model PATH] [--out DIR]

``--decoding free`` (default) lets the model write any text, so the invalid-reply rate shows
what SFT fixes; ``choices`` scores the two valid replies (never invalid). With ``choices``,
each model row also gets the exact expected return of its greedy policy (a table over the 280
states the text env can show, ``blackjack_exact.py``), which has none of the 1,000 hands'
sampling noise (standard error about 0.03), and the share of states where it plays as basic
strategy (the optimal policy here: exact -0.043). The SFT adapter is saved in ``--out``/sft.

Target: SFT + PPO reaches a greedy mean return >= -0.07.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import textgym  # noqa: F401
from textgym import record_trajectories
from textgym.envs import blackjack_exact
from textgym_agents import PPOConfig, PPOPolicy, evaluate, sft_warm_start

try:
    from blackjack_learning import ACTIONS, Scripted, basic_agreement, basic_strategy, greedy_table
except ImportError:  # imported as benchmarks.warm_start (textgym record --expert ...)
    from benchmarks.blackjack_learning import (
        ACTIONS,
        Scripted,
        basic_agreement,
        basic_strategy,
        greedy_table,
    )

TARGET = -0.07
ENV = "textgym/Blackjack-v1"
EVAL_SEED = 10_000  # evaluation hands differ from training hands, same for every policy


def blackjack_expert(obs) -> int:
    """Basic strategy on Blackjack-v1's raw observation (player total, dealer card, usable ace).

    A recording expert: ``textgym record --expert benchmarks.warm_start:blackjack_expert``.
    """
    total, dealer, usable_ace = (int(v) for v in obs)
    return ACTIONS.index(basic_strategy(total, dealer, bool(usable_ace)))


def ppo_config(args) -> PPOConfig:
    """PPO settings of ``blackjack_learning.py``; the reply format depends on --decoding."""
    if args.decoding == "choices":
        replies = {"decoding": "choices", "reply_prefix": '{"action": "'}
    else:  # free text: the cold model's replies are mostly prose, hence invalid
        replies = {"decoding": "free", "max_new_tokens": 12}
    return PPOConfig(
        **replies,
        num_steps=args.num_steps,
        minibatch_size=32,
        micro_batch_size=16,
        num_epochs=2,
        learning_rate=args.lr,
        kl_coef=args.kl_coef,
        seed=args.seed,
        save_every=0,
        progress=False,
    )


def train_for(policy: PPOPolicy, seconds: float, args, out: Path) -> tuple[int, float]:
    """PPO until ``seconds`` have passed (checked after each update): (hands, seconds taken)."""
    if seconds <= 0:
        return 0, 0.0
    envs = gym.make_vec(ENV, num_envs=args.num_envs)
    start = time.perf_counter()
    episodes = [0]

    def keep_going(metrics) -> bool:
        episodes[0] = int(metrics["env/episodes"])
        elapsed = time.perf_counter() - start
        print(
            f"  update {int(metrics['train/update'])}: {episodes[0]} hands, return "
            f"{metrics.get('env/return_mean', float('nan')):+.3f}, invalid "
            f"{metrics['env/invalid_rate']:.1%}, {elapsed:.0f}/{seconds:.0f} s",
            flush=True,
        )
        return elapsed < seconds

    policy.learn(envs, total_episodes=10**9, output_dir=out, callback=keep_going)
    envs.close()
    return episodes[0], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall time of each PPO arm")
    parser.add_argument("--demo-hands", type=int, default=500, help="basic-strategy hands")
    parser.add_argument("--eval-hands", type=int, default=1000)
    parser.add_argument("--decoding", default="free", choices=["free", "choices"])
    parser.add_argument("--model", default=None, help="model path (default: embedded)")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-5, help="PPO learning rate")
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--sft-epochs", type=float, default=2.0)
    parser.add_argument("--sft-lr", type=float, default=2e-4)
    parser.add_argument(
        "--no-deduplicate", action="store_true", help="train SFT on repeated hands too"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/warm-start-benchmark")
    args = parser.parse_args()
    out, budget = Path(args.out), args.minutes * 60
    eval_env = gym.make(ENV)
    rows = []

    def report(name, policy, seconds=None, hands=None, table=None):
        """Evaluate on the shared hands; with a decision table, also its exact expected return."""
        if table is None and args.decoding == "choices" and isinstance(policy, PPOPolicy):
            table = greedy_table(policy, eval_env)  # the whole greedy policy (see docstring)
        result = evaluate(policy, eval_env, args.eval_hands, seed=EVAL_SEED, num_envs=16).as_dict()
        if table is not None:
            result["exact_return"] = blackjack_exact.expected_return(lambda *s: table[s])
            if all(isinstance(choice, str) for choice in table.values()):  # deterministic
                result["basic_agreement"] = basic_agreement(table)
        rows.append({"policy": name, "train_s": seconds, "ppo_hands": hands, **result})
        se = result["std_return"] / np.sqrt(result["episodes"])
        exact = f", exact {result['exact_return']:+.3f}" if table is not None else ""
        print(
            f"{name}: mean return {result['mean_return']:+.3f} ± {se:.3f}{exact}, invalid "
            f"{result['invalid_rate']:.1%}",
            flush=True,
        )

    states = list(blackjack_exact.states())
    for name, choose in [
        ("random", lambda s, rng: rng.choice(ACTIONS)),
        ("always stick", lambda s, rng: "stick"),
        ("basic strategy", lambda s, rng: basic_strategy(*s)),
    ]:
        # random play's table holds P(hit) = 0.5 instead of a choice
        table = {s: 0.5 if name == "random" else choose(s, None) for s in states}
        report(name, Scripted(choose), table=table)

    torch.manual_seed(args.seed)
    cold = PPOPolicy.from_pretrained(args.model, config=ppo_config(args))
    report(f"base model ({args.decoding})", cold)
    print(f"cold PPO for {budget:.0f} s...", flush=True)
    hands, seconds = train_for(cold, budget, args, out / "cold")
    report("cold PPO", cold, seconds, hands)
    del cold

    torch.manual_seed(args.seed)
    warm = PPOPolicy.from_pretrained(args.model, config=ppo_config(args))
    start = time.perf_counter()  # recording and SFT count against this arm's budget
    demos = record_trajectories(ENV, blackjack_expert, args.demo_hands, seed=args.seed)
    sft = sft_warm_start(
        warm,
        demos,
        epochs=args.sft_epochs,
        learning_rate=args.sft_lr,
        deduplicate=not args.no_deduplicate,
        seed=args.seed,
        progress=True,
    )
    sft_seconds = time.perf_counter() - start
    print(
        f"SFT: {len(demos)} demonstration turns of {args.demo_hands} hands, "
        f"{sft['sft/rows']:.0f} trained, {sft['sft/steps']:.0f} steps, loss "
        f"{sft['sft/loss_first']:.3f} -> {sft['sft/loss_last']:.3f}, {sft_seconds:.0f} s",
        flush=True,
    )
    report("SFT", warm, sft_seconds)
    warm.save(out / "sft")  # the SFT-only adapter, to evaluate further on its own
    print(f"PPO after SFT for the remaining {budget - sft_seconds:.0f} s...", flush=True)
    hands, seconds = train_for(warm, budget - sft_seconds, args, out / "sft-ppo")
    report("SFT + PPO", warm, sft_seconds + seconds, hands)

    print(f"\nBlackjack, greedy, {args.eval_hands} hands (seed {EVAL_SEED}), {args.decoding}")
    print(
        f"{'policy':<24}{'train s':>9}{'PPO hands':>11}{'mean return':>14}{'± se':>8}"
        f"{'invalid':>9}{'exact':>9}{'= basic':>9}"
    )
    for row in rows:
        seconds = "" if row["train_s"] is None else f"{row['train_s']:.0f}"
        hands = "" if row["ppo_hands"] is None else str(row["ppo_hands"])
        se = row["std_return"] / np.sqrt(row["episodes"])
        exact = f"{row['exact_return']:+.3f}" if "exact_return" in row else ""
        agree = f"{row['basic_agreement']:.0%}" if "basic_agreement" in row else ""
        print(
            f"{row['policy']:<24}{seconds:>9}{hands:>11}{row['mean_return']:>+14.3f}"
            f"{se:>8.3f}{row['invalid_rate']:>9.1%}{exact:>9}{agree:>9}"
        )
    print(
        "exact: expected return of the greedy decision table over all deals (no sampling "
        "noise); = basic: states where it plays as basic strategy"
    )
    final = rows[-1]["mean_return"]
    print(f"target: SFT + PPO >= {TARGET}: {'met' if final >= TARGET else 'MISSED'} ({final:+.3f})")
    if "exact_return" in rows[-1]:
        exact = rows[-1]["exact_return"]
        verdict = "met" if exact >= TARGET else "MISSED"
        print(f"target on the exact expected return: {verdict} ({exact:+.3f})")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"rows": rows, "sft": sft, "args": vars(args)}
    (out / "warm_start.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
