"""LlamaGym's Blackjack example, unchanged in shape, on textgym's PPO (offline, embedded model).

    python examples/blackjack.py [--episodes 200] [--eval-episodes 500] [--free-text]

The agent names its two replies (``action_replies``), so the Agent API uses choice decoding:
every reply is "stay" or "hit" from the first hand. ``--free-text`` runs LlamaGym's original
agent instead, whose free replies ``extract_action`` parses (with the embedded 135M model most
of them are prose, recorded invalid and penalised). Expected output: a progress bar, PPO stats
every --batch-size episodes, then the greedy return on --eval-episodes held-out hands before
and after training, with its standard error (measured numbers: README's examples table).
"""

from __future__ import annotations

import argparse
import math
import re

import gymnasium as gym
from tqdm import trange

from textgym_agents import Agent, evaluate
from textgym_agents.model.loading import load_model


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


class NamedBlackjackAgent(BlackjackAgent):
    """The same agent with its replies named: choice decoding, never an invalid reply."""

    def action_replies(self) -> dict[str, int]:
        return {"stay": 0, "hit": 1}


def greedy_return(agent: Agent, episodes: int) -> tuple[float, float]:
    """Mean greedy return on held-out hands (seeds 10,000+) and its standard error."""
    result = evaluate(agent, agent.text_env(gym.make("Blackjack-v1")), episodes, seed=10_000)
    return result["mean_return"], result["std_return"] / math.sqrt(episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-episodes", type=int, default=500, help="held-out hands")
    parser.add_argument("--free-text", action="store_true", help="LlamaGym's free-text agent")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    cls = BlackjackAgent if args.free_text else NamedBlackjackAgent
    agent = cls(
        model,
        tokenizer,
        "cpu",
        batch_size=args.batch_size,
        action_space=gym.spaces.Discrete(2),
        # Free text: LlamaGym's settings; named replies: the per-env defaults (for_env's).
        **({"max_new_tokens": 8, "learning_rate": 2e-5} if args.free_text else {}),
    )
    before = greedy_return(agent, args.eval_episodes) if args.eval_episodes else None
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
    if before is not None:
        after = greedy_return(agent, args.eval_episodes)
        print(f"greedy return on {args.eval_episodes} held-out hands (± standard error):")
        print(
            f"  before {before[0]:+.3f} ± {before[1]:.3f}, after {after[0]:+.3f} ± {after[1]:.3f}"
        )


if __name__ == "__main__":
    main()
