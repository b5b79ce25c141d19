"""No two modules of textgym / textgym_agents import each other, directly or round a loop.

Read from the source (AST), so it needs no import and sees every module. Every import that can
run counts, a lazy one inside a function too (``PPOTrainer.train`` importing the run driver,
which imported the trainer, was such a cycle); only ``if TYPE_CHECKING:`` imports do not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("textgym", "textgym_agents")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``body`` that can run, at import time or later (lazily)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)  # the body is for annotations only
        else:  # functions, classes, if / try / with / match blocks
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _runtime_imports([child])
                elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    yield from _runtime_imports(child.body)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from pkg import mod`` names ``pkg.mod``)."""
    files = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    is_package = {name: path.name == "__init__.py" for name, path in files.items()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        package = name if is_package[name] else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_module_imports_another_that_imports_it_back():
    graph = import_graph(ROOT, PACKAGES)
    assert "textgym_agents.ppo.trainer" in graph and "textgym_agents.ppo.run" in graph
    assert import_cycles(graph) == []


def test_trainer_imports_the_run_driver_one_way():
    graph = import_graph(ROOT, PACKAGES)
    assert "textgym_agents.ppo.run" in graph["textgym_agents.ppo.trainer"]
    assert not any(
        name.startswith("textgym_agents.ppo.trainer") for name in graph["textgym_agents.ppo.run"]
    )


@pytest.fixture
def toy(tmp_path):
    """A package with two real cycles (a <-> b at import time, e <-> f lazily) and no other."""
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg import b\nA = 1\n",
        "pkg/b.py": "try:\n    from .a import A\nexcept ImportError:\n    A = None\n",
        "pkg/c.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.d import D\n",
        "pkg/d.py": "import pkg.c\n\nD = 2\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/e.py": "from .. import c\nfrom ..sub import e, f\n",
        "pkg/sub/f.py": "class F:\n    def run(self):\n        from pkg.sub.e import c\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_checker_finds_real_cycles_and_ignores_typing_imports(toy):
    graph = import_graph(toy, ("pkg",))
    assert graph["pkg.b"] == {"pkg.a"}  # relative, inside try
    assert graph["pkg.c"] == set()  # TYPE_CHECKING only
    assert graph["pkg.sub.e"] == {"pkg.c", "pkg.sub.f"}  # ..c resolved; itself is no edge
    assert graph["pkg.sub.f"] == {"pkg.sub.e"}  # lazy, in a method
    assert import_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.e", "pkg.sub.f"]]
