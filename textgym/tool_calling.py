"""A text env seen as one tool: the agent acts by calling ``step`` with the action's fields.

``tool_env(...)`` builds the class that ``trl.GRPOTrainer(environment_factory=...)`` expects:
``reset()`` returns the task and first observation, ``get_reward()`` the episode's return.
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from pydantic import BaseModel

from textgym.checker import prompt_parts
from textgym.instructions import _resolve, _type_text
from textgym.parsers import JSONActionParser

__all__ = ["ToolEnv", "tool_env"]

_SCALARS = (int, float, str, bool, type(None))
_REPLY_DOC = "Your reply, written in the format the task describes."
_EACH_CALL = "each call returns the next observation, until the episode ends."
# Names a tool method would clash with: ToolEnv's methods and attributes.
_RESERVED = frozenset(
    {"reset", "get_reward", "done", "task", "tool_name", "action_fields", "unfinished_penalty"}
    | {"env", "seed", "replies", "rewards", "terminated", "truncated"}
)


class ToolEnv:
    """Base of the classes :func:`tool_env` builds; one instance plays one episode at a time.

    TRL turns every public method of an environment class into a tool, so the only public
    methods are ``reset``, ``get_reward`` and the generated tool (``step`` by default).

    Attributes:
        task: The text env's system prompt, told to act through the tool.
        tool_name: Name of the generated tool method.
        action_fields: The tool's arguments (the action schema's JSON fields), or None when the
            tool takes the whole reply as ``reply`` (parsers without a Pydantic schema).
        unfinished_penalty: Subtracted from the return when a rollout ends mid-episode.
        env: The text env (a Gymnasium env stack holding a ``TextEnvWrapper``).
        seed: The seed of the current episode (None when reset without one).
        replies: The reply text each tool call sent to ``env.step``, this episode.
        rewards: The text env's reward for each of those calls.
        terminated: Whether the episode has terminated.
        truncated: Whether the episode was truncated (time limit or invalid replies).

    Example:
        >>> import textgym
        >>> FrozenLake = textgym.tool_env("textgym/FrozenLake-v1", is_slippery=False)
        >>> lake = FrozenLake()
        >>> _ = lake.reset(seed=0)
        >>> "Input should be 'left', 'down', 'right' or 'up'" in lake.step(action="jump")
        True
        >>> lake.replies, lake.rewards, lake.done
        (['{"action": "jump"}'], [-1.0], False)
    """

    task: ClassVar[str]
    tool_name: ClassVar[str]
    action_fields: ClassVar[tuple[str, ...] | None]
    unfinished_penalty: ClassVar[float]
    _make_env: ClassVar[Callable[[], gym.Env[Any, Any]]]

    def __init__(self) -> None:
        if type(self) is ToolEnv:
            raise TypeError("ToolEnv is a base class; build one with textgym.tool_env(...)")
        self.env = type(self)._make_env()
        self.seed: int | None = None
        self.replies: list[str] = []
        self.rewards: list[float] = []
        self.terminated = self.truncated = False
        self._started = False

    @property
    def done(self) -> bool:
        """Whether the episode has ended (terminated or truncated)."""
        return self.terminated or self.truncated

    def reset(self, **kwargs: Any) -> str:
        """Start an episode; return the task followed by the first observation.

        Args:
            **kwargs: A dataset row (TRL passes the whole row). ``seed`` and ``options`` go to
                ``env.reset``; when ``prompt`` already holds a system message (see
                ``textgym_agents.trl_grpo.grpo_dataset``), only the observation is returned.
        """
        seed = kwargs.get("seed")
        self.seed = None if seed is None else int(seed)
        messages, _ = self.env.reset(seed=self.seed, options=kwargs.get("options"))
        self.replies, self.rewards = [], []
        self.terminated = self.truncated = False
        self._started = True
        observation = messages[-1]["content"]
        if _has_system_message(kwargs.get("prompt")):
            return observation
        return f"{self.task}\n\n{observation}"

    def get_reward(self) -> float:
        """Return the episode's return: the text env's rewards summed over the tool calls.

        Invalid calls count with the text env's penalty; a rollout that stops before the
        episode ends loses ``unfinished_penalty`` as well.
        """
        if not self._started:
            raise RuntimeError("get_reward() was called before reset()")
        penalty = 0.0 if self.done else self.unfinished_penalty
        return float(sum(self.rewards)) - penalty

    def _act(self, arguments: dict[str, Any]) -> str:
        """Send the tool call's arguments to the text env as reply text; return what it says."""
        if not self._started:
            raise RuntimeError(f"{self.tool_name}() was called before reset()")
        if self.done:
            return f"Error: the episode has ended; do not call {self.tool_name} again."
        reply = arguments.get("reply")
        if self.action_fields is not None or set(arguments) != {"reply"} or type(reply) is not str:
            # The text env's parser judges the call (real Pydantic validation, with its
            # penalty), exactly as it would judge the same JSON written as a plain reply.
            reply = json.dumps(arguments, ensure_ascii=False, default=str)
        messages, reward, terminated, truncated, info = self.env.step(reply)
        self.replies.append(reply)
        self.rewards.append(float(reward))
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        text = messages[-1]["content"]
        if self.done:
            text += f"\n\nThe episode has ended; your return is {sum(self.rewards):g}."
        return text


