"""`benchmarks/learning_suite.py` end to end with the tiny model: cells, tables, plots, resume."""

import json

import pytest

from tests.benchmarks.scripts import run_script
from textgym_agents.tracking.metrics_log import read_metrics


def run_suite(tiny_dir, out, *extra, envs="blackjack,frozenlake", estimators="gae,rloo"):
    args = ["--model", tiny_dir, "--envs", envs, "--estimators", estimators]
    args += ["--seeds", "0,1", "--episodes", "8", "--eval-every", "4", "--eval-episodes", "4"]
    args += ["--num-envs", "4", "--group-size", "2", "--out", str(out), *extra]
    return run_script("learning_suite.py", *args).stdout


@pytest.mark.slow
def test_every_cell_trains_is_scored_and_plotted_and_is_read_back(tiny_dir, tmp_path):
    out = tmp_path / "suite"
    stdout = run_suite(tiny_dir, out)
    cells = ("gae-seed0", "gae-seed1", "rloo-seed0", "rloo-seed1")
    assert "blackjack: random -0.3942 (se 0.0000), optimal -0.0431" in stdout
    assert "| gae | 2 |" in stdout and "| rloo | 2 |" in stdout
    for env_name in ("blackjack", "frozenlake"):
        assert (out / f"{env_name}.png").read_bytes()[:4] == b"\x89PNG"
        for cell in cells:
            result = json.loads((out / env_name / cell / "result.json").read_text())
            assert result["episodes"] >= 8 and result["settings"]["seed"] == int(cell[-1])
            assert result["settings"]["advantage_estimator"] == cell.split("-")[0]
            curve = (out / env_name / cell / "curve.jsonl").read_text().splitlines()
            assert curve  # evaluated during training
    blackjack = json.loads(
        (out / "blackjack" / "rloo-seed0" / "curve.jsonl").read_text().splitlines()[0]
    )
    assert len(blackjack["hits"]) == 280 and set(blackjack["hits"]) <= {"H", "S"}
    assert blackjack["se"] == 0.0  # exact
    # FrozenLake is scored exactly too (tabular_exact): a greedy move per state, no s.e.
    assert "frozenlake: random 0.0139 (se 0.0000)" in stdout
    assert "optimal 1.0000 (value iteration, exact)" in stdout
    frozen = json.loads((out / "frozenlake" / "gae-seed0" / "result.json").read_text())
    assert frozen["after_se"] == 0.0 and frozen["after_success"] == frozen["after"]
    assert 0.0 <= frozen["after_success"] <= 1.0 and frozen["before_success_se"] == 0.0
    point = json.loads(
        (out / "frozenlake" / "gae-seed0" / "curve.jsonl").read_text().splitlines()[0]
    )
    assert len(point["table"]) == 16 and set(point["table"]) <= set("LDRU")
    assert "|   seed 0 success | |" in stdout  # envs that report is_success get a success row
    # The untrained score is computed once per env (LoRA's B starts at zero: every cell's
    # policy is the base model then) and the last curve point, taken after the last update
    # over as many episodes, is the after-training score.
    starts = [json.loads((out / "frozenlake" / c / "start.json").read_text()) for c in cells]
    assert "reused_from" not in starts[0]
    assert all(s["reused_from"] == "gae-seed0" for s in starts[1:])
    assert len({s["return"] for s in starts}) == 1
    for cell in cells:
        result = json.loads((out / "frozenlake" / cell / "result.json").read_text())
        last = json.loads((out / "frozenlake" / cell / "curve.jsonl").read_text().splitlines()[-1])
        if last["episodes"] == result["episodes"]:
            assert result["after"] == last["return"]
    # Run again: finished cells are read back, not retrained (the same table comes out).
    again = run_suite(tiny_dir, out)
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert [line for line in again.splitlines() if line.startswith("| ")] == table
    # The scoreboard reads the same cells back: a row each, their numbers, a summary per group.
    board = run_script("scoreboard.py", out, "--solved", "-1").stdout
    for env_name in ("blackjack", "frozenlake"):
        for cell in cells:
            estimator, seed = cell.split("-seed")
            result = json.loads((out / env_name / cell / "result.json").read_text())
            metrics = read_metrics(out / env_name / cell / "run")
            first = json.loads((out / env_name / cell / "curve.jsonl").read_text().splitlines()[0])
            row = f"| `{{}}` | {estimator} | {seed} | {result['episodes']} | "
            row += f"{result['before']:.4f} → {result['after']:.4f} | {first['episodes']} | "
            assert row in board, (row, board)
            assert f"| {metrics[-1]['env/turns']:,} | " in board
    assert board.count("| `{}` | rloo | 2 | ") == 2 and "| 2 of 2 |" in board


@pytest.mark.slow
def test_babyai_trains_on_short_episodes_and_prints_the_bot_beside_random(tiny_dir, tmp_path):
    pytest.importorskip("minigrid")
    out = tmp_path / "suite"
    extra = ("--curve-episodes", "2", "--seeds", "0")
    stdout = run_suite(tiny_dir, out, *extra, envs="babyai-gotoredball", estimators="gigpo")
    assert "optimal (BabyAI bot)" in stdout and "success 100.0%" in stdout
    cell = out / "babyai-gotoredball" / "gigpo-seed0"
    config = json.loads((cell / "run" / "config.json").read_text())
    assert '"max_steps": 16' in config["env"]["spec"]  # training episodes are cut at 16 steps
    before = json.loads((cell / "start.json").read_text())
    assert 0 < before["length"] <= 16  # and so are the scored ones
    result = json.loads((cell / "result.json").read_text())
    assert 0.0 <= result["after_success"] <= 1.0
    curve = (cell / "curve.jsonl").read_text().splitlines()
    assert curve and all("success" in json.loads(line) for line in curve)


