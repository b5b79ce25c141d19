"""``textgym train``: evaluate, train with a progress bar, evaluate again, summarise.

The ``train`` entry point of ``textgym.commands``; torch is imported when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from textgym.cli_common import (
    CLIError,
    UsageError,
    add_env_arg,
    add_trust_arg,
    count,
    make_env,
    one_line,
    parse_env_args,
    positive_int,
    recorded_env_args,
    write_run_info,
)
from textgym.plugins import FunctionCommand
from textgym_agents.cli.common import from_pretrained, import_agents
from textgym_agents.cli.config import add_config_flags, flag_values, read_config_file
from textgym_agents.cli.evaluate import (
    EVAL_SEED,
    evaluate_policy,
    evaluation_point,
    format_gap,
    format_table,
)
from textgym_agents.cli.runs import (
    episodes_done,
    holds_run,
    read_run_info,
    resume_point,
)
from textgym_agents.ppo.defaults import DEFAULT_TRAIN_ENV, RUN_DEFAULTS, run_defaults

__all__ = ["EXIT_WRITE_FAILED", "command", "configure", "run_train"]

#: Exit code when a checkpoint or the final policy cannot be written (a full disk): EX_IOERR.
EXIT_WRITE_FAILED = 74

USAGE = (
    "textgym train [ENV_ID] [--model M] [--episodes N] [--num-envs N] [--output DIR]\n"
    "                     [--config FILE] [--resume DIR] [--eval-episodes N] "
    "[-e KEY=VALUE]\n                     [--<ppo-setting> VALUE ...]"
)
TRAIN_EPILOG = """\
examples:
  textgym train                                   # the calculator tool task: learns in minutes
  textgym train textgym/Blackjack-v1              # 500 hands; the base model's always-stick
  textgym train textgym/FrozenLake-v1 -e is_slippery=false --episodes 300
  textgym train --learning-rate 1e-4 --num-epochs 4 --output runs/bj
  textgym train --config settings.yaml --seed 1   # flags override the file
  textgym train --resume runs/bj                  # continue after Ctrl-C
  textgym train --resume runs/bj --episodes 2000  # or train longer

