"""LlamaGym's Blackjack example, unchanged in shape, on textgym's PPO (offline, embedded model).

    python examples/blackjack.py [--episodes 200]

Expected output: a progress bar, then PPO stats every --batch-size episodes (loss, KL,
invalid rate), and the mean return of the last 100 episodes. One run with the defaults took
357 s on one CPU core (OMP_NUM_THREADS=1) and ended with ``mean return of the last 100
episodes: -0.290``. The invalid rate stayed at 0.75-1.0: the embedded 135M model mostly writes
prose without "stay" or "hit", so those turns send the default action and are penalised, and
200 episodes (LlamaGym's example ran 5,000) do not teach it the format.
``examples/blackjack_text_env.py`` trains the same task with choice decoding instead.
"""

from __future__ import annotations

import argparse
import re

import gymnasium as gym
from tqdm import trange

from textgym_agents import Agent
from textgym_agents.models import load_model


class BlackjackAgent(Agent):
    def get_system_prompt(self) -> str:
        return (
            "You are an expert blackjack player. Every turn, you will see your current sum, "
            "the card the dealer is showing, and whether you hold a usable ace. Win by "
            "exceeding the dealer's hand without going over 21. Reply with one word: "
            '"stay" or "hit".'
        )

    def format_observation(self, observation) -> str:
        ace = "have" if observation[2] else "don't have"
        return (
            f"Your current total is {observation[0]}, the dealer is showing "
            f"{observation[1]}, and you {ace} a usable ace."
        )

    def extract_action(self, response: str) -> int:
        match = re.search(r"\b(stay|hit)\b", response.lower())
        if match is None:
            raise ValueError(f"no action in {response!r}")  # recorded as an invalid turn
        return 0 if match.group(1) == "stay" else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    agent = BlackjackAgent(
        model,
        tokenizer,
        "cpu",
        batch_size=args.batch_size,
        action_space=gym.spaces.Discrete(2),
        max_new_tokens=8,
        learning_rate=2e-5,
    )
    env = gym.make("Blackjack-v1")
    returns = []
    for _ in trange(args.episodes):
        observation, info = env.reset()
        done, episode_return = False, 0.0
        while not done:
            action = agent.act(observation)
            observation, reward, terminated, truncated, info = env.step(action)
            agent.assign_reward(reward)
            episode_return += reward
            done = terminated or truncated
        returns.append(episode_return)
        train_stats = agent.terminate_episode(truncated=truncated and not terminated)
        if train_stats is not None:
            keys = ["loss/policy", "loss/value", "policy/approx_kl", "env/invalid_rate"]
            print({k: round(train_stats[k], 4) for k in keys if k in train_stats})
    recent = returns[-100:]
    print(f"mean return of the last {len(recent)} episodes: {sum(recent) / len(recent):+.3f}")


if __name__ == "__main__":
    main()
