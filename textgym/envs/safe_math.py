"""Evaluate untrusted arithmetic (what an LLM writes into a calculator call) safely.

A whitelisting walker over ``ast.parse(expr, mode="eval")``: numbers, ``+ - * / // % **``,
parentheses, unary signs and ``sqrt(x)``; length, size, exponent and magnitude are bounded.
"""

from __future__ import annotations

import ast
import math

__all__ = ["UnsafeExpressionError", "evaluate_expression", "format_number"]

_BINARY_SYMBOLS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
}
_ALLOWED_BINARY = frozenset({ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow})
_REFUSED: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "subscripts are not allowed",
    ast.Lambda: "lambdas are not allowed",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "'and' and 'or' are not allowed",
    ast.IfExp: "conditional expressions are not allowed",
    ast.NamedExpr: "assignments are not allowed",
    ast.JoinedStr: "f-strings are not allowed",
    ast.Tuple: "tuples are not allowed",
    ast.List: "lists are not allowed",
    ast.Set: "sets are not allowed",
    ast.Dict: "dicts are not allowed",
    ast.Starred: "starred expressions are not allowed",
}
_ALLOWED = "only numbers, + - * / // % **, parentheses and sqrt() are allowed"


class UnsafeExpressionError(ValueError):
    """An expression the calculator refuses to evaluate; the message says why.

    Example:
        >>> try:
        ...     evaluate_expression("__import__('os')")
        ... except UnsafeExpressionError as e:
        ...     print(e)
        function '__import__' is not allowed; the only function is sqrt
    """


def evaluate_expression(
    expr: str,
    *,
    max_length: int = 200,
    max_nodes: int = 100,
    max_exponent: float = 100,
    max_magnitude: float = 1e100,
) -> float:
    """Evaluate an arithmetic expression without ``eval``, refusing anything else.

    Integer arithmetic stays exact until the end (``//``, ``%`` and ``**`` follow Python's
    semantics), so the cost is bounded by the limits below rather than by the input.

    Args:
        expr: The expression, e.g. ``"(12 + 3) * sqrt(16)"``.
        max_length: Longest expression in characters, checked before parsing.
        max_nodes: Most operands and operations (AST expression nodes).
        max_exponent: Largest absolute exponent of ``**``.
        max_magnitude: Largest absolute value of any literal or intermediate result.

    Returns:
        The value as a float.

    Raises:
        UnsafeExpressionError: The expression is invalid, not whitelisted, too costly, or its
            value is undefined (division by zero, sqrt of a negative number) or not finite.
        TypeError: ``expr`` is not a str.

    Example:
        >>> evaluate_expression("123 * 456")
        56088.0
        >>> evaluate_expression("-(2 + 3) ** 2 / sqrt(4)")
        -12.5
        >>> try:
        ...     evaluate_expression("10 ** 1000")
        ... except UnsafeExpressionError as e:
        ...     print(e)
        exponent 1000 is too large (the limit is 100)
    """
    if not isinstance(expr, str):
        raise TypeError(f"Expected the expression as str, got {type(expr).__name__}")
    if len(expr) > max_length:
        raise UnsafeExpressionError(
            f"expression is {len(expr)} characters long, over the limit of {max_length}"
        )
    if not expr.strip():
        raise UnsafeExpressionError("expression is empty")
    try:
        # Leading whitespace is an IndentationError in eval mode; people and models add it.
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise UnsafeExpressionError("invalid syntax") from None
    # Counted iteratively (ast.walk) before the recursive walk, which this bound keeps shallow.
    nodes = sum(isinstance(node, ast.expr) for node in ast.walk(tree))
    if nodes > max_nodes:
        raise UnsafeExpressionError(
            f"expression has {nodes} operands and operations, over the limit of {max_nodes}"
        )
    walker = _Evaluator(max_exponent=max_exponent, max_magnitude=max_magnitude)
    try:
        return float(walker.visit(tree.body))
    except OverflowError:  # only reachable with max_magnitude above the float range
        raise UnsafeExpressionError("result is too large for a float") from None


def format_number(value: float) -> str:
    """Render a number the way a person would write it.

    Integral values print without ``.0`` (below 1e15, where floats are still exact
    integers); others keep 10 significant digits.

    Example:
        >>> format_number(56088.0), format_number(-0.0), format_number(2 / 3), format_number(1e20)
        ('56088', '0', '0.6666666667', '1e+20')
    """
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


