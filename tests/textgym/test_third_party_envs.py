"""Gymnasium envs nobody here wrote, wrapped with the zero-code defaults.

`TextEnvWrapper(env)` with `GenericFormatter` and the auto schema, untouched envs from PyPI
(installed by the test extra): raw MiniGrid/BabyAI (Dict: image array, direction, mission
text), NumberLink (RGB Box), BulletChess (Dict: one-hot board, 20,481-entry action mask).
"""

import importlib
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from textgym import GenericFormatter, TextEnvWrapper, check_text_env
from textgym.formatters import MAX_ARRAY_ITEMS, summarise_array


def _require(module: str) -> None:
    # In CI the test extra installs these packages, so a missing one is a failure, not a skip.
    if os.environ.get("CI"):
        importlib.import_module(module)
    else:
        pytest.importorskip(module, reason='installed by the test extra: pip install -e ".[test]"')


ENVS = [
    # (package, env id)
    ("minigrid", "MiniGrid-Empty-5x5-v0"),
    ("minigrid", "MiniGrid-DoorKey-5x5-v0"),
    ("minigrid", "BabyAI-GoToRedBall-v0"),
    ("numberlink", "NumberLinkRGB-v0"),
    ("gym_bullet_chess", "BulletChess-v0"),
]
ENV_IDS = [env_id for _, env_id in ENVS]
MAX_USER_CHARS = 2_000  # every user message of these envs, whatever their arrays' sizes
JUNK_REPLIES = [
    "",
    "I think I will go left.",
    "{",
    '{"action": -1}',
    '{"action": "north"}',
    '{"action": 1, "speed": 2}',
    '{"move": 1}',
    "[1, 2]",
    "null",
    "NaN",
    "\x00\u2603" * 20,
    "x" * 5_000,  # over max_reply_chars
]


def make(env_id: str) -> TextEnvWrapper:
    _require(dict((i, p) for p, i in ENVS)[env_id])
    return TextEnvWrapper(gym.make(env_id))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env(env_id):
    check_env(make(env_id))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_text_env(env_id):
    assert check_text_env(make(env_id), n_samples=20, skip_render_check=True) == 20


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_default_prompt_is_generic_and_bounded(env_id):
    env = make(env_id)
    assert isinstance(env.formatter, GenericFormatter)
    messages, _ = env.reset(seed=0)
    system, user = messages[0]["content"], messages[-1]["content"]
    assert f"environment {env_id}" in system and '"action": integer from 0 to' in system
    assert user.startswith("Observation:")
    assert len(user) < MAX_USER_CHARS
    assert "array(" not in user and "dtype" not in user


def test_minigrid_prompt_summarises_the_image_and_shows_the_mission():
    messages, _ = make("BabyAI-GoToRedBall-v0").reset(seed=0)
    lines = messages[-1]["content"].splitlines()
    assert lines[1].startswith("- image: uint8 array of shape (7, 7, 3), min 0, max ")
    assert "; corner [:4, :4, :]: [[[" in lines[1]
    assert lines[2:] == ["- direction: 2", "- mission: go to the red ball"]


def test_chess_prompt_lists_the_legal_actions_of_the_mask():
    env = make("BulletChess-v0")
    obs, info = env.env.reset(seed=0)
    legal = np.flatnonzero(obs["action_mask"])
    assert 0 < len(legal) <= 32  # the 20 opening moves
    mask_line = env.format_observation(obs, info).splitlines()[-1]
    assert mask_line == (
        f"- action_mask: int8 array of shape (20481,), min 0, max 1; {len(legal)} nonzero, "
        f"at [{', '.join(str(i) for i in legal)}]"
    )


def test_the_package_text_is_one_formatter_away():
    """What the docs advise for a board the summary cannot show: the package's own text."""
    _require("gym_bullet_chess")
    from gym_bullet_chess import format_position_for_llm

    env = TextEnvWrapper(
        gym.make("BulletChess-v0"), formatter=lambda obs, info: format_position_for_llm(info)
    )
    messages, _ = env.reset(seed=0)
    assert messages[-1]["content"].startswith("FEN: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w")
    assert "Legal UCI moves: g1h3 g1f3" in messages[-1]["content"]


