"""Parse what a model writes for ``textgym/Calculator-v0`` into canonical commands.

Replies are ReAct-style text (``Action: calculator(<expr>)`` / ``Answer: <n>``) or the JSON
equivalent; the result is the command string :class:`~textgym.envs.calculator.CalculatorEnv` takes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from textgym.parsers import ActionParseError, ActionParser

__all__ = [
    "ANSWER_PREFIX",
    "MARKUP",
    "MAX_COMMAND_CHARS",
    "REPLY_FORMATS",
    "TOOL_PREFIX",
    "CalculatorParser",
    "CalculatorReply",
]

TOOL_PREFIX = "Action: calculator("
ANSWER_PREFIX = "Answer:"
# The length of CalculatorEnv's action space (UnicodeText(4096)): the canonical form can be a
# character or two longer than the reply ("answer:1" -> "Answer: 1").
MAX_COMMAND_CHARS = 4096
_NO_ACTION = "no 'Action: calculator(<expression>)' or 'Answer: <number>' found in the reply"
_KEYWORD = re.compile(r"\b(action|answer)[ \t]*:", re.IGNORECASE)
_TOOL_NAME = re.compile(r"[\s*`]*([A-Za-z_][\w.]*)[ \t]*(\(?)")
_FENCE_OPEN = re.compile(r"```[ \t]*json", re.IGNORECASE)
MARKUP = " \t\r\n*`"
REPLY_FORMATS = ("json", "text", "both")
_JSON_INSTRUCTIONS = (
    'Reply with a JSON object: either {"tool": "calculator", "expression": "<expression>"} to '
    'call the calculator, or {"answer": "<number>"} to give your final answer.'
)
_TEXT_FORMAT = (
    'an optional "Thought: ..." line, then either "Action: calculator(<expression>)" to call '
    'the calculator or "Answer: <number>" to give your final answer. Example reply:\n'
    "Thought: I need the product of 123 and 456.\n"
    "Action: calculator(123 * 456)"
)
# What constrained decoding may write: a calculator call or a numeric answer, in JSON. A subset
# of what the parser accepts ("thought" is left out to keep replies short); the expression is
# at most as long as the env's evaluator accepts.
REPLY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "tool": {"const": "calculator"},
                "expression": {"type": "string", "minLength": 1, "maxLength": 200},
            },
            "required": ["tool", "expression"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"answer": {"type": "number"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    ]
}


class CalculatorReply(BaseModel):
    """The JSON form of a reply: a calculator call or the final answer.

    Example:
        >>> CalculatorReply(tool="calculator", expression="2 + 3").to_action()
        'Action: calculator(2 + 3)'
    """

    model_config = ConfigDict(extra="forbid")

    thought: str | None = Field(default=None, description="Your reasoning (optional).")
    tool: Literal["calculator"] | None = Field(default=None, description="The tool to call.")
    expression: str | None = Field(default=None, description="The expression to calculate.")
    answer: StrictStr | StrictInt | StrictFloat | None = Field(
        default=None, description="Your final answer, a number."
    )

    @model_validator(mode="after")
    def _one_action(self) -> CalculatorReply:
        if (self.expression is None) == (self.answer is None):
            raise ValueError("give exactly one of 'expression' (a calculator call) or 'answer'")
        if self.answer is not None and self.tool is not None:
            raise ValueError("'tool' goes with 'expression', not with 'answer'")
        return self

    def to_action(self) -> str:
        """Return the canonical command string."""
        if self.expression is not None:
            return f"{TOOL_PREFIX}{self.expression.strip()})"
        return f"{ANSWER_PREFIX} {str(self.answer).strip()}"


class CalculatorParser(ActionParser):
    r"""Parses ReAct-style text or JSON replies into canonical calculator commands.

    A fenced ```json block, if any, is the reply. Otherwise the first ``Action:`` or
    ``Answer:`` keyword (case-insensitive; when a reply holds both, the earlier one wins) and
    the outermost ``{...}`` are tried, whichever starts first, the other only if the first
    fails (the first error is raised if both fail). The tool call's expression is the text
    inside the parentheses that open after ``calculator(``; it is not evaluated here (a bad
    expression is the env's malformed tool call, not a parse error).

    Both forms are parsed whatever ``reply_format`` says; it picks the form the instructions
    teach. JSON is the default: it is what ``textgym train`` writes (replies start with
    ``{"``), and the embedded model follows it best (docs/results.md, "The instructions").

    Example:
        >>> parser = CalculatorParser()
        >>> parser.parse("Thought: multiply.\nAction: calculator((1 + 2) * 3)")
        'Action: calculator((1 + 2) * 3)'
        >>> parser.parse('{"answer": 56088}')
        'Answer: 56088'
        >>> print(CalculatorParser().instructions())  # doctest: +NORMALIZE_WHITESPACE
        Reply with a JSON object: either {"tool": "calculator", "expression": "<expression>"}
        to call the calculator, or {"answer": "<number>"} to give your final answer.
    """

    def __init__(self, reply_format: str = "json") -> None:
        """Create the parser.

        Args:
            reply_format: The form the instructions teach: ``"json"`` (a JSON object),
                ``"text"`` (ReAct-style ``Action:`` / ``Answer:`` lines) or ``"both"``.
        """
        if reply_format not in REPLY_FORMATS:
            raise ValueError(
                f"Expected reply_format to be one of {REPLY_FORMATS}, got {reply_format!r}"
            )
        self.reply_format = reply_format

    def parse(self, text: str) -> str:
        """Return the canonical command described by ``text`` or raise ActionParseError."""
        if not isinstance(text, str):
            raise ActionParseError(f"expected the reply as str, got {type(text).__name__}")
        command = self._parse(text)
        if len(command) > MAX_COMMAND_CHARS:
            raise ActionParseError(
                f"the command is {len(command)} characters long, over the limit of "
                f"{MAX_COMMAND_CHARS}",
                text,
            )
        return command

    def _parse(self, text: str) -> str:
        fence = _FENCE_OPEN.search(text)
        if fence is not None:
            end = text.find("```", fence.end())
            return self._parse_json(text[fence.end() : end if end != -1 else len(text)], text)
        # Whichever of a keyword and a JSON object comes first is tried first, and the other
        # only if it fails, so prose around (or braces inside) either form does no harm.
        attempts: list[tuple[int, Callable[[], str]]] = []
        keyword = _KEYWORD.search(text)
        if keyword is not None:
            attempts.append((keyword.start(), partial(_parse_keyword, text, keyword)))
        brace = text.find("{")
        if brace != -1:
            attempts.append((brace, partial(self._parse_json, text, text)))
        first_error: ActionParseError | None = None
        for _, attempt in sorted(attempts, key=itemgetter(0)):
            try:
                return attempt()
            except ActionParseError as e:
                first_error = first_error or e
        raise first_error or ActionParseError(_NO_ACTION, text)

    def _parse_json(self, source: str, text: str) -> str:
        start, end = source.find("{"), source.rfind("}")
        candidate = source[start : end + 1] if 0 <= start < end else source
        try:
            return CalculatorReply.model_validate_json(candidate).to_action()
        except ValidationError as e:
            parts = []
            for item in e.errors(include_url=False, include_input=False):
                loc = ".".join(str(p) for p in item["loc"])
                parts.append(f"{loc}: {item['msg']}" if loc else item["msg"])
            message = "invalid JSON reply: " + "; ".join(parts)
            raise ActionParseError(message[:500], text, validation_error=e) from None

    def instructions(self) -> str:
        """Explain the reply format ``reply_format`` names, with an example."""
        if self.reply_format == "json":
            return _JSON_INSTRUCTIONS
        if self.reply_format == "text":
            return "Reply with " + _TEXT_FORMAT
        return (
            "Reply in one of two formats.\nText: "
            + _TEXT_FORMAT
            + '\nJSON: an object with an optional "thought" and either "tool": "calculator" '
            'with "expression", or "answer". Example reply:\n'
            '{"thought": "The calculator returned 56088.", "answer": "56088"}'
        )

    def reply_schema(self) -> dict[str, Any]:
        """Return :data:`REPLY_SCHEMA`: JSON tool calls and numeric answers."""
        return copy.deepcopy(REPLY_SCHEMA)

    def example(self, action: Any) -> str | None:
        """Return the canonical command itself when it parses back to ``action``."""
        if not isinstance(action, str):
            return None
        try:
            return action if self.parse(action) == action else None
        except ActionParseError:
            return None


