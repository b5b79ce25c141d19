import gymnasium as gym
import numpy as np
import pytest

import textgym
from textgym import TextEnvWrapper, check_text_env, register, registered_ids
from textgym.checker import find_text_wrapper
from textgym.envs.reasoning_gym_text import REASONING_GYM_TASKS
from textgym.envs.textarena_text import TEXTARENA_GAMES

CLASSIC_IDS = [
    "textgym/Acrobot-v1",
    "textgym/Blackjack-v1",
    "textgym/CartPole-v1",
    "textgym/CliffWalking-v1",
    "textgym/FrozenLake-v1",
    "textgym/FrozenLake8x8-v1",
    "textgym/MountainCar-v0",
    "textgym/Pendulum-v1",
    "textgym/Taxi-v4",
]


def test_registered_ids():
    babyai = [f"textgym/BabyAI-{name}-v0" for name in ("GoToRedBall", "GoToLocal", "OpenDoor")]
    babyai += ["textgym/BabyAI-PickupLocal-v0", "textgym/BabyAI-PutNextLocal-v0"]
    games = ["textgym/TicTacToe-v0", "textgym/ConnectFour-v0"]
    native = ["textgym/Calculator-v0", "textgym/FrozenLakeRandom-v0", "textgym/Sokoban-v0"]
    native += ["textgym/OpenEnv-v0"]  # any OpenEnv server
    reasoning = [f"textgym/rg-{task}-v0" for task in REASONING_GYM_TASKS]
    arena = [f"textgym/ta-{game}" for game in TEXTARENA_GAMES]
    ids = [*CLASSIC_IDS, *native, *babyai, *games, *reasoning, *arena]
    assert registered_ids() == sorted(ids)


@pytest.mark.parametrize("env_id", CLASSIC_IDS)
def test_registered_env_passes_checkers(env_id):
    env = gym.make(env_id)
    assert check_text_env(env, n_samples=30) == 30
    assert env.spec.id == env_id


@pytest.mark.parametrize("env_id", CLASSIC_IDS)
def test_registered_env_plays_like_the_base_env(env_id):
    """Replying with the example reply of action a gives the same rewards as stepping a."""
    env = gym.make(env_id)
    text_env = find_text_wrapper(env)
    base = gym.make(text_env.unwrapped.spec.kwargs.get("env_id", env_id.split("/")[1]))
    base.reset(seed=11)
    env.reset(seed=11)
    base.action_space.seed(0)
    for _ in range(5):
        action = base.action_space.sample()
        _, base_reward, base_term, _, _ = base.step(action)
        _, reward, terminated, _, info = env.step(env.get_wrapper_attr("example_reply")(action))
        assert not info["invalid"]
        assert np.isclose(float(reward), float(base_reward), atol=1e-5)
        assert terminated == base_term
        if terminated:
            break


def test_wrapper_and_env_kwargs_are_split():
    env = gym.make("textgym/FrozenLake-v1", map_name="8x8", is_slippery=False, history=2)
    text_env = find_text_wrapper(env)
    assert text_env.history == 2
    assert env.unwrapped.spec.kwargs["map_name"] == "8x8"
    messages, _ = env.reset(seed=0)
    assert len(messages[-1]["content"].splitlines()) == 9  # position line + 8 map rows


def test_wrapper_options_override_preset():
    env = gym.make("textgym/Blackjack-v1", system_prompt="Be bold.", formatter="Total {o[0]}")
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"].startswith("Be bold.\n\nReply with")
    assert messages[1]["content"] == "Total 11"


def test_preset_takes_a_parser_instead_of_its_action_names():
    from pydantic import BaseModel

    class Move(BaseModel):
        go: int

    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, parser=Move)
    env.reset(seed=0)
    _, _, _, _, info = env.step('{"go": 1}')
    assert not info["invalid"] and info["env_action"] == 1


# Replies (by action index) that end an episode of each preset with a goal, and the outcome.
SUCCESS_CASES = [
    ("textgym/FrozenLake-v1", {"is_slippery": False}, [2, 2, 1, 1, 1, 2], True),
    ("textgym/FrozenLake-v1", {"is_slippery": False}, [1, 2], False),  # the hole at (1, 1)
    ("textgym/CliffWalking-v1", {}, [0] + [1] * 11 + [2], True),
    ("textgym/Taxi-v4", {}, [4], None),  # an illegal pickup: the episode goes on
]


@pytest.mark.parametrize(("env_id", "kwargs", "actions", "success"), SUCCESS_CASES)
def test_presets_with_a_goal_report_is_success_at_the_end(env_id, kwargs, actions, success):
    env = gym.make(env_id, **kwargs)
    reply = env.get_wrapper_attr("example_reply")
    env.reset(seed=0)
    for i, action in enumerate(actions):
        _, _, terminated, truncated, info = env.step(reply(action))
        ended = terminated or truncated
        assert ("is_success" in info) == ended == (i == len(actions) - 1 and success is not None)
    assert info.get("is_success") is success


