"""The model's reply is untrusted input: every parser maps any string to an action or a parse error.

Covers every auto-generated schema (each space type, nested), user models, function parsers, the
calculator parser and the parser of every registered env, over hostile text: any unicode
(surrogates and control characters included), deep or huge JSON, several objects, numbers out of
range, NaN and infinities, and replies of 1 MB. Parsing must end in bounded time.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import textgym  # noqa: F401  (registers the textgym/ ids)
from textgym.envs.calculator_parser import MAX_COMMAND_CHARS, CalculatorParser
from textgym.extras import MissingExtraError
from textgym.parsers import ActionParseError, ActionParser, FunctionParser, JSONActionParser
from textgym.registration import registered_ids
from textgym.spaces import UnicodeText
from textgym.wrappers import TextEnvWrapper

MB = 1_000_000
SLOW = 5.0  # CPU seconds (process time, so other jobs on the machine do not count) per parse

SPACES: dict[str, gym.Space[Any]] = {
    "discrete": spaces.Discrete(3),
    "discrete-start": spaces.Discrete(3, start=-1),
    "discrete-large": spaces.Discrete(10**6),
    "multi-discrete": spaces.MultiDiscrete([3, 4]),
    "multi-discrete-2d-start": spaces.MultiDiscrete(
        np.array([[2, 3], [4, 5]]), start=np.array([[-1, 0], [1, 2]])
    ),
    "multi-binary": spaces.MultiBinary(3),
    "multi-binary-2d": spaces.MultiBinary((2, 2)),
    "box-scalar": spaces.Box(-2.0, 2.0, (1,), np.float32),
    "box-0d": spaces.Box(-2.0, 2.0, (), np.float64),
    "box-2d": spaces.Box(0.0, 1.0, (2, 3), np.float32),
    "box-int": spaces.Box(0, 10, (2,), np.int64),
    "box-uint8": spaces.Box(0, 255, (2,), np.uint8),
    "box-float16": spaces.Box(-1.0, 1.0, (2,), np.float16),
    "box-non-uniform": spaces.Box(
        np.array([-1.0, 0.0], np.float32), np.array([1.0, np.inf], np.float32)
    ),
    "box-infinite": spaces.Box(-np.inf, np.inf, (2,), np.float32),
    "text": spaces.Text(5, min_length=1),
    "unicode-text": UnicodeText(8),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32))),
    "dict": spaces.Dict(
        {
            "my-key": spaces.Discrete(2),
            "class": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "model_config": spaces.MultiBinary(2),
        }
    ),
    "nested": spaces.Tuple(
        (spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 3])))}),)
    ),
}
NAMED = {
    "discrete-named": (spaces.Discrete(3), {"action_names": ["stick", "hit", "double down"]}),
    "dict-named": (
        spaces.Dict({"move": spaces.Discrete(2), "speed": spaces.Box(0.0, 1.0, (1,))}),
        {"action_names": {"move": ["up", "down"]}},
    ),
}


class Bet(BaseModel):
    """A user model with its own ``to_action`` and a cross-field rule."""

    model_config = ConfigDict(extra="forbid")
    amount: int = Field(ge=1, le=10)
    all_in: bool = False

    def to_action(self) -> int:
        return 10 if self.all_in else self.amount


def _user_function(reply: str) -> int:
    """A careless user parser: raises whatever int(), indexing and division raise."""
    value = int(reply.strip().split()[0])
    return 100 // value % 3


def _parsers() -> dict[str, tuple[gym.Space[Any] | None, ActionParser]]:
    """Every parser under test and the space its actions must lie in (None: any value)."""
    found: dict[str, tuple[gym.Space[Any] | None, ActionParser]] = {}
    for name, space in SPACES.items():
        found[name] = (space, JSONActionParser.from_space(space))
    for name, (space, options) in NAMED.items():
        found[name] = (space, JSONActionParser.from_space(space, **options))
    strict = JSONActionParser.from_space(NAMED["discrete-named"][0], lenient=False)
    found["strict"] = (NAMED["discrete-named"][0], strict)
    found["user-model"] = (spaces.Discrete(11), JSONActionParser(Bet))
    found["function"] = (None, FunctionParser(_user_function))
    found["calculator"] = (UnicodeText(MAX_COMMAND_CHARS), CalculatorParser())
    for env_id in registered_ids():
        try:
            env = gym.make(env_id)
        except (MissingExtraError, ConnectionError):  # BabyAI without minigrid; OpenEnv-v0
            continue
        wrapper = env
        while not isinstance(wrapper, TextEnvWrapper):
            wrapper = wrapper.env
        found[env_id] = (wrapper.env.action_space, wrapper.parser)
        env.close()
    return found


PARSERS = _parsers()

# --- strategies -----------------------------------------------------------------------------

any_char = st.characters(exclude_categories=()) | st.characters(categories=["Cs", "Cc", "Cf"])
json_syntax = '{}[]",:\\ \n\t0123456789.-+eEaNnIfinity`json'
special_numbers = st.sampled_from(
    ["NaN", "-NaN", "Infinity", "-Infinity", "inf", "1e999", "-1e999", "1e-999", "9" * 400]
    + ["-" + "9" * 5000, "1" + "0" * 310, "0x10", "1_000", "01", "-0", "1.", ".5", "1e", "+1"]
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.floats()
    | st.text(alphabet=any_char, max_size=6)
    | st.sampled_from(["stick", "HIT", "up", "calculator", "1 + 2", "0.5", ""])
)
keys = st.sampled_from(["action", "my-key", "class", "model_config", "a", "move", "speed"])
keys |= st.sampled_from(["amount", "all_in", "answer", "expression", "tool", "thought", "field_0"])
json_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(keys | st.text(alphabet=any_char, max_size=3), children, max_size=4)
    ),
    max_leaves=12,
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # NaN and Infinity become bare tokens


@st.composite
def json_documents(draw: st.DrawFn) -> str:
    """JSON (or almost-JSON) text: values, objects with the schemas' keys, special numbers."""
    kind = draw(st.sampled_from(["value", "object", "number", "fenced", "bare"]))
    if kind == "number":
        return '{"' + draw(keys) + '": ' + draw(special_numbers) + "}"
    if kind == "bare":
        return draw(special_numbers | st.builds(_dumps, leaves))
    value = draw(json_values)
    if kind == "object":
        value = {draw(keys): value}
    text = _dumps(value)
    return f"```json\n{text}\n```" if kind == "fenced" else text


