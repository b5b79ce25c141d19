"""Multi-turn navigation where credit must flow across turns: PPO on FrozenLake, offline.

    python examples/frozenlake.py [--episodes 48] [--map ledge|4x4] [--out runs/frozenlake]

The only reward is 1, on the move that reaches the goal G; every other move pays 0, and
falling into a hole H ends the episode with nothing. So the moves that led to G earn credit
only through PPO's turn-level GAE: with discount ``gamma`` and ``lam``, the advantage of a move
sums the later temporal-difference errors, so the goal's reward flows back to every earlier
turn of the episode (and the value head learns which cells are worth being on).

The lake is not slippery (``is_slippery=False``). The default map is a narrow ledge, 2 × 4:

    FFFS    walk left along the top row (S is the start),
    GHHH    then step down onto G; stepping down anywhere else is a hole.

Why not the classic 4x4 map (``--map 4x4``)? The embedded 135M model answers "left" in ~45%
of states whatever the map shows; replaying its measured choices, it would reach that G about
once in 10,000 episodes, so a short run has nothing to learn from. On the ledge its own choices
reach G in roughly 5-10% of episodes, and PPO must learn the one turn that matters: "down" at
the left end. Success, mean return and invalid replies are measured by sampling (greedy play
is deterministic here); the last lines replay one greedy episode.

Expected output with the defaults (16 sampled evaluation episodes; one run took 443 s wall on
one CPU core, OMP_NUM_THREADS=1, the other core busy with another job; a run this short varies
a lot, an earlier one started at 12.5% success):

    before: success 25.0%, mean return +0.250, invalid replies 14.9%, 4.6 turns/episode
     after: success 43.8%, mean return +0.438, invalid replies 8.8%, 5.7 turns/episode
    run written to runs/frozenlake (learning_curve.png, metrics.jsonl, final/)
    greedy episode: left left left left left left left left -> did not reach G
    You are at row 0, column 0 (P on the map; rows and columns count from 0).
    PFFS
    GHHH

Only the last of its six updates saw a success (in both runs); that one batch moved the
sampled policy, not its most likely move at the left end, so greedy play still waits there.
Longer is not simply better: with ``--episodes 200`` the training success rate peaked at 38%
near episode 80, then the policy collapsed onto "left" everywhere (entropy 2.0 -> 0.2), stopped
reaching G and had nothing left to learn from. ``ent_coef`` or ``kl_coef`` are the settings to
try against that. Choice decoding (``decoding="choices"``, no invalid replies) did worse here:
a turn that is not a move wastes time without risk, and without those the sampled policy
reached G once in 64 training episodes (temperature 2, ``ent_coef=0.1``) and greedy play still
only went left.
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

import textgym  # noqa: F401  (registers textgym/FrozenLake-v1)
from textgym_agents import PPOConfig, PPOPolicy, evaluate

MAPS = {"ledge": ["FFFS", "GHHH"], "4x4": ["SFFF", "FHFH", "FFFH", "HFFG"]}
MOVES = ("left", "down", "right", "up")  # FrozenLake's action order (the preset's names)


class ReportSuccess(gym.Wrapper):
    """Adds ``info["is_success"]`` when an episode ends, so ``evaluate`` reports a success rate."""

    def step(self, action: str) -> tuple[Any, ...]:
        messages, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:  # a reply that reaches G is the only step paying > 0
            info["is_success"] = bool(terminated and float(reward) > 0)
        return messages, reward, terminated, truncated, info


def lake_options(lake: list[str], max_moves: int) -> dict[str, Any]:
    """Options of ``gym.make``: the base env's, the text wrapper's and the time limit."""
    # An invalid reply wastes a turn but costs nothing: with the wrapper's default penalty
    # (-1 per invalid reply), jumping into the nearest hole was the cheapest way to stop paying
    # it, and PPO learned exactly that in a trial run.
    options = {"desc": lake, "is_slippery": False, "invalid_penalty": 0.0}
    return {**options, "max_episode_steps": max_moves}


def make_envs(lake: list[str], num_envs: int, max_moves: int) -> VectorEnv:
    options = lake_options(lake, max_moves)
    return gym.make_vec("textgym/FrozenLake-v1", num_envs, wrappers=[ReportSuccess], **options)


def greedy_episode(policy: PPOPolicy, env: gym.Env[Any, Any]) -> tuple[list[str], bool, str]:
    """Moves of one greedy episode, whether it reached G, and the last map shown."""
    messages, _ = env.reset(seed=0)
    moves, done, success = [], False, False
    while not done:
        messages, reward, terminated, truncated, info = env.step(policy.act(messages, greedy=True))
        moves.append(MOVES[int(info["env_action"])] if "env_action" in info else "(invalid)")
        success, done = terminated and float(reward) > 0, terminated or truncated
    return moves, success, messages[-1]["content"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48, help="training episodes")
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--map", choices=sorted(MAPS), default="ledge")
    parser.add_argument("--max-moves", type=int, default=8, help="turns per episode (time limit)")
    parser.add_argument("--out", default="runs/frozenlake")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    config = PPOConfig(
        reply_prefix='{"action": "',  # the model only names the move; the env parses the JSON
        stop_strings=['"'],
        max_new_tokens=3,
        gamma=0.95,  # discount per turn: a shorter path to G is worth more
        lam=0.95,  # GAE lambda: how far back one turn's TD error reaches at full weight
        num_steps=8,
        num_epochs=1,
        minibatch_size=32,
        micro_batch_size=16,
        learning_rate=5e-4,
        kl_coef=0.0,
    )
    policy = PPOPolicy.from_pretrained(args.model, config=config)
    lake = MAPS[args.map]
    eval_envs = make_envs(lake, min(16, args.eval_episodes), args.max_moves)
    before = evaluate(policy, eval_envs, n_episodes=args.eval_episodes, greedy=False, seed=10_000)

    envs = make_envs(lake, args.num_envs, args.max_moves)
    policy.learn(envs, total_episodes=args.episodes, output_dir=args.out)

    after = evaluate(policy, eval_envs, n_episodes=args.eval_episodes, greedy=False, seed=10_000)
    for name, result in [("before", before), ("after", after)]:
        print(
            f"{name:>6}: success {result['success_rate']:.1%}, mean return "
            f"{result['mean_return']:+.3f}, invalid replies {result['invalid_rate']:.1%}, "
            f"{result['mean_length']:.1f} turns/episode"
        )
    print(f"run written to {args.out} (learning_curve.png, metrics.jsonl, final/)")
    env = gym.make("textgym/FrozenLake-v1", **lake_options(lake, args.max_moves))
    moves, success, last_map = greedy_episode(policy, env)
    print(f"greedy episode: {' '.join(moves)} -> {'reached G' if success else 'did not reach G'}")
    print("\n".join(last_map.splitlines()[-len(lake) - 1 :]))  # where the agent ended


if __name__ == "__main__":
    main()
