"""`textgym train`, `eval`, `plot` and `play --policy` with a tiny model; Ctrl-C and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import pytest

from textgym.cli import main  # also registers the textgym/ envs
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from textgym_agents.tracking.metrics_log import read_metrics

QUICK = ["--num-envs", "2", "--num-steps", "2", "--minibatch-size", "8", "--no-progress"]


def textgym(*args, cwd, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "textgym.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        **kwargs,
    )


@pytest.fixture(scope="module")
def run_dir(tiny_dir, tmp_path_factory):
    """A finished run: `textgym train` in a subprocess."""
    cwd = tmp_path_factory.mktemp("work")
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, "--episodes", "6"]
    args += ["--eval-episodes", "2", *QUICK]
    result = textgym(*args, "--output", "run", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd / "run", result.stdout


@pytest.mark.slow
def test_train_writes_the_run_and_summarises(run_dir):
    run, stdout = run_dir
    assert stdout.splitlines()[0] == "Run directory: run"  # where the run goes, first
    assert "decoding='choices'" in stdout and 'reply_prefix=\'{"action": "\'' in stdout
    assert "base model  textgym/Blackjack-v1" in stdout and "trained     textgym" in stdout
    assert "textgym eval run" in stdout
    assert "change in mean return: " in stdout  # and how many standard errors it is
    for name in ["config.json", "metrics.jsonl", "learning_curve.png", "final/policy.json"]:
        assert (run / name).exists(), name
    assert latest_checkpoint(run) is not None
    config = json.loads((run / "config.json").read_text())["ppo"]
    assert config["num_steps"] == 2 and config["kl_coef"] == 0.0 and config["progress"] is False
    info = json.loads((run / "cli.json").read_text())
    assert info["env"] == "textgym/Blackjack-v1" and info["episodes"] == 6
    points = json.loads((run / "evaluations.json").read_text())  # drawn on the curve
    assert [(p["name"], p["episodes"], p["evaluation_episodes"]) for p in points] == [
        ("base model", 0, 2),
        ("trained", 6, 2),
    ]
    assert all(p["se"] >= 0 and 0 <= p["success_rate"] <= 1 for p in points)


@pytest.mark.slow
def test_eval_plot_and_play_a_run(run_dir, tiny_dir, capsys, tmp_path):
    run, _ = run_dir
    args = ["eval", str(run), str(run / "final"), tiny_dir, "--episodes", "2", "--num-envs", "2"]
    assert main(args) == 0
    table = capsys.readouterr().out.splitlines()[-4:]
    header = ["policy", "env", "episodes", "mean", "return", "std", "s.e.", "success", "invalid"]
    assert table[0].split() == header
    assert [line.split()[0] for line in table[1:]] == [str(run), str(run / "final"), tiny_dir]
    assert all(line.endswith("0.0%") for line in table[1:])  # choices: no invalid reply

    assert main(["eval", str(run), "--episodes", "2", "--json", "--decoding", "free"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 2 and result["env"] == "textgym/Blackjack-v1"

    two = tmp_path / "two.png"
    assert main(["plot", str(run), str(run), "--labels", "a", "b", "--output", str(two)]) == 0
    assert two.read_bytes()[:4] == b"\x89PNG"

    assert main(["play", "--policy", str(run), "--seed", "1", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count('\n[assistant]\n{"action": ') >= 2 and "mean return over 2" in out


def test_bad_input_gives_a_clear_error(run_dir, tiny_dir, capsys, tmp_path):
    run, _ = run_dir
    cases = [
        (["train", "--learning-rte", "1e-4"], 2, "did you mean --learning-rate?"),
        (["train", "--learning-rate", "fast"], 2, "argument --learning-rate: expected a number"),
        (
            ["train", "--clip-range", "-1"],
            2,
            "clip_range must be > 0, got -1.0 (from --clip-range)",
        ),
        (["train", "--decoding", "beam"], 2, "decoding must be one of"),
        (["train", "--advantage-estimator", "grpo"], 2, "group_size must be >= 2, got 1"),
        (["train", "--config", str(tmp_path / "none.yaml")], 2, "--config: cannot read"),
        (["train", "--resume", str(tmp_path / "none")], 1, "--resume: no such run directory"),
        (["train", "--resume", str(tmp_path)], 1, "no checkpoint in"),
        (["train", "--output", str(run), "--model", tiny_dir], 1, "already holds a run"),
        (["train", "--resume", str(run), "--learning-rate", "1"], 2, "cannot change when resum"),
        (["train", "nope/Nothing-v0"], 1, "Namespace nope not found"),
        (["eval", str(tmp_path / "missing-run")], 1, "no such run directory or model"),
        (["plot", str(tmp_path)], 1, "has no metrics.jsonl"),
    ]
    for args, code, message in cases:
        assert main(args) == code, args
        err = capsys.readouterr().err
        assert message in err, (args, err)
        assert "Traceback" not in err
        if code == 1:
            assert err.count("\n") == 1, err  # one line

    config = tmp_path / "bad.yaml"
    config.write_text("learning_rate: 1e-4\nnum_epoch: 3\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown setting 'num_epoch'; did you mean 'num_epochs'?" in capsys.readouterr().err


@pytest.mark.slow
def test_train_with_a_group_estimator(tiny_dir, tmp_path, capsys):
    """`--advantage-estimator gigpo --group-size 2`: critic-free metrics; a bad G is named."""
    args = ["train", "--model", tiny_dir, "--eval-episodes", "0", "--no-progress"]
    args += ["--num-steps", "1", "--advantage-estimator", "gigpo", "--group-size", "2"]
    run = tmp_path / "run"
    assert main([*args, "--num-envs", "4", "--episodes", "8", "--output", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())["ppo"]
    assert config["advantage_estimator"] == "gigpo" and config["group_size"] == 2
    lines = read_metrics(run)
    assert lines and all(not k.startswith("value/") for line in lines for k in line)
    assert lines[-1]["env/episodes"] % 4 == 0  # whole rounds of 4 envs
    capsys.readouterr()
    assert main([*args, "--num-envs", "3", "--output", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert "num_envs (3) must be a multiple of group_size (2)" in err and "Traceback" not in err


def test_usage_error_and_missing_run_through_the_command(tmp_path):
    result = textgym("eval", "run", "--episodez", "3", cwd=tmp_path)
    assert result.returncode == 2 and "did you mean --episodes?" in result.stderr
    result = textgym("eval", "runs/missing", cwd=tmp_path)
    assert (
        result.returncode == 1 and "no such run directory or model: runs/missing" in result.stderr
    )
    assert result.stderr.count("\n") == 1


def test_train_help_lists_every_ppo_setting(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in PPOConfig.help():
        assert "--" + name.replace("_", "-") in out, name
    assert "examples:" in out and "AdamW learning rate of the LoRA weights" in out


def stop_after_first_update(tiny_dir, tmp_path, signum):
    """Start `textgym train` in a subprocess, send ``signum`` after its first update."""
    args = ["train", "--model", tiny_dir, "--episodes", "100000", "--eval-episodes", "0"]
    args += [*QUICK, "--save-every", "1000", "--output", "run"]
    process = subprocess.Popen(
        [sys.executable, "-m", "textgym.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().endswith("\n")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(tiny_dir, tmp_path):
    code, stderr = stop_after_first_update(tiny_dir, tmp_path, signal.SIGTERM)
    assert code == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("Terminated (SIGTERM); latest checkpoint")
    assert "Traceback" not in stderr
    assert latest_checkpoint(tmp_path / "run") is not None


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tiny_dir, tmp_path, capsys):
    code, stderr = stop_after_first_update(tiny_dir, tmp_path, signal.SIGINT)
    assert code == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("Interrupted; latest checkpoint step_")
    assert "continue with: textgym train --resume run" in stderr and "Traceback" not in stderr
    checkpoint = latest_checkpoint(tmp_path / "run")
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["update_step"] == len(read_metrics(tmp_path / "run")) >= 1

    done = state["episodes"]
    run = str(tmp_path / "run")
    assert main(["train", "--resume", run, "--episodes", str(done + 4)]) == 0
    assert f"({done} episodes done)" in capsys.readouterr().out
    steps = [line["step"] for line in read_metrics(run)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > state["update_step"]
    assert (tmp_path / "run" / "final" / "policy.json").is_file()
    assert main(["train", "--resume", run]) == 0  # the run's target is reached
    assert "pass a larger --episodes" in capsys.readouterr().out


# --- TrainingRun's Ctrl-C handling, in-process ------------------------------------------------


def make_trainer(tiny_dir, run):
    config = PPOConfig(num_steps=2, minibatch_size=8, micro_batch_size=4, progress=False)
    config.save_every = 1000
    policy = PPOPolicy.from_pretrained(tiny_dir, config=config)
    return PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=2), output_dir=run)


def sigint(*args):
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def default_sigint():
    """Python's Ctrl-C handler, also when the tests run as a shell's background job.

    Background jobs of a shell without job control start with SIGINT ignored; Python then never
    installs ``default_int_handler`` and training (rightly) leaves the ignored signal alone.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_between_updates_saves_the_last_one(tiny_dir, tmp_path, default_sigint):
    trainer = make_trainer(tiny_dir, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(10_000, callback=lambda m: sigint() if m["train/update"] == 2 else None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002"]
    assert len(read_metrics(tmp_path)) == 2


@pytest.mark.slow
def test_ctrl_c_during_an_update_finishes_it_then_saves(tiny_dir, tmp_path, default_sigint):
    trainer = make_trainer(tiny_dir, tmp_path)
    weights = trainer.optimizer.param_groups[0]["params"]  # the LoRA weights, live
    hook = trainer.optimizer.register_step_post_hook(lambda *a: (hook.remove(), sigint()))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(10_000)
    assert trainer.update_step == 1  # the update ran to its end before stopping
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    assert len(read_metrics(tmp_path)) == 1
    resumed = make_trainer(tiny_dir, tmp_path / "again")
    from textgym_agents.ppo.run import TrainingRun

    TrainingRun(resumed).resume(tmp_path)
    loaded = resumed.policy.trainable_parameters()[0]
    assert all(a.equal(b) for a, b in zip(weights, loaded, strict=True))


def test_second_ctrl_c_stops_at_once_without_saving(tiny_dir, tmp_path, default_sigint):
    trainer = make_trainer(tiny_dir, tmp_path)
    hook = trainer.optimizer.register_step_post_hook(lambda *a: (hook.remove(), sigint(), sigint()))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(10_000)
    assert trainer.update_step == 0 and list_checkpoints(tmp_path) == []


def test_the_default_run_is_the_calculator_recipe_each_env_gets_its_own_and_flags_win(tmp_path):
    import argparse

    from textgym_agents.cli.train import _plan, configure

    parser = argparse.ArgumentParser()
    configure(parser)

    def plan(*args):
        return _plan(parser.parse_args([*args, "--output", str(tmp_path / "run")]), PPOConfig)

    default = plan()
    assert default.env_id == "textgym/Calculator-v0"
    assert (default.episodes, default.num_envs, default.eval_episodes) == (64, 8, 32)
    config = default.config
    assert (config.decoding, config.reply_prefix, config.stop_strings) == ("free", '{"', ["}"])
    assert (config.temperature, config.max_new_tokens, config.kl_coef) == (0.7, 40, 0.0)
    assert (config.learning_rate, config.self_imitation) == (5e-4, 16)  # the calculator's recipe
    told = plan("--episodes", "5", "--num-envs", "2", "--temperature", "1.0", "--learning-rate",
                "1e-4")  # fmt: skip
    assert (told.episodes, told.num_envs, told.config.temperature) == (5, 2, 1.0)
    assert told.config.learning_rate == 1e-4
    blackjack = plan("textgym/Blackjack-v1")
    assert (blackjack.episodes, blackjack.num_envs, blackjack.eval_episodes) == (6000, 16, 50)
    assert blackjack.config.decoding == "choices" and blackjack.config.temperature == 2.0
    assert blackjack.config.advantage_estimator == "gigpo" and blackjack.config.group_size == 4
    lake = plan("textgym/FrozenLake-v1")  # its recipe, starting training episodes anywhere
    assert (lake.episodes, lake.num_envs, lake.exploring_starts) == (512, 8, True)
    assert lake.training_max_steps is None  # the env's own limit
    assert plan("textgym/FrozenLake-v1", "--training-max-steps", "9").training_max_steps == 9
    assert lake.config.advantage_estimator == "gigpo" and lake.config.explore_eps == 0.3
    assert not plan("textgym/FrozenLake-v1", "--no-exploring-starts").exploring_starts
    curriculum = plan("textgym/FrozenLake-v1", "--curriculum")  # replaces the default starts
    assert curriculum.curriculum and not curriculum.exploring_starts
    cliff = plan("textgym/CliffWalking-v1")  # no measured recipe: the general defaults
    assert (cliff.episodes, cliff.config.advantage_estimator) == (500, "gae")
    assert not cliff.exploring_starts
    assert plan("textgym/TicTacToe-v0", "--exploring-starts").exploring_starts  # random openings
    game = plan("textgym/TicTacToe-v0")  # its recipe, against the measured training opponent
    assert (game.episodes, game.env_args, game.exploring_starts) == (
        1024, {"opponent": "minimax:0.5"}, False
    )  # fmt: skip
    assert game.config.advantage_estimator == "gigpo" and game.config.group_size == 4
    assert plan("textgym/TicTacToe-v0", "-e", "opponent=random").env_args == {"opponent": "random"}
    assert plan("textgym/Blackjack-v1").env_args == {}


def test_resume_of_a_finished_run_without_its_final_policy_writes_it(run_dir, tmp_path, capsys):
    """A full disk can stop a run after its last checkpoint but before final/ is written."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir[0], run)
    shutil.rmtree(run / "final")
    assert main(["train", "--resume", str(run), "--no-progress", "--eval-episodes", "0"]) == 0
    assert "writing its final policy" in capsys.readouterr().out
    assert (run / "final" / "policy.json").is_file()
    PPOPolicy.load(run / "final")


def lake_run_args(tiny_dir, num_envs):
    """`textgym train` on the non-slippery lake, the tiny model, short evaluations and rollouts."""
    args = ["train", "textgym/FrozenLake-v1", "-e", "is_slippery=false", "--model", tiny_dir]
    return args + ["--eval-episodes", "1", "--num-steps", "2", "--num-envs", str(num_envs),
                   "--no-progress"]  # fmt: skip


@pytest.mark.slow  # two short training runs: about a minute
def test_curriculum_trains_near_the_goal_evaluates_from_the_start_and_resumes(
    tiny_dir, tmp_path, capsys
):
    """`--curriculum`: the level is saved after every update and read back on --resume."""
    args = lake_run_args(tiny_dir, num_envs=2)
    run = tmp_path / "run"
    assert main([*args, "--curriculum", "--episodes", "2", "--output", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Curriculum: episodes start near the goal (level 1)" in out
    assert json.loads((run / "cli.json").read_text())["curriculum"] is True
    assert "reverse_curriculum" not in json.loads((run / "cli.json").read_text())["env_args"]
    saved = json.loads((run / "curriculum.json").read_text())
    assert saved["level"] == 1 and 1 <= len(saved["outcomes"]) <= 16
    (run / "curriculum.json").write_text(json.dumps({"level": 3, "outcomes": []}))
    assert main(["train", "--resume", str(run), "--episodes", "4", "--no-progress"]) == 0
    assert "Curriculum: episodes start near the goal (level 3)" in capsys.readouterr().out
    assert json.loads((run / "curriculum.json").read_text())["level"] >= 3


@pytest.mark.slow  # two short training runs: about a minute
def test_frozen_lake_trains_from_anywhere_by_default_and_a_resumed_run_keeps_its_starts(
    tiny_dir, tmp_path, capsys
):
    """FrozenLake's default `--exploring-starts`: training episodes start all over the lake."""
    args = lake_run_args(tiny_dir, num_envs=4) + ["--group-size", "2", "--sample-episodes", "8"]
    run = tmp_path / "run"
    args += ["--training-max-steps", "3"]
    assert main([*args, "--episodes", "8", "--output", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Exploring starts: training episodes start at random states" in out
    assert "Training episodes end after 3 moves" in out
    info = json.loads((run / "cli.json").read_text())
    assert info["exploring_starts"] is True and "exploring_starts" not in info["env_args"]
    assert info["training_max_steps"] == 3 and "training_max_steps" not in info["env_args"]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert max(len(episode["turns"]) for episode in episodes) <= 3
    starts = {
        episode["turns"][0]["messages"][-1]["content"].splitlines()[0] for episode in episodes
    }
    assert len(starts) > 1  # not all from the env's own start (row 0, column 0); a group's
    # members share a seed, hence a start: two groups of two, two rounds, every episode logged
    evaluations = json.loads((run / "evaluations.json").read_text())
    assert evaluations and all("episodes" in row for row in evaluations)
    assert main(["train", "--resume", str(run), "--episodes", "12", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Exploring starts:" in out and "Training episodes end after 3 moves" in out


@pytest.mark.slow  # two short training runs
def test_tictactoe_trains_against_its_measured_opponent_and_a_resumed_run_keeps_its_own(
    tiny_dir, tmp_path, capsys
):
    run = tmp_path / "run"
    args = ["train", "textgym/TicTacToe-v0", "--model", tiny_dir, "--num-envs", "4"]
    args += ["--eval-episodes", "2", "--dtype", "float32", "--no-progress"]
    assert main([*args, "--episodes", "4", "--output", str(run)]) == 0
    assert "Env options: opponent='minimax:0.5'" in capsys.readouterr().out
    info_file = run / "cli.json"
    info = json.loads(info_file.read_text())
    assert info["env_args"] == {"opponent": "minimax:0.5"}
    info["env_args"] = {}  # as a run recorded before tic-tac-toe had a default opponent
    info_file.write_text(json.dumps(info))
    assert main(["train", "--resume", str(run), "--episodes", "8", "--no-progress"]) == 0
    assert "Env options:" not in capsys.readouterr().out
    assert json.loads(info_file.read_text())["env_args"] == {}


def test_exploring_starts_and_the_curriculum_together_are_a_usage_error(tmp_path, capsys):
    args = ["train", "textgym/FrozenLake-v1", "--curriculum", "--exploring-starts"]
    assert main([*args, "--output", str(tmp_path / "r")]) == 2
    assert "choose one of --curriculum and --exploring-starts" in capsys.readouterr().err


def test_exploring_starts_on_an_env_without_a_model_is_a_usage_error(tmp_path, capsys):
    args = ["train", "textgym/CartPole-v1", "--exploring-starts", "--output", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--exploring-starts needs a tabular world" in err and "Traceback" not in err


def test_a_training_move_limit_on_an_env_that_takes_none_is_a_usage_error(tmp_path, capsys):
    args = ["train", "--training-max-steps", "3", "--output", str(tmp_path / "r")]  # calculator
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--training-max-steps: textgym/Calculator-v0 takes no move limit" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_curriculum_on_an_env_without_a_model_is_a_usage_error(tmp_path, capsys):
    args = ["train", "textgym/CartPole-v1", "--curriculum", "--output", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--curriculum needs a tabular world" in err and "textgym/CartPole-v1 does not" in err
    assert "Traceback" not in err
