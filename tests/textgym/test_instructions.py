from typing import Any, Literal

import numpy as np
import pytest
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

from textgym.instructions import describe_model, example_from_schema
from textgym.schemas import schema_from_space
from textgym.spaces import UnicodeText

HEADER = "Reply with a JSON object with exactly these fields:\n"


class Target(BaseModel):
    row: int = Field(ge=0, le=7, description="Row from the top.")
    col: int = Field(ge=0, le=7)


class Shot(BaseModel):
    """Where to fire."""

    model_config = ConfigDict(extra="forbid")
    target: Target = Field(description="The cell to hit.")
    weapon: Literal["cannon", "torpedo"] = Field(description="Which weapon to use.")
    power: float = Field(gt=0.0, le=1.0, description="Fraction of full power.")
    salvo: int = Field(gt=0, lt=4)
    note: str | None = Field(default=None, max_length=40, description="Anything to add.")
    pair: tuple[int, float] = (1, 0.5)
    flag: bool = False
    anything: object = None


class Node(BaseModel):
    child: "Node"


class Free(BaseModel):
    value: Any


# --- describe_model golden strings ----------------------------------------------------------


def test_discrete_with_names():
    schema = schema_from_space(spaces.Discrete(3), action_names=["left", "stay", "right"])
    assert describe_model(schema.model, '{"action": "left"}') == (
        HEADER + '- "action": one of "left", "stay", "right"\nExample reply: {"action": "left"}'
    )
    assert describe_model(schema.model) == HEADER + '- "action": one of "left", "stay", "right"'


def test_discrete_without_names():
    schema = schema_from_space(spaces.Discrete(4, start=-1), description="Which lever.")
    assert describe_model(schema.model) == (
        HEADER + '- "action": integer from -1 to 2. Which lever.'
    )


def test_box():
    vector = schema_from_space(spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert describe_model(vector.model) == (
        HEADER + '- "action": a list of 2 × (number from -1.0 to 1.0)'
    )
    torque = schema_from_space(
        spaces.Box(-2.0, 2.0, (1,), np.float32), field_name="torque", description="Torque in N·m."
    )
    assert describe_model(torque.model, '{"torque": 0.0}') == (
        HEADER + '- "torque": number from -2.0 to 2.0. Torque in N·m.\n'
        'Example reply: {"torque": 0.0}'
    )
    grid = schema_from_space(spaces.Box(0, 255, (2, 3), np.uint8))
    assert describe_model(grid.model) == (
        HEADER + '- "action": a list of 2 × (a list of 3 × (integer from 0 to 255))'
    )
    half = schema_from_space(spaces.Box(0.0, np.inf, (3,), np.float32))
    assert describe_model(half.model) == HEADER + '- "action": a list of 3 × (number >= 0.0)'
    free = schema_from_space(spaces.Box(-np.inf, np.inf, (1,), np.float32))
    assert describe_model(free.model) == HEADER + '- "action": number'


def test_multi_discrete_multi_binary_text_tuple():
    assert describe_model(schema_from_space(spaces.MultiDiscrete([3, 3], start=[1, 1])).model) == (
        HEADER + '- "action": a list of 2 × (integer from 1 to 3)'
    )
    assert describe_model(schema_from_space(spaces.MultiBinary(1)).model) == (
        HEADER + '- "action": integer from 0 to 1'
    )
    assert describe_model(schema_from_space(UnicodeText(200)).model) == (
        HEADER + '- "action": string of at most 200 characters'
    )
    pair = spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32)))
    assert describe_model(schema_from_space(pair).model) == (
        HEADER + '- "action": a list [integer from 0 to 1, a list of 2 × (number from 0.0 to 1.0)]'
    )


def test_dict():
    space = spaces.Dict(
        {
            "my-key": spaces.Discrete(2),
            "class": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "move": spaces.Discrete(3),
            "inner": spaces.Dict(
                {
                    "x": spaces.MultiBinary(2),
                    "t": spaces.Tuple((spaces.Discrete(2), spaces.Text(4))),
                }
            ),
        }
    )
    schema = schema_from_space(space, action_names={"move": ["left", "stay", "right"]})
    assert describe_model(schema.model) == (
        HEADER + '- "class": a list of 2 × (number from -1.0 to 1.0)\n'
        '- "inner": an object with these fields:\n'
        '  - "t": a list [integer from 0 to 1, string of at most 4 characters]\n'
        '  - "x": a list of 2 × (integer from 0 to 1)\n'
        '- "move": one of "left", "stay", "right"\n'
        '- "my-key": integer from 0 to 1'
    )


