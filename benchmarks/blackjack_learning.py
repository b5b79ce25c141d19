"""Does PPO teach the embedded model blackjack? Greedy return before/after, in one run.

Trains the embedded SmolLM2-135M-Instruct (LoRA) on ``textgym/Blackjack-v1`` and evaluates
the greedy policy on the same hands before and after. Reference points come from scripted
policies played through the same text env and the same evaluation: random play, always
stick, and basic strategy (hit/stand table for these rules).

    python benchmarks/blackjack_learning.py [--hands 3000] [--eval-hands 1000] [--out DIR]

With choice decoding it also prints the exact expected return of the greedy policy before and
after (``blackjack_exact.py``: no sampling noise; basic strategy, the optimum, is -0.043).

Target: after <= 3,000 training hands, greedy mean return >= -0.15.
The run directory (metrics, checkpoints, learning curve) is written to --out.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import textgym
from textgym.checker import find_text_wrapper
from textgym.envs import blackjack_exact
from textgym.envs.blackjack_exact import basic_strategy
from textgym_agents import PPOConfig, PPOPolicy, evaluate
from textgym_agents.tracking.plotting import plot_learning_curves

TARGET = -0.15
ACTIONS = ("stick", "hit")  # Blackjack-v1's action ids
_STATE = re.compile(r"totals (\d+)(, counting an ace as 11)?\. The dealer shows (?:an? )?(\w+)")


def read_state(messages):
    """(player total, dealer card, usable ace) from the Blackjack formatter's text."""
    match = _STATE.search(messages[-1]["content"])
    dealer = match.group(3)
    return int(match.group(1)), 1 if dealer == "ace" else int(dealer), bool(match.group(2))


def first_turn_prompt(policy: PPOPolicy, text_env, state: Any) -> list[int]:
    """Token ids of what the model sees on a first turn in ``state`` (Blackjack: total, dealer,
    ace), for a text env that shows only the current state."""
    messages = [
        {"role": "system", "content": text_env.system_prompt},
        {"role": "user", "content": text_env.format_observation(state, {})},
    ]
    return policy.encode(messages)


def hit_choices(policy: PPOPolicy, env: gym.Env, states) -> torch.Tensor:
    """(N, 2) choice log-probabilities (column 0 stick, 1 hit) of first-turn prompts in ``states``
    (total, dealer card, usable ace), as choice decoding scores them."""
    text_env = find_text_wrapper(env)  # the text layer under gym.make's wrappers
    options = text_env.reply_choices()
    order = [options.index('{"action": "stick"}'), options.index('{"action": "hit"}')]
    return state_choice_logps(policy, text_env, states)[:, order]


def state_choice_logps(policy: PPOPolicy, text_env, states) -> torch.Tensor:
    """(N, choices) log-probabilities of ``text_env.reply_choices()`` (in that order) on the
    first-turn prompts of ``states``, as choice decoding scores them."""
    prompts = [first_turn_prompt(policy, text_env, state) for state in states]
    ids = policy.choice_ids(text_env.reply_choices())
    with torch.no_grad():
        logps = policy.score_choices(prompts, [ids] * len(prompts)).logps
    return torch.stack(list(logps))


def greedy_table(policy: PPOPolicy, env: gym.Env) -> dict[tuple[int, int, bool], str]:
    """The greedy choice ("hit" or "stick") in every state a hand can show.

    The text env shows only the current state, so with choice decoding this table is the whole
    greedy policy: ``blackjack_exact.expected_return`` gives its exact expected return.
    """
    states = list(blackjack_exact.states())
    picks = hit_choices(policy, env, states).argmax(1).tolist()
    return {state: ACTIONS[pick] for state, pick in zip(states, picks, strict=True)}


def basic_agreement(table: dict[tuple[int, int, bool], str]) -> float:
    """Share of the 280 states in which a greedy table plays as basic strategy."""
    return float(np.mean([table[s] == basic_strategy(*s) for s in blackjack_exact.states()]))


def exact_return(policy: PPOPolicy, env: gym.Env) -> float:
    """Exact expected return of the policy's greedy choices (no sampling noise)."""
    table = greedy_table(policy, env)
    return blackjack_exact.expected_return(lambda *state: table[state])


def hit_map(policy: PPOPolicy, env: gym.Env) -> dict[int, tuple[float, float]]:
    """Per hard player total (4-21): the share of dealer cards the greedy policy hits on, and
    the mean P(hit) (at the policy's temperature), from first-turn prompts of the text env."""
    states = [(total, dealer, 0) for total in range(4, 22) for dealer in range(1, 11)]
    logps = hit_choices(policy, env, states)
    table: dict[int, list[tuple[bool, float]]] = {}
    for (total, _, _), row in zip(states, logps, strict=True):
        table.setdefault(total, []).append((int(row.argmax()) == 1, float(row[1].exp())))
    return {
        t: (float(np.mean([g for g, _ in v])), float(np.mean([p for _, p in v])))
        for t, v in table.items()
    }


