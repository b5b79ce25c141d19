"""A griffe extension for the docs site: house-style docstrings render as intended.

griffe's Google parser knows ``Examples:`` (doctest lines become code blocks) but reads the
singular ``Example:`` the house style uses as an admonition, whose ``>>>`` lines would render
as Markdown (and fail ``mkdocs build --strict`` on outputs such as ``['stick', 'hit']``).
Sphinx roles (``:class:`~textgym.Policy```) would show verbatim: they become code spans.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([\w.()]+)`")


def _code_span(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class DoctestExamples(griffe.Extension):
    """Read ``Example:`` sections as ``Examples:``, and Sphinx roles as code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring before it is parsed (griffe parses lazily)."""
        if obj.docstring is not None:
            value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(_code_span, value)
