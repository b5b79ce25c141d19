"""Any OpenEnv server as a Gymnasium text env: ``gym.make("textgym/OpenEnv-v0", base_url=...)``.

An episode runs over the server's WebSocket (``/ws``), one session per env, so a vector env
of N copies opens N sessions. What the env is depends on the server's ``/schema``:

- A **text server** (its action is one ``reply`` string and its observation carries
  ``messages``, as ``textgym serve`` and :mod:`textgym.openenv_server` speak): the messages
  are passed through as they are and the reply goes back verbatim; the server parses it and
  penalises an invalid reply, and its ``invalid`` / ``parse_error`` / valid replies / reply
  schema / action mask come back in ``info`` and in :meth:`OpenEnvTextEnv.reply_choices`.
- **Any other server**: :class:`OpenEnvEnv` (observations and actions as JSON objects) behind
  a :class:`~textgym.wrappers.TextEnvWrapper` whose parser is built from the server's action
  schema, so a reply is parsed here into the server's ``Action`` and an invalid one is
  recorded and penalised exactly as for a local env (the server is not stepped).

Every wait is bounded (``timeout_s``): a server that stops answering or goes away mid-episode
raises :class:`OpenEnvError` naming the server, never hangs. The server's messages are
untrusted data: they are checked for shape, never evaluated.

Needs the ``openenv`` extra: ``pip install "textgym[openenv]"``.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Mapping
from typing import Annotated, Any, Literal, SupportsFloat

import gymnasium as gym
import numpy as np
from pydantic import BaseModel, Field, create_model

from textgym.extras import require
from textgym.parsers import JSONActionParser
from textgym.spaces import ChatMessages, UnicodeText
from textgym.wrappers import Messages, TextEnvWrapper

__all__ = [
    "JSONObjects",
    "OpenEnvCapacityError",
    "OpenEnvEnv",
    "OpenEnvError",
    "OpenEnvSession",
    "OpenEnvTextEnv",
    "make_openenv_text_env",
    "model_from_schema",
]

_WIRE_ONLY = ("done", "reward", "metadata")  # OpenEnv's own observation fields
_MAX_MESSAGE_BYTES = 16 * 2**20
_TEXT_BOUNDS = ("max_messages", "max_content_length")


class OpenEnvError(ConnectionError):
    """The OpenEnv server failed, went away, stopped answering or answered with an error."""


class OpenEnvCapacityError(OpenEnvError):
    """The server already runs as many sessions as it allows (``CAPACITY_REACHED``)."""


class OpenEnvSession:
    """One WebSocket session with an OpenEnv server: ``reset``, ``step``, ``close``.

    Args:
        base_url: The server's address, ``http://host:port`` (``https``, ``ws`` and ``wss``
            work too).
        timeout_s: The longest wait for the server to connect or answer one message.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._ws: Any = None

    @property
    def ws_url(self) -> str:
        """The session's WebSocket address (``.../ws``)."""
        scheme, sep, rest = self.base_url.partition("://")
        if not sep:
            raise ValueError(f"Expected a URL like http://127.0.0.1:8000, got {self.base_url!r}")
        scheme = {"http": "ws", "https": "wss"}.get(scheme, scheme)
        return f"{scheme}://{rest}/ws"

    def schema(self) -> dict[str, Any]:
        """The server's ``/schema``: JSON schemas of its action, observation and state."""
        url = self.base_url.replace("ws://", "http://").replace("wss://", "https://")
        try:
            with urllib.request.urlopen(f"{url}/schema", timeout=self.timeout_s) as response:
                schema = json.loads(response.read(_MAX_MESSAGE_BYTES))
        except (OSError, ValueError) as e:
            raise OpenEnvError(f"No OpenEnv schema from {url}/schema: {e}") from e
        if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
            raise OpenEnvError(f"{url}/schema did not describe an action: {str(schema)[:200]}")
        return schema

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start an episode; returns ``{"observation": {...}, "reward": r, "done": d}``."""
        data: dict[str, Any] = {} if seed is None else {"seed": int(seed)}
        return self._ask({"type": "reset", "data": data})

    def step(self, action: Mapping[str, Any]) -> dict[str, Any]:
        """Send one action (the server's ``Action`` fields); returns the observation message."""
        return self._ask({"type": "step", "data": dict(action)})

    def state(self) -> dict[str, Any]:
        """The session's state (``episode_id``, ``step_count`` and what the server adds)."""
        return self._ask({"type": "state"}, expect="state")

    def close(self) -> None:
        """End the session (the server closes its env)."""
        if self._ws is None:
            return
        ws, self._ws = self._ws, None
        with contextlib.suppress(Exception):  # already gone: nothing left to close
            ws.send(json.dumps({"type": "close"}))
        ws.close()

    def _connect(self) -> Any:
        if self._ws is None:
            client = require("websockets.sync.client", "openenv", "textgym/OpenEnv-v0")
            try:
                connection = client.connect(
                    self.ws_url,
                    open_timeout=self.timeout_s,
                    close_timeout=min(self.timeout_s, 5.0),
                    max_size=_MAX_MESSAGE_BYTES,
                    proxy=None,
                )
                self._ws = connection.__enter__()  # the context manager, held for the session
            except (OSError, TimeoutError) as e:
                raise OpenEnvError(
                    f"Cannot connect to the OpenEnv server at {self.ws_url}: {e}"
                ) from e
        return self._ws

    def _ask(self, message: dict[str, Any], expect: str = "observation") -> dict[str, Any]:
        ws = self._connect()
        try:
            # If closed, still read what the server said first (a full server sends
            # CAPACITY_REACHED on connect, then closes).
            with contextlib.suppress(Exception):
                ws.send(json.dumps(message))
            raw = ws.recv(timeout=self.timeout_s)
        except TimeoutError as e:
            self._drop()
            raise OpenEnvError(
                f"The OpenEnv server at {self.ws_url} did not answer a {message['type']} "
                f"in {self.timeout_s:g} s"
            ) from e
        except Exception as e:  # websockets' ConnectionClosed and socket errors
            self._drop()
            raise OpenEnvError(
                f"The OpenEnv server at {self.ws_url} closed the session during a "
                f"{message['type']}: {e}"
            ) from e
        try:
            answer = json.loads(raw)
        except ValueError as e:
            raise OpenEnvError(f"The OpenEnv server sent something not JSON: {raw[:200]!r}") from e
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
            raise OpenEnvError(f"Unexpected message from the OpenEnv server: {str(answer)[:200]}")
        if answer.get("type") == "error":
            self._fail(answer["data"], message["type"])
        if answer.get("type") != expect:
            raise OpenEnvError(f"Unexpected message from the OpenEnv server: {str(answer)[:200]}")
        data = answer["data"]
        if expect == "observation" and not isinstance(data.get("observation"), dict):
            raise OpenEnvError(f"The OpenEnv server sent no observation: {str(data)[:200]}")
        return data

    def _fail(self, error: Mapping[str, Any], during: str) -> None:
        code, text = error.get("code"), str(error.get("message", error))[:500]
        if code == "CAPACITY_REACHED":
            self._drop()
            raise OpenEnvCapacityError(f"The OpenEnv server at {self.ws_url} is full: {text}")
        raise OpenEnvError(f"The OpenEnv server refused a {during} ({code}): {text}")

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):  # the connection is already broken
                ws.close()


