"""Peak memory and speed of the main job's training loop with oneDNN's kernel cache bounded or not.

bf16 matrix products on CPU run through oneDNN, which keeps up to 1,024 kernels it built
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``); textgym_agents bounds it to
``textgym_agents.model.memory.KERNEL_CACHE_CAPACITY`` (64) unless the variable is set. Each arm
runs in a fresh process (the variable is read once per process): load the embedded model with
``dtype="auto"``, then ``--updates`` rollouts and updates of textgym/Calculator-v0 (8 envs, the
settings of ``PPOConfig.for_env``, the same sampling seed per update in every arm). Prints the
seconds of rollout and update, the resident memory after the last update, the peak RSS and the
ratios. Where "auto" picks float32 (no fast bf16) oneDNN builds few kernels and the arms should
agree.

    python benchmarks/kernel_cache_memory.py [--updates 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = "--one"
ARMS = {"oneDNN default (1024)": "1024", "bounded (textgym default)": None}
MEASURES = ("rollout_s", "update_s", "rss_after_gb", "peak_gb")


def one_arm(updates: int) -> dict:
    """Load, then ``updates`` rollouts and updates; seconds, RSS after and peak RSS."""
    import resource

    import gymnasium as gym
    import torch

    import textgym  # noqa: F401  (registers the text envs)
    from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
    from textgym_agents.model.memory import resident_kb

    envs = gym.make_vec("textgym/Calculator-v0", num_envs=8)
    config = PPOConfig.for_env(envs, progress=False, seed=0)
    policy = PPOPolicy.from_pretrained(None, config=config)
    trainer = PPOTrainer(policy, envs, output_dir=None)
    rollout_s = update_s = 0.0
    for update in range(updates):
        torch.manual_seed(update)
        start = time.perf_counter()
        buffer = trainer.collect()
        rollout_s += time.perf_counter() - start
        start = time.perf_counter()
        trainer.update(buffer, trainer.collector.drain())
        update_s += time.perf_counter() - start
    envs.close()
    return {
        "dtype": policy.base_info["precision"]["dtype"],
        "capacity": os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"],
        "turns": trainer.turns,
        "rollout_s": rollout_s,
        "update_s": update_s,
        "rss_after_gb": resident_kb() / 1e6,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every arm, alternating")
    parser.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_arm(args.updates)))
        return
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    results: dict[str, list[dict]] = {name: [] for name in ARMS}
    for _ in range(args.rounds):
        for name, capacity in ARMS.items():
            env = (
                base if capacity is None else {**base, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": capacity}
            )
            command = [sys.executable, __file__, CHILD, "--updates", str(args.updates)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{name}: {results[name][-1]}", flush=True)
    print(f"\ntextgym/Calculator-v0, 8 envs, {args.updates} updates per run, {args.rounds} run(s)")
    columns = ("capacity", "rollout s", "update s", "RSS after", "peak")
    print(f"{'arm':27} " + " ".join(f"{c:>9}" for c in columns))
    mean = {}
    for name, runs in results.items():
        mean[name] = {k: sum(r[k] for r in runs) / len(runs) for k in MEASURES}
        m = mean[name]
        print(
            f"{name:27} {runs[0]['capacity']:>9} {m['rollout_s']:9.1f} {m['update_s']:9.1f} "
            f"{m['rss_after_gb']:8.2f}GB {m['peak_gb']:7.2f}GB"
        )
    before, now = (mean[name] for name in ARMS)
    print(
        f"\nbounded / default: peak {now['peak_gb'] / before['peak_gb']:.2f}x, loop time "
        f"{(now['rollout_s'] + now['update_s']) / (before['rollout_s'] + before['update_s']):.2f}x "
        f"(dtype {results[next(iter(ARMS))][0]['dtype']})"
    )


if __name__ == "__main__":
    main()
