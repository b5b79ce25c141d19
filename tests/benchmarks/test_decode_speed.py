"""`benchmarks/decode_speed.py` end to end with the tiny model."""

import re

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_the_arms_are_compared_with_the_measured_bound(tiny_dir):
    args = ["--model", tiny_dir, "--tokens", "4", "--batches", "1", "2", "--rounds", "1"]
    lines = run_script("decode_speed.py", *args, "--context", "2", timeout=300).stdout.splitlines()
    bound = next(line for line in lines if "read bandwidth" in line)
    assert float(re.search(r"bound ([\d.]+) decode steps/s", bound).group(1)) > 0
    rows = [line.split()[0] for line in lines if "of the batch-1 bound" in line]
    assert rows == ["policy", "generate()", "plain", "matmuls"] * 2  # every arm, both batches
    tokens = int(re.search(r"prompt: (\d+) tokens", "\n".join(lines)).group(1))
    assert tokens > 2 * 17  # two sentences of context before the request
    plain = [line for line in lines if line.strip().startswith("plain HF")]
    assert all("(4 steps)" in line for line in plain)  # EOS suppressed: exactly --tokens
    assert all("steps/s with the prompt's pass" in line for line in lines if "bound;" in line)
    verdicts = [line for line in lines if line.startswith("  policy at batch")]
    assert [line.split(":")[0].split()[-1] for line in verdicts] == ["1", "2"]
    floors = [line for line in lines if "policy / matrix products alone" in line]
    assert len(floors) == 2
    assert all(re.search(r"alone: \d+\.\d\d \(target >= 0.8: (met|MISSED)\)", f) for f in floors)


@pytest.mark.slow
def test_dtype_is_a_choice(tiny_dir):
    args = ["--model", tiny_dir, "--tokens", "2", "--batches", "1", "--rounds", "1"]
    lines = run_script("decode_speed.py", *args, "--dtype", "bfloat16", timeout=300)
    assert lines.stdout.startswith("torch.bfloat16, 1 threads")
