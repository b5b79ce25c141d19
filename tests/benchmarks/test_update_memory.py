"""`benchmarks/update_memory.py` end to end with the tiny model: one process per layout."""

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_each_layout_runs_in_its_own_process_and_is_compared(tiny_dir):
    args = ["--model", tiny_dir, "--num-envs", "2", "--layouts", "8:none,8:64"]
    result = run_script("update_memory.py", *args, timeout=600)
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("micro_batch_size"))
    table = lines[header + 1 :]
    assert [row.split()[0] for row in table] == ["8:none", "8:64"]
    assert "(1.00x, 1.00x)" in table[0]
    # the token bound splits the same turns into more passes
    first, second = (row.split()[2] for row in table)
    assert sum(map(int, first.split(","))) == sum(map(int, second.split(",")))
    assert len(second.split(",")) > len(first.split(","))
