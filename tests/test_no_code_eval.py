"""Model text is untrusted: nothing in textgym or textgym_agents may run data as code.

An AST scan of both packages for ``eval``/``exec``/``compile``/``__import__`` (by name, through
``builtins`` or ``getattr``), pickle-based formats (``pickle``, ``marshal``, ``shelve``, ``dill``,
``cloudpickle``, ``joblib``, ``torch.load``, ``numpy.load(allow_pickle=True)``) and unsafe YAML
loaders. The scanner is itself tested on snippets it must flag, so it cannot pass vacuously.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import textgym
import textgym_agents

PACKAGES = [Path(textgym.__file__).parent, Path(textgym_agents.__file__).parent]
CODE_RUNNERS = {"eval", "exec", "compile", "__import__"}
PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle"}
PICKLE_MODULES |= {"joblib"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load"}


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def findings(source: str, where: str = "<snippet>") -> list[str]:
    """Every place in ``source`` that could run data as code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names]
            modules = names if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] in PICKLE_MODULES for m in modules):
                found.append(f"{line} imports {modules[0]}")
            if isinstance(node, ast.ImportFrom) and node.module == "builtins":
                found += [f"{line} imports builtins.{n}" for n in names if n in CODE_RUNNERS]
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if name in CODE_RUNNERS or (name.startswith("builtins.") and last in CODE_RUNNERS):
            found.append(f"{line} calls {name}()")
        elif name == "getattr" and any(
            isinstance(a, ast.Constant) and a.value in CODE_RUNNERS for a in node.args[1:2]
        ):
            found.append(f"{line} reaches {node.args[1].value} through getattr")  # type: ignore[attr-defined]
        elif name == "torch.load":
            found.append(f"{line} calls torch.load() (pickle)")
        elif name.endswith("load") and name.split(".")[0] in ("np", "numpy"):
            allow = _keyword(node, "allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                found.append(f"{line} calls {name}(allow_pickle=True)")
        elif name.split(".")[0] == "yaml" and last in UNSAFE_YAML:
            loader = _dotted(_keyword(node, "Loader") or ast.Constant(None))
            if last != "load" or not loader.endswith(("SafeLoader", "CSafeLoader")):
                found.append(f"{line} calls {name}() without a safe loader")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        "eval(text)",
        "exec(text)",
        "compile(text, '<reply>', 'eval')",
        "__import__(name)",
        "import builtins\nbuiltins.eval(text)",
        "from builtins import exec",
        "getattr(__builtins__, 'eval')(text)",
        "import pickle",
        "from pickle import loads",
        "import cloudpickle",
        "from joblib import load",
        "torch.load(path)",
        "np.load(path, allow_pickle=True)",
        "yaml.load(text)",
        "yaml.load(text, Loader=yaml.Loader)",
        "yaml.unsafe_load(text)",
    ],
)
def test_the_scanner_flags_code_execution(snippet):
    assert len(findings(snippet)) == 1, snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "model.eval()",  # torch's train/eval switch
        "ast.literal_eval(text)",
        "yaml.safe_load(text)",
        "yaml.load(text, Loader=yaml.SafeLoader)",
        "np.load(path)",
        "safetensors.torch.load_file(path)",
        "re.compile(pattern)",
        "json.loads(text)",
    ],
)
def test_the_scanner_lets_safe_calls_through(snippet):
    assert findings(snippet) == []


def test_no_package_module_runs_data_as_code():
    files = [path for package in PACKAGES for path in sorted(package.rglob("*.py"))]
    assert len(files) > 40  # both packages were found and scanned
    found = []
    for path in files:
        where = str(path.relative_to(path.parents[1]))
        found += findings(path.read_text(encoding="utf-8"), where)
    assert found == []
