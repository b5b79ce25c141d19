"""Atomic files and directories (textgym_agents.runfiles.atomic)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from textgym_agents.runfiles.atomic import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    load_tensors,
    save_tensors,
)

# --- atomic files -------------------------------------------------------------------------------


def test_atomic_write_bytes_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "a.bin"
    atomic_write_bytes(path, b"old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in path.parent.iterdir()] == ["a.bin"]


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    atomic_write_json(path, {"v": 1})

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_atomic_write_json_converts_numpy_and_rejects_tensors(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": np.float32(0.5), "n": np.int64(3)})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 0.5, "n": 3}
    with pytest.raises(TypeError, match="Cannot write Tensor to JSON; put tensors in `tensors=`"):
        atomic_write_json(tmp_path / "b.json", {"t": torch.ones(1)})
    assert not (tmp_path / "b.json").exists()


def test_save_tensors_shared_storage_and_metadata(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {"base": base, "row": base[1], "t": base.t(), "step": torch.tensor(3.0)}
    save_tensors(tmp_path / "t.safetensors", tensors, metadata={"format": "pt"})
    loaded = load_tensors(tmp_path / "t.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    from safetensors import safe_open

    with safe_open(tmp_path / "t.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_save_tensors_validates_inputs(tmp_path):
    with pytest.raises(
        TypeError, match=r"safetensors metadata must map str to str, got \{'a': 1\}"
    ):
        save_tensors(tmp_path / "t.safetensors", {"w": torch.ones(1)}, metadata={"a": 1})
    with pytest.raises(TypeError, match="Expected a torch.Tensor for 'w', got list"):
        save_tensors(tmp_path / "t.safetensors", {"w": [1.0]})
    assert list(tmp_path.iterdir()) == []


# --- atomic directories -------------------------------------------------------------------------


def test_atomic_directory_creates_and_replaces(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target and not target.exists()
        (tmp / "a.txt").write_text("1")
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_directory_exception_leaves_target_untouched(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
    with pytest.raises(RuntimeError, match="halfway"), atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("2")
        raise RuntimeError("halfway")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_directory_failed_rename_restores_previous(tmp_path, monkeypatch):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
    real_rename = os.rename

    def rename(src, dst):
        if Path(dst) == target and ".tmp-" in Path(src).name:
            raise OSError("rename failed")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"), atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
