"""Turn a model's reply text into an env action, or an :class:`ActionParseError`.

Parsing = extract (a fenced ```json block, else every top-level ``{...}`` in the prose) →
``model_validate_json``; finite action sets also accept an action name standing alone. Every
object of a reply is checked, however many: a duplicate key in any of them, or valid objects
that disagree, make the reply invalid.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pydantic_core
from pydantic import BaseModel, ValidationError

from textgym.instructions import describe_model, example_from_schema
from textgym.json_spans import fenced_blocks, json_objects, outside_json
from textgym.references import is_reference, resolve
from textgym.schemas import ActionNames, ActionSchema, schema_from_space

__all__ = ["ActionParseError", "ActionParser", "FunctionParser", "JSONActionParser", "as_parser"]

# JSONActionParser attributes derived from (source, to_action, from_action, lenient).
_BUILT_FROM_SOURCE = frozenset(
    {"schema", "model", "_to_action", "_from_action", "_names_pattern", "_instructions"}
)
_MAX_ERROR_CHARS = 500


class ActionParseError(ValueError):
    """A reply that does not describe a valid action.

    Attributes:
        reply: The raw reply text.
        validation_error: The Pydantic error behind it, if any.

    Example:
        >>> err = ActionParseError("no JSON object found in the reply", reply="hmm")
        >>> str(err), err.reply
        ('no JSON object found in the reply', 'hmm')
    """

    def __init__(
        self, message: str, reply: str = "", validation_error: ValidationError | None = None
    ) -> None:
        super().__init__(message)
        self.reply = reply
        self.validation_error = validation_error


class ActionParser(ABC):
    """Maps reply text to an env action and tells the model which format to use.

    Subclasses implement :meth:`parse` and :meth:`instructions`; :meth:`example`,
    :meth:`choices` and :meth:`reply_schema` are optional and enable round-trip checks, choice
    decoding and constrained decoding.
    """

    @abstractmethod
    def parse(self, text: str) -> Any:
        """Return the env action described by ``text`` or raise :class:`ActionParseError`."""

    @abstractmethod
    def instructions(self) -> str:
        """Return the action-format instructions for the system prompt."""

    def example(self, action: Any) -> str | None:
        """Return a reply that parses to ``action``, or None if this parser cannot write one."""
        return None

    def choices(self) -> list[str] | None:
        """Return every valid reply of a finite action set (one per action), or None."""
        return None

    def reply_schema(self) -> dict[str, Any] | None:
        """Return a JSON schema every reply satisfying it parses (constrained decoding), or None."""
        return None

    def __eq__(self, other: object) -> bool:
        # Value equality lets Gymnasium re-create an env from its spec: `gym.make(env.spec)`
        # compares the recorded wrapper arguments with those of the rebuilt env.
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]

    def bind(self, env: gym.Env[Any, Any]) -> None:  # noqa: B027 (optional hook, no-op)
        """Called once by the wrapper with the wrapped env; override to read env details."""


class JSONActionParser(ActionParser):
    """Validates replies against a Pydantic model and converts them to env actions.

    Accepted replies, tried in order: a fenced ```json block or every top-level JSON object
    in the prose; a bare JSON value when the model has one field; an action name standing
    alone in free text when the action set is named and finite.

    Every top-level object of the reply (of its fenced blocks, if it has any) is checked,
    however many there are: objects that fail validation are skipped, but all valid ones must
    describe the same action, and an object that repeats a key (at any depth) makes the whole
    reply invalid, since JSON parsers disagree on which of the values counts.

    Example:
        >>> from gymnasium.spaces import Discrete
        >>> parser = JSONActionParser.from_space(Discrete(2), action_names=["stick", "hit"])
        >>> parser.parse('I will play safe. {"action": "stick"}')
        np.int64(0)
        >>> parser.parse("Hit me!")
        np.int64(1)
        >>> parser.example(1)
        '{"action": "hit"}'
    """

    def __init__(
        self,
        model: type[BaseModel] | ActionSchema,
        *,
        to_action: Callable[[BaseModel], Any] | None = None,
        from_action: Callable[[Any], BaseModel] | None = None,
        lenient: bool = True,
    ) -> None:
        """Create the parser.

        Args:
            model: A Pydantic model class or an :class:`ActionSchema`. A model's own
                ``to_action()`` method is used when it has one; else a single-field model maps
                to that field's value and any other model to its ``model_dump()``.
            to_action: Converts a validated model into an env action (overrides the above).
            from_action: Converts an env action into a model instance, for example replies.
            lenient: Accept a bare JSON value for one-field models and, for named finite
                action sets, an action name standing alone in free text.
        """
        if isinstance(model, ActionSchema):
            schema = model
        elif isinstance(model, type) and issubclass(model, BaseModel):
            schema = _schema_for_model(model)
        else:
            raise TypeError(f"Expected a Pydantic model class or ActionSchema, got {model!r}")
        self.schema = schema
        self.model = schema.model
        self._source = model
        self._given = (model if isinstance(model, type) else None, to_action, from_action)
        self._to_action = to_action or schema.to_action
        self._from_action = from_action or schema.from_action
        self.lenient = lenient
        self._names_pattern = None
        if lenient and schema.names:
            # One group per name, so a match says which name it is: re's case-insensitive
            # matching is not str.lower ("ſtick" matches "stick", "İ".lower() is two chars).
            longest_first = sorted(enumerate(schema.names), key=lambda item: -len(item[1]))
            alternatives = "|".join(f"(?P<n{i}>{re.escape(n)})" for i, n in longest_first)
            self._names_pattern = re.compile(
                rf"(?<![\w-])(?:{alternatives})(?![\w-])", re.IGNORECASE
            )
        self._instructions = describe_model(self.model, self._default_example())

    def __eq__(self, other: object) -> bool:
        # Schemas generated from equal spaces hold fresh closures, so compare what defines
        # them: the JSON schema, the names, leniency and any user-given callables.
        return (
            type(self) is type(other)
            and self._given == other._given  # type: ignore[attr-defined]
            and self.lenient == other.lenient  # type: ignore[attr-defined]
            and self.schema.names == other.schema.names  # type: ignore[attr-defined]
            and self.schema.actions == other.schema.actions  # type: ignore[attr-defined]
            and self.model.model_json_schema() == other.model.model_json_schema()  # type: ignore[attr-defined]
        )

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        """Pickle what the parser was built from; the model and patterns are rebuilt on load.

        A model generated from a space has no importable name, so it cannot be pickled
        itself; its :class:`ActionSchema` pickles as the space and options instead.
        """
        return {k: v for k, v in vars(self).items() if k not in _BUILT_FROM_SOURCE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild the parser from its source, then restore any other attributes."""
        _, to_action, from_action = state["_given"]
        JSONActionParser.__init__(
            self,
            state["_source"],
            to_action=to_action,
            from_action=from_action,
            lenient=state["lenient"],
        )
        vars(self).update(state)

    @classmethod
    def from_space(
        cls,
        space: gym.Space[Any],
        *,
        action_names: ActionNames | None = None,
        field_name: str = "action",
        description: str | None = None,
        lenient: bool = True,
    ) -> JSONActionParser:
        """Build the parser for an action space (see :func:`textgym.schemas.schema_from_space`)."""
        schema = schema_from_space(
            space, action_names=action_names, field_name=field_name, description=description
        )
        return cls(schema, lenient=lenient)

    def parse(self, text: str) -> Any:
        """Return the env action described by ``text`` or raise :class:`ActionParseError`."""
        if not isinstance(text, str):
            raise ActionParseError(f"expected the reply as str, got {type(text).__name__}")
        model = self._validate(text)
        try:
            return self._to_action(model)
        except Exception as e:  # a user's to_action may raise anything on odd values
            raise ActionParseError(f"could not convert the reply to an action: {e}", text) from e

    def _validate(self, text: str) -> BaseModel:
        fenced = fenced_blocks(text)
        # Every object counts; identical ones are checked once (a reply may repeat one
        # object 70,000 times). Most fences of a hostile reply hold no object: skip them fast.
        candidates = Counter(
            candidate
            for source in fenced or [text]
            if "}" in source
            for candidate in json_objects(source)
        )
        first_error: ActionParseError | None = None
        chosen: BaseModel | None = None
        valid, agree = 0, True
        for candidate, count in candidates.items():
            duplicate = _duplicate_key(candidate)
            if duplicate is not None:
                raise ActionParseError(
                    f"invalid action: duplicate key {_short(repr(duplicate))} in a JSON object",
                    text,
                )
            try:
                model = self.model.model_validate_json(candidate)
            except ValidationError as e:
                first_error = first_error or _validation_error(e, text)
                continue
            valid += count
            if chosen is None:
                chosen = model
            elif model != chosen:
                agree = False
        if not agree:
            raise ActionParseError(
                f"ambiguous reply: it holds {valid} JSON objects with different actions", text
            )
        if chosen is not None:
            return chosen
        if self.lenient and not candidates and self.schema.field is not None:
            bare = self._validate_bare(fenced[0] if fenced else text, text)
            if bare is not None:
                return bare
        if self._names_pattern is not None:
            named = self._validate_names(text)
            if named is not None:
                return named
        if first_error is not None:
            raise first_error
        expected = "no JSON object found in the reply"
        if self._names_pattern is not None:
            expected += " and no action name (" + ", ".join(self.schema.names or ()) + ")"
        raise ActionParseError(expected, text)

    def _validate_bare(self, source: str, text: str) -> BaseModel | None:
        stripped = source.strip()
        if not stripped or stripped[0] not in '"[-0123456789tfn':
            return None
        try:
            value = pydantic_core.from_json(stripped)
        except (ValueError, TypeError):  # TypeError: a lone surrogate cannot be UTF-8 encoded
            return None
        try:
            return self.model.model_validate({self.schema.field: value})
        except ValidationError as e:
            if self._names_pattern is None:
                raise _validation_error(e, text) from None
            return None

    def _validate_names(self, text: str) -> BaseModel | None:
        # Only free text counts: a name inside a rejected JSON object ({"action": "hit",
        # "extra": 1}) must not turn that object into a valid reply.
        matches = self._names_pattern.finditer(outside_json(text))  # type: ignore[union-attr]
        found = sorted({int(m.lastgroup[1:]) for m in matches})  # type: ignore[index]
        names = self.schema.names or ()
        if len(found) > 1:
            listed = ", ".join(names[i] for i in found)
            raise ActionParseError(f"ambiguous reply: it names several actions ({listed})", text)
        if not found:
            return None
        try:
            return self.model.model_validate({self.schema.field: names[found[0]]})
        except ValidationError as e:  # a hand-made ActionSchema whose names its model rejects
            raise _validation_error(e, text) from None

    def instructions(self) -> str:
        """Return the generated format instructions (fields, allowed values, an example)."""
        return self._instructions

    def example(self, action: Any) -> str | None:
        """Return the JSON reply for ``action`` (None if the parser has no ``from_action``)."""
        if self._from_action is None:
            return None
        return _compact_json(self._from_action(action))

    def choices(self) -> list[str] | None:
        """Return one JSON reply per action for finite Discrete action sets."""
        if self.schema.actions is None or self._from_action is None:
            return None
        return [_compact_json(self._from_action(a)) for a in self.schema.actions]

    def reply_schema(self) -> dict[str, Any]:
        """Return the JSON schema of the Pydantic model replies are validated against."""
        return self.model.model_json_schema()

    def _default_example(self) -> str | None:
        if self.schema.actions is not None and self._from_action is not None:
            return _compact_json(self._from_action(self.schema.actions[0]))
        value = example_from_schema(self.model)
        if value is None:
            return None
        try:
            return _compact_json(self.model.model_validate(value))
        except ValidationError:
            return None


class FunctionParser(ActionParser):
    """Wraps a function ``reply -> action``; any exception it raises marks the reply invalid.

    Example:
        >>> parser = FunctionParser(lambda reply: 0 if "stay" in reply else 1,
        ...                         instructions="Say 'stay' or 'hit'.")
        >>> parser.parse("I stay")
        0
    """

    def __init__(self, fn: Callable[[str], Any], instructions: str = "") -> None:
        """Create the parser.

        Args:
            fn: Maps the reply text to an env action; raising marks the reply invalid.
            instructions: Action-format instructions shown to the model.
        """
        if not callable(fn):
            raise TypeError(f"Expected a callable reply -> action, got {fn!r}")
        self.fn = fn
        self._instructions = instructions

    def parse(self, text: str) -> Any:
        """Call the function; turn whatever it raises into :class:`ActionParseError`."""
        try:
            return self.fn(text)
        except ActionParseError:
            raise
        except Exception as e:
            raise ActionParseError(f"{type(e).__name__}: {_short(str(e))}", text) from e

    def instructions(self) -> str:
        """Return the instructions given at construction."""
        return self._instructions


def as_parser(parser: Any, action_space: gym.Space[Any], **schema_options: Any) -> ActionParser:
    """Coerce what a user passed as ``parser`` into an :class:`ActionParser`.

    Args:
        parser: None (generate from ``action_space``), an :class:`ActionParser`, a Pydantic
            model class, an :class:`ActionSchema`, a callable ``reply -> action``, or the
            importable name ``"module:Name"`` of any of these (an ActionParser class is
            built without arguments).
        action_space: The wrapped env's action space.
        **schema_options: ``action_names``, ``field_name``, ``description`` for generation.

    Example:
        >>> from gymnasium.spaces import Discrete
        >>> as_parser(None, Discrete(3)).parse('{"action": 2}')
        np.int64(2)
        >>> as_parser("textgym.envs.calculator_parser:CalculatorParser", None).parse("Answer: 4")
        'Answer: 4'
    """
    if parser is None:
        return JSONActionParser.from_space(action_space, **schema_options)
    if schema_options:
        raise ValueError(f"{sorted(schema_options)} only apply when no parser is given")
    if isinstance(parser, ActionParser):
        return parser
    if isinstance(parser, str):
        if not is_reference(parser):
            raise TypeError(
                f"Expected a parser given as a string to be an importable name 'module:Name', "
                f"got {parser!r}"
            )
        named = resolve(parser)
        if isinstance(named, type) and issubclass(named, ActionParser):
            return named()
        if isinstance(named, str):  # a name must lead to an object, not to another name
            raise TypeError(f"Expected {parser!r} to name a parser, got the string {named!r}")
        return as_parser(named, action_space)
    if isinstance(parser, ActionSchema) or (
        isinstance(parser, type) and issubclass(parser, BaseModel)
    ):
        return JSONActionParser(parser)
    if callable(parser):
        return FunctionParser(parser)
    raise TypeError(
        "Expected parser to be None, an ActionParser, a Pydantic model class or a callable "
        f"reply -> action, got {type(parser).__name__}"
    )


def _schema_for_model(model: type[BaseModel]) -> ActionSchema:
    fields = list(model.model_fields)
    single = fields[0] if len(fields) == 1 else None
    if callable(getattr(model, "to_action", None)):
        to_action: Callable[[BaseModel], Any] = lambda m: m.to_action()  # type: ignore[attr-defined]  # noqa: E731
    elif single is not None:
        to_action = lambda m: getattr(m, single)  # noqa: E731
    else:
        to_action = lambda m: m.model_dump()  # noqa: E731
    from_action = getattr(model, "from_action", None)
    return ActionSchema(model=model, to_action=to_action, from_action=from_action, field=single)


def _validation_error(error: ValidationError, reply: str) -> ActionParseError:
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in item["loc"])
        parts.append(f"{loc}: {item['msg']}" if loc else item["msg"])
    message = "invalid action: " + _short("; ".join(parts))
    return ActionParseError(message, reply, validation_error=error)


class _DuplicateKeyError(Exception):
    """Raised by :func:`_reject_duplicate_keys` to stop ``json.loads`` at a repeated key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> None:
    """``object_pairs_hook`` for ``json.loads``: raise at the first key seen twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKeyError(key)
        seen.add(key)


def _duplicate_key(candidate: str) -> str | None:
    """Return a key that some object of the JSON text ``candidate`` repeats, else None.

    Pydantic keeps the last of repeated keys; other parsers keep the first. Text that is not
    JSON (or nests too deep for ``json.loads``) has no duplicate here: validation rejects it.
    Numbers are kept as text, so huge ones cost nothing and raise nothing.

    Example:
        >>> _duplicate_key('{"action": "stick", "x": {"a": 1, "a": 2}}')
        'a'
    """
    if candidate.count(":") < 2:  # a repeated key needs two "key:" pairs: the common case
        return None
    try:
        json.loads(
            candidate,
            object_pairs_hook=_reject_duplicate_keys,
            parse_int=str,
            parse_float=str,
            strict=False,  # accept control characters in strings, as more lenient parsers do
        )
    except _DuplicateKeyError as e:
        return e.key
    except (ValueError, RecursionError):
        return None
    return None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def _compact_json(model: BaseModel) -> str:
    """JSON with a space after separators, as people and models write it."""
    return json.dumps(model.model_dump(mode="json", by_alias=True), ensure_ascii=False)
