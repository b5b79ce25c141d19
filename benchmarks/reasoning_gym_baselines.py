"""Baselines of the reasoning-gym text envs: what a reply that ignores the question scores.

For each registered ``textgym/rg-<task>-v0``, episode ``i`` asks the question of seed
``--seed + i`` and is answered with the correct answer of *another* question of the same task
(seed ``--seed + i + 1``): a reply of the right form that ignores the question, the text
counterpart of a random valid action. The task's own ``score_answer`` scores it through the
text env, as it scores a model. The library's own answer scores 1.0 on every question (tested
in tests/textgym/envs/test_reasoning_gym_text.py). Needs ``textgym[reasoning-gym]``.

    .venv/bin/python benchmarks/reasoning_gym_baselines.py              # 200 questions per task
"""

from __future__ import annotations

import argparse
import json
import math

import gymnasium as gym

import textgym  # noqa: F401  (registers the ids)
from textgym.envs.reasoning_gym_text import REASONING_GYM_TASKS


def other_answer_score(task: str, episodes: int, seed: int) -> tuple[float, float, float]:
    """Mean score, its standard error and the success rate of other questions' answers."""
    env = gym.make(f"textgym/rg-{task}-v0")
    scores, solved = [], 0
    for i in range(episodes):
        env.reset(seed=seed + i + 1)
        other = env.unwrapped.entry["answer"]
        env.reset(seed=seed + i)
        _, reward, _, _, info = env.step(json.dumps({"answer": other}))
        scores.append(reward)
        solved += bool(info["is_success"])
    env.close()
    mean = sum(scores) / episodes
    var = sum((s - mean) ** 2 for s in scores) / max(episodes - 1, 1)
    return mean, math.sqrt(var / episodes), solved / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--tasks", default=",".join(REASONING_GYM_TASKS))
    args = parser.parse_args()
    print("| env | another question's answer: score (s.e.) | solved | the library's answer |")
    print("|---|---|---|---|")
    for task in args.tasks.split(","):
        mean, se, solved = other_answer_score(task, args.episodes, args.seed)
        print(f"| `textgym/rg-{task}-v0` | {mean:.3f} ({se:.3f}) | {solved:.1%} | 1.0 |")


if __name__ == "__main__":
    main()
