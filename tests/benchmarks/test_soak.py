"""`benchmarks/soak.py`: its bound checks, and the script end to end on a short run."""

import importlib.util
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
spec = importlib.util.spec_from_file_location("soak", SCRIPT)
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def row(update, **changes):
    values = dict(rss_mb=500.0, fds=8, objects=4e5, run_dir_mb=0.6, metrics_kb=update * 1.0)
    values.update(s_per_update=0.3, cpu_s_per_update=0.28, update=update)
    values.update(changes)
    return values


def test_flat_rows_hold_every_bound():
    assert soak.check([row(100), row(200), row(2000)]) == []


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"rss_mb": 600.0}, "rss_mb"),
        ({"fds": 12}, "fds"),
        ({"objects": 5e5}, "objects"),
        ({"run_dir_mb": 1.2}, "run_dir_mb"),
        ({"cpu_s_per_update": 0.6}, "cpu_s_per_update"),
        ({"metrics_kb": 200 + 1800 * 5.0}, "metrics.jsonl"),
    ],
)
def test_growth_past_a_bound_is_reported_against_the_warm_up_row(changes, name):
    failures = soak.check([row(100, rss_mb=100.0), row(200), row(2000, **changes)])
    assert len(failures) == 1 and failures[0].startswith(name)


@pytest.mark.slow
def test_the_script_prints_a_row_per_interval_and_its_verdict():
    result = run_script("soak.py", "--updates", "20", "--every", "10", timeout=600, ok=(0, 1))
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "update", "rss_mb", "fds", "objects", "run_dir_mb", "metrics_kb", "s_per_update",
        "cpu_s_per_update",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:3]] == ["10", "20"]
    assert "2 rows over 20 updates" in result.stdout and "bounds (last row vs" in result.stdout
