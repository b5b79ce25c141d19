"""Peak memory and time of one PPO epoch by micro-batch layout, each layout in its own process.

    python benchmarks/update_memory.py [--env textgym/Calculator-v0] [--num-envs 8]
        [--layouts 8:none,16:none,16:1024,16:512] [--model M]

Every layout (``micro_batch_size:micro_batch_tokens[:dtype]``, ``none`` for no token bound;
the dtype, e.g. ``float32`` or ``bfloat16``, defaults to ``PPOConfig.dtype``) runs in a
fresh process, so glibc's kept memory from one layout cannot hide another's peak: it loads the
model, collects one rollout with ``PPOConfig.for_env``'s settings (the same seed, so the same
rollout up to thread-level noise), scores it, then runs one epoch of gradients and reports
the epoch's seconds and the process's peak RSS (VmRSS sampled every 20 ms, and ``ru_maxrss``).
The table compares them with the first layout. Pin it to one core for comparable times
(``taskset -c 1 env OMP_NUM_THREADS=1 ...``). Results: docs/performance.md, "Memory".
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from typing import Any

CHILD = "--one"


def _rss_gb() -> float:
    from textgym_agents.model.memory import resident_kb

    return resident_kb() / 1e6


def one_layout(
    env_id: str, num_envs: int, micro: int, tokens: int | None, model: Any, dtype: str | None
) -> dict:
    """Rollout, scoring and one epoch of gradients under one layout; its time and peak RSS."""
    import gymnasium as gym
    import numpy as np

    import textgym  # noqa: F401  (registers the text envs)
    from textgym_agents import PPOConfig, PPOPolicy
    from textgym_agents.ppo.steps import minibatch_loss, minibatches
    from textgym_agents.ppo.trainer import PPOTrainer

    peak = [_rss_gb()]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], _rss_gb())
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    envs = gym.make_vec(env_id, num_envs=num_envs)
    config = PPOConfig.for_env(
        envs, progress=False, micro_batch_size=micro, micro_batch_tokens=tokens
    )
    policy = PPOPolicy.from_pretrained(model, config=config, dtype=dtype)
    loaded = _rss_gb()
    trainer = PPOTrainer(policy, envs, output_dir=None)
    buffer = trainer.collect()
    collected = _rss_gb()
    turns = buffer.turns()
    order = np.arange(len(turns))
    trainer.score(turns, order)
    trainer.compute_advantages(buffer)
    before = _rss_gb()
    layout = list(minibatches(order, turns, config.minibatch_size, micro, tokens))
    start = time.perf_counter()
    for minibatch in layout:
        scored = sum(turns[i].scored_tokens for micro_batch in minibatch for i in micro_batch)
        size = sum(len(micro_batch) for micro_batch in minibatch)
        minibatch_loss(policy, config, turns, minibatch, scored, size)
        policy.model.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    envs.close()
    return {
        "turns": len(turns),
        "passes": [len(m) for minibatch in layout for m in minibatch],
        "epoch_s": seconds,
        "dtype": str(next(policy.model.parameters()).dtype).removeprefix("torch."),
        "rss_loaded_gb": loaded,
        "rss_collected_gb": collected,
        "rss_before_gb": before,
        "peak_gb": max(peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="textgym/Calculator-v0")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--layouts", default="8:none,16:none,16:1024,16:512")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument(CHILD, metavar="LAYOUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        micro, tokens, *dtype = args.one.split(":")
        bound = None if tokens == "none" else int(tokens)
        result = one_layout(
            args.env, args.num_envs, int(micro), bound, args.model, dtype[0] if dtype else None
        )
        print(json.dumps(result))
        return
    rows = []
    for layout in args.layouts.split(","):
        command = [sys.executable, __file__, "--env", args.env, "--num-envs", str(args.num_envs)]
        command += [CHILD, layout] + (["--model", args.model] if args.model else [])
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append((layout, json.loads(done.stdout.strip().splitlines()[-1])))
        print(f"{layout}: {rows[-1][1]}", flush=True)
    first = rows[0][1]
    print(f"\n{args.env}, {args.num_envs} envs, one rollout, one epoch per layout")
    print("micro_batch_size:micro_batch_tokens  turns  passes                 epoch    peak RSS")
    for layout, r in rows:
        passes = ",".join(map(str, r["passes"]))
        ratio = f"({r['epoch_s'] / first['epoch_s']:.2f}x, {r['peak_gb'] / first['peak_gb']:.2f}x)"
        print(
            f"{layout:<36} {r['turns']:>5}  {passes:<22} {r['epoch_s']:6.1f} s "
            f"{r['peak_gb']:5.2f} GB  {ratio}"
        )


if __name__ == "__main__":
    main()
