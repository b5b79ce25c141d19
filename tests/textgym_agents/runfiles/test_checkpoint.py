from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import textgym_agents
from textgym_agents.runfiles.atomic import atomic_write_json, load_tensors, save_tensors
from textgym_agents.runfiles.checkpoint import (
    discard_checkpoints_after,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    optimizer_state_from_files,
    optimizer_state_to_files,
    rng_state,
    save_checkpoint,
    set_rng_state,
    state_from_files,
    state_to_files,
)

REPO_ROOT = Path(textgym_agents.__file__).resolve().parents[1]
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


def _save(run, step, **kwargs):
    kwargs.setdefault("tensors", {"model": {"w": torch.full((4,), float(step))}})
    kwargs.setdefault("json_files", {"trainer": {"step": step}})
    return save_checkpoint(run, step, **kwargs)


def _assert_consistent(path: Path) -> int:
    tensors, jsons = load_checkpoint(path)
    step = int(path.name.removeprefix("step_"))
    assert jsons["trainer"]["step"] == step
    assert torch.all(tensors["model"]["w"] == float(step))
    return step


# --- state flattening: optimizer, RNG ----------------------------------------------------------


def _train(params, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum((p * torch.randn(p.shape, generator=gen)).sum() ** 2 for p in params)
        loss.backward()
        opt.step()


def test_adamw_round_trip_through_files_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    params_a = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    groups = [
        {"params": [params_a[0]], "lr": 1e-2, "betas": (0.8, 0.99)},
        {"params": [params_a[1]], "lr": 3e-3, "amsgrad": True, "weight_decay": 0.1},
    ]
    opt_a = torch.optim.AdamW(groups)
    _train(params_a, opt_a, steps=3, seed=1)

    tensors, meta = optimizer_state_to_files(opt_a.state_dict())
    assert {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step"} <= set(tensors)
    save_tensors(tmp_path / "opt.safetensors", tensors)
    atomic_write_json(tmp_path / "opt.json", meta)

    params_b = [torch.nn.Parameter(p.detach().clone()) for p in params_a]
    opt_b = torch.optim.AdamW(
        [{"params": [params_b[0]]}, {"params": [params_b[1]], "amsgrad": True}], lr=0.5
    )
    restored = optimizer_state_from_files(
        load_tensors(tmp_path / "opt.safetensors"), json.loads((tmp_path / "opt.json").read_text())
    )
    opt_b.load_state_dict(restored)
    assert opt_b.param_groups[0]["betas"] == (0.8, 0.99)
    assert opt_b.param_groups[1]["lr"] == 3e-3

    _train(params_a, opt_a, steps=4, seed=2)
    _train(params_b, opt_b, steps=4, seed=2)
    for a, b in zip(params_a, params_b, strict=True):
        assert torch.equal(a, b)


def test_optimizer_state_to_files_rejects_other_dicts():
    with pytest.raises(ValueError, match=r"with 'state' and 'param_groups', got keys \['w'\]"):
        optimizer_state_to_files({"w": torch.ones(1)})


def test_state_round_trip_keeps_types():
    state = {
        "tuple": (1, (2.5, None)),
        3: "int key",
        "__tensor__": "a key that looks like a tag",
        "a.b": torch.ones(2),
        "a": {"b": torch.zeros(2)},
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "empty": np.zeros((0, 3)),
        "np": np.float64(0.25),
        "inf": float("inf"),
    }
    tensors, meta = state_to_files(state)
    assert len(tensors) == 2  # the colliding "a.b" paths got distinct names
    restored = state_from_files(tensors, json.loads(json.dumps(meta)))
    assert restored["tuple"] == (1, (2.5, None)) and restored[3] == "int key"
    assert restored["__tensor__"] == "a key that looks like a tag"
    assert torch.equal(restored["a.b"], torch.ones(2))
    assert torch.equal(restored["a"]["b"], torch.zeros(2))
    assert restored["array"].dtype == np.uint32 and np.array_equal(
        restored["array"], state["array"]
    )
    assert restored["empty"].shape == (0, 3)
    assert restored["np"] == 0.25 and restored["inf"] == float("inf")


def test_state_to_files_refuses_objects_that_need_pickle():
    with pytest.raises(TypeError, match="Cannot store object at 'opt.x' without pickle"):
        state_to_files({"opt": {"x": object()}})


def _draw():
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), np.random.randn()


def test_rng_round_trip_through_files(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    tensors, meta = rng_state()
    save_tensors(tmp_path / "rng.safetensors", tensors)
    atomic_write_json(tmp_path / "rng.json", meta)
    expected = _draw()
    _draw()  # move every generator on
    set_rng_state(
        load_tensors(tmp_path / "rng.safetensors"), json.loads((tmp_path / "rng.json").read_text())
    )
    assert _draw() == expected


# --- checkpoints --------------------------------------------------------------------------------


def test_save_checkpoint_layout_is_pickle_free(tmp_path):
    def extra(tmp: Path) -> None:
        (tmp / "policy").mkdir()
        (tmp / "policy" / "adapter_config.json").write_text("{}")

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))])
    opt_tensors, opt_meta = optimizer_state_to_files(opt.state_dict())
    rng_tensors, rng_meta = rng_state()
    path = save_checkpoint(
        tmp_path,
        12,
        tensors={"optimizer": opt_tensors, "rng": rng_tensors, "value_head": {"w": torch.ones(2)}},
        json_files={"optimizer": opt_meta, "rng": rng_meta, "trainer": {"step": 12}},
        extra=extra,
    )
    assert path == tmp_path / "checkpoints" / "step_00000012"
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert files == [
        "checkpoint.json",
        "optimizer.json",
        "optimizer.safetensors",
        "policy/adapter_config.json",
        "rng.json",
        "rng.safetensors",
        "trainer.json",
        "value_head.safetensors",
    ]
    for file in path.rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            assert not data.startswith(b"\x80"), f"{file} looks like a pickle"
            assert b"torch._utils" not in data and b"cnumpy" not in data
            if file.suffix == ".json":
                json.loads(data)
    manifest = json.loads((path / "checkpoint.json").read_text())
    listing = manifest.pop("files")
    assert manifest == {
        "step": 12,
        "tensors": ["optimizer", "rng", "value_head"],
        "json": ["optimizer", "rng", "trainer"],
    }
    files = sorted(f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file())
    assert sorted(listing) == [name for name in files if name != "checkpoint.json"]
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in listing.values())
    tensors, jsons = load_checkpoint(path)
    assert set(tensors) == {"optimizer", "rng", "value_head"}
    assert jsons["trainer"] == {"step": 12}
    set_rng_state(tensors["rng"], jsons["rng"])


