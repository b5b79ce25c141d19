"""Serve a text env over OpenEnv's protocol, so that any OpenEnv client can play and train on it.

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ is the environment protocol that TRL,
Unsloth, torchforge and SkyRL consume: Pydantic ``Action`` / ``Observation`` / ``State`` models
behind a FastAPI app, one env per WebSocket session. :func:`create_openenv_app` turns a
registered text env id (or a factory of text envs) into such an app; ``textgym serve`` runs it.

On the wire an action is ``{"reply": "<the model's reply text>"}``; the server's text env
parses it exactly as the local env does (an invalid reply is recorded and penalised there).
A :class:`TextObservation` carries the chat messages and, as declared fields (OpenEnv clients
may drop ``metadata``), what a trainer needs: ``terminated`` / ``truncated`` (OpenEnv's ``done``
is their union), ``invalid`` and ``parse_error``, the valid replies and reply JSON schema for
choice or constrained decoding, the action mask, and the rest of the step's ``info`` as JSON.

Needs the ``openenv`` extra: ``pip install "textgym[openenv]"``.

Example:
    >>> from textgym.openenv_server import TextAction, TextGymEnvironment
    >>> import gymnasium as gym
    >>> server_env = TextGymEnvironment(gym.make("textgym/Blackjack-v1"))
    >>> first = server_env.reset(seed=0)
    >>> first.messages[-1]["role"], first.valid_replies
    ('user', ['{"action": "stick"}', '{"action": "hit"}'])
    >>> obs = server_env.step(TextAction(reply="I fold"))
    >>> obs.invalid, obs.reward, obs.done
    (True, -1.0, False)
    >>> server_env.state.step_count
    1
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
from pydantic import Field

from textgym.checker import prompt_parts
from textgym.episodes import reply_choices, reply_schemas
from textgym.extras import require
from textgym.recording import plain_json
from textgym.spaces import ChatMessages

require("openenv", "openenv", "Serving over OpenEnv")

from openenv.core.env_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

__all__ = [
    "TextAction",
    "TextGymEnvironment",
    "TextObservation",
    "TextState",
    "create_openenv_app",
    "running_server",
    "serve",
]


class TextAction(Action):
    """One reply of the model, as text; the server's text env parses it."""

    reply: str = Field(description="The model's reply text, parsed by the env into an action")


class TextObservation(Observation):
    """A text env's observation and the step's outcome, every field a client needs declared."""

    messages: list[dict[str, str]] = Field(description="The chat messages the model answers")
    terminated: bool = Field(default=False, description="The episode ended in the env")
    truncated: bool = Field(default=False, description="The episode was cut (a time limit)")
    invalid: bool = Field(default=False, description="The last reply did not parse")
    parse_error: str | None = Field(default=None, description="Why the last reply was invalid")
    valid_replies: list[str] | None = Field(
        default=None, description="Every valid reply now (finite action sets), for choice decoding"
    )
    reply_schema: dict[str, Any] | None = Field(
        default=None, description="The JSON schema of a valid reply, for constrained decoding"
    )
    action_mask: list[int] | None = Field(default=None, description="1 for each legal action")
    info: dict[str, Any] = Field(default_factory=dict, description="The step's other info, as JSON")


class TextState(State):
    """The session's episode id and step count, the env it plays and its reply hints."""

    env_id: str | None = Field(default=None, description="The text env's registered id")
    valid_replies: list[str] | None = Field(
        default=None, description="The env's valid replies before its first reset, if it has any"
    )
    reply_schema: dict[str, Any] | None = Field(
        default=None, description="The env's reply JSON schema before its first reset"
    )
    system_prompt: str | None = Field(default=None, description="The env's system prompt")
    instructions: str | None = Field(
        default=None, description="How to reply (the end of the system prompt)"
    )
    invalid_penalty: float | None = Field(default=None, description="What an invalid reply costs")


class TextGymEnvironment(Environment[TextAction, TextObservation, TextState]):
    """An OpenEnv ``Environment`` that plays one text env (one per session).

    Args:
        env: A text env (chat-message observations, reply text actions).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__()
        if not isinstance(env.observation_space, ChatMessages):
            raise ValueError(
                f"Expected a text env (ChatMessages observations), got {env.observation_space}; "
                "wrap it with textgym.TextEnvWrapper or pass a textgym/... id"
            )
        self.env = env
        spec = getattr(env, "spec", None)
        try:
            system_prompt, instructions, _, penalty = prompt_parts(env)
            prompt = {
                "system_prompt": system_prompt,
                "instructions": instructions,
                "invalid_penalty": penalty,
            }
        except ValueError:  # a text env of its own making
            prompt = {}
        self._state = TextState(
            env_id=spec.id if spec is not None else None,
            valid_replies=reply_choices(env),
            reply_schema=reply_schemas(env),
            **prompt,
        )

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> TextObservation:
        """Start an episode (seeded like ``env.reset(seed=...)``)."""
        messages, info = self.env.reset(seed=seed)
        self._state = self._state.model_copy(
            update={"episode_id": episode_id or str(uuid.uuid4()), "step_count": 0}
        )
        return self._observation(messages, info, None, False, False)

    def step(
        self, action: TextAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TextObservation:
        """Send the reply to the text env; the outcome comes back as declared fields."""
        messages, reward, terminated, truncated, info = self.env.step(action.reply)
        self._state.step_count += 1
        return self._observation(messages, info, float(reward), terminated, truncated)

    @property
    def state(self) -> TextState:
        """The current episode's id and step count."""
        return self._state

    def close(self) -> None:
        """Close the text env."""
        self.env.close()

    def _observation(
        self,
        messages: list[dict[str, str]],
        info: Mapping[str, Any],
        reward: float | None,
        terminated: bool,
        truncated: bool,
    ) -> TextObservation:
        plain = plain_json(dict(info))
        return TextObservation(
            messages=messages,
            reward=reward,
            done=bool(terminated or truncated),
            terminated=bool(terminated),
            truncated=bool(truncated),
            invalid=bool(plain.pop("invalid", False)),
            parse_error=plain.pop("parse_error", None),
            action_mask=plain.pop("action_mask", None),
            valid_replies=reply_choices(self.env),
            reply_schema=reply_schemas(self.env),
            info=plain,
        )


