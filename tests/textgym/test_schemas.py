import json

import numpy as np
import pytest
from gymnasium import spaces
from pydantic import ValidationError

from textgym.schemas import ActionSchema, schema_from_space
from textgym.spaces import UnicodeText

UNSUPPORTED = (
    "Expected a Discrete, Box, MultiDiscrete, MultiBinary, Text, Dict or Tuple action space, "
    "got {}; pass a parser for this space"
)

SPACES = {
    "discrete": spaces.Discrete(5),
    "discrete-start": spaces.Discrete(3, start=-1),
    "multi-discrete": spaces.MultiDiscrete([2, 3, 4]),
    "multi-discrete-start": spaces.MultiDiscrete([3, 3], start=[-1, 5]),
    "multi-discrete-2d": spaces.MultiDiscrete(np.array([[2, 3], [4, 5]])),
    "multi-binary": spaces.MultiBinary(4),
    "multi-binary-1": spaces.MultiBinary(1),
    "multi-binary-2d": spaces.MultiBinary((2, 3)),
    "box-scalar": spaces.Box(-2.0, 2.0, (1,), np.float32),
    "box-0d": spaces.Box(-2.0, 2.0, (), np.float64),
    "box-1x1": spaces.Box(0.0, 1.0, (1, 1), np.float32),
    "box-1d": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "box-2d": spaces.Box(0.0, 1.0, (2, 3), np.float32),
    "box-int": spaces.Box(0, 10, (2,), np.int64),
    "box-uint8": spaces.Box(0, 255, (2, 2), np.uint8),
    "box-non-uniform": spaces.Box(
        np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32)
    ),
    "box-infinite": spaces.Box(-np.inf, np.inf, (2,), np.float32),
    "box-half-infinite": spaces.Box(
        np.array([0.0, -np.inf]), np.array([np.inf, 0.0]), dtype=np.float64
    ),
    "box-float64": spaces.Box(-1e6, 1e6, (2,), np.float64),
    "text": spaces.Text(5, min_length=1),
    "text-charset": spaces.Text(4, charset="ab"),
    "unicode-text": UnicodeText(6),
    "tuple": spaces.Tuple(
        (spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32), spaces.MultiBinary(2))
    ),
    "dict": spaces.Dict(
        {
            "my-key": spaces.Discrete(3),
            "class": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "model_config": spaces.MultiBinary(2),
            "plain": spaces.Discrete(2, start=1),
            "inner": spaces.Dict({"x": spaces.Discrete(2), "my-key": spaces.Box(0.0, 1.0, (1,))}),
        }
    ),
    "nested": spaces.Tuple((spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2),))}),)),
}


def assert_same_action(actual, expected):
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys()
        for key in expected:
            assert_same_action(actual[key], expected[key])
    elif isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same_action(a, e)
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
        assert np.array_equal(actual, expected)
    else:
        assert type(actual) is type(expected)
        assert actual == expected


def action_json(value):
    """The reply text '{"action": <value>}' for a JSON value written as text."""
    return '{"action": ' + str(value) + "}"


def parse(schema, text):
    return schema.to_action(schema.model.model_validate_json(text))


def error_types(schema, text):
    with pytest.raises(ValidationError) as error:
        schema.model.model_validate_json(text)
    return [(e["type"], e["loc"]) for e in error.value.errors()]


def error_messages(schema, text):
    with pytest.raises(ValidationError) as error:
        schema.model.model_validate_json(text)
    return [e["msg"] for e in error.value.errors()]


# --- Round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPACES)
def test_sampled_actions_roundtrip_through_json(name):
    space = SPACES[name]
    schema = schema_from_space(space)
    space.seed(0)
    for _ in range(50):
        action = space.sample()
        reply = json.dumps(schema.from_action(action).model_dump(mode="json", by_alias=True))
        back = parse(schema, reply)
        assert_same_action(back, action)
        assert space.contains(back)


def test_named_discrete_roundtrip():
    space = spaces.Discrete(3, start=10, seed=0)
    schema = schema_from_space(space, action_names=["left", "stay", "right"])
    for _ in range(20):
        action = space.sample()
        reply = schema.from_action(action).model_dump_json()
        name = ["left", "stay", "right"][action - 10]
        assert reply == '{"action":"' + name + '"}'
        assert_same_action(parse(schema, reply), action)


# --- Discrete -------------------------------------------------------------------------------


