"""Random-policy and BabyAI-bot baselines of the BabyAI text envs: success rate with its s.e.

The random policy replies with one of the env's valid replies (``reply_choices``) uniformly at
random; the bot is minigrid's scripted ``BabyAIBot`` (it reads the level's full state, so it is
the scripted optimum a text policy can only approach), its action sent as the action's name.
Both play through the text env, so replies are parsed exactly as a model's would be. Episode
``i`` of an id resets with seed ``--seed + i``. Needs the minigrid extra; no model.

    .venv/bin/python benchmarks/babyai_random.py              # 500 episodes per id
    .venv/bin/python benchmarks/babyai_random.py --episodes 200 --ids textgym/BabyAI-GoToLocal-v0
    .venv/bin/python benchmarks/babyai_random.py --bot        # the bot's rows too
    .venv/bin/python benchmarks/babyai_random.py --max-steps 16   # episodes cut at 16 steps
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from typing import Any

import gymnasium as gym

import textgym
from textgym.envs.minigrid_text import ACTION_NAMES, BABYAI_LEVELS
from textgym.evaluation import evaluate


def random_policy(choices: list[str], seed: int):
    rng = random.Random(seed)
    return lambda messages: rng.choice(choices)


def baseline(env_id: str, episodes: int, seed: int, **kwargs: Any) -> dict[str, float]:
    """A uniformly random valid reply each step, on episodes ``seed`` .. of ``env_id``."""
    env = gym.make(env_id, **kwargs)
    choices = textgym.reply_choices(env)
    assert choices, f"{env_id} has no fixed set of replies"
    start = time.perf_counter()
    result = evaluate(random_policy(choices, seed), env, episodes, seed=seed)
    env.close()
    p = result.success_rate
    return {
        "success": p,
        "se": math.sqrt(p * (1 - p) / episodes),
        "return": result.mean_return,
        "length": result.mean_length,
        "seconds": time.perf_counter() - start,
    }


def bot_baseline(env_id: str, episodes: int, seed: int, **kwargs: Any) -> dict[str, float]:
    """minigrid's ``BabyAIBot`` on episodes ``seed`` .. ``seed + episodes - 1`` of ``env_id``.

    The bot is built on each reset level and asked for its next action every step
    (``replan``); a suggestion the text env does not offer (``done`` where the level does not
    take it) ends the episode as it stands.
    """
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = gym.make(env_id, **kwargs)
    names = textgym.checker.find_text_wrapper(env).parser.schema.names
    start = time.perf_counter()
    successes, returns, lengths = [], [], []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        bot = BabyAIBot(env.unwrapped)
        total, length, done, info = 0.0, 0, False, {}
        while not done:
            name = ACTION_NAMES[int(bot.replan())]
            if name not in names:
                break
            _, reward, terminated, truncated, info = env.step(json.dumps({"action": name}))
            total, length = total + float(reward), length + 1
            done = terminated or truncated
        successes.append(bool(info.get("is_success", False)))
        returns.append(total)
        lengths.append(length)
    env.close()
    return summary(successes, returns, lengths, start)


def summary(
    successes: list[bool], returns: list[float], lengths: list[int], start: float
) -> dict[str, float]:
    """Success rate with its standard error, mean return and length, seconds since ``start``."""
    n = len(successes)
    p = sum(successes) / n
    return {
        "success": p,
        "se": math.sqrt(p * (1 - p) / n),
        "return": sum(returns) / n,
        "length": sum(lengths) / n,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1000, help="seed of the first episode")
    parser.add_argument("--ids", nargs="*", default=[f"textgym/{name}" for name in BABYAI_LEVELS])
    parser.add_argument("--bot", action="store_true", help="add the BabyAI bot's rows")
    parser.add_argument("--max-steps", type=int, default=None, help="default: each level's own")
    args = parser.parse_args()
    kwargs = {} if args.max_steps is None else {"max_steps": args.max_steps}
    cap = f", at most {args.max_steps} steps" if kwargs else ""
    print(f"{args.episodes} episodes per id, seeds {args.seed}..{cap}")
    print("| id | policy | success | s.e. | mean return | mean length | seconds |")
    print("|---|---|---|---|---|---|---|")
    for env_id in args.ids:
        rows = {"random": baseline(env_id, args.episodes, args.seed, **kwargs)}
        if args.bot:
            rows["BabyAI bot"] = bot_baseline(env_id, args.episodes, args.seed, **kwargs)
        for policy, row in rows.items():
            print(
                f"| `{env_id}` | {policy} | {row['success']:.1%} | {row['se']:.1%} "
                f"| {row['return']:.3f} | {row['length']:.1f} | {row['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
