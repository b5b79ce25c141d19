"""Baselines of two TextArena text envs: random moves in the game's format against a solver.

``textgym/ta-GuessTheNumber-v0`` (a number from 1 to 20 in 10 guesses): uniformly random
guesses against binary search on the game's hints. ``textgym/ta-TowerOfHanoi-v0`` (3 disks):
a uniformly random move among the six source-target pairs against the optimal 7 moves. Both
play through the text env, so the game reads and judges the replies as it would a model's.
Game ``i`` resets with seed ``--seed + i``. Needs ``textgym[textarena]``, no model.

    .venv/bin/python benchmarks/textarena_baselines.py               # 200 games per row
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import textgym  # noqa: F401  (registers the ids)

HANOI_MOVES = [f"[{a} {b}]" for a in "ABC" for b in "ABC" if a != b]
HANOI_SOLUTION = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


def play(env_id: str, player: Callable[[Any], Callable[[str], str]], games: int, seed: int):
    """Success rate, its standard error and the mean number of moves of ``player``."""
    env = gym.make(env_id)
    wins, moves = 0, 0
    for i in range(games):
        messages, _ = env.reset(seed=seed + i)
        move = player(np.random.default_rng(seed + i))
        terminated = truncated = False
        while not (terminated or truncated):
            messages, _, terminated, truncated, info = env.step(move(messages[-1]["content"]))
            moves += 1
        wins += bool(info.get("is_success"))
    env.close()
    rate = wins / games
    return rate, math.sqrt(rate * (1 - rate) / games), moves / games


def random_guesser(rng: Any) -> Callable[[str], str]:
    return lambda text: f"[{rng.integers(1, 21)}]"


def binary_search(rng: Any) -> Callable[[str], str]:
    bounds = [1, 20]
    last = [None]

    def move(text: str) -> str:
        hint = text.splitlines()[-1]
        if last[0] is not None:
            if "higher" in hint:
                bounds[0] = last[0] + 1
            elif "lower" in hint:
                bounds[1] = last[0] - 1
        last[0] = (bounds[0] + bounds[1]) // 2
        return f"[{last[0]}]"

    return move


def random_hanoi(rng: Any) -> Callable[[str], str]:
    return lambda text: HANOI_MOVES[int(rng.integers(len(HANOI_MOVES)))]


def solved_hanoi(rng: Any) -> Callable[[str], str]:
    moves = iter(HANOI_SOLUTION)
    return lambda text: next(moves)


ROWS = [
    ("textgym/ta-GuessTheNumber-v0", "random guesses", random_guesser),
    ("textgym/ta-GuessTheNumber-v0", "binary search", binary_search),
    ("textgym/ta-TowerOfHanoi-v0", "random moves", random_hanoi),
    ("textgym/ta-TowerOfHanoi-v0", "optimal (7 moves)", solved_hanoi),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args()
    print("| env | player | success (s.e.) | moves per game |")
    print("|---|---|---|---|")
    for env_id, name, player in ROWS:
        rate, se, moves = play(env_id, player, args.games, args.seed)
        print(f"| `{env_id}` | {name} | {rate:.1%} ({se:.1%}) | {moves:.1f} |")


if __name__ == "__main__":
    main()
