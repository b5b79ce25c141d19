import json
import time
from typing import Literal

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from textgym.instructions import describe_model
from textgym.parsers import (
    ActionParseError,
    ActionParser,
    FunctionParser,
    JSONActionParser,
    as_parser,
)
from textgym.schemas import schema_from_space

NO_JSON = "no JSON object found in the reply"
NO_NAME = NO_JSON + " and no action name (stick, hit, double down)"


def blackjack(**kwargs):
    names = ["stick", "hit", "double down"]
    return JSONActionParser.from_space(spaces.Discrete(3), action_names=names, **kwargs)


def parse_error(parser, text):
    with pytest.raises(ActionParseError) as error:
        parser.parse(text)
    assert error.value.reply == text
    return error.value


class Bet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(ge=1, le=10)
    all_in: bool = False

    def to_action(self):
        return 100 if self.all_in else self.amount * 10

    @classmethod
    def from_action(cls, action):
        return cls(amount=action // 10)


class Move(BaseModel):
    model_config = ConfigDict(extra="forbid")
    direction: Literal["left", "right"]


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: str
    count: int = Field(ge=1)


# --- Extraction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('{"action": "hit"}', 1),
        ('```json\n{"action": "hit"}\n```', 1),
        ('```JSON\n{"action": "hit"}```', 1),
        ('```\n{"action": "stick"}\n```', 0),
        ('Thinking... I have 12.\n```json\n{"action": "hit"}\n```\nGood luck!', 1),
        ('I will play safe. {"action": "stick"} That is all.', 0),
        ('{"action": "Double Down"}', 2),
        ('  {\n  "action" : "HIT"\n}  ', 1),
        ('{"action": "hit"} and again {"action": "HIT"}', 1),  # objects that agree
        ('Not {this} one, {"action": "stick"}', 0),  # invalid candidates are skipped
        ('{"note": "x"} {"action": "hit"}', 1),
    ],
)
def test_json_replies(text, action):
    assert blackjack().parse(text) == action


def test_fenced_block_wins_over_objects_in_prose():
    parser = blackjack()
    assert parser.parse('Earlier I said {"action": "stick"}.\n```json\n{"action": "hit"}\n```') == 1


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('{"action": "}"} hit', 1),  # a brace inside a string does not end the object
        ('{"note": "{", "action": "stick"}', None),  # extra field: rejected, never "stick"
        ('{"note": "}{", "answer": "x"} stick', 0),
    ],
)
def test_braces_inside_json_strings(text, action):
    parser = blackjack()
    if action is None:
        error = parse_error(parser, text)
        assert str(error) == "invalid action: note: Extra inputs are not permitted"
    else:
        assert parser.parse(text) == action


def test_escaped_quotes_and_braces_in_strings():
    parser = JSONActionParser.from_space(spaces.Text(20, charset='ab"}{\\ '))
    assert parser.parse(r'Reply: {"action": "a\"}b"} done') == 'a"}b'
    assert parser.parse(r'{"action": "a\\"} trailing "}') == "a\\"
    assert parser.parse(r'{"action": "\\\"{"}') == '\\"{'


def test_objects_that_disagree_are_ambiguous():
    error = parse_error(blackjack(), '{"action": "hit"} or maybe {"action": "stick"}')
    assert str(error) == "ambiguous reply: it holds 2 JSON objects with different actions"
    assert error.validation_error is None
    fenced = '```json\n{"action": "hit"}\n```\n```json\n{"action": "stick"}\n```'
    assert str(parse_error(blackjack(), fenced)) == (
        "ambiguous reply: it holds 2 JSON objects with different actions"
    )


AMBIGUOUS = "ambiguous reply: it holds {} JSON objects with different actions"


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ('{"action": "stick"} ' * 9 + '{"action": "hit"}', 10),
        ('{"action": "stick"} ' * 8 + '{"action": "hit"}', 9),  # the 9th object used to be unread
        ('{"action": "stick"}\n' * 50 + '{"action": "hit"}' + '{"action": "stick"}' * 50, 101),
        ('```json\n{"action": "stick"}\n```\n' * 8 + '```json\n{"action": "hit"}\n```', 9),
        ('{"action": "jump"} ' * 20 + '{"action": "stick"} {"action": "hit"}', 2),
    ],
)
def test_every_object_must_agree_however_many(text, valid):
    assert str(parse_error(blackjack(), text)) == AMBIGUOUS.format(valid)