def test_discrete_without_names():
    schema = schema_from_space(spaces.Discrete(3, start=-1))
    assert isinstance(schema, ActionSchema)
    assert (schema.field, schema.names) == ("action", None)
    assert schema.actions == (np.int64(-1), np.int64(0), np.int64(1))
    assert [parse(schema, action_json(i)) for i in (-1, 0, 1)] == [-1, 0, 1]
    assert_same_action(parse(schema, '{"action": 1}'), np.int64(1))
    assert error_types(schema, '{"action": 2}') == [("less_than_equal", ("action",))]
    assert error_types(schema, '{"action": -2}') == [("greater_than_equal", ("action",))]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ('"left"', "int_parsing"),
        ("[1]", "int_type"),
        ('{"x": 1}', "int_type"),
        ("null", "int_type"),
        ("1.5", "int_from_float"),
        ("NaN", "finite_number"),
        ("Infinity", "finite_number"),
        ("-Infinity", "finite_number"),
        ("1e999", "finite_number"),
    ],
)
def test_discrete_rejects_wrong_types_and_non_finite(value, kind):
    schema = schema_from_space(spaces.Discrete(3))
    assert error_types(schema, action_json(value)) == [(kind, ("action",))]


def test_discrete_with_names_is_case_insensitive_and_respects_start():
    schema = schema_from_space(spaces.Discrete(2, start=5), action_names=["Stick", "hit"])
    assert schema.names == ("Stick", "hit")
    assert schema.actions == (np.int64(5), np.int64(6))
    for reply in ('"stick"', '"STICK"', '" Stick "', '"sTiCk"'):
        assert_same_action(parse(schema, action_json(reply)), np.int64(5))
    assert_same_action(parse(schema, '{"action": "HIT"}'), np.int64(6))
    assert schema.from_action(np.int64(5)).model_dump() == {"action": "Stick"}
    assert schema.from_action(6).model_dump() == {"action": "hit"}


@pytest.mark.parametrize("value", ['"fold"', '"hitting"', "1", "null", '["hit"]'])
def test_discrete_with_names_rejects_other_values(value):
    schema = schema_from_space(spaces.Discrete(2), action_names=["stick", "hit"])
    assert error_types(schema, action_json(value)) == [("literal_error", ("action",))]
    assert error_messages(schema, action_json(value)) == ["Input should be 'stick' or 'hit'"]


def test_large_discrete_lists_no_actions():
    assert schema_from_space(spaces.Discrete(1024)).actions is not None
    assert schema_from_space(spaces.Discrete(1025)).actions is None


@pytest.mark.parametrize(
    ("space", "names", "message"),
    [
        (spaces.Discrete(2), ["a"], "Expected 2 distinct action names for action, got ['a']"),
        (
            spaces.Discrete(2),
            ["hit", "HIT"],
            "Expected 2 distinct action names for action, got ['hit', 'HIT']",
        ),
        (
            spaces.Box(0, 1, (2,)),
            ["a", "b"],
            "Action names were given for action, but its space is not Discrete",
        ),
        (
            spaces.Discrete(2),
            {"action": ["a", "b"]},
            "action_names is a mapping, but the action space is not a Dict space",
        ),
        (
            spaces.Dict({"a": spaces.Discrete(2)}),
            ["up", "down"],  # not dict(["up", "down"])'s "... element #1 has length 4 ..."
            "For a Dict action space, action_names must map keys to name lists",
        ),
        (
            spaces.Dict({"a": spaces.Discrete(2)}),
            {"b": ["x", "y"]},
            "action_names has keys ['b'] that the Dict space lacks",
        ),
        (
            spaces.Dict({"a": spaces.Box(0, 1, (1,))}),
            {"a": ["x", "y"]},
            "Action names were given for a, but its space is not Discrete",
        ),
        (
            spaces.Dict({"a": spaces.Discrete(3)}),
            {"a": ["x", "y"]},
            "Expected 3 distinct action names for a, got ['x', 'y']",
        ),
    ],
)
def test_bad_action_names(space, names, message):
    with pytest.raises(ValueError) as error:
        schema_from_space(space, action_names=names)
    assert str(error.value) == message


def test_field_name_and_description():
    schema = schema_from_space(spaces.Discrete(2), field_name="move", description="Where to go.")
    properties = schema.model.model_json_schema()["properties"]
    assert list(properties) == ["move"]
    assert properties["move"]["description"] == "Where to go."
    assert schema.field == "move"
    assert_same_action(parse(schema, '{"move": 1}'), np.int64(1))
    assert error_types(schema, '{"action": 1}') == [
        ("missing", ("move",)),
        ("extra_forbidden", ("action",)),
    ]


