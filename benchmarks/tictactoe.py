"""Does RL teach the embedded model tic-tac-toe? Win/draw/loss before and after, in one run.

Trains the embedded SmolLM2-135M-Instruct (LoRA, cold start, choice decoding over the legal
moves) on ``textgym/TicTacToe-v0`` against ``--train-opponent`` (default ``minimax:0.5``: perfect
play that makes a random move half the time, so the learner both wins and is punished for not
blocking; ``random`` and ``minimax`` also work), seats alternating, and scores
the greedy policy before and after on ``--eval-games`` held-out games against a random
opponent and against perfect play (``opponent="minimax"``: nobody beats it, the best result is
a draw). References come from the same seat env in the same run: random vs random, minimax vs
random, random vs minimax.

    python benchmarks/tictactoe.py --estimator gigpo --group-size 4 --seeds 0 \\
        --episodes 2000 --eval-games 500 --out runs/tictactoe

A learning curve (results against random and against minimax over ``--curve-games`` games
each, every ``--eval-every`` training games) and one PNG are written under ``--out``. Each
seed keeps its run directory: run the same command again after an interruption and it
resumes. Pin it to one core for comparable timings (``taskset -c 1 env OMP_NUM_THREADS=1 ...``).

Target: >= 80% non-losses against random, measurable draws against minimax, within
about 2 hours on 2 cores. Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import gymnasium as gym

import textgym  # noqa: F401  (registers the text envs)
from textgym.atomic import atomic_write_json
from textgym.envs.pettingzoo_seat import AECSeatEnv, Opponent, RandomOpponent, play_games
from textgym.envs.tictactoe_minimax import MinimaxOpponent
from textgym_agents import PPOPolicy, evaluate
from textgym_agents.exceptions import SIGTERMExit
from textgym_agents.ppo.trainer import PPOTrainer

try:
    from curve_points import CurvePoints, cell_config, train_cell
except ImportError:  # imported as benchmarks.tictactoe
    from benchmarks.curve_points import CurvePoints, cell_config, train_cell

ENV_ID = "textgym/TicTacToe-v0"
# Held-out: training resets use the config seed's own seeds (small ones, or 32-bit hashes for
# seed-shared groups, which meet this range with negligible probability).
EVAL_SEED = 1_000_000
OUTCOMES = ("win", "draw", "loss")
OPPONENTS = {"random": RandomOpponent, "minimax": MinimaxOpponent}


def tally(outcomes: list[str | None]) -> dict[str, float]:
    """Win/draw/loss rates of ``outcomes``, the non-loss rate and its standard error.

    A game without an outcome (cut short: too many invalid replies, the turn limit) is
    ``unfinished`` and is not a non-loss, so win + draw + loss + unfinished = 1.
    """
    counts = Counter(outcome if outcome in OUTCOMES else "unfinished" for outcome in outcomes)
    n = len(outcomes)
    rates = {k: counts[k] / n for k in (*OUTCOMES, "unfinished")}
    non_loss = rates["win"] + rates["draw"]
    se = math.sqrt(non_loss * (1 - non_loss) / n)
    return {**rates, "non_loss": non_loss, "non_loss_se": se, "games": n}


def reference(player: Opponent, opponent: str, games: int) -> dict[str, float]:
    """A scripted player's results on the seat env (seats alternating), no text involved."""
    import pettingzoo

    env = AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), OPPONENTS[opponent]())
    return tally(play_games(env, player, games, seed=EVAL_SEED))


def score(policy: PPOPolicy, opponent: str, games: int) -> dict[str, float]:
    """The greedy policy's results over ``games`` held-out games against ``opponent``."""
    env = gym.make(ENV_ID, opponent=opponent)
    try:
        result = evaluate(policy, env, games, seed=EVAL_SEED)
    finally:
        env.close()
    found = tally([episode.outcome for episode in result.episodes])
    found["invalid_rate"] = float(result.invalid_rate)
    return found


