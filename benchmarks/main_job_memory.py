"""Peak memory and speed of the main job's training loop, with each memory lever on and off.

Arms (``--arms``, in order; each runs in a fresh process, so no arm inherits another's heap or
oneDNN's kernel cache, which is configured once per process):

- ``onednn-1024``: oneDNN keeps its default 1,024 kernels (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``)
  and transformers' own RMSNorm and MLP modules (``lean_activations=False``).
- ``plain-modules``: the kernel cache bounded as ``import textgym_agents`` does
  (``textgym_agents.model.memory.KERNEL_CACHE_CAPACITY``), transformers' modules.
- ``now``: textgym's defaults (the bounded cache, ``lean_activations=True``).
- ``checkpointing``: ``now`` with gradient checkpointing (``gradient_checkpointing=True``: each
  decoder layer recomputed in the backward pass), the same gradients for more update time.

Each arm loads the model (``--model``, default the embedded one) with ``dtype="auto"``, then
runs ``--updates`` rollouts and updates of textgym/Calculator-v0 (8 envs, the settings of
``PPOConfig.for_env``, the same sampling seed per update in every arm; lean activations change
no result, nor does checkpointing, so the arms play the same turns up to the kernel cache,
which changes none either).
Prints the seconds of rollout and update, the resident memory after the last update, the peak
RSS of each arm (``ru_maxrss``) and each arm's ratios to the first. Pin it to one core for
comparable times: ``taskset -c 1 env OMP_NUM_THREADS=1 ...``. Results: docs/performance.md,
"Memory".

    python benchmarks/main_job_memory.py [--updates 4] [--rounds 1] [--arms now,plain-modules]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = "--one"
CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ARMS: dict[str, tuple[str | None, dict]] = {  # name: (kernel cache capacity, settings)
    "onednn-1024": ("1024", {"lean_activations": False}),
    "plain-modules": (None, {"lean_activations": False}),
    "now": (None, {}),
    "checkpointing": (None, {"gradient_checkpointing": True}),
}
MEASURES = ("rollout_s", "update_s", "rss_after_gb", "peak_gb")


def one_arm(updates: int, model: str | None, settings: dict) -> dict:
    """Load, then ``updates`` rollouts and updates; seconds, RSS after and peak RSS."""
    import resource

    import gymnasium as gym
    import torch

    import textgym  # noqa: F401  (registers the text envs)
    from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
    from textgym_agents.model.memory import resident_kb

    envs = gym.make_vec("textgym/Calculator-v0", num_envs=8)
    config = PPOConfig.for_env(envs, progress=False, seed=0, **settings)
    policy = PPOPolicy.from_pretrained(model, config=config)
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
        "capacity": os.environ[CACHE],
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
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    parser.add_argument("--model", default=None, help="a model directory (default: embedded)")
    parser.add_argument(CHILD, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_arm(args.updates, args.model, ARMS[args.one][1])))
        return
    arms = args.arms.split(",")
    unknown = [name for name in arms if name not in ARMS]
    if unknown or not arms:
        parser.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    base = {k: v for k, v in os.environ.items() if k != CACHE}
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name in arms:
            capacity = ARMS[name][0]
            env = base if capacity is None else {**base, CACHE: capacity}
            command = [sys.executable, __file__, CHILD, name, "--updates", str(args.updates)]
            command += ["--model", args.model] if args.model else []
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{name}: {results[name][-1]}", flush=True)
    print(f"\ntextgym/Calculator-v0, 8 envs, {args.updates} updates per run, {args.rounds} run(s)")
    columns = ("capacity", "turns", "rollout s", "update s", "RSS after", "peak", "vs first")
    print(f"{'arm':14} " + " ".join(f"{c:>9}" for c in columns))
    mean = {
        name: {k: sum(r[k] for r in runs) / len(runs) for k in MEASURES}
        for name, runs in results.items()
    }
    first = mean[arms[0]]
    for name, runs in results.items():
        m = mean[name]
        peak = m["peak_gb"] / first["peak_gb"]
        loop = (m["rollout_s"] + m["update_s"]) / (first["rollout_s"] + first["update_s"])
        print(
            f"{name:14} {runs[0]['capacity']:>9} {runs[0]['turns']:>9} {m['rollout_s']:9.1f} "
            f"{m['update_s']:9.1f} {m['rss_after_gb']:7.2f}GB {m['peak_gb']:7.2f}GB "
            f"  peak {peak:.2f}x, loop time {loop:.2f}x"
        )
    print(f"(dtype {results[arms[0]][0]['dtype']})")


if __name__ == "__main__":
    main()