def tool_env(
    env: str | EnvSpec | Callable[[], gym.Env[Any, Any]],
    *,
    tool_name: str = "step",
    tool_description: str | None = None,
    unfinished_penalty: float | None = None,
    **make_kwargs: Any,
) -> type[ToolEnv]:
    """Build a :class:`ToolEnv` class for a text env; each instance makes its own env.

    The tool's arguments are the fields of the env's Pydantic action schema, with type hints
    and a Google-style docstring (what ``transformers.utils.get_json_schema`` reads). Envs
    whose parser has no schema get a single ``reply: str`` argument. Every call goes through
    ``env.step`` as JSON text, so invalid calls are judged, penalised and explained exactly as
    invalid replies are.

    Args:
        env: A registered text env id, an ``EnvSpec`` (``env.spec`` re-creates an env), or a
            zero-argument callable returning a text env.
        tool_name: Name of the tool method.
        tool_description: First line of the tool's docstring (the description the model sees).
        unfinished_penalty: Subtracted from ``get_reward()`` when the rollout ends before the
            episode; defaults to the text env's ``invalid_penalty`` (stopping counts like an
            invalid reply, so never acting is never the safest policy).
        **make_kwargs: Passed to ``gym.make`` with an id or spec.

    Returns:
        A class whose zero-argument constructor is the ``environment_factory`` TRL expects.

    Example:
        >>> import textgym
        >>> Blackjack = tool_env("textgym/Blackjack-v1")
        >>> game = Blackjack()
        >>> print(game.reset(seed=0).splitlines()[-1])
        Your hand totals 11. The dealer shows a 10.
        >>> print(game.step(action="stick").splitlines()[-1])
        The episode has ended; your return is -1.
        >>> game.get_reward(), game.step(action="hit")
        (-1.0, 'Error: the episode has ended; do not call step again.')
    """
    make = _env_maker(env, make_kwargs)
    if not (isinstance(tool_name, str) and tool_name.isidentifier()) or tool_name.startswith("_"):
        raise ValueError(f"Expected tool_name to be a public identifier, got {tool_name!r}")
    if tool_name in _RESERVED or keyword.iskeyword(tool_name):
        raise ValueError(f"tool_name {tool_name!r} is taken; choose another name")
    probe = make()
    try:
        system_prompt, instructions, parser, invalid_penalty = prompt_parts(probe)
        parameters = _tool_parameters(parser)
        task = _task(system_prompt, instructions, tool_name, parameters)
        penalty = invalid_penalty if unfinished_penalty is None else unfinished_penalty
        env_name = probe.spec.id if probe.spec is not None else type(probe.unwrapped).__name__
    finally:
        probe.close()
    if not penalty >= 0:
        raise ValueError(f"Expected unfinished_penalty >= 0, got {unfinished_penalty!r}")

    description = tool_description or "Take your next action; returns what happens next."
    attributes = {
        "__doc__": f"{env_name} as a tool-calling environment (built by textgym.tool_env).",
        "__module__": __name__,
        "task": task,
        "tool_name": tool_name,
        "action_fields": None if parameters is None else tuple(p[0] for p in parameters),
        "unfinished_penalty": float(penalty),
        "_make_env": staticmethod(make),
        tool_name: _tool_method(tool_name, description, parameters),
    }
    # One class per call: TRL matches environments to their reward column by exact type.
    class_name = re.sub(r"\W", "_", env_name.split("/")[-1]) + "_ToolEnv"
    return type(class_name, (ToolEnv,), attributes)