def _reward(data: Mapping[str, Any]) -> float:
    reward = data.get("reward")
    if reward is None:
        return 0.0
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise OpenEnvError(f"The OpenEnv server sent a reward that is not a number: {reward!r}")
    return float(reward)


def _messages(observation: Mapping[str, Any]) -> Messages:
    messages = observation.get("messages")
    if not (isinstance(messages, list) and all(_is_message(m) for m in messages)):
        raise OpenEnvError(
            f"The OpenEnv server sent messages that are not chat messages: {str(messages)[:200]}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _is_text_server(schema: Mapping[str, Any]) -> bool:
    action = {k for k in schema["action"].get("properties", {}) if k != "metadata"}
    observation = schema.get("observation", {}).get("properties", {})
    reply = schema["action"].get("properties", {}).get("reply", {})
    return action == {"reply"} and reply.get("type") == "string" and "messages" in observation


class OpenEnvTextEnv(gym.Env[Messages, str]):
    """A text server's env (``textgym serve``): its messages in, the reply text out.

    ``info`` holds the server's step info (JSON values), ``invalid`` and ``parse_error``, and
    ``action_mask`` as an int8 array when the server sends one; :meth:`reply_choices` and
    :meth:`reply_schema` are the server's latest lists, for choice or constrained decoding
    (before the first reset, those of the session's state).

    Args:
        base_url: The server's address.
        timeout_s: The longest wait for one answer.
        max_messages: The observation space's bound on messages in a conversation.
        max_content_length: Its bound on characters in one message.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        max_messages: int = 64,
        max_content_length: int = 16384,
    ) -> None:
        self.session = OpenEnvSession(base_url, timeout_s=timeout_s)
        self.observation_space = ChatMessages(max_messages, max_content_length)
        self.action_space = UnicodeText(max_content_length)
        self._choices: list[str] | None = None
        self._schema: dict[str, Any] | None = None
        self.server_state = self.session.state()
        self._hints(self.server_state)  # before the first reset, for a trainer's set-up

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Messages, dict[str, Any]]:
        """Start an episode on the server (seeded like the server's env)."""
        super().reset(seed=seed)
        return self._read(self.session.reset(seed), stepped=False)

    def step(self, action: str) -> tuple[Messages, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send the reply; the server parses it, steps its env and answers."""
        data = self.session.step({"reply": str(action)})
        messages, info = self._read(data, stepped=True)
        observation = data["observation"]
        done = bool(data.get("done"))
        terminated = bool(observation.get("terminated", done))
        truncated = bool(observation.get("truncated", False)) and not terminated
        return messages, _reward(data), terminated, truncated, info

    def reply_choices(self) -> list[str] | None:
        """The valid replies the server listed with its last observation, if any."""
        return list(self._choices) if self._choices else None

    def reply_schema(self) -> dict[str, Any] | None:
        """The reply JSON schema the server sent with its last observation, if any."""
        return self._schema

    def prompt_parts(self) -> tuple[str, str, JSONActionParser | None, float]:
        """``(system prompt, reply instructions, parser, invalid penalty)`` the server declares.

        What :func:`textgym.tool_env` reads to make the served env a tool: the parser is built
        from the server's reply schema (None when replies are free text).
        """
        state = self.server_state
        schema = state.get("reply_schema")
        parser = JSONActionParser(model_from_schema(schema)) if isinstance(schema, dict) else None
        penalty = state.get("invalid_penalty")
        return (
            str(state.get("system_prompt") or ""),
            str(state.get("instructions") or ""),
            parser,
            float(penalty) if isinstance(penalty, int | float) else 0.0,
        )

    def close(self) -> None:
        """End the session."""
        self.session.close()

    def _read(self, data: Mapping[str, Any], stepped: bool) -> tuple[Messages, dict[str, Any]]:
        observation = data["observation"]
        messages = _messages(observation)
        self._hints(observation)
        info = dict(observation.get("info") or {})
        if stepped and "invalid" in observation:
            info["invalid"] = bool(observation["invalid"])
        if observation.get("parse_error") is not None:
            info["parse_error"] = str(observation["parse_error"])
        if observation.get("action_mask") is not None:
            info["action_mask"] = np.asarray(observation["action_mask"], dtype=np.int8)
        return messages, info

    def _hints(self, fields: Mapping[str, Any]) -> None:
        choices, schema = fields.get("valid_replies"), fields.get("reply_schema")
        listed = isinstance(choices, list) and all(isinstance(c, str) for c in choices)
        self._choices = choices if listed else None
        self._schema = schema if isinstance(schema, dict) else None


class JSONObjects(gym.Space[dict[str, Any]]):
    """JSON objects (``dict`` with string keys), optionally those a Pydantic model accepts.

    Example:
        >>> from pydantic import BaseModel
        >>> class Guess(BaseModel):
        ...     number: int
        >>> space = JSONObjects(Guess)
        >>> space.contains({"number": 3}), space.contains({"number": "three"}), space.contains(3)
        (True, False, False)
    """

    def __init__(self, model: type[BaseModel] | None = None) -> None:
        super().__init__()
        self.model = model

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a JSON object the model (if any) validates."""
        if not (isinstance(x, dict) and all(isinstance(k, str) for k in x)):
            return False
        if self.model is None:
            return True
        try:
            self.model.model_validate(x)
        except ValueError:
            return False
        return True

    def __repr__(self) -> str:
        return f"JSONObjects({self.model.__name__ if self.model else ''})"


class OpenEnvEnv(gym.Env[dict[str, Any], dict[str, Any]]):
    """Any OpenEnv server as a Gymnasium env: observations and actions as JSON objects.

    The observation is the server's observation fields (without OpenEnv's ``done``,
    ``reward`` and ``metadata``); the action is a dict of the server's ``Action`` fields.
    :func:`make_openenv_text_env` puts a :class:`~textgym.wrappers.TextEnvWrapper` on it.

    Args:
        base_url: The server's address.
        timeout_s: The longest wait for one answer.
        schema: The server's ``/schema`` (fetched when not given).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(
        self, base_url: str, *, timeout_s: float = 60.0, schema: Mapping[str, Any] | None = None
    ) -> None:
        self.session = OpenEnvSession(base_url, timeout_s=timeout_s)
        self.schema = dict(schema) if schema is not None else self.session.schema()
        self.action_model = model_from_schema(self.schema["action"], skip=("metadata",))
        self.observation_space = JSONObjects()
        self.action_space = JSONObjects(self.action_model)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode on the server."""
        super().reset(seed=seed)
        data = self.session.reset(seed)
        return self._observation(data), {}

    def step(
        self, action: Mapping[str, Any]
    ) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Send one action; OpenEnv's ``done`` ends the episode (``terminated``)."""
        data = self.session.step(action)
        return self._observation(data), _reward(data), bool(data.get("done")), False, {}

    def close(self) -> None:
        """End the session."""
        self.session.close()

    @staticmethod
    def _observation(data: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in data["observation"].items() if k not in _WIRE_ONLY}


def make_openenv_text_env(
    base_url: str = "http://127.0.0.1:8000", *, timeout_s: float = 60.0, **wrapper_kwargs: Any
) -> gym.Env[Messages, str]:
    """Entry point of ``textgym/OpenEnv-v0``: the server's env as a text env.

    A text server (``textgym serve``) gives an :class:`OpenEnvTextEnv`; any other server an
    :class:`OpenEnvEnv` behind a ``TextEnvWrapper`` whose parser validates replies against the
    server's action schema.

    Args:
        base_url: The server's address (``textgym serve`` listens on http://127.0.0.1:8000).
        timeout_s: The longest wait for the server to connect or answer.
        **wrapper_kwargs: ``TextEnvWrapper`` options (formatter, system prompt, history, ...);
            a text server does its own prompting and takes only ``max_messages`` and
            ``max_content_length`` (:class:`OpenEnvTextEnv`).
    """
    session = OpenEnvSession(base_url, timeout_s=timeout_s)
    schema = session.schema()
    if _is_text_server(schema):
        bounds = {k: wrapper_kwargs.pop(k) for k in _TEXT_BOUNDS if k in wrapper_kwargs}
        if wrapper_kwargs:
            raise TypeError(
                f"{base_url} serves a text env, which builds its own prompts: "
                f"wrapper options {sorted(wrapper_kwargs)} do not apply"
            )
        return OpenEnvTextEnv(base_url, timeout_s=timeout_s, **bounds)
    env = OpenEnvEnv(base_url, timeout_s=timeout_s, schema=schema)
    wrapper_kwargs.setdefault(
        "parser",
        JSONActionParser(env.action_model, to_action=lambda m: m.model_dump(mode="json")),
    )
    return TextEnvWrapper(env, **wrapper_kwargs)


_CONSTRAINTS = {  # JSON schema keyword -> pydantic Field argument
    "minimum": "ge",
    "maximum": "le",
    "exclusiveMinimum": "gt",
    "exclusiveMaximum": "lt",
    "minLength": "min_length",
    "maxLength": "max_length",
    "minItems": "min_length",
    "maxItems": "max_length",
    "pattern": "pattern",
}
_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}


def model_from_schema(
    schema: Mapping[str, Any], *, name: str | None = None, skip: tuple[str, ...] = ()
) -> type[BaseModel]:
    """A Pydantic model for a JSON schema object (what a server's ``/schema`` describes).

    Covers what action models use: string, integer, number, boolean and null fields, arrays,
    nested objects (``$ref`` into ``$defs`` too), ``enum`` / ``const`` as literals, ``anyOf``
    unions, defaults, descriptions and the bounds of a field (``minimum``, ``maxLength``,
    ``pattern``, ...). Anything else accepts any JSON value. Extra fields are
    refused, as in OpenEnv's ``Action``.

    Args:
        schema: A JSON schema of ``"type": "object"``.
        name: The model's name (default: the schema's ``title``).
        skip: Properties to leave out (OpenEnv's ``metadata``).

    Example:
        >>> Move = model_from_schema({
        ...     "title": "MoveAction", "type": "object", "required": ["direction"],
        ...     "properties": {
        ...         "direction": {"enum": ["left", "right"], "description": "Where to go"},
        ...         "steps": {"type": "integer", "default": 1},
        ...     },
        ... })
        >>> Move(direction="left")
        MoveAction(direction='left', steps=1)
        >>> Move.model_validate({"direction": "up"})
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for MoveAction
        ...
    """
    return _object_model(schema, schema.get("$defs", {}), name, skip)


def _object_model(
    schema: Mapping[str, Any], defs: Mapping[str, Any], name: str | None, skip: tuple[str, ...]
) -> type[BaseModel]:
    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        if key in skip or not key.isidentifier() or key.startswith("_"):
            continue
        annotation = _annotation(prop, defs, key)
        options = {"description": prop["description"]} if "description" in prop else {}
        if key in required:
            fields[key] = (annotation, Field(..., **options))
        else:
            default = prop.get("default")
            optional = annotation | None if default is None else annotation
            fields[key] = (optional, Field(default, **options))
    model_name = name or str(schema.get("title") or "Action")
    model_name = "".join(c for c in model_name if c.isalnum() or c == "_") or "Action"
    return create_model(model_name, __config__={"extra": "forbid"}, **fields)


def _annotation(prop: Mapping[str, Any], defs: Mapping[str, Any], key: str) -> Any:
    annotation = _base_annotation(prop, defs, key)
    bounds = {name: prop[word] for word, name in _CONSTRAINTS.items() if word in prop}
    return Annotated[annotation, Field(**bounds)] if bounds else annotation


def _base_annotation(prop: Mapping[str, Any], defs: Mapping[str, Any], key: str) -> Any:
    if "$ref" in prop:
        target = defs.get(str(prop["$ref"]).rsplit("/", 1)[-1])
        return _annotation(target, defs, key) if isinstance(target, Mapping) else Any
    if "const" in prop:
        return Literal[prop["const"]]
    if "enum" in prop and prop["enum"]:
        return Literal[tuple(prop["enum"])]
    for union in ("anyOf", "oneOf"):
        if union in prop:
            options = [_annotation(option, defs, key) for option in prop[union]]
            result = options[0]
            for option in options[1:]:
                result = result | option
            return result
    kind = prop.get("type")
    if isinstance(kind, list):
        return _annotation({"anyOf": [{**prop, "type": k} for k in kind]}, defs, key)
    if kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    if kind == "array":
        items = prop.get("items")
        return list[_annotation(items, defs, key)] if isinstance(items, Mapping) else list[Any]
    if kind == "object":
        if "properties" in prop:
            return _object_model(prop, defs, prop.get("title") or key.title(), ())
        return dict[str, Any]
    return Any