# --- MultiDiscrete / MultiBinary ------------------------------------------------------------


def test_multi_discrete():
    space = spaces.MultiDiscrete([3, 4])
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [2, 3]}')
    assert_same_action(action, np.array([2, 3], dtype=np.int64))
    assert space.contains(action)
    assert error_messages(schema, '{"action": [3, 0]}') == [
        "Value error, value at [0] is 3, outside [0, 2]"
    ]
    assert error_types(schema, '{"action": [-1, 0]}') == [("greater_than_equal", ("action", 0))]
    assert error_types(schema, '{"action": [1]}') == [("too_short", ("action",))]
    assert error_types(schema, '{"action": [1, 1, 1]}') == [("too_long", ("action",))]
    assert error_types(schema, '{"action": 1}') == [("list_type", ("action",))]
    assert error_types(schema, '{"action": [1, 0.5]}') == [("int_from_float", ("action", 1))]
    assert error_types(schema, '{"action": [1, NaN]}') == [("finite_number", ("action", 1))]


def test_multi_discrete_with_start_and_uniform_nvec():
    space = spaces.MultiDiscrete([3, 3], start=[-1, -1])
    schema = schema_from_space(space)
    assert space.contains(parse(schema, '{"action": [-1, 1]}'))
    assert error_types(schema, '{"action": [2, 0]}') == [("less_than_equal", ("action", 0))]
    assert error_types(schema, '{"action": [-2, 0]}') == [("greater_than_equal", ("action", 0))]


def test_multi_discrete_2d():
    space = spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]))
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [[1, 2], [3, 4]]}')
    assert_same_action(action, np.array([[1, 2], [3, 4]], dtype=np.int64))
    assert space.contains(action)
    assert error_messages(schema, '{"action": [[1, 3], [3, 4]]}') == [
        "Value error, value at [0, 1] is 3, outside [0, 2]"
    ]
    assert error_types(schema, '{"action": [[1, 2, 0], [3, 4]]}') == [("too_long", ("action", 0))]
    assert error_types(schema, '{"action": [1, 2, 3, 4]}') == [("too_long", ("action",))]


def test_multi_binary():
    space = spaces.MultiBinary(3)
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [1, 0, 1]}')
    assert_same_action(action, np.array([1, 0, 1], dtype=np.int8))
    assert space.contains(action)
    assert error_types(schema, '{"action": [2, 0, 1]}') == [("less_than_equal", ("action", 0))]
    assert error_types(schema, '{"action": [1, 0]}') == [("too_short", ("action",))]
    one = spaces.MultiBinary(1)
    assert_same_action(parse(schema_from_space(one), '{"action": 1}'), np.array([1], np.int8))


# --- Box ------------------------------------------------------------------------------------


def test_box_of_one_number_takes_a_number():
    space = spaces.Box(-2.0, 2.0, (1,), np.float32)
    schema = schema_from_space(space, field_name="torque")
    action = parse(schema, '{"torque": 0.5}')
    assert_same_action(action, np.array([0.5], dtype=np.float32))
    assert space.contains(action)
    assert error_types(schema, '{"torque": [0.5]}') == [("float_type", ("torque",))]
    assert error_types(schema, '{"torque": 2.5}') == [("less_than_equal", ("torque",))]
    assert error_types(schema, '{"torque": -2.01}') == [("greater_than_equal", ("torque",))]
    for shape in [(), (1, 1)]:
        space = spaces.Box(-2.0, 2.0, shape, np.float32)
        action = parse(schema_from_space(space), '{"action": -2}')
        assert_same_action(action, np.full(shape, -2.0, dtype=np.float32))


def test_box_1d_and_2d():
    space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [0.25, -1, 1]}')
    assert_same_action(action, np.array([0.25, -1.0, 1.0], dtype=np.float32))
    assert space.contains(action)
    assert error_types(schema, '{"action": [0, 0]}') == [("too_short", ("action",))]
    assert error_types(schema, '{"action": [0, 0, 0, 0]}') == [("too_long", ("action",))]
    assert error_types(schema, '{"action": [0, 1.5, 0]}') == [("less_than_equal", ("action", 1))]
    assert error_types(schema, '{"action": [0, "a", 0]}') == [("float_parsing", ("action", 1))]
    assert error_types(schema, '{"action": 0}') == [("list_type", ("action",))]

    space = spaces.Box(0.0, 1.0, (2, 3), np.float32)
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [[0, 0.5, 1], [1, 0.5, 0]]}')
    assert action.shape == (2, 3) and space.contains(action)
    assert error_types(schema, '{"action": [0, 0.5, 1, 1, 0.5, 0]}')[-1] == (
        "too_long",
        ("action",),
    )
    assert error_types(schema, '{"action": [[0, 0.5, 1], [1, 0.5]]}') == [
        ("too_short", ("action", 1))
    ]


