"""Damaged checkpoints, a second process on a live run, torn metrics and a full disk: real runs.

Each test damages the files of a real (tiny-model) run the way the world does — truncation, a
changed byte, a deleted file, a writer killed mid-line, ``ENOSPC`` from the writer — and checks
that training and loading say what is wrong and go on from what is intact.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest
import safetensors.torch
import torch

import textgym  # noqa: F401
from textgym.cli import main
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.exceptions import CheckpointError, CheckpointWriteError, RunLockedError
from textgym_agents.runfiles.checkpoint import (
    checkpoint_damage,
    latest_checkpoint,
    list_checkpoints,
)
from textgym_agents.tracking.metrics_log import read_metrics

CONFIG = dict(
    num_steps=2,
    max_new_tokens=4,
    minibatch_size=4,
    micro_batch_size=4,
    save_every=1,
    keep_checkpoints=3,
    progress=False,
    seed=1,
)
MANY = 10**6


def trainer(tiny_dir, run):
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(tiny_dir, config=PPOConfig(**CONFIG))
    return PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", 2), output_dir=run)


def stop_at(update):
    return lambda metrics: False if metrics["train/update"] >= update else None


def truncate(path, size=10):
    with open(path, "r+b") as f:
        f.truncate(size)


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def run(tiny_dir, tmp_path):
    """A run directory with the checkpoints of updates 1, 2 and 3 and a final policy."""
    trainer(tiny_dir, tmp_path / "run").train(MANY, callback=stop_at(3))
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == [
        f"step_{n:08d}" for n in (1, 2, 3)
    ]
    return tmp_path / "run"


# --- damaged checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: truncate(c / "optimizer.safetensors"), "optimizer.safetensors is 10 bytes"),
        pytest.param(
            lambda c: flip_a_byte(c / "adapter" / "adapter_model.safetensors"),
            "adapter/adapter_model.safetensors does not match its SHA-256",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda c: (c / "trainer_state.json").unlink(),
            "trainer_state.json is missing",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda c: (c / "checkpoint.json").unlink(),
            "checkpoint.json is missing",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["truncated", "bit-rot", "deleted-file", "no-manifest"],
)
@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint_for_the_newest_intact(
    tiny_dir, run, caplog, damage, reason
):
    newest = latest_checkpoint(run)
    damage(newest)
    with caplog.at_level(logging.WARNING):
        found = latest_checkpoint(run)
    assert found.name == "step_00000002"
    assert f"Skipping damaged checkpoint {newest}: {reason}" in caplog.text
    resumed = trainer(tiny_dir, run)
    resumed.train(MANY, resume_from=run, callback=stop_at(4))
    assert resumed.update_step == 4
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]  # update 3 was redone
    assert checkpoint_damage(latest_checkpoint(run)) is None


def test_no_intact_checkpoint_is_one_clear_error_naming_the_directory(tiny_dir, run, capsys):
    for checkpoint in list_checkpoints(run):
        truncate(checkpoint / "rng.safetensors")
    with pytest.raises(CheckpointError, match=f"No intact checkpoint in {run / 'checkpoints'}"):
        trainer(tiny_dir, run).train(MANY, resume_from=run)
    assert main(["train", "--resume", str(run)]) == 1
    assert "--resume: No intact checkpoint in" in capsys.readouterr().err


@pytest.mark.slow
def test_an_explicitly_named_damaged_checkpoint_is_refused_not_replaced(tiny_dir, run):
    newest = latest_checkpoint(run)
    truncate(newest / "value_head.safetensors")
    with pytest.raises(CheckpointError, match=f"{newest} is damaged: value_head.safetensors"):
        trainer(tiny_dir, run).train(MANY, resume_from=newest)


@pytest.mark.parametrize("where", ["final", "checkpoint"])
@pytest.mark.slow
def test_loading_a_damaged_policy_names_the_file(run, where):
    path = run / "final" if where == "final" else latest_checkpoint(run)
    PPOPolicy.load(path)  # intact: loads
    flip_a_byte(path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(CheckpointError, match="adapter/adapter_model.safetensors does not match"):
        PPOPolicy.load(path)


def test_a_policy_without_a_listing_still_gets_a_clear_error(run):
    (run / "final" / "files.json").unlink()  # as saved before listings existed
    truncate(run / "final" / "value_head.safetensors")
    with pytest.raises(CheckpointError, match="cannot be read"):
        PPOPolicy.load(run / "final")


# --- two processes, one run directory -----------------------------------------------------------

CHILD = """
import sys, gymnasium as gym, textgym
from textgym_agents import PPOConfig, PPOPolicy
config = PPOConfig(num_steps=2, max_new_tokens=4, minibatch_size=4, micro_batch_size=4,
                   save_every=1, progress=False, seed=1)