def test_many_agreeing_objects_are_one_action():
    forms = ['{"action": "hit"}', '{"action":"HIT"}', '{ "action" : "Hit" }', '{"action": "hiT"}']
    assert blackjack().parse("\n".join(forms * 25)) == 1  # 100 objects, 4 spellings
    rejected_first = '{"action": "jump"} ' * 8 + " and ".join(forms * 25)
    assert blackjack().parse(rejected_first) == 1  # more than 8 objects before the valid ones


DUPLICATE = "invalid action: duplicate key {!r} in a JSON object"


@pytest.mark.parametrize(
    "text",
    [
        '{"action": "stick", "action": "hit"}',
        '{"action": "hit", "action": "hit"}',  # even when the values agree
        '```json\n{"action": "hit",\n "action": "stick"}\n```',
        '{"action": "hit"} ' * 20 + '{"action": "hit", "action": "hit"}',
        '{"action": "stick", "action": "jump"} {"action": "hit"}',  # first value would disagree
        '{"action": "hit", "action": "hitt"} stick',  # no falling back on names either
        '{"action": "stick", "\u0061ction": "hit"}',  # the same key, escaped
    ],
)
def test_duplicate_keys_make_a_reply_invalid(text):
    for parser in (blackjack(), blackjack(lenient=False)):
        error = parse_error(parser, text)
        assert str(error) == DUPLICATE.format("action")
        assert error.validation_error is None


class Trade(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: Order


@pytest.mark.parametrize(
    ("parser", "text", "key"),
    [
        (JSONActionParser(Trade), '{"order": {"item": "a", "count": 1, "count": 9}}', "count"),
        (
            JSONActionParser.from_space(
                spaces.Tuple((spaces.Dict({"a": spaces.Discrete(2)}), spaces.Discrete(2)))
            ),
            '{"action": [{"a": 0, "a": 1}, 1]}',
            "a",
        ),
        (blackjack(), '{"action": "hit", "note": {"x": [{"y": 1, "y": 2}]}}', "y"),
    ],
)
def test_duplicate_keys_in_nested_objects_make_a_reply_invalid(parser, text, key):
    assert str(parse_error(parser, text)) == DUPLICATE.format(key)


def test_duplicate_check_reads_strings_huge_numbers_and_nan():
    parser = JSONActionParser(Order)
    assert parser.parse('{"item": "{\\"item\\": 1, \\"item\\": 2}", "count": 2}') == {
        "item": '{"item": 1, "item": 2}',
        "count": 2,
    }
    big = '{"item": "a", "count": ' + "9" * 5000 + ', "count": 1}'  # over int()'s digit limit
    assert str(parse_error(parser, big)) == DUPLICATE.format("count")
    nan = '{"item": "a", "count": NaN, "count": 1}'
    assert str(parse_error(parser, nan)) == DUPLICATE.format("count")


def test_checking_every_object_stays_linear():
    """Distinct two-key objects (each parsed for duplicates), then the one that disagrees."""

    def seconds(n: int) -> float:
        text = "".join(f'{{"action": "hit", "n": {i}}} ' for i in range(n))
        text += '{"action": "stick", "action": "stick"}'
        start = time.process_time()
        assert str(parse_error(blackjack(), text)) == DUPLICATE.format("action")
        return time.process_time() - start

    small, large = seconds(5_000), seconds(50_000)  # 50,000 objects: 1.3 MB
    assert large < 30 * max(small, 1e-3), (small, large)
    assert large < 2.0


# --- Lenient: names in free text and bare values --------------------------------------------


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("hit", 1),
        ("Hit me!", 1),
        ("I'll STICK.", 0),
        ("stick\n", 0),
        ("double down", 2),
        ("Let's DOUBLE DOWN, why not", 2),
        ('"hit"', 1),
        ("Action: hit", 1),
        ("hit. Definitely hit.", 1),
        ("ſtick", 0),  # re's case folding matches "ſ" to "s"
        ("HİT", 1),  # and "İ" to "i"
        ('{"action": "jump"} no wait, hit', 1),
    ],
)
def test_action_names_in_free_text(text, action):
    assert blackjack().parse(text) == action


