"""A shared run directory, dataset or saved policy is data: nothing in it is imported or run.

Each test plants a harmless marker module's name (the ``code_marker`` fixture) where a hostile
run directory would put code — the recorded env spec of ``policy.json``, ``cli.json``'s env
arguments — and runs each entry point that reads it: nothing is imported without
``--trust-run`` / ``trust_code=True``, and the error names what was refused.
"""

from __future__ import annotations

import json
import shutil

import pytest

from textgym.cli import main
from textgym.trust import UntrustedCodeError
from textgym_agents import PPOPolicy
from textgym_agents.runfiles.atomic import atomic_write_json
from textgym_agents.runfiles.integrity import file_listing
from textgym_agents.runfiles.policy_files import FILES_MANIFEST

ENTRY_POINT = "textgym_code_marker:planted"
FORMATTER = "textgym_code_marker:Planted"
QUICK = ["--num-envs", "2", "--num-steps", "2", "--eval-episodes", "0", "--no-progress"]


@pytest.fixture(scope="module")
def finished_run(tiny_dir, tmp_path_factory):
    """A finished tiny-model Blackjack run with a checkpoint per update and a final policy."""
    run = tmp_path_factory.mktemp("finished") / "run"
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, "--episodes", "4", *QUICK]
    assert main([*args, "--save-every", "1", "--output", str(run)]) == 0
    return run


@pytest.fixture
def run(finished_run, tmp_path):
    """A copy of the finished run, to plant things in."""
    return shutil.copytree(finished_run, tmp_path / "run")


def plant_entry_point(policy_dir):
    """Point the env record of a saved policy at the marker, and re-list its files.

    The listing is a check against damage, not a signature: whoever edits a policy can
    rewrite it, so the plant passes the integrity check and reaches the trust check.
    """
    info = json.loads((policy_dir / "policy.json").read_text())
    spec = json.loads(info["env"]["spec"])
    spec["entry_point"] = ENTRY_POINT
    info["env"]["spec"] = json.dumps(spec)
    atomic_write_json(policy_dir / "policy.json", info)
    listing = file_listing(policy_dir, exclude={FILES_MANIFEST})
    atomic_write_json(policy_dir / FILES_MANIFEST, {"format": 1, "files": listing})


def plant_env_args(directory, env="textgym/Blackjack-v1"):
    """Name the marker as the formatter in ``cli.json`` (created if missing)."""
    file = directory / "cli.json"
    info = json.loads(file.read_text()) if file.exists() else {}
    info.update(env=env, env_args={"formatter": FORMATTER})
    file.write_text(json.dumps(info))


def refused(capsys, named):
    err = capsys.readouterr().err
    assert named in err and "--trust-run" in err, err
    return err


def test_eval_refuses_a_policy_whose_env_record_names_unknown_code(run, capsys, code_marker):
    plant_entry_point(run / "final")
    assert main(["eval", str(run), "--episodes", "1"]) == 1
    refused(capsys, ENTRY_POINT)
    assert not code_marker.exists()
    # opted in: the record is built (the marker runs, fails, and eval falls back to cli.json)
    assert main(["eval", str(run), "--episodes", "1", "--trust-run"]) == 0
    assert "called" in code_marker.read_text()


def test_eval_refuses_run_info_that_names_unknown_code(run, capsys, code_marker):
    for directory in (run, run / "final"):  # no spec recorded: eval falls back to cli.json
        file = directory / ("policy.json" if directory.name == "final" else "config.json")
        info = json.loads(file.read_text())
        info["env"] = {"id": "textgym/Blackjack-v1", "spec": None, "spec_error": "none"}
        atomic_write_json(file, info)
    listing = file_listing(run / "final", exclude={FILES_MANIFEST})
    atomic_write_json(run / "final" / FILES_MANIFEST, {"format": 1, "files": listing})
    plant_env_args(run)
    assert main(["eval", str(run), "--episodes", "1"]) == 1
    refused(capsys, FORMATTER)
    assert not code_marker.exists()


def test_resume_refuses_run_info_that_names_unknown_code(run, capsys, code_marker):
    plant_env_args(run)
    assert main(["train", "--resume", str(run), "--episodes", "6"]) == 1
    err = refused(capsys, FORMATTER)
    assert "cli.json" in err
    assert not code_marker.exists()


def test_resume_refuses_an_unregistered_env_id(run, capsys, code_marker):
    plant_env_args(run, env="textgym_code_marker:Env-v0")
    assert main(["train", "--resume", str(run), "--episodes", "6"]) == 1
    refused(capsys, "the env id 'textgym_code_marker:Env-v0' (not registered here)")
    assert not code_marker.exists()


def test_a_warm_start_dataset_that_names_unknown_code_is_refused(
    tiny_dir, tmp_path, capsys, code_marker
):
    data = tmp_path / "data"
    data.mkdir()
    plant_env_args(data)
    args = ["train", "--sft-data", str(data), "--model", tiny_dir, *QUICK]
    assert main([*args, "--output", str(tmp_path / "out")]) == 1
    refused(capsys, FORMATTER)
    assert main(["sft", str(data), "--model", tiny_dir, "--output", str(tmp_path / "o2")]) == 1
    refused(capsys, FORMATTER)
    assert not code_marker.exists()


def test_ppo_policy_load_refuses_a_record_naming_unknown_code(run, code_marker):
    plant_entry_point(run / "final")
    with pytest.raises(UntrustedCodeError, match="textgym_code_marker:planted") as error:
        PPOPolicy.load(run / "final")
    assert "trust_code=True" in str(error.value)
    policy = PPOPolicy.load(run / "final", trust_code=True)  # loading builds no env
    assert json.loads(policy.trained_env["spec"])["entry_point"] == ENTRY_POINT
    assert not code_marker.exists()


@pytest.mark.parametrize("command", ["play", "record"])
def test_play_and_record_refuse_a_policy_naming_unknown_code(
    command, run, tmp_path, capsys, code_marker
):
    args = [command, "--policy", str(run), "--episodes", "1"]
    if command == "record":
        args += ["--output", str(tmp_path / "data")]
    plant_env_args(run)
    assert main(args) == 1
    refused(capsys, FORMATTER)
    info = json.loads((run / "cli.json").read_text())
    info["env_args"] = {}
    (run / "cli.json").write_text(json.dumps(info))
    plant_entry_point(run / "final")
    assert main(args) == 1
    refused(capsys, ENTRY_POINT)
    assert not code_marker.exists()


def test_a_corrupt_config_json_stops_resume_with_an_error_naming_it(run, capsys):
    (run / "config.json").write_text('{"ppo": {"seed": 3, "save_')
    assert main(["train", "--resume", str(run), "--episodes", "6"]) == 1
    err = capsys.readouterr().err
    assert "config.json is unreadable" in err and str(run) in err
    assert (run / "config.json").read_text() == '{"ppo": {"seed": 3, "save_'  # not rewritten


def test_a_corrupt_cli_json_is_an_error_naming_it(run, capsys):
    (run / "cli.json").write_text("[1, 2")
    assert main(["train", "--resume", str(run), "--episodes", "6"]) == 1
    assert "cli.json is unreadable" in capsys.readouterr().err
