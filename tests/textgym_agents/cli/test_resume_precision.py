"""``textgym train --resume`` continues in the run's own precision, whatever "auto" picks here."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from textgym.cli import main

QUICK = ["--num-envs", "2", "--num-steps", "2", "--eval-episodes", "0", "--no-progress"]


def adapter(run):
    return load_file(str(run / "final" / "adapter" / "adapter_model.safetensors"))


# One of the two differs from what "auto" picks on any machine, so one case fails if the saved
# precision were ignored (as it was: resume then trained in this machine's "auto" choice).
# Three tiny runs each (bfloat16 is emulated, and slow, on CPUs without it): the slow tier.
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_without_dtype_keeps_the_runs_precision_bit_for_bit(
    tiny_dir, tmp_path, capsys, dtype
):
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, *QUICK, "--save-every", "1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main([*args, "--dtype", dtype, "--episodes", "8", "--output", str(straight)]) == 0
    assert main([*args, "--dtype", dtype, "--episodes", "4", "--output", str(split)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(split), "--episodes", "8"]) == 0  # no --dtype
    assert f"Precision: {dtype}" in capsys.readouterr().out
    assert json.loads((split / "config.json").read_text())["base"]["dtype"] == dtype
    a, b = adapter(straight), adapter(split)
    assert a.keys() == b.keys()
    assert all(a[key].dtype == b[key].dtype and a[key].equal(b[key]) for key in a)


def test_a_dtype_flag_against_the_run_warns_that_it_will_differ(tiny_dir, tmp_path, capsys):
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, *QUICK, "--save-every", "1"]
    run = tmp_path / "run"
    assert main([*args, "--dtype", "float32", "--episodes", "2", "--output", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--episodes", "2", "--dtype", "bfloat16"]) == 0
    err = capsys.readouterr().err
    assert "--dtype bfloat16 overrides the resumed run's float32" in err