@pytest.mark.parametrize("text", ["hitting", "I'm a hitter", "sticky", "hit-me", "shit", "double"])
def test_action_names_need_word_boundaries(text):
    assert str(parse_error(blackjack(), text)) == NO_NAME


@pytest.mark.parametrize(
    ("text", "listed"),
    [
        ("I will hit or stick", "stick, hit"),
        ("stick? HIT? double down?", "stick, hit, double down"),
        ("Hit, no, double down", "hit, double down"),
    ],
)
def test_two_names_are_ambiguous(text, listed):
    error = parse_error(blackjack(), text)
    assert str(error) == f"ambiguous reply: it names several actions ({listed})"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"action": "hit", "confidence": 0.9}', "confidence: Extra inputs are not permitted"),
        ('{"action": "stick", "note": "not hit"}', "note: Extra inputs are not permitted"),
        ('{"action": "hit me"}', "action: Input should be 'stick', 'hit' or 'double down'"),
        (
            '```json\n{"move": "hit"}\n```',
            "action: Field required; move: Extra inputs are not permitted",
        ),
    ],
)
def test_names_inside_rejected_json_do_not_count(text, message):
    error = parse_error(blackjack(), text)
    assert str(error) == f"invalid action: {message}"
    assert isinstance(error.validation_error, ValidationError)


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "I fold", "1", "[1]", "{}"[:1]])
def test_nothing_to_parse(text):
    assert str(parse_error(blackjack(), text)) == NO_NAME


def test_not_lenient_needs_json():
    parser = blackjack(lenient=False)
    assert parser.parse('{"action": "HIT"}') == 1
    for text in ["hit", '"hit"']:
        assert str(parse_error(parser, text)) == NO_JSON
    strict_box = JSONActionParser.from_space(spaces.Box(0.0, 1.0, (2,)), lenient=False)
    assert str(parse_error(strict_box, "[1, 0]")) == NO_JSON


@pytest.mark.parametrize(
    ("space", "text", "action"),
    [
        (spaces.Discrete(3), "1", np.int64(1)),
        (spaces.Discrete(3), " 2 \n", np.int64(2)),
        (spaces.Discrete(3), "```json\n2\n```", np.int64(2)),
        (spaces.Box(-1.0, 1.0, (1,), np.float32), "0.5", np.array([0.5], np.float32)),
        (spaces.Box(-1.0, 1.0, (1,), np.float32), "-1", np.array([-1.0], np.float32)),
        (spaces.MultiBinary(2), "[1, 0]", np.array([1, 0], np.int8)),
        (spaces.Box(0.0, 1.0, (2,), np.float32), "[1, 0]", np.array([1.0, 0.0], np.float32)),
        (spaces.Text(5), '"abc"', "abc"),
    ],
)
def test_bare_json_values_for_one_field_models(space, text, action):
    result = JSONActionParser.from_space(space).parse(text)
    assert np.array_equal(result, action) and space.contains(result)


@pytest.mark.parametrize(
    ("space", "text", "message"),
    [
        (
            spaces.Discrete(3),
            "3",
            "invalid action: action: Input should be less than or equal to 2",
        ),
        (spaces.Discrete(3), "true", None),  # pydantic's lax mode: true -> 1 (left alone)
        (
            spaces.Box(-1.0, 1.0, (1,), np.float32),
            "[0.5]",
            "invalid action: action: Input should be a valid number",
        ),
        (
            spaces.Box(-1.0, 1.0, (1,), np.float32),
            "NaN",
            NO_JSON,  # NaN is not a JSON value on its own
        ),
        (
            spaces.Box(-1.0, 1.0, (1,), np.float32),
            "-Infinity",
            "invalid action: action: Input should be a finite number",
        ),
        (
            spaces.Box(-1.0, 1.0, (1,), np.float32),
            "1e999",
            "invalid action: action: Input should be a finite number",
        ),
        (
            spaces.MultiBinary(2),
            "[1, 0, 1]",
            "invalid action: action: List should have at most 2 items after validation, not 3",
        ),
        (spaces.MultiBinary(2), "[1, 0] [0, 1]", NO_JSON),
        (spaces.Discrete(3), '"\ud800"', NO_JSON),  # a lone surrogate is not UTF-8
        (spaces.Discrete(3), "[" * 100, NO_JSON),
    ],
)
def test_bare_json_values_that_are_invalid(space, text, message):
    parser = JSONActionParser.from_space(space)
    if message is None:
        assert parser.parse(text) == 1
    else:
        assert str(parse_error(parser, text)) == message


