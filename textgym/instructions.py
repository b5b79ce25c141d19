"""Action-format instructions for the model, generated from a Pydantic model's JSON schema.

The text is a pure function of the schema (field names, types, allowed values, bounds,
descriptions) and an example reply, so the same action space always yields the same prompt.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel

__all__ = ["describe_model", "example_from_schema"]

_TYPE_WORDS = {
    "integer": "integer",
    "number": "number",
    "string": "string",
    "boolean": "true or false",
    "null": "null",
}


def describe_model(model: type[BaseModel], example: str | None = None) -> str:
    """Return the instructions telling a model how to write a reply for ``model``.

    Args:
        model: The Pydantic action model.
        example: One valid reply, shown at the end.

    Returns:
        A few lines of plain text.

    Example:
        >>> from typing import Literal
        >>> from pydantic import create_model
        >>> Move = create_model("Move", direction=(Literal["left", "right"], ...))
        >>> print(describe_model(Move, '{"direction": "left"}'))
        Reply with a JSON object with exactly these fields:
        - "direction": one of "left", "right"
        Example reply: {"direction": "left"}
    """
    schema = model.model_json_schema()
    lines = ["Reply with a JSON object with exactly these fields:"]
    lines += _field_lines(schema, schema.get("$defs", {}), indent="")
    if example is not None:
        lines.append(f"Example reply: {example}")
    return "\n".join(lines)


def _field_lines(schema: dict[str, Any], defs: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for name, prop in schema.get("properties", {}).items():
        prop = _resolve(prop, defs)
        text = f"{indent}- {json.dumps(name)}"
        nested = _resolve(prop, defs)
        if nested.get("type") == "object" and "properties" in nested:
            if prop.get("description"):
                lines.append(f"{text}: an object. {prop['description']} Its fields:")
            else:
                lines.append(f"{text}: an object with these fields:")
            lines += _field_lines(nested, defs, indent + "  ")
            continue
        text += f": {_type_text(prop, defs)}"
        if prop.get("description"):
            text += f". {prop['description']}"
        lines.append(text)
    return lines


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in prop:
        resolved = dict(defs.get(prop["$ref"].split("/")[-1], {}))
        resolved.update({k: v for k, v in prop.items() if k != "$ref"})
        return resolved
    return prop


def _type_text(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    prop = _resolve(prop, defs)
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "anyOf" in prop:
        return " or ".join(_type_text(p, defs) for p in prop["anyOf"])
    kind = prop.get("type")
    if kind in ("integer", "number"):
        return _TYPE_WORDS[kind] + _bounds_text(prop)
    if kind == "string":
        limit = prop.get("maxLength")
        return "string" + (f" of at most {limit} characters" if limit is not None else "")
    if kind == "array":
        if "prefixItems" in prop:
            parts = ", ".join(_type_text(p, defs) for p in prop["prefixItems"])
            return f"a list [{parts}]"
        items = _type_text(prop.get("items", {}), defs)
        size = prop.get("minItems")
        if size is not None and size == prop.get("maxItems"):
            return f"a list of {size} × ({items})"
        return f"a list of ({items})"
    if kind == "object":
        fields = ", ".join(json.dumps(k) for k in prop.get("properties", {}))
        return f"an object with fields {fields}" if fields else "an object"
    return _TYPE_WORDS.get(kind, "any JSON value")


def _bounds_text(prop: dict[str, Any]) -> str:
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    parts = []
    if low is not None:
        parts.append(f">= {low}")
    elif prop.get("exclusiveMinimum") is not None:
        parts.append(f"> {prop['exclusiveMinimum']}")
    if high is not None:
        parts.append(f"<= {high}")
    elif prop.get("exclusiveMaximum") is not None:
        parts.append(f"< {prop['exclusiveMaximum']}")
    return " " + " and ".join(parts) if parts else ""


def example_from_schema(model: type[BaseModel]) -> dict[str, Any] | None:
    """Build one value that should validate against ``model`` from its JSON schema.

    Used for models written by users, which carry no env action to render. Returns None when
    the schema holds something this walker cannot fill in.

    Example:
        >>> from pydantic import BaseModel, Field
        >>> class Bet(BaseModel):
        ...     amount: int = Field(ge=1, le=10)
        >>> example_from_schema(Bet)
        {'amount': 1}
    """
    schema = model.model_json_schema()
    try:
        value = _example(schema, schema.get("$defs", {}), depth=0)
    except (LookupError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _example(prop: dict[str, Any], defs: dict[str, Any], depth: int) -> Any:
    if depth > 20:
        raise ValueError("schema nests too deeply for an example")
    prop = _resolve(prop, defs)
    if "examples" in prop and prop["examples"]:
        return prop["examples"][0]
    if "default" in prop:
        return prop["default"]
    if "enum" in prop:
        return prop["enum"][0]
    if "const" in prop:
        return prop["const"]
    if "anyOf" in prop:
        return _example(prop["anyOf"][0], defs, depth + 1)
    kind = prop.get("type")
    if kind in ("integer", "number"):
        return _number_example(prop, int if kind == "integer" else float)
    if kind == "string":
        return "x" * max(1, int(prop.get("minLength", 1)))
    if kind == "boolean":
        return False
    if kind == "array":
        if "prefixItems" in prop:
            return [_example(p, defs, depth + 1) for p in prop["prefixItems"]]
        return [_example(prop.get("items", {}), defs, depth + 1)] * int(prop.get("minItems", 1))
    if kind == "object":
        return {
            k: _example(v, defs, depth + 1)
            for k, v in prop.get("properties", {}).items()
            if k in prop.get("required", [])
        }
    raise ValueError(f"no example for schema type {kind!r}")


def _number_example(prop: dict[str, Any], kind: type) -> int | float:
    """The lower bound, else 0 (or a negative upper bound), else the first value inside."""
    low, high = prop.get("minimum"), prop.get("maximum")
    x_low, x_high = prop.get("exclusiveMinimum"), prop.get("exclusiveMaximum")
    lows = [b for b in (low, x_low) if b is not None]
    highs = [b for b in (high, x_high) if b is not None]
    candidates = [low, high if high is not None and high < 0 else 0]
    candidates.append(max(lows) + 1 if lows else None)
    candidates.append((max(lows) + min(highs)) / 2 if lows and highs else None)
    candidates.append(min(highs) - 1 if highs else None)
    for candidate in candidates:
        if candidate is None:
            continue
        value = kind(math.floor(candidate) if kind is int else candidate)
        if (
            (low is None or value >= low)
            and (high is None or value <= high)
            and (x_low is None or value > x_low)
            and (x_high is None or value < x_high)
        ):
            return value
    raise ValueError(f"no {kind.__name__} satisfies the bounds of {prop}")