def test_blackjack_success_is_a_won_hand():
    env = gym.make("textgym/Blackjack-v1")
    outcomes = set()
    for seed in range(40):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step('{"action": "stick"}')
        assert terminated and info["is_success"] is (reward > 0)
        outcomes.add(info["is_success"])
    assert outcomes == {True, False}


@pytest.mark.parametrize("env_id", [i for i in CLASSIC_IDS if i != "textgym/Blackjack-v1"])
def test_every_registered_env_has_a_turn_limit(env_id):
    """A policy that never reaches a goal still ends its episodes (evaluation terminates).

    Blackjack needs none: every hit draws a card, so a hand ends within 21 turns.
    """
    assert gym.make(env_id).spec.max_episode_steps is not None


def test_cliffwalking_is_cut_at_100_turns_though_gymnasiums_has_no_limit():
    assert gym.spec("CliffWalking-v1").max_episode_steps is None
    env = gym.make("textgym/CliffWalking-v1")
    env.reset(seed=0)
    for turn in range(1, 101):  # walking into the top edge never reaches the goal
        _, _, terminated, truncated, _ = env.step('{"action": "up"}')
        assert not terminated and truncated is (turn == 100)


def test_a_training_move_limit_truncates_under_the_envs_own_limit():
    env = gym.make("textgym/CliffWalking-v1", training_max_steps=3)
    env.reset(seed=0)
    cut = [env.step('{"action": "up"}')[3] for _ in range(3)]
    assert cut == [False, False, True] and env.spec.max_episode_steps == 100
    with pytest.raises(ValueError, match="training_max_steps must be >= 1"):
        gym.make("textgym/CliffWalking-v1", training_max_steps=0)


def test_presets_without_a_goal_report_no_success():
    env = gym.make("textgym/CartPole-v1", max_episode_steps=3)
    env.reset(seed=0)
    for _ in range(3):
        _, _, terminated, truncated, info = env.step('{"action": "left"}')
    assert (terminated or truncated) and "is_success" not in info


def test_render_mode_reaches_base_env():
    env = gym.make("textgym/FrozenLake-v1", render_mode="ansi")
    env.reset(seed=0)
    assert "FHFH" in env.render()


def test_unknown_id_suggests_close_match():
    with pytest.raises(gym.error.NameNotFound, match="Did you mean: `Blackjack`"):
        gym.make("textgym/Blackjak-v1")
    with pytest.raises(gym.error.VersionNotFound, match="It provides versioned environments"):
        gym.make("textgym/Blackjack-v2")
    with pytest.raises(gym.error.DeprecatedEnv, match="Please use `textgym/Taxi-v4` instead"):
        gym.make("textgym/Taxi-v3")


def test_register_user_env_with_pydantic_parser():
    from pydantic import BaseModel

    class Push(BaseModel):
        direction: int

    register(
        "tests/Push-v0",
        "CartPole-v1",
        formatter="Angle {o[2]:.2f}",
        parser=Push,
        max_episode_steps=5,
        env_kwargs={"sutton_barto_reward": True},
    )
    env = gym.make("tests/Push-v0")
    messages, _ = env.reset(seed=0)
    assert messages[-1]["content"] == "Angle -0.05"
    for _ in range(5):
        _, reward, terminated, truncated, info = env.step('{"direction": 1}')
        if terminated or truncated:
            break
    assert truncated or terminated
    assert env.unwrapped.spec.kwargs["sutton_barto_reward"] is True


def test_register_rejects_unknown_wrapper_options():
    with pytest.raises(TypeError, match=r"Unknown TextEnvWrapper options \['histroy'\]"):
        register("tests/Bad-v0", "CartPole-v1", histroy=2)


def test_make_text_env_with_callable_base():
    env = textgym.make_text_env(lambda **kw: gym.make("Blackjack-v1", **kw), natural=True)
    assert isinstance(env, TextEnvWrapper)
    assert env.unwrapped.natural is True


@pytest.mark.parametrize("env_id", [*CLASSIC_IDS, "textgym/Calculator-v0"])
def test_spec_rebuilds_registered_env(env_id):
    env = gym.make(env_id)
    rebuilt = gym.make(env.spec)
    assert rebuilt.reset(seed=3)[0] == env.reset(seed=3)[0]


def test_spec_rebuilds_env_with_generated_parser_instance():
    from textgym import JSONActionParser

    def factory(**kwargs):
        base = gym.make("CartPole-v1", **kwargs)
        return TextEnvWrapper(base, parser=JSONActionParser.from_space(base.action_space))

    gym.register("tests/CartFactory-v0", entry_point=factory)
    env = gym.make("tests/CartFactory-v0")
    assert gym.make(env.spec).reset(seed=0)[0] == env.reset(seed=0)[0]
