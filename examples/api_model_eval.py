"""Evaluate a model behind any OpenAI-compatible chat API, or a plain function, on a text env.

    python examples/api_model_eval.py --policy basic-strategy --episodes 1000
    OPENAI_API_KEY=sk-... python examples/api_model_eval.py --model gpt-4o-mini --episodes 50
    python examples/api_model_eval.py --base-url http://localhost:8000/v1 --model my-model \
        --env textgym/FrozenLake-v1 -e is_slippery=false --verbose

A policy is any callable ``messages -> reply text``, and the loop is the plain Gymnasium one:

    messages, info = env.reset(seed=seed)
    while not done:
        reply = policy(messages)                       # chat API, function, person...
        messages, reward, terminated, truncated, info = env.step(reply)

``textgym.evaluate`` runs it over N seeded episodes and reports the mean return, the
invalid-reply rate and (where the env reports it) the success rate. The API policy,
``textgym.ChatCompletionsPolicy``, needs only the standard library: it POSTs the messages to
``{base_url}/chat/completions`` (OpenAI, vLLM, llama.cpp's server, Ollama, ...), with the base
URL, model and key from the flags or from ``OPENAI_BASE_URL``, ``OPENAI_MODEL`` and
``OPENAI_API_KEY``. The plain-function policy here is Blackjack basic strategy, reading the same
text the model reads. Output of the first command (offline, under a second):

    basic strategy on textgym/Blackjack-v1
    1000 episodes: return -0.018 ± 0.957, length 1.52, invalid replies 0.0%, success 44.9%

On the same 1000 hands always sticking (``--policy stick``) returns -0.141. ``--verbose``
prints every prompt's last message, the reply and each episode's return.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import gymnasium as gym

import textgym
from textgym import Episode
from textgym.cli_common import add_env_arg, parse_env_args
from textgym.wrappers import Messages

_HAND = re.compile(
    r"Your hand totals (\d+)(, counting an ace as 11)?\. The dealer shows (an ace|a (\d+))\."
)


def basic_strategy(messages: Messages) -> str:
    """Blackjack basic strategy (hit or stick; no doubling or splitting) read off the prompt.

    Example:
        >>> hand = "Your hand totals 16. The dealer shows a 10."
        >>> basic_strategy([{"role": "user", "content": hand}])
        '{"action": "hit"}'
    """
    match = _HAND.search(messages[-1]["content"])
    if match is None:
        raise ValueError(f"no Blackjack hand in {messages[-1]['content']!r}")
    total, soft = int(match.group(1)), match.group(2) is not None
    dealer = 11 if match.group(3) == "an ace" else int(match.group(4))
    if soft:
        hit = total <= 17 or (total == 18 and dealer >= 9)
    elif total <= 11:
        hit = True
    elif total == 12:
        hit = dealer not in (4, 5, 6)
    else:
        hit = total <= 16 and dealer >= 7
    return '{"action": "%s"}' % ("hit" if hit else "stick")


def always_stick(messages: Messages) -> str:
    """The simplest baseline: never take a card."""
    return '{"action": "stick"}'


def show_turns(policy):
    """Wrap a policy so every prompt's last message and the reply are printed."""

    def shown(messages: Messages) -> str:
        reply = policy(messages)
        print(f"  > {messages[-1]['content']}\n  < {reply}")
        return reply

    return shown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="textgym/Blackjack-v1", help="text env id")
    add_env_arg(parser)
    parser.add_argument(
        "--policy",
        choices=["api", "basic-strategy", "stick"],
        default="api",
        help="api: an OpenAI-compatible endpoint; basic-strategy/stick: Blackjack functions",
    )
    parser.add_argument("--episodes", type=int, default=20, help="episodes to play")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        help="API root including /v1 (default: $OPENAI_BASE_URL or OpenAI)",
    )
    parser.add_argument(
        "--model", default=os.environ.get("OPENAI_MODEL"), help="model (default $OPENAI_MODEL)"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="API key (default $OPENAI_API_KEY; local servers usually need none)",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--verbose", action="store_true", help="print every turn and return")
    args = parser.parse_args(argv)
    if args.policy == "api" and not args.model:
        parser.error("--policy api needs --model (or OPENAI_MODEL)")
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = gym.make(args.env, **parse_env_args(args.env_arg))
    if args.policy == "api":
        policy = textgym.ChatCompletionsPolicy(
            args.model,
            args.base_url,
            api_key=args.api_key,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
        )
        print(f"{args.model} at {policy.url} on {args.env}")
    else:
        policy = basic_strategy if args.policy == "basic-strategy" else always_stick
        print(f"{args.policy.replace('-', ' ')} on {args.env}")

    def report(episode: Episode) -> None:
        replies = "reply" if episode.length == 1 else "replies"
        print(
            f"episode {episode.seed}: return {episode.episode_return:+g}, "
            f"{episode.length} {replies} ({episode.invalid} invalid)"
        )

    try:
        result = textgym.evaluate(
            show_turns(policy) if args.verbose else policy,
            env,
            args.episodes,
            seed=args.seed,
            on_episode=report if args.verbose else None,
        )
    except textgym.ChatAPIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        env.close()
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
