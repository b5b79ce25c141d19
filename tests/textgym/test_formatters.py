import numpy as np
import pytest
from gymnasium import spaces

from textgym.formatters import (
    Formatter,
    FunctionFormatter,
    GenericFormatter,
    TemplateFormatter,
    as_formatter,
    render_value,
)
from textgym.spaces import ChatMessages, UnicodeText

NUMPY_REPRS = ("array(", "np.", "dtype", "float32", "int64")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.int64(14), "14"),
        (np.int8(-3), "-3"),
        (np.uint8(255), "255"),
        (np.float32(0.1), "0.1"),
        (np.float64(1 / 3), "0.333"),
        (np.float32(2 / 3), "0.667"),
        (np.bool_(True), "true"),
        (np.bool_(False), "false"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-0.0, "0.0"),
        (np.float32(-0.0), "0.0"),
        (-0.0001, "0.0"),
        (0.0004, "0.0"),
        (0.0006, "0.001"),
        (-1.23456, "-1.235"),
        (2.0, "2.0"),
        (123456.789012, "123456.789"),
        (1e20, "1e+20"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (np.float32(-np.inf), "-inf"),
        ("text", "text"),
        (np.str_("numpy text"), "numpy text"),
        (None, "None"),
        (np.array(3.5), "3.5"),
        (np.array([], dtype=np.float32), "[]"),
        (np.array([0.123456, -0.00001], dtype=np.float32), "[0.123, 0.0]"),
        (np.array([[1, 2], [3, 4]], dtype=np.int8), "[[1, 2], [3, 4]]"),
        (np.array([True, False]), "[true, false]"),
        ((14, np.int64(10), False), "(14, 10, false)"),
        ((), "()"),
        ({"pos": np.array([1, 2]), "done": np.int8(1)}, "{pos: [1, 2], done: 1}"),
        ({"a": {"b": (np.float64(0.5), [np.int64(1)])}}, "{a: {b: (0.5, [1])}}"),
        ([(1, 2.25), {"x": -0.0}], "[(1, 2.25), {x: 0.0}]"),
    ],
)
def test_render_value(value, expected):
    assert render_value(value) == expected


@pytest.mark.parametrize(
    ("precision", "expected"),
    [(0, "[2.0, 0.0, 0.0]"), (1, "[1.5, -0.1, 0.0]"), (5, "[1.54321, -0.12346, 4e-05]")],
)
def test_render_value_precision(precision, expected):
    assert render_value([1.54321, -0.123456, 0.00004], precision) == expected


# --- GenericFormatter -----------------------------------------------------------------------


def test_generic_formatter_one_line():
    fmt = GenericFormatter()
    assert fmt(np.int64(3), {}) == "Observation: 3"
    assert fmt((15, 2, 0), {"ignored": 1}) == "Observation: (15, 2, 0)"
    assert fmt(np.array([0.5, -0.25]), {}) == "Observation: [0.5, -0.25]"
    assert fmt("a b", {}) == "Observation: a b"
    custom = GenericFormatter(precision=1, prefix="State:")
    assert custom(np.array([0.5678]), {}) == "State: [0.6]"


def test_generic_formatter_dict_one_line_per_key():
    obs = {"agent": np.array([1, 2]), "hp": np.float32(0.25), "inner": {"x": (1, 2)}}
    assert GenericFormatter()(obs, {}) == (
        "Observation:\n- agent: [1, 2]\n- hp: 0.25\n- inner: {x: (1, 2)}"
    )
    # Labels apply to flat vectors and tuples, not to dicts (which carry their own keys).
    assert GenericFormatter(labels=["a", "b", "c"])({"k": 1}, {}) == "Observation:\n- k: 1"


def test_generic_formatter_with_labels():
    fmt = GenericFormatter(labels=("position", "velocity"))
    assert fmt(np.array([-0.5234, 0.0012]), {}) == (
        "Observation:\n- position: -0.523\n- velocity: 0.001"
    )
    assert fmt(np.array([[1.0], [2.0]]), {}) == "Observation:\n- position: 1.0\n- velocity: 2.0"
    hand = GenericFormatter(labels=["player sum", "dealer card", "usable ace"])
    assert hand((np.int64(14), np.int64(10), np.int64(1)), {}) == (
        "Observation:\n- player sum: 14\n- dealer card: 10\n- usable ace: 1"
    )


@pytest.mark.parametrize(
    ("obs", "got"), [(np.array([1.0, 2.0, 3.0]), 3), ((1,), 1), ([], 0), (np.zeros((2, 2)), 4)]
)
def test_generic_formatter_label_count_error(obs, got):
    with pytest.raises(ValueError) as error:
        GenericFormatter(labels=["a", "b"])(obs, {})
    assert str(error.value) == f"Expected 2 values for labels ['a', 'b'], got {got}"


# --- TemplateFormatter ----------------------------------------------------------------------


