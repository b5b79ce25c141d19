"""Render env observations as text for the model.

A formatter is a :class:`Formatter` object, a callable ``(obs, info) -> str`` or a template
string; :class:`GenericFormatter` renders any Gymnasium space readably.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.references import is_reference, resolve

__all__ = [
    "Formatter",
    "FunctionFormatter",
    "GenericFormatter",
    "TemplateFormatter",
    "MAX_ARRAY_ITEMS",
    "as_formatter",
    "render_value",
    "summarise_array",
]

MAX_ARRAY_ITEMS = 100  # arrays with more values than this are summarised, not listed
_CROP_ITEMS = 48  # values shown in the corner of a summarised array
_LISTED_NONZERO = 32  # a sparse 1-D array (a mask) lists up to this many nonzero indices


class Formatter:
    """Turns an env observation (and its info) into the text of a user message.

    Subclasses implement :meth:`format`; :meth:`bind` lets them read the env once (a map, the
    action meanings) before the first observation.
    """

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Return the text shown to the model for ``obs``."""
        raise NotImplementedError

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Called once by the wrapper with the wrapped env; override to read env details."""

    def __call__(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Same as :meth:`format`, so a formatter is also a plain ``(obs, info) -> str``."""
        return self.format(obs, info)

    def __eq__(self, other: object) -> bool:
        # Value equality lets Gymnasium re-create an env from its spec: `gym.make(env.spec)`
        # compares the recorded wrapper arguments with those of the rebuilt env.
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]


def render_value(value: Any, precision: int = 3, max_items: int = MAX_ARRAY_ITEMS) -> str:
    """Render a value from any Gymnasium space on one line, without numpy reprs.

    Floats are rounded to ``precision`` decimals (``-0.0`` shows as ``0.0``); arrays and
    tuples become bracketed lists; dicts become ``key: value`` pairs. An array of more than
    ``max_items`` values (an image) is summarised by :func:`summarise_array`, so the text
    stays short whatever the array's size.

    Example:
        >>> import numpy as np
        >>> render_value(np.array([0.123456, -0.00001], dtype=np.float32))
        '[0.123, 0.0]'
        >>> render_value((14, np.int64(10), False))
        '(14, 10, false)'
        >>> render_value({"pos": np.array([1, 2]), "done": np.int8(1)})
        '{pos: [1, 2], done: 1}'
        >>> render_value(np.arange(12).reshape(3, 4), max_items=8)
        'int64 array of shape (3, 4), min 0, max 11; corner [:2, :2]: [[0, 1], [4, 5]]'
    """
    if isinstance(value, np.ndarray):
        if value.size > max_items:
            return summarise_array(value, precision, min(_CROP_ITEMS, max_items))
        return render_value(value.tolist(), precision, max_items)
    if isinstance(value, np.generic):
        return render_value(value.item(), precision)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        rounded = round(value, precision)
        return repr(rounded + 0.0)  # + 0.0 turns -0.0 into 0.0
    if isinstance(value, Mapping):
        items = (f"{k}: {render_value(v, precision, max_items)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(render_value(v, precision, max_items) for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v, precision, max_items) for v in value) + "]"
    return str(value)


