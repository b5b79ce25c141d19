"""Train the embedded SmolLM2 model to play blackjack: text env + PPOPolicy, offline.

    python examples/blackjack_text_env.py [--hands 400] [--out runs/blackjack]

Shows a progress bar, writes metrics, checkpoints, the final adapter and a learning-curve
PNG to --out, and prints the greedy evaluation before and after training. Replies use choice
decoding (the two valid replies are scored; none is invalid) with exploration settings
(temperature 2 over the choices, entropy bonus 0.3), those of ``textgym train``.

Expected output with the defaults (one run: 523 s wall on one CPU core, OMP_NUM_THREADS=1):

    before: mean return -0.155, invalid replies 0.0%
     after: mean return -0.155, invalid replies 0.0%
    run written to runs/blackjack (learning_curve.png, metrics.jsonl, final/)
    Your hand totals 20. The dealer shows a 7. -> {"action": "stick"}

The model sticks on every hand before and after: 400 hands do not teach the embedded 135M model
when to hit (benchmarks/blackjack_learning.py and docs/results.md measure why). The example
shows the API and the run directory; use it to try settings (``--hands``, ``--temperature``,
``--ent-coef``, ``--learning-rate``).
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import textgym  # noqa: F401  (registers textgym/Blackjack-v1)
from textgym_agents import PPOConfig, PPOPolicy, evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hands", type=int, default=400, help="training hands")
    parser.add_argument("--eval-hands", type=int, default=200)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=2.0, help="sampling in training")
    parser.add_argument("--ent-coef", type=float, default=0.3, help="entropy bonus")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--out", default="runs/blackjack")
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()

    config = PPOConfig(
        # Score the two valid replies and sample one (choice decoding): every reply is
        # valid and a turn is one forward pass. Both replies start with this prefix.
        decoding="choices",
        reply_prefix='{"action": "',
        temperature=args.temperature,  # explore: zero-shot the model almost always sticks
        ent_coef=args.ent_coef,
        num_steps=4,
        minibatch_size=32,
        micro_batch_size=16,
        learning_rate=args.learning_rate,
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
    choices = eval_env.get_wrapper_attr("reply_choices")()  # the valid replies
    print(messages[-1]["content"], "->", policy.act(messages, choices=choices, greedy=True))


if __name__ == "__main__":
    main()
