"""Decoding modes of the embedded model, zero-shot and after training, measured in one run.

For each env: the invalid-reply rate and seconds per turn of ``free`` text, ``choices`` (where
the env lists its valid replies) and ``constrained`` (where it has a reply JSON schema), greedy,
over the same episodes. Then Blackjack's greedy mean return after the same training budget in
each mode.

    python benchmarks/decoding_modes.py [--episodes 50] [--train-hands 500] [--eval-hands 500]

Targets: 0% invalid replies with ``choices`` and ``constrained``, and
``choices`` faster per turn than ``free``.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, evaluate
from textgym_agents.ppo.rollout import reply_choices, reply_schemas

ENVS = ["textgym/Blackjack-v1", "textgym/FrozenLake-v1", "textgym/Calculator-v0"]


# "free+prefix": free text that starts with the JSON the env asks for and stops at the closing
# quote (the trick the examples use with free decoding), for envs whose replies are JSON actions.
MODES = {
    "free": {"decoding": "free"},
    "free+prefix": {"decoding": "free", "reply_prefix": '{"action": "', "stop_strings": ['"']},
    "choices": {"decoding": "choices", "reply_prefix": '{"action": "'},
    # No prefix: the grammar writes the whole reply, so one setting serves every env.
    "constrained": {"decoding": "constrained"},
    # The JSON start as a prefix (the grammar consumes it): fewer forced tokens to generate.
    "constrained+prefix": {"decoding": "constrained", "reply_prefix": '{"action": "'},
}


def config(mode: str, **overrides) -> PPOConfig:
    """The same generation settings in every mode; only the decoding differs."""
    values = dict(MODES[mode], max_new_tokens=24, progress=False)
    values.update(overrides)
    return PPOConfig(**values)


def zero_shot(policy: PPOPolicy, env_id: str, mode: str, episodes: int) -> dict[str, float]:
    """Invalid rate and seconds per turn of greedy play."""
    policy.config = config(mode)
    env = gym.make(env_id)
    start = time.perf_counter()
    result = evaluate(policy, env, episodes, seed=10_000, num_envs=min(16, episodes))
    turns = result["mean_length"] * result["episodes"]
    return {**result, "s_per_turn": (time.perf_counter() - start) / max(turns, 1)}


def same_prompts(policy: PPOPolicy, env_id: str, modes: list[str], n: int = 16) -> dict:
    """Seconds per reply of each mode on the same n first-turn prompts (one batch, greedy, best
    of 2): the cost of a decision without the episode-length effects of playing whole episodes
    (an invalid-reply run ends early; finished envs leave batches part-empty)."""
    envs = gym.make_vec(env_id, num_envs=n)
    batch = list(envs.reset(seed=10_000)[0])
    choices, schemas = reply_choices(envs), reply_schemas(envs)
    envs.close()
    seconds = {}
    for mode in modes:
        policy.config = config(mode)
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            policy.generate(batch, greedy=True, choices=choices, schemas=schemas)
            best = min(best, time.perf_counter() - start)
        seconds[mode] = best / n
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50, help="zero-shot episodes per env")
    parser.add_argument("--train-hands", type=int, default=500, help="0 skips training")
    parser.add_argument("--eval-hands", type=int, default=500)
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(args.model, config=config("free"))

    print(f"zero-shot, greedy, {args.episodes} episodes per env")
    print(f"{'env':<24}{'mode':<19}{'invalid':>9}{'s/turn':>9}{'mean return':>13}")
    for env_id in ENVS:
        modes = ["free"]
        probe = gym.make_vec(env_id, num_envs=1)
        if reply_choices(probe) is not None:
            modes += ["free+prefix", "choices"]
        if reply_schemas(probe) is not None:
            modes += (
                ["constrained", "constrained+prefix"] if "choices" in modes else ["constrained"]
            )
        probe.close()
        timings = {}
        for mode in modes:
            r = zero_shot(policy, env_id, mode, args.episodes)
            timings[mode] = r["s_per_turn"]
            print(
                f"{env_id:<24}{mode:<19}{r['invalid_rate']:>9.1%}{r['s_per_turn']:>9.2f}"
                f"{r['mean_return']:>+13.3f}",
                flush=True,
            )
        for mode in ("choices", "constrained", "constrained+prefix"):
            if mode in timings:
                speedup = timings["free"] / timings[mode]
                print(f"{'':<24}{mode}: {speedup:.1f}x faster per turn than free")
        same = same_prompts(policy, env_id, modes)
        print(
            f"{'':<24}same 16 first-turn prompts, s/reply: "
            + ", ".join(f"{mode} {t:.3f}" for mode, t in same.items())
            + "; "
            + ", ".join(
                f"{mode} {same['free'] / same[mode]:.1f}x"
                for mode in ("choices", "constrained")
                if mode in same
            )
            + " faster than free",
            flush=True,
        )

    if args.train_hands <= 0:
        return
    print(f"\nBlackjack: greedy mean return over {args.eval_hands} hands after ", end="")
    print(f"{args.train_hands} training hands (same PPO settings)")
    eval_env = gym.make("textgym/Blackjack-v1")
    for mode in ["free+prefix", "choices", "constrained"]:
        torch.manual_seed(0)
        settings = dict(num_steps=4, minibatch_size=32, micro_batch_size=16, kl_coef=0.0)
        policy = PPOPolicy.from_pretrained(args.model, config=config(mode, **settings))
        envs = gym.make_vec("textgym/Blackjack-v1", num_envs=16)
        start = time.perf_counter()
        policy.learn(envs, total_episodes=args.train_hands, output_dir=None)
        seconds = time.perf_counter() - start
        r = evaluate(policy, eval_env, args.eval_hands, seed=10_000)
        print(
            f"{mode:<19} mean return {r['mean_return']:+.3f}  invalid {r['invalid_rate']:.1%}  "
            f"training {seconds:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
