"""`benchmarks/calculator_prompts.py` end to end with the tiny model."""

import json

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_each_variant_is_played_greedy_and_sampled_on_the_same_questions(tiny_dir):
    args = ["--model", tiny_dir, "--variants", "json,both-no-example", "--episodes", "3"]
    result = run_script("calculator_prompts.py", *args, "--dtype", "float32", timeout=600)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [row["variant"] for row in rows] == ["json", "both-no-example"]
    for row in rows:
        for mode in ("greedy", "sampled"):
            rate = row[mode]["success"]
            assert rate in (0, 1 / 3, 2 / 3, 1)
            assert row[mode]["success_se"] == pytest.approx((rate * (1 - rate) / 3) ** 0.5)


@pytest.mark.slow
def test_an_unknown_variant_is_refused():
    result = run_script("calculator_prompts.py", "--variants", "json,xml", ok=(2,))
    assert "unknown variants ['xml']" in result.stderr
