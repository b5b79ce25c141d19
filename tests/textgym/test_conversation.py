import pytest

from textgym.conversation import Conversation


def test_no_history_keeps_only_the_message_to_answer():
    chat = Conversation("system", history=0)
    chat.observe("one")
    chat.answer("a")
    chat.observe("two")
    assert chat.messages() == [
        {"role": "system", "content": "system"},
        {"role": "user", "content": "two"},
    ]


def test_history_none_keeps_every_turn_and_ends_on_the_last_reply():
    chat = Conversation("system", history=None)
    for i in range(50):
        chat.observe(f"obs {i}")
        chat.answer(f"reply {i}")
    messages = chat.messages()
    assert len(messages) == 101 and messages[-1] == {"role": "assistant", "content": "reply 49"}


def test_reset_forgets_the_turns():
    chat = Conversation("system", history=3)
    chat.observe("one")
    chat.answer("a")
    chat.reset()
    assert chat.messages() == [{"role": "system", "content": "system"}]


def test_a_reply_needs_a_message_to_answer():
    chat = Conversation("system")
    with pytest.raises(RuntimeError, match="call observe"):
        chat.answer("a")