INVALID_BOX_REPLIES = {
    '{"action": [0.5, 0.5], "extra": 1}': "extra: Extra inputs are not permitted",
    '{"action": [0.5]}': "action: List should have at least 2 items after validation, not 1",
    '{"action": [0.5, "x"]}': (
        "action.1: Input should be a valid number, unable to parse string as a number"
    ),
    '{"action": "0.5, 0.5"}': "action: Input should be a valid array",
    '{"action": [2, 0]}': "action.0: Input should be less than or equal to 1",
    '{"action": [NaN, 0]}': "action.0: Input should be a finite number",
    '{"action": [1e999, 0]}': "action.0: Input should be a finite number",
    '{"Action": [0, 0]}': "action: Field required; Action: Extra inputs are not permitted",
    '{"action": [0, 0],}': "Invalid JSON: trailing comma at line 1 column 19",
}


@pytest.mark.parametrize(("text", "message"), INVALID_BOX_REPLIES.items())
def test_json_that_does_not_validate(text, message):
    error = parse_error(JSONActionParser.from_space(spaces.Box(-1.0, 1.0, (2,))), text)
    assert str(error) == f"invalid action: {message}"
    assert isinstance(error.validation_error, ValidationError)


def test_first_validation_error_is_reported():
    parser = JSONActionParser.from_space(spaces.Discrete(2))
    error = parse_error(parser, '{"action": 5} then {"action": "x"}')
    assert str(error) == "invalid action: action: Input should be less than or equal to 1"


def test_long_error_messages_are_shortened():
    parser = JSONActionParser.from_space(spaces.MultiBinary(100))
    error = parse_error(parser, json.dumps({"action": ["x"] * 100}))
    assert len(str(error)) == len("invalid action: ") + 500
    assert str(error).endswith("…")
    assert len(error.validation_error.errors()) == 100


def test_parse_rejects_non_strings():
    with pytest.raises(ActionParseError) as error:
        blackjack().parse(1)
    assert str(error.value) == "expected the reply as str, got int"


def test_lone_surrogates_never_escape_as_other_errors():
    parser = JSONActionParser.from_space(spaces.Text(5))
    for text in ["\ud800", '"\ud800"', '{"action": "\ud800"}', "```json\n\udfff\n```"]:
        parse_error(parser, text)


# --- Pathological replies -------------------------------------------------------------------

