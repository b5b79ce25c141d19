import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pydantic import BaseModel, ConfigDict

from textgym import (
    ActionParseError,
    ChatMessages,
    Formatter,
    FunctionParser,
    TextEnvWrapper,
    UnicodeText,
    check_text_env,
)


def blackjack(**kwargs):
    return TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["stick", "hit"], **kwargs)


def test_messages_are_system_then_user():
    env = blackjack()
    messages, info = env.reset(seed=0)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert 'one of "stick", "hit"' in messages[0]["content"]
    assert messages[1]["content"] == "Observation: (11, 10, 0)"
    assert env.observation_space.contains(messages)
    assert isinstance(env.observation_space, ChatMessages)
    assert isinstance(env.action_space, UnicodeText)


def test_valid_reply_steps_env_and_records_info():
    env = blackjack()
    env.reset(seed=1)
    messages, reward, terminated, truncated, info = env.step('```json\n{"action": "stick"}\n```')
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["parsed_action"] == 0 and info["env_action"] == 0
    assert "parse_error" not in info and info["invalid"] is False
    assert info["invalid_count"] == 0 and info["consecutive_invalid"] == 0
    assert info["reply"] == '```json\n{"action": "stick"}\n```'


def test_same_seed_same_episode_as_raw_env():
    raw = gym.make("Blackjack-v1")
    env = blackjack()
    raw_obs, _ = raw.reset(seed=3)
    env.reset(seed=3)
    raw_obs, raw_reward, *_ = raw.step(1)
    messages, reward, *_ = env.step("hit")
    assert reward == raw_reward
    assert messages[-1]["content"] == f"Observation: {tuple(int(v) for v in raw_obs)}"


def test_penalize_repeats_observation_with_error_and_truncates():
    env = blackjack(max_invalid=2, invalid_penalty=0.5)
    first, _ = env.reset(seed=0)
    messages, reward, terminated, truncated, info = env.step("no idea")
    assert reward == -0.5 and not terminated and not truncated
    assert "env_action" not in info and "parsed_action" not in info and info["invalid"] is True
    assert info["parse_error"] == (
        "no JSON object found in the reply and no action name (stick, hit)"
    )
    assert messages[-1]["content"] == (
        "Your last reply was invalid (no JSON object found in the reply and no action name "
        "(stick, hit)). Reply again in the required format.\n\n" + first[-1]["content"]
    )
    _, reward, terminated, truncated, info = env.step('{"action": "fold"}')
    assert truncated and not terminated
    assert info["consecutive_invalid"] == 2 and info["invalid_count"] == 2
    assert info["parse_error"] == "invalid action: action: Input should be 'stick' or 'hit'"


def test_valid_reply_resets_consecutive_count_but_not_total():
    env = blackjack()
    env.reset(seed=5)
    env.step("?")
    _, _, _, _, info = env.step("hit")
    assert info["consecutive_invalid"] == 0 and info["invalid_count"] == 1
    env.reset(seed=5)
    _, _, _, _, info = env.step("?")
    assert info["invalid_count"] == 1  # counters restart with the episode


def test_default_action_mode_steps_env_with_penalty():
    raw = gym.make("Blackjack-v1")
    raw.reset(seed=0)
    _, raw_reward, *_ = raw.step(0)
    env = blackjack(on_invalid="default_action", default_action=0, invalid_penalty=0.25)
    env.reset(seed=0)
    messages, reward, terminated, _, info = env.step("gibberish")
    assert reward == raw_reward - 0.25 and terminated
    assert info["env_action"] == 0 and "parsed_action" not in info
    assert messages[-1]["content"].startswith("Your last reply was invalid (")
    assert "The default action was taken." in messages[-1]["content"]


def test_raise_mode_raises_parse_error():
    env = blackjack(on_invalid="raise")
    env.reset(seed=0)
    with pytest.raises(ActionParseError, match="no JSON object found") as excinfo:
        env.step("what?")
    assert excinfo.value.reply == "what?"


def test_oversized_reply_is_invalid_without_parsing():
    calls = []

    def parse(reply):
        calls.append(reply)
        return 0

    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=parse, max_reply_chars=10)
    env.reset(seed=0)
    _, _, _, _, info = env.step("x" * 11)
    assert info["parse_error"] == "reply is 11 characters long, over the limit of 10"
    assert calls == []


