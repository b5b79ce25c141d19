"""Train the embedded SmolLM2 model to play blackjack: text env + PPOPolicy, offline.

    python examples/blackjack_text_env.py [--hands 1000] [--out runs/blackjack]

Shows a progress bar, writes metrics, checkpoints, the final adapter and a learning-curve
PNG to --out, and prints the greedy evaluation before and after training.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import textgym  # noqa: F401  (registers textgym/Blackjack-v1)
from textgym_agents import PPOConfig, PPOPolicy, evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hands", type=int, default=1000, help="training hands")
    parser.add_argument("--eval-hands", type=int, default=200)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--out", default="runs/blackjack")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    config = PPOConfig(
        # The reply starts with the JSON the env asks for, so the model only picks the
        # action; it stops at the closing quote. Replies are still parsed by the env.
        reply_prefix='{"action": "',
        stop_strings=['"'],
        max_new_tokens=4,
        num_steps=4,
        minibatch_size=32,
        micro_batch_size=16,
        learning_rate=2e-4,
        kl_coef=0.0,
    )
    policy = PPOPolicy.from_pretrained(args.model, config=config)  # LoRA attached
    eval_env = gym.make("textgym/Blackjack-v1")
    before = evaluate(policy, eval_env, n_episodes=args.eval_hands, seed=10_000)

    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=args.num_envs)
    policy.learn(envs, total_episodes=args.hands, output_dir=args.out)

    after = evaluate(policy, eval_env, n_episodes=args.eval_hands, seed=10_000)
    for name, result in [("before", before), ("after", after)]:
        print(
            f"{name:>6}: mean return {result['mean_return']:+.3f}, "
            f"invalid replies {result['invalid_rate']:.1%}"
        )
    print(f"run written to {args.out} (learning_curve.png, metrics.jsonl, final/)")
    # The trained policy plays through the ordinary env loop.
    messages, _ = eval_env.reset(seed=1)
    print(messages[-1]["content"], "->", policy.act(messages, greedy=True))


if __name__ == "__main__":
    main()