def test_template_formatter_fields():
    fmt = TemplateFormatter("Your hand totals {o[0]}; the dealer shows {o[1]}.")
    assert fmt((np.int64(14), np.int64(10), np.int64(0)), {}) == (
        "Your hand totals 14; the dealer shows 10."
    )
    vector = TemplateFormatter("x={o[0]} v={o[1]} all={text}")
    assert vector(np.array([0.123456, -0.0000001], dtype=np.float32), {}) == (
        "x=0.123 v=0.0 all=[0.123, 0.0]"
    )
    assert TemplateFormatter("{o}")(np.array([[1, 2]]), {}) == "[[1, 2]]"
    assert TemplateFormatter("{o}")(np.int64(3), {}) == "3"
    assert TemplateFormatter("{text}", precision=1)((0.25, True), {}) == "(0.2, true)"
    assert TemplateFormatter("lives: {info[lives]}")(0, {"lives": 3}) == "lives: 3"


def test_template_formatter_dict_keys():
    obs = {"pos": np.array([1.23456, 2.0]), "hp": np.int64(7), "name": np.str_("bob")}
    fmt = TemplateFormatter("{name} at {pos} ({pos[0]}) with {hp} hp; {o[hp]}")
    assert fmt(obs, {}) == "bob at [1.235, 2.0] (1.235) with 7 hp; 7"
    assert TemplateFormatter("{text}")(obs, {}) == "{pos: [1.235, 2.0], hp: 7, name: bob}"


def test_template_formatter_raw_obs_is_available():
    obs = np.array([1, 2])
    assert TemplateFormatter("{obs.shape}")(obs, {}) == "(2,)"


def test_template_formatter_needs_a_string():
    with pytest.raises(TypeError) as error:
        TemplateFormatter(["{o}"])
    assert str(error.value) == "Expected the template as str, got list"


# --- FunctionFormatter / as_formatter / Formatter -------------------------------------------


def test_function_formatter():
    fmt = FunctionFormatter(lambda obs, info: f"State {obs} after {info['steps']} steps")
    assert fmt(3, {"steps": 2}) == "State 3 after 2 steps"
    assert fmt.format(4, {"steps": 0}) == "State 4 after 0 steps"
    with pytest.raises(TypeError) as error:
        FunctionFormatter(3)
    assert str(error.value) == "Expected a callable (obs, info) -> str, got 3"


def test_as_formatter():
    assert isinstance(as_formatter(None), GenericFormatter)
    existing = GenericFormatter(labels=["a"])
    assert as_formatter(existing) is existing
    template = as_formatter("State {obs}")
    assert isinstance(template, TemplateFormatter) and template(3, {}) == "State 3"
    function = as_formatter(lambda obs, info: "x")
    assert isinstance(function, FunctionFormatter) and function(0, {}) == "x"


@pytest.mark.parametrize(("value", "name"), [(3, "int"), (b"{obs}", "bytes"), ([], "list")])
def test_as_formatter_errors(value, name):
    with pytest.raises(TypeError) as error:
        as_formatter(value)
    assert str(error.value) == (
        "Expected formatter to be None, a Formatter, a template string or a callable "
        f"(obs, info) -> str, got {name}"
    )


def test_formatter_base_class():
    with pytest.raises(NotImplementedError):
        Formatter().format(0, {})
    assert Formatter().bind(None) is None

    class Shout(Formatter):
        def format(self, obs, info):
            return str(obs).upper()

    assert Shout()("hi", {}) == "HI"


# --- Every space renders without numpy reprs ------------------------------------------------

OBSERVATION_SPACES = {
    "discrete": spaces.Discrete(5, start=-2),
    "box": spaces.Box(-1.0, 1.0, (4,), np.float32),
    "box-2d": spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
    "box-uint8": spaces.Box(0, 255, (2, 2, 3), np.uint8),
    "multi-discrete": spaces.MultiDiscrete([3, 4]),
    "multi-binary": spaces.MultiBinary((2, 2)),
    "text": spaces.Text(8),
    "tuple": spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))),
    "dict": spaces.Dict(
        {
            "agent": spaces.Box(0, 4, (2,), np.int64),
            "nested": spaces.Dict(
                {"flag": spaces.MultiBinary(1), "t": spaces.Tuple((spaces.Box(0.0, 1.0),))}
            ),
        }
    ),
    "graph": spaces.Graph(spaces.Box(0.0, 1.0, (2,)), spaces.Discrete(3)),
    "sequence": spaces.Sequence(spaces.Box(0.0, 1.0, (2,))),
    "sequence-stacked": spaces.Sequence(spaces.Discrete(3), stack=True),
    "one-of": spaces.OneOf([spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,))]),
    "unicode-text": UnicodeText(8),
    "chat": ChatMessages(2, 8),
}


@pytest.mark.parametrize("name", OBSERVATION_SPACES)
def test_every_space_renders_without_numpy_reprs(name):
    space = OBSERVATION_SPACES[name]
    space.seed(0)
    formatters = [GenericFormatter(), TemplateFormatter("{text} | {o}")]
    for _ in range(10):
        obs = space.sample()
        for fmt in formatters:
            text = fmt(obs, {})
            assert isinstance(text, str) and text
            assert not any(r in text for r in NUMPY_REPRS), text


def test_template_with_unknown_field_names_the_field():
    with pytest.raises(ValueError, match=r"names the field 'total', which is not one of"):
        TemplateFormatter("Total {total}")((1, 2), {})
