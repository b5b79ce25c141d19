"""Smoke runs of examples/frozenlake.py and examples/custom_env.py with a tiny model."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script, *args, cwd):
    # One thread: on a shared CPU, torch's default (one per core) can be many times slower.
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