@st.composite
def nested(draw: st.DrawFn) -> str:
    """Deeply nested JSON, closed or not, up to 50,000 levels."""
    depth = draw(st.integers(1, 50_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"action":', "}"), ("{", "}")]))
    inner = draw(st.sampled_from(["1", "", '"hit"', "[]", "{}"]))
    return opener * depth + inner + closer * draw(st.integers(0, depth))


@st.composite
def several_objects(draw: st.DrawFn) -> str:
    """Several JSON objects (agreeing or not) in prose."""
    parts = draw(st.lists(json_documents(), min_size=2, max_size=6))
    separator = draw(st.sampled_from([" ", "\n", " or ", ", then ", "```", "}{", ""]))
    return separator.join(parts)


@st.composite
def huge(draw: st.DrawFn) -> str:
    """A short piece repeated up to 1 MB: the shapes that make naive parsers quadratic."""
    piece = draw(
        st.sampled_from(['{"action": "hit"} ', "{", "}", '"', "\\", "```json\n", "Action: "])
        | st.text(alphabet=any_char, min_size=1, max_size=12)
        | json_documents()
    )
    return piece * draw(st.integers(1, MB // max(len(piece), 1)))


@st.composite
def mutated_example(draw: st.DrawFn, name: str) -> str:
    """A valid reply of the parser's own format with a few characters replaced."""
    space, parser = PARSERS[name]
    reply = None
    if space is not None:
        space.seed(draw(st.integers(0, 2**16)))
        reply = parser.example(space.sample())
    reply = reply or draw(st.sampled_from(["Action: calculator(1 + 2)", "Answer: 3", "4"]))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(reply)))
        reply = reply[:i] + draw(st.text(alphabet=any_char, max_size=3)) + reply[i + 1 :]
    return draw(st.sampled_from(["", "Sure! ", "```json\n"])) + reply


def replies(name: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(alphabet=any_char),
        st.text(alphabet=json_syntax, max_size=60),
        json_documents(),
        several_objects(),
        nested(),
        huge(),
        mutated_example(name),
    )


def check_parse(name: str, text: str) -> float:
    """Parse ``text``: a contained action or ActionParseError, nothing else; return CPU seconds."""
    space, parser = PARSERS[name]
    start = time.process_time()
    try:
        action = parser.parse(text)
    except ActionParseError as error:
        assert isinstance(str(error), str)
        if not isinstance(parser, FunctionParser):
            assert error.reply == text
    else:
        if space is not None:
            assert space.contains(action), (action, space)
    return time.process_time() - start


# --- properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PARSERS)
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_any_reply_is_an_action_or_a_parse_error(name, data):
    text = data.draw(replies(name), label="reply")
    assert check_parse(name, text) < SLOW


# --- 1 MB replies, timed ----------------------------------------------------------------------

MEGABYTE_REPLIES = {
    "random-unicode": "".join(
        chr(c)
        for c in np.random.default_rng(0).integers(0, 0x10FFFF, MB)
        if not 0xD800 <= c < 0xE000
    ),
    "control-chars": "".join(chr(i % 32) for i in range(MB)),
    "lone-surrogates": "\ud800\udfff" * (MB // 2),
    "deep-arrays": "[" * (MB // 2) + "]" * (MB // 2),
    "deep-objects": '{"action":' * (MB // 11) + "1" + "}" * (MB // 11),
    "unclosed": "{" * MB,
    "one-huge-object": _dumps({"action": ["x"] * (MB // 5)}),
    "many-objects": '{"action": 1} ' * (MB // 14),
    "huge-number": '{"action": ' + "9" * MB + "}",
    "many-nans": "[" + "NaN, " * (MB // 5) + "NaN]",
    "quotes-and-escapes": '{"' + '\\"' * (MB // 2),
    "fences": "```json\n{" * (MB // 9),
    "prose-with-names": "hit stick up down left " * (MB // 23),
    "tool-calls": "Action: calculator(" * (MB // 19),
}


# The registered classic envs use the generated schemas above (named Discrete, one-number Box):
# two of them stand for the rest here, where each parse costs up to a second.
MEGABYTE_PARSERS = [n for n in PARSERS if not n.startswith("textgym/")]
MEGABYTE_PARSERS += ["textgym/Blackjack-v1", "textgym/Pendulum-v1"]


@pytest.mark.parametrize("reply", MEGABYTE_REPLIES)
def test_megabyte_replies_parse_in_bounded_time(reply):
    text = MEGABYTE_REPLIES[reply]
    assert len(text) >= MB * 0.9
    times = {name: check_parse(name, text) for name in MEGABYTE_PARSERS}
    slowest = max(times, key=times.__getitem__)
    assert times[slowest] < SLOW, f"{slowest} took {times[slowest]:.2f} s"


def test_parse_time_grows_linearly_with_reply_size():
    """10x the text costs about 10x the time, not 100x (the brace and fence scanners)."""
    piece = '{"action": "jump"} {"x": "}{"} ```json\n{"a": [1, {"b": "\\""}]}``` hit stick '

    def seconds(n: int) -> float:
        text = piece * n
        return min(check_parse("discrete-named", text) for _ in range(3))

    small, large = seconds(1_000), seconds(10_000)
    assert large < 30 * max(small, 1e-3), (small, large)


# --- through the env: a reply never crashes a step ------------------------------------------


@pytest.mark.parametrize("env_id", [i for i in registered_ids() if i in PARSERS])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_reply_steps_every_registered_env(env_id, data):
    env = gym.make(env_id, max_reply_chars=2 * MB)
    messages, _ = env.reset(seed=data.draw(st.integers(0, 100), label="seed"))
    for _ in range(data.draw(st.integers(1, 3), label="turns")):
        text = data.draw(replies(env_id), label="reply")
        start = time.process_time()
        messages, reward, terminated, truncated, info = env.step(text)
        assert time.process_time() - start < SLOW
        assert env.observation_space.contains(messages)
        assert math.isfinite(float(reward))
        assert info["reply"] == text and info["invalid"] == ("parse_error" in info)
        if terminated or truncated:
            break
    env.close()


def test_replies_over_the_limit_are_rejected_without_parsing():
    env = gym.make("textgym/Blackjack-v1")
    env.reset(seed=0)
    start = time.process_time()
    _, reward, _, _, info = env.step('{"action": "hit"}' + " " * MB)
    assert time.process_time() - start < 0.5
    assert info["parse_error"] == "reply is 1000017 characters long, over the limit of 4096"
    assert reward == -1.0  # the invalid-reply penalty: the env did not move


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (
            '{"action": "stick"} ' * 8 + '{"action": "hit"}',
            "ambiguous reply: it holds 9 JSON objects with different actions",
        ),
        (
            '{"action": "stick", "action": "hit"}',
            "invalid action: duplicate key 'action' in a JSON object",
        ),
    ],
)
def test_replies_that_hide_another_action_are_invalid_steps(reply, error):
    env = gym.make("textgym/Blackjack-v1")
    env.reset(seed=0)
    _, reward, _, _, info = env.step(reply)
    assert info["invalid"] and info["parse_error"] == error
    assert reward == -1.0  # the invalid-reply penalty: the env did not move
    env.close()


def test_calculator_commands_over_the_action_space_are_parse_errors():
    parser = CalculatorParser()
    reply = "answer:" + "1" * (MAX_COMMAND_CHARS - 7)  # the canonical form adds a space
    with pytest.raises(ActionParseError, match="^the command is 4097 characters long, over the"):
        parser.parse(reply)
    assert parser.parse(reply[:-1]) == "Answer: " + "1" * (MAX_COMMAND_CHARS - 8)


def test_huge_integers_in_a_non_uniform_space_are_parse_errors():
    parser = PARSERS["multi-discrete"][1]
    with pytest.raises(ActionParseError, match="a value is too large for the action space"):
        parser.parse('{"action": [' + "9" * 400 + ", 1]}")
