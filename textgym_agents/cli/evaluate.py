"""``textgym eval`` and ``textgym plot``, and loading a policy from a run, a policy or a model.

Commands of the ``textgym.commands`` entry-point group; torch is imported when they run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym

from textgym.cli_common import (
    DEFAULT_ENV,
    CLIError,
    UsageError,
    add_env_arg,
    add_trust_arg,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    recorded_env,
)
from textgym.env_records import make_recorded_env
from textgym.plugins import FunctionCommand
from textgym.trust import UntrustedCodeError
from textgym_agents.cli.common import from_pretrained, import_agents
from textgym_agents.cli.runs import read_run_info, read_trained_env, resolve_policy
from textgym_agents.ppo.defaults import DEFAULT_NUM_ENVS, env_defaults, reply_hints

__all__ = [
    "EVAL_SEED",
    "check_policy_files",
    "eval_command",
    "evaluate_policy",
    "format_gap",
    "format_table",
    "load_policy",
    "plot_command",
    "run_eval",
    "run_plot",
    "standard_error",
]

EVAL_SEED = 10_000  # evaluation episodes differ from the training ones (seeded from 0)

EVAL_EPILOG = """\
examples:
  textgym eval runs/bj                         # the run's final policy on the run's env
  textgym eval runs/bj embedded --episodes 200 # trained vs base model, same episodes
  textgym eval path/to/model --env textgym/FrozenLake-v1 --decoding free
"""
PLOT_EPILOG = """\
examples:
  textgym plot runs/bj                         # rewrites runs/bj/learning_curve.png
  textgym plot runs/a runs/b --output ab.png --smooth 5 --x step
