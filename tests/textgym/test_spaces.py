import string

import numpy as np
import pytest
from gymnasium.spaces import Dict, Discrete, Text, Tuple
from gymnasium.vector.utils import (
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    iterate,
    read_from_shared_memory,
    write_to_shared_memory,
)

from textgym.spaces import ROLES, ChatMessages, UnicodeText

SAMPLE_CHARS = set(string.ascii_letters + string.digits + string.punctuation + " \n")

# Strings that are easy to get wrong in a byte encoding: multi-byte UTF-8, 4-byte emoji,
# lone surrogates (not valid UTF-8 at all), NUL bytes and the empty string.
TRICKY_STRINGS = ["", "a", "héllo ✓", "日本語", "😀", "\ud800", "\udfff\ud800", "a\x00b", "\x00"]


def conversation(*contents, roles=("system", "user", "assistant")):
    return [{"role": roles[i % len(roles)], "content": c} for i, c in enumerate(contents)]


# --- UnicodeText ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", True),
        ("héllo ✓", True),
        ("😀" * 10, True),
        ("\ud800", True),
        ("x" * 10, True),
        ("x" * 11, False),
        (np.str_("numpy str"), True),
        (b"bytes", False),
        (None, False),
        (5, False),
        (["a"], False),
    ],
)
def test_unicode_text_contains(value, expected):
    assert UnicodeText(10).contains(value) is expected


def test_unicode_text_min_length():
    space = UnicodeText(5, min_length=2)
    assert [space.contains("x" * n) for n in range(7)] == [
        False,
        False,
        True,
        True,
        True,
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_length": 0}, "Expected max_length to be a positive int, got 0"),
        ({"max_length": 2.5}, "Expected max_length to be a positive int, got 2.5"),
        ({"max_length": "3"}, "Expected max_length to be a positive int, got '3'"),
        ({"max_length": 3, "min_length": 4}, "Expected min_length to be an int in [0, 3], got 4"),
        ({"max_length": 3, "min_length": -1}, "Expected min_length to be an int in [0, 3], got -1"),
    ],
)
def test_unicode_text_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as error:
        UnicodeText(**kwargs)
    assert str(error.value) == message


@pytest.mark.parametrize(("max_length", "min_length"), [(1, 0), (1, 1), (10, 3), (5000, 300)])
def test_unicode_text_samples_are_contained_printable_and_seeded(max_length, min_length):
    space = UnicodeText(max_length, min_length=min_length, seed=7)
    samples = [space.sample() for _ in range(100)]
    assert all(space.contains(s) for s in samples)
    assert set("".join(samples)) <= SAMPLE_CHARS
    assert max(len(s) for s in samples) <= max(min_length, 256)  # long spaces stay cheap
    again = UnicodeText(max_length, min_length=min_length, seed=7)
    assert [again.sample() for _ in range(100)] == samples
    space.seed(7)
    assert space.sample() == samples[0]


def test_unicode_text_samples_vary_in_length():
    space = UnicodeText(20, seed=0)
    assert len({len(space.sample()) for _ in range(200)}) > 10


def test_unicode_text_sample_rejects_masks():
    with pytest.raises(NotImplementedError) as error:
        UnicodeText(3).sample(mask=np.ones(3))
    assert str(error.value) == "UnicodeText.sample does not support masks"
    with pytest.raises(NotImplementedError):
        UnicodeText(3).sample(probability=np.ones(3))


def test_unicode_text_eq_repr_and_json():
    space = UnicodeText(10, min_length=2)
    assert space == UnicodeText(10, min_length=2)
    assert space != UnicodeText(10)
    assert space != UnicodeText(11, min_length=2)
    assert space != Text(10, min_length=2)
    assert repr(space) == "UnicodeText(2, 10)"
    assert space.is_np_flattenable is False
    assert space.to_jsonable(("a", "é")) == ["a", "é"]
    assert space.from_jsonable(["a", "é"]) == ["a", "é"]


# --- ChatMessages ---------------------------------------------------------------------------


def test_chat_messages_contains_well_formed_conversations():
    space = ChatMessages(max_messages=3, max_content_length=5)
    assert space.contains([])
    assert space.contains(conversation("Be", "hi", "hello"))
    assert space.contains(tuple(conversation("Be", "hi")))
    assert space.contains([{"role": "tool", "content": "😀😀😀😀😀"}])