@pytest.mark.slow
def test_exploring_starts_cells_train_from_anywhere_and_stop_at_the_score_asked(tiny_dir, tmp_path):
    out = tmp_path / "suite"
    extra = ("--seeds", "0", "--exploring-starts", "--stop-at", "-1")  # any score: stop at once
    extra += ("--settings", '{"sample_episodes": 8, "group_size": 1}')  # log every episode
    extra += ("--training-max-steps", "2", "--episodes", "32")  # a budget it does not reach
    run_suite(tiny_dir, out, *extra, envs="frozenlake", estimators="gae")
    cell = out / "frozenlake" / "gae-seed0"
    result = json.loads((cell / "result.json").read_text())
    assert result["starts"] == "exploring" and result["training_max_steps"] == 2
    points = (cell / "curve.jsonl").read_text().splitlines()
    assert len(points) == 1 and 4 <= result["episodes"] < 32  # stopped at the first point
    episodes = [
        json.loads(line) for line in (cell / "run" / "episodes.jsonl").read_text().splitlines()
    ]
    firsts = {
        episode["turns"][0]["messages"][-1]["content"].splitlines()[0] for episode in episodes
    }
    assert len(firsts) > 1  # not only the env's own start
    assert max(len(episode["turns"]) for episode in episodes) <= 2


@pytest.mark.slow
def test_curriculum_cells_save_their_level_and_report_it_on_the_curve(tiny_dir, tmp_path):
    out = tmp_path / "suite"
    extra = ("--seeds", "0", "--curriculum", "--curriculum-window", "2")
    extra += ("--curriculum-demote", "0.1", "--curriculum-level", "2")
    stdout = run_suite(tiny_dir, out, *extra, envs="frozenlake", estimators="gigpo")
    cell = out / "frozenlake" / "gigpo-seed0"
    level = json.loads((cell / "curriculum.json").read_text())["level"]
    starts = json.loads((cell / "result.json").read_text())["starts"]
    assert starts == {
        "curriculum": {"window": 2, "demote_below": 0.1, "first_level": 2, "level": level}
    }
    points = [json.loads(line) for line in (cell / "curve.jsonl").read_text().splitlines()]
    assert points and all(point["curriculum_level"] >= 1 for point in points)
    assert points[-1]["curriculum_level"] == level and "curriculum level" in stdout
    spec = json.loads((cell / "run" / "config.json").read_text())["env"]["spec"]
    assert "reverse_curriculum" not in spec  # a live object: the training envs' only


def test_the_last_curve_point_is_the_final_score_only_when_measured_the_same_way(tmp_path):
    from argparse import Namespace

    from benchmarks.learning_suite import final_point

    curve = tmp_path / "curve.jsonl"
    curve.write_text('{"episodes": 96, "return": 0.1}\n{"episodes": 130, "return": 0.25}\n')
    same = Namespace(curve_episodes=None, eval_episodes=200)
    assert final_point(curve, 130, same) == {"episodes": 130, "return": 0.25}
    assert final_point(curve, 144, same) is None  # trained past the last point
    fewer = Namespace(curve_episodes=48, eval_episodes=200)  # points over fewer episodes
    assert final_point(curve, 130, fewer) is None
    assert final_point(tmp_path / "missing.jsonl", 130, same) is None


def test_a_curve_runs_from_the_untrained_score_to_the_final_one(tmp_path):
    from benchmarks.learning_suite import curves

    cell = tmp_path / "calculator" / "gae-seed0"
    cell.mkdir(parents=True)
    (cell / "start.json").write_text('{"return": -0.45, "se": 0.1}')
    (cell / "curve.jsonl").write_text('{"episodes": 30, "return": 0.56}\n')
    (cell / "result.json").write_text('{"episodes": 39, "after": 0.575}')
    assert curves(tmp_path, "calculator") == {"gae": [[(0, -0.45), (30, 0.56), (39, 0.575)]]}
    (cell / "result.json").write_text('{"episodes": 30, "after": 0.56}')  # the same point
    assert curves(tmp_path, "calculator") == {"gae": [[(0, -0.45), (30, 0.56)]]}


def test_the_random_reference_plays_random_valid_replies(monkeypatch):
    """Scored over sampled episodes where no exact score exists: Blackjack, sampled, lands on
    the exact random return (-0.3942) within the standard error."""
    from benchmarks import learning_suite

    sampled = {"id": "textgym/Blackjack-v1", "kwargs": {}, "optimal": -0.0431}
    monkeypatch.setitem(learning_suite.ENVS, "blackjack-sampled", sampled)
    found = learning_suite.random_reference("blackjack-sampled", 2000)
    assert found["se"] > 0
    assert abs(found["return"] - -0.3942) < 4 * found["se"], found
