"""BabyAI-Text: the MiniGrid formatter's wording, the registered textgym/BabyAI-* ids."""

import json
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import textgym
from textgym import check_text_env, reply_choices
from textgym.checker import find_text_wrapper
from textgym.envs.minigrid_text import (
    ACTION_NAMES,
    BABYAI_LEVELS,
    FirstActions,
    MiniGridFormatter,
    describe_view,
    make_babyai_text_env,
    relative_position,
)
from textgym.extras import MissingExtraError

IDS = [f"textgym/{name}" for name in BABYAI_LEVELS]
HINT = 'pip install "textgym[minigrid]"'
# Solutions on seed 1, found once with minigrid's BabyAIBot and written out.
SOLUTIONS = {
    "textgym/BabyAI-GoToRedBall-v0": [
        "turn right", "turn right", "go forward", "turn right", "go forward", "go forward",
        "turn left",
    ],
    "textgym/BabyAI-GoToLocal-v0": ["go forward", "turn left"],
    "textgym/BabyAI-PickupLocal-v0": ["go forward", "turn left", "pick up"],
    "textgym/BabyAI-PutNextLocal-v0": [
        "turn right", "turn right", "go forward", "go forward", "turn right", "go forward",
        "pick up", "turn right", "go forward", "drop",
    ],
    "textgym/BabyAI-OpenDoor-v0": ["go forward"] * 5 + ["toggle"],
}  # fmt: skip
SENTENCE = re.compile(r"You see (a|an) (?:(open|closed|locked) )?(\w+) (\w+) (.+)\.")
WALL = re.compile(r"You see a wall (.+)\.")


@pytest.fixture
def minigrid():
    return pytest.importorskip("minigrid")


def reply(name):
    return json.dumps({"action": name})


def user_text(messages):
    return messages[-1]["content"]


def steps_of(position):
    """'1 step left and 3 steps forward' -> (lateral, forward), lateral < 0 on the left."""
    lateral = forward = 0
    for count, word in re.findall(r"(\d+) steps? (left|right|forward)", position):
        if word == "forward":
            forward = int(count)
        else:
            lateral = int(count) * (-1 if word == "left" else 1)
    assert relative_position(lateral, forward) == position
    return lateral, forward


def cell_at(raw, lateral, forward):
    x, y = raw.agent_pos + forward * raw.dir_vec + lateral * raw.right_vec
    return raw.grid.get(int(x), int(y))


# --- the wording, on synthetic views (no minigrid needed) ------------------------------------


def empty_view(size=7):
    image = np.zeros((size, size, 3), dtype=np.uint8)
    image[:, :] = (1, 0, 0)
    return image


def test_relative_position_wording():
    assert relative_position(-1, 3) == "1 step left and 3 steps forward"
    assert relative_position(3, 1) == "3 steps right and 1 step forward"
    assert relative_position(0, 2) == "2 steps forward"
    assert relative_position(-2, 0) == "2 steps left"


def test_describe_view_orders_walls_then_objects_nearest_first():
    image = empty_view()
    image[:, 2] = (2, 5, 0)  # a wall across the view, 4 steps ahead
    image[0, 6] = (2, 5, 0)  # a wall 3 steps left
    image[4, 5] = (7, 4, 0)  # yellow box: right 1, forward 1
    image[2, 5] = (5, 3, 0)  # purple key: left 1, forward 1 (2 steps in all: left to right)
    image[3, 4] = (4, 1, 0)  # open green door 2 ahead
    image[6, 3] = (4, 2, 2)  # locked blue door: right 3, forward 3
    image[5, 3] = (8, 1, 0)  # the goal: right 2, forward 3
    image[1, 3] = (9, 0, 0)  # lava: left 2, forward 3
    assert describe_view(image) == [
        "You see a wall 4 steps forward.",
        "You see a wall 3 steps left.",
        "You see a purple key 1 step left and 1 step forward.",
        "You see an open green door 2 steps forward.",
        "You see a yellow box 1 step right and 1 step forward.",
        "You see lava 2 steps left and 3 steps forward.",
        "You see the goal 2 steps right and 3 steps forward.",
        "You see a locked blue door 3 steps right and 3 steps forward.",
    ]


def test_walls_are_named_only_when_seen():
    image = empty_view()
    image[3, 3] = (0, 0, 0)  # unseen cell ahead hides the wall behind it
    image[3, 1] = (2, 5, 0)
    image[5, 6] = (2, 5, 0)  # right: 2 steps
    image[6, 6] = (2, 5, 0)
    assert describe_view(image) == ["You see a wall 2 steps right."]