def create_openenv_app(
    env: str | Callable[[], gym.Env[Any, Any]], *, max_sessions: int = 4, **make_kwargs: Any
) -> Any:
    """A FastAPI app serving a text env over OpenEnv's protocol, one env per session.

    Episodes run over the app's WebSocket ``/ws`` (OpenEnv's clients use it); the plain HTTP
    ``/reset`` and ``/step`` build a fresh env per request, as in every OpenEnv server.
    ``/health``, ``/schema`` (the JSON schemas of :class:`TextAction`, :class:`TextObservation`
    and :class:`TextState`) and ``/metadata`` describe it. A session over ``max_sessions`` gets
    OpenEnv's ``CAPACITY_REACHED`` error.

    Args:
        env: A registered text env id (``"textgym/Blackjack-v1"``) or a function returning a
            new text env for each session.
        max_sessions: The most sessions (WebSocket connections) open at once.
        **make_kwargs: Passed to ``gym.make`` with an id.

    Returns:
        The FastAPI app; run it with uvicorn (:func:`serve` does).

    Example:
        >>> from fastapi.testclient import TestClient
        >>> app = create_openenv_app("textgym/Blackjack-v1", max_sessions=2)
        >>> with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ...     ws.send_json({"type": "reset", "data": {"seed": 0}})
        ...     first = ws.receive_json()["data"]
        ...     ws.send_json({"type": "step", "data": {"reply": '{"action": "stick"}'}})
        ...     last = ws.receive_json()["data"]
        >>> first["observation"]["messages"][-1]["content"]
        'Your hand totals 11. The dealer shows a 10.'
        >>> last["reward"], last["done"], last["observation"]["info"]["env_action"]
        (-1.0, True, 0)
    """
    if max_sessions < 1:
        raise ValueError(f"Expected max_sessions >= 1, got {max_sessions}")
    if isinstance(env, str):
        env_id = env
        factory: Callable[[], gym.Env[Any, Any]]
        factory = functools.partial(gym.make, env_id, **make_kwargs)
    elif callable(env) and not isinstance(env, gym.Env):
        if make_kwargs:
            raise TypeError(f"make_kwargs {sorted(make_kwargs)} apply to an env id only")
        env_id, factory = getattr(env, "__name__", "textgym"), env
    else:
        raise TypeError(
            f"Expected an env id or a function returning a new text env, got {env!r} "
            "(a session needs an env of its own: pass lambda: make_my_env())"
        )
    TextGymEnvironment(factory()).close()  # fail now, not at the first session
    return create_fastapi_app(
        functools.partial(_session_env, factory),
        TextAction,
        TextObservation,
        env_name=env_id,
        max_concurrent_envs=max_sessions,
        state_cls=TextState,
    )


def _session_env(factory: Callable[[], gym.Env[Any, Any]]) -> TextGymEnvironment:
    return TextGymEnvironment(factory())


def serve(
    env: str | Callable[[], gym.Env[Any, Any]],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = 4,
    **make_kwargs: Any,
) -> None:
    """Serve a text env over OpenEnv's protocol until interrupted (uvicorn).

    Args:
        env: A registered text env id or a function returning a new text env.
        host: The address to listen on (``0.0.0.0`` for every interface).
        port: The port to listen on.
        max_sessions: The most sessions open at once.
        **make_kwargs: Passed to ``gym.make`` with an id.
    """
    import uvicorn

    app = create_openenv_app(env, max_sessions=max_sessions, **make_kwargs)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@contextlib.contextmanager
def running_server(
    env: str | Callable[[], gym.Env[Any, Any]],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_sessions: int = 4,
    **make_kwargs: Any,
) -> Iterator[str]:
    """Serve a text env from a background thread of this process while the block runs.

    For notebooks, tests and one-process demos; ``textgym serve`` is the standalone server.

    Args:
        env: A registered text env id or a function returning a new text env.
        host: The address to listen on.
        port: The port (0: a free one).
        max_sessions: The most sessions open at once.
        **make_kwargs: Passed to ``gym.make`` with an id.

    Yields:
        The server's base URL, e.g. ``http://127.0.0.1:40123``.

    Example:
        >>> import json, urllib.request
        >>> with running_server("textgym/Blackjack-v1") as url:
        ...     json.load(urllib.request.urlopen(f"{url}/health"))["status"]
        'healthy'
    """
    import uvicorn

    app = create_openenv_app(env, max_sessions=max_sessions, **make_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="openenv-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"The OpenEnv server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