def untrained_scores(policy: PPOPolicy, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The untrained policy's held-out results, scored once for every seed with its settings.

    A fresh adapter adds nothing (LoRA's B starts at zero), so before training every seed's
    greedy policy is the base model's: its ``--eval-games`` games are played once and kept in
    ``--out`` under the settings other than the seed (1,000 games took ~11 min a cell).
    """
    settings = {k: v for k, v in policy.config.to_dict().items() if k != "seed"}
    dtype = str(next(policy.model.parameters()).dtype)
    key = json.dumps([args.model, args.eval_games, dtype, settings], sort_keys=True, default=str)
    kept_file = Path(args.out) / "untrained.json"
    kept = json.loads(kept_file.read_text()) if kept_file.exists() else {}
    if key in kept:
        print(f"  seed {seed}: the untrained policy's results read from {kept_file}", flush=True)
        return kept[key]
    scores = {name: score(policy, name, args.eval_games) for name in OPPONENTS}
    atomic_write_json(kept_file, {**kept, key: scores})  # cells may share --out
    return scores


def run_cell(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Train one seed (resuming if it has a checkpoint) and return its result."""
    cell = Path(args.out) / f"{args.estimator}-seed{seed}"
    result_file = cell / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    envs = gym.make_vec(
        ENV_ID,
        num_envs=args.num_envs,
        opponent=args.train_opponent,
        **({"exploring_starts": True} if args.exploring_starts else {}),
    )
    config = cell_config(envs, seed, args.estimator, args.group_size, args.settings)
    policy = PPOPolicy.from_pretrained(args.model, config=config)
    cell.mkdir(parents=True, exist_ok=True)
    start_file = cell / "start.json"
    if not start_file.exists():
        start_file.write_text(json.dumps(untrained_scores(policy, args, seed)))

    def report(done: int, found: dict[str, Any]) -> None:
        for name, value in found.items():
            print(f"  seed {seed}: {done} games, vs {name} {_fmt(value)}", flush=True)

    curve = CurvePoints(
        cell / "curve.jsonl",
        args.eval_every,
        lambda: {name: score(policy, name, args.curve_games) for name in OPPONENTS},
        report,
    )

    trainer = PPOTrainer(policy, envs, output_dir=cell / "run")
    metrics, seconds, episodes = train_cell(trainer, cell / "run", args.episodes, curve)
    envs.close()
    after = {name: score(policy, name, args.eval_games) for name in OPPONENTS}
    result = {
        "seed": seed,
        "estimator": args.estimator,
        "train_opponent": args.train_opponent,
        "exploring_starts": args.exploring_starts,
        "episodes": int(metrics["env/episodes"]),
        "before": json.loads(start_file.read_text()),
        "after": after,
        "train_seconds": seconds,
        "games_per_s": episodes / max(seconds, 1e-9),
        "settings": config.to_dict(),
    }
    result_file.write_text(json.dumps(result, indent=2))
    return result


def plot(out: Path, references: dict[str, dict[str, float]]) -> Path | None:
    """Non-losses against random (solid) and against minimax (dotted) per seed.

    The lines are the curve's points; dots with error bars are the ``--eval-games`` evaluations
    before and after training.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for k, curve_file in enumerate(sorted(out.glob("*-seed*/curve.jsonl"))):
        start = json.loads((curve_file.parent / "start.json").read_text())
        rows = [json.loads(line) for line in curve_file.read_text().splitlines()]
        x = [0] + [row["episodes"] for row in rows]
        result_file = curve_file.parent / "result.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        for name, style in (("random", "-"), ("minimax", ":")):
            y = [start[name]["non_loss"]] + [row[name]["non_loss"] for row in rows]
            label = f"{curve_file.parent.name} vs {name}"
            ax.plot(x, y, style, color=f"C{k}", label=label)
            ends = [(0, start[name])]  # the held-out evaluations: --eval-games each
            if result is not None:
                ends.append((result["episodes"], result["after"][name]))
            for at, found in ends:
                ax.errorbar(at, found["non_loss"], found["non_loss_se"], fmt="o", color=f"C{k}")
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    for name in ("random vs random", "minimax vs random"):
        value = references[name]["non_loss"]
        ax.axhline(value, linestyle="--", color="grey", linewidth=0.8)
        ax.annotate(name, (0, value), fontsize=7, color="grey")
    ax.set(xlabel="training games", ylabel="non-losses (greedy)", title="tic-tac-toe")
    ax.legend()
    path = out / "tictactoe.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _fmt(found: dict[str, float]) -> str:
    return (
        f"W {found['win']:.1%} D {found['draw']:.1%} L {found['loss']:.1%} "
        f"(non-losses {found['non_loss']:.1%} ± {found['non_loss_se']:.1%})"
    )


def main() -> None:
    """Parse the flags, compute the references, run (or read back) each seed, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator", default="gigpo")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--episodes", type=int, default=2000, help="training games per seed")
    parser.add_argument("--eval-games", type=int, default=500, help="held-out games per opponent")
    parser.add_argument("--eval-every", type=int, default=500, help="games between curve points")
    parser.add_argument("--curve-games", type=int, default=64, help="games per opponent per point")
    parser.add_argument("--train-opponent", default="minimax:0.5", help="random, minimax[:eps]")
    parser.add_argument(
        "--exploring-starts",
        action="store_true",
        help="start training games after a random opening (0 to 6 moves); evaluations and "
        "curve points play whole games",
    )
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--settings", default="{}", help="JSON of extra PPOConfig settings")
    parser.add_argument("--out", default="runs/tictactoe")
    args = parser.parse_args()
    out = Path(args.out)
    references = {
        "random vs random": reference(RandomOpponent(), "random", args.eval_games),
        "minimax vs random": reference(MinimaxOpponent(), "random", args.eval_games),
        "random vs minimax": reference(RandomOpponent(), "minimax", args.eval_games),
        "minimax:0.5 vs random": reference(MinimaxOpponent(0.5), "random", args.eval_games),
    }
    try:
        results = [run_cell(args, int(seed)) for seed in args.seeds.split(",")]
    except (KeyboardInterrupt, SIGTERMExit):  # the trainer saved a checkpoint
        print("Stopped; run the same command again to resume the unfinished seed.")
        raise SystemExit(130) from None
    print(f"\ntic-tac-toe, {args.eval_games} held-out games per row, seats alternating")
    print("| player | opponent | win | draw | loss | non-losses ± s.e. |")
    print("|---|---|---|---|---|---|")
    for name, found in references.items():
        player, opponent = name.split(" vs ")
        print(f"| {player} (reference) | {opponent} | {_row(found)} |")
    for result in results:
        for when in ("before", "after"):
            for opponent, found in result[when].items():
                label = f"model {when} ({result['estimator']}, seed {result['seed']})"
                print(f"| {label} | {opponent} | {_row(found)} |")
        print(
            f"| seed {result['seed']}: {result['episodes']} training games against "
            f"{result['train_opponent']}"
            f"{' (exploring starts)' if result.get('exploring_starts') else ''}, "
            f"{result['games_per_s']:.2f} games/s | | | | | |"
        )
    path = plot(out, references)
    if path is not None:
        print(f"Curve: {path}")


def _row(found: dict[str, float]) -> str:
    return (
        f"{found['win']:.1%} | {found['draw']:.1%} | {found['loss']:.1%} | "
        f"{found['non_loss']:.1%} ± {found['non_loss_se']:.1%}"
    )


if __name__ == "__main__":
    main()
