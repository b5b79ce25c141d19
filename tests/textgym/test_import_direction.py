"""One direction of dependency: no module of `textgym` imports `textgym_agents`, in any form.

The training commands reach `textgym` through entry points (textgym/plugins.py); this test
fails on a top-level or lazy import, on `importlib.import_module`/`__import__` of the package,
and on any "textgym_agents..." module string (a registration or entry-point target).
"""

import ast
import re
from pathlib import Path

import pytest

import textgym

PACKAGE = Path(textgym.__file__).parent
FORBIDDEN = "textgym_agents"
# A module path or "module:attr" target naming the training package.
MODULE_STRING = re.compile(rf"{FORBIDDEN}(\.\w+)*(:[\w.]+)?")


def _is_forbidden(module: str | None) -> bool:
    return module is not None and (module == FORBIDDEN or module.startswith(FORBIDDEN + "."))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (prose may name the package; only code may not import it)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def agents_imports(source: str, name: str = "<source>") -> list[str]:
    """Every place in ``source`` that imports or names a module of the training package."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if _is_forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_forbidden(node.module):
            found.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and MODULE_STRING.fullmatch(node.value.strip()):
                found.append(f"{where} names {node.value.strip()!r}")
        elif isinstance(node, ast.JoinedStr) and node.values:  # f"textgym_agents.{name}"
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith(FORBIDDEN):
                found.append(f"{where} f-string {first.value!r}...")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "import textgym_agents",
        "import textgym_agents.policy as p",
        "import os, textgym_agents.ppo.run",
        "from textgym_agents import PPOPolicy",
        "from textgym_agents.runfiles.checkpoint import latest_checkpoint",
        "def f():\n    from textgym_agents.ppo.run import find_checkpoint\n",
        "def f():\n    import textgym_agents\n    return textgym_agents\n",
        "import importlib\nimportlib.import_module('textgym_agents.tracking')",
        "from importlib import import_module as im\nim('textgym_agents')",
        "__import__('textgym_agents.policy')",
        "ENTRY = 'textgym_agents.cli.train:command'",
        "def f(name):\n    return __import__(f'textgym_agents.{name}')\n",
        "if TYPE_CHECKING:\n    from textgym_agents.policy import PPOPolicy\n",
    ],
)
def test_the_check_catches_every_form_of_import(source):
    assert agents_imports(source) != []


@pytest.mark.parametrize(
    "source",
    [
        '"""Docs may mention textgym_agents.cli.train:command."""',
        "import textgym_agents_extra_thing",  # another package, not a submodule
        "from textgym.plugins import COMMANDS_GROUP",
        "HINT = \"pip install 'textgym[agents]'\"",
        "def f():\n    '''See textgym_agents.'''\n",
    ],
)
def test_the_check_allows_docs_and_other_packages(source):
    assert agents_imports(source) == []


def test_no_textgym_module_imports_textgym_agents():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20  # the whole package is scanned
    found = []
    for path in modules:
        name = str(path.relative_to(PACKAGE.parent))
        found += agents_imports(path.read_text(encoding="utf-8"), name)
    assert found == []
