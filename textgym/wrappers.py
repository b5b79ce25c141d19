"""``TextEnvWrapper``: any Gymnasium env becomes a text env (chat messages in, reply text out).

The wrapper owns prompt construction (system prompt with action instructions, a window of
past turns, the new observation) so policies stay stateless: messages in, reply text out.
"""

from __future__ import annotations

import copy
import inspect
import reprlib
from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.core import ActType, ObsType

from textgym.action_masks import ActionMasking
from textgym.conversation import Conversation, Messages, invalid_reply_note
from textgym.formatters import Formatter, as_formatter
from textgym.parsers import ActionParseError, ActionParser, as_parser
from textgym.references import reference_of
from textgym.spaces import ChatMessages, UnicodeText
from textgym.wrapper_options import INVALID_MODES, check_options, json_like, system_prompt_text

__all__ = ["INVALID_MODES", "WRAPPER_OPTIONS", "Messages", "TextEnvWrapper"]

_ERROR_ROOM = 1024  # characters reserved in a user message for the quoted parse error


class TextEnvWrapper(gym.Wrapper[Messages, str, ObsType, ActType], gym.utils.RecordConstructorArgs):
    """Observations become chat messages; the model's reply text is parsed into an action.

    Every ``step`` returns in ``info``: ``reply``, ``invalid``, ``invalid_count`` (this
    episode) and ``consecutive_invalid``; ``parsed_action`` when the reply was valid;
    ``env_action`` (the action the env took) when the env was stepped; ``parse_error`` when
    the reply was invalid. (Absent rather than None, so infos batch in vector envs, where
    ``info["_parse_error"]`` masks the envs that have one.) When an invalid reply leaves the
    env unstepped, the env's keys repeat those of its last observation.

    With ``action_mask=True`` the valid replies depend on the state: the env's
    ``info["action_mask"]`` (or ``obs["action_mask"]``) names the legal actions,
    :meth:`reply_choices` and :meth:`reply_schema` list only those, and a reply naming an
    illegal action is invalid (``info["illegal_action"]`` holds it).

    Example:
        >>> import gymnasium as gym
        >>> env = TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["stick", "hit"])
        >>> messages, info = env.reset(seed=0)
        >>> [m["role"] for m in messages]
        ['system', 'user']
        >>> messages[-1]["content"]
        'Observation: (11, 10, 0)'
        >>> messages, reward, terminated, truncated, info = env.step('{"action": "stick"}')
        >>> info["env_action"], reward, terminated
        (np.int64(0), -1.0, True)
        >>> _ = env.reset(seed=0)
        >>> messages, reward, terminated, truncated, info = env.step("I fold")
        >>> info["parse_error"], reward
        ('no JSON object found in the reply and no action name (stick, hit)', -1.0)
    """

    def __init__(
        self,
        env: gym.Env[ObsType, ActType] | str,
        formatter: Any = None,
        parser: Any = None,
        *,
        system_prompt: str | None = None,
        history: int = 0,
        on_invalid: str = "penalize",
        invalid_penalty: float = 1.0,
        max_invalid: int = 3,
        default_action: Any = None,
        max_reply_chars: int = 4096,
        max_observation_chars: int = 8192,
        action_names: Any = None,
        action_field: str | None = None,
        action_description: str | None = None,
        action_mask: bool = False,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Wrap an env.

        Args:
            env: An env instance or a registered env id (made with ``env_kwargs``).
            formatter: A :class:`~textgym.formatters.Formatter`, a callable
                ``(obs, info) -> str`` or a template string; None renders any space generically.
            parser: An :class:`~textgym.parsers.ActionParser`, a Pydantic model class or a
                callable ``reply -> action``; None generates a Pydantic model from the
                action space.
            system_prompt: Task description; the action instructions are appended to it.
            history: Number of past turns (observation + reply) kept in the prompt.
            on_invalid: What an invalid reply does: ``"penalize"`` (reward
                ``-invalid_penalty``, env not stepped, the observation repeats with the error
                quoted, truncation after ``max_invalid`` consecutive invalid replies),
                ``"default_action"`` (the env steps with ``default_action`` and the reward
                loses ``invalid_penalty``) or ``"raise"`` (:class:`ActionParseError`).
            invalid_penalty: Reward subtracted for an invalid reply (>= 0).
            max_invalid: Consecutive invalid replies that truncate the episode (penalize mode).
            default_action: Action for ``"default_action"`` mode; defaults to the first
                action of a Discrete space.
            max_reply_chars: Longer replies are invalid without being parsed.
            max_observation_chars: Longest formatted observation accepted from the formatter.
            action_names: Names of Discrete actions for the generated schema (a mapping from
                key to names for Dict spaces).
            action_field: JSON field holding the action in the generated schema.
            action_description: Description of the action field shown to the model.
            action_mask: Read the legal actions of each state from the env's
                ``info["action_mask"]`` (else ``obs["action_mask"]``; Discrete action spaces):
                replies naming an illegal action are invalid, and the valid replies listed
                for choice and constrained decoding are the legal ones. The env must give a
                mask on reset; a later observation without one allows every action.
            env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.
        """
        # The spec records JSON where it can (a formatter or parser by its importable name),
        # so `env.spec.to_json()` works; other objects are recorded as they are.
        gym.utils.RecordConstructorArgs.__init__(
            self,
            formatter=reference_of(formatter, Formatter) or formatter,
            parser=reference_of(parser, ActionParser) or parser,
            system_prompt=system_prompt,
            history=history,
            on_invalid=on_invalid,
            invalid_penalty=invalid_penalty,
            max_invalid=max_invalid,
            default_action=json_like(default_action),
            max_reply_chars=max_reply_chars,
            max_observation_chars=max_observation_chars,
            action_names=json_like(action_names),
            action_field=action_field,
            action_description=action_description,
            action_mask=action_mask,
        )
        if isinstance(env, str):
            env = gym.make(env, **dict(env_kwargs or {}))
        elif env_kwargs:
            raise ValueError("env_kwargs only apply when env is an env id, not an env instance")
        if not isinstance(env, gym.Env):
            raise TypeError(f"Expected a gymnasium.Env or an env id, got {type(env).__name__}")
        super().__init__(env)
        check_options(on_invalid, history, invalid_penalty, max_invalid, max_reply_chars)
        if not (isinstance(max_observation_chars, int) and max_observation_chars >= 1):
            raise ValueError(f"Expected max_observation_chars >= 1, got {max_observation_chars!r}")

        schema_options = {
            k: v
            for k, v in {
                "action_names": action_names,
                "field_name": action_field,
                "description": action_description,
            }.items()
            if v is not None
        }
        self.formatter = as_formatter(formatter)
        self.parser = as_parser(parser, env.action_space, **schema_options)
        self.formatter.bind(env)
        self.parser.bind(env)
        if not isinstance(action_mask, bool):
            raise TypeError(f"Expected action_mask to be a bool, got {action_mask!r}")
        self.masking = ActionMasking(env.action_space, self.parser) if action_mask else None

        self.history = history
        self.on_invalid = on_invalid
        self.invalid_penalty = float(invalid_penalty)
        self.max_invalid = max_invalid
        self.max_reply_chars = max_reply_chars
        self.max_observation_chars = max_observation_chars
        self.default_action = self._resolve_default_action(default_action)
        self.system_prompt = system_prompt_text(system_prompt, env, self.parser.instructions())

        content_limit = max(
            len(self.system_prompt), max_observation_chars + _ERROR_ROOM, max_reply_chars
        )
        self.observation_space = ChatMessages(2 + 2 * history, content_limit)
        self.action_space = UnicodeText(max_reply_chars)

        self._chat = Conversation(self.system_prompt, history)
        self._obs_text = ""
        self._invalid_count = 0
        self._consecutive_invalid = 0
        self._env_info: Mapping[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Messages, dict[str, Any]]:
        """Reset the env and return the first prompt."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._chat.reset()
        self._invalid_count = self._consecutive_invalid = 0
        if self.masking is not None:
            self.masking.update(obs, info, required=True)
        self._obs_text = self.format_observation(obs, info)
        self._chat.observe(self._obs_text)
        self._env_info = info
        return self._chat.messages(), self._with_mask(dict(info))

    def step(self, action: str) -> tuple[Messages, SupportsFloat, bool, bool, dict[str, Any]]:
        """Parse the reply, step the env (or handle an invalid reply); return the next prompt."""
        if not isinstance(action, str):
            raise TypeError(f"Expected the reply as str, got {type(action).__name__}")
        env_action, error = self._parse_action(action)
        illegal = None
        if error is None and self.masking is not None:
            error = self.masking.error(env_action)
            if error is not None:
                illegal, env_action = env_action, None
        if error is not None and self.on_invalid == "raise":
            raise ActionParseError(error, action)
        self._chat.answer(action[: self.max_reply_chars])

        if error is None:
            self._consecutive_invalid = 0
            obs, reward, terminated, truncated, info = self.env.step(env_action)
            self._observe_mask(obs, info)
            self._obs_text = self.format_observation(obs, info)
            self._chat.observe(self._obs_text)
            self._env_info = info
            info = dict(info)
            parsed = env_action
        else:
            self._invalid_count += 1
            self._consecutive_invalid += 1
            parsed = None
            if self.on_invalid == "default_action":
                env_action = self.default_action
                if self.masking is not None and not self.masking.legal(env_action):
                    env_action = next(iter(self.masking.legal_actions()), env_action)
                obs, reward, terminated, truncated, info = self.env.step(env_action)
                self._observe_mask(obs, info)
                reward = float(reward) - self.invalid_penalty
                self._obs_text = self.format_observation(obs, info)
                self._env_info = info
                note = invalid_reply_note(error, "The default action was taken.")
                info = dict(info)
            else:
                env_action = None
                reward, terminated = -self.invalid_penalty, False
                truncated = self._consecutive_invalid >= self.max_invalid
                note = invalid_reply_note(error, "Reply again in the required format.")
                # The env did not move: repeat its last info (a copy, as callers keep infos).
                info = copy.deepcopy(dict(self._env_info))
            self._chat.observe(f"{note}\n\n{self._obs_text}")

        # Keys without a value are left out rather than set to None: vector envs batch each
        # key into an array typed by its first value, and None beside a number breaks that.
        info.update(
            reply=action,
            invalid=error is not None,
            invalid_count=self._invalid_count,
            consecutive_invalid=self._consecutive_invalid,
        )
        if parsed is not None:
            info["parsed_action"] = parsed
        if env_action is not None:
            info["env_action"] = env_action
        if error is not None:
            info["parse_error"] = error
        if illegal is not None:
            info["illegal_action"] = illegal
        return self._chat.messages(), reward, terminated, truncated, self._with_mask(info)

    def parse_reply(
        self, reply: str, *, masking: ActionMasking | None = None
    ) -> tuple[Any, str | None]:
        """Return ``(env_action, None)`` for a valid reply, else ``(None, error message)``.

        Never raises for bad reply text: parser failures of any kind become the error message.
        With ``action_mask=True``, an action that is illegal in the current state is an error;
        ``masking`` checks against other legal actions instead (another seat's, for a PettingZoo
        text opponent).
        """
        action, error = self._parse_action(reply)
        masking = self.masking if masking is None else masking
        if error is None and masking is not None:
            error = masking.error(action)
        return (None, error) if error is not None else (action, None)

    def _parse_action(self, reply: str) -> tuple[Any, str | None]:
        if len(reply) > self.max_reply_chars:
            return (
                None,
                f"reply is {len(reply)} characters long, over the limit of {self.max_reply_chars}",
            )
        try:
            action = self.parser.parse(reply)
        except ActionParseError as e:
            return None, str(e)
        except Exception as e:  # a user parser's bug must not end a training run
            return None, f"the parser raised {type(e).__name__}: {str(e)[:300]}"
        if not self.env.action_space.contains(action):
            return (
                None,
                f"the reply maps to {reprlib.repr(action)}, which is not in the action space "
                f"{self.env.action_space}",
            )
        return action, None

    def format_observation(self, obs: Any, info: Mapping[str, Any]) -> str:
        """Render an env observation with the formatter, checking type and length."""
        text = self.formatter(obs, info)
        if not isinstance(text, str):
            raise TypeError(f"The formatter must return str, got {type(text).__name__}")
        if len(text) > self.max_observation_chars:
            raise ValueError(
                f"The formatted observation has {len(text)} characters, over "
                f"max_observation_chars={self.max_observation_chars} for the observation space "
                f"{str(self.env.observation_space)[:200]}; pass a formatter that renders it "
                "shorter (formatter=a Formatter, a function (obs, info) -> str or a template) "
                "or raise the limit"
            )
        return text

    def example_reply(self, action: Any) -> str | None:
        """Return a reply that makes the parser produce ``action`` (None if it cannot say)."""
        return self.parser.example(action)

    def reply_choices(self) -> list[str] | None:
        """Return every valid reply when the action set is finite, else None.

        One reply per action (see :meth:`~textgym.parsers.ActionParser.choices`); a policy
        can score these instead of generating free text, so every reply is valid. Vector
        envs answer with ``envs.call("reply_choices")``. With ``action_mask=True`` the list
        holds the legal actions of the current state only, so ask again every turn.

        Example:
            >>> import gymnasium as gym
            >>> env = TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["stick", "hit"])
            >>> env.reply_choices()
            ['{"action": "stick"}', '{"action": "hit"}']
        """
        if self.masking is not None:
            return self.masking.choices()
        return self.parser.choices()

    def reply_schema(self) -> dict[str, Any] | None:
        """Return the JSON schema of valid replies, or None when the parser has none.

        A reply that satisfies it parses (see
        :meth:`~textgym.parsers.ActionParser.reply_schema`), so a policy can restrict its
        generation to it (constrained decoding). Vector envs answer with
        ``envs.call("reply_schema")``. With ``action_mask=True`` and a finite set of JSON
        replies, the schema allows the legal replies of the current state only.

        Example:
            >>> import gymnasium as gym
            >>> env = TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["stick", "hit"])
            >>> env.reply_schema()["properties"]["action"]["enum"]
            ['stick', 'hit']
        """
        if self.masking is not None:
            return self.masking.schema()
        return self.parser.reply_schema()

    def action_masks(self) -> np.ndarray | None:
        """The legal env actions of the current state (int8, 1 = legal), or None if unmasked.

        Named as sb3-contrib's ``MaskablePPO`` asks for it; ``Discrete.sample(mask=...)``
        takes it as it is.

        Example:
            >>> import gymnasium as gym
            >>> env = TextEnvWrapper(gym.make("Taxi-v4"), action_mask=True)
            >>> _ = env.reset(seed=0)
            >>> env.action_masks()
            array([1, 1, 0, 0, 0, 0], dtype=int8)
            >>> len(env.reply_choices())
            2
        """
        return None if self.masking is None else self.masking.int8()

    def _observe_mask(self, obs: Any, info: Mapping[str, Any]) -> None:
        if self.masking is not None:
            self.masking.update(obs, info)

    def _with_mask(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.masking is not None:
            info["action_mask"] = self.masking.int8()
        return info

    def _resolve_default_action(self, default_action: Any) -> Any:
        if default_action is None:
            if self.on_invalid != "default_action":
                return None
            if not isinstance(self.env.action_space, gym.spaces.Discrete):
                raise ValueError(
                    "on_invalid='default_action' needs default_action for a "
                    f"{type(self.env.action_space).__name__} action space"
                )
            default_action = self.env.action_space.start
        if not self.env.action_space.contains(default_action):
            raise ValueError(
                f"default_action {default_action!r} is not in the action space "
                f"{self.env.action_space}"
            )
        return default_action


#: The keyword arguments of :class:`TextEnvWrapper` (what ``gym.make`` of a text env passes to
#: the wrapper rather than to the base env).
WRAPPER_OPTIONS = frozenset(inspect.signature(TextEnvWrapper.__init__).parameters) - {
    "self",
    "env",
    "env_kwargs",
}