def test_box_int_dtype():
    space = spaces.Box(0, 10, (2,), np.int64)
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [3, 10]}')
    assert_same_action(action, np.array([3, 10], dtype=np.int64))
    assert space.contains(action)
    assert error_types(schema, '{"action": [3, 0.5]}') == [("int_from_float", ("action", 1))]
    assert error_types(schema, '{"action": [3, 11]}') == [("less_than_equal", ("action", 1))]


def test_box_non_uniform_bounds():
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32))
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [-1, 5]}')
    assert space.contains(action)
    assert error_messages(schema, '{"action": [0, 6]}') == [
        "Value error, value at [1] is 6, outside [0, 5]"
    ]
    assert error_messages(schema, '{"action": [-1.5, 6]}') == [
        "Value error, value at [0] is -1.5, outside [-1, 1]"
    ]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1.0, 1.0, (2,), np.float32),
        spaces.Box(-np.inf, np.inf, (2,), np.float32),
        spaces.Box(-np.inf, np.inf, (2,), np.float64),
        spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32)),
    ],
)
def test_box_rejects_non_finite_numbers(space, value):
    schema = schema_from_space(space)
    assert error_types(schema, action_json(f"[0, {value}]")) == [("finite_number", ("action", 1))]


def test_box_infinite_bounds_reject_numbers_that_overflow_the_dtype():
    space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [3e38, -1e-30]}')
    assert space.contains(action) and np.all(np.isfinite(action))
    assert error_messages(schema, '{"action": [0, 1e300]}') == [
        "Value error, value at [1] is 1e+300, outside [-3.40282e+38, 3.40282e+38]"
    ]
    one = schema_from_space(spaces.Box(-np.inf, np.inf, (1,), np.float32))
    assert error_messages(one, '{"action": -1e39}') == [
        "Value error, value is -1e+39, outside [-3.40282e+38, 3.40282e+38]"
    ]
    wide = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    assert wide.contains(parse(schema_from_space(wide), '{"action": [0, 1e300]}'))


def test_box_half_infinite_bounds():
    space = spaces.Box(np.array([0.0, -np.inf]), np.array([np.inf, 0.0]), dtype=np.float64)
    schema = schema_from_space(space)
    assert space.contains(parse(schema, '{"action": [1e100, -1e100]}'))
    assert error_messages(schema, '{"action": [-1, 0]}') == [
        "Value error, value at [0] is -1, outside [0, 1.79769e+308]"
    ]


@pytest.mark.parametrize("text", ['{"action": [0.5, 0.5], "extra": 1}', '{"extra": 1}'])
def test_box_rejects_extra_fields(text):
    schema = schema_from_space(spaces.Box(0.0, 1.0, (2,)))
    assert ("extra_forbidden", ("extra",)) in error_types(schema, text)


# --- Dict / Tuple / Text --------------------------------------------------------------------


def test_dict_keys_become_fields_even_when_not_identifiers():
    space = SPACES["dict"]
    schema = schema_from_space(space, action_names={"my-key": ["left", "stay", "right"]})
    assert schema.field is None and schema.actions is None and schema.names is None
    json_schema = schema.model.model_json_schema()
    assert set(json_schema["properties"]) == {"my-key", "class", "model_config", "plain", "inner"}
    reply = {
        "my-key": "RIGHT",
        "class": [0.5, -0.5],
        "model_config": [1, 0],
        "plain": 2,
        "inner": {"x": 1, "my-key": 0.25},
    }
    action = parse(schema, json.dumps(reply))
    assert space.contains(action)
    assert_same_action(
        action,
        {
            "class": np.array([0.5, -0.5], dtype=np.float32),
            "inner": {"my-key": np.array([0.25], dtype=np.float32), "x": np.int64(1)},
            "model_config": np.array([1, 0], dtype=np.int8),
            "my-key": np.int64(2),
            "plain": np.int64(2),
        },
    )
    assert schema.from_action(action).model_dump(by_alias=True, mode="json") == {
        **reply,
        "my-key": "right",
        "inner": {"x": 1, "my-key": 0.25},
    }