def summarise_array(array: np.ndarray, precision: int = 3, corner_items: int = _CROP_ITEMS) -> str:
    """Describe a large array in a bounded line: dtype, shape, range and a corner of it.

    The corner keeps the leading entries of every axis, the same number on each (all of a
    short axis), as many as fit in ``corner_items`` values (48). A 1-D array with at most 32
    nonzero values (an action mask) lists their indices instead. Values print as
    :func:`render_value` prints them, so the line stays under 2,000 characters.

    Example:
        >>> import numpy as np
        >>> image = np.zeros((56, 56, 3), dtype=np.uint8)
        >>> image[0, 1] = [255, 128, 0]
        >>> summarise_array(image)  # doctest: +NORMALIZE_WHITESPACE
        'uint8 array of shape (56, 56, 3), min 0, max 255; corner [:4, :4, :]: [[[0, 0, 0],
        [255, 128, 0], [0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0], [0, 0, 0],
        [0, 0, 0]]]'
        >>> mask = np.zeros(20481, dtype=np.int8)
        >>> mask[[7, 300]] = 1
        >>> summarise_array(mask)
        'int8 array of shape (20481,), min 0, max 1; 2 nonzero, at [7, 300]'
    """
    head = f"{array.dtype} array of shape {tuple(array.shape)}"
    if array.size == 0:
        return head
    if not (np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)):
        return f"{head}; corner {_corner(array, precision, corner_items)}"
    low, high = render_value(array.min(), precision), render_value(array.max(), precision)
    head += f", min {low}, max {high}"
    if array.ndim == 1:
        nonzero = np.flatnonzero(array)
        if len(nonzero) <= _LISTED_NONZERO:
            return f"{head}; {len(nonzero)} nonzero, at {render_value(nonzero.tolist())}"
    return f"{head}; corner {_corner(array, precision, corner_items)}"


def _corner(array: np.ndarray, precision: int, corner_items: int) -> str:
    """``[:k, :k, :]: [...]``: the leading ``k`` entries of each axis, k as large as fits."""
    side = 1
    while math.prod(min(n, side + 1) for n in array.shape) <= corner_items and any(
        n > side for n in array.shape
    ):
        side += 1
    index = tuple(slice(min(n, side)) for n in array.shape)
    label = ", ".join(":" if n <= side else f":{side}" for n in array.shape)
    return f"[{label}]: {render_value(array[index].tolist(), precision)}"


class GenericFormatter(Formatter):
    """Renders any observation: Discrete, Box, MultiDiscrete, MultiBinary, Dict, Tuple, Text.

    Dict observations become one ``key: value`` line per key; everything else one line.
    Optional labels name the entries of a 1-D Box/MultiDiscrete or Tuple observation. An array
    of more than ``max_items`` values (an image, a one-hot board, an action mask) is
    summarised in one bounded line (:func:`summarise_array`) instead of listed.

    Example:
        >>> import numpy as np
        >>> fmt = GenericFormatter(labels=["position", "velocity"])
        >>> print(fmt(np.array([-0.5234, 0.0012]), {}))
        Observation:
        - position: -0.523
        - velocity: 0.001
        >>> print(GenericFormatter()({"agent": np.array([1, 2]), "hp": 3}, {}))
        Observation:
        - agent: [1, 2]
        - hp: 3
        >>> print(GenericFormatter(max_items=4)({"board": np.eye(3, dtype=np.int8)}, {}))
        Observation:
        - board: int8 array of shape (3, 3), min 0, max 1; corner [:2, :2]: [[1, 0], [0, 1]]
    """

    def __init__(
        self,
        labels: Sequence[str] | None = None,
        precision: int = 3,
        prefix: str = "Observation:",
        max_items: int = MAX_ARRAY_ITEMS,
    ) -> None:
        """Create the formatter.

        Args:
            labels: Names for the entries of a flat vector or tuple observation.
            precision: Decimals kept for floats.
            prefix: First line of the message.
            max_items: Largest array listed in full; larger ones are summarised.
        """
        if not (isinstance(max_items, int) and max_items >= 1):
            raise ValueError(f"Expected max_items to be an int >= 1, got {max_items!r}")
        self.labels = list(labels) if labels is not None else None
        self.precision = precision
        self.prefix = prefix
        self.max_items = max_items

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Render ``obs``; ``info`` is not shown."""
        if isinstance(obs, Mapping):
            items = list(obs.items())
        elif self.labels is not None:
            values = list(np.asarray(obs).reshape(-1)) if isinstance(obs, np.ndarray) else list(obs)
            if len(values) != len(self.labels):
                raise ValueError(
                    f"Expected {len(self.labels)} values for labels {self.labels}, "
                    f"got {len(values)}"
                )
            items = list(zip(self.labels, values, strict=True))
        else:
            return f"{self.prefix} {render_value(obs, self.precision, self.max_items)}"
        lines = [f"- {k}: {render_value(v, self.precision, self.max_items)}" for k, v in items]
        return "\n".join([self.prefix, *lines])


class TemplateFormatter(Formatter):
    """Fills a ``str.format`` template with the observation.

    Fields available in the template: ``obs`` (the raw observation), ``info``, ``text`` (the
    generic one-line rendering), ``o`` (the observation as a list for vector/tuple
    observations, so ``{o[0]}`` prints ``14`` rather than ``np.int64(14)``) and, for Dict
    observations, each key.

    Example:
        >>> fmt = TemplateFormatter("Your hand totals {o[0]}; the dealer shows {o[1]}.")
        >>> fmt((14, 10, 0), {})
        'Your hand totals 14; the dealer shows 10.'
    """

    def __init__(self, template: str, precision: int = 3) -> None:
        """Create the formatter.

        Args:
            template: A ``str.format`` template.
            precision: Decimals kept for floats in ``text`` and ``o``.
        """
        if not isinstance(template, str):
            raise TypeError(f"Expected the template as str, got {type(template).__name__}")
        self.template = template
        self.precision = precision

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Fill the template."""
        fields: dict[str, Any] = {}
        if isinstance(obs, Mapping):
            fields.update({str(k): _plain(v, self.precision) for k, v in obs.items()})
        plain = _plain(obs, self.precision)
        fields.update(obs=obs, info=info, text=render_value(obs, self.precision), o=plain)
        try:
            return self.template.format(**fields)
        except KeyError as e:
            raise ValueError(
                f"The template names the field {e}, which is not one of {sorted(fields)}"
            ) from None


