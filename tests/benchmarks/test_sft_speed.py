"""`benchmarks/sft_speed.py` end to end with the tiny model."""

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_each_precision_is_trained_timed_and_scored(tiny_dir):
    args = ["--model", tiny_dir, "--demo-hands", "12", "--epochs", "1", "--arms", "float32,mixed"]
    lines = run_script("sft_speed.py", *args, timeout=900).stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("arm"))
    table = lines[header + 1 :]
    assert [row.split(",")[0].split()[0] for row in table] == ["float32", "bf16"]
    assert "1.00x" in table[0]
    exact = [float(row.split()[-2]) for row in table]
    # a greedy Blackjack table's exact return lies between always-bust and always-win
    assert all(-1.0 < value < 1.0 for value in exact)


@pytest.mark.slow
def test_unknown_arms_are_refused(tiny_dir):
    result = run_script("sft_speed.py", "--arms", "fp8", ok=(2,), timeout=120)
    assert "unknown arms ['fp8']" in result.stderr