policy = PPOPolicy.from_pretrained(sys.argv[1], config=config)
policy.learn(gym.make_vec("textgym/Blackjack-v1", 2), 10**6, output_dir=sys.argv[2])
"""


@pytest.mark.slow
def test_a_second_writer_of_a_live_run_is_refused(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, str(script), tiny_dir, str(run)], env=env)
    try:
        while not list_checkpoints(run):  # it has written its first checkpoint
            assert child.poll() is None
        with pytest.raises(RunLockedError, match=f"pid {child.pid} on "):
            trainer(tiny_dir, run).train(MANY, resume_from=run)
        args = ["train", "--model", tiny_dir, "--resume", str(run), "--no-progress"]
        assert main(args) == 1  # the CLI stops before it evaluates or loads anything
        assert f"is being written by another training process (pid {child.pid}" in (
            capsys.readouterr().err
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # The killed writer's lock is stale: the run can be resumed (its lock file named it).
    resumed = trainer(tiny_dir, run)
    resumed.train(MANY, resume_from=run, callback=stop_at(1))  # one update after the resume
    assert resumed.update_step >= 2


# --- a writer killed mid-line -------------------------------------------------------------------

TORN = """
import os, signal, sys
from textgym_agents.tracking.metrics_log import MetricsLogger
logger = MetricsLogger(sys.argv[1])
for step in (1, 2, 3):
    logger.log({"env/return_mean": step / 10, "env/invalid_rate": 0.0}, step=step)
logger._file.flush() if hasattr(logger, "_file") else None
with open(os.path.join(sys.argv[1], "metrics.jsonl"), "a") as f:
    f.write('{"step": 4, "env/return_me')  # the line a kill interrupts
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_metrics_line_torn_by_kill_9_is_skipped_by_plot_and_repaired_by_resume(
    tiny_dir, run, tmp_path, caplog
):
    torn = tmp_path / "torn"
    script = tmp_path / "torn.py"
    script.write_text(textwrap.dedent(TORN))
    assert subprocess.run([sys.executable, str(script), str(torn)]).returncode == -9
    assert (torn / "metrics.jsonl").read_text().endswith('"env/return_me')
    assert main(["plot", str(torn), "--output", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert [r["step"] for r in read_metrics(torn)] == [1, 2, 3]
    # The same in a real run: resume drops the torn line and appends after it.
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "env/ret')
    with caplog.at_level(logging.WARNING):
        trainer(tiny_dir, run).train(MANY, resume_from=run, callback=stop_at(4))
    assert "truncated last line" in caplog.text
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def disk_full_at_step(monkeypatch):
    """Make the safetensors writer fail with ENOSPC half-way through checkpoint ``step``."""
    real = safetensors.torch.save_file
    state = {"step": None, "failures": 0, "library": False}

    def save_file(tensors, filename, metadata=None):
        if f"step_{state['step']:08d}" in str(filename):
            with open(filename, "wb") as f:
                f.write(b"\0" * 100)  # what fitted on the disk
            state["failures"] += 1
            if state["library"]:  # what safetensors itself raises: not an OSError
                text = "Error while serializing: I/O error: No space left on device (os error 28)"
                raise safetensors.SafetensorError(text)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filename))
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    return state


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_checkpoint_and_stops_cleanly(
    tiny_dir, tmp_path, caplog, disk_full_at_step
):
    run = tmp_path / "run"
    disk_full_at_step["step"] = 3
    with caplog.at_level(logging.ERROR), pytest.raises(CheckpointWriteError) as stop:
        trainer(tiny_dir, run).train(MANY, callback=stop_at(5))
    assert stop.value.errno == errno.ENOSPC
    assert "No space left on device" in str(stop.value)
    assert "newest complete checkpoint is step_00000002" in str(stop.value)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "Could not write" in errors[0].getMessage()
    assert disk_full_at_step["failures"] == 1  # no second attempt on a full disk
    assert [p.name for p in list_checkpoints(run)] == ["step_00000001", "step_00000002"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_00000001",
        "step_00000002",
    ]  # no temp directory left behind
    assert checkpoint_damage(latest_checkpoint(run)) is None
    disk_full_at_step["step"] = -1  # space freed: resume
    resumed = trainer(tiny_dir, run)
    resumed.train(MANY, resume_from=run, callback=stop_at(3))
    assert resumed.update_step == 3


@pytest.mark.parametrize("library", [False, True], ids=["oserror", "safetensors-error"])
def test_the_cli_exits_74_on_a_full_disk(tiny_dir, tmp_path, capsys, disk_full_at_step, library):
    disk_full_at_step.update(step=1, library=library)
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, "--episodes", "8"]
    args += ["--eval-episodes", "0", "--num-envs", "2", "--num-steps", "2", "--no-progress"]
    assert main([*args, "--save-every", "1", "--output", str(tmp_path / "run")]) == 74
    err = capsys.readouterr().err
    assert "error: Could not write" in err and "No space left on device" in err
    assert json.loads((tmp_path / "run" / "cli.json").read_text())["episodes"] == 8
    assert disk_full_at_step["failures"] == 1  # one save attempt, none after the failure
