"""Learning from cold start: every advantage estimator on the same envs, episodes and seeds.

Each cell (env, estimator, seed) trains the embedded SmolLM2-135M-Instruct (LoRA, no
demonstrations) with ``textgym train``'s per-env defaults and only the estimator changed, and
scores the greedy policy before, during (``--eval-every`` episodes: the learning curve) and
after training: exactly on Blackjack (``blackjack_exact``: the greedy policy is a table over
280 states), else on ``--eval-episodes`` held-out episodes (seeds no training episode uses;
``--curve-episodes`` for the points in between), with the standard error. It prints, per env,
random and optimal references and each estimator's mean over seeds, and writes one PNG per
env with every estimator's curve.

    python benchmarks/learning_suite.py --envs blackjack --estimators gae,gigpo --seeds 0,1 \\
        --episodes 2000 --out runs/suite

Every cell keeps its run directory (a checkpoint after every update) and its curve under
``--out``: run the same command again after an interruption and finished cells are read back,
an unfinished one resumes from its last checkpoint. Pin it to one core for comparable timings
(``taskset -c 1 env OMP_NUM_THREADS=1 ...``). Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import textgym  # noqa: F401  (registers the text envs)
from textgym.checker import find_text_wrapper
from textgym.curriculum import CurriculumProgress
from textgym.envs import blackjack_exact
from textgym.episodes import reply_choices
from textgym_agents import PPOPolicy, evaluate
from textgym_agents.exceptions import SIGTERMExit
from textgym_agents.ppo.trainer import PPOTrainer

try:
    import tabular_exact
    from babyai_random import bot_baseline
    from blackjack_learning import greedy_table
    from curve_points import CurvePoints, cell_config, train_cell
except ImportError:  # imported as benchmarks.learning_suite
    from benchmarks import tabular_exact
    from benchmarks.babyai_random import bot_baseline
    from benchmarks.blackjack_learning import greedy_table
    from benchmarks.curve_points import CurvePoints, cell_config, train_cell

LAST_TABLE: list[str] = []  # the greedy reply's first letter in each state of the last exact score
# Held-out: training resets use the config seed's own seeds (small ones, or 32-bit hashes for
# seed-shared groups, which meet this range with negligible probability).
EVAL_SEED = 1_000_000
ENVS: dict[str, dict[str, Any]] = {
    "blackjack": {"id": "textgym/Blackjack-v1", "kwargs": {}, "optimal": -0.0431},
    # Tabular envs ("optimal": "tabular"): scored exactly by tabular_exact (the greedy table's
    # expected return under the time limit), the optimum by value iteration in the same run.
    "frozenlake": {
        "id": "textgym/FrozenLake-v1",
        "kwargs": {"is_slippery": False},
        "optimal": "tabular",
    },
    # The same lake, its observations also saying where the goal is and where each move leads.
    "frozenlake-surroundings": {
        "id": "textgym/FrozenLake-v1",
        "kwargs": {
            "is_slippery": False,
            "formatter": "textgym.envs.classic:FrozenLakeSurroundingsFormatter",
        },
        "optimal": "tabular",
    },
    "frozenlake-slippery": {
        "id": "textgym/FrozenLake-v1",
        "kwargs": {"is_slippery": True},
        "optimal": "tabular",  # 0.7402 at the 100-step limit (Gymnasium's docs: ~0.74)
    },
    "cliffwalking": {"id": "textgym/CliffWalking-v1", "kwargs": {}, "optimal": "tabular"},
    "calculator": {"id": "textgym/Calculator-v0", "kwargs": {}, "optimal": None},
    # BabyAI-Text (GLAM's benchmark): success is facing the red ball. Training and scoring
    # episodes stop after 16 steps, not the level's 64 (the bot needs 5.2 on average; a
    # cold-start policy's failures would otherwise cost 64 model turns each, and a 200-episode
    # evaluation at 64 steps did not finish in 66 min on one core). "optimal" is minigrid's
    # BabyAI bot in the same run and at the same cap, on held-out seeds EVAL_SEED + k (the
    # policy's evaluation seeds its 16 envs EVAL_SEED + i once each: the same range, not the
    # same episodes beyond the first 16).
    "babyai-gotoredball": {
        "id": "textgym/BabyAI-GoToRedBall-v0",
        "kwargs": {"max_steps": 16},
        "optimal": "bot",
    },
}


def score(policy: Any, env_name: str, episodes: int) -> dict[str, float]:
    """Greedy return and its standard error: exact on Blackjack and the tabular envs, else over
    held-out episodes.

    Envs that report ``is_success`` also give ``success`` (the rate) and ``success_se``;
    FrozenLake's success probability is its expected return (1 at the goal, else 0). The
    tabular envs also give ``sampling_return``: the exact return of the moves training samples.
    """
    spec = ENVS[env_name]
    env = gym.make(spec["id"], **spec["kwargs"])
    try:
        if env_name == "blackjack" and policy is not None:
            table = greedy_table(policy, env)
            LAST_TABLE[:] = [table[state][0].upper() for state in blackjack_exact.states()]
            return {
                "return": blackjack_exact.expected_return(lambda *state: table[state]),
                "se": 0.0,
            }
        if spec["optimal"] == "tabular" and policy is not None:
            table, sampling = tabular_exact.policy_tables(policy, env)
            replies = find_text_wrapper(env).reply_choices()  # in action order
            LAST_TABLE[:] = [_action_name(replies[a])[0].upper() for a in table.argmax(1)]
            horizon = env.spec.max_episode_steps
            value = tabular_exact.expected_return(env, table, horizon)
            # What training samples: a sharper signal than the greedy table, which can sit on
            # 0 while the moves it samples get better.
            found = {
                "return": value,
                "se": 0.0,
                "sampling_return": tabular_exact.expected_return(env, sampling, horizon),
            }
            if env_name.startswith("frozenlake"):
                found.update(success=value, success_se=0.0)
            return found
        result = evaluate(policy, env, episodes, seed=EVAL_SEED)
        found = {
            "return": float(result["mean_return"]),
            "se": float(result["std_return"]) / math.sqrt(episodes),
        }
        if result.get("mean_length") is not None:
            found["length"] = float(result["mean_length"])
        if result.get("success_rate") is not None:
            rate = float(result["success_rate"])
            found.update(success=rate, success_se=math.sqrt(rate * (1 - rate) / episodes))
        return found
    finally:
        env.close()


def random_reference(env_name: str, episodes: int) -> dict[str, float] | None:
    """A uniformly random valid reply each turn (exact on Blackjack); None without choices."""
    if env_name == "blackjack":
        return {"return": blackjack_exact.expected_return(lambda *state: 0.5), "se": 0.0}
    spec = ENVS[env_name]
    if spec["optimal"] == "tabular":
        env = gym.make(spec["id"], **spec["kwargs"])
        uniform = tabular_exact.uniform(env)
        return {
            "return": tabular_exact.expected_return(env, uniform, env.spec.max_episode_steps),
            "se": 0.0,
        }
    env = gym.make(spec["id"], **spec["kwargs"])
    replies = reply_choices(env)  # a single env's list of valid replies
    env.close()
    if not replies:
        return None
    rng = np.random.default_rng(0)

    def pick(messages: Any) -> str:
        return replies[int(rng.integers(len(replies)))]

    return score(pick, env_name, episodes)


def run_cell(args: argparse.Namespace, env_name: str, estimator: str, seed: int) -> dict[str, Any]:
    """Train one cell (resuming if it has a checkpoint) and return its result."""
    cell = Path(args.out) / env_name / f"{estimator}-seed{seed}"
    result_file = cell / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    spec = ENVS[env_name]
    cell.mkdir(parents=True, exist_ok=True)
    # Training envs only: the scores start episodes where the env does.
    progress, progress_file = None, cell / "curriculum.json"
    train_kwargs = dict(spec["kwargs"])
    if args.curriculum:
        progress = CurriculumProgress(
            window=args.curriculum_window,
            demote_below=args.curriculum_demote,
            level=args.curriculum_level,
        )
        if progress_file.exists():  # resumed: the level reached (saved after every update)
            progress.load(progress_file)
        train_kwargs["reverse_curriculum"] = progress
    elif args.exploring_starts:
        train_kwargs["exploring_starts"] = True
    if args.training_max_steps is not None:
        train_kwargs["training_max_steps"] = args.training_max_steps
    envs = gym.make_vec(spec["id"], num_envs=args.num_envs, **train_kwargs)
    config = cell_config(envs, seed, estimator, args.group_size, args.settings)
    policy = PPOPolicy.from_pretrained(args.model, config=config)
    curve_file = cell / "curve.jsonl"
    start_file = cell / "start.json"
    if not start_file.exists():
        start_file.write_text(json.dumps(untrained_score(args, env_name, policy)))
    before_data = json.loads(start_file.read_text())
    trainer = PPOTrainer(policy, envs, output_dir=cell / "run")

    def measure() -> dict[str, Any]:
        found = score(policy, env_name, args.curve_episodes or args.eval_episodes)
        if env_name == "blackjack":  # which of the 280 states it hits in, in states() order
            found["hits"] = "".join(LAST_TABLE)
        elif ENVS[env_name]["optimal"] == "tabular":  # the greedy move's initial, state by state
            found["table"] = "".join(LAST_TABLE)
        if progress is not None:
            found["curriculum_level"] = progress.level
        return found

    def report(done: int, found: dict[str, Any]) -> None:
        success = f", success {found['success']:.1%}" if "success" in found else ""
        if "sampling_return" in found:
            success += f", sampling {found['sampling_return']:.4f}"
        if "curriculum_level" in found:
            success += f", curriculum level {found['curriculum_level']}"
        print(
            f"  {env_name} {estimator} seed {seed}: {done} episodes, "
            f"greedy {found['return']:.4f}{success}"
        )

    curve = CurvePoints(curve_file, args.eval_every, measure, report)

    def after_update(metrics: dict[str, float]) -> bool:
        if progress is not None:
            progress.save(progress_file)
        curve(metrics)
        return not solved(curve.point, args.stop_at)  # False stops the training

    metrics, seconds, episodes = train_cell(trainer, cell / "run", args.episodes, after_update)
    envs.close()
    after = final_point(curve_file, episodes, args) or score(policy, env_name, args.eval_episodes)
    result = {
        "env": env_name,
        "estimator": estimator,
        "seed": seed,
        "episodes": int(metrics["env/episodes"]),
        "before": before_data["return"],
        "before_se": before_data["se"],
        "after": after["return"],
        "after_se": after["se"],
        "train_seconds": seconds,
        "hands_per_s": episodes / max(seconds, 1e-9),
        "settings": config.to_dict(),
    }
    if progress is not None:
        result["starts"] = {
            "curriculum": {
                "window": progress.window,
                "demote_below": progress.demote_below,
                "first_level": args.curriculum_level,
                "level": progress.level,
            }
        }
    elif args.exploring_starts:
        result["starts"] = "exploring"
    if args.training_max_steps is not None:
        result["training_max_steps"] = args.training_max_steps
    for key in ("success", "success_se", "sampling_return"):
        if key in before_data:
            result[f"before_{key}"] = before_data[key]
        if key in after:
            result[f"after_{key}"] = after[key]
    result_file.write_text(json.dumps(result, indent=2))
    return result


def solved(point: dict[str, Any] | None, stop_at: float | None) -> bool:
    """Whether a curve point's greedy return reached ``--stop-at`` (never without one).

    Example:
        >>> solved({"episodes": 96, "return": 1.0}, 1.0), solved({"return": 0.5}, 1.0)
        (True, False)
        >>> solved({"return": 1.0}, None), solved(None, 1.0)
        (False, False)
    """
    return stop_at is not None and point is not None and point["return"] >= stop_at


def untrained_score(args: argparse.Namespace, env_name: str, policy: Any) -> dict[str, Any]:
    """The greedy score before training, computed once per env and shared by its cells.

    LoRA starts with its B matrices at zero, so before training every cell's policy is the base
    model, whatever its estimator or seed: a sibling cell's ``start.json`` made with the same
    model, ``--settings`` and ``--eval-episodes`` is that score (``reused_from`` says whose).
    """
    key = {"model": args.model, "settings": args.settings, "eval_episodes": args.eval_episodes}
    for sibling in sorted((Path(args.out) / env_name).glob("*/start.json")):
        found = json.loads(sibling.read_text())
        if found.get("key") == key:
            return {**found, "reused_from": sibling.parent.name}
    return {**score(policy, env_name, args.eval_episodes), "key": key}


def final_point(curve_file: Path, episodes: int, args: argparse.Namespace) -> dict | None:
    """The curve's last point when it scored the finished policy as the final score would.

    A point taken at the run's last update with ``--curve-episodes`` equal to
    ``--eval-episodes`` (or unset) is the after-training score: reused, not measured twice.
    """
    if args.curve_episodes not in (None, args.eval_episodes) or not curve_file.exists():
        return None
    lines = curve_file.read_text().splitlines()
    last = json.loads(lines[-1]) if lines else None
    return last if last is not None and last["episodes"] == episodes else None


def curves(out: Path, env_name: str) -> dict[str, list[list[tuple[int, float]]]]:
    """Each estimator's curves (one per seed) of greedy return against training episodes: the
    untrained score, the curve points and the final score."""
    found: dict[str, list[list[tuple[int, float]]]] = {}
    for curve_file in sorted((out / env_name).glob("*/curve.jsonl")):
        estimator = curve_file.parent.name.rsplit("-seed", 1)[0]
        start = json.loads((curve_file.parent / "start.json").read_text())["return"]
        points = [(0, start)] + [
            (row["episodes"], row["return"])
            for row in map(json.loads, curve_file.read_text().splitlines())
        ]
        result_file = curve_file.parent / "result.json"
        if result_file.exists():  # the final score, where it is past the last curve point
            result = json.loads(result_file.read_text())
            if result["episodes"] > points[-1][0]:
                points.append((result["episodes"], result["after"]))
        found.setdefault(estimator, []).append(points)
    return found


def plot(out: Path, env_name: str, reference: dict[str, float | None]) -> Path | None:
    """One PNG: every estimator's greedy-return curves (thin: seeds), the references dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = curves(out, env_name)
    if not found:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (estimator, runs) in enumerate(sorted(found.items())):
        for j, points in enumerate(runs):
            x, y = zip(*points, strict=True)
            ax.plot(x, y, color=f"C{k}", alpha=0.8, label=estimator if j == 0 else None)
    for name, value in reference.items():
        if value is not None:
            ax.axhline(value, linestyle="--", color="grey", linewidth=0.8)
            ax.annotate(name, (0, value), fontsize=7, color="grey")
    ax.set(xlabel="training episodes", ylabel="greedy return", title=env_name)
    ax.legend()
    path = out / f"{env_name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def main() -> None:
    """Parse the flags, run (or read back) every cell, print the tables, write the plots."""
    try:
        _main()
    except (KeyboardInterrupt, SIGTERMExit):  # the cell's trainer saved a checkpoint
        print("Stopped; run the same command again to resume the unfinished cell.")
        raise SystemExit(130) from None


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="blackjack", help=f"comma-separated, of {list(ENVS)}")
    parser.add_argument("--estimators", default="gae,grpo,rloo,gigpo,reinforce")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--episodes", type=int, default=2000, help="training episodes per cell")
    parser.add_argument("--eval-every", type=int, default=500, help="episodes between evals")
    parser.add_argument("--eval-episodes", type=int, default=200, help="held-out episodes")
    parser.add_argument(
        "--curve-episodes", type=int, default=None, help="per curve point (default: as --eval)"
    )
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--settings", default="{}", help="JSON of extra PPOConfig settings")
    parser.add_argument(
        "--curriculum",
        action="store_true",
        help="tabular envs: start training episodes near the goal (textgym.curriculum)",
    )
    parser.add_argument(
        "--stop-at",
        type=float,
        default=None,
        help="end a cell once a curve point's greedy return reaches this (e.g. 1.0: solved)",
    )
    parser.add_argument(
        "--exploring-starts",
        action="store_true",
        help="tabular envs: start every training episode at a random state that can reach the "
        "goal (textgym.curriculum.ExploringStarts)",
    )
    parser.add_argument(
        "--curriculum-window", type=int, default=16, help="episodes per promotion decision"
    )
    parser.add_argument(
        "--curriculum-demote",
        type=float,
        default=0.0,
        help="success rate under which the curriculum moves the start forward again (0: never)",
    )
    parser.add_argument(
        "--curriculum-level",
        type=int,
        default=1,
        help="the curriculum's first level: the farthest start, in moves from the goal",
    )
    parser.add_argument(
        "--training-max-steps",
        type=int,
        default=None,
        help="tabular worlds: end training episodes after this many moves (scores keep the "
        "env's own limit)",
    )
    parser.add_argument("--out", default="runs/learning-suite")
    args = parser.parse_args()
    if args.curriculum and args.exploring_starts:
        parser.error("choose one of --curriculum and --exploring-starts")
    out = Path(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    for env_name in args.envs.split(","):
        results = [
            run_cell(args, env_name, estimator, seed)
            for estimator in args.estimators.split(",")
            for seed in seeds
        ]
        random_ref = random_reference(env_name, args.eval_episodes)
        reference = {"random": random_ref["return"] if random_ref else None}
        spec = ENVS[env_name]
        optimal = spec["optimal"]
        if optimal == "bot":
            bot = bot_baseline(spec["id"], args.eval_episodes, EVAL_SEED, **spec["kwargs"])
            reference["optimal"] = bot["return"]
            optimal = (
                f"(BabyAI bot) {bot['return']:.4f}, success {bot['success']:.1%} "
                f"(se {bot['se']:.1%}), {bot['length']:.1f} steps"
            )
        elif optimal == "tabular":
            env = gym.make(spec["id"], **spec["kwargs"])
            horizon = env.spec.max_episode_steps
            optimal = tabular_exact.expected_return(
                env, tabular_exact.optimal(env, horizon), horizon
            )
            reference["optimal"] = optimal
            optimal = f"{optimal:.4f} (value iteration, exact)"
        else:
            reference["optimal"] = optimal
        print(f"\n{env_name}: random {_fmt(random_ref)}, optimal {optimal}")
        print("| estimator | seeds | greedy before | greedy after (mean ± spread) | hands/s |")
        print("|---|---|---|---|---|")
        by_estimator: dict[str, list[dict[str, Any]]] = {}
        for result in results:
            by_estimator.setdefault(result["estimator"], []).append(result)
        for estimator, rows in by_estimator.items():
            after = np.array([r["after"] for r in rows])
            before = np.mean([r["before"] for r in rows])
            spread = after.std(ddof=1) if len(after) > 1 else float("nan")
            speed = np.mean([r["hands_per_s"] or 0.0 for r in rows])
            print(
                f"| {estimator} | {len(rows)} | {before:.4f} | {after.mean():.4f} ± "
                f"{spread:.4f} ({', '.join(f'{a:.4f}' for a in after)}) | {speed:.2f} |"
            )
            for r in rows:
                if "after_success" in r:
                    print(
                        f"|   seed {r['seed']} success | | {r['before_success']:.1%} ± "
                        f"{r['before_success_se']:.1%} | {r['after_success']:.1%} ± "
                        f"{r['after_success_se']:.1%} | |"
                    )
                if "after_sampling_return" in r:  # the moves training samples, exactly
                    print(
                        f"|   seed {r['seed']} sampling | | {r['before_sampling_return']:.4f} | "
                        f"{r['after_sampling_return']:.4f} | |"
                    )
        path = plot(out, env_name, reference)
        if path is not None:
            print(f"Curves: {path}")


def _action_name(reply: str) -> str:
    """The move a choice reply names: ``{"action": "left"}`` -> ``left``."""
    return str(json.loads(reply).get("action", reply)) if reply.startswith("{") else reply


def _fmt(value: dict[str, float] | None) -> str:
    if value is None:
        return "n/a"
    success = f", success {value['success']:.1%}" if "success" in value else ""
    return f"{value['return']:.4f} (se {value['se']:.4f}){success}"


if __name__ == "__main__":
    main()