The run directory holds config.json, metrics.jsonl, episodes.jsonl (a few episodes per
update, turn by turn), checkpoints/, final/ (the trained policy) and learning_curve.png;
textgym view RUN shows them on one page. Ctrl-C saves a checkpoint; --resume continues from it
(a damaged newest checkpoint is skipped for the newest intact one). A run directory another
live process trains into is refused. Exit codes: 0 done, 130 Ctrl-C, 143 SIGTERM, 74 a
checkpoint could not be written (a full disk; the earlier checkpoints are intact).
Envs that list their valid replies use decoding=choices (every reply valid, one forward pass
per turn) with their common start as reply_prefix; others use free text.
"""


_ENV_LIMIT = "the env's own limit"


def _per_env(key: str, general: str | None = None) -> str:
    """A run default for the help text: the general one (or ``general``), then each env's own."""
    own = ", ".join(f"{v[key]} on {env}" for env, v in RUN_DEFAULTS.items() if key in v)
    general = general or str(run_defaults("")[key])
    return f"{general}; {own}" if own else general


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``textgym train`` and a flag per :class:`PPOConfig` field."""
    parser.description = "Train a model on a text env by PPO and write a run directory."
    parser.epilog = TRAIN_EPILOG
    parser.usage = USAGE
    parser.add_argument(
        "env", nargs="?", metavar="ENV_ID", help=f"text env (default: {DEFAULT_TRAIN_ENV})"
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "bfloat16-passes"],
        help="compute dtype of the base model; auto: bf16 where this machine runs it fast "
        "(measured once per phase: bfloat16-passes keeps fp32 weights for generation and "
        "runs forward passes in bf16), else float32 (default: auto; on --resume, the run's own)",
    )
    parser.add_argument(
        "--model", help="model directory, .gguf file or cached HF id (default: embedded)"
    )
    parser.add_argument(
        "--episodes",
        type=positive_int,
        help=f"episodes to train, counting resumed ones (default: {_per_env('episodes')})",
    )
    parser.add_argument(
        "--num-envs",
        type=positive_int,
        help=f"envs played in parallel (default: {_per_env('num_envs')})",
    )
    parser.add_argument(
        "--output", metavar="DIR", help="run directory (default: runs/<env>-<time>)"
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML or JSON file of settings (flags override it)"
    )
    parser.add_argument(
        "--resume", metavar="DIR", help="continue the run in DIR (or from a checkpoint dir)"
    )
    parser.add_argument(
        "--eval-episodes",
        type=count,
        help=f"greedy evaluation episodes before and after (default: {_per_env('eval_episodes')})",
    )
    parser.add_argument(
        "--sft-data",
        metavar="DIR",
        help="warm start: fine-tune on this dataset (from textgym record) before PPO",
    )
    parser.add_argument(
        "--sft-epochs", type=float, default=1.0, help="epochs of the warm start (default: 1)"
    )
    parser.add_argument(
        "--sft-learning-rate",
        type=float,
        default=2e-4,
        help="learning rate of the warm start (default: 2e-4; --learning-rate is PPO's)",
    )
    parser.add_argument(
        "--curriculum",
        action="store_true",
        default=None,
        help="tabular worlds (FrozenLake, CliffWalking, Taxi): start training episodes near "
        "the goal and move the start back as the agent succeeds; evaluations start where the "
        "env does (default: off; on --resume, the run's own)",
    )
    parser.add_argument(
        "--exploring-starts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tabular worlds: start every training episode at a random state that can reach "
        "the goal; games: after a random opening; evaluations start where the env does "
        "(default: "
        f"{_per_env('exploring_starts')}; on --resume, the run's own)",
    )
    parser.add_argument(
        "--training-max-steps",
        type=positive_int,
        metavar="N",
        help="end training episodes after N moves (truncated), under the env's own turn "
        "limit, so a wandering cold-start policy cannot fill a rollout with long episodes; "
        "evaluations keep the env's limit (default: "
        f"{_per_env('training_max_steps', general=_ENV_LIMIT)}; on --resume, the run's own)",
    )
    add_env_arg(parser)
    add_trust_arg(parser)
    from textgym_agents.ppo.config import PPOConfig  # no torch: --help stays quick

    add_config_flags(parser, PPOConfig)


# --- train -----------------------------------------------------------------------------------


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _model_arg(model: str | None) -> str | None:
    if model in (None, "embedded"):
        return None
    path = Path(model).expanduser()  # type: ignore[arg-type]
    return str(path.resolve()) if path.exists() else model  # absolute: final/ reloads it


def _source_note(message: str, sources: Mapping[str, str]) -> str:
    field = message.split(" ", 1)[0]
    return f"{message} (from {sources[field]})" if field in sources else message


@dataclass
class _Plan:
    """What ``textgym train`` will do, from flags, --config, the resumed run and defaults."""

    env_id: str
    env_args: dict[str, Any]
    model: str | None
    dtype: str
    episodes: int
    num_envs: int
    eval_episodes: int
    curriculum: bool
    exploring_starts: bool
    training_max_steps: int | None
    config: Any
    out: Path
    checkpoint: Path | None


# Settings the optimizer's saved state overrides on resume (torch restores param_groups).
_FIXED_ON_RESUME = ("learning_rate", "value_learning_rate", "weight_decay")


def _saved_run(run_dir: Path) -> dict[str, Any]:
    """The resumed run's ``config.json``: an unreadable one is an error, never defaults."""
    file = run_dir / "config.json"
    try:
        saved = json.loads(file.read_text())
    except FileNotFoundError:
        raise CLIError(f"--resume: {file} is missing; the run's settings are unknown") from None
    except (OSError, ValueError) as e:
        raise CLIError(f"--resume: {file} is unreadable ({one_line(e)}); fix or restore it") from e
    if not isinstance(saved, dict) or not isinstance(saved.get("ppo", {}), dict):
        raise CLIError(f"--resume: {file} is not a run's config (no 'ppo' settings object)")
    return saved


def _dtype(flag: str | None, saved: str | None) -> str:
    """The run's precision: ``--dtype``, else the resumed run's own, else ``auto``."""
    if flag is None:
        return saved or "auto"
    if saved is not None and flag != saved:
        print(
            f"warning: --dtype {flag} overrides the resumed run's {saved}: its weights will "
            "differ from an uninterrupted run's",
            file=sys.stderr,
        )
    return flag


