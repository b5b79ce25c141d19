"""The scoreboard of learning-suite cells: one row per cell, read from the files it left.

    python benchmarks/scoreboard.py runs/fl-curriculum runs/fl-kl --solved 1.0

Each argument is a ``learning_suite.py --out`` directory (finished or stopped cells alike).
Per env it prints a row per cell (its ``--settings``, estimator and seed): the episodes it
trained, the greedy score before and after (the last curve point, or the final score of a
finished cell), the first curve point at or above ``--solved``, the score of the moves training
samples along the curve (tabular envs), the curriculum level, the successes in its training
episodes, its turns and its seconds of training (rollouts and updates, summed over every start
of the run); then, per settings and estimator, the mean greedy score after training with its
standard error over seeds and how many seeds solved the env. Nothing is trained or evaluated:
the numbers are those the cells wrote. Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from textgym_agents.tracking.metrics_log import read_metrics

try:
    from curve_points import training_seconds
except ImportError:  # imported as benchmarks.scoreboard
    from benchmarks.curve_points import training_seconds


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cell_row(cell: Path, solved: float | None = None) -> dict[str, Any]:
    """What one cell directory (``<out>/<env>/<estimator>-seed<N>``) holds, summarised."""
    start = json.loads((cell / "start.json").read_text())
    curve = _json_lines(cell / "curve.jsonl")
    rows = read_metrics(cell / "run") if (cell / "run" / "metrics.jsonl").exists() else []
    estimator, seed = cell.name.rsplit("-seed", 1)
    successes, previous = 0, 0
    for row in rows:
        episodes = row.get("env/episodes", previous)
        successes += round((row.get("env/success_rate") or 0.0) * (episodes - previous))
        previous = episodes
    after, trained = start["return"], 0
    if curve:
        after, trained = curve[-1]["return"], curve[-1]["episodes"]
    result_file = cell / "result.json"
    if result_file.exists():
        result = json.loads(result_file.read_text())
        if result["episodes"] >= trained:
            after, trained = result["after"], result["episodes"]
    solved_at = None
    if solved is not None:
        solved_at = next((p["episodes"] for p in curve if p["return"] >= solved - 1e-9), None)
    level = None
    if (cell / "curriculum.json").exists():
        level = json.loads((cell / "curriculum.json").read_text()).get("level")
    return {
        "settings": start.get("key", {}).get("settings", "{}"),
        "estimator": estimator,
        "seed": int(seed),
        "episodes": rows[-1].get("env/episodes", trained) if rows else trained,
        "before": start["return"],
        "after": after,
        "solved_at": solved_at,
        "sampling": [(0, start.get("sampling_return"))]
        + [(p["episodes"], p.get("sampling_return")) for p in curve],
        "level": level,
        "successes": successes,
        "turns": rows[-1].get("env/turns") if rows else 0,
        "training_s": training_seconds(rows),
    }


def _cells(outs: list[Path]) -> dict[str, list[Path]]:
    envs: dict[str, list[Path]] = {}
    for out in outs:
        for start in sorted(out.glob("*/*-seed*/start.json")):
            envs.setdefault(start.parent.parent.name, []).append(start.parent)
    return envs


def _sampling(points: list[tuple[int, float | None]]) -> str:
    known = [(e, s) for e, s in points if s is not None]
    if not known:
        return "—"
    first, rest = known[0], known[1:]
    return f"{first[1]:.4f}" + ("".join(f", {e}: {s:.4f}" for e, s in rest) if rest else "")


def scoreboard(outs: list[Path], solved: float | None = None) -> str:
    """The markdown tables of every cell under the ``learning_suite.py --out`` directories."""
    lines: list[str] = []
    for env_name, cells in _cells(outs).items():
        rows = [cell_row(cell, solved) for cell in cells]
        lines += [
            f"\n{env_name}\n",
            "| settings | estimator | seed | episodes | greedy before → after | solved at | "
            "sampling (episodes: score) | level | successes in training | turns | training |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            level = "" if r["level"] is None else str(r["level"])
            solved_at = "" if r["solved_at"] is None else str(r["solved_at"])
            lines.append(
                f"| `{r['settings']}` | {r['estimator']} | {r['seed']} | {r['episodes']} | "
                f"{r['before']:.4f} → {r['after']:.4f} | {solved_at} | {_sampling(r['sampling'])} "
                f"| {level} | {r['successes']} | {r['turns']:,} | {r['training_s']:,.0f} s |"
            )
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["settings"], r["estimator"]), []).append(r)
        lines += ["", "| settings | estimator | seeds | greedy after (mean ± s.e.) | solved |"]
        lines.append("|---|---|---|---|---|")
        for (settings, estimator), group in groups.items():
            after = [r["after"] for r in group]
            mean = sum(after) / len(after)
            se = (
                math.sqrt(sum((a - mean) ** 2 for a in after) / (len(after) - 1) / len(after))
                if len(after) > 1
                else float("nan")
            )
            won = "—" if solved is None else f"{sum(r['solved_at'] is not None for r in group)}"
            lines.append(
                f"| `{settings}` | {estimator} | {len(group)} | {mean:.4f} ± {se:.4f} | "
                f"{won} of {len(group)} |"
            )
    return "\n".join(lines)


def main() -> None:
    """Parse the flags and print the scoreboard."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", nargs="+", type=Path, help="learning_suite.py --out directories")
    parser.add_argument(
        "--solved", type=float, default=None, help="the greedy score that counts as solved"
    )
    args = parser.parse_args()
    missing = [str(out) for out in args.outs if not out.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    print(scoreboard(args.outs, args.solved))


if __name__ == "__main__":
    main()
