"""`benchmarks/curve_points.py`: points every N episodes, resumed curves continue, time counted."""

import doctest
import json

import gymnasium as gym

import textgym  # noqa: F401
from benchmarks import curve_points
from benchmarks.curve_points import CurvePoints, cell_config, train_cell
from textgym_agents import PPOPolicy, PPOTrainer
from textgym_agents.tracking.metrics_log import read_metrics


def test_the_docstring_example_runs():
    assert doctest.testmod(curve_points).failed == 0


def test_points_come_every_n_episodes_and_a_resumed_curve_continues(tmp_path):
    path = tmp_path / "curve.jsonl"
    calls, reports = [], []

    def measure():
        calls.append(1)
        return {"x": len(calls)}

    points = CurvePoints(path, 8, measure, lambda done, found: reports.append((done, found["x"])))
    for done in (3, 8, 9, 15, 17):
        points({"env/episodes": done})
    assert reports == [(8, 1), (17, 2)]
    again = CurvePoints(path, 8, lambda: {"x": 0})
    again({"env/episodes": 20})  # 3 after the last point: not due
    again({"env/episodes": 25})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 17, 25]


def test_a_cell_counts_the_whole_runs_training_and_a_finished_cell_resumes(tiny_dir, tmp_path):
    run_dir, curve = tmp_path / "run", CurvePoints(tmp_path / "curve.jsonl", 4, lambda: {})

    def cell():
        envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4)
        settings = '{"num_steps": 2, "minibatch_size": 8, "micro_batch_size": 4, "save_every": 1}'
        config = cell_config(envs, 0, "gigpo", 2, settings)
        trainer = PPOTrainer(
            PPOPolicy.from_pretrained(tiny_dir, config=config), envs, output_dir=run_dir
        )
        return train_cell(trainer, run_dir, 6, curve)

    metrics, seconds, episodes = cell()
    rows = read_metrics(run_dir)
    timed = sum(row["time/rollout_s"] + row["time/update_s"] for row in rows)
    assert episodes == metrics["env/episodes"] >= 6 and seconds >= timed > 0
    # Run again on the finished cell (a later session's final evaluation): nothing trains, the
    # same whole-run numbers come back instead of a KeyError on empty metrics.
    assert cell()[1:] == (seconds, episodes)
