"""Finding JSON in free-form replies (textgym.json_spans)."""

from __future__ import annotations

import pytest

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
