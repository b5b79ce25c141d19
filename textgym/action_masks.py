"""State-dependent valid replies: an env's ``action_mask`` narrows the replies a text env accepts.

:class:`ActionMasking` reads the mask (``info["action_mask"]``, else ``obs["action_mask"]``, as
Gymnasium and PettingZoo give it) and derives the legal replies, reply schema and errors from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.parsers import ActionParseError, ActionParser

__all__ = ["ActionMasking", "find_action_mask", "masked_schema"]


def find_action_mask(obs: Any, info: Mapping[str, Any]) -> Any:
    """The env's action mask: ``info["action_mask"]``, else ``obs["action_mask"]``, else None.

    Example:
        >>> find_action_mask(3, {"action_mask": [1, 0]})
        [1, 0]
        >>> find_action_mask({"observation": 0, "action_mask": [0, 1]}, {})
        [0, 1]
        >>> find_action_mask(3, {}) is None
        True
    """
    mask = info.get("action_mask") if isinstance(info, Mapping) else None
    if mask is None and isinstance(obs, Mapping):
        mask = obs.get("action_mask")
    return mask


def masked_schema(replies: Sequence[str]) -> dict[str, Any] | None:
    """A JSON schema that allows exactly ``replies`` (JSON texts), or None if one is not JSON.

    Constrained decoding then writes only legal replies.

    Example:
        >>> masked_schema(['{"move": "a1"}', '{"move": "c3"}'])
        {'enum': [{'move': 'a1'}, {'move': 'c3'}]}
        >>> masked_schema(["a1"]) is None
        True
    """
    try:
        return {"enum": [json.loads(reply) for reply in replies]}
    except ValueError:
        return None


class ActionMasking:
    """The legal actions of the current state of a Discrete action space, and what follows.

    The wrapper updates :attr:`mask` on every observation; the parser's choices are matched
    to actions once (by parsing each), so any parser that lists choices works.

    Example:
        >>> from gymnasium.spaces import Discrete
        >>> from textgym.parsers import JSONActionParser
        >>> parser = JSONActionParser.from_space(Discrete(3), action_names=["a", "b", "c"])
        >>> masking = ActionMasking(Discrete(3), parser)
        >>> masking.update(0, {"action_mask": np.array([1, 0, 1], dtype=np.int8)})
        >>> masking.choices()
        ['{"action": "a"}', '{"action": "c"}']
        >>> masking.error(1)
        'the action "b" is not legal now; the legal actions are: a, c'
    """

    def __init__(self, space: gym.Space[Any], parser: ActionParser) -> None:
        """Mask the actions of ``space`` (a Discrete space), whose replies ``parser`` reads."""
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(
                f"action_mask=True needs a Discrete action space, got {type(space).__name__}"
            )
        self.space = space
        self.parser = parser
        self.mask: np.ndarray | None = None  # (n,) bool; None: every action is legal
        self._choice_actions: list[int] | None | bool = False  # looked up when first needed

    def update(self, obs: Any, info: Mapping[str, Any], *, required: bool = False) -> None:
        """Read the mask of a new observation (none found: every action is legal).

        Raises:
            ValueError: If ``required`` and the env gives no mask, or the mask has the wrong
                shape.
        """
        found = find_action_mask(obs, info)
        if found is None:
            if required:
                raise ValueError(
                    "action_mask=True, but the env gave no action mask in info['action_mask'] "
                    "or obs['action_mask'] on reset"
                )
            self.mask = None
            return
        mask = np.asarray(found).astype(bool)
        if mask.shape != (int(self.space.n),):
            raise ValueError(
                f"Expected an action mask of shape ({int(self.space.n)},) for {self.space}, "
                f"got shape {mask.shape}"
            )
        self.mask = mask

    def int8(self) -> np.ndarray:
        """The mask as Gymnasium takes it (``Discrete.sample(mask=...)``): int8, 1 = legal."""
        if self.mask is None:
            return np.ones(int(self.space.n), dtype=np.int8)
        return self.mask.astype(np.int8)

    def legal(self, action: Any) -> bool:
        """Whether an action of the space is legal now."""
        return self.mask is None or bool(self.mask[int(action) - int(self.space.start)])

    def legal_actions(self) -> list[int]:
        """The legal actions, in order."""
        start = int(self.space.start)
        return [start + k for k in range(int(self.space.n)) if self.legal(start + k)]

    def choices(self) -> list[str] | None:
        """The parser's choices of the legal actions (None when the parser lists none)."""
        choices = self.parser.choices()
        actions = self._actions_of(choices)
        if choices is None or actions is None or self.mask is None:
            return choices
        return [c for c, a in zip(choices, actions, strict=True) if self.legal(a)]

    def schema(self) -> dict[str, Any] | None:
        """The parser's reply schema narrowed to the legal choices where it can be."""
        schema = self.parser.reply_schema()
        if schema is None or self.mask is None:
            return schema
        choices = self.choices()
        if not choices:
            return schema
        return masked_schema(choices) or schema

    def error(self, action: Any) -> str | None:
        """The invalid-reply message for an illegal action, or None when it is legal."""
        if self.legal(action):
            return None
        legal = ", ".join(self._name(a) for a in self.legal_actions()) or "none"
        illegal = json.dumps(self._name(action))
        return f"the action {illegal} is not legal now; the legal actions are: {legal}"

    def _name(self, action: int) -> str:
        schema = getattr(self.parser, "schema", None)
        actions, names = getattr(schema, "actions", None), getattr(schema, "names", None)
        if actions is not None and names is not None:
            for a, name in zip(actions, names, strict=True):
                if int(a) == int(action):
                    return name
        return str(int(action))

    def _actions_of(self, choices: list[str] | None) -> list[int] | None:
        """The action of each choice; a choice the parser cannot read back is an error.

        Masking the choices needs their actions: rather than offer every choice (illegal ones
        too) without a word, a parser whose own choices do not parse to actions is refused the
        first time the legal replies are asked for (the first step's reply choices or schema),
        before any reply is played.
        """
        if self._choice_actions is False:
            self._choice_actions = None
            if choices is not None:
                actions = []
                for choice in choices:
                    try:
                        actions.append(int(self.parser.parse(choice)))
                    except (ActionParseError, TypeError, ValueError) as e:
                        raise ValueError(
                            f"action_mask=True needs the parser's choices to parse to actions, "
                            f"but {type(self.parser).__name__} could not read its choice "
                            f"{choice!r} back: {e}"
                        ) from e
                self._choice_actions = actions
        return self._choice_actions  # type: ignore[return-value]