def test_formatter_mission_carrying_and_last_actions():
    image = empty_view()
    image[3, 6] = (6, 0, 0)  # carrying a red ball
    obs = {"image": image, "direction": 1, "mission": "put the red ball next to the blue box"}
    fmt = MiniGridFormatter(last_actions=2)
    actions = ("turn left", "go forward", "pick up")
    assert fmt(obs, {"last_actions": actions}) == (
        "Mission: put the red ball next to the blue box\n"
        "You carry a red ball.\n"
        "Your last actions: go forward, pick up."
    )
    image[3, 6] = (1, 0, 0)
    assert MiniGridFormatter()(obs, {"last_actions": actions}) == (
        "Mission: put the red ball next to the blue box\nYou carry nothing."
    )
    assert fmt(obs, {"last_actions": ()}).endswith("\nYour last actions: none.")
    with pytest.raises(ValueError, match="Expected last_actions to be an int >= 0, got -1"):
        MiniGridFormatter(last_actions=-1)


def test_first_actions_rejects_too_few_actions():
    with pytest.raises(
        ValueError, match=r"Discrete space of at least 8 actions, got Discrete\(6\)"
    ):
        FirstActions(gym.make("Taxi-v4"), 8)


# --- the registered envs ---------------------------------------------------------------------


def test_ids_are_registered():
    assert set(IDS) <= set(textgym.registered_ids())
    assert {
        "textgym/BabyAI-GoToRedBall-v0",
        "textgym/BabyAI-GoToLocal-v0",
        "textgym/BabyAI-PickupLocal-v0",
        "textgym/BabyAI-PutNextLocal-v0",
        "textgym/BabyAI-OpenDoor-v0",
    } == set(IDS)
    assert gym.spec(IDS[0]).kwargs == {"level": "BabyAI-GoToRedBall-v0"}


def test_golden_first_prompt(minigrid):
    messages, _ = gym.make("textgym/BabyAI-GoToRedBall-v0").reset(seed=0)
    assert messages[0]["content"] == (
        "You are an agent in a grid world of rooms with walls, doors, keys, balls and boxes. "
        "Each turn you read your mission and what you see: up to 6 steps ahead and 3 steps to "
        "either side, walls and closed doors blocking the view. Positions are counted in steps "
        "from where you stand. 'turn left' and 'turn right' turn you 90 degrees where you "
        "stand; 'go forward' moves you one step ahead; 'pick up' takes the object right in "
        "front of you (you carry one at a time); 'drop' puts what you carry down right in front "
        "of you; 'toggle' opens or closes the door right in front of you. To go to an object, "
        "stand next to it and face it.\n\n"
        "Reply with a JSON object with exactly these fields:\n"
        '- "action": one of "turn left", "turn right", "go forward", "pick up", "drop", '
        '"toggle"\n'
        'Example reply: {"action": "turn left"}'
    )
    assert user_text(messages) == (
        "Mission: go to the red ball\n"
        "You see a wall 6 steps forward.\n"
        "You see a wall 2 steps left.\n"
        "You see a yellow key 1 step left and 1 step forward.\n"
        "You see a grey ball 1 step right and 1 step forward.\n"
        "You see a purple key 1 step left and 2 steps forward.\n"
        "You see a blue key 1 step right and 2 steps forward.\n"
        "You see a red box 2 steps right and 2 steps forward.\n"
        "You see a grey ball 1 step right and 5 steps forward.\n"
        "You see a green key 2 steps right and 4 steps forward.\n"
        "You see a red ball 3 steps right and 4 steps forward.\n"
        "You carry nothing."
    )
    messages, _ = gym.make("textgym/BabyAI-OpenDoor-v0").reset(seed=0)
    assert user_text(messages) == (
        "Mission: open the door in front of you\n"
        "You see a wall 2 steps forward.\n"
        "You see a closed red door 1 step left.\n"
        "You carry nothing."
    )


@pytest.mark.parametrize("env_id", IDS)
def test_positions_match_the_grid(minigrid, env_id):
    env = gym.make(env_id)
    raw = env.unwrapped
    rng = np.random.default_rng(0)
    described = 0
    for seed in range(3):
        messages, _ = env.reset(seed=seed)
        for _ in range(8):
            for line in user_text(messages).splitlines()[1:-1]:
                if wall := WALL.fullmatch(line):
                    lateral, forward = steps_of(wall[1])
                    assert cell_at(raw, lateral, forward).type == "wall", line
                    assert lateral == 0 or forward == 0, line
                    unit = (int(np.sign(lateral)), int(np.sign(forward)))
                    for k in range(1, max(abs(lateral), forward)):  # nothing nearer blocks it
                        between = cell_at(raw, unit[0] * k, unit[1] * k)
                        assert between is None or between.type != "wall", line
                    continue
                match = SENTENCE.fullmatch(line)
                assert match, line
                _, state, color, kind, position = match.groups()
                cell = cell_at(raw, *steps_of(position))
                assert (cell.color, cell.type) == (color, kind), line
                if state is not None:
                    assert state == (
                        "open" if cell.is_open else "locked" if cell.is_locked else "closed"
                    )
                described += 1
            action = ACTION_NAMES[int(rng.integers(0, 3))]  # turn or move
            messages, _, terminated, truncated, _ = env.step(reply(action))
            if terminated or truncated:
                break
    assert described >= 5


