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
    "as_formatter",
    "render_value",
]


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


def render_value(value: Any, precision: int = 3) -> str:
    """Render a value from any Gymnasium space on one line, without numpy reprs.

    Floats are rounded to ``precision`` decimals (``-0.0`` shows as ``0.0``); arrays and
    tuples become bracketed lists; dicts become ``key: value`` pairs.

    Example:
        >>> import numpy as np
        >>> render_value(np.array([0.123456, -0.00001], dtype=np.float32))
        '[0.123, 0.0]'
        >>> render_value((14, np.int64(10), False))
        '(14, 10, false)'
        >>> render_value({"pos": np.array([1, 2]), "done": np.int8(1)})
        '{pos: [1, 2], done: 1}'
    """
    if isinstance(value, np.ndarray):
        return render_value(value.tolist(), precision)
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
        return "{" + ", ".join(f"{k}: {render_value(v, precision)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(render_value(v, precision) for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v, precision) for v in value) + "]"
    return str(value)


class GenericFormatter(Formatter):
    """Renders any observation: Discrete, Box, MultiDiscrete, MultiBinary, Dict, Tuple, Text.

    Dict observations become one ``key: value`` line per key; everything else one line.
    Optional labels name the entries of a 1-D Box/MultiDiscrete or Tuple observation.

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
    """

    def __init__(
        self, labels: Sequence[str] | None = None, precision: int = 3, prefix: str = "Observation:"
    ) -> None:
        """Create the formatter.

        Args:
            labels: Names for the entries of a flat vector or tuple observation.
            precision: Decimals kept for floats.
            prefix: First line of the message.
        """
        self.labels = list(labels) if labels is not None else None
        self.precision = precision
        self.prefix = prefix

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
            return f"{self.prefix} {render_value(obs, self.precision)}"
        lines = [f"- {k}: {render_value(v, self.precision)}" for k, v in items]
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