class FunctionFormatter(Formatter):
    """Wraps a function ``(obs, info) -> str``.

    Example:
        >>> FunctionFormatter(lambda obs, info: f"State {obs}")(3, {})
        'State 3'
    """

    def __init__(self, fn: Callable[[Any, Mapping[str, Any]], str]) -> None:
        """Create the formatter from ``fn(obs, info) -> str``."""
        if not callable(fn):
            raise TypeError(f"Expected a callable (obs, info) -> str, got {fn!r}")
        self.fn = fn

    def format(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Call the function."""
        return self.fn(obs, info)


def as_formatter(formatter: Any) -> Formatter:
    """Coerce what a user passed as ``formatter`` into a :class:`Formatter`.

    Args:
        formatter: None (generic), a :class:`Formatter`, a template string, a callable, or
            the importable name ``"module:Name"`` of a Formatter class (built without
            arguments) or of a function (a string of that form is never a template: a
            template without fields would print the same text every turn).

    Example:
        >>> as_formatter("State {obs}")(3, {})
        'State 3'
        >>> as_formatter("textgym.envs.classic:BlackjackFormatter")((15, 1, 1), {})
        'Your hand totals 15, counting an ace as 11. The dealer shows an ace.'
    """
    if formatter is None:
        return GenericFormatter()
    if isinstance(formatter, Formatter):
        return formatter
    if is_reference(formatter):
        named = resolve(formatter)
        if isinstance(named, type) and issubclass(named, Formatter):
            return named()
        if isinstance(named, Formatter) or (callable(named) and not isinstance(named, type)):
            return as_formatter(named)
        raise TypeError(
            f"Expected {formatter!r} to name a Formatter class or a function (obs, info) -> "
            f"str, got {type(named).__name__}"
        )
    if isinstance(formatter, str):
        return TemplateFormatter(formatter)
    if callable(formatter):
        return FunctionFormatter(formatter)
    raise TypeError(
        "Expected formatter to be None, a Formatter, a template string or a callable "
        f"(obs, info) -> str, got {type(formatter).__name__}"
    )


def _plain(value: Any, precision: int) -> Any:
    """Numpy values → Python values (floats rounded), keeping the structure."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist(), precision)
    if isinstance(value, np.generic):
        return _plain(value.item(), precision)
    if isinstance(value, float) and math.isfinite(value):
        return round(value, precision) + 0.0
    if isinstance(value, list | tuple):
        return [_plain(v, precision) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v, precision) for k, v in value.items()}
    return value
