"""PPO-update tokens/s of the embedded model and the share of the machine's matmul FLOP/s.

Collects one batch of real Blackjack turns, then times the update (scoring forward passes +
one epoch of forward/backward) and, in the same run, the machine's fp32 matmul FLOP/s. The
utilisation uses the issue's formula, 6 x parameters x tokens/s / peak, where tokens are
every prompt and reply token of the batch. Prompts share their system prompt, which the
policy runs once per micro-batch, so fewer tokens pass through the model than this counts;
both counts are printed.

    python benchmarks/update_throughput.py [--turns 64] [--micro-batch 16]

Target (issue 3): >= 35% of the measured matmul FLOP/s.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.prefix import shared_length

TARGET = 0.35


def matmul_flops(size: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = PPOConfig(
        num_steps=args.turns // 16,
        max_new_tokens=16,
        minibatch_size=args.turns,
        micro_batch_size=args.micro_batch,
        num_epochs=1,
        kl_coef=0.05,  # include the reference forward pass
    )
    policy = PPOPolicy.from_pretrained(args.model, config=config)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=16))
    buffer = trainer.collect()
    turns = buffer.turns()
    nominal = sum(len(t.prompt_ids) + len(t.response_ids) for t in turns)
    computed = 0
    for minibatch in trainer._batches(np.arange(len(turns)), turns):
        for micro in minibatch:
            sequences = [turns[i].prompt_ids + turns[i].response_ids for i in micro]
            shared = shared_length(sequences, min(len(turns[i].prompt_ids) for i in micro) - 1)
            computed += sum(len(s) - shared for s in sequences) + shared

    peak_before = matmul_flops()
    start = time.perf_counter()
    trainer.update(buffer)
    seconds = time.perf_counter() - start
    peak = max(peak_before, matmul_flops())
    params = sum(p.numel() for p in policy.model.parameters())
    # Passes over the batch: the policy and reference scoring forwards (1 + 1) and one
    # training epoch (forward + backward, counted as 3 forwards in the 6 x P rule).
    rate = nominal / seconds
    utilisation = 6 * params * rate / peak
    print(f"{len(turns)} turns, {nominal} tokens ({computed} after sharing system prompts)")
    print(f"update (scoring + 1 epoch): {seconds:.1f} s, {rate:,.0f} tokens/s")
    print(f"peak fp32 matmul: {peak / 1e9:.0f} GFLOP/s; parameters: {params / 1e6:.1f} M")
    print(
        f"utilisation 6*P*tokens/s/peak: {utilisation:.0%} "
        f"(target >= {TARGET:.0%}: {'met' if utilisation >= TARGET else 'MISSED'})"
    )
    print(f"the same counting only computed tokens: {6 * params * computed / seconds / peak:.0%}")


if __name__ == "__main__":
    main()
