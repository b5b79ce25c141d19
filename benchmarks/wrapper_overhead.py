"""Cost of the text layer: raw env steps/s vs text env steps/s, measured in one run.

Both envs are the same ``gym.make(base_id)`` stack; the text env adds only the
TextEnvWrapper (formatting, parsing, prompt building). A scripted policy picks the same
actions for both; the text policy sends the precomputed example reply for each action, so
policy cost is not counted. Runs alternate between raw and text to share machine noise;
the median of the rounds is reported.

    python benchmarks/wrapper_overhead.py [--steps 20000] [--rounds 5]

Target: the text layer adds under 30 µs per step on Blackjack.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

from textgym import make_text_env

TARGET_US = {"Blackjack-v1": 30.0}


def run(env, actions, steps, seed=0):
    env.reset(seed=seed)
    start = time.perf_counter()
    for i in range(steps):
        _, _, terminated, truncated, _ = env.step(actions[i])
        if terminated or truncated:
            env.reset()
    return time.perf_counter() - start


def measure(base_id: str, steps: int, rounds: int) -> tuple[float, float]:
    raw = gym.make(base_id)
    text = make_text_env(base_id, preset=base_id)
    rng = np.random.default_rng(0)
    actions = [int(a) for a in rng.integers(0, raw.action_space.n, size=steps)]
    replies_by_action = {a: text.example_reply(np.int64(a)) for a in set(actions)}
    replies = [replies_by_action[a] for a in actions]
    raw_times, text_times = [], []
    run(raw, actions, min(steps, 1000))  # warm-up
    run(text, replies, min(steps, 1000))
    for _ in range(rounds):
        raw_times.append(run(raw, actions, steps))
        text_times.append(run(text, replies, steps))
    return statistics.median(raw_times) / steps, statistics.median(text_times) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'env':<14} {'raw steps/s':>12} {'text steps/s':>13} {'ratio':>7} "
        f"{'added µs/step':>14}  target"
    )
    ok = True
    for base_id in ["Blackjack-v1", "CartPole-v1"]:
        raw_s, text_s = measure(base_id, args.steps, args.rounds)
        added_us = (text_s - raw_s) * 1e6
        target = TARGET_US.get(base_id)
        verdict = (
            "-"
            if target is None
            else (f"< {target:g} µs " + ("ok" if added_us < target else "MISSED"))
        )
        ok &= target is None or added_us < target
        print(
            f"{base_id:<14} {1 / raw_s:>12,.0f} {1 / text_s:>13,.0f} {raw_s / text_s:>7.2f} "
            f"{added_us:>14.1f}  {verdict}"
        )
    print("all targets met" if ok else "a target was missed")


if __name__ == "__main__":
    main()