PATHOLOGICAL = {
    "deep-lists": "[" * 100_000,
    "deep-lists-closed": "[" * 50_000 + "]" * 50_000,
    "deep-objects": "{" * 100_000,
    "deep-objects-closed": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "deep-braces-closed": "{" * 50_000 + "}" * 50_000,
    "quotes": '"' * 1_000_000,
    "backticks": "`" * 1_000_000,
    "open-fence": "```json\n" + "a" * 1_000_000,
    "fences": "```json\n" * 120_000,
    "escapes": "{" + '"\\' * 500_000,
    "letters": "x" * 1_000_000,
    "names": "hit " * 250_000,
    "big-number": "9" * 1_000_000,
    "long-list": "[" + "1," * 400_000 + "1]",
    "many-objects": '{"action": "hit"} ' * 50_000,
    "many-bad-objects": '{"action": "jump"} ' * 50_000 + "hit",
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_replies_fail_fast_and_cleanly(name):
    text = PATHOLOGICAL[name]
    start = time.process_time()  # CPU time: other jobs on a shared machine do not count
    try:
        result = blackjack().parse(text)  # tries every path: JSON, bare value, names
    except ActionParseError:
        assert name not in ("names", "many-objects", "many-bad-objects")
    else:
        assert name in ("names", "many-objects", "many-bad-objects") and result == 1
    assert time.process_time() - start < 2.0


@pytest.mark.parametrize("name", ["deep-lists", "deep-lists-closed", "big-number", "long-list"])
def test_pathological_bare_values_fail_fast_and_cleanly(name):
    parser = JSONActionParser.from_space(spaces.Box(0.0, 1.0, (2,)))  # bare errors are raised
    start = time.process_time()
    with pytest.raises(ActionParseError):
        parser.parse(PATHOLOGICAL[name])
    assert time.process_time() - start < 2.0


# --- User models ----------------------------------------------------------------------------


def test_user_model_with_to_action_and_from_action():
    parser = JSONActionParser(Bet)
    assert parser.parse('{"amount": 3}') == 30
    assert parser.parse('{"amount": 3, "all_in": true}') == 100
    assert parser.example(70) == '{"amount": 7, "all_in": false}'
    assert parser.choices() is None
    assert parser.schema.field is None
    assert str(parse_error(parser, "3")) == NO_JSON  # no bare values for multi-field models
    error = parse_error(parser, '{"amount": 11}')
    assert str(error) == "invalid action: amount: Input should be less than or equal to 10"
    assert parser.instructions() == (
        "Reply with a JSON object with exactly these fields:\n"
        '- "amount": integer from 1 to 10\n'
        '- "all_in": true or false\n'
        'Example reply: {"amount": 1, "all_in": false}'
    )


def test_user_model_with_one_field():
    parser = as_parser(Move, spaces.Discrete(2))
    assert isinstance(parser, JSONActionParser)
    assert parser.parse('{"direction": "left"}') == "left"
    assert parser.parse('"right"') == "right"
    assert parser.example("left") is None  # no from_action: cannot write replies
    assert parser.choices() is None
    error = parse_error(parser, "right")  # names are only known for generated schemas
    assert str(error) == NO_JSON
    assert str(parse_error(parser, '"up"')) == (
        "invalid action: direction: Input should be 'left' or 'right'"
    )
    assert parser.instructions() == describe_model(Move, '{"direction": "left"}')


def test_user_model_with_several_fields_maps_to_its_dump():
    parser = JSONActionParser(Order)
    assert parser.parse('{"item": "tea", "count": 2}') == {"item": "tea", "count": 2}
    assert str(parse_error(parser, '{"item": "tea", "count": 2, "price": 1}')) == (
        "invalid action: price: Extra inputs are not permitted"
    )
    assert str(parse_error(parser, '{"item": "tea"}')) == "invalid action: count: Field required"


def test_to_action_and_from_action_overrides():
    parser = JSONActionParser(
        Order, to_action=lambda m: (m.item, m.count), from_action=lambda a: Order(item=a, count=1)
    )
    assert parser.parse('{"item": "tea", "count": 2}') == ("tea", 2)
    assert parser.example("milk") == '{"item": "milk", "count": 1}'


def test_to_action_errors_become_parse_errors():
    def boom(model):
        raise KeyError("no such item")

    parser = JSONActionParser(Order, to_action=boom)
    error = parse_error(parser, '{"item": "tea", "count": 2}')
    assert str(error) == "could not convert the reply to an action: 'no such item'"
    assert isinstance(error.__cause__, KeyError)


@pytest.mark.parametrize("model", [42, Order(item="x", count=1), dict, "Order"])
def test_json_parser_rejects_other_models(model):
    with pytest.raises(TypeError) as error:
        JSONActionParser(model)
    assert str(error.value) == f"Expected a Pydantic model class or ActionSchema, got {model!r}"


# --- choices / example / instructions -------------------------------------------------------


def test_choices_and_examples_for_finite_action_sets():
    parser = blackjack()
    choices = ['{"action": "stick"}', '{"action": "hit"}', '{"action": "double down"}']
    assert parser.choices() == choices
    assert [parser.parse(c) for c in choices] == [0, 1, 2]
    assert parser.example(2) == '{"action": "double down"}'
    plain = JSONActionParser.from_space(spaces.Discrete(3, start=1))
    assert plain.choices() == ['{"action": 1}', '{"action": 2}', '{"action": 3}']
    assert JSONActionParser.from_space(spaces.Discrete(2000)).choices() is None
    assert JSONActionParser.from_space(spaces.Box(0.0, 1.0, (2,))).choices() is None


@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(4, start=-2),
        spaces.Box(-2.0, 2.0, (1,), np.float32),
        spaces.Box(-np.inf, np.inf, (2, 2), np.float32),
        spaces.MultiDiscrete([3, 5]),
        spaces.MultiBinary(3),
        spaces.Text(6),
        spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32))),
        spaces.Dict({"my-key": spaces.Discrete(2), "class": spaces.Box(0.0, 1.0, (1,))}),
    ],
)
def test_example_replies_parse_back_to_their_action(space):
    parser = JSONActionParser.from_space(space)
    space.seed(5)
    for _ in range(20):
        action = space.sample()
        result = parser.parse(parser.example(action))
        assert space.contains(result)
        assert json.dumps(parser.example(result)) == json.dumps(parser.example(action))


