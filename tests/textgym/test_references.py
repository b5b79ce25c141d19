import pytest
from pydantic import create_model

from textgym.envs.calculator import CalculatorReply, observation_text
from textgym.envs.calculator_parser import CalculatorParser
from textgym.envs.classic import BlackjackFormatter, FrozenLakeFormatter
from textgym.formatters import Formatter, FunctionFormatter, GenericFormatter, as_formatter
from textgym.parsers import ActionParser, FunctionParser, JSONActionParser, as_parser
from textgym.references import is_reference, reference_of, resolve


def local_function(obs, info):
    return "local"


@pytest.mark.parametrize(
    ("obj", "name"),
    [
        (observation_text, "textgym.envs.calculator:observation_text"),
        (CalculatorReply, "textgym.envs.calculator_parser:CalculatorReply"),
        (FrozenLakeFormatter(), "textgym.envs.classic:FrozenLakeFormatter"),
        (GenericFormatter(), "textgym.formatters:GenericFormatter"),
        (CalculatorParser(), "textgym.envs.calculator_parser:CalculatorParser"),
    ],
)
def test_importable_objects_are_named_by_where_they_are_defined(obj, name):
    assert reference_of(obj, (Formatter, ActionParser)) == name
    assert is_reference(name)


def test_objects_without_an_importable_name_have_none():
    def inner(obs, info):
        return ""

    bound = FrozenLakeFormatter()
    bound.rows = ["SF", "FG"]
    for obj in [
        lambda obs, info: "",
        inner,
        create_model("Action", action=(int, ...)),  # made at run time: no module attribute
        GenericFormatter(labels=["x"]),  # configured: the class alone does not rebuild it
        bound,  # already read an env
        FunctionFormatter(local_function),  # needs its function
        JSONActionParser(CalculatorReply),  # needs its model
        3,
        "text",
    ]:
        assert reference_of(obj, (Formatter, ActionParser)) is None, obj


def test_instances_are_named_only_for_the_given_base_classes():
    assert reference_of(BlackjackFormatter()) is None
    assert reference_of(BlackjackFormatter(), ActionParser) is None


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("Hand {o[0]}", "Expected an importable name 'module:Name', got 'Hand {o[0]}'"),
        ("textgym.nowhere:Thing", "Cannot import 'textgym.nowhere:Thing': No module named"),
        ("textgym.formatters:Missing", "Cannot import 'textgym.formatters:Missing': module"),
    ],
)
def test_resolve_says_what_is_wrong(reference, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        resolve(reference)


def test_formatters_by_name():
    assert isinstance(as_formatter("textgym.envs.classic:BlackjackFormatter"), BlackjackFormatter)
    by_function = as_formatter("textgym.envs.calculator:observation_text")
    assert by_function == FunctionFormatter(observation_text)
    assert as_formatter("Hand: {o[0]}")((15, 1, 0), {}) == "Hand: 15"  # templates stay templates
    with pytest.raises(TypeError, match="to name a Formatter class or a function"):
        as_formatter("textgym.envs.calculator:DIFFICULTIES")
    with pytest.raises(ValueError, match="Cannot import 'textgym.nowhere:Thing'"):
        as_formatter("textgym.nowhere:Thing")


def test_parsers_by_name():
    assert isinstance(as_parser("textgym.envs.calculator:CalculatorParser", None), CalculatorParser)
    by_model = as_parser("textgym.envs.calculator:CalculatorReply", None)
    assert by_model == JSONActionParser(CalculatorReply)
    assert isinstance(as_parser("textgym.envs.calculator:observation_text", None), FunctionParser)
    with pytest.raises(TypeError, match="to be an importable name 'module:Name', got 'hit'"):
        as_parser("hit", None)
    with pytest.raises(TypeError, match="to name a parser, got the string"):
        as_parser("textgym.envs.calculator:TOOL_PREFIX", None)
