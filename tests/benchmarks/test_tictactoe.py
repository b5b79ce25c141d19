"""`benchmarks/tictactoe.py` end to end with the tiny model: references, table, curve, read back."""

import json

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("pettingzoo")


def run(tiny_dir, out, seeds="0"):
    args = ["--model", tiny_dir, "--seeds", seeds, "--episodes", "8", "--eval-every", "4"]
    args += ["--eval-games", "6", "--curve-games", "4", "--num-envs", "4", "--group-size", "2"]
    return run_script("tictactoe.py", *args, "--out", out).stdout


@pytest.mark.slow
def test_a_seed_trains_is_scored_against_both_opponents_and_is_read_back(tiny_dir, tmp_path):
    out = tmp_path / "ttt"
    stdout = run(tiny_dir, out)
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| minimax (reference) | random |") for line in table)
    # Perfect play never loses: its loss column is 0.0%.
    assert "| 0.0% | 100.0% ± 0.0% |" in next(row for row in table if "minimax (reference)" in row)
    result = json.loads((out / "gigpo-seed0" / "result.json").read_text())
    assert result["episodes"] >= 8 and result["train_opponent"] == "minimax:0.5"
    for when in ("before", "after"):
        for opponent in ("random", "minimax"):
            found = result[when][opponent]
            assert found["games"] == 6
            assert abs(found["win"] + found["draw"] + found["loss"] - 1) < 1e-9
            assert found["invalid_rate"] == 0.0  # choice decoding over the legal moves
        assert result[when]["minimax"]["win"] == 0.0
    curve = [json.loads(line) for line in (out / "gigpo-seed0" / "curve.jsonl").open()]
    assert curve and curve[0]["minimax"]["games"] == 4
    assert (out / "tictactoe.png").read_bytes()[:4] == b"\x89PNG"
    again = run(tiny_dir, out)  # read back, not retrained
    assert [line for line in again.splitlines() if line.startswith("| ")] == table


@pytest.mark.slow
def test_the_untrained_policy_is_scored_once_for_every_seed(tiny_dir, tmp_path):
    out = tmp_path / "ttt"
    stdout = run(tiny_dir, out, seeds="0,1")
    assert "seed 0: the untrained policy's results read from" not in stdout
    assert f"seed 1: the untrained policy's results read from {out / 'untrained.json'}" in stdout
    first, second = (
        json.loads((out / f"gigpo-seed{s}" / "result.json").read_text()) for s in (0, 1)
    )
    assert first["before"] == second["before"] and first["before"]["random"]["games"] == 6
    assert len(json.loads((out / "untrained.json").read_text())) == 1
