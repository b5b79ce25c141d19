"""`benchmarks/main_job_speed.py` end to end with the tiny model: both arms in one process."""

import re

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_both_arms_play_timed_updates_and_are_compared(tiny_dir):
    args = ["--model", tiny_dir, "--updates", "1", "--num-envs", "2"]
    lines = run_script("main_job_speed.py", *args, timeout=600).stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("arm "))
    table = [line.split() for line in lines[header + 1 : header + 3]]
    assert [row[0] for row in table] == ["before", "now"]
    assert all(int(float(row[4])) > 0 for row in table)  # turns played in the timed update
    assert float(table[1][2]) == 0.0  # no scoring pass "now": the update scores its own turns
    ratio = next(line for line in lines if line.startswith("now / before:"))
    assert re.match(r"now / before: [\d.]+x turns/s", ratio)
