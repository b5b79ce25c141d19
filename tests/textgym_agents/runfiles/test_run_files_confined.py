"""Run files stay inside their run directory: no write through a link, no read outside it."""

from __future__ import annotations

import json

import pytest
import torch

from textgym_agents.exceptions import CheckpointError, RunFileError
from textgym_agents.runfiles.atomic import atomic_write_json
from textgym_agents.runfiles.checkpoint import MANIFEST, checkpoint_damage, save_checkpoint
from textgym_agents.runfiles.integrity import confined, file_listing, find_damage
from textgym_agents.runfiles.run_lock import RunLock
from textgym_agents.tracking.metrics_log import MetricsLogger


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.lock").symlink_to(target)
    with pytest.raises(RunFileError, match="train.lock is a symbolic link"):
        RunLock(run).acquire()
    assert target.read_text() == "keep me\n"


def test_a_symlinked_metrics_file_is_refused_and_its_torn_target_untouched(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"step": 1}\n{"step": 2, "to')  # a torn last line: resume would cut it
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(target)
    with pytest.raises(RunFileError, match="metrics.jsonl is a symbolic link"):
        MetricsLogger(run)
    assert target.read_text() == '{"step": 1}\n{"step": 2, "to'


def test_a_torn_last_metrics_line_is_still_dropped_in_a_regular_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 0}\n{"step": 2, "ti')
    with MetricsLogger(tmp_path) as logger:
        logger.log({"x": 1.0}, step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_the_cli_refuses_a_run_directory_with_a_symlinked_lock(tmp_path, capsys):
    from textgym.cli import main

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.lock").symlink_to(target)
    args = ["train", "textgym/Blackjack-v1", "--episodes", "2", "--output", str(tmp_path / "run")]
    assert main(args) == 1
    assert "train.lock is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "a/../../outside.bin", ""])
def test_confined_rejects_names_that_leave_the_directory(tmp_path, name):
    assert confined(tmp_path / "policy", name) is None


def outside_listing(tmp_path, name, matching):
    """A listing naming a file outside the directory, with its true hash or a wrong one."""
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"a secret")
    entry = file_listing(tmp_path, exclude={"policy"})["outside.bin"]
    if not matching:
        entry = {**entry, "sha256": "0" * 64}
    return {name: entry}


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_listing_cannot_make_the_check_read_a_file_outside(tmp_path, how):
    policy = tmp_path / "policy"
    policy.mkdir()
    name = {"dotdot": "../outside.bin", "absolute": str(tmp_path / "outside.bin")}.get(how)
    if how == "symlink":
        (policy / "link.bin").symlink_to(tmp_path / "outside.bin")
        name = "link.bin"
    # The same answer whether the outside file matches or not: no oracle for its contents.
    answers = {find_damage(policy, outside_listing(tmp_path, name, m)) for m in (True, False)}
    assert len(answers) == 1
    (answer,) = answers
    assert answer is not None and "not a file inside" in answer


def test_a_checkpoint_manifest_naming_files_outside_is_damaged(tmp_path):
    path = save_checkpoint(tmp_path, 1, tensors={"model": {"w": torch.ones(4)}})
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["tensors"] = ["../../elsewhere"]
    atomic_write_json(path / MANIFEST, manifest)
    assert "not a file inside" in checkpoint_damage(path)
    manifest["tensors"], manifest["files"] = ["model"], outside_listing(tmp_path, "../x", True)
    atomic_write_json(path / MANIFEST, manifest)
    assert "not a file inside" in checkpoint_damage(path)


def test_loading_a_policy_whose_listing_leaves_its_directory_is_refused(tmp_path):
    from textgym_agents.runfiles.policy_files import FILES_MANIFEST, load_policy_parts

    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text("{}")
    listing = outside_listing(tmp_path, "../outside.bin", True)
    atomic_write_json(policy / FILES_MANIFEST, {"format": 1, "files": listing})
    with pytest.raises(CheckpointError, match="not a file inside"):
        load_policy_parts(policy)
