"""Your own Gymnasium env as a text env: a Pydantic action model, gym.register, PPO training.

    python examples/custom_env.py [--episodes 80] [--out runs/cafe]

``CafeEnv`` is a plain Gymnasium env: three customers per episode, each ordering 1-3 cups of
coffee, tea or juice (reward 1 for the exact order, 0.5 for the right drink). Replies are JSON
validated by the Pydantic model ``Serve`` (``Literal`` drink, ``Field(ge=1, le=3)`` cups, a
validator accepting " Tea ", no extra fields) and mapped to the Dict action by ``to_action``.
The text env is registered with ``gym.register`` and checked with ``textgym.check_text_env``;
the embedded model is trained with PPO and evaluated (greedy) before and after.

Expected output with the defaults (one run: 470 s wall on one CPU core, OMP_NUM_THREADS=1,
the other core busy with another job; the system prompt is cut short here):

    check_text_env: 20 round trips passed
    --- system prompt ---
    You work at a café counter. Serve each customer exactly what they order.
    ...
    - "cups": integer from 1 to 3. How many cups to pour
    Example reply: {"drink": "coffee", "cups": 1}
    --- user ---
    Customer 1 of 3 orders 2 cups of juice.
    reply {"drink": " Tea ", "cups": 2} -> valid, env action {'drink': np.int64(1), 'cups': ...
    reply {"drink": "espresso", "cups": 5} -> invalid action: drink: Input should be 'coffee',
    'tea' or 'juice'; cups: Input should be less than or equal to 3
    before: perfect episodes 4.2%, mean return 1.12 / 3, invalid replies 0.0%
     after: perfect episodes 100.0%, mean return 3.00 / 3, invalid replies 0.0%
    run written to runs/cafe (learning_curve.png, metrics.jsonl, final/)
    Customer 1 of 3 orders 2 cups of tea. -> {"drink": "tea", "cups": 2}

Before training the model copies the cups but pours the example's coffee for every order.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Dict, Discrete
from pydantic import BaseModel, ConfigDict, Field, field_validator

import textgym
from textgym.formatters import FunctionFormatter
from textgym.parsers import JSONActionParser
from textgym_agents import PPOConfig, PPOPolicy, evaluate

DRINKS = ("coffee", "tea", "juice")
CUSTOMERS = 3
Action = dict[str, np.int64]


class CafeEnv(gym.Env[Action, Action]):
    """Three customers in a row; each orders 1-3 cups of one drink (a plain Gymnasium env)."""

    def __init__(self) -> None:
        order = {"drink": Discrete(len(DRINKS)), "cups": Discrete(3, start=1)}
        self.observation_space = Dict({**order, "customer": Discrete(CUSTOMERS)})
        self.action_space = Dict(order)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Action, dict[str, Any]]:
        super().reset(seed=seed)
        self.served = self.perfect = 0
        return self._next_order(), {}

    def step(self, action: Action) -> tuple[Action, float, bool, bool, dict[str, Any]]:
        right_drink = action["drink"] == self.order["drink"]
        perfect = right_drink and action["cups"] == self.order["cups"]
        self.served, self.perfect = self.served + 1, self.perfect + int(perfect)
        reward = 1.0 if perfect else 0.5 if right_drink else 0.0
        done = self.served == CUSTOMERS
        info = {"is_success": self.perfect == CUSTOMERS} if done else {}
        return self._next_order(), reward, done, False, info

    def _next_order(self) -> Action:
        self.order = {
            "drink": np.int64(self.np_random.integers(len(DRINKS))),
            "cups": np.int64(self.np_random.integers(1, 4)),
            "customer": np.int64(min(self.served, CUSTOMERS - 1)),
        }
        return self.order


class Serve(BaseModel):
    """What to pour for the customer at the counter."""

    model_config = ConfigDict(extra="forbid")
    drink: Literal["coffee", "tea", "juice"] = Field(description="The drink that was ordered")
    cups: int = Field(1, ge=1, le=3, description="How many cups to pour")

    @field_validator("drink", mode="before")
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


def to_action(serve: Serve) -> Action:
    return {"drink": np.int64(DRINKS.index(serve.drink)), "cups": np.int64(serve.cups)}


def from_action(action: Action) -> Serve:  # gives example replies (used by check_text_env)
    return Serve(drink=DRINKS[int(action["drink"])], cups=int(action["cups"]))


def describe(obs: Action, info: dict[str, Any]) -> str:
    cups = int(obs["cups"])
    what = f"{cups} cup{'s' if cups > 1 else ''} of {DRINKS[int(obs['drink'])]}"
    return f"Customer {int(obs['customer']) + 1} of {CUSTOMERS} orders {what}."


def make_cafe_text_env(**wrapper_options: Any) -> textgym.TextEnvWrapper:
    return textgym.TextEnvWrapper(
        CafeEnv(),
        formatter=FunctionFormatter(describe),
        parser=JSONActionParser(Serve, to_action=to_action, from_action=from_action),
        system_prompt="You work at a café counter. Serve each customer exactly what they order.",
        **wrapper_options,
    )


gym.register(id="custom/Cafe-v0", entry_point=make_cafe_text_env, max_episode_steps=9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=80, help="training episodes")
    parser.add_argument("--eval-episodes", type=int, default=24)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--out", default="runs/cafe")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    env = gym.make("custom/Cafe-v0")
    print(f"check_text_env: {textgym.check_text_env(env, n_samples=20)} round trips passed")
    messages, _ = env.reset(seed=0)
    print(
        f"--- system prompt ---\n{messages[0]['content']}\n--- user ---\n{messages[-1]['content']}"
    )
    for reply in ['{"drink": " Tea ", "cups": 2}', '{"drink": "espresso", "cups": 5}']:
        *_, info = env.step(reply)
        verdict = info.get("parse_error", f"valid, env action {info.get('env_action')}")
        print(f"reply {reply} -> {verdict}")

    config = PPOConfig(
        # The model continues the JSON after the prefix and stops at the closing brace.
        reply_prefix='{"drink": "',
        stop_strings=["}"],
        max_new_tokens=12,
        num_steps=3,
        minibatch_size=24,
        micro_batch_size=24,
        learning_rate=3e-4,
        kl_coef=0.0,
    )
    policy = PPOPolicy.from_pretrained(args.model, config=config)
    before = evaluate(policy, env, n_episodes=args.eval_episodes, seed=10_000)
    envs = gym.make_vec("custom/Cafe-v0", num_envs=args.num_envs)
    policy.learn(envs, total_episodes=args.episodes, output_dir=args.out)
    after = evaluate(policy, env, n_episodes=args.eval_episodes, seed=10_000)
    for name, result in [("before", before), ("after", after)]:
        # success_rate is missing when no evaluated episode ended by serving all customers.
        perfect, invalid = result.get("success_rate", 0.0), result["invalid_rate"]
        print(
            f"{name:>6}: perfect episodes {perfect:.1%}, mean return "
            f"{result['mean_return']:.2f} / {CUSTOMERS}, invalid replies {invalid:.1%}"
        )
    print(f"run written to {args.out} (learning_curve.png, metrics.jsonl, final/)")
    messages, _ = env.reset(seed=1)
    print(messages[-1]["content"], "->", policy.act(messages, greedy=True))


if __name__ == "__main__":
    main()