def _env_maker(
    env: str | EnvSpec | Callable[[], gym.Env[Any, Any]], make_kwargs: Mapping[str, Any]
) -> Callable[[], gym.Env[Any, Any]]:
    if isinstance(env, str | EnvSpec):
        return lambda: gym.make(env, **make_kwargs)
    if isinstance(env, gym.Env):
        raise TypeError(
            "Expected an env id, an EnvSpec or a callable making a new env, got an env "
            "instance; pass env.spec to make more like it"
        )
    if not callable(env):
        raise TypeError(f"Expected an env id, an EnvSpec or a callable, got {type(env).__name__}")
    if make_kwargs:
        raise ValueError(f"{sorted(make_kwargs)} only apply with an env id or spec")
    return env


def _tool_parameters(parser: Any) -> list[tuple[str, Any, str, Any]] | None:
    """``(name, type hint, description, default)`` per schema field, or None for reply mode."""
    if not isinstance(parser, JSONActionParser):
        return None
    model = parser.model
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    parameters = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if not key.isidentifier() or keyword.iskeyword(key) or key == "self":
            return None  # JSON keys that cannot be Python parameters: take the reply instead
        prop = _resolve(schema["properties"][key], defs)
        text = _type_text(prop, defs)
        if prop.get("description"):
            text += f". {prop['description']}"
        default = inspect.Parameter.empty if field.is_required() else field.get_default()
        parameters.append((key, _plain_hint(field.annotation), " ".join(text.split()), default))
    return parameters


def _plain_hint(hint: Any) -> Any:
    """Reduce a Pydantic annotation to the types ``get_json_schema`` understands."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _plain_hint(args[0])
    if origin is Literal or hint in _SCALARS:
        return hint
    if origin is list:
        return list[_plain_hint(args[0])] if args else list
    if origin is tuple:
        if len(args) > 1 and ... not in args:
            return tuple[tuple(_plain_hint(a) for a in args)]  # type: ignore[misc]
        return list[_plain_hint(args[0])] if args else list
    if origin is Union or origin is types.UnionType:
        return Union[tuple(_plain_hint(a) for a in args)]  # noqa: UP007
    if isinstance(hint, type) and issubclass(hint, BaseModel | Mapping):
        return dict
    return Any


def _task(
    system_prompt: str, instructions: str, tool_name: str, parameters: list[Any] | None
) -> str:
    if parameters is None:
        how = "with your reply as its `reply` argument"
        return f"{system_prompt}\n\nAct by calling the `{tool_name}` tool {how}; {_EACH_CALL}"
    # The JSON reply instructions would contradict the tool's schema, so they are dropped.
    if instructions and system_prompt.endswith(f"\n\n{instructions}"):
        system_prompt = system_prompt[: -len(instructions) - 2]
    return f"{system_prompt}\n\nAct by calling the `{tool_name}` tool; {_EACH_CALL}"


def _tool_method(
    name: str, description: str, parameters: list[tuple[str, Any, str, Any]] | None
) -> Callable[..., str]:
    params = (
        [("reply", str, _REPLY_DOC, inspect.Parameter.empty)] if parameters is None else parameters
    )

    def tool(self: ToolEnv, **arguments: Any) -> str:
        return self._act(arguments)

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    signature += [
        inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        for key, hint, _, default in params
    ]
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {key: hint for key, hint, _, _ in params} | {"return": str}
    args = "\n".join(f"    {key}: {text}" for key, _, text, _ in params)
    tool.__doc__ = (
        f"{description}\n\nArgs:\n{args}\n\nReturns:\n    The next observation, or an error "
        "message when the call is invalid."
    )
    return tool


def _has_system_message(prompt: Any) -> bool:
    return isinstance(prompt, list) and any(
        isinstance(m, Mapping) and m.get("role") == "system" for m in prompt
    )
