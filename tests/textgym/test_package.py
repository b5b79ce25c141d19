import ast
import subprocess
import sys
from pathlib import Path

import textgym

PACKAGE = Path(textgym.__file__).parent


def test_textgym_imports_without_training_stack():
    code = (
        "import sys, textgym, gymnasium as gym; gym.make('textgym/Blackjack-v1'); "
        "heavy = {'torch', 'transformers', 'peft', 'trl'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_eval_exec_or_pickle_in_package():
    """Model output is untrusted: nothing in textgym may run it as code."""
    banned = {"eval", "exec", "compile", "__import__"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if is_call and node.func.id in banned:
                found.append(f"{path.name}:{node.lineno} {node.func.id}()")
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in {"pickle", "marshal", "shelve"} for n in names):
                    found.append(f"{path.name}:{node.lineno} imports {names}")
    assert found == []