def _plan(args: argparse.Namespace, config_cls: Any) -> _Plan:
    saved_info: dict[str, Any] = {}
    saved_ppo: dict[str, Any] = {}
    saved_model = saved_dtype = run_dir = checkpoint = None
    if args.resume:
        run_dir, checkpoint = resume_point(args.resume)
        saved_info = read_run_info(run_dir)
        saved = _saved_run(run_dir)
        saved_ppo = dict(saved.get("ppo", {}))
        saved_model = (saved.get("base") or {}).get("name_or_path")
        saved_dtype = (saved.get("base") or {}).get("dtype")
    file_ppo, file_train = read_config_file(args.config, config_cls) if args.config else ({}, {})
    flags = flag_values(args)
    for key in _FIXED_ON_RESUME:
        if key in saved_ppo and {**file_ppo, **flags}.get(key, saved_ppo[key]) != saved_ppo[key]:
            raise UsageError(
                f"{key} cannot change when resuming: the checkpoint's optimizer state keeps it"
            )

    def pick(name: str, default: Any) -> Any:
        return _first(getattr(args, name), file_train.get(name), saved_info.get(name), default)

    # A warm start's dataset names the env it was recorded on (textgym record's cli.json).
    data_info = read_run_info(args.sft_data) if args.sft_data else {}
    env_id = pick("env", data_info.get("env") or DEFAULT_TRAIN_ENV)
    per_env = run_defaults(env_id)
    # The env's measured options, under all given ones; a resumed run keeps its recorded ones.
    env_args = {} if "env_args" in saved_info else per_env["env_args"]  # a fresh copy
    env_args.update(
        recorded_env_args(data_info, env_id, f"{args.sft_data} (cli.json)", args.trust_run)
    )
    env_args.update(recorded_env_args(saved_info, env_id, f"{run_dir} (cli.json)", args.trust_run))
    env_args.update(file_train.get("env_args", {}))
    env_args.update(parse_env_args(args.env_arg))
    probe = make_env(env_id, env_args)  # fails early on an unknown env; lists its replies
    curriculum = bool(pick("curriculum", False))  # a curriculum asked for replaces the env's
    exploring = bool(pick("exploring_starts", not curriculum and per_env["exploring_starts"]))
    if curriculum and exploring:
        probe.close()
        raise UsageError("choose one of --curriculum and --exploring-starts, not both")
    max_steps = pick("training_max_steps", per_env["training_max_steps"])
    tabular = (
        "a tabular world that publishes its model (env.unwrapped.P, as FrozenLake, CliffWalking "
        "and Taxi do)"
    )
    training_only = (  # (asked for, option, value, the error if the env cannot take it)
        (
            curriculum,
            "reverse_curriculum",
            True,
            f"--curriculum needs {tabular}; {env_id} does not",
        ),
        (
            exploring,
            "exploring_starts",
            True,
            f"--exploring-starts needs {tabular} or a game (TicTacToe, ConnectFour); {env_id} "
            "does not",
        ),
        (
            max_steps is not None,
            "training_max_steps",
            max_steps,
            f"--training-max-steps: {env_id} takes no move limit for training episodes (the "
            "envs of textgym's Gymnasium presets do: Blackjack, FrozenLake, ...)",
        ),
    )
    for asked, option, value, problem in training_only:
        if not asked:  # else fail early on an env that cannot take it
            continue
        try:
            make_env(env_id, {**env_args, option: value}).close()
        except CLIError as e:
            probe.close()
            raise UsageError(f"{problem}: {e}") from e
    given = {**saved_ppo, **file_ppo, **flags}
    num_envs = pick("num_envs", per_env["num_envs"])
    sources = {key: "the resumed run's config.json" for key in saved_ppo}
    sources.update({key: f"--config {args.config}" for key in file_ppo})
    sources.update({key: "--" + key.replace("_", "-") for key in flags})
    try:
        config = config_cls.for_env(probe, num_envs=num_envs, **given)
    except (TypeError, ValueError) as e:
        raise UsageError(_source_note(one_line(e), sources)) from e
    finally:
        probe.close()

    if args.output:
        out = Path(args.output)
    elif run_dir is not None:
        out = run_dir
    else:
        from textgym_agents.runfiles.checkpoint import (
            default_run_dir,  # imports torch: not for --help
        )

        out = default_run_dir(env_id)
    if out != run_dir and holds_run(out):
        raise CLIError(
            f"{out} already holds a run; continue it with --resume {out} or pick another --output"
        )
    return _Plan(
        env_id=env_id,
        env_args=env_args,
        model=_model_arg(pick("model", saved_model)),
        dtype=_dtype(args.dtype, saved_dtype),
        episodes=pick("episodes", per_env["episodes"]),
        num_envs=num_envs,
        eval_episodes=pick("eval_episodes", per_env["eval_episodes"]),
        curriculum=curriculum,
        exploring_starts=exploring,
        training_max_steps=max_steps,
        config=config,
        out=out,
        checkpoint=checkpoint,
    )


