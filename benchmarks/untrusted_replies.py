"""Cost of hostile replies: parsing 1 MB of adversarial text vs parsing a normal reply.

For each parser kind (named Discrete, one-number Box, Dict, the calculator), times a normal
reply (the parser's own example) and several 1 MB shapes (unclosed braces, deep nesting, many
objects, escapes, fences, action names, random unicode), taking the best of ``--rounds``. Prints
the worst 1 MB time, its ratio to the normal reply, and the 10x-size ratio (1 MB vs 100 kB: ~10
means linear). No absolute target: the figure to watch is the ratio across changes.

    python benchmarks/untrusted_replies.py [--rounds 3]

Note: ``TextEnvWrapper`` rejects replies over ``max_reply_chars`` (4096 by default) before
parsing, so in training a 1 MB reply costs a length check; this measures the parsers alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from textgym.envs.calculator_parser import CalculatorParser
from textgym.parsers import ActionParseError, ActionParser, JSONActionParser

MB = 1_000_000


def shapes(size: int) -> dict[str, str]:
    rng = np.random.default_rng(0)
    codes = rng.integers(0x20, 0x10FFFF, size)
    return {
        "unclosed braces": "{" * size,
        "deep nesting": '{"action":' * (size // 11) + "1" + "}" * (size // 11),
        "many objects": '{"action": "jump"} ' * (size // 19),
        "one huge object": json.dumps({"action": ["x"] * (size // 5)}),
        "quotes/escapes": '{"' + '\\"' * (size // 2),
        "fences": "```json\n{" * (size // 9),
        "action names": "hit stick up down " * (size // 18),
        "tool calls": "Action: calculator(" * (size // 19),
        "random unicode": "".join(chr(c) for c in codes if not 0xD800 <= c < 0xE000),
    }


PARSERS: dict[str, tuple[ActionParser, str]] = {
    "named Discrete": (
        JSONActionParser.from_space(spaces.Discrete(2), action_names=["stick", "hit"]),
        '{"action": "hit"}',
    ),
    "Box (1 number)": (
        JSONActionParser.from_space(spaces.Box(-2.0, 2.0, (1,), np.float32), field_name="torque"),
        '{"torque": 0.5}',
    ),
    "Dict": (
        JSONActionParser.from_space(
            spaces.Dict({"move": spaces.Discrete(2), "speed": spaces.Box(0.0, 1.0, (2,))}),
            action_names={"move": ["up", "down"]},
        ),
        '{"move": "up", "speed": [0.5, 0.25]}',
    ),
    "calculator": (CalculatorParser(), "Thought: multiply.\nAction: calculator(123 * 456)"),
}


def best_time(parser: ActionParser, text: str, rounds: int, repeat: int = 1) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            with contextlib.suppress(ActionParseError):
                parser.parse(text)
        times.append((time.perf_counter() - start) / repeat)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    big, small = shapes(MB), shapes(MB // 10)
    gym.logger.min_level = 40  # quiet the Box precision warning
    print(
        f"{'parser':<16} {'normal µs':>10} {'worst 1 MB shape':<17} {'1 MB ms':>8} "
        f"{'1 MB / normal':>14} {'1 MB / 100 kB':>14}"
    )
    for name, (p, normal) in PARSERS.items():
        normal_s = best_time(p, normal, args.rounds, repeat=2000)
        big_s = {shape: best_time(p, text, args.rounds) for shape, text in big.items()}
        worst = max(big_s, key=big_s.__getitem__)
        small_s = best_time(p, small[worst], args.rounds)
        print(
            f"{name:<16} {normal_s * 1e6:>10.1f} {worst:<17} {big_s[worst] * 1e3:>8.1f} "
            f"{big_s[worst] / normal_s:>14,.0f} {big_s[worst] / small_s:>14.1f}"
        )


if __name__ == "__main__":
    main()