@pytest.mark.parametrize(
    "value",
    [
        conversation("a", "b", "c", "d"),  # too many messages
        [{"role": "narrator", "content": "a"}],
        [{"role": "user"}],
        [{"content": "a"}],
        [{"role": "user", "content": "a", "name": "bob"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": "x" * 6}],
        [("user", "a")],
        ["user: a"],
        {"role": "user", "content": "a"},
        "user: a",
        None,
    ],
)
def test_chat_messages_rejects_malformed_conversations(value):
    assert not ChatMessages(max_messages=3, max_content_length=5).contains(value)


def test_chat_messages_custom_roles():
    space = ChatMessages(2, 10, roles=["narrator", "player"])
    assert space.roles == ("narrator", "player")
    assert space.contains([{"role": "player", "content": "go"}])
    assert not space.contains([{"role": "user", "content": "go"}])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 10), {}, "Expected max_messages to be a positive int, got 0"),
        ((1.0, 10), {}, "Expected max_messages to be a positive int, got 1.0"),
        ((2, 0), {}, "Expected max_content_length to be a positive int, got 0"),
        ((2, None), {}, "Expected max_content_length to be a positive int, got None"),
        ((2, 10), {"roles": ()}, "Expected 1 to 255 role names, got ()"),
        ((2, 10), {"roles": ["user", 1]}, "Expected 1 to 255 role names, got ['user', 1]"),
    ],
)
def test_chat_messages_rejects_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError) as error:
        ChatMessages(*args, **kwargs)
    assert str(error.value) == message


def test_chat_messages_allows_at_most_255_roles():
    ChatMessages(1, 1, roles=[f"r{i}" for i in range(255)])
    with pytest.raises(ValueError):
        ChatMessages(1, 1, roles=[f"r{i}" for i in range(256)])


def test_chat_messages_samples_are_contained_and_seeded():
    space = ChatMessages(max_messages=5, max_content_length=100, seed=3)
    samples = [space.sample() for _ in range(50)]
    assert all(space.contains(s) for s in samples)
    for sample in samples:
        roles = [m["role"] for m in sample]
        assert roles == ["system", *(["user", "assistant"] * 3)][: len(roles)]
        assert all(len(m["content"]) <= 64 for m in sample)
    assert {len(s) for s in samples} == {1, 2, 3, 4, 5}
    again = ChatMessages(max_messages=5, max_content_length=100, seed=3)
    assert [again.sample() for _ in range(50)] == samples


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        (("user", "assistant"), ["user", "user", "assistant", "user"]),
        (("narrator",), ["narrator"] * 4),
        (("system", "tool"), ["system", "system", "tool", "system"]),
    ],
)
def test_chat_messages_sample_uses_only_allowed_roles(roles, expected):
    space = ChatMessages(max_messages=4, max_content_length=3, roles=roles, seed=0)
    samples = [space.sample() for _ in range(30)]
    assert all(space.contains(s) for s in samples)
    longest = max(samples, key=len)
    assert [m["role"] for m in longest] == expected


def test_chat_messages_sample_rejects_masks():
    with pytest.raises(NotImplementedError) as error:
        ChatMessages(2, 2).sample(mask=0)
    assert str(error.value) == "ChatMessages.sample does not support masks"


def test_chat_messages_eq_repr_and_json():
    space = ChatMessages(2, 10)
    assert space == ChatMessages(2, 10, roles=ROLES)
    assert space != ChatMessages(3, 10)
    assert space != ChatMessages(2, 11)
    assert space != ChatMessages(2, 10, roles=("user",))
    assert space != UnicodeText(10)
    assert repr(space) == "ChatMessages(max_messages=2, max_content_length=10)"
    assert space.is_np_flattenable is False
    sample = conversation("a", "b")
    as_json = space.to_jsonable([sample])
    assert as_json == [sample]
    as_json[0][0]["content"] = "changed"  # copies, not views of the sample
    assert sample[0]["content"] == "a"
    assert space.from_jsonable([sample]) == [sample]


# --- Batching (SyncVectorEnv) ---------------------------------------------------------------


@pytest.mark.parametrize("space", [UnicodeText(8, seed=0), ChatMessages(3, 8, seed=0)])
def test_batch_space_iterate_and_concatenate(space):
    batched = batch_space(space, 3)
    assert isinstance(batched, Tuple)
    assert list(batched.spaces) == [space] * 3
    batched.seed(1)
    items = batched.sample()
    assert batched.contains(items)
    assert all(space.contains(item) for item in items)
    assert list(iterate(batched, items)) == list(items)
    out = create_empty_array(space, n=3)
    assert concatenate(space, list(items), out) == tuple(items)