def run_train(args: argparse.Namespace) -> int:
    """``textgym train``: evaluate, train with a progress bar, evaluate again, summarise.

    Under ``accelerate launch`` every process runs this; the main one prints and writes.
    """
    agents = import_agents()
    from textgym_agents.distributed import current

    process = current()  # the processes of `accelerate launch` (one when run directly)
    if process.is_main:
        return _train(args, agents, process)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        return _train(args, agents, process)  # one copy of the output: the main process's


def _named_run_dir(args: argparse.Namespace) -> Path | None:
    """The existing run directory named by --resume or --output, if any."""
    target = args.resume or args.output
    if not target or not Path(target).is_dir():
        return None
    path = Path(target)
    return path.parents[1] if (path / "trainer_state.json").is_file() else path


def _locked(path: Path | None, process: Any) -> Any:
    from textgym_agents.runfiles.run_lock import RunLock

    return RunLock(path) if path is not None and process.is_main else contextlib.nullcontext()


def _train(args: argparse.Namespace, agents: Any, process: Any) -> int:
    try:  # a live run named by --resume/--output is refused before it is read
        with _locked(_named_run_dir(args), process):
            plan = _plan(args, agents.PPOConfig)
            if process.enabled:
                if args.sft_data:
                    raise UsageError("--sft-data does not run under accelerate launch yet")
                plan.out = Path(process.broadcast_text(str(plan.out)))  # the main one's name
                process.barrier()  # every process checked plan.out before the main one writes
            with _locked(plan.out, process):  # held before the first evaluation
                return _train_locked(args, agents, process, plan)
    except (agents.RunLockedError, agents.RunFileError) as e:
        raise CLIError(str(e)) from None
    except agents.CheckpointWriteError as e:
        print(f"error: {e.strerror}", file=sys.stderr)
        return EXIT_WRITE_FAILED


