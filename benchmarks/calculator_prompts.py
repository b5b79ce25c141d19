"""How the calculator's prompt decides whether the untrained model ever solves a question.

Plays the embedded model on ``textgym/Calculator-v0`` with ``textgym train``'s decoding
settings (free text from ``{"``, stopped at ``}``), once per prompt variant: the reply form
the instructions teach (``reply_format``: ``json``, ``text``, ``both``) and whether the system
prompt ends with the worked episode (``EXAMPLE_EPISODE``). For each it prints the greedy and
the sampled (temperature 0.7, what training samples) success rate with its standard error,
the mean return and the invalid-reply rate, on the same questions (episode ``i`` resets with
seed ``--seed + i``). A first sampled success is what online RL needs before it can learn
anything here, so the sampled rate is the number to read.

    .venv/bin/python benchmarks/calculator_prompts.py                       # every variant
    .venv/bin/python benchmarks/calculator_prompts.py --variants json,both --episodes 64
"""

from __future__ import annotations

import argparse
import json
import math
import time

import gymnasium as gym

import textgym  # noqa: F401  (registers textgym/Calculator-v0)
from textgym.envs.calculator import EXAMPLE_EPISODE, SYSTEM_PROMPT
from textgym_agents import PPOConfig, PPOPolicy, evaluate

ENV_ID = "textgym/Calculator-v0"
# name -> (reply_format, worked episode in the system prompt)
VARIANTS = {
    "json": ("json", True),
    "both": ("both", True),
    "text": ("text", True),
    "json-no-example": ("json", False),
    "both-no-example": ("both", False),
}


def play(policy: PPOPolicy, variant: str, episodes: int, seed: int, greedy: bool) -> dict:
    """Success rate with its standard error, return and invalid rate of one prompt variant."""
    reply_format, example = VARIANTS[variant]
    prompt = SYSTEM_PROMPT + (EXAMPLE_EPISODE if example else "")
    env = gym.make(ENV_ID, reply_format=reply_format, system_prompt=prompt)
    result = evaluate(policy, env, episodes, greedy=greedy, seed=seed, num_envs=8)
    # None when no episode ended with an answer: every one ran out of turns, none solved.
    rate = result.success_rate or 0.0
    return {
        "success": rate,
        "success_se": math.sqrt(rate * (1 - rate) / episodes),
        "return": result.mean_return,
        "invalid": result.invalid_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--episodes", type=int, default=64, help="questions per row")
    parser.add_argument("--seed", type=int, default=10_000, help="seed of the first question")
    parser.add_argument("--model", default=None, help="base model (default: the embedded one)")
    parser.add_argument("--dtype", default="auto", help="precision of the base model")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    config = PPOConfig.for_env(ENV_ID, progress=False)
    policy = PPOPolicy.from_pretrained(args.model, dtype=args.dtype, config=config)
    print(f"precision: {policy.base_info.get('dtype')}, {args.episodes} questions per row")
    print(f"{'variant':<16} {'greedy solved':>15} {'sampled solved':>15} {'return g/s':>13} "
          f"{'invalid g/s':>12} {'s':>5}")  # fmt: skip
    for variant in variants:
        start = time.perf_counter()
        rows = [play(policy, variant, args.episodes, args.seed, greedy) for greedy in (True, False)]
        g, s = rows
        print(
            f"{variant:<16} {g['success']:>7.1%} ± {g['success_se']:<5.1%} "
            f"{s['success']:>7.1%} ± {s['success_se']:<5.1%} "
            f"{g['return']:>+6.2f}/{s['return']:<+6.2f} {g['invalid']:>5.1%}/{s['invalid']:<5.1%} "
            f"{time.perf_counter() - start:>5.0f}",
            flush=True,
        )
        print(json.dumps({"variant": variant, "greedy": g, "sampled": s}), flush=True)


if __name__ == "__main__":
    main()
