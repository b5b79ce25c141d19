"""Pydantic action models generated from Gymnasium action spaces, and the way back.

``schema_from_space(space)`` returns an :class:`ActionSchema`: a Pydantic model a reply is
validated against, plus the conversions between a validated model and an env action.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, SupportsIndex

import numpy as np
from gymnasium import spaces
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model

from textgym.spaces import UnicodeText

__all__ = ["ActionSchema", "schema_from_space"]

ActionNames = Sequence[str] | Mapping[str, Any]


@dataclass(frozen=True)
class ActionSchema:
    """A Pydantic model for replies and its mapping to and from env actions.

    Attributes:
        model: Pydantic model a reply's JSON is validated against (extra fields forbidden).
        to_action: Converts a validated model instance into an env action.
        from_action: Converts an env action into a model instance (for example replies).
        actions: Every env action, in order, when the set is finite and small (else None).
        names: The reply names of ``actions`` when they have names (lenient free-text parsing).
        field: Name of the single field holding the action, or None for Dict spaces.
        recipe: The arguments :func:`schema_from_space` was called with (None for a schema
            made by hand). A generated model class cannot be pickled (it has no importable
            name), so a schema with a recipe pickles and copies as its recipe and is
            generated again on loading.

    Example:
        >>> from gymnasium.spaces import Discrete
        >>> schema = schema_from_space(Discrete(2), action_names=["stick", "hit"])
        >>> schema.to_action(schema.model.model_validate_json('{"action": "HIT"}'))
        np.int64(1)
        >>> schema.from_action(0).model_dump_json()
        '{"action":"stick"}'
        >>> import pickle
        >>> pickle.loads(pickle.dumps(schema)).from_action(1).model_dump_json()
        '{"action":"hit"}'
    """

    model: type[BaseModel]
    to_action: Callable[[BaseModel], Any]
    from_action: Callable[[Any], BaseModel]
    actions: tuple[Any, ...] | None = None
    names: tuple[str, ...] | None = None
    field: str | None = "action"
    recipe: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Pickle (and deep-copy) a generated schema as the call that generates it."""
        if self.recipe is None:
            return super().__reduce_ex__(protocol)
        return _from_recipe, (dict(self.recipe),)


def _from_recipe(recipe: Mapping[str, Any]) -> ActionSchema:
    return schema_from_space(**recipe)


@dataclass(frozen=True)
class _Node:
    """How one (sub)space appears in the model: type annotation and the two conversions."""

    annotation: Any
    to_env: Callable[[Any], Any]
    to_json: Callable[[Any], Any]


def schema_from_space(
    space: spaces.Space[Any],
    *,
    action_names: ActionNames | None = None,
    field_name: str = "action",
    description: str | None = None,
) -> ActionSchema:
    """Generate the Pydantic action model for an action space.

    Args:
        space: Discrete, Box, MultiDiscrete, MultiBinary, Text, Dict or Tuple (nested freely).
        action_names: For a Discrete space, one name per action (replies use the names). For
            a Dict space, a mapping from key to the names of that Discrete subspace.
        field_name: Name of the JSON field holding the action (not used for Dict spaces,
            whose keys become the fields).
        description: Description of the action field, shown to the model.

    Returns:
        The :class:`ActionSchema`.

    Raises:
        TypeError: For a space type without a JSON form (Graph, Sequence, OneOf, custom).
        ValueError: For names that do not match the space.

    Example:
        >>> import numpy as np
        >>> from gymnasium.spaces import Box
        >>> schema = schema_from_space(Box(-2.0, 2.0, (1,), np.float32), field_name="torque")
        >>> schema.to_action(schema.model(torque=0.5))
        array([0.5], dtype=float32)
    """
    recipe = {
        "space": space,
        "action_names": action_names,
        "field_name": field_name,
        "description": description,
    }
    if isinstance(space, spaces.Dict):
        if not isinstance(action_names, Mapping | None):
            raise ValueError("For a Dict action space, action_names must map keys to name lists")
        model, to_env, to_json = _dict_model("Action", space, dict(action_names or {}))
        return ActionSchema(
            model=model,
            to_action=to_env,
            from_action=lambda action: model.model_validate(to_json(action)),
            field=None,
            recipe=recipe,
        )
    if isinstance(action_names, Mapping):
        raise ValueError("action_names is a mapping, but the action space is not a Dict space")
    node = _node(space, action_names, path=field_name)
    field_info = Field(description=description) if description else Field()
    model = create_model(
        "Action",
        __config__=ConfigDict(extra="forbid"),
        **{field_name: (node.annotation, field_info)},
    )
    actions = discrete_names = None
    if isinstance(space, spaces.Discrete) and space.n <= 1024:
        actions = tuple(space.start + np.int64(i) for i in range(space.n))
        discrete_names = tuple(action_names) if action_names is not None else None
    return ActionSchema(
        model=model,
        to_action=lambda m: node.to_env(getattr(m, field_name)),
        from_action=lambda action: model.model_validate({field_name: node.to_json(action)}),
        actions=actions,
        names=discrete_names,
        field=field_name,
        recipe=recipe,
    )


