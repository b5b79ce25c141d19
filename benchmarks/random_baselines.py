"""Random and optimal baselines of the RAGEN worlds: success rate with its s.e., return, length.

``textgym/Sokoban-v0`` and ``textgym/FrozenLakeRandom-v0`` (not slippery, and RAGEN's slip
probability 2/3), under the registered 100-turn limit and under RAGEN's 10 actions per
episode. The random policy replies with one of the env's valid replies (``reply_choices``)
uniformly at random; the optimal one solves the room by breadth-first search (Sokoban) or
the lake by finite-horizon dynamic programming over Gymnasium's transition table (the policy
with the highest probability of reaching the goal within the turns left; without slips, a
shortest path). Both play through the text env, so replies are parsed exactly
as a model's would be. Episode ``i`` resets with seed ``--seed + i``; the optimal rows play
the same rooms and lakes as the random ones. For the slippery lake the optimal row also gives
the exact success probability (``exact``: the dynamic program's value of the start, averaged
over the episodes' lakes). Needs no model and no extra.

    .venv/bin/python benchmarks/random_baselines.py                # 500 episodes per row
    .venv/bin/python benchmarks/random_baselines.py --episodes 200 --max-steps 100
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.envs import frozen_lake_random, sokoban

try:  # run as a script from benchmarks/, or imported as benchmarks.random_baselines
    from babyai_random import baseline, summary
except ImportError:
    from benchmarks.babyai_random import baseline, summary

ROWS = (
    ("textgym/Sokoban-v0", {}),
    ("textgym/FrozenLakeRandom-v0", {"slip_probability": 0.0}),
    ("textgym/FrozenLakeRandom-v0", {"slip_probability": 2 / 3}),
)


def lake_plan(lake: Any, horizon: int) -> tuple[np.ndarray, float]:
    """Best action per (turns left - 1, state) and the start's success probability.

    The action maximises the probability of reaching the goal within the turns left; among
    equally likely ones, the fastest (the higher discounted probability, discount 0.9).
    """
    n = lake.observation_space.n
    value, fast = np.zeros(n), np.zeros(n)  # with no turn left
    best = np.zeros((horizon, n), dtype=int)
    for k in range(horizon):
        q, q_fast = np.zeros((n, 4)), np.zeros((n, 4))
        for s in range(n):
            for a in range(4):
                for p, nxt, reward, done in lake.P[s][a]:
                    q[s, a] += p * (reward if done else value[nxt])
                    q_fast[s, a] += p * (reward if done else 0.9 * fast[nxt])
        ties = q >= q.max(axis=1, keepdims=True) - 1e-12
        best[k] = np.where(ties, q_fast, -np.inf).argmax(axis=1)
        value, fast = q.max(axis=1), q_fast[np.arange(n), best[k]]
    return best, float(value[0])


def optimal_baseline(env_id: str, episodes: int, seed: int, **kwargs: Any) -> dict[str, Any]:
    """BFS (Sokoban) or the finite-horizon optimum (the lake), played through the text env."""
    env = gym.make(env_id, **kwargs)
    limit = env.spec.max_episode_steps
    start = time.perf_counter()
    successes, returns, lengths, exact = [], [], [], []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        raw = env.unwrapped
        plan: Any = None
        if isinstance(raw, sokoban.SokobanEnv):
            plan, names = sokoban.solve_room(raw.room), sokoban.ACTION_NAMES
        else:
            names = frozen_lake_random.ACTION_NAMES
            best, probability = lake_plan(raw.lake, limit)
            exact.append(probability)
        total, length, done, info = 0.0, 0, False, {}
        while not done:
            if isinstance(raw, sokoban.SokobanEnv):
                action = plan[length]
            else:
                action = int(best[limit - length - 1, raw.lake.s])
            _, reward, terminated, truncated, info = env.step(json.dumps({"action": names[action]}))
            total, length, done = total + float(reward), length + 1, terminated or truncated
        successes.append(bool(info.get("is_success", False)))
        returns.append(total)
        lengths.append(length)
    env.close()
    row = summary(successes, returns, lengths, start)
    if exact:
        row["exact"] = sum(exact) / len(exact)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1000, help="seed of the first episode")
    parser.add_argument(
        "--max-steps", type=int, nargs="*", default=[100, 10], help="turn limits to measure"
    )
    args = parser.parse_args()
    print(f"{args.episodes} episodes per row, seeds {args.seed}..")
    columns = ["id", "options", "turns", "policy", "success", "s.e.", "mean return"]
    columns += ["mean length", "seconds"]
    print(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
    for limit in args.max_steps:
        for env_id, kwargs in ROWS:
            options = ", ".join(f"{k}={v:.3g}" for k, v in kwargs.items()) or "defaults"
            kwargs = {**kwargs, "max_episode_steps": limit}
            rows = {
                "random valid reply": baseline(env_id, args.episodes, args.seed, **kwargs),
                "optimal": optimal_baseline(env_id, args.episodes, args.seed, **kwargs),
            }
            for policy, row in rows.items():
                if "exact" in row:
                    policy += f" (exact {row['exact']:.1%})"
                print(
                    f"| `{env_id}` | {options} | {limit} | {policy} | {row['success']:.1%} "
                    f"| {row['se']:.1%} | {row['return']:.3f} | {row['length']:.1f} "
                    f"| {row['seconds']:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
