from __future__ import annotations

import json

import gymnasium as gym
import pytest

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym.env_records import env_record, make_recorded_env, prompt_difference, system_prompt_of
from textgym.envs.calculator import SYSTEM_PROMPT
from textgym.formatters import GenericFormatter


def play(env, replies, seed=3):
    messages, _ = env.reset(seed=seed)
    seen = [messages]
    for reply in replies:
        messages, reward, terminated, truncated, _ = env.step(reply)
        seen.append((messages, reward, terminated, truncated))
        if terminated or truncated:
            messages, _ = env.reset()
            seen.append(messages)
    return seen


@pytest.mark.parametrize("vectorization", ["none", "sync", "async"])
def test_the_record_of_a_custom_prompt_env_rebuilds_it(vectorization):
    kwargs = {"system_prompt": SYSTEM_PROMPT + " Be brief.", "difficulty": "mixed"}
    if vectorization == "none":
        env = gym.make("textgym/Calculator-v0", **kwargs)
    else:
        env = gym.make_vec("textgym/Calculator-v0", 2, vectorization_mode=vectorization, **kwargs)
    record = json.loads(json.dumps(env_record(env)))  # as it is stored
    env.close()
    assert record["id"] == "textgym/Calculator-v0" and "Be brief." in record["system_prompt"]
    rebuilt = make_recorded_env(record)
    original = gym.make("textgym/Calculator-v0", **kwargs)
    replies = ["calculator: 2 + 3", "answer: 5", "nonsense", "answer: 7"]
    assert play(rebuilt, replies) == play(original, replies)
    assert prompt_difference(record, rebuilt) is None


def test_a_wrapper_applied_outside_make_is_rebuilt_with_its_options():
    env = TextEnvWrapper(gym.make("FrozenLake-v1", is_slippery=False), action_names=list("LDRU"))
    record = env_record(env)
    rebuilt = make_recorded_env(record)
    assert system_prompt_of(rebuilt) == system_prompt_of(env)
    assert play(rebuilt, ["R", "R", "D", "x"]) == play(env, ["R", "R", "D", "x"])


def test_a_changed_prompt_or_action_instructions_are_named_with_where_they_differ():
    record = env_record(gym.make("textgym/Blackjack-v1"))
    plain = gym.make("textgym/Blackjack-v1", system_prompt="Play blackjack.")
    assert prompt_difference(record, plain).startswith(
        "its system prompt differs from the one used in training from character 0"
    )
    renamed = gym.make("textgym/Blackjack-v1", action_names=["stay", "draw"])
    difference = prompt_difference(record, renamed)
    assert difference is not None and "stay" in difference  # the action instructions changed


def test_an_env_whose_spec_is_not_json_is_recorded_with_the_reason():
    env = gym.make("textgym/Blackjack-v1", formatter=GenericFormatter(labels=["a", "b", "c"]))
    record = env_record(env)
    assert record["spec"] is None and "not JSON" in record["spec_error"]
    assert record["system_prompt"] == system_prompt_of(env)
    with pytest.raises(ValueError, match="Cannot rebuild the recorded env 'textgym/Blackjack-v1'"):
        make_recorded_env(record)


def test_unknown_prompts_compare_as_no_difference():
    assert prompt_difference({"id": "x"}, gym.make("textgym/Blackjack-v1")) is None
    assert system_prompt_of(gym.make("Blackjack-v1")) is None


class PlainChat(gym.Env):
    """A chat env that is not a TextEnvWrapper (no system_prompt, no reply_choices)."""

    def __init__(self):
        from textgym.spaces import ChatMessages, UnicodeText

        self.observation_space = ChatMessages(2, 100)
        self.action_space = UnicodeText(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}

    def step(self, action):
        return [{"role": "user", "content": "hi"}], 0.0, True, False, {}


def test_probing_an_async_vector_env_of_plain_chat_envs_leaves_its_workers_alive():
    from textgym.episodes import reply_choices

    envs = gym.vector.AsyncVectorEnv([PlainChat, PlainChat])
    try:
        envs.reset(seed=0)
        assert system_prompt_of(envs) is None and env_record(envs)["system_prompt"] is None
        assert reply_choices(envs) is None
        envs.step(["a", "b"])  # a worker that had raised AttributeError would be gone
    finally:
        envs.close()


def test_a_curriculum_is_left_out_of_the_recorded_env_and_named():
    from textgym.curriculum import CurriculumProgress

    envs = gym.make_vec(
        "textgym/FrozenLake-v1",
        num_envs=2,
        is_slippery=False,
        reverse_curriculum=CurriculumProgress(),
    )
    record = env_record(envs)
    assert record["training_only"] == ["reverse_curriculum"]
    rebuilt = make_recorded_env(record)  # the env a policy is scored on: the env's own start
    messages, info = rebuilt.reset(seed=0)
    assert "row 0, column 0" in messages[-1]["content"] and "curriculum_level" not in info
    assert rebuilt.unwrapped.spec.kwargs["is_slippery"] is False


def test_exploring_starts_are_left_out_of_the_recorded_env_and_named():
    envs = gym.make_vec("textgym/FrozenLake-v1", num_envs=2, exploring_starts=True)
    record = env_record(envs)
    assert record["training_only"] == ["exploring_starts"]
    rebuilt = make_recorded_env(record)
    assert all(
        rebuilt.reset(seed=s)[0][-1]["content"].startswith("You are at row 0, column 0")
        for s in range(20)
    )


def test_a_training_move_limit_is_left_out_of_the_recorded_env_and_named():
    envs = gym.make_vec("textgym/CliffWalking-v1", num_envs=2, training_max_steps=3)
    record = env_record(envs)
    assert record["training_only"] == ["training_max_steps"]
    rebuilt = make_recorded_env(record)
    rebuilt.reset(seed=0)
    truncated, moves = False, 0
    while not truncated:  # "up" from the start against the edge: only the env's limit ends it
        moves += 1
        truncated = rebuilt.step('{"action": "up"}')[3]
    assert moves == 100