def _node(space: spaces.Space[Any], names: Sequence[str] | None, path: str) -> _Node:
    if names is not None and not isinstance(space, spaces.Discrete):
        raise ValueError(f"Action names were given for {path}, but its space is not Discrete")
    if isinstance(space, spaces.Discrete):
        return _discrete_node(space, names, path)
    if isinstance(space, spaces.Box):
        return _array_node(space, space.low, space.high, path)
    if isinstance(space, spaces.MultiDiscrete):
        low = space.start
        return _array_node(space, low, low + space.nvec - 1, path)
    if isinstance(space, spaces.MultiBinary):
        zeros = np.zeros(space.shape, dtype=np.int64)
        return _array_node(space, zeros, zeros + 1, path)
    if isinstance(space, spaces.Tuple):
        children = [_node(sub, None, f"{path}[{i}]") for i, sub in enumerate(space.spaces)]
        return _Node(
            annotation=tuple[tuple(c.annotation for c in children)],  # type: ignore[misc]
            to_env=lambda v: tuple(c.to_env(x) for c, x in zip(children, v, strict=True)),
            to_json=lambda a: [c.to_json(x) for c, x in zip(children, a, strict=True)],
        )
    if isinstance(space, spaces.Dict):
        model, to_env, to_json = _dict_model(_model_name(path), space, {})
        return _Node(annotation=model, to_env=to_env, to_json=to_json)
    if isinstance(space, spaces.Text | UnicodeText):
        return _text_node(space)
    raise TypeError(
        f"Expected a Discrete, Box, MultiDiscrete, MultiBinary, Text, Dict or Tuple action "
        f"space, got {type(space).__name__}; pass a parser for this space"
    )


def _discrete_node(space: spaces.Discrete, names: Sequence[str] | None, path: str) -> _Node:
    start = int(space.start)
    if names is None:
        return _Node(
            annotation=Annotated[int, Field(ge=start, le=start + int(space.n) - 1)],
            to_env=lambda v: np.int64(v),
            to_json=int,
        )
    names = tuple(names)
    if len(names) != space.n or len({n.lower() for n in names}) != len(names):
        raise ValueError(
            f"Expected {space.n} distinct action names for {path}, got {list(names)!r}"
        )
    canonical = {n.strip().lower(): n for n in names}

    def normalise(value: Any) -> Any:
        if isinstance(value, str):
            return canonical.get(value.strip().lower(), value)
        return value

    def name_of(action: Any) -> str:
        index = int(action) - start
        if not 0 <= index < len(names):  # a negative index would wrap around silently
            raise ValueError(f"action {action!r} is not in {space}")
        return names[index]

    return _Node(
        annotation=Annotated[Literal[names], BeforeValidator(normalise)],  # type: ignore[valid-type]
        to_env=lambda v: np.int64(start + names.index(v)),
        to_json=name_of,
    )


