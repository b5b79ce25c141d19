"""Turns/s of the README's main job with and without its row-saving levers, in one run.

Both arms train the embedded model on textgym/Calculator-v0 (8 envs; free-text JSON tool calls
whose prompts keep the last 4 turns, so each turn's prompt and reply begin the next turn's
prompt) with the settings `textgym train` picks (`PPOConfig.for_env`). They differ only in
how many rows they run:

- before: every turn is its own row in scoring and in the update (pack_turns=False), a
          scoring pass runs every turn before the update (score_in_update=False), every
          generation call prefills its prompts in full (carry_caches=False), in one batch
          padded to the longest, its key/value cache grows by concatenation (a copy of
          the whole cache at every decoding step), and every micro-batch of the update runs
          the shared system prompt again, forward and backward, and transformers'
          generate() runs the decoding steps (lean_decoding=False);
- now:    a turn whose prompt and reply begin another turn's prompt is read from that turn's
          row, minibatches keep such chains together (pack_turns=True, the default), the
          first minibatch's old log-probs come from the update's own first pass and the
          critic's values from the rollout (score_in_update=True, the default), a prompt
          that continues a row of the last generation call runs only its new tokens
          (carry_caches=True, the default), and generation prefills rows of very different
          lengths one at a time (shared_prefix.PREFILL_PADDING_MAX) into a cache with room
          kept for the reply (shared_prefix.growing_cache), and a minibatch's shared prefix
          runs once for all its micro-batches (PolicyScoring.sharing_prefix), and the
          decoding steps run in textgym's lean loop (lean_decoding=True, the default).

The arms alternate update by update in one process (after one warm-up update each), so machine
load drifts affect both alike, and each update samples with the same seed in both arms (they
play the same turns while their numerics agree to rounding). Prints seconds per phase, the
scored tokens, turns/s and the ratios.

    python benchmarks/main_job_speed.py [--updates 2] [--env textgym/Calculator-v0] [--model DIR]

Target: >= 2x turns/s for the calculator main job.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import DynamicCache

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.decoding import shared_prefix
from textgym_agents.decoding.shared_prefix import (
    PREFILL_PADDING_MAX,
    containing_rows,
    shared_length,
)
from textgym_agents.model.precision import cpu_signature
from textgym_agents.ppo.steps import minibatches

BEFORE = {"pack_turns": False, "score_in_update": False, "carry_caches": False}
BEFORE |= {"lean_decoding": False}


def concatenating_cache(reserve: int, source: Any = None) -> Any:
    """The cache generation used before ``growing_cache``: transformers' ``DynamicCache``."""
    cache = DynamicCache()
    for index, layer in enumerate(source.layers if source is not None else ()):
        cache.update(layer.keys, layer.values, index)
    return cache


# Each arm: PPOConfig overrides, the padding ratio above which rows are prefilled alone, and
# generation's cache.
ARMS = {
    "before": (BEFORE, float("inf"), concatenating_cache),
    "now": ({}, PREFILL_PADDING_MAX, shared_prefix.growing_cache),
}
PHASES = ("time/rollout_s", "time/score_s", "time/update_s")


def make_trainer(
    env_id: str, num_envs: int, overrides: dict, before: bool, model: str | None = None
) -> PPOTrainer:
    config = PPOConfig.for_env(env_id, num_envs=num_envs, progress=False, seed=0, **overrides)
    policy = PPOPolicy.from_pretrained(model, config=config)
    if before:  # every micro-batch runs the shared prefix itself
        policy.sharing_prefix = lambda prompts: contextlib.nullcontext()
    return PPOTrainer(policy, gym.make_vec(env_id, num_envs=num_envs))


def forward_tokens(trainer: PPOTrainer, turns: list) -> int:
    """Own tokens (past the shared prefix) of the first epoch's forward passes, padding included."""
    config, total = trainer.config, 0
    sizes = (config.minibatch_size, config.micro_batch_size, config.micro_batch_tokens)
    order = np.arange(len(turns))
    for minibatch in minibatches(order, turns, *sizes, pack=config.pack_turns):
        prompts = [turns[i].prompt_ids for micro in minibatch for i in micro]
        shared = shared_length(prompts, min(len(p) for p in prompts) - 1)
        for micro in minibatch:
            sequences = [turns[i].prompt_ids + turns[i].response_ids for i in micro]
            owners = containing_rows(sequences) if config.pack_turns else range(len(micro))
            rows = [sequences[b] for b in set(owners)]  # the rows the pass runs
            total += len(rows) * (max(len(row) for row in rows) - shared)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2, help="timed updates per arm")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--env", default="textgym/Calculator-v0")
    parser.add_argument("--model", default=None, help="a model directory (default: embedded)")
    args = parser.parse_args()
    trainers = {
        name: make_trainer(args.env, args.num_envs, o, name == "before", args.model)
        for name, (o, *_) in ARMS.items()
    }
    keys = (*PHASES, "seconds", "turns", "tokens")
    totals = {name: dict.fromkeys(keys, 0.0) for name in ARMS}
    for update in range(args.updates + 1):
        for name, trainer in trainers.items():
            _, shared_prefix.PREFILL_PADDING_MAX, shared_prefix.growing_cache = ARMS[name]
            torch.manual_seed(update)  # the same sampling seed for both arms
            turns, start = trainer.turns, time.perf_counter()
            buffer = trainer.collect()
            rollout_s = time.perf_counter() - start
            tokens = forward_tokens(trainer, buffer.turns())
            metrics = trainer.update(buffer, trainer.collector.drain())
            seconds = time.perf_counter() - start
            if update == 0:
                continue  # warm-up: first-call allocations, the precision measurement
            total = totals[name]
            total["seconds"] += seconds
            total["turns"] += trainer.turns - turns
            total["tokens"] += tokens
            total["time/rollout_s"] += rollout_s
            for key in PHASES[1:]:
                total[key] += metrics[key]
    print(f"machine: {cpu_signature()}")
    for name, trainer in trainers.items():
        precision = trainer.policy.base_info["precision"]
        print(f"{name}: {precision['dtype']} ({precision['reason']})")
    print(f"\n{args.env}: {args.updates} updates per arm after one warm-up, {args.num_envs} envs")
    print(
        f"{'arm':7} {'rollout s':>10} {'score s':>8} {'update s':>9} {'turns':>6} "
        f"{'tokens':>7} {'turns/s':>8} {'score+update s/turn':>20}"
    )
    rate, train_rate = {}, {}
    for name, total in totals.items():
        rate[name] = total["turns"] / total["seconds"]
        train = total["time/score_s"] + total["time/update_s"]
        train_rate[name] = train / max(total["turns"], 1)
        print(
            f"{name:7} {total['time/rollout_s']:10.1f} {total['time/score_s']:8.1f} "
            f"{total['time/update_s']:9.1f} {total['turns']:6.0f} {total['tokens']:7.0f} "
            f"{rate[name]:8.3f} {train_rate[name]:20.2f}"
        )
    ratio = rate["now"] / rate["before"]
    print(
        f"\nnow / before: {ratio:.2f}x turns/s; score + update "
        f"{train_rate['before'] / train_rate['now']:.2f}x faster per turn; forward tokens "
        f"{totals['before']['tokens'] / max(totals['now']['tokens'], 1):.2f}x fewer"
    )
    print(f"turns/s target >= 2x: {'met' if ratio >= 2 else 'NOT met'}")
    print(f"peak RSS of this process (both arms): {resource.getrusage(0).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