def test_parser_result_outside_action_space_is_invalid():
    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=lambda reply: 7)
    env.reset(seed=0)
    _, _, _, _, info = env.step("anything")
    assert info["parse_error"] == (
        "the reply maps to 7, which is not in the action space Discrete(2)"
    )
    # a parser echoing a huge reply back does not put it into the next observation
    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=lambda reply: list(reply))
    env.reset(seed=0)
    messages, _, _, _, info = env.step("x" * 4000)
    assert info["parse_error"] == (
        "the reply maps to ['x', 'x', 'x', 'x', 'x', 'x', ...], which is not in the action "
        "space Discrete(2)"
    )
    assert len(messages[-1]["content"]) < 300


def test_buggy_parser_does_not_crash_the_episode():
    class Buggy(FunctionParser):
        def parse(self, text):
            raise KeyError("oops")

    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=Buggy(lambda r: 0))
    env.reset(seed=0)
    _, reward, _, _, info = env.step("stick")
    assert info["parse_error"] == "the parser raised KeyError: 'oops'"
    assert reward == -1.0


def test_non_str_action_is_a_clear_error():
    env = blackjack()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="Expected the reply as str, got int"):
        env.step(1)


def test_history_window_keeps_last_turns():
    env = TextEnvWrapper(gym.make("CartPole-v1"), history=2, action_names=["left", "right"])
    messages, _ = env.reset(seed=0)
    assert len(messages) == 2
    for i in range(4):
        messages, *_ = env.step("left" if i % 2 else "right")
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["right", "left"]
    assert env.observation_space.contains(messages)
    assert env.observation_space.max_messages == 6


def test_history_replays_invalid_reply_and_error():
    env = TextEnvWrapper(gym.make("CartPole-v1"), history=1, action_names=["left", "right"])
    env.reset(seed=0)
    messages, *_ = env.step("both left and right")
    assert messages[2] == {"role": "assistant", "content": "both left and right"}
    assert messages[3]["content"].startswith(
        "Your last reply was invalid (ambiguous reply: it names several actions (left, right))"
    )


def test_formatter_forms():
    class Total(Formatter):
        def format(self, obs, info):
            return f"Total {obs[0]}"

    for formatter, expected in [
        (lambda obs, info: f"Total {obs[0]}", "Total 11"),
        ("Total {o[0]}", "Total 11"),
        (Total(), "Total 11"),
    ]:
        env = TextEnvWrapper(gym.make("Blackjack-v1"), formatter)
        messages, _ = env.reset(seed=0)
        assert messages[-1]["content"] == expected


def test_formatter_output_is_checked():
    env = TextEnvWrapper(gym.make("Blackjack-v1"), lambda obs, info: 3)
    with pytest.raises(TypeError, match="The formatter must return str, got int"):
        env.reset(seed=0)
    env = TextEnvWrapper(gym.make("Blackjack-v1"), lambda o, i: "x" * 50, max_observation_chars=20)
    with pytest.raises(ValueError, match="The formatted observation has 50 characters, over"):
        env.reset(seed=0)


def test_pydantic_model_parser_with_to_action():
    class Decision(BaseModel):
        model_config = ConfigDict(extra="forbid")
        hit: bool

        def to_action(self):
            return int(self.hit)

    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=Decision)
    messages, _ = env.reset(seed=0)
    assert '- "hit": true or false' in messages[0]["content"]
    _, _, _, _, info = env.step('{"hit": true}')
    assert info["env_action"] == 1
    env.reset(seed=0)
    _, _, _, _, info = env.step('{"hit": true, "bet": 5}')
    assert info["parse_error"] == "invalid action: bet: Extra inputs are not permitted"


def test_custom_system_prompt_gets_instructions_appended():
    env = blackjack(system_prompt="You are an expert blackjack player.")
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"].startswith("You are an expert blackjack player.\n\nReply with")


def test_function_parser_without_instructions_leaves_prompt_alone():
    env = TextEnvWrapper(
        gym.make("Blackjack-v1"), parser=lambda r: 0 if "stay" in r else 1, system_prompt="Play."
    )
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"] == "Play."