"""


def configure_eval(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``textgym eval``."""
    parser.description = "Greedy evaluation: mean return, its std, success rate, invalid replies."
    parser.epilog = EVAL_EPILOG
    parser.add_argument(
        "targets",
        nargs="+",
        metavar="RUN_DIR|MODEL",
        help="a run directory, a saved policy, a model path or 'embedded'",
    )
    parser.add_argument(
        "--env", metavar="ENV_ID", help=f"text env (default: the run's, else {DEFAULT_ENV})"
    )
    parser.add_argument(
        "--episodes", type=positive_int, default=100, help="episodes (default: 100)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=EVAL_SEED,
        help=f"seed of the first episode (default: {EVAL_SEED})",
    )
    parser.add_argument(
        "--num-envs",
        type=positive_int,
        default=DEFAULT_NUM_ENVS,
        help=f"episodes played in parallel (default: {DEFAULT_NUM_ENVS})",
    )
    parser.add_argument(
        "--sample", action="store_true", help="sample replies instead of greedy decoding"
    )
    parser.add_argument(
        "--decoding",
        choices=["free", "choices", "constrained", "auto"],
        help="override the policy's decoding",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_env_arg(parser)
    add_trust_arg(parser)


def configure_plot(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``textgym plot``."""
    parser.description = "Draw the learning curves of one or several runs into one PNG."
    parser.epilog = PLOT_EPILOG
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories (with metrics.jsonl)"
    )
    parser.add_argument(
        "--output",
        metavar="PNG",
        help="default: RUN_DIR/learning_curve.png for one run, else learning_curves.png",
    )
    parser.add_argument(
        "--keys",
        nargs="+",
        help="metrics to draw, one panel each (default: those of env/return_mean, "
        "env/success_rate and env/invalid_rate the runs logged)",
    )
    parser.add_argument(
        "--x",
        help="x axis: step or a logged metric (default: env/episodes where every run logged it, "
        "with the greedy evaluations of textgym train; else step)",
    )
    parser.add_argument(
        "--smooth", type=positive_int, default=1, help="moving-average window (default: 1)"
    )
    parser.add_argument("--labels", nargs="+", help="legend names, one per run")


# --- policies: a run, a saved policy or a model ------------------------------------------------


def load_policy(
    target: str,
    env: gym.Env[Any, Any] | None,
    decoding: str | None = None,
    trust_code: bool = False,
) -> tuple[Any, str]:
    """Load what ``target`` names (see :func:`resolve_policy`) as a policy for ``env``.

    A fresh model gets the decoding :func:`~textgym_agents.ppo.defaults.env_defaults` picks
    for the env's valid replies or reply schema; ``decoding`` overrides the decoding of any
    policy. A saved policy whose recorded env names unknown code is refused unless
    ``trust_code`` (:mod:`textgym.trust`).
    """
    kind, where, label = resolve_policy(target)
    agents = import_agents()
    choices, schema = reply_hints(env) if env is not None else (None, None)
    overrides = env_defaults(choices, {"decoding": decoding} if decoding else {}, schema=schema)
    keys = ("decoding", "reply_prefix", "stop_strings", "max_new_tokens")
    overrides = {k: v for k, v in overrides.items() if k in keys}
    if decoding:
        overrides["decoding"] = decoding
    if kind == "model":
        config = agents.PPOConfig(progress=False, **overrides)
        return from_pretrained(agents, where, config), label
    try:
        policy = agents.PPOPolicy.load(where, trust_code=trust_code)
    except UntrustedCodeError as e:
        raise CLIError(str(e)) from None
    except (OSError, ValueError, agents.CheckpointError) as e:
        raise CLIError(f"could not load the policy in {where}: {one_line(e)}") from e
    if decoding:
        values = {**policy.config.to_dict(), **overrides}
        policy.config = agents.PPOConfig.from_dict(values)
    return policy, label


# --- eval ----------------------------------------------------------------------------------------


def evaluate_policy(
    agents: Any, policy: Any, env: Any, episodes: int, **kwargs: Any
) -> Mapping[str, Any]:
    """``evaluate`` on the evaluation seed, playing at most ``episodes`` envs at once."""
    kwargs.setdefault("seed", EVAL_SEED)
    kwargs["num_envs"] = min(kwargs.get("num_envs", DEFAULT_NUM_ENVS), episodes)
    return agents.evaluate(policy, env, n_episodes=episodes, **kwargs)


def evaluation_point(name: str, episodes: int, result: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation as a point of the run's curve (``evaluations.json``).

    Example:
        >>> point = evaluation_point("trained", 16, {"mean_return": 0.5, "std_return": 0.5,
        ...                                          "episodes": 25, "invalid_rate": 0.0})
        >>> point["se"], point["episodes"]
        (0.1, 16)
    """
    point = {
        "name": name,
        "episodes": episodes,
        "mean_return": float(result["mean_return"]),
        "se": standard_error(result),
        "invalid_rate": float(result["invalid_rate"]),
        "evaluation_episodes": int(result["episodes"]),
    }
    rate = result.get("success_rate")
    if rate is not None:
        n = max(int(result["episodes"]), 1)
        point.update(success_rate=float(rate), success_se=math.sqrt(rate * (1 - rate) / n))
    return point


def standard_error(result: Mapping[str, Any]) -> float:
    """Standard error of an :func:`~textgym_agents.evaluate` result's mean return."""
    return float(result["std_return"]) / math.sqrt(max(int(result["episodes"]), 1))


def format_gap(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """How far ``after`` is from ``before``, in standard errors: mean return, and success rate.

    The mean return's standard error of the difference treats the two evaluations as
    independent, which is conservative when they play the same episodes; the success rate's
    is the pooled one of a two-proportion test (not 0 when one rate is 0% or 100%).

    Example:
        >>> before = {"mean_return": -0.3, "std_return": 0.5, "episodes": 25}
        >>> print(format_gap(before, {"mean_return": 0.5, "std_return": 0.5, "episodes": 25}))
        change in mean return: +0.800 (s.e. 0.141): 5.7 standard errors
        >>> before.update(success_rate=0.0)
        >>> after = {"mean_return": 0.5, "std_return": 0.5, "episodes": 25, "success_rate": 0.8}
        >>> print(format_gap(before, after).splitlines()[1])
        change in success rate: +80.0% (s.e. 13.9%): 5.8 standard errors
    """
    change = float(after["mean_return"]) - float(before["mean_return"])
    se = math.hypot(standard_error(before), standard_error(after))
    lines = [f"change in mean return: {change:+.3f} (s.e. {se:.3f}): {_sigmas(change, se)}"]
    if before.get("success_rate") is not None and after.get("success_rate") is not None:
        n1, n2 = int(before["episodes"]), int(after["episodes"])
        p1, p2 = float(before["success_rate"]), float(after["success_rate"])
        pooled = (p1 * n1 + p2 * n2) / max(n1 + n2, 1)
        se = math.sqrt(pooled * (1 - pooled) * (1 / max(n1, 1) + 1 / max(n2, 1)))
        change = p2 - p1
        lines.append(
            f"change in success rate: {change:+.1%} (s.e. {se:.1%}): {_sigmas(change, se)}"
        )
    return "\n".join(lines)


def _sigmas(change: float, se: float) -> str:
    return f"{change / se:.1f} standard errors" if se > 0 else "no spread"


def format_table(rows: list[tuple[str, str, Mapping[str, Any]]]) -> str:
    """An evaluation table: one row per ``(name, env id, evaluate() result)``.

    Example:
        >>> result = {"mean_return": -0.2, "std_return": 0.9, "invalid_rate": 0.0, "episodes": 8}
        >>> print(format_table([("base model", "textgym/Blackjack-v1", result)]))
        policy      env                   episodes  mean return    std   s.e.  success  invalid
        base model  textgym/Blackjack-v1         8       -0.200  0.900  0.318        -     0.0%
    """
    header = ["policy", "env", "episodes", "mean return", "std", "s.e.", "success", "invalid"]
    lines = [header]
    for name, env_id, r in rows:
        success = r.get("success_rate")
        lines.append(
            [
                name,
                env_id,
                str(r["episodes"]),
                f"{r['mean_return']:.3f}",
                f"{r['std_return']:.3f}",
                f"{standard_error(r):.3f}",
                "-" if success is None else f"{success:.1%}",
                f"{r['invalid_rate']:.1%}",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def check_policy_files(target: str) -> None:
    """Refuse a damaged saved policy before anything is built from its run's files.

    Raises:
        CLIError: A file of the policy ``target`` names is missing, truncated or changed.
    """
    kind, where, _ = resolve_policy(target)
    if kind != "policy":
        return
    from textgym_agents.runfiles.policy_files import policy_damage

    problem = policy_damage(where)  # type: ignore[arg-type]
    if problem is not None:
        raise CLIError(f"could not load the policy in {where}: it is damaged: {problem}")


def eval_env(
    target: str, env_id: str | None, env_args: Mapping[str, Any], trust: bool = False
) -> tuple[str, gym.Env[Any, Any]]:
    """The env to evaluate ``target`` on: ``env_id``, else the one it was trained on.

    The training env is rebuilt from the run's env record (its spec, custom system prompt
    included), else from ``cli.json``'s id and ``-e`` arguments; with neither, the default env.
    ``env_args`` (``-e KEY=VALUE``) override the rebuilt env's arguments. What the files name
    must be code textgym knows unless ``trust`` (:mod:`textgym.trust`).
    """
    if env_id is None and Path(target).exists():
        record = read_trained_env(target)
        if record is not None and record.get("spec"):
            try:
                env = make_recorded_env(record, trust_code=trust, **env_args)
            except UntrustedCodeError as e:
                raise CLIError(f"{target}: {e}") from None
            except Exception as e:  # a record from another version, a missing extra
                message = f"warning: could not rebuild the training env: {one_line(e)}"
                print(message, file=sys.stderr)
            else:
                return str(record.get("id")), env
    info = read_run_info(target) if Path(target).exists() else {}
    env_id, args = recorded_env(info, env_id, env_args, f"{target} (cli.json)", trust)
    return env_id, make_env(env_id, args)


def run_eval(args: argparse.Namespace) -> int:
    """``textgym eval``: evaluate each target on the same episodes and print a table."""
    for target in args.targets:
        resolve_policy(target)  # a missing run directory fails before torch is imported
    agents = import_agents()
    rows = []
    for target in args.targets:
        check_policy_files(target)  # before anything is built from the run's files
        env_id, env = eval_env(target, args.env, parse_env_args(args.env_arg), args.trust_run)
        policy, label = load_policy(target, env, args.decoding, args.trust_run)
        if not args.json:
            print(f"Evaluating {label} on {args.episodes} episodes of {env_id}...", flush=True)
        result = evaluate_policy(
            agents,
            policy,
            env,
            args.episodes,
            greedy=not args.sample,
            seed=args.seed,
            num_envs=args.num_envs,
        )
        rows.append((label, env_id, result))
        env.close()
    if args.json:
        results = [{"policy": name, "env": env_id, **r} for name, env_id, r in rows]
        print(json.dumps(results, indent=2))
    else:
        print(format_table(rows))
    return 0


# --- plot ----------------------------------------------------------------------------------------


def run_plot(args: argparse.Namespace) -> int:
    """``textgym plot``: the learning curves of the runs in one PNG."""
    runs = [Path(run) for run in args.runs]
    for run in runs:
        if not run.exists():
            raise CLIError(f"no such run directory: {run}")
        if run.is_dir() and not (run / "metrics.jsonl").is_file():
            raise CLIError(f"{run} is not a run directory: it has no metrics.jsonl")
    if args.labels and len(args.labels) != len(runs):
        raise UsageError(f"--labels: expected {len(runs)} labels (one per run)")
    output = args.output
    if output is None:
        output = runs[0] / "learning_curve.png" if len(runs) == 1 else "learning_curves.png"
    import_agents()
    from textgym_agents.tracking.plotting import curve_settings, plot_learning_curves

    keys, x_key = curve_settings(runs)
    path = plot_learning_curves(
        runs,
        output,
        keys=args.keys or keys,
        labels=args.labels,
        smooth=args.smooth,
        x_key=args.x or x_key,
    )
    print(f"Wrote {path}")
    return 0


eval_command = FunctionCommand(
    "eval", "evaluate trained policies or models on a text env", configure_eval, run_eval
)
"""``textgym eval``, the ``eval`` entry point of ``textgym.commands``."""
plot_command = FunctionCommand(
    "plot", "draw the learning curves of runs into one PNG", configure_plot, run_plot
)
"""``textgym plot``, the ``plot`` entry point of ``textgym.commands``."""
