"""`benchmarks/main_job_memory.py` end to end with the tiny model: one process per arm."""

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_each_arm_runs_in_its_own_process_and_is_compared(tiny_dir):
    args = ["--model", tiny_dir, "--updates", "1", "--arms", "onednn-1024,now"]
    result = run_script("main_job_memory.py", *args, timeout=600)
    lines = result.stdout.splitlines()
    assert "'capacity': '1024'" in next(line for line in lines if line.startswith("onednn-1024:"))
    header = next(i for i, line in enumerate(lines) if line.startswith("arm "))
    table = lines[header + 1 : header + 3]
    assert [row.split()[0] for row in table] == ["onednn-1024", "now"]
    assert "peak 1.00x, loop time 1.00x" in table[0]
    assert table[1].split()[1] != "1024"
    # lean activations and the kernel cache change no result: the same turns in both arms
    assert table[0].split()[2] == table[1].split()[2]


def test_an_unknown_arm_is_refused():
    result = run_script("main_job_memory.py", "--arms", "now,fastest", ok=(2,))
    assert "unknown arms ['fastest']" in result.stderr
