"""Find the JSON in a model's free-form reply: fenced blocks and top-level ``{...}`` spans.

A linear scan over the reply's braces and quotes, never a JSON parse: braces inside JSON
strings (escaped quotes included) do not count, unbalanced text simply yields no span, and a
reply of a million ``{`` costs one ``rfind``. Objects without nested objects (the common case,
70,000 of them in a megabyte reply) are matched by one regular expression; only nested ones
are walked brace by brace. :mod:`textgym.parsers` validates what is found.
"""

from __future__ import annotations

import re

__all__ = ["fenced_blocks", "json_objects", "json_spans", "outside_json"]

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_JSON_TOKENS = re.compile(r'[{}"]')
# An object without nested objects: text other than braces and quotes, and JSON strings (a
# backslash escapes the next character); else a lone "{" (nested objects, or one never closed).
# Unrolled loops: every character has one way to match, so a failed match backtracks in
# linear time.
_FLAT_OBJECT_OR_OPEN = re.compile(r'\{[^{}"]*(?:"[^"\\]*(?:\\.[^"\\]*)*"[^{}"]*)*\}|\{', re.DOTALL)


def fenced_blocks(text: str) -> list[str]:
    r"""Return the contents of every closed Markdown code fence (plain or tagged ``json``).

    Example:
        >>> fenced_blocks('Sure:\n```json\n{"a": 1}\n```')
        ['{"a": 1}\n']
    """
    return [match.group(1) for match in _FENCE.finditer(text)]


def json_objects(text: str, limit: int | None = None) -> list[str]:
    """Return the top-level ``{...}`` spans of ``text`` (the first ``limit`` of them).

    Example:
        >>> json_objects('I pick {"action": "hit"} (not {"action": "}"})')
        ['{"action": "hit"}', '{"action": "}"}']
    """
    return [text[start:end] for start, end in json_spans(text, limit)]


def outside_json(text: str) -> str:
    """Return the free text of a reply, every top-level ``{...}`` span blanked out.

    Example:
        >>> outside_json('hit {"action": "stick"} now')
        'hit   now'
    """
    parts, end = [], 0
    for start, stop in json_spans(text, None):
        parts.append(text[end:start])
        end = stop
    parts.append(text[end:])
    return " ".join(parts)


def json_spans(text: str, limit: int | None) -> list[tuple[int, int]]:
    r"""Return ``(start, end)`` of the top-level ``{...}`` spans (at most ``limit`` of them).

    An escaped quote does not end a string, so the ``}`` after it is not a closing brace.

    Example:
        >>> json_spans('{"a": "\\"}"} {}', None)
        [(0, 12), (13, 15)]
    """
    spans: list[tuple[int, int]] = []
    # No span can end after the last "}": stop there (a reply of a million "{" costs nothing).
    end = text.rfind("}") + 1
    pos = 0
    while True:
        # Outside objects, quotes and "}" are prose: an object starts at the next "{".
        for match in _FLAT_OBJECT_OR_OPEN.finditer(text, pos, end):
            start, stop = match.span()
            if stop == start + 1:  # a lone "{": walk its nested objects
                stop = _nested_object_end(text, start, end)
                if stop < 0:  # never closed: neither is any object after it
                    return spans
            spans.append((start, stop))
            if limit is not None and len(spans) >= limit:
                return spans
            if stop > match.end():  # resume the search after the nested object
                pos = stop
                break
        else:
            return spans


def _nested_object_end(text: str, start: int, end: int) -> int:
    """Return the end of the object opening at ``start``, or -1 if it does not close by ``end``."""
    depth, in_string = 0, False
    for match in _JSON_TOKENS.finditer(text, start, end):
        char, pos = match.group(), match.start()
        if in_string:
            if char == '"' and not _is_escaped(text, pos):
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos + 1
    return -1


def _is_escaped(text: str, pos: int) -> bool:
    """True if the character at ``pos`` is preceded by an odd number of backslashes."""
    count = 0
    while pos - count - 1 >= 0 and text[pos - count - 1] == "\\":
        count += 1
    return count % 2 == 1
