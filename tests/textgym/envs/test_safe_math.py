from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from textgym.envs.safe_math import UnsafeExpressionError, evaluate_expression, format_number

ALLOWED = "only numbers, + - * / // % **, parentheses and sqrt() are allowed"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("123 * 456", 56088),
        ("1 + 2 - 3", 0),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("(1 + 2) * 3", 9),
        ("-(2 + 3)", -5),
        ("+4", 4),
        ("--4", 4),
        ("sqrt(144)", 12),
        ("sqrt(2)", math.sqrt(2)),
        ("sqrt(1 + 3) * 2.5", 5),
        ("1.5e3 + 0.5", 1500.5),
        ("1_000 + 1", 1001),
        ("  2 + 2  ", 4),
        ("0 ** 0", 1),
        ("(-8) ** 3", -512),
        ("4 ** 0.5", 2),
        ("2 ** 3 ** 2", 512),
        ("(" * 99 + "1" + ")" * 99, 1),
    ],
)
def test_accepts_whitelisted_arithmetic(expr: str, expected: float) -> None:
    result = evaluate_expression(expr)
    assert type(result) is float
    assert result == pytest.approx(expected)


def test_big_integers_stay_exact_until_the_end() -> None:
    assert evaluate_expression("99999999999 * 99999999999 - 99999999999 ** 2") == 0.0
    assert evaluate_expression("sqrt(12345678987654321 ** 2)") == 12345678987654321.0


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("x + 1", f"unknown name 'x': {ALLOWED}"),
        ("pi", f"unknown name 'pi': {ALLOWED}"),
        ("__import__('os').system('ls')", "only sqrt(x) may be called"),
        ("__import__('os')", "function '__import__' is not allowed; the only function is sqrt"),
        ("abs(-1)", "function 'abs' is not allowed; the only function is sqrt"),
        ("math.sqrt(4)", "only sqrt(x) may be called"),
        ("sqrt", "sqrt must be called with one argument, like sqrt(16)"),
        ("sqrt(4, 2)", "sqrt takes exactly one argument, like sqrt(16)"),
        ("sqrt()", "sqrt takes exactly one argument, like sqrt(16)"),
        ("sqrt(x=4)", "sqrt takes exactly one argument, like sqrt(16)"),
        ("sqrt(*[4])", "sqrt takes exactly one argument, like sqrt(16)"),
        ("sqrt(-4)", "sqrt of a negative number"),
        ("(1).real", f"attribute access is not allowed: {ALLOWED}"),
        ("[1, 2][0]", f"subscripts are not allowed: {ALLOWED}"),
        ("(lambda: 1)()", "only sqrt(x) may be called"),
        ("lambda: 1", f"lambdas are not allowed: {ALLOWED}"),
        ("[i for i in (1, 2)]", f"comprehensions are not allowed: {ALLOWED}"),
        ("1 < 2", f"comparisons are not allowed: {ALLOWED}"),
        ("1 if 1 else 2", f"conditional expressions are not allowed: {ALLOWED}"),
        ("(1, 2)", f"tuples are not allowed: {ALLOWED}"),
        ("'1' + '2'", f"str literals are not allowed: {ALLOWED}"),
        ("True + 1", f"bool literals are not allowed: {ALLOWED}"),
        ("2j", f"complex literals are not allowed: {ALLOWED}"),
        ("2 ^ 3", f"operator ^ is not allowed (use ** for powers): {ALLOWED}"),
        ("1 << 100", f"operator << is not allowed: {ALLOWED}"),
        ("~1", f"operator ~ is not allowed: {ALLOWED}"),
        ("9**9**9", "exponent 387420489 is too large (the limit is 100)"),
        ("10**1000", "exponent 1000 is too large (the limit is 100)"),
        ("10 ** -101", "exponent -101 is too large (the limit is 100)"),
        ("99 ** 99", "result is too large (over 1e+100)"),
        ("1e99 * 1e99", "result is too large (over 1e+100)"),
        ("1" * 101, "result is too large (over 1e+100)"),
        ("1e999", "result is not a finite number"),
        ("1 / 0", "division by zero"),
        ("1 // (2 - 2)", "division by zero"),
        ("1 % 0", "modulo by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "a negative number raised to a fractional power"),
        ("", "expression is empty"),
        ("   ", "expression is empty"),
        ("1 +", "invalid syntax"),
        ("import os", "invalid syntax"),
        ("1; 2", "invalid syntax"),
        ("1\x00", "invalid syntax"),
        ("x" * 201, "expression is 201 characters long, over the limit of 200"),
        ("+".join(["1"] * 51), "expression has 101 operands and operations, over the limit of 100"),
    ],
)
def test_refuses_with_exact_message(expr: str, message: str) -> None:
    with pytest.raises(UnsafeExpressionError) as excinfo:
        evaluate_expression(expr)
    assert str(excinfo.value) == message


