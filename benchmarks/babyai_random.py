"""Random-policy baseline of the BabyAI text envs: success rate per id with its standard error.

The policy replies with one of the env's valid replies (``reply_choices``) uniformly at random,
through the text env (so the replies are parsed exactly as a model's would be). Episode ``i``
of an id resets with seed ``--seed + i``. Needs the minigrid extra; no model.

    .venv/bin/python benchmarks/babyai_random.py              # 500 episodes per id
    .venv/bin/python benchmarks/babyai_random.py --episodes 200 --ids textgym/BabyAI-GoToLocal-v0
"""

from __future__ import annotations

import argparse
import math
import random
import time

import gymnasium as gym

import textgym
from textgym.envs.minigrid_text import BABYAI_LEVELS
from textgym.evaluation import evaluate_callable


def random_policy(choices: list[str], seed: int):
    rng = random.Random(seed)
    return lambda messages: rng.choice(choices)


def baseline(env_id: str, episodes: int, seed: int) -> dict[str, float]:
    env = gym.make(env_id)
    choices = textgym.reply_choices(env)
    assert choices, f"{env_id} has no fixed set of replies"
    start = time.perf_counter()
    result = evaluate_callable(random_policy(choices, seed), env, episodes, seed=seed)
    env.close()
    p = result.success_rate
    return {
        "success": p,
        "se": math.sqrt(p * (1 - p) / episodes),
        "return": result.mean_return,
        "length": result.mean_length,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1000, help="seed of the first episode")
    parser.add_argument("--ids", nargs="*", default=[f"textgym/{name}" for name in BABYAI_LEVELS])
    args = parser.parse_args()
    print(f"random policy, {args.episodes} episodes per id, seeds {args.seed}..")
    print("| id | success | s.e. | mean return | mean length | seconds |")
    print("|---|---|---|---|---|---|")
    for env_id in args.ids:
        row = baseline(env_id, args.episodes, args.seed)
        print(
            f"| `{env_id}` | {row['success']:.1%} | {row['se']:.1%} | {row['return']:.3f} "
            f"| {row['length']:.1f} | {row['seconds']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
