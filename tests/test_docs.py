"""The docs speak of the project as it is: the module map is complete, no text cites work items.

Fast and torch-free: they read files only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("textgym", "textgym_agents")
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".sh"}
# Internal work-tracking references: "issue 18", "Issue #7", "session 13", "items 1-4", "item 3",
# and the same in a heading's anchor ("...-issue-18"); "work item(s)" in any form.
WORK_TRACKING = re.compile(
    r"\b(?:issue|session|item)s?[ _#-]*\d+|\bwork[ -]?items?\b", re.IGNORECASE
)
# A module or subpackage path of either package, wherever it stands in the text (but not the
# tail of a longer path such as tests/textgym/test_cli.py).
MODULE_PATH = re.compile(r"(?<![\w/.-])((?:textgym|textgym_agents)/(?:\w+/)*(?:\w+\.py|))(?![\w/])")


def tracked_text_files() -> list[Path]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    names = [name for name in listing.decode().split("\0") if name]
    here = Path(__file__).resolve()
    return [
        ROOT / name
        for name in names
        if Path(name).suffix in TEXT_SUFFIXES
        and (ROOT / name).is_file()
        and (ROOT / name).resolve() != here
    ]


def work_tracking_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, match) of every reference to a work item or work period in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in WORK_TRACKING.finditer(text)]


def test_work_tracking_pattern_finds_references_and_leaves_ordinary_words():
    found = work_tracking_mentions(
        "Target (issue 17, item 6). Session 9: done. See #learning-suite-issue-18.\n"
        "Issue #7 and sessions 4-5; two work items."
    )
    assert [m for _, m in found] == [
        "issue 17",
        "item 6",
        "Session 9",
        "issue-18",
        "Issue #7",
        "sessions 4",
        "work items",
    ]
    ordinary = 'A known issue. @pytest.fixture(scope="session"); each item of 3 lists; items[2]'
    assert work_tracking_mentions(ordinary) == []


def test_no_tracked_text_file_cites_work_items_or_work_periods():
    """Docs, code and scripts speak of the project (versions, dates, commands), not of how the
    work on it was organised: "issue 18" or "session 13" means nothing to a reader."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {match}"
        for path in tracked_text_files()
        for line, match in work_tracking_mentions(
            path.read_text(encoding="utf-8", errors="replace")
        )
    ]
    assert not offenders, "\n".join(offenders)


def package_modules() -> set[str]:
    """Every module (but ``__init__.py``) and subpackage of both packages, as repository paths."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "__pycache__" in relative:
                continue
            if path.name != "__init__.py":
                found.add(relative)
            elif path.parent != ROOT / package:
                found.add(path.parent.relative_to(ROOT).as_posix() + "/")
    return found


def module_map_section() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    match = re.search(r"^## Module map\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert match, f"{ARCHITECTURE.relative_to(ROOT)} has no '## Module map' section"
    return match.group(1)


def test_module_map_names_every_module_and_subpackage():
    named = set(MODULE_PATH.findall(module_map_section()))
    missing = sorted(package_modules() - named)
    assert not missing, f"add to the module map of docs/architecture.md: {missing}"


def test_architecture_page_names_no_module_that_does_not_exist():
    named = set(MODULE_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    named.discard("textgym/")
    named.discard("textgym_agents/")
    unknown = sorted(name for name in named if not (ROOT / name).exists())
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"


def test_module_path_pattern():
    text = (
        "`textgym/wrappers.py`, `textgym_agents/ppo/` and textgym_agents/ppo/run.py; "
        "tests/textgym/test_cli.py and textgym/Blackjack-v1 are not modules"
    )
    assert MODULE_PATH.findall(text) == [
        "textgym/wrappers.py",
        "textgym_agents/ppo/",
        "textgym_agents/ppo/run.py",
    ]


def test_the_settings_reference_in_the_training_guide_is_the_generated_one():
    from textgym_agents.cli.config import default_text
    from textgym_agents.ppo.config import config_reference

    text = (ROOT / "docs" / "training.md").read_text()
    block = text.split("<!-- settings:start -->\n")[1].split("<!-- settings:end -->")[0]
    assert block == config_reference(default_text), (
        "regenerate the block of docs/training.md between the settings markers from "
        "config_reference(textgym_agents.cli.config.default_text)"
    )
