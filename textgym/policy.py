"""The ``Policy`` protocol: the one typed seam between text envs and whatever writes the replies.

A policy maps chat messages to reply text for a batch of conversations, optionally given each
env's valid replies (``choices``) or reply JSON schema (``schemas``); plain callables adapt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from textgym.wrappers import Messages

__all__ = ["CallablePolicy", "JSONSchema", "Policy", "PolicyBase", "as_policy"]

JSONSchema = dict[str, Any]
"""A reply JSON schema, as ``TextEnvWrapper.reply_schema()`` returns it."""


@runtime_checkable
class Policy(Protocol):
    """Anything that replies to a batch of conversations: the seam between the two packages.

    The episode runner (:func:`textgym.episodes.run_episodes`) calls :meth:`act_batch` once
    per step with the prompts of every env that waits for a reply. A policy that can use the
    env's valid replies (choice decoding) or its reply schema (constrained decoding) says so
    with :attr:`wants_choices` / :attr:`wants_schemas`; the runner then passes them, one entry
    per conversation (None for an env that has none). ``textgym_agents.PPOPolicy`` and
    ``textgym_agents.Agent`` satisfy it; wrap a plain ``messages -> reply`` function with
    :func:`as_policy`, or subclass :class:`PolicyBase`.

    Example:
        >>> class Stick(PolicyBase):
        ...     def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        ...         return ['{"action": "stick"}' for _ in batch]
        >>> isinstance(Stick(), Policy), isinstance(lambda messages: "hi", Policy)
        (True, False)
        >>> Stick()([{"role": "user", "content": "Hit or stick?"}])
        '{"action": "stick"}'
    """

    @property
    def wants_choices(self) -> bool:
        """Whether :meth:`act_batch` uses ``choices`` (the runner looks them up only then)."""
        ...

    @property
    def wants_schemas(self) -> bool:
        """Whether :meth:`act_batch` uses ``schemas`` (the runner looks them up only then)."""
        ...

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[JSONSchema | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """Reply to every conversation of ``batch``: one reply text each, in order.

        Args:
            batch: Conversations (lists of ``{"role", "content"}`` messages), one per env.
            choices: Each conversation's valid replies (``env.reply_choices()``), or None.
            schemas: Each conversation's reply JSON schema (``env.reply_schema()``), or None.
            greedy: Reply with the most likely text rather than a sample (a deterministic
                policy ignores it).
        """
        ...


class PolicyBase:
    """Defaults for a :class:`Policy`: wants neither choices nor schemas; one reply via ``()``.

    Subclasses write :meth:`act_batch`; ``policy(messages)`` replies to one conversation, so a
    ``PolicyBase`` is also a plain ``messages -> reply`` callable.

    Example:
        >>> class Echo(PolicyBase):
        ...     def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        ...         return [messages[-1]["content"] for messages in batch]
        >>> Echo().act_batch([[{"role": "user", "content": c}] for c in "ab"])
        ['a', 'b']
    """

    wants_choices = False
    wants_schemas = False

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[JSONSchema | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """Reply to every conversation of ``batch`` (see :meth:`Policy.act_batch`)."""
        raise NotImplementedError

    def __call__(
        self,
        messages: Messages,
        *,
        choices: Sequence[str] | None = None,
        schema: JSONSchema | None = None,
        greedy: bool = False,
    ) -> str:
        """Reply to one conversation, given its valid replies or reply schema if any."""
        replies = self.act_batch(
            [messages],
            choices=None if choices is None else [choices],
            schemas=None if schema is None else [schema],
            greedy=greedy,
        )
        return replies[0]


class CallablePolicy(PolicyBase):
    """A plain ``messages -> reply`` callable (a function, a scripted bot, an API client).

    Replies one conversation at a time; wants neither choices nor schemas.

    Example:
        >>> policy = CallablePolicy(lambda messages: "hit")
        >>> policy.act_batch([[{"role": "user", "content": "?"}]] * 2)
        ['hit', 'hit']
    """

    def __init__(self, function: Callable[[Messages], str]) -> None:
        """Wrap ``function``."""
        if not callable(function):
            raise TypeError(
                f"Expected policy to be a callable messages -> reply, got {function!r:.200}"
            )
        self.function = function

    def __repr__(self) -> str:
        return f"CallablePolicy({self.function!r})"

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[JSONSchema | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """Call the function on each conversation."""
        return [self.function(messages) for messages in batch]


def as_policy(policy: Policy | Callable[[Messages], str]) -> Policy:
    """Return ``policy`` if it is a :class:`Policy`, else wrap a callable as one.

    Example:
        >>> policy = as_policy(lambda messages: "hit")
        >>> isinstance(policy, Policy), as_policy(policy) is policy
        (True, True)
        >>> as_policy("hit")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Expected policy to be a callable messages -> reply or a textgym Policy ...
    """
    if isinstance(policy, Policy):
        return policy
    if not callable(policy):
        raise TypeError(
            "Expected policy to be a callable messages -> reply or a textgym Policy "
            f"(act_batch, wants_choices, wants_schemas), got {policy!r:.200}"
        )
    return CallablePolicy(policy)