def test_is_a_value_error_and_rejects_non_str() -> None:
    assert issubclass(UnsafeExpressionError, ValueError)
    with pytest.raises(TypeError, match="^Expected the expression as str, got int$"):
        evaluate_expression(3)  # type: ignore[arg-type]


def test_limits_are_configurable() -> None:
    assert evaluate_expression("2 ** 200", max_exponent=300, max_magnitude=1e300) == 2.0**200
    with pytest.raises(UnsafeExpressionError, match="^expression is 5 characters long"):
        evaluate_expression("1 + 2", max_length=4)
    with pytest.raises(UnsafeExpressionError, match="^expression has 3 operands"):
        evaluate_expression("1 + 2", max_nodes=2)


@pytest.mark.parametrize(
    "expr",
    [
        "9**9**9**9",
        "(10**100)**100",
        "2**100*2**100*2**100*2**100",
        "-" * 199 + "1",
        "(" * 200 + "1",
    ],
)
def test_hostile_inputs_fail_fast(expr: str) -> None:
    start = time.process_time()  # CPU time: other jobs on a shared machine do not count
    with pytest.raises(UnsafeExpressionError):
        evaluate_expression(expr)
    assert time.process_time() - start < 0.5


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (56088.0, "56088"),
        (-3.0, "-3"),
        (-0.0, "0"),
        (0.5, "0.5"),
        (1 / 3, "0.3333333333"),
        (1e15, "1e+15"),
    ],
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


# --- Property: anything a model writes is a finite number or a refusal, quickly -------------

numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "0.0", "1e308", "1e-320", "9" * 150, "0.5", "1e100", "1_0", "0x1F"]),
)
operators = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "^", "<<", "@", "<"])
expressions = st.recursive(
    numbers | st.sampled_from(["x", "sqrt", "True", "'1'", "None", "(1).real", "[1]"]),
    lambda inner: st.one_of(
        st.tuples(inner, operators, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda x: f"-{x}"),
        inner.map(lambda x: f"sqrt({x})"),
        inner.map(lambda x: f"__import__({x})"),
    ),
    max_leaves=40,
)
LIFTED = {"max_length": 10_000, "max_nodes": 10_000}


def evaluate_or_refuse(expr: str, **limits: float) -> float | None:
    start = time.process_time()
    try:
        value = evaluate_expression(expr, **limits)
    except UnsafeExpressionError:
        value = None
    assert time.process_time() - start < 0.5
    assert value is None or (isinstance(value, float) and math.isfinite(value))
    return value


@pytest.mark.parametrize(
    "limits",
    [
        {},
        LIFTED,
        {**LIFTED, "max_magnitude": math.inf, "max_exponent": 1_000},
        {**LIFTED, "max_magnitude": 1e300, "max_exponent": math.inf},
    ],
    ids=["default", "long", "no-magnitude-limit", "no-exponent-limit"],
)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(expr=expressions | st.text())
def test_any_text_is_a_finite_number_or_refused_quickly(limits, expr):
    evaluate_or_refuse(expr, **limits)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    expr=st.recursive(
        st.integers(-50, 50).map(str),
        lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        max_leaves=25,
    )
)
def test_integer_arithmetic_matches_a_reference(expr):
    """+, - and * of small ints, checked against a stack evaluator written independently."""
    tokens = expr.replace("(", " ( ").replace(")", " ) ").split()

    def value(i: int) -> tuple[int, int]:  # fully parenthesised: ( a op b ) or a literal
        if tokens[i] != "(":
            return int(tokens[i]), i + 1
        left, i = value(i + 1)
        op = tokens[i]
        right, i = value(i + 1)
        result = left + right if op == "+" else left - right if op == "-" else left * right
        return result, i + 1

    expected = value(0)[0]
    if abs(expected) <= 1e100:
        assert evaluate_expression(expr, max_length=10_000) == float(expected)


def test_overflow_past_the_float_range_is_refused():
    with pytest.raises(UnsafeExpressionError, match="^result is too large for a float$"):
        evaluate_expression("10 ** 400 / 1", max_magnitude=math.inf, max_exponent=1000)
