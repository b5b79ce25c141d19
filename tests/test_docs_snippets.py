"""Every ```python block of README.md and docs/*.md runs, so the snippets cannot rot.

How the blocks run:

- Per file, in order, in one namespace: a page's later blocks use what its earlier blocks
  imported or built, as for a reader who runs them top to bottom. Each file starts afresh.
- In a temporary working directory (``runs/``, ``data/`` land there); envs the blocks register
  are removed from Gymnasium's registry afterwards.

What is substituted, so that they run offline in seconds:

- The model: ``PPOPolicy.from_pretrained()`` and ``textgym_agents.model.loading.load_model()``
  called without a model load the tiny random Llama of ``textgym_agents.testing.tiny_model``
  (the ``tiny_dir`` fixture) in float32 instead of the embedded SmolLM2.
- Sizes, in the block's source text (`SMALL`): an integer keyword argument ``total_episodes=``,
  ``n_episodes=``, ``num_envs=``, ``group_size=`` or ``max_steps=`` above 2 becomes 2, and
  ``max_completion_length=`` becomes 8.
- ``OPENAI_API_KEY`` is unset, so a block that calls a chat API only when it is set skips it.
- `PRELUDES`: imports run before the first block of a page whose blocks use names they do not
  import (none today: every page's blocks import what they use).

Pages whose blocks train for real (SFT, GRPO: tens of seconds even with the tiny model) are in
the slow tier (`SLOW_PAGES`); the README and the other pages run in the fast tier.

Blocks that are not meant to run (output, shell commands) are fenced ```text or ```bash.
"""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SMALL = {
    re.compile(r"\b(total_episodes|n_episodes|num_envs|group_size|max_steps)=(\d[\d_]*)\b"): (
        lambda m: f"{m[1]}={min(int(m[2]), 2)}"
    ),
    re.compile(r"\bmax_completion_length=\d+\b"): lambda m: "max_completion_length=8",
}
PRELUDES: dict[str, str] = {}


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file: (line number of the fence, source)."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m[1]) for m in FENCE.finditer(text)]


def shrink(source: str) -> str:
    for pattern, replace in SMALL.items():
        source = pattern.sub(replace, source)
    return source


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]
SLOW_PAGES = {"docs/training.md", "docs/other-loops.md", "docs/openenv.md"}


def page_param(page: Path):
    name = str(page.relative_to(ROOT))
    return pytest.param(page, id=name, marks=[pytest.mark.slow] if name in SLOW_PAGES else [])


def test_the_front_door_and_the_guides_have_snippets():
    names = {str(p.relative_to(ROOT)) for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/text-envs.md", "docs/training.md"} <= names


def test_readme_links_into_docs_point_at_pages_and_headings():
    """mkdocs --strict checks the links between pages; the README is outside the site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", readme)
    assert len(links) > 10
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{path}#{anchor}"


def test_shrink_makes_sizes_small_and_leaves_small_ones():
    assert shrink("learn(envs, total_episodes=2000)") == "learn(envs, total_episodes=2)"
    assert shrink("evaluate(p, env, n_episodes=1)") == "evaluate(p, env, n_episodes=1)"
    assert shrink("GRPOConfig(max_completion_length=128)") == "GRPOConfig(max_completion_length=8)"


@pytest.fixture
def tiny_models(monkeypatch, tiny_dir):
    """Load the tiny model wherever a block loads the embedded one."""
    from textgym_agents.model import loading as models
    from textgym_agents.policy import PPOPolicy

    from_pretrained = PPOPolicy.from_pretrained.__func__
    load_model = models.load_model

    def tiny_from_pretrained(cls, name_or_path=None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        return from_pretrained(cls, name_or_path or tiny_dir, **kwargs)

    def tiny_load_model(name_or_path=None, **kwargs):
        kwargs.setdefault("dtype", "float32")
        return load_model(name_or_path or tiny_dir, **kwargs)

    monkeypatch.setattr(PPOPolicy, "from_pretrained", classmethod(tiny_from_pretrained))
    monkeypatch.setattr(models, "load_model", tiny_load_model)


@pytest.mark.parametrize("page", [page_param(page) for page in PAGES_WITH_CODE])
def test_python_blocks_run(page, tiny_models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    registered = dict(gym.registry)
    name = str(page.relative_to(ROOT))
    namespace: dict = {"__name__": f"docs_snippet_{page.stem}"}
    try:
        if name in PRELUDES:
            exec(compile(PRELUDES[name], f"<prelude of {name}>", "exec"), namespace)
        for line, source in python_blocks(page):
            # Compiled with the page's line numbers, so a traceback points into the page.
            code = compile("\n" * line + shrink(source), str(page), "exec")
            exec(code, namespace)  # the repository's own documentation, not model output
    finally:
        for env_id in set(gym.registry) - set(registered):
            del gym.registry[env_id]