def print_hit_map(name: str, table: dict[int, tuple[float, float]]) -> None:
    print(f"{name}: greedy hits on (share of dealer cards) / mean P(hit), by hard total")
    print("  " + " ".join(f"{t:>4}" for t in table))
    print("  " + " ".join(f"{g:>4.0%}" if g else "   ." for g, _ in table.values()))
    print("  " + " ".join(f"{p:>4.2f}"[-4:] for _, p in table.values()), flush=True)


class Scripted(textgym.PolicyBase):
    """A policy from a function of the game state, evaluated exactly like the model."""

    def __init__(self, choose, seed: int = 0) -> None:
        self.choose, self.rng = choose, np.random.default_rng(seed)

    def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        return [f'{{"action": "{self.choose(read_state(m), self.rng)}"}}' for m in batch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hands", type=int, default=3000, help="training hands")
    parser.add_argument("--eval-hands", type=int, default=1000)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--out", default="runs/blackjack-benchmark")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-steps", type=int, default=4)
    parser.add_argument("--value-lr", type=float, default=1e-3)
    parser.add_argument("--ent-coef", type=float, default=0.0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature in training (exploration: zero-shot P(hit) is ~0.06 at 1)",
    )
    parser.add_argument(
        "--decoding", default="choices", choices=["free", "choices"], help="reply decoding mode"
    )
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    eval_env = gym.make("textgym/Blackjack-v1")
    eval_seed = 10_000  # evaluation hands differ from training hands, same for every policy

    rows = []

    def report(name, result, seconds=None):
        rows.append({"policy": name, **result, "seconds": seconds})
        extra = f"  ({seconds:.0f} s)" if seconds is not None else ""
        print(
            f"{name:<28} mean return {result['mean_return']:+.3f} ± "
            f"{result['std_return'] / np.sqrt(result['episodes']):.3f}   "
            f"invalid {result['invalid_rate']:.1%}{extra}",
            flush=True,
        )

    n = args.eval_hands
    refs = {
        "random": Scripted(lambda s, rng: rng.choice(["stick", "hit"])),
        "always stick": Scripted(lambda s, rng: "stick"),
        "basic strategy": Scripted(lambda s, rng: basic_strategy(*s)),
    }
    for name, scripted in refs.items():
        report(name, evaluate(scripted, eval_env, n, seed=eval_seed, num_envs=args.num_envs))

    config = PPOConfig(
        reply_prefix='{"action": "',
        stop_strings=['"'],
        max_new_tokens=4,
        num_steps=args.num_steps,
        minibatch_size=32,
        micro_batch_size=16,
        num_epochs=args.epochs,
        learning_rate=args.lr,
        value_learning_rate=args.value_lr,
        kl_coef=args.kl_coef,
        ent_coef=args.ent_coef,
        temperature=args.temperature,
        decoding=args.decoding,
        gamma=1.0,
        save_every=10,
        seed=args.seed,
    )
    policy = PPOPolicy.from_pretrained(config=config)
    start = time.perf_counter()
    before = evaluate(policy, eval_env, n, seed=eval_seed, num_envs=args.num_envs)
    report("SmolLM2-135M before", before, time.perf_counter() - start)
    maps = {"before": hit_map(policy, eval_env)}
    print_hit_map("before", maps["before"])
    exact = {}  # exact expected return of the greedy decision table (choice decoding only)
    if args.decoding == "choices":
        exact["before"] = exact_return(policy, eval_env)
        print(f"before: exact expected return {exact['before']:+.3f}", flush=True)

    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=args.num_envs)
    start = time.perf_counter()
    policy.learn(envs, total_episodes=args.hands, output_dir=args.out)
    train_seconds = time.perf_counter() - start
    print(f"training: {args.hands} hands in {train_seconds:.0f} s", flush=True)

    start = time.perf_counter()
    after = evaluate(policy, eval_env, n, seed=eval_seed, num_envs=args.num_envs)
    report("SmolLM2-135M after", after, time.perf_counter() - start)
    maps["after"] = hit_map(policy, eval_env)
    print_hit_map("after", maps["after"])
    if args.decoding == "choices":
        exact["after"] = exact_return(policy, eval_env)
        print(f"after: exact expected return {exact['after']:+.3f}", flush=True)
    verdict = "met" if after["mean_return"] >= TARGET else "MISSED"
    print(f"target: greedy mean return >= {TARGET} after <= {args.hands} hands: {verdict}")

    out = Path(args.out)
    references = {r["policy"]: r["mean_return"] for r in rows[:3]}
    plot_learning_curves(
        [out], out / "learning_curve.png", smooth=5, references={"env/return_mean": references}
    )
    summary = {
        "rows": rows,
        "train_seconds": train_seconds,
        "hit_map": maps,
        "exact_return": exact,
        "config": config.to_dict(),
    }
    (out / "benchmark.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
