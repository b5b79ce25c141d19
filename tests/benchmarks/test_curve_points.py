"""`benchmarks/curve_points.py`: points every N episodes, resumed curves continue, time counted."""

import doctest
import json

from benchmarks import curve_points
from benchmarks.curve_points import CurvePoints


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
    assert reports == [(8, 1), (17, 2)] and points.seconds >= 0.0
    again = CurvePoints(path, 8, lambda: {"x": 0})
    again({"env/episodes": 20})  # 3 after the last point: not due
    again({"env/episodes": 25})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 17, 25]