class _Evaluator:
    """Recursive evaluator over the whitelisted node types; everything else is refused."""

    def __init__(self, *, max_exponent: float, max_magnitude: float) -> None:
        self.max_exponent = max_exponent
        self.max_magnitude = max_magnitude

    def visit(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant):
            value = self._constant(node)
        elif isinstance(node, ast.BinOp):
            value = self._binary(node)
        elif isinstance(node, ast.UnaryOp):
            value = self._unary(node)
        elif isinstance(node, ast.Call):
            value = self._call(node)
        elif isinstance(node, ast.Name):
            if node.id == "sqrt":
                raise UnsafeExpressionError("sqrt must be called with one argument, like sqrt(16)")
            raise UnsafeExpressionError(f"unknown name {node.id!r}: {_ALLOWED}")
        else:
            message = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed")
            raise UnsafeExpressionError(f"{message}: {_ALLOWED}")
        return self._checked(value)

    def _checked(self, value: int | float) -> int | float:
        if isinstance(value, float) and not math.isfinite(value):
            raise UnsafeExpressionError("result is not a finite number")
        if abs(value) > self.max_magnitude:
            raise UnsafeExpressionError(f"result is too large (over {self.max_magnitude:g})")
        return value

    def _constant(self, node: ast.Constant) -> int | float:
        # type() rather than isinstance(): bool is an int subclass and must be refused.
        if type(node.value) not in (int, float):
            kind = type(node.value).__name__
            raise UnsafeExpressionError(f"{kind} literals are not allowed: {_ALLOWED}")
        return node.value

    def _unary(self, node: ast.UnaryOp) -> int | float:
        if isinstance(node.op, ast.USub):
            return -self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return +self.visit(node.operand)
        symbol = "~" if isinstance(node.op, ast.Invert) else "not"
        raise UnsafeExpressionError(f"operator {symbol} is not allowed: {_ALLOWED}")

    def _binary(self, node: ast.BinOp) -> int | float:
        op = type(node.op)
        if op not in _ALLOWED_BINARY:
            symbol = _BINARY_SYMBOLS.get(op, op.__name__)
            hint = " (use ** for powers)" if op is ast.BitXor else ""
            raise UnsafeExpressionError(f"operator {symbol} is not allowed{hint}: {_ALLOWED}")
        left, right = self.visit(node.left), self.visit(node.right)
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Pow:
            return self._power(left, right)
        if right == 0:
            raise UnsafeExpressionError("modulo by zero" if op is ast.Mod else "division by zero")
        if op is ast.Div:
            return left / right
        if op is ast.FloorDiv:
            return left // right
        return left % right

    def _power(self, base: int | float, exponent: int | float) -> int | float:
        if abs(exponent) > self.max_exponent:
            raise UnsafeExpressionError(
                f"exponent {format_number(exponent)} is too large "
                f"(the limit is {format_number(self.max_exponent)})"
            )
        if base == 0:
            if exponent < 0:
                raise UnsafeExpressionError("division by zero")
            return base**exponent
        if base < 0 and exponent != int(exponent):
            raise UnsafeExpressionError("a negative number raised to a fractional power")
        # Estimate the size before computing: an exact int power can be costly to build.
        if exponent * math.log10(abs(base)) > math.log10(self.max_magnitude):
            raise UnsafeExpressionError(f"result is too large (over {self.max_magnitude:g})")
        return base**exponent

    def _call(self, node: ast.Call) -> int | float:
        if not isinstance(node.func, ast.Name):
            raise UnsafeExpressionError("only sqrt(x) may be called")
        if node.func.id != "sqrt":
            raise UnsafeExpressionError(
                f"function {node.func.id!r} is not allowed; the only function is sqrt"
            )
        if len(node.args) != 1 or node.keywords or isinstance(node.args[0], ast.Starred):
            raise UnsafeExpressionError("sqrt takes exactly one argument, like sqrt(16)")
        value = self.visit(node.args[0])
        if value < 0:
            raise UnsafeExpressionError("sqrt of a negative number")
        # isqrt keeps perfect squares of large ints exact, where float sqrt could round.
        if isinstance(value, int) and math.isqrt(value) ** 2 == value:
            return math.isqrt(value)
        return math.sqrt(value)