def _parse_keyword(text: str, keyword: re.Match[str]) -> str:
    if keyword.group(1).lower() == "answer":
        return _parse_answer(text, keyword.end())
    return _parse_tool_call(text, keyword.end())


def _parse_tool_call(text: str, pos: int) -> str:
    match = _TOOL_NAME.match(text, pos)
    if match is None:
        raise ActionParseError("expected 'calculator(<expression>)' after 'Action:'", text)
    name, paren = match.group(1), match.group(2)
    if name.lower() != "calculator":
        raise ActionParseError(f"unknown tool {name!r}; the only tool is calculator", text)
    if not paren:
        raise ActionParseError("expected 'calculator(<expression>)' after 'Action:'", text)
    depth, start = 0, match.end() - 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return f"{TOOL_PREFIX}{text[start + 1 : i].strip()})"
    raise ActionParseError("the calculator call has no closing parenthesis", text)


def _parse_answer(text: str, pos: int) -> str:
    # The answer is the rest of its line, or the next line when "Answer:" ends its own line.
    value = text[pos:].lstrip().split("\n", 1)[0].lstrip(MARKUP).rstrip(MARKUP + ".")
    if not value:
        raise ActionParseError("the answer after 'Answer:' is empty", text)
    return f"{ANSWER_PREFIX} {value}"