def test_keep_prunes_oldest_and_never_the_new_one(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    _save(tmp_path, 2, keep=1)  # an older step saved after later ones is still kept
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000004"]
    for step in (5, 6):
        _save(tmp_path, step, keep=None)
    assert len(list_checkpoints(tmp_path)) == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        p.name for p in list_checkpoints(tmp_path)
    ]


def test_resave_same_step_replaces_it(tmp_path):
    _save(tmp_path, 5)
    _save(tmp_path, 5, json_files={"trainer": {"step": 5, "again": True}})
    _, jsons = load_checkpoint(latest_checkpoint(tmp_path))
    assert jsons["trainer"] == {"step": 5, "again": True}
    assert len(list((tmp_path / "checkpoints").iterdir())) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"step": -1}, ValueError, "Expected a non-negative int step, got -1"),
        ({"step": 1.0}, ValueError, "Expected a non-negative int step, got 1.0"),
        ({"keep": 0}, ValueError, r"Expected keep >= 1 or None \(keep all\), got 0"),
        ({"tensors": {"a/b": {}}}, ValueError, r"tensors names must match .* got 'a/b'"),
        ({"json_files": {".hidden": {}}}, ValueError, "json_files names must match"),
        ({"json_files": {"checkpoint": {}}}, ValueError, "name 'checkpoint' is reserved"),
    ],
)
def test_save_checkpoint_validates_arguments(tmp_path, kwargs, error, message):
    step = kwargs.pop("step", 1)
    with pytest.raises(error, match=message):
        save_checkpoint(tmp_path, step, **kwargs)
    assert latest_checkpoint(tmp_path) is None


def test_latest_checkpoint_ignores_incomplete_dirs(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    _save(tmp_path, 3)
    ckpts = tmp_path / "checkpoints"
    for name in ("step_00000009.tmp-abc", "step_00000009.old-abc", "step_00000008", "step_9"):
        (ckpts / name).mkdir()  # no manifest, or not a step name
    (ckpts / "step_00000009.tmp-abc" / "checkpoint.json").write_text("{}")
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    _save(tmp_path, 4)  # cleans the leftovers of crashed saves, not unrelated dirs
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "step_00000003",
        "step_00000004",
        "step_00000008",
        "step_9",
    ]


