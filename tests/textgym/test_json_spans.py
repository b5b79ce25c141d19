"""Finding JSON in free-form replies (textgym.json_spans)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from textgym.json_spans import fenced_blocks, json_objects, json_spans, outside_json


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("no json here", []),
        ('{"a": 1}', [(0, 8)]),
        ('x {"a": {"b": 2}} y {"c": 3}', [(2, 17), (20, 28)]),
        ('{"a": "}"}', [(0, 10)]),  # a brace inside a string is text
        ('{"a": "\\\\"}', [(0, 11)]),  # an escaped backslash ends before the quote
        ('{"a": "\\"}"}', [(0, 12)]),  # an escaped quote does not end the string
        ("{{{{", []),  # unbalanced: nothing
        ("} {", []),
        ('"outside" {"a": "b"}', [(10, 20)]),  # quotes outside objects are prose
    ],
)
def test_json_spans(text, spans):
    assert json_spans(text, None) == spans
    assert json_objects(text) == [text[a:b] for a, b in spans]


def _brace_by_brace(text: str) -> list[tuple[int, int]]:
    """The reference: walk every brace and quote, counting depth and skipping strings."""
    spans, depth, start, in_string = [], 0, 0, False
    for match in re.finditer(r'[{}"]', text):
        char, pos = match.group(), match.start()
        if in_string:
            backslashes = len(text[:pos]) - len(text[:pos].rstrip("\\"))
            in_string = char != '"' or backslashes % 2 == 1
        elif char == '"':
            in_string = depth > 0
        elif char == "{":
            start = pos if depth == 0 else start
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                spans.append((start, pos + 1))
    return spans


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.text(alphabet='{}"\\ a:\n', max_size=40))
def test_spans_match_a_brace_by_brace_walk(text):
    """Flat objects are matched by a regular expression, nested ones walked: same spans."""
    assert json_spans(text, None) == _brace_by_brace(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1} ' * 70_000,  # flat objects, one regex match each
        '{"a": {"b": "}"}} ' * 20_000,  # nested objects, walked brace by brace
        '{"a": "' + "\\" * 500_000 + '"}',
        "{ " + '{"a": 1} ' * 100_000,  # never closed: one walk to the end
    ],
)
def test_many_or_long_objects_are_scanned_in_linear_time(text):
    start = time.process_time()
    json_spans(text, None)
    assert time.process_time() - start < 2.0


def test_limit_stops_the_scan():
    text = " ".join("{}" for _ in range(20))
    assert len(json_spans(text, 8)) == 8
    assert json_objects(text, 3) == ["{}", "{}", "{}"]


def test_outside_json_blanks_every_object():
    assert outside_json('say hit {"action": "stick"} or {"x": 1} stick') == "say hit   or   stick"
    assert outside_json("plain") == "plain"


def test_fenced_blocks_plain_and_json_tagged_only_when_closed():
    text = '```json\n{"a": 1}\n```\nand\n```\n{"b": 2}```\n```json\n{"c": 3}'
    assert fenced_blocks(text) == ['{"a": 1}\n', '{"b": 2}']
