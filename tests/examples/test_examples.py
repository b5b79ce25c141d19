"""Smoke runs of every example with a tiny model and tiny settings (the real runs are minutes)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess per example

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script, *args, cwd):
    # One thread: a tiny model gains nothing from more, and on a busy CPU OpenMP threads
    # competing with other processes make a run several times slower (130 s instead of 18 s).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("mode", [[], ["--free-text"]], ids=["named-replies", "free-text"])
def test_blackjack_llamagym_loop(tiny_dir, tmp_path, mode):
    args = ["--episodes", "8", "--batch-size", "4", "--eval-episodes", "4", "--log-every", "1"]
    out = run("blackjack.py", *args, *mode, "--model", tiny_dir, cwd=tmp_path)
    assert out.count("loss/policy") == 2  # an update per 4 hands
    assert "mean return of the last 8 training hands" in out
    if mode:
        assert "(mean of 4 held-out hands)" in out and " ± " in out
    else:
        assert "'env/invalid_rate': 0.0" in out  # named replies are never invalid
        assert "'train/learning_rate': 0.0003" in out  # the Blackjack recipe, annealed
        assert out.count("(exact)") == 2


def test_blackjack_text_env(tiny_dir, tmp_path):
    out = run(
        "blackjack_text_env.py",
        "--hands",
        "4",
        "--eval-hands",
        "4",
        "--num-envs",
        "2",
        "--model",
        tiny_dir,
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert "before: mean return" in out and "after: mean return" in out
    assert (tmp_path / "run" / "learning_curve.png").is_file()
    assert (tmp_path / "run" / "final" / "adapter" / "adapter_config.json").is_file()


def tiny_settings(tiny_dir, out):
    return ["--episodes", "2", "--eval-episodes", "2", "--num-envs", "2"] + [
        "--model",
        tiny_dir,
        "--out",
        str(out),
    ]


def assert_run_written(out):
    assert (out / "metrics.jsonl").is_file()
    assert (out / "learning_curve.png").is_file()
    assert (out / "final" / "adapter" / "adapter_config.json").is_file()


def test_frozenlake(tiny_dir, tmp_path):
    out = run("frozenlake.py", *tiny_settings(tiny_dir, tmp_path / "run"), cwd=tmp_path)
    for phase in ("before", " after"):
        assert f"{phase}: success " in out
    assert "invalid replies" in out and "mean return" in out
    assert "greedy episode: " in out
    assert "FFF" in out and "GHHH" in out  # the ledge map, drawn with the agent on it
    assert_run_written(tmp_path / "run")


def test_custom_env(tiny_dir, tmp_path):
    out = run("custom_env.py", *tiny_settings(tiny_dir, tmp_path / "run"), cwd=tmp_path)
    assert "check_text_env: 20 round trips passed" in out
    assert 'reply {"drink": " Tea ", "cups": 2} -> valid' in out
    assert "drink: Input should be 'coffee', 'tea' or 'juice'" in out  # Pydantic's verdict
    assert "cups: Input should be less than or equal to 3" in out
    for phase in ("before", " after"):
        assert f"{phase}: perfect episodes " in out
    assert "Customer 1 of 3 orders" in out
    assert_run_written(tmp_path / "run")


def test_calculator_tool_agent(tiny_dir, tmp_path):
    out_dir = tmp_path / "run"
    args = ["--episodes", "2", "--eval-episodes", "2", "--questions", "1", "--num-envs", "2"]
    args += ["--difficulty", "add", "--model", tiny_dir, "--out", str(out_dir)]
    out = run("calculator_tool_agent.py", *args, cwd=tmp_path)
    adapter = out_dir / "final" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (out_dir / "metrics.jsonl").is_file()
    assert "before training:" in out and "after training (reloaded):" in out
    assert out.count("  Q: What is ") == 2  # the same question before and after
    assert out.count("solved 0/1") + out.count("solved 1/1") == 2
    assert "before: solved" in out and "after: solved" in out
    assert f"reloaded {adapter} onto {tiny_dir}" in out