def test_user_model_with_descriptions():
    assert describe_model(Shot, '{"target": {"row": 0, "col": 0}}') == (
        HEADER + '- "target": an object. The cell to hit. Its fields:\n'
        '  - "row": integer from 0 to 7. Row from the top.\n'
        '  - "col": integer from 0 to 7\n'
        '- "weapon": one of "cannon", "torpedo". Which weapon to use.\n'
        '- "power": number > 0.0 and <= 1.0. Fraction of full power.\n'
        '- "salvo": integer > 0 and < 4\n'
        '- "note": string of at most 40 characters or null. Anything to add.\n'
        '- "pair": a list [integer, number]\n'
        '- "flag": true or false\n'
        '- "anything": any JSON value\n'
        'Example reply: {"target": {"row": 0, "col": 0}}'
    )


def test_descriptions_are_deterministic():
    pair = {"b": spaces.Discrete(2), "a": spaces.MultiBinary(3)}
    make = [
        lambda: schema_from_space(spaces.Discrete(3), action_names=["a", "b", "c"]).model,
        lambda: schema_from_space(spaces.Box(-1.0, 1.0, (2, 2), np.float32)).model,
        lambda: schema_from_space(spaces.Dict(pair)).model,
        lambda: Shot,
    ]
    for build in make:
        assert describe_model(build()) == describe_model(build())
        assert example_from_schema(build()) == example_from_schema(build())


# --- example_from_schema --------------------------------------------------------------------

EXAMPLE_SPACES = [
    spaces.Discrete(5),
    spaces.Discrete(3, start=-7),
    spaces.Box(-2.0, 2.0, (1,), np.float32),
    spaces.Box(-np.inf, -3.0, (2,), np.float32),
    spaces.Box(1.0, np.inf, (2, 2), np.float64),
    spaces.Box(0, 255, (2,), np.uint8),
    spaces.MultiDiscrete([2, 3, 4]),
    spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.full((2, 2), 4)),
    spaces.MultiBinary((2, 2)),
    spaces.Text(5, min_length=3),
    UnicodeText(4, min_length=2),
    spaces.Tuple((spaces.Discrete(2, start=1), spaces.Box(-1.0, 1.0, (2,), np.float32))),
    spaces.Dict({"my-key": spaces.Discrete(2), "inner": spaces.Dict({"x": spaces.MultiBinary(2)})}),
    # Not here: non-uniform Box bounds and Text character sets are checked by validators that
    # the JSON schema does not show, so a walker of the schema cannot satisfy them.
]


@pytest.mark.parametrize("space", EXAMPLE_SPACES, ids=lambda s: type(s).__name__)
def test_examples_of_generated_schemas_validate(space):
    schema = schema_from_space(space)
    example = example_from_schema(schema.model)
    assert isinstance(example, dict)
    action = schema.to_action(schema.model.model_validate(example))
    assert space.contains(action)


def test_examples_of_named_schemas():
    schema = schema_from_space(spaces.Discrete(2), action_names=["stick", "hit"])
    assert example_from_schema(schema.model) == {"action": "stick"}
    dict_schema = schema_from_space(
        spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(-3.0, 3.0, (1,))}),
        action_names={"a": ["up", "down"]},
    )
    assert example_from_schema(dict_schema.model) == {"a": "up", "b": -3.0}


def test_examples_of_user_models_validate():
    example = example_from_schema(Shot)
    assert example == {"target": {"row": 0, "col": 0}, "weapon": "cannon", "power": 1.0, "salvo": 1}
    Shot.model_validate(example)


class Bounds(BaseModel):
    low_only: int = Field(ge=5)
    high_only: float = Field(le=-2.5)
    high_positive: int = Field(le=9)
    open_range: float = Field(gt=0.0, lt=0.5)
    open_int: int = Field(gt=-3, lt=-1)
    above: float = Field(gt=10.0)
    below: int = Field(lt=-10)
    given: int = Field(ge=0, examples=[42])
    literal: Literal["only"]
    text: str = Field(min_length=3)


def test_examples_respect_every_kind_of_bound():
    example = example_from_schema(Bounds)
    assert example == {
        "low_only": 5,
        "high_only": -2.5,
        "high_positive": 0,
        "open_range": 0.25,
        "open_int": -2,
        "above": 11.0,
        "below": -11,
        "given": 42,
        "literal": "only",
        "text": "xxx",
    }
    Bounds.model_validate(example)


def test_no_example_when_the_schema_cannot_be_filled():
    Node.model_rebuild()
    assert example_from_schema(Node) is None  # recursion deeper than the walker goes
    assert example_from_schema(Free) is None  # a required field of unknown type

    class Impossible(BaseModel):
        n: int = Field(gt=0, lt=1)

    assert example_from_schema(Impossible) is None