def test_exception_in_extra_keeps_previous_checkpoint(tmp_path):
    _save(tmp_path, 1)

    def extra(tmp: Path) -> None:
        raise RuntimeError("adapter save failed")

    with pytest.raises(RuntimeError, match="adapter save failed"):
        _save(tmp_path, 2, extra=extra)
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000001"]


def test_discard_checkpoints_after(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    removed = discard_checkpoints_after(tmp_path, 1)
    assert [p.name for p in removed] == ["step_00000002", "step_00000003"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]


def test_load_checkpoint_requires_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a complete checkpoint: checkpoint.json"):
        load_checkpoint(tmp_path)


# --- crashes: SIGKILL in a child process --------------------------------------------------------

CHILD = """
import os, signal, sys, torch
from textgym_agents.runfiles.checkpoint import latest_checkpoint, save_checkpoint

run, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])

def save(step, **kwargs):
    return save_checkpoint(
        run, step, tensors={"model": {"w": torch.full((size,), float(step))}},
        json_files={"trainer": {"step": step}}, **kwargs)

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "in_extra":
    save(1); save(2, extra=die)
elif mode == "between_renames":
    save(1); save(2)
    real_rename = os.rename
    def rename(src, dst):
        real_rename(src, dst)
        if ".old-" in os.fspath(dst):
            die()
    os.rename = rename
    save(2)
else:  # loop: keep saving until killed, resuming after the latest checkpoint
    latest = latest_checkpoint(run)
    first = step = int(latest.name[5:]) + 1 if latest else 0
    while True:
        save(step, keep=2)
        if step == first:
            print("ready", flush=True)
        step += 1
"""


def _run_child(tmp_path: Path, mode: str, size: int = 16) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "run"), mode, str(size)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@posix_only
@pytest.mark.slow
def test_sigkill_inside_extra_leaves_previous_checkpoint(tmp_path):
    child = _run_child(tmp_path, "in_extra")
    assert child.wait(timeout=60) == -signal.SIGKILL
    run = tmp_path / "run"
    assert _assert_consistent(latest_checkpoint(run)) == 1
    assert any(".tmp-" in p.name for p in (run / "checkpoints").iterdir())
    _save(run, 2)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000001", "step_00000002"]


@posix_only
@pytest.mark.slow
def test_sigkill_between_renames_falls_back_to_previous_step(tmp_path):
    child = _run_child(tmp_path, "between_renames")
    assert child.wait(timeout=60) == -signal.SIGKILL
    run = tmp_path / "run"
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[0] == "step_00000001"
    assert names[1].startswith("step_00000002.old-") and names[2].startswith("step_00000002.tmp-")
    assert _assert_consistent(latest_checkpoint(run)) == 1


@pytest.mark.slow
@posix_only
def test_random_sigkill_during_large_saves_leaves_a_loadable_checkpoint(tmp_path):
    rng = random.Random(0)
    run = tmp_path / "run"
    last_step = -1
    for _ in range(3):
        child = _run_child(tmp_path, "loop", size=1 << 24)  # 64 MB per save
        with child.stdout:
            assert child.stdout.readline() == "ready\n"
        # Saves take ~0.2 s each, so most kills land in the middle of writing one.
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=rng.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
        step = _assert_consistent(latest_checkpoint(run))
        assert step > last_step
        last_step = step
        assert len(list_checkpoints(run)) <= 3  # keep=2, plus one mid-prune at worst


def test_a_failed_prune_of_an_old_checkpoint_is_a_warning(tmp_path, monkeypatch, caplog):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, json_files={"trainer": {"step": step}}, keep=2)

    def busy(path):
        raise OSError(16, "Device or resource busy", str(path))

    monkeypatch.setattr("textgym_agents.runfiles.checkpoint._delete_checkpoint", busy)
    with caplog.at_level(logging.WARNING):
        path = save_checkpoint(tmp_path, 3, json_files={"trainer": {"step": 3}}, keep=2)
    assert path.name == "step_00000003" and list_checkpoints(tmp_path)[-1] == path
    assert "Could not remove the old checkpoint" in caplog.text