def test_dict_rejects_missing_extra_and_internal_field_names():
    schema = schema_from_space(
        spaces.Dict({"my-key": spaces.Discrete(2), "ok": spaces.Discrete(2)})
    )
    assert error_types(schema, '{"my-key": 1}') == [("missing", ("ok",))]
    assert error_types(schema, '{"my-key": 1, "ok": 0, "other": 0}') == [
        ("extra_forbidden", ("other",))
    ]
    # The internal attribute name of a non-identifier key is not part of the reply format.
    assert error_types(schema, '{"field_0": 1, "ok": 0}') == [
        ("missing", ("my-key",)),
        ("extra_forbidden", ("field_0",)),
    ]
    assert error_types(schema, '{"my-key": 2, "ok": 0}') == [("less_than_equal", ("my-key",))]
    assert error_types(schema, "[1, 0]") == [("model_type", ())]


def test_nested_dict_rejects_extra_fields_inside():
    schema = schema_from_space(spaces.Dict({"inner": spaces.Dict({"x": spaces.Discrete(2)})}))
    assert error_types(schema, '{"inner": {"x": 1, "y": 0}}') == [
        ("extra_forbidden", ("inner", "y"))
    ]
    assert error_types(schema, '{"inner": 1}') == [("model_type", ("inner",))]


def test_tuple():
    space = spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32)))
    schema = schema_from_space(space)
    action = parse(schema, '{"action": [1, [0.5, 0.25]]}')
    assert_same_action(action, (np.int64(1), np.array([0.5, 0.25], dtype=np.float32)))
    assert space.contains(action)
    assert error_types(schema, '{"action": [1]}') == [("missing", ("action", 1))]
    assert error_types(schema, '{"action": [1, [0.5, 0.25], 3]}') == [("too_long", ("action",))]
    assert error_types(schema, '{"action": [2, [0.5, 0.25]]}') == [
        ("less_than_equal", ("action", 0))
    ]
    assert error_types(schema, '{"action": [1, [0.5, NaN]]}') == [
        ("finite_number", ("action", 1, 1))
    ]


def test_text():
    space = spaces.Text(5, min_length=2, charset="abc")
    schema = schema_from_space(space)
    assert parse(schema, '{"action": "abca"}') == "abca"
    assert error_types(schema, '{"action": "a"}') == [("string_too_short", ("action",))]
    assert error_types(schema, '{"action": "abcabc"}') == [("string_too_long", ("action",))]
    assert error_types(schema, '{"action": 12}') == [("string_type", ("action",))]
    assert error_messages(schema, '{"action": "abxzy"}') == [
        "Value error, characters not allowed: 'xyz'"
    ]


def test_unicode_text():
    schema = schema_from_space(UnicodeText(3))
    assert parse(schema, '{"action": "é😀\\n"}') == "é😀\n"
    assert error_types(schema, '{"action": "abcd"}') == [("string_too_long", ("action",))]


# --- Unsupported spaces ---------------------------------------------------------------------


class CustomSpace(spaces.Space):
    pass


@pytest.mark.parametrize(
    ("space", "name"),
    [
        (spaces.Graph(spaces.Box(0, 1, (2,)), None), "Graph"),
        (spaces.Sequence(spaces.Discrete(2)), "Sequence"),
        (spaces.OneOf([spaces.Discrete(2), spaces.Discrete(3)]), "OneOf"),
        (CustomSpace(), "CustomSpace"),
        (spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2)))), "Sequence"),
        (spaces.Dict({"g": spaces.Graph(spaces.Discrete(2), None)}), "Graph"),
    ],
)
def test_unsupported_spaces_raise_type_error(space, name):
    with pytest.raises(TypeError) as error:
        schema_from_space(space)
    assert str(error.value) == UNSUPPORTED.format(name)


def test_named_discrete_from_action_rejects_out_of_range_actions():
    schema = schema_from_space(spaces.Discrete(2, start=1), action_names=["a", "b"])
    assert schema.from_action(2).model_dump() == {"action": "b"}
    for bad in (0, 3, -1):
        with pytest.raises(ValueError, match=rf"action {bad} is not in Discrete\(2, start=1\)"):
            schema.from_action(bad)