def test_env_id_and_env_kwargs():
    env = TextEnvWrapper("FrozenLake-v1", env_kwargs={"is_slippery": False})
    assert env.unwrapped.spec.kwargs["is_slippery"] is False
    with pytest.raises(ValueError, match="env_kwargs only apply when env is an env id"):
        TextEnvWrapper(gym.make("FrozenLake-v1"), env_kwargs={"is_slippery": False})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"on_invalid": "ignore"},
            "Expected on_invalid to be one of ('penalize', 'default_action', 'raise'), "
            "got 'ignore'",
        ),
        ({"history": -1}, "Expected history to be an int >= 0, got -1"),
        (
            {"invalid_penalty": -1.0},
            "Expected invalid_penalty >= 0 (it is subtracted from the reward), got -1.0",
        ),
        ({"max_invalid": 0}, "Expected max_invalid to be an int >= 1, got 0"),
        (
            {"on_invalid": "default_action", "default_action": 5},
            "default_action 5 is not in the action space Discrete(2)",
        ),
    ],
)
def test_bad_options_are_rejected_eagerly(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        TextEnvWrapper(gym.make("Blackjack-v1"), **kwargs)
    assert str(excinfo.value) == message


def test_default_action_needed_for_box():
    with pytest.raises(ValueError, match="needs default_action for a Box action space"):
        TextEnvWrapper(gym.make("Pendulum-v1"), on_invalid="default_action")
    env = TextEnvWrapper(
        gym.make("Pendulum-v1"), on_invalid="default_action", default_action=np.zeros(1, np.float32)
    )
    env.reset(seed=0)
    _, _, _, _, info = env.step('{"action": 9}')
    assert info["env_action"].tolist() == [0.0]


def test_not_an_env():
    with pytest.raises(TypeError, match="Expected a gymnasium.Env or an env id, got int"):
        TextEnvWrapper(3)


@pytest.mark.parametrize(
    "env_id", ["Blackjack-v1", "CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "MountainCar-v0"]
)
def test_generic_wrapping_passes_checkers(env_id):
    env = TextEnvWrapper(gym.make(env_id))
    check_env(env)
    assert check_text_env(env, n_samples=20) == 20


def test_spec_rebuilds_the_wrapper_stack():
    env = blackjack(history=1)
    rebuilt = gym.make(env.spec)
    assert rebuilt.unwrapped.spec.id == "Blackjack-v1"
    assert rebuilt.reset(seed=4)[0] == env.reset(seed=4)[0]


def test_render_close_unwrapped():
    env = TextEnvWrapper(gym.make("FrozenLake-v1", render_mode="ansi"))
    env.reset(seed=0)
    assert "FHFH" in env.render()
    assert env.unwrapped is env.env.unwrapped
    env.close()


def test_info_json_serialisable_for_logging():
    env = blackjack()
    env.reset(seed=0)
    _, _, _, _, info = env.step("hit")
    json.dumps({k: (v.item() if hasattr(v, "item") else v) for k, v in info.items()})


def test_penalized_step_repeats_last_env_info_as_a_copy():
    env = TextEnvWrapper(gym.make("Taxi-v4"))
    _, reset_info = env.reset(seed=0)
    _, _, _, _, info = env.step("drive!")
    assert np.array_equal(info["action_mask"], reset_info["action_mask"])
    assert info["action_mask"] is not reset_info["action_mask"]
    assert info["invalid"] is True


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_infos_batch_when_valid_and_invalid_replies_mix(mode):
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=3, vectorization_mode=mode)
    envs.reset(seed=0)
    _, _, _, _, infos = envs.step(["hit", "??", "stick"])
    assert infos["invalid"].tolist() == [False, True, False]
    assert infos["_parsed_action"].tolist() == [True, False, True]
    assert infos["parsed_action"][[0, 2]].tolist() == [1, 0]
    assert infos["_parse_error"].tolist() == [False, True, False]
    assert infos["parse_error"][1].startswith("no JSON object found")
    envs.close()


def test_on_invalid_accepts_only_the_documented_modes():
    from textgym.wrapper_options import INVALID_MODES

    for mode in INVALID_MODES:
        TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["stick", "hit"], on_invalid=mode)
    with pytest.raises(ValueError, match="on_invalid"):  # the British spelling is no alias
        TextEnvWrapper(gym.make("Blackjack-v1"), on_invalid="penalise")
