"""Episodes/s of the default `textgym train` loop beside the loop before its speed work, in one run.

The arms train the embedded model on one env with the settings `textgym train` picks for it
(textgym_agents.ppo.defaults.env_defaults): textgym/Blackjack-v1 (16 envs; one to three turns
a hand, choice decoding; ``--env blackjack-groups``: in GiGPO's seed-shared groups of 4, as
`textgym train` trains it) or, with ``--env babyai``, textgym/BabyAI-GoToRedBall-v0 with the
last two turns in each prompt (``history=2``) and 16 steps an episode (choice decoding over
six actions, long grid descriptions), or with ``--env cliffwalking`` textgym/CliffWalking-v1
as its learning cells in docs/results.md train it (GiGPO in groups of 4; training episodes start
anywhere and end after 20 moves; four moves to choose from, one 4 x 12 grid per prompt, states
that repeat within a batch). They differ only in the speed switches:

- before: float32, a separate scoring pass before every update (reuse_rollout_scores=False),
  transformers' sdpa attention (gqa_attention=False), the models' own norm and MLP forward
  (lean_activations=False), a row per turn where turns show the same prompt
  (share_repeated_prompts=False), and every micro-batch running the rows' shared system
  prompt itself, forward and backward;
- now:    dtype "auto" (bf16 where this machine runs it fast, see textgym_agents.model.precision),
  the rollout's choice log-probs and values reused, sdpa_gqa attention, a minibatch's shared
  prefix run once for all its micro-batches (PolicyScoring.sharing_prefix), a repeated
  prompt run once, and on a bf16 base the LoRA products in bf16 too (mixed_precision);
- lora32:  "now" with the LoRA products in fp32 (mixed_precision=False; the same as "now" where
  "auto" picks float32), to show what mixed precision adds;
- unshared: "now" with a row per turn where turns show the same prompt
  (share_repeated_prompts=False), to show what running a repeated prompt once adds.

The arms alternate update by update in one process (after one warm-up update each), so
machine load drifts affect both alike, and each update samples with the same seed in both
arms, so that (where their numerics agree) they play the same hands. Prints seconds per
phase, hands/s and the ratio.

    python benchmarks/train_speed.py [--updates 3] [--num-envs 16] [--env babyai]
    python benchmarks/train_speed.py --env cliffwalking --num-envs 8 --arms unshared,now

``--arms`` picks the arms (default: before, lora32, now); ratios are to the first one named.

Targets: Blackjack >= 2.5x hands/s where bf16 is fast, >= 1.2x on a machine without fast bf16;
BabyAI >= 3x turns/s.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
from typing import Any

import gymnasium as gym
import torch

import textgym  # noqa: F401
from textgym.cli_common import reply_choices
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.model.precision import cpu_signature
from textgym_agents.ppo.defaults import env_defaults

# name: (env id, its kwargs, the rate the target is on, target with / without bf16 or None,
# settings over the decoding defaults)
ENVS: dict[str, tuple[str, dict[str, Any], str, tuple[float, float] | None, dict[str, Any]]] = {
    "blackjack": ("textgym/Blackjack-v1", {}, "hands", (2.5, 1.2), {}),
    "blackjack-groups": (  # as `textgym train` trains it: seed-shared groups of 4
        "textgym/Blackjack-v1",
        {},
        "hands",
        None,
        {"advantage_estimator": "gigpo", "group_size": 4},
    ),
    "babyai": (
        "textgym/BabyAI-GoToRedBall-v0",
        {"max_steps": 16, "history": 2},
        "turns",
        (3, 3),
        {},
    ),
    "cliffwalking": (
        "textgym/CliffWalking-v1",
        {"exploring_starts": True, "training_max_steps": 20},
        "turns",
        None,
        {"advantage_estimator": "gigpo", "group_size": 4, "explore_eps": 0.3},
    ),
}
ARMS = {
    "before": (
        {
            "reuse_rollout_scores": False,
            "gqa_attention": False,
            "lean_activations": False,
            "share_repeated_prompts": False,
        },
        "float32",
    ),
    "lora32": ({"mixed_precision": False}, "auto"),
    "unshared": ({"share_repeated_prompts": False}, "auto"),
    "now": ({}, "auto"),
}
PHASES = ("time/rollout_s", "time/score_s", "time/update_s")


def make_trainer(env: str, overrides: dict, dtype: str, num_envs: int, before: bool) -> PPOTrainer:
    env_id, env_kwargs, _, _, settings = ENVS[env]
    probe = gym.make(env_id, **env_kwargs)
    defaults = env_defaults(reply_choices(probe), {})  # the decoding `textgym train` picks
    probe.close()
    config = PPOConfig(**{**defaults, **settings, **overrides, "progress": False})
    policy = PPOPolicy.from_pretrained(None, dtype=dtype, config=config)
    if before:  # every micro-batch runs the shared prefix itself
        policy.sharing_prefix = lambda prompts: contextlib.nullcontext()
    return PPOTrainer(policy, gym.make_vec(env_id, num_envs=num_envs, **env_kwargs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3, help="timed updates per arm")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--env", choices=sorted(ENVS), default="blackjack")
    parser.add_argument("--arms", default="before,lora32,now", help=f"of {', '.join(ARMS)}")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if len(arms) < 2 or not set(arms) <= set(ARMS):
        parser.error(f"--arms: two or more of {', '.join(ARMS)}")
    torch.manual_seed(0)
    trainers = {
        name: make_trainer(args.env, *ARMS[name], args.num_envs, name == "before") for name in arms
    }
    totals = {name: dict.fromkeys((*PHASES, "seconds", "hands", "turns"), 0.0) for name in arms}
    for update in range(args.updates + 1):
        for name, trainer in trainers.items():
            # The same sampling seed for every arm: their log-probs agree (fp32: to rounding),
            # so they play the same hands and the same turns, and only the speed differs.
            torch.manual_seed(update)
            episodes, turns = trainer.episodes, trainer.turns
            start = time.perf_counter()
            metrics = trainer.step()
            seconds = time.perf_counter() - start
            if update == 0:
                continue  # warm-up: first-call allocations, the precision measurement
            total = totals[name]
            total["seconds"] += seconds
            total["hands"] += trainer.episodes - episodes
            total["turns"] += trainer.turns - turns
            for key in PHASES:
                total[key] += metrics[key]
    print(f"machine: {cpu_signature()}")
    for name, trainer in trainers.items():
        precision = trainer.policy.base_info["precision"]
        print(f"{name}: {precision['dtype']} ({precision['reason']})")
    print(
        f"\n{ENVS[args.env][0]}: {args.updates} updates per arm after one warm-up, "
        f"{args.num_envs} envs"
    )
    header = f"{'arm':8} {'rollout s':>10} {'score s':>8} {'update s':>9} {'turns':>6} {'hands':>6}"
    print(f"{header} {'turns/s':>8} {'hands/s':>8}")
    rate, turn_rate = {}, {}
    for name, total in totals.items():
        rate[name] = total["hands"] / total["seconds"]
        turn_rate[name] = total["turns"] / total["seconds"]
        print(
            f"{name:8} {total['time/rollout_s']:10.1f} {total['time/score_s']:8.1f} "
            f"{total['time/update_s']:9.1f} {total['turns']:6.0f} {total['hands']:6.0f} "
            f"{turn_rate[name]:8.3f} {rate[name]:8.3f}"
        )
    print()
    base = arms[0]
    for name in arms[1:]:
        hands = f"{rate[name] / rate[base]:.2f}x" if rate[base] else "—"  # none finished
        turns = turn_rate[name] / turn_rate[base]
        print(f"{name} / {base}: {hands} hands/s, {turns:.2f}x turns/s")
    unit, targets = ENVS[args.env][2:4]
    if targets is not None and {"before", "now"} <= set(arms):
        rates = rate if unit == "hands" else turn_rate
        ratio = rates["now"] / rates["before"]
        fast_bf16 = trainers["now"].policy.base_info["precision"]["dtype"] == "bfloat16"
        target = targets[0] if fast_bf16 else targets[1]
        verdict = "met" if ratio >= target else "NOT met"
        print(f"now: {ratio:.2f}x {unit}/s (target >= {target}x: {verdict})")
    print(f"peak RSS of this process (all arms): {resource.getrusage(0).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
