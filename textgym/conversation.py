"""The one prompt builder: a system message, the last turns kept, the message to answer now.

:class:`~textgym.TextEnvWrapper`, the text opponent of a PettingZoo seat and
``textgym_agents.Agent`` all build their chat prompts with :class:`Conversation`, so a prompt
has the same shape wherever a model reads it.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Conversation", "Messages", "invalid_reply_note"]

#: A chat prompt: ``{"role": ..., "content": ...}`` messages.
Messages = list[dict[str, str]]


class Conversation:
    """One seat's chat prompt: the system message, past turns and the message to answer.

    Args:
        system_prompt: The system message of every prompt.
        history: Past turns (user message + reply) kept in the prompt; None keeps them all.

    Example:
        >>> chat = Conversation("You play.", history=1)
        >>> chat.observe("Turn 1")
        >>> chat.answer("hit")
        >>> chat.observe("Turn 2")
        >>> [m["content"] for m in chat.messages()]
        ['You play.', 'Turn 1', 'hit', 'Turn 2']
        >>> chat.answer("stick"); chat.observe("Turn 3")
        >>> [m["content"] for m in chat.messages()]
        ['You play.', 'Turn 2', 'stick', 'Turn 3']
    """

    def __init__(self, system_prompt: str, history: int | None = 0) -> None:
        self.system_prompt = system_prompt
        self._turns: deque[tuple[str, str]] = deque(maxlen=history)
        self.user_text: str | None = None

    def reset(self) -> None:
        """Forget the turns (a new episode)."""
        self._turns.clear()
        self.user_text = None

    def observe(self, text: str) -> None:
        """Set the user message the next reply answers."""
        self.user_text = text

    def answer(self, reply: str) -> None:
        """Record the reply to the current user message as a past turn."""
        if self.user_text is None:
            raise RuntimeError("answer() needs a user message: call observe() first")
        self._turns.append((self.user_text, reply))
        self.user_text = None

    def messages(self) -> Messages:
        """The chat prompt: system, the kept turns, then the unanswered user message if any."""
        messages = [{"role": "system", "content": self.system_prompt}]
        for user, assistant in self._turns:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        if self.user_text is not None:
            messages.append({"role": "user", "content": self.user_text})
        return messages


def invalid_reply_note(error: str, consequence: str) -> str:
    """The line that tells the model its last reply was invalid, and what happened instead.

    Example:
        >>> invalid_reply_note("not JSON", "Reply again in the required format.")
        'Your last reply was invalid (not JSON). Reply again in the required format.'
    """
    return f"Your last reply was invalid ({error}). {consequence}"
