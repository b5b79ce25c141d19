"""Shared test set-up: headless rendering for Gymnasium's pygame-based envs, a tiny model dir."""

import importlib.util
import os
import sys
import tempfile

import pytest

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
# Under pytest-xdist (`pytest -n auto`) each worker gets its share of the cores: torch's
# default of one thread per core in every worker would oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))

# Without the minigrid extra: this module imports minigrid at the top, these doctests make envs.
HAS_MINIGRID = importlib.util.find_spec("minigrid") is not None
collect_ignore = [] if HAS_MINIGRID else ["textgym/envs/minigrid_levels.py"]
NEEDS_MINIGRID = {"textgym.envs.minigrid_text.make_babyai_text_env"}


def pytest_collection_modifyitems(items):
    """Skip the doctests that make BabyAI envs when minigrid is not installed."""
    skip = pytest.mark.skip(reason='needs minigrid: pip install "textgym[minigrid]"')
    for item in items:
        if not HAS_MINIGRID and item.name in NEEDS_MINIGRID:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A directory holding a tiny model and the embedded tokenizer (for subprocess tests)."""
    from textgym_agents.testing import tiny_model

    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


CODE_MARKER = "textgym_code_marker"


@pytest.fixture
def code_marker(tmp_path_factory, monkeypatch):
    """An importable module ``textgym_code_marker`` that records being imported and called.

    Returns the file it appends ``imported`` / ``called`` lines to: it exists only once the
    module ran. ``planted(**kwargs)`` (an env entry point) and ``Planted(...)`` (a formatter,
    parser or wrapper class) record a call, then raise.
    """
    where = tmp_path_factory.mktemp("marker")
    calls = where / "calls.txt"
    (where / f"{CODE_MARKER}.py").write_text(
        "import pathlib\n"
        f"CALLS = pathlib.Path({str(calls)!r})\n"
        "with CALLS.open('a') as f:\n"
        "    f.write('imported\\n')\n"
        "def planted(*args, **kwargs):\n"
        "    with CALLS.open('a') as f:\n"
        "        f.write('called\\n')\n"
        "    raise RuntimeError('the planted code ran')\n"
        "class Planted:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        planted()\n"
    )
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.delitem(sys.modules, CODE_MARKER, raising=False)
    return calls
