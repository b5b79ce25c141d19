"""A long run stays flat: RSS, file descriptors, run-directory size and update time over time.

    python benchmarks/soak.py [--updates 2000] [--every 100] [--model M] [--out DIR]

Trains the tiny random model (``textgym_agents.testing.tiny_model``; ``--model`` for another)
on Blackjack (4 envs, 2 steps each, choice decoding, a checkpoint every 50 updates, 3 kept)
for ``--updates`` updates and, every ``--every`` updates, prints the process's RSS, its open
file descriptors, the Python objects alive after a collection, the size of the run directory
with and without ``metrics.jsonl`` (which grows by one line per update by design) and the mean
seconds per update of the interval, wall-clock and CPU (the process's own CPU time, which
another job on the same core barely changes). At the end it checks the bounds, comparing the last
interval with the warm-up row, the first at or after update 200 (by then the checkpoints have
reached their kept number):

- RSS grows by at most 64 MB;
- open file descriptors: at most 2 more;
- live Python objects: at most 1% more;
- the run directory without ``metrics.jsonl``: at most 10% more (pruned checkpoints);
- ``metrics.jsonl``: at most 4 KB per update;
- CPU seconds per update: at most 1.5 times the warm-up interval's (wall-clock seconds are
  printed, not bounded: they measure the machine's other load as much as the run).

Exit status 1 when a bound fails. Pin it to one core for steady times
(``taskset -c 0 env OMP_NUM_THREADS=1 ...``). Results: docs/reliability.md, "A long run".
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BOUNDS = {  # name: (kind, limit) of last row vs the warm-up row
    "rss_mb": ("add", 64.0),
    "fds": ("add", 2),
    "objects": ("ratio", 1.01),
    "run_dir_mb": ("ratio", 1.10),
    "cpu_s_per_update": ("ratio", 1.5),
}
METRICS_BYTES_PER_UPDATE = 4096
SAVE_EVERY, KEEP = 50, 3
WARMUP = SAVE_EVERY * (KEEP + 1)  # the update from which the run directory stops growing


def rss_mb() -> float:
    """The resident set size of this process in MB (``VmRSS``)."""
    from textgym_agents.model.memory import resident_kb

    return resident_kb() / 1024


def dir_mb(path: Path, skip: str | None = None) -> float:
    """Total size of the files under ``path`` in MB, leaving out files named ``skip``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != skip) / 2**20


def check(rows: list[dict[str, float]]) -> list[str]:
    """The bounds that the last row breaks against the warm-up row, as sentences."""
    first = next((row for row in rows if row["update"] >= WARMUP), rows[0])
    last = rows[-1]
    failures = []
    for name, (kind, limit) in BOUNDS.items():
        grew = last[name] - first[name] if kind == "add" else last[name] / max(first[name], 1e-9)
        if grew > limit:
            failures.append(f"{name}: {first[name]:.3g} -> {last[name]:.3g} (limit {kind} {limit})")
    updates = last["update"] - first["update"]
    per_update = (last["metrics_kb"] - first["metrics_kb"]) * 1024 / max(updates, 1)
    if per_update > METRICS_BYTES_PER_UPDATE:
        failures.append(f"metrics.jsonl: {per_update:.0f} bytes per update")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--model", help="model directory (default: the tiny random model)")
    parser.add_argument("--out", help="run directory (default: a temporary one)")
    args = parser.parse_args(argv)

    import gymnasium as gym
    import torch

    import textgym  # noqa: F401  (registers the text envs)
    from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
    from textgym_agents.testing import tiny_model

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    model = args.model
    if model is None:
        tiny, tokenizer = tiny_model()
        tiny.save_pretrained(work / "tiny")
        tokenizer.save_pretrained(work / "tiny")
        model = str(work / "tiny")
    out = Path(args.out) if args.out else work / "run"
    config = PPOConfig(
        decoding="choices",
        num_steps=2,
        minibatch_size=8,
        micro_batch_size=8,
        num_epochs=1,
        save_every=SAVE_EVERY,
        keep_checkpoints=KEEP,
        progress=False,
        seed=0,
    )
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(model, config=config)
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4)
    trainer = PPOTrainer(policy, envs, output_dir=out)
    rows: list[dict[str, float]] = []
    clock = [time.perf_counter(), time.process_time()]
    header = ["update", "rss_mb", "fds", "objects", "run_dir_mb", "metrics_kb", "s_per_update"]
    header.append("cpu_s_per_update")
    print(" ".join(f"{h:>16}" for h in header), flush=True)

    def measure(metrics: dict[str, Any]) -> bool | None:
        update = int(metrics["train/update"])
        if update % args.every == 0:
            now, cpu = time.perf_counter(), time.process_time()
            gc.collect()
            row = {
                "update": update,
                "rss_mb": rss_mb(),
                "fds": len(os.listdir("/proc/self/fd")),
                "objects": len(gc.get_objects()),
                "run_dir_mb": dir_mb(out, skip="metrics.jsonl"),
                "metrics_kb": (out / "metrics.jsonl").stat().st_size / 1024,
                "s_per_update": (now - clock[0]) / args.every,
                "cpu_s_per_update": (cpu - clock[1]) / args.every,
            }
            rows.append(row)
            print(" ".join(f"{row[h]:>16.4g}" for h in header), flush=True)
            clock[:] = [time.perf_counter(), time.process_time()]
        return False if update >= args.updates else None

    trainer.train(10**9, callback=measure)
    envs.close()
    failures = check(rows)
    print(f"\n{len(rows)} rows over {trainer.update_step} updates, {trainer.episodes} episodes")
    print("bounds (last row vs the warm-up row): " + ("all held" if not failures else "FAILED"))
    for failure in failures:
        print(f"  {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
