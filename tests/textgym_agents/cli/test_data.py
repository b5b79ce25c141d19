"""`textgym record` and `textgym sft` with scripted experts and a tiny model, end to end."""

import json
import math
import os
import subprocess
import sys

import gymnasium as gym
import pytest
from datasets import load_from_disk

from textgym.cli import main  # also registers the textgym/ envs
from textgym.recording import COLUMNS

EXPERTS = """
def hit_below_17(obs):
    return int(obs[0] < 17)

def not_an_action(obs):
    return 7
"""


def textgym(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "textgym.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working directory with an importable experts module and a recorded dataset."""
    cwd = tmp_path_factory.mktemp("work")
    (cwd / "experts.py").write_text(EXPERTS)
    args = ["record", "--expert", "experts:hit_below_17", "--episodes", "12", "--seed", "3"]
    result = textgym(*args, "--output", "demos", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd, result.stdout


def test_record_writes_a_dataset_of_the_expert_and_the_env(work):
    cwd, stdout = work
    dataset = load_from_disk(str(cwd / "demos"))
    assert tuple(dataset.column_names) == COLUMNS
    assert sorted(set(dataset["episode"])) == list(range(12))
    assert sorted(set(dataset["seed"])) == list(range(3, 15))
    env = gym.make("textgym/Blackjack-v1")
    parser = env.get_wrapper_attr("parser")
    for row in dataset:
        total = int(row["prompt"][-1]["content"].split("totals ")[1].split(",")[0].split(".")[0])
        assert parser.parse(row["completion"][0]["content"]) == int(total < 17)
    info = json.loads((cwd / "demos" / "cli.json").read_text())
    assert info["env"] == "textgym/Blackjack-v1" and info["expert"] == "experts:hit_below_17"
    assert f"Wrote {len(dataset)} turns of 12 episodes to demos" in stdout
    assert "textgym sft demos" in stdout


def test_record_keeps_the_best_episodes_of_a_random_expert(tmp_path, capsys):
    args = ["record", "textgym/FrozenLake-v1", "-e", "is_slippery=false", "--expert", "random"]
    args += ["--episodes", "100", "--seed", "5"]
    assert main([*args, "--top-fraction", "0.1", "--output", str(tmp_path / "best")]) == 0
    assert "(the best 10)" in capsys.readouterr().out
    assert main([*args, "--output", str(tmp_path / "all")]) == 0
    best, everything = (load_from_disk(str(tmp_path / name)) for name in ("best", "all"))
    returns = dict(zip(everything["episode"], everything["return"], strict=True))
    ranked = sorted(returns, key=lambda episode: (-returns[episode], episode))
    assert sorted(set(best["episode"])) == sorted(ranked[:10])
    assert max(returns.values()) == 1.0  # a random walk reaches the goal now and then
    kept = everything.filter(lambda row: row["episode"] in set(ranked[:10]))
    assert best["prompt"] == kept["prompt"] and best["completion"] == kept["completion"]
    info = json.loads((tmp_path / "best" / "cli.json").read_text())
    assert info["env_args"] == {"is_slippery": False} and info["top_fraction"] == 0.1


@pytest.mark.slow
def test_sft_fine_tunes_a_tiny_model_and_saves_a_playable_policy(work, tiny_dir, capsys):
    cwd, _ = work
    args = ["sft", "demos", "--model", tiny_dir, "--output", "sft", "--eval-episodes", "2"]
    result = textgym(*args, "--learning-rate", "3e-3", "--no-progress", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "SFT: " in out and " steps on " in out
    table = out.split("Policy written to sft")[0].strip().splitlines()[-2:]
    assert [line.split()[:3] for line in table] == [
        [tiny_dir, "textgym/Blackjack-v1", "2"],
        ["fine-tuned", "textgym/Blackjack-v1", "2"],
    ]
    assert "textgym eval sft" in out
    info = json.loads((cwd / "sft" / "cli.json").read_text())
    assert info["env"] == "textgym/Blackjack-v1" and info["sft"]["dataset"] == "demos"
    assert info["sft"]["sft/loss_last"] < info["sft"]["sft/loss_first"]
    assert (cwd / "sft" / "policy.json").is_file() and (cwd / "sft" / "adapter").is_dir()
    assert not list((cwd / "demos").glob("cache-*"))  # the dataset directory is left alone

    # The saved policy is what `eval` and `record --policy` load; its env comes from cli.json.
    assert main(["eval", str(cwd / "sft"), "--episodes", "2", "--json"]) == 0
    (evaluation,) = json.loads(capsys.readouterr().out)
    assert evaluation["env"] == "textgym/Blackjack-v1" and math.isfinite(evaluation["mean_return"])
    record = ["record", "--policy", str(cwd / "sft"), "--episodes", "3", "--num-envs", "2"]
    assert main([*record, "--output", str(cwd / "own")]) == 0
    own = load_from_disk(str(cwd / "own"))
    assert sorted(set(own["episode"])) == [0, 1, 2]
    assert not any(own["invalid"])  # Blackjack's policy decodes by choices: always valid


def test_bad_input_gives_a_clear_error(work, tmp_path, capsys, monkeypatch):
    cwd, _ = work
    monkeypatch.chdir(cwd)  # the experts module is importable from the working directory
    cases = [
        (["record", "--episodes", "2", "--output", "x"], 2, "one of the arguments --expert"),
        (["record", "--expert", "nocolon", "--output", str(tmp_path / "a")], 2, "MODULE:FUNCT"),
        (["record", "--expert", "random", "--top-fraction", "2", "--output", "y"], 2, "(0, 1]"),
        (["record", "--expert", "nope_mod:f", "--output", str(tmp_path / "b")], 1, "cannot imp"),
        (["record", "--expert", "experts:nothing", "--output", str(tmp_path / "c")], 1, "no fun"),
        (["record", "--expert", "random", "--output", "demos"], 1, "already exists"),
        (
            ["record", "--expert", "experts:not_an_action", "--output", str(tmp_path / "d")],
            1,
            "which is not in the action space Discrete(2)",
        ),
        (["sft", str(tmp_path / "none"), "--output", str(tmp_path / "e")], 1, "no such dataset"),
    ]
    for args, code, message in cases:
        assert main(args) == code, args
        err = capsys.readouterr().err
        assert message in err, (args, err)
        assert "Traceback" not in err
        if code == 1:
            assert err.count("\n") == 1, err


@pytest.mark.slow
def test_train_warm_starts_from_a_dataset(work, tiny_dir):
    cwd, _ = work
    args = ["train", "--model", tiny_dir, "--sft-data", "demos", "--sft-epochs", "1"]
    args += ["--sft-learning-rate", "5e-4"]
    args += ["--episodes", "4", "--num-envs", "2", "--eval-episodes", "2", "--output", "warm"]
    result = textgym(*args, "--no-progress", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Warm start: fine-tuning on demos" in out and "SFT: " in out
    rows = [line.split()[0:2] for line in out.splitlines() if "textgym/Blackjack-v1" in line]
    assert ["after", "SFT"] in rows  # the table has base, after SFT and trained rows
    info = json.loads((cwd / "warm" / "cli.json").read_text())
    assert info["sft_data"] == "demos"
    assert (info["sft_epochs"], info["sft_learning_rate"]) == (1.0, 5e-4)
    assert (cwd / "warm" / "final" / "adapter").is_dir()
