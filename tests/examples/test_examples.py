"""Smoke runs of the examples with a tiny model and tiny settings (the real runs are minutes)."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script, *args, cwd):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_blackjack_llamagym_loop(tiny_dir, tmp_path):
    out = run(
        "blackjack.py", "--episodes", "4", "--batch-size", "2", "--model", tiny_dir, cwd=tmp_path
    )
    assert "loss/policy" in out
    assert "mean return of the last 4 episodes" in out


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