@pytest.mark.parametrize(
    "env_id", ["MiniGrid-DoorKey-5x5-v0", "NumberLinkRGB-v0", "BulletChess-v0"]
)
def test_the_docs_show_the_default_prompts(env_id):
    page = (Path(__file__).parents[2] / "docs" / "text-envs.md").read_text(encoding="utf-8")
    messages, _ = make(env_id).reset(seed=0)
    assert f"{env_id}" in page
    assert messages[-1]["content"] in page


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_replies(env_id):
    """50 steps of replies: valid ones from the schema and choices, and junk."""
    env = make(env_id)
    rng = np.random.default_rng(0)
    env.env.action_space.seed(0)
    choices = env.reply_choices()
    messages, _ = env.reset(seed=0)
    valid_seen = invalid_seen = 0
    for _ in range(50):
        kind = rng.integers(3)
        if kind == 0:
            reply, expect_valid = env.example_reply(env.env.action_space.sample()), True
        elif kind == 1 and choices:
            reply, expect_valid = choices[rng.integers(len(choices))], True
        else:
            reply, expect_valid = JUNK_REPLIES[rng.integers(len(JUNK_REPLIES))], False
        messages, reward, terminated, truncated, info = env.step(reply)
        assert info["invalid"] is not expect_valid, (reply, info.get("parse_error"))
        assert env.observation_space.contains(messages)
        assert len(messages[-1]["content"]) < MAX_USER_CHARS + 1_100  # + the quoted error
        assert np.isfinite(float(reward))
        valid_seen += expect_valid
        invalid_seen += not expect_valid
        if terminated or truncated:
            messages, _ = env.reset()
    assert valid_seen and invalid_seen


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_sync_vector_env(env_id):
    make(env_id)  # skips when the package is missing
    envs = gym.vector.SyncVectorEnv([lambda: TextEnvWrapper(gym.make(env_id)) for _ in range(2)])
    observations, _ = envs.reset(seed=0)
    assert len(observations) == 2
    example = envs.envs[0].example_reply(0)
    for _ in range(3):
        observations, rewards, _, _, infos = envs.step((example, "no idea"))
        assert list(infos["invalid"]) == [False, True]
        assert rewards[1] == -1.0
        assert all(envs.single_observation_space.contains(o) for o in observations)
    envs.close()


# --- The bound on large arrays -----------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        np.zeros((7, 7, 3), dtype=np.uint8),
        np.full((56, 56, 3), 255, dtype=np.uint8),
        np.random.default_rng(0).random((8, 8, 18), dtype=np.float32),
        np.random.default_rng(0).normal(0, 1e300, (64, 64)),
        np.random.default_rng(0).integers(-(2**62), 2**62, (3, 100, 100, 4)),
        np.ones(20_481, dtype=np.int8),
        np.eye(1_000, dtype=bool)[3],
        np.array(["word"] * 500),
    ],
    ids=lambda a: f"{a.dtype}{a.shape}",
)
def test_large_arrays_render_in_bounded_text(array):
    text = GenericFormatter()(array, {})
    assert len(text) < MAX_USER_CHARS
    assert text.startswith(f"Observation: {array.dtype} array of shape {array.shape}")
    assert "..." not in text and "array(" not in text


def test_arrays_up_to_the_limit_are_listed_in_full():
    board = np.arange(MAX_ARRAY_ITEMS).reshape(10, 10)
    assert GenericFormatter()(board, {}) == f"Observation: {board.tolist()}"
    assert "array of shape" in GenericFormatter()(np.arange(MAX_ARRAY_ITEMS + 1), {})
    assert GenericFormatter(max_items=200)(np.arange(150), {}).endswith("148, 149]")
    with pytest.raises(ValueError, match="Expected max_items to be an int >= 1, got 0"):
        GenericFormatter(max_items=0)


def test_summary_corner_and_mask():
    image = np.zeros((56, 56, 3), dtype=np.uint8)
    image[0, 0] = [1, 2, 3]
    assert summarise_array(image).startswith(
        "uint8 array of shape (56, 56, 3), min 0, max 3; corner [:4, :4, :]: [[[1, 2, 3], [0, 0, 0]"
    )
    mask = np.zeros(300, dtype=np.int8)
    mask[[5, 250]] = 1
    assert (
        summarise_array(mask) == "int8 array of shape (300,), min 0, max 1; 2 nonzero, at [5, 250]"
    )
    assert summarise_array(np.zeros((0, 200))) == "float64 array of shape (0, 200)"


def test_pixel_observations_give_a_short_prompt():
    """Gymnasium's own pixel wrapper: a 400 x 600 x 3 frame each turn."""
    pytest.importorskip("pygame")
    base = gym.make("CartPole-v1", render_mode="rgb_array")
    env = TextEnvWrapper(gym.wrappers.AddRenderObservation(base, render_only=True))
    messages, _ = env.reset(seed=0)
    assert messages[-1]["content"].startswith(
        "Observation: uint8 array of shape (400, 600, 3), min 0, max 255; corner [:4, :4, :]:"
    )
    assert len(messages[-1]["content"]) < 500


def test_an_overlong_observation_names_the_space_and_the_fix():
    env = make("MiniGrid-Empty-5x5-v0")
    env = TextEnvWrapper(env.env, max_observation_chars=100)
    with pytest.raises(ValueError) as raised:
        env.reset(seed=0)
    message = str(raised.value)
    assert message.startswith("The formatted observation has ")
    assert "over max_observation_chars=100 for the observation space Dict('direction'" in message
    assert "pass a formatter that renders it shorter" in message