def test_examples_keep_unicode_and_dict_keys():
    assert JSONActionParser.from_space(spaces.Text(3, charset="éa")).example("éa") == (
        '{"action": "éa"}'
    )
    parser = JSONActionParser.from_space(spaces.Dict({"my-key": spaces.Discrete(2)}))
    assert parser.example({"my-key": 1}) == '{"my-key": 1}'


def test_generated_instructions():
    assert blackjack().instructions() == (
        "Reply with a JSON object with exactly these fields:\n"
        '- "action": one of "stick", "hit", "double down"\n'
        'Example reply: {"action": "stick"}'
    )
    box = JSONActionParser.from_space(
        spaces.Box(-2.0, 2.0, (1,), np.float32), field_name="torque", description="Motor torque."
    )
    assert box.instructions() == (
        "Reply with a JSON object with exactly these fields:\n"
        '- "torque": number from -2.0 to 2.0. Motor torque.\n'
        'Example reply: {"torque": -2.0}'
    )


def test_instructions_without_a_valid_example():
    # Per-element bounds are not in the JSON schema, so the schema walker's zeros can fail.
    space = spaces.Box(np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32))
    parser = JSONActionParser.from_space(space)
    assert parser.instructions() == (
        'Reply with a JSON object with exactly these fields:\n- "action": a list of 2 × (number)'
    )


# --- FunctionParser / as_parser -------------------------------------------------------------


def test_function_parser():
    parser = FunctionParser(lambda reply: {"stick": 0, "hit": 1}[reply.strip()], "Say hit.")
    assert parser.parse(" hit ") == 1
    assert parser.instructions() == "Say hit."
    assert parser.example(1) is None and parser.choices() is None
    error = parse_error(parser, "fold")
    assert str(error) == "KeyError: 'fold'"
    assert isinstance(error.__cause__, KeyError)
    assert FunctionParser(int).instructions() == ""


def test_function_parser_errors():
    def long_error(reply):
        raise ValueError("x" * 1000)

    assert str(parse_error(FunctionParser(long_error), "a")) == "ValueError: " + "x" * 499 + "…"

    original = ActionParseError("custom message", reply="a")

    def raises_parse_error(reply):
        raise original

    with pytest.raises(ActionParseError) as error:
        FunctionParser(raises_parse_error).parse("a")
    assert error.value is original
    with pytest.raises(TypeError) as error:
        FunctionParser("not callable")
    assert str(error.value) == "Expected a callable reply -> action, got 'not callable'"


def test_as_parser():
    space = spaces.Discrete(2)
    generated = as_parser(None, space, action_names=["stick", "hit"], field_name="move")
    assert isinstance(generated, JSONActionParser) and generated.parse('{"move": "hit"}') == 1
    existing = FunctionParser(len)
    assert as_parser(existing, space) is existing
    assert as_parser(Move, space).model is Move
    schema = schema_from_space(space)
    assert as_parser(schema, space).schema is schema
    function = as_parser(len, space)
    assert isinstance(function, FunctionParser) and function.parse("abc") == 3


