"""LlamaGym's Blackjack example, unchanged in shape, on textgym's PPO (offline, embedded model).

    python examples/blackjack.py [--episodes 6000] [--seed 0] [--free-text]

The agent names its two replies (``action_replies``), so the Agent API uses choice decoding:
every reply is "stay" or "hit" from the first hand. It trains with the settings
``textgym train textgym/Blackjack-v1`` uses (``ENV_RECIPES``): GiGPO in groups of 4 hands
(the loop deals each group one hand: the env is reset with one seed per group), learning rate
3e-4 annealed to 0 over ``--episodes``, entropy bonus 0.6. Each prompt shows the current hand
alone (``history=0``): it is all a decision needs, and the greedy policy is then a table over
the 280 hands a player can hold, whose expected return ``textgym.envs.blackjack_exact``
computes exactly (always stick: -0.183; basic strategy, the best: -0.043).

``--free-text`` runs LlamaGym's original agent instead (its settings, the whole hand in every
prompt), whose free replies ``extract_action`` parses (with the embedded 135M model most are
prose, recorded invalid and penalised); it is scored on ``--eval-episodes`` held-out hands.

Expected output: a progress bar with the mean return of the last 100 hands, PPO stats every
``--log-every`` updates, then the greedy return before and after training (measured numbers
and run times: docs/examples.md).
"""

from __future__ import annotations

import argparse
import math
import re

import gymnasium as gym
from tqdm import trange

from textgym.envs import blackjack_exact
from textgym_agents import Agent, evaluate
from textgym_agents.model.loading import load_model
from textgym_agents.ppo.defaults import ENV_RECIPES

ACTIONS = ("stick", "hit")  # Blackjack-v1's action ids
TRAIN_SEEDS = 1_000_000  # training deals from (seed + 1) * TRAIN_SEEDS; held-out: 10,000+


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


def exact_greedy_return(agent: Agent) -> float:
    """The greedy policy's exact expected return: its reply to each of the 280 hands."""
    hands = list(blackjack_exact.states())
    prompts = [
        [
            {"role": "system", "content": agent.get_system_prompt()},
            {"role": "user", "content": agent.format_observation(hand)},
        ]
        for hand in hands
    ]
    replies = agent.act_batch(prompts, choices=[list(agent.replies)] * len(hands), greedy=True)
    table = {hand: ACTIONS[agent.replies[r]] for hand, r in zip(hands, replies, strict=True)}
    return blackjack_exact.expected_return(lambda *hand: table[hand])


def sampled_greedy_return(agent: Agent, episodes: int) -> str:
    """Mean greedy return on held-out hands (seeds 10,000+) with its standard error."""
    result = evaluate(agent, agent.text_env(gym.make("Blackjack-v1")), episodes, seed=10_000)
    se = result["std_return"] / math.sqrt(episodes)
    return f"{result['mean_return']:+.3f} ± {se:.3f} (mean of {episodes} held-out hands)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=6000, help="training hands")
    parser.add_argument("--batch-size", type=int, default=16, help="hands per PPO update")
    parser.add_argument("--seed", type=int, default=0, help="seeds sampling and the deals")
    parser.add_argument("--eval-episodes", type=int, default=500, help="--free-text: held-out")
    parser.add_argument("--log-every", type=int, default=25, help="updates between stats lines")
    parser.add_argument("--free-text", action="store_true", help="LlamaGym's free-text agent")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    if args.free_text:  # LlamaGym's settings
        settings = {"max_new_tokens": 8, "learning_rate": 2e-5}
        agent = BlackjackAgent(model, tokenizer, "cpu", batch_size=args.batch_size, **settings)
    else:  # textgym train's Blackjack settings, the hand alone in each prompt
        agent = NamedBlackjackAgent(
            model,
            tokenizer,
            "cpu",
            batch_size=args.batch_size,
            total_episodes=args.episodes,
            history=0,
            **{**ENV_RECIPES["textgym/Blackjack-v1"], "seed": args.seed},
        )

    def greedy_return() -> str:
        if args.free_text:
            return sampled_greedy_return(agent, args.eval_episodes)
        return f"{exact_greedy_return(agent):+.4f} (exact)"

    before = greedy_return()
    env = gym.make("Blackjack-v1")
    returns, updates = [], 0
    bar = trange(args.episodes)
    for episode in bar:
        deal = (args.seed + 1) * TRAIN_SEEDS + episode // agent.group_size  # one per group
        observation, info = env.reset(seed=deal)
        done, episode_return = False, 0.0
        while not done:
            action = agent.act(observation)
            observation, reward, terminated, truncated, info = env.step(action)
            agent.assign_reward(reward)
            episode_return += reward
            done = terminated or truncated
        returns.append(episode_return)
        train_stats = agent.terminate_episode(truncated and not terminated, observation)
        recent = returns[-100:]
        bar.set_postfix(last_100=f"{sum(recent) / len(recent):+.3f}", refresh=False)
        if train_stats is not None:
            updates += 1
            if updates % args.log_every == 0:
                keys = ["loss/policy", "policy/entropy", "train/learning_rate", "env/invalid_rate"]
                bar.write(str({k: round(train_stats[k], 4) for k in keys if k in train_stats}))
    recent = returns[-100:]
    print(f"mean return of the last {len(recent)} training hands: {sum(recent) / len(recent):+.3f}")
    print(f"greedy return before {before}, after {greedy_return()}")


if __name__ == "__main__":
    main()
