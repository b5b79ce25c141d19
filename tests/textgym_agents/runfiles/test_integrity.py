from __future__ import annotations

import pytest

from textgym_agents.exceptions import CheckpointError
from textgym_agents.runfiles.integrity import file_listing, find_damage, raise_if_damaged


@pytest.fixture
def directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "sub" / "b.json").write_text('{"x": 1}')
    (tmp_path / "manifest.json").write_text("{}")
    return tmp_path


def test_listing_names_every_file_but_the_excluded_with_size_and_hash(directory):
    listing = file_listing(directory, exclude={"manifest.json"})
    assert sorted(listing) == ["a.bin", "sub/b.json"]
    assert listing["a.bin"]["bytes"] == 2560 and len(listing["a.bin"]["sha256"]) == 64
    assert find_damage(directory, listing) is None


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "a.bin").unlink(), "a.bin is missing"),
        (lambda d: (d / "a.bin").write_bytes(b"x" * 100), "a.bin is 100 bytes, expected 2560"),
        (lambda d: (d / "sub" / "b.json").write_text('{"x": 2}'), "sub/b.json does not match"),
    ],
    ids=["deleted", "truncated", "one-byte-changed"],
)
def test_each_kind_of_damage_is_named(directory, damage, expected):
    listing = file_listing(directory)
    damage(directory)
    assert expected in find_damage(directory, listing)
    with pytest.raises(CheckpointError, match=f"The policy {directory} is damaged: {expected}"):
        raise_if_damaged(directory, listing, "The policy")


def test_files_not_in_the_listing_are_ignored(directory):
    listing = file_listing(directory)
    (directory / "notes.txt").write_text("added by a user")
    assert find_damage(directory, listing) is None


def test_a_malformed_listing_is_reported_not_raised(directory):
    assert "not an object" in find_damage(directory, ["a.bin"])
    assert "malformed" in find_damage(directory, {"a.bin": {"bytes": 1}})