def _array_node(space: spaces.Space[Any], low: np.ndarray, high: np.ndarray, path: str) -> _Node:
    """Box, MultiDiscrete and MultiBinary: a number, or nested lists of the space's shape."""
    shape, dtype = tuple(space.shape), space.dtype
    is_int = np.issubdtype(dtype, np.integer)
    scalar: type = int if is_int else float
    low, high = np.broadcast_to(low, shape), np.broadcast_to(high, shape)
    element_bounds: dict[str, Any] = {} if is_int else {"allow_inf_nan": False}
    if low.size and np.all(low == low.flat[0]) and np.isfinite(low.flat[0]):
        element_bounds["ge"] = scalar(low.flat[0])
    if high.size and np.all(high == high.flat[0]) and np.isfinite(high.flat[0]):
        element_bounds["le"] = scalar(high.flat[0])
    annotation: Any = Annotated[scalar, Field(**element_bounds)]
    if np.issubdtype(dtype, np.floating):
        # A finite JSON number past the dtype's range (1e300 for float32) would become inf.
        limit = float(np.finfo(dtype).max)
        low, high = np.maximum(low, -limit), np.minimum(high, limit)

    def to_env(value: Any) -> np.ndarray:
        return np.asarray(value, dtype=dtype).reshape(shape)

    def check_bounds(value: Any) -> Any:
        try:
            array = np.asarray(value, dtype=np.float64).reshape(shape)
        except OverflowError:  # an int with hundreds of digits, where no bound applies
            raise ValueError("a value is too large for the action space") from None
        outside = np.argwhere((array < low) | (array > high))
        if outside.size:
            index = tuple(int(i) for i in outside[0])
            where = f" at {list(index)}" if array.size > 1 else ""
            raise ValueError(
                f"value{where} is {array[index]:g}, outside [{low[index]:g}, {high[index]:g}]"
            )
        return value

    if int(np.prod(shape)) == 1:  # a single number, whatever the shape: Pendulum's torque
        return _Node(
            annotation=Annotated[annotation, AfterValidator(check_bounds)],
            to_env=to_env,
            to_json=lambda a: _py(a).item(),
        )

    for size in reversed(shape):
        annotation = Annotated[list[annotation], Field(min_length=size, max_length=size)]

    return _Node(
        annotation=Annotated[annotation, AfterValidator(check_bounds)],
        to_env=to_env,
        to_json=lambda a: _py(a).tolist(),
    )


def _text_node(space: spaces.Text | UnicodeText) -> _Node:
    limits = Field(min_length=space.min_length, max_length=space.max_length)
    if isinstance(space, UnicodeText):
        return _Node(annotation=Annotated[str, limits], to_env=str, to_json=str)
    allowed = space.character_set

    def check_charset(value: str) -> str:
        bad = sorted({c for c in value if c not in allowed})
        if bad:
            raise ValueError(f"characters not allowed: {''.join(bad[:10])!r}")
        return value

    return _Node(
        annotation=Annotated[str, limits, AfterValidator(check_charset)], to_env=str, to_json=str
    )


def _dict_model(
    name: str, space: spaces.Dict, names: Mapping[str, Any]
) -> tuple[type[BaseModel], Callable[[Any], Any], Callable[[Any], Any]]:
    unknown = set(names) - set(space.spaces)
    if unknown:
        raise ValueError(f"action_names has keys {sorted(unknown)} that the Dict space lacks")
    fields: dict[str, Any] = {}
    children: dict[str, tuple[str, _Node]] = {}
    for i, (key, sub) in enumerate(space.spaces.items()):
        attr = key if _usable_field_name(key) else f"field_{i}"
        node = _node(sub, names.get(key), path=str(key))
        fields[attr] = (node.annotation, Field(alias=key) if attr != key else Field())
        children[key] = (attr, node)
    # Aliases only: the internal ``field_i`` names are not in the JSON schema the model sees,
    # so a reply using them is as wrong as any other extra field.
    model = create_model(name, __config__=ConfigDict(extra="forbid"), **fields)

    def to_env(m: BaseModel) -> dict[str, Any]:
        return {key: node.to_env(getattr(m, attr)) for key, (attr, node) in children.items()}

    def to_json(action: Mapping[str, Any]) -> dict[str, Any]:
        return {key: node.to_json(action[key]) for key, (_, node) in children.items()}

    return model, to_env, to_json


def _usable_field_name(key: Any) -> bool:
    return (
        isinstance(key, str)
        and key.isidentifier()
        and not key.startswith("_")
        and not keyword.iskeyword(key)
        and not hasattr(BaseModel, key)
    )


def _model_name(path: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in path).strip("_")
    return "Action_" + (cleaned or "value")


def _py(value: Any) -> np.ndarray:
    return np.asarray(value)
