"""Can LoRA learn Blackjack's decision from the hand at all? Supervised check, in one run.

PPO on ``textgym/Blackjack-v1`` (``blackjack_learning.py``) has not made the embedded model's
choice depend on the hand total. This script asks whether that is the representation or the
learning signal: it trains the same LoRA adapter by cross-entropy over the two choices
(``{"action": "hit"}`` / ``{"action": "stick"}``, scored exactly as choice decoding scores them)
toward basic strategy, on every first-turn state (hard totals 4-21 and soft totals 13-21 against
every dealer card), and prints every ``--every`` steps how many states the greedy choice gets
right and the mean P(hit) at a few totals. Clean labels are the best case for any learner:
a policy gradient gets a noisy ±1 return per hand instead.

    python benchmarks/blackjack_learnability.py [--lr 1e-3] [--steps 60] [--batch 32]

Measured on one core (docs/results.md, "Blackjack at the default settings"): at lr 1e-3
greedy agreement with basic strategy went 41% -> 97% in 40 steps of 32 states; at lr 3e-4, 81%
after 40 steps.
"""

from __future__ import annotations

import argparse
import random
import time

import gymnasium as gym
import numpy as np
import torch

import textgym  # noqa: F401
from textgym.checker import find_text_wrapper
from textgym_agents import PPOConfig, PPOPolicy

try:
    from blackjack_learning import basic_strategy, first_turn_prompt
except ImportError:  # imported as benchmarks.blackjack_learnability
    from benchmarks.blackjack_learning import basic_strategy, first_turn_prompt

SHOWN_TOTALS = (5, 9, 12, 14, 16, 18, 20)


def first_turn_states() -> list[tuple[int, int, int]]:
    """Every (player total, dealer card, usable ace) a first turn can show."""
    hard = [(t, d, 0) for t in range(4, 22) for d in range(1, 11)]
    return hard + [(t, d, 1) for t in range(13, 22) for d in range(1, 11)]


def choice_logps(policy: PPOPolicy, prompts, ids, chunk: int = 64) -> torch.Tensor:
    """(N, 2) log-probabilities of the two replies, with gradients if enabled."""
    rows = []
    for i in range(0, len(prompts), chunk):
        part = prompts[i : i + chunk]
        rows += policy.score_choices(part, [ids] * len(part)).logps
    return torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (LoRA)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="states per step")
    parser.add_argument("--every", type=int, default=10, help="report every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    policy = PPOPolicy.from_pretrained(config=PPOConfig(decoding="choices", temperature=1.0))
    text_env = find_text_wrapper(gym.make("textgym/Blackjack-v1"))
    options = text_env.reply_choices()
    hit = options.index('{"action": "hit"}')
    ids = policy.choice_ids(options)
    states = first_turn_states()
    prompts = [first_turn_prompt(policy, text_env, s) for s in states]
    labels = torch.tensor([hit if basic_strategy(*s) == "hit" else 1 - hit for s in states])
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    def report(step: int, seconds: float) -> None:
        with torch.no_grad():
            logps = choice_logps(policy, prompts, ids)
        agree = float((logps.argmax(1) == labels).float().mean())
        p_hit = logps[:, hit].exp()
        by_total = [
            np.mean([float(p_hit[i]) for i, s in enumerate(states) if s[0] == t and not s[2]])
            for t in SHOWN_TOTALS
        ]
        cells = " ".join(f"{p:5.2f}" for p in by_total)
        print(f"{step:>5} {seconds:>7.0f} {agree:>9.1%}   {cells}", flush=True)

    print(f"lr {args.lr}, {len(states)} states, basic strategy hits in {labels.eq(hit).sum()}")
    header = " ".join(f"{t:>5}" for t in SHOWN_TOTALS)
    print(f"{'step':>5} {'s':>7} {'agreement':>9}   mean P(hit) at hard total {header}")
    start = time.perf_counter()
    report(0, 0.0)
    for step in range(1, args.steps + 1):
        batch = random.sample(range(len(states)), args.batch)
        logps = choice_logps(policy, [prompts[i] for i in batch], ids)
        loss = torch.nn.functional.nll_loss(logps, labels[batch])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % args.every == 0:
            report(step, time.perf_counter() - start)


if __name__ == "__main__":
    main()
