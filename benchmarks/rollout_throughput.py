"""Batched rollout vs one env at a time: turns/s of the embedded model, measured in one run.

Both sides generate replies to the same 16 Blackjack prompts with the same model and
greedy decoding (so they produce the same tokens); one side makes a single batched call,
the other one call per prompt. Rounds alternate between the two to share machine noise.

    python benchmarks/rollout_throughput.py [--envs 16] [--rounds 3] [--max-new-tokens 24]

Target (issue 3): batched >= 8x the turns/s of one env at a time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy

TARGET = 8.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(
        args.model, config=PPOConfig(max_new_tokens=args.max_new_tokens)
    )
    env = gym.make("textgym/Blackjack-v1")
    prompts = [env.reset(seed=seed)[0] for seed in range(args.envs)]
    policy.generate(prompts[:2], greedy=True)  # warm-up

    batched, single = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        together = policy.generate(prompts, greedy=True)
        batched.append(time.perf_counter() - start)
        start = time.perf_counter()
        alone = [policy.generate([p], greedy=True) for p in prompts]
        single.append(time.perf_counter() - start)
    same = sum(a.response_ids[0] == b for a, b in zip(alone, together.response_ids, strict=True))
    tokens = sum(len(r) for r in together.response_ids)
    batched_rate = args.envs / statistics.median(batched)
    single_rate = args.envs / statistics.median(single)
    ratio = batched_rate / single_rate
    print(f"{args.envs} Blackjack prompts, {tokens} reply tokens, greedy, median of {args.rounds}")
    print(f"one env at a time: {single_rate:6.2f} turns/s")
    print(f"batched ({args.envs} envs): {batched_rate:6.2f} turns/s")
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(f"speed-up: {ratio:.1f}x (target >= {TARGET:g}x: {verdict})")
    print(f"identical replies: {same}/{args.envs}")


if __name__ == "__main__":
    main()
