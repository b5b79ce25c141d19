import copy
import json
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env

import textgym
from textgym import check_text_env
from textgym.envs.sokoban import (
    ACTION_NAMES,
    BOX,
    BOX_ON_TARGET,
    PLAYER,
    PLAYER_ON_TARGET,
    TARGET,
    WALL,
    Room,
    SokobanEnv,
    generate_room,
    room_grid,
    solve_room,
)

ENV_ID = "textgym/Sokoban-v0"


def reply(action: int) -> str:
    return json.dumps({"action": ACTION_NAMES[action]})


def open_room(rows=5, cols=6):
    walls = np.ones((rows, cols), dtype=bool)
    walls[1:-1, 1:-1] = False
    return walls


def test_registered_with_a_turn_limit_and_named_replies():
    env = gym.make(ENV_ID)
    assert env.spec.max_episode_steps == 100
    assert isinstance(env.unwrapped, SokobanEnv)
    assert textgym.reply_choices(env) == [reply(a) for a in range(4)]


def test_passes_gymnasiums_checker_and_the_text_checker():
    check_env(SokobanEnv(render_mode="ansi"), skip_render_check=True)  # render: tested below
    assert check_text_env(gym.make(ENV_ID), n_samples=30) == 30


def test_every_generated_room_is_solvable_and_well_formed():
    env = SokobanEnv()
    lengths = []
    for seed in range(200):
        grid, _ = env.reset(seed=seed)
        assert grid.shape == (6, 6) and grid.dtype == np.uint8
        border = np.concatenate([grid[0], grid[-1], grid[:, 0], grid[:, -1]])
        assert (border == WALL).all()
        # One player, one box off the target, one target (the player may stand on it).
        assert (grid == BOX).sum() == 1 and (grid == PLAYER).sum() <= 1
        assert (grid == TARGET).sum() + (grid == PLAYER_ON_TARGET).sum() == 1
        solution = solve_room(env.room)
        assert solution, f"seed {seed}: no solution"
        lengths.append(len(solution))
    assert min(lengths) >= 1 and len(set(lengths)) > 3  # rooms of varied difficulty


def test_same_seed_same_room_and_seeds_differ():
    a, b = SokobanEnv(), SokobanEnv()
    for seed in range(5):
        assert np.array_equal(a.reset(seed=seed)[0], b.reset(seed=seed)[0])
    rooms = {SokobanEnv().reset(seed=seed)[0].tobytes() for seed in range(30)}
    assert len(rooms) == 30


@pytest.mark.parametrize("seed", range(12))
def test_bfs_solution_played_through_the_text_env_succeeds_with_the_documented_return(seed):
    """n moves earn -0.1 each, and the last push +1 +10: a return of 11 - 0.1 n."""
    env = gym.make(ENV_ID)
    env.reset(seed=seed)
    solution = solve_room(env.unwrapped.room)
    total = 0.0
    for i, action in enumerate(solution):
        _, reward, terminated, truncated, info = env.step(reply(action))
        total += float(reward)
        assert not info["invalid"] and not truncated
        assert terminated == (i == len(solution) - 1)
        if not terminated:
            assert math.isclose(float(reward), -0.1) and "is_success" not in info
    assert info["is_success"] is True and math.isclose(float(reward), 10.9)
    assert math.isclose(total, 11 - 0.1 * len(solution))


def test_walls_and_a_box_against_a_wall_stop_the_player():
    env = SokobanEnv()
    env.reset(seed=0)
    env.room = Room(open_room(), (1, 1), (2, 1), (3, 4))
    grid, reward, terminated, _, info = env.step(0)  # up: the border wall
    assert env.room.player == (1, 1) and not info["moved"] and reward == -0.1
    env.room = Room(open_room(), (2, 1), (3, 1), (3, 4))
    env.step(1)  # down: the box is against the bottom wall
    assert env.room.player == (2, 1) and env.room.box == (3, 1)
    _, _, _, _, info = env.step(3)  # right: a plain move
    assert env.room.player == (2, 2) and info == {"moved": True, "pushed": False}
    env.room = Room(open_room(), (3, 2), (3, 3), (3, 4))
    grid, reward, terminated, _, info = env.step(3)  # right: pushes the box onto the target
    assert terminated and info == {"moved": True, "pushed": True, "is_success": True}
    assert grid[3, 4] == BOX_ON_TARGET and grid[3, 3] == PLAYER and math.isclose(reward, 10.9)


def test_a_stuck_box_runs_into_the_time_limit_without_success():
    env = gym.make(ENV_ID, max_episode_steps=5)
    env.reset(seed=0)
    env.unwrapped.room = Room(open_room(), (2, 2), (1, 1), (3, 4))  # the box in a corner
    assert solve_room(env.unwrapped.room) is None
    for turn in range(1, 6):
        _, reward, terminated, truncated, info = env.step("left")
        assert not terminated and truncated is (turn == 5)
    assert "is_success" not in info


def test_shallow_search_keeps_the_box_one_push_from_the_target():
    rng = np.random.default_rng(0)
    for _ in range(50):
        room = generate_room(rng, (6, 6), internal_walls=3, search_depth=1)
        assert len(solve_room(room)) == 1


def test_room_size_and_walls_are_options():
    rng = np.random.default_rng(0)
    room = generate_room(rng, (7, 9), internal_walls=0)
    assert room.walls.shape == (7, 9) and room.walls.sum() == 2 * 7 + 2 * 9 - 4
    env = gym.make(ENV_ID, dim_room=[5, 7], internal_walls=1)
    messages, _ = env.reset(seed=0)
    assert len(messages[-1]["content"].splitlines()) == 1 + 5
    for bad in ({"dim_room": (4, 4)}, {"internal_walls": 14}, {"search_depth": 0}):
        with pytest.raises(ValueError):
            SokobanEnv(**bad)


def test_render_draws_the_grid_the_model_sees():
    env = gym.make(ENV_ID, render_mode="ansi")
    messages, _ = env.reset(seed=3)
    assert env.render() == "\n".join(messages[-1]["content"].splitlines()[1:])
    assert SokobanEnv().render() is None


def test_prompt_states_the_legend_and_the_position_line():
    env = gym.make(ENV_ID)
    messages, _ = env.reset(seed=0)
    system = messages[0]["content"]
    for symbol in ("# wall", "_ floor", "O target", "X box", "√ box on the target", "P you"):
        assert symbol in system
    first = messages[-1]["content"].splitlines()[0]
    assert first == (
        "You (P) are at row 2, column 4; the box (X) at row 2, column 3; "
        "the target (O) at row 3, column 1."
    )


def test_spec_json_round_trip_rebuilds_the_env_with_its_options():
    env = gym.make(ENV_ID, internal_walls=0, search_depth=5, history=1)
    rebuilt = gym.make(EnvSpec.from_json(env.spec.to_json()))
    assert rebuilt.reset(seed=4)[0] == env.reset(seed=4)[0]
    assert rebuilt.unwrapped.search_depth == 5


def test_deep_copy_mid_episode_plays_on_alike():
    env = gym.make(ENV_ID)
    env.reset(seed=5)
    env.step("left")
    clone = copy.deepcopy(env)
    for action in ("up", "right", "down", "left"):
        assert clone.step(action)[:4] == env.step(action)[:4]


def test_room_grid_marks_the_player_on_the_target():
    grid = room_grid(Room(open_room(), (2, 2), (1, 1), (2, 2)))
    assert grid[2, 2] == PLAYER_ON_TARGET and grid[1, 1] == BOX
