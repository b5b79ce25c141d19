"""Gymnasium spaces for text environments: free unicode text and chat conversations.

Both spaces batch in ``SyncVectorEnv`` and, through the shared-memory handlers registered
here, in ``AsyncVectorEnv`` with its default ``shared_memory=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

__all__ = ["ROLES", "ChatMessages", "UnicodeText"]

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
_SAMPLE_CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"
_LEN = np.dtype("<u4")  # little-endian length prefix in shared memory


class UnicodeText(Space[str]):
    """Any Python string of bounded length, unicode included.

    Gymnasium's ``Text`` space only contains strings over a fixed character set, which
    cannot describe what a language model writes. This space contains every ``str`` whose
    length lies in ``[min_length, max_length]``.

    Example:
        >>> space = UnicodeText(max_length=10)
        >>> space.contains("héllo ✓")
        True
        >>> space.contains("x" * 11)
        False
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        """Create the space.

        Args:
            max_length: Largest number of characters a member may have.
            min_length: Smallest number of characters a member may have.
            seed: Seed for :meth:`sample`.
        """
        if not (isinstance(max_length, int) and max_length >= 1):
            raise ValueError(f"Expected max_length to be a positive int, got {max_length!r}")
        if not (isinstance(min_length, int) and 0 <= min_length <= max_length):
            raise ValueError(
                f"Expected min_length to be an int in [0, {max_length}], got {min_length!r}"
            )
        self.max_length = max_length
        self.min_length = min_length
        super().__init__(dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Return a random printable ASCII string (lengths capped at 256 to stay cheap)."""
        if mask is not None or probability is not None:
            raise NotImplementedError("UnicodeText.sample does not support masks")
        high = min(self.max_length, max(self.min_length, 256))
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(list(_SAMPLE_CHARS), size=length)
        return "".join(chars.tolist())

    def contains(self, x: Any) -> bool:
        """Return True if ``x`` is a ``str`` of allowed length."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        """Text has no fixed-size numeric form."""
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.min_length == self.min_length
            and other.max_length == self.max_length
        )

    def to_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        """Strings are already JSON values."""
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        """Strings are already JSON values."""
        return list(sample_n)


class ChatMessages(Space[list[dict[str, str]]]):
    """A chat conversation: a list of ``{"role": ..., "content": ...}`` messages.

    This is the observation space of a text environment: the complete prompt for the next
    model turn, ready for ``tokenizer.apply_chat_template`` or an OpenAI-style client.

    Example:
        >>> space = ChatMessages(max_messages=2, max_content_length=100)
        >>> space.contains([{"role": "system", "content": "Be brief."},
        ...                 {"role": "user", "content": "Hit or stick?"}])
        True
        >>> space.contains([{"role": "narrator", "content": "?"}])
        False
    """

    def __init__(
        self,
        max_messages: int,
        max_content_length: int,
        *,
        roles: Sequence[str] = ROLES,
        seed: Any = None,
    ) -> None:
        """Create the space.

        Args:
            max_messages: Largest number of messages in a conversation.
            max_content_length: Largest number of characters in one message's content.
            roles: The allowed values of ``role``.
            seed: Seed for :meth:`sample`.
        """
        if not (isinstance(max_messages, int) and max_messages >= 1):
            raise ValueError(f"Expected max_messages to be a positive int, got {max_messages!r}")
        if not (isinstance(max_content_length, int) and max_content_length >= 1):
            raise ValueError(
                f"Expected max_content_length to be a positive int, got {max_content_length!r}"
            )
        if not roles or len(roles) > 255 or not all(isinstance(r, str) for r in roles):
            raise ValueError(f"Expected 1 to 255 role names, got {roles!r}")
        self.max_messages = max_messages
        self.max_content_length = max_content_length
        self.roles = tuple(roles)
        super().__init__(dtype=object, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        """Return a random conversation (system message, then alternating user/assistant)."""
        if mask is not None or probability is not None:
            raise NotImplementedError("ChatMessages.sample does not support masks")
        n = int(self.np_random.integers(1, self.max_messages + 1))
        # Passing the generator as the seed shares it, so one seed fixes the whole sample.
        text = UnicodeText(min(self.max_content_length, 64), seed=self.np_random)
        order = [r for r in ("user", "assistant") if r in self.roles] or list(self.roles)
        roles = ["system" if "system" in self.roles else order[0]]
        roles += [order[i % len(order)] for i in range(n - 1)]
        return [{"role": role, "content": text.sample()} for role in roles]

    def contains(self, x: Any) -> bool:
        """Return True if ``x`` is a list (or tuple) of well-formed messages."""
        if not isinstance(x, (list, tuple)) or len(x) > self.max_messages:
            return False
        return all(
            isinstance(m, dict)
            and m.keys() == {"role", "content"}
            and m["role"] in self.roles
            and isinstance(m["content"], str)
            and len(m["content"]) <= self.max_content_length
            for m in x
        )

    @property
    def is_np_flattenable(self) -> bool:
        """Conversations have no fixed-size numeric form."""
        return False

    def __repr__(self) -> str:
        return (
            f"ChatMessages(max_messages={self.max_messages}, "
            f"max_content_length={self.max_content_length})"
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChatMessages)
            and other.max_messages == self.max_messages
            and other.max_content_length == self.max_content_length
            and other.roles == self.roles
        )

    def to_jsonable(self, sample_n: Sequence[list[dict[str, str]]]) -> list[list[dict[str, str]]]:
        """Conversations are already JSON values."""
        return [[dict(m) for m in sample] for sample in sample_n]

    def from_jsonable(self, sample_n: list[list[dict[str, str]]]) -> list[list[dict[str, str]]]:
        """Conversations are already JSON values."""
        return [[dict(m) for m in sample] for sample in sample_n]


# --- AsyncVectorEnv shared memory -------------------------------------------------------
# Each sub-environment owns a fixed block of bytes: UTF-8 ("surrogatepass", so any Python
# str round-trips) with little-endian uint32 length prefixes. Block sizes follow from the
# space bounds (4 bytes per character at most), so every member of the space fits.


def _block_size(space: UnicodeText | ChatMessages) -> int:
    if isinstance(space, UnicodeText):
        return 4 + 4 * space.max_length
    return 4 + space.max_messages * (1 + 4 + 4 * space.max_content_length)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _pack(space: UnicodeText | ChatMessages, value: Any) -> bytes:
    if not space.contains(value):
        raise ValueError(f"Cannot write a value outside {space!r} to shared memory")
    if isinstance(space, UnicodeText):
        data = _encode(value)
        return len(data).to_bytes(4, "little") + data
    parts = [len(value).to_bytes(4, "little")]
    for message in value:
        data = _encode(message["content"])
        role = bytes([space.roles.index(message["role"])])
        parts += [role, len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def _unpack(space: UnicodeText | ChatMessages, block: np.ndarray) -> Any:
    raw = block.tobytes()

    def length_at(pos: int) -> int:
        return int(np.frombuffer(raw, _LEN, count=1, offset=pos)[0])

    if isinstance(space, UnicodeText):
        return raw[4 : 4 + length_at(0)].decode("utf-8", "surrogatepass")
    messages, pos = [], 4
    for _ in range(length_at(0)):
        role, size = space.roles[raw[pos]], length_at(pos + 1)
        content = raw[pos + 5 : pos + 5 + size].decode("utf-8", "surrogatepass")
        messages.append({"role": role, "content": content})
        pos += 5 + size
    return messages


@create_shared_memory.register(UnicodeText)
@create_shared_memory.register(ChatMessages)
def _create_text_shared_memory(
    space: UnicodeText | ChatMessages, n: int = 1, ctx: ModuleType = mp
) -> Any:
    return ctx.Array("B", n * _block_size(space))


def _blocks(space: UnicodeText | ChatMessages, shared_memory: Any) -> np.ndarray:
    buffer = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
    return buffer.reshape(-1, _block_size(space))


@read_from_shared_memory.register(UnicodeText)
@read_from_shared_memory.register(ChatMessages)
def _read_text_from_shared_memory(
    space: UnicodeText | ChatMessages, shared_memory: Any, n: int = 1
) -> SharedTextView:
    return SharedTextView(space, shared_memory, n)


class SharedTextView(Sequence[Any]):
    """A live view of the observations in shared memory, decoded when read.

    ``AsyncVectorEnv`` calls ``read_from_shared_memory`` once and expects a view that sees
    every later write (numpy arrays do). Decoded strings would go stale, so this decodes on
    access; ``copy.deepcopy`` (what ``AsyncVectorEnv`` returns by default) gives a plain tuple.
    """

    def __init__(self, space: UnicodeText | ChatMessages, shared_memory: Any, n: int) -> None:
        self._space, self._memory, self._n = space, shared_memory, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._n)))
        if not -self._n <= index < self._n:
            raise IndexError(f"index {index} out of range for {self._n} environments")
        return _unpack(self._space, _blocks(self._space, self._memory)[index % self._n])

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[Any, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SharedTextView({tuple(self)!r})"


@write_to_shared_memory.register(UnicodeText)
@write_to_shared_memory.register(ChatMessages)
def _write_text_to_shared_memory(
    space: UnicodeText | ChatMessages, index: int, value: Any, shared_memory: Any
) -> None:
    data = np.frombuffer(_pack(space, value), dtype=np.uint8)
    _blocks(space, shared_memory)[index, : data.size] = data