def test_batch_space_of_dict_with_text():
    space = Dict({"n": Discrete(3), "text": UnicodeText(4)}, seed=0)
    batched = batch_space(space, 2)
    items = batched.sample()
    assert batched.contains(items)
    unbatched = list(iterate(batched, items))
    assert len(unbatched) == 2 and all(space.contains(item) for item in unbatched)


# --- Shared memory (AsyncVectorEnv) ---------------------------------------------------------


def shared_roundtrip(space, values):
    memory = create_shared_memory(space, n=len(values))
    for index, value in enumerate(values):
        write_to_shared_memory(space, index, value, memory)
    return tuple(read_from_shared_memory(space, memory, n=len(values)))


def test_unicode_text_shared_memory_roundtrip():
    space = UnicodeText(8)
    assert shared_roundtrip(space, TRICKY_STRINGS) == tuple(TRICKY_STRINGS)


@pytest.mark.parametrize("char", ["a", "é", "✓", "😀", "\U0010ffff", "\ud800"])
@pytest.mark.parametrize("max_length", [1, 7, 1000])
def test_unicode_text_shared_memory_fits_longest_widest_strings(char, max_length):
    space = UnicodeText(max_length)
    value = char * max_length
    assert shared_roundtrip(space, [value, value]) == (value, value)


def test_shared_memory_overwrite_with_shorter_value_and_unwritten_slots():
    space = UnicodeText(6)
    memory = create_shared_memory(space, n=3)
    write_to_shared_memory(space, 1, "😀😀😀😀😀😀", memory)
    write_to_shared_memory(space, 1, "ab", memory)
    assert tuple(read_from_shared_memory(space, memory, n=3)) == ("", "ab", "")


def test_shared_memory_rejects_values_outside_the_space():
    space = UnicodeText(4)
    memory = create_shared_memory(space, n=1)
    with pytest.raises(ValueError) as error:
        write_to_shared_memory(space, 0, "x" * 5, memory)
    assert str(error.value) == "Cannot write a value outside UnicodeText(0, 4) to shared memory"
    chat = ChatMessages(1, 4)
    with pytest.raises(ValueError) as error:
        write_to_shared_memory(chat, 0, [{"role": "x", "content": ""}], create_shared_memory(chat))
    assert str(error.value) == (
        "Cannot write a value outside ChatMessages(max_messages=1, max_content_length=4) "
        "to shared memory"
    )


def test_chat_messages_shared_memory_roundtrip():
    space = ChatMessages(max_messages=len(TRICKY_STRINGS), max_content_length=8)
    values = [
        conversation(*TRICKY_STRINGS),
        [],
        conversation("", roles=("tool",)),
        list(reversed(conversation(*TRICKY_STRINGS))),
    ]
    assert shared_roundtrip(space, values) == tuple(values)


def test_chat_messages_shared_memory_fits_worst_case():
    roles = [f"role{i}" for i in range(255)]
    space = ChatMessages(max_messages=4, max_content_length=50, roles=roles)
    worst = [{"role": roles[-1], "content": "😀" * 50} for _ in range(4)]
    surrogates = [{"role": roles[i], "content": "\udc80" * 50} for i in (0, 1, 128, 254)]
    assert shared_roundtrip(space, [worst, surrogates]) == (worst, surrogates)


def test_chat_messages_shared_memory_seeded_samples():
    space = ChatMessages(max_messages=4, max_content_length=70, seed=11)
    values = [space.sample() for _ in range(20)]
    assert shared_roundtrip(space, values) == tuple(values)


def test_shared_memory_inside_composite_spaces():
    space = Tuple((UnicodeText(3), Dict({"chat": ChatMessages(1, 2), "n": Discrete(4)})))
    memory = create_shared_memory(space, n=2)
    values = [("😀é", {"chat": [], "n": 3}), ("", {"chat": conversation("\ud800b"), "n": 0})]
    for index, value in enumerate(values):
        write_to_shared_memory(space, index, value, memory)
    texts, rest = read_from_shared_memory(space, memory, n=2)
    assert tuple(texts) == ("😀é", "")
    assert tuple(rest["chat"]) == ([], conversation("\ud800b"))
    assert rest["n"].tolist() == [3, 0]