def _train_locked(args: argparse.Namespace, agents: Any, process: Any, plan: _Plan) -> int:
    out, env_id = plan.out, plan.env_id
    print(f"Run directory: {out}", flush=True)
    if plan.checkpoint is not None:
        done = episodes_done(plan.checkpoint)
        finished = (out / "final" / "policy.json").is_file()
        if done >= plan.episodes and finished:
            print(f"The run has {done} episodes (>= {plan.episodes}); pass a larger --episodes")
            return 0
        if done >= plan.episodes:  # its final/ was never written (a full disk, say)
            print(f"The run has {done} episodes; writing its final policy", flush=True)
        else:
            print(f"Resuming from {plan.checkpoint} ({done} episodes done)")
    print(
        f"Training {env_id} for {plan.episodes} episodes ({plan.num_envs} envs), "
        f"model: {plan.model or 'embedded'}"
    )
    defaults = agents.PPOConfig().to_dict()
    changed = {k: v for k, v in plan.config.to_dict().items() if v != defaults.get(k)}
    print("Settings: " + ", ".join(f"{k}={v!r}" for k, v in changed.items()), flush=True)
    if plan.env_args:
        print("Env options: " + ", ".join(f"{k}={v!r}" for k, v in plan.env_args.items()))
    if plan.exploring_starts:
        print(
            "Exploring starts: training episodes start at random states (games: after a random "
            "opening); evaluations start where the env does"
        )
    if plan.training_max_steps is not None:
        print(
            f"Training episodes end after {plan.training_max_steps} moves "
            "(evaluations keep the env's own limit)"
        )

    policy = from_pretrained(agents, plan.model, plan.config, dtype=plan.dtype)
    precision = policy.base_info.get("precision") or {}
    print(f"Precision: {precision.get('dtype')} ({precision.get('reason')})", flush=True)
    info = {key: getattr(plan, key) for key in ("env_id", "env_args", "model", "episodes")}
    info.update(num_envs=plan.num_envs, eval_episodes=plan.eval_episodes, sft_data=args.sft_data)
    if plan.curriculum:
        info["curriculum"] = True
    info["exploring_starts"] = plan.exploring_starts  # a resumed run keeps it, on or off
    if plan.training_max_steps is not None:
        info["training_max_steps"] = plan.training_max_steps
    if args.sft_data:
        info.update(sft_epochs=args.sft_epochs, sft_learning_rate=args.sft_learning_rate)
    if process.is_main:
        write_run_info(out, {"env": info.pop("env_id"), **info})
    env = make_env(env_id, plan.env_args)
    results = []
    if plan.eval_episodes:
        print(f"Evaluating the base model on {plan.eval_episodes} episodes...", flush=True)
        result = evaluate_policy(agents, policy, env, plan.eval_episodes)
        results.append(("base model", env_id, result))
    if args.sft_data and plan.checkpoint is None:  # a resumed run's adapter already has it
        print(f"Warm start: fine-tuning on {args.sft_data}...", flush=True)
        sft = agents.sft_warm_start(
            policy,
            args.sft_data,
            epochs=args.sft_epochs,
            learning_rate=args.sft_learning_rate,
            progress=plan.config.progress,
        )
        print(
            f"SFT: {sft['sft/steps']:.0f} steps, loss {sft['sft/loss_first']:.3f} -> "
            f"{sft['sft/loss_last']:.3f}",
            flush=True,
        )
        if plan.eval_episodes:
            result = evaluate_policy(agents, policy, env, plan.eval_episodes)
            results.append(("after SFT", env_id, result))
    train_args, callback = _curriculum(plan, process)
    if plan.training_max_steps is not None:
        train_args["training_max_steps"] = plan.training_max_steps
    envs = gym.make_vec(env_id, num_envs=plan.num_envs, **plan.env_args, **train_args)
    try:
        policy.learn(
            envs, plan.episodes, output_dir=out, resume_from=plan.checkpoint, callback=callback
        )
    except (KeyboardInterrupt, agents.SIGTERMExit) as stop:  # Ctrl-C or SIGTERM
        from textgym_agents.runfiles.checkpoint import latest_checkpoint

        what = "Interrupted" if isinstance(stop, KeyboardInterrupt) else "Terminated (SIGTERM)"
        try:
            latest = latest_checkpoint(out)
        except agents.CheckpointError:  # every checkpoint damaged: say so, exit as signalled
            latest = None
        message = f"{what} before any checkpoint of {out} was saved"
        if latest is not None:
            message = f"{what}; latest checkpoint {latest.name}; continue with: "
            message += f"textgym train --resume {out}"
        if process.is_main:
            print(message, file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
    finally:
        envs.close()
    if plan.eval_episodes:
        print(f"Evaluating the trained policy on {plan.eval_episodes} episodes...", flush=True)
        results.append(
            ("trained", env_id, evaluate_policy(agents, policy, env, plan.eval_episodes))
        )
        print(f"\nGreedy evaluation (seed {EVAL_SEED}):")
        print(format_table(results))
        print(format_gap(results[0][2], results[-1][2]))
        if process.is_main:  # the evaluations on the run's curve
            from textgym_agents.tracking.metrics_log import read_metrics
            from textgym_agents.tracking.plotting import plot_run, write_evaluations

            # The last update overshoots --episodes by up to an update's worth.
            logged = [r.get("env/episodes") for r in read_metrics(out)]
            done = {"trained": next((n for n in reversed(logged) if n), plan.episodes)}
            points = [evaluation_point(n, done.get(n, 0), r) for n, _, r in results]
            write_evaluations(out, points)
            plot_run(out)
    env.close()
    print(
        f"\nRun written to {out}: final/ (the policy), metrics.jsonl, "
        f"{'episodes.jsonl, ' if plan.config.sample_episodes else ''}learning_curve.png, "
        f"{'evaluations.json, ' if plan.eval_episodes else ''}"
        f"checkpoints/\nNext: textgym view {out} | textgym eval {out} | "
        f"textgym play {env_id} --policy {out}"
    )
    return 0


def _curriculum(plan: _Plan, process: Any) -> tuple[dict[str, Any], Any]:
    """The training envs' extra arguments and trainer callback: ``--curriculum``'s, or none.

    With ``--exploring-starts`` the envs start anywhere and nothing is saved between updates.

    One :class:`~textgym.curriculum.CurriculumProgress` is shared by the training envs and
    written to ``curriculum.json`` in the run directory after every update; a resumed run
    continues from the level written last.
    """
    if plan.exploring_starts:
        return {"exploring_starts": True}, None
    if not plan.curriculum:
        return {}, None
    from textgym.curriculum import CurriculumProgress

    progress, file = CurriculumProgress(), plan.out / "curriculum.json"
    if plan.checkpoint is not None and file.is_file():
        try:
            progress.load(file)
        except (OSError, ValueError) as e:
            raise CLIError(f"{file} is unreadable ({one_line(e)}); fix or delete it") from e
    print(f"Curriculum: episodes start near the goal (level {progress.level})", flush=True)

    def save(metrics: Mapping[str, float]) -> None:
        if process.is_main:
            progress.save(file)

    return {"reverse_curriculum": progress}, save


command = FunctionCommand(
    "train", "train a model on a text env with PPO (LoRA)", configure, run_train
)
"""``textgym train``, the ``train`` entry point of ``textgym.commands``."""