def test_as_parser_errors():
    with pytest.raises(TypeError) as error:
        as_parser(42, spaces.Discrete(2))
    assert str(error.value) == (
        "Expected parser to be None, an ActionParser, a Pydantic model class or a callable "
        "reply -> action, got int"
    )
    with pytest.raises(ValueError) as error:
        as_parser(Move, spaces.Discrete(2), action_names=["a", "b"], description="d")
    assert str(error.value) == "['action_names', 'description'] only apply when no parser is given"
    with pytest.raises(TypeError) as error:
        as_parser(None, spaces.Sequence(spaces.Discrete(2)))
    assert str(error.value).endswith("got Sequence; pass a parser for this space")


def test_action_parser_is_abstract_with_optional_hooks():
    with pytest.raises(TypeError):
        ActionParser()

    class Minimal(ActionParser):
        def parse(self, text):
            return 0

        def instructions(self):
            return ""

    parser = Minimal()
    assert parser.example(0) is None and parser.choices() is None
    assert parser.bind(None) is None


def test_action_parse_error_attributes():
    error = ActionParseError("bad", reply="text")
    assert isinstance(error, ValueError)
    assert (str(error), error.reply, error.validation_error) == ("bad", "text", None)


# --- Property: any text parses to a contained action or raises ActionParseError -------------

PROPERTY_SPACES = {
    "discrete-names": (spaces.Discrete(3), {"action_names": ["stick", "hit", "double down"]}),
    "discrete": (spaces.Discrete(3, start=-1), {}),
    "box": (spaces.Box(-1.0, 1.0, (2,), np.float32), {}),
    "box-scalar": (spaces.Box(-np.inf, np.inf, (1,), np.float32), {}),
    "multi-binary": (spaces.MultiBinary(2), {}),
    "dict": (
        spaces.Dict({"my-key": spaces.Discrete(2), "class": spaces.Box(-1.0, 1.0, (2,))}),
        {"action_names": {"my-key": ["up", "down"]}},
    ),
}
PROPERTY_PARSERS = {
    name: JSONActionParser.from_space(space, **options)
    for name, (space, options) in PROPERTY_SPACES.items()
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=5)
    | st.sampled_from(["stick", "HIT", "up", "Down"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["action", "my-key", "class", "x"]) | st.text(max_size=3),
            children,
            max_size=3,
        )
    ),
    max_leaves=8,
)
replies = st.one_of(
    st.text(),
    st.text(alphabet='{}[]"\\:, 0123456789.-eEaNnIfinity`json\nhitstickupdown', max_size=40),
    st.builds(
        lambda before, value, after: before + json.dumps(value) + after,
        st.text(max_size=8),
        json_values,
        st.sampled_from(["", "\n```", " hit", " {", "}"]),
    ),
    st.builds(lambda value: "```json\n" + json.dumps(value) + "\n```", json_values),
)


@st.composite
def mutated_examples(draw, name):
    """A valid reply for a sampled action, with a few characters replaced and text around it."""
    space, parser = PROPERTY_SPACES[name][0], PROPERTY_PARSERS[name]
    space.seed(draw(st.integers(0, 10_000)))
    reply = parser.example(space.sample())
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(reply)))
        reply = reply[:i] + draw(st.text(max_size=2)) + reply[i + 1 :]
    before = draw(st.sampled_from(["", "Sure: ", "```json\n", "hit "]))
    return before + reply + draw(st.sampled_from(["", " stick", "\n```", " {", "}"]))


@pytest.mark.parametrize("name", PROPERTY_SPACES)
@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_text_parses_to_a_contained_action_or_raises_parse_error(name, data):
    text = data.draw(replies | mutated_examples(name), label="reply")
    try:
        action = PROPERTY_PARSERS[name].parse(text)
    except ActionParseError as error:
        assert error.reply == text
    else:
        assert PROPERTY_SPACES[name][0].contains(action)