@pytest.mark.parametrize("env_id", IDS)
def test_every_id_passes_the_checkers(minigrid, env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped)
    check_env(env)
    assert check_text_env(env, n_samples=20) == 20
    assert reply_choices(env) == [reply(name) for name in ACTION_NAMES[:6]]
    assert find_text_wrapper(env).parser.parse(reply("drop")) == 4


@pytest.mark.parametrize("env_id", IDS)
def test_scripted_solution_succeeds(minigrid, env_id):
    env = gym.make(env_id)
    env.reset(seed=1)
    *head, last = SOLUTIONS[env_id]
    for name in head:
        _, _, terminated, truncated, info = env.step(reply(name))
        assert not (terminated or truncated) and "is_success" not in info
    _, reward, terminated, truncated, info = env.step(reply(last))
    assert terminated and info["is_success"] is True and float(reward) > 0


def test_running_out_of_steps_fails(minigrid):
    env = gym.make("textgym/BabyAI-GoToRedBall-v0")  # 64 steps at most
    env.reset(seed=0)
    ends = [env.step(reply("turn left"))[2:] for _ in range(64)]
    assert all(not terminated for terminated, _, _ in ends)
    assert [truncated for _, truncated, _ in ends] == [False] * 63 + [True]
    assert ends[-1][2]["is_success"] is False and "is_success" not in ends[-2][2]


def test_carrying_is_described(minigrid):
    env = gym.make("textgym/BabyAI-PutNextLocal-v0")
    messages, _ = env.reset(seed=1)
    solution = SOLUTIONS["textgym/BabyAI-PutNextLocal-v0"]
    for name in solution[: solution.index("pick up") + 1]:
        assert user_text(messages).endswith("\nYou carry nothing.")
        messages, *_ = env.step(reply(name))
    carried = env.unwrapped.carrying
    assert carried is not None
    assert user_text(messages).endswith(f"\nYou carry a {carried.color} {carried.type}.")
    assert f"You see a {carried.color} {carried.type} " not in user_text(messages)
    messages, *_ = env.step(reply("turn right"))
    messages, *_ = env.step(reply("go forward"))
    messages, *_ = env.step(reply("drop"))
    assert env.unwrapped.carrying is None and user_text(messages).endswith("\nYou carry nothing.")


def test_last_actions(minigrid):
    env = gym.make("textgym/BabyAI-GoToLocal-v0", last_actions=2)
    messages, info = env.reset(seed=3)
    assert user_text(messages).endswith("\nYou carry nothing.\nYour last actions: none.")
    assert info["last_actions"] == ()
    for name in ("turn left", "turn right", "go forward"):
        messages, *_ = env.step(reply(name))
    assert user_text(messages).endswith("\nYour last actions: turn right, go forward.")
    messages, _, _, _, info = env.step("I will dance")  # invalid: the env does not step
    assert info["invalid"] and info["last_actions"] == ("turn right", "go forward")
    assert "Your last actions: turn right, go forward." in user_text(messages)


def test_done_action_and_level_options(minigrid):
    env = gym.make("textgym/BabyAI-GoToLocal-v0", done_action=True, room_size=6, history=1)
    assert reply_choices(env) == [reply(name) for name in ACTION_NAMES]
    assert "'done' says that you have completed the mission." in env.reset(seed=0)[0][0]["content"]
    assert env.unwrapped.room_size == 6 and find_text_wrapper(env).history == 1
    with pytest.raises(ValueError, match="Expected level to be one of"):
        make_babyai_text_env("BabyAI-Nope-v0")


def test_sampling_rejections_are_not_printed(minigrid, capsys):
    env = gym.make("textgym/BabyAI-PutNextLocal-v0")
    for seed in range(10):
        env.reset(seed=seed)
    assert capsys.readouterr().out == ""


# --- without the extra -----------------------------------------------------------------------


def test_missing_extra_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "minigrid", None)  # import minigrid now fails
    with pytest.raises(MissingExtraError) as caught:
        gym.make("textgym/BabyAI-GoToRedBall-v0")
    assert str(caught.value) == f"textgym/BabyAI-GoToRedBall-v0 needs the minigrid package: {HINT}"
    assert caught.value.extra == "minigrid"


@pytest.mark.slow
def test_envs_lists_the_ids_without_the_extra():
    script = (
        "import sys\n"
        "sys.modules['minigrid'] = None\n"
        "from textgym.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "envs"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    line = f"  unavailable: textgym/BabyAI-OpenDoor-v0 needs the minigrid package: {HINT}"
    assert f"textgym/BabyAI-OpenDoor-v0  (BabyAI-OpenDoor-v0)\n{line}" in result.stdout
    assert 'textgym/Blackjack-v1  (Blackjack-v1)\n  replies: {"action": "stick"}' in result.stdout
