import json
import math
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from gymnasium.utils.env_checker import check_env

import textgym
from textgym import check_text_env
from textgym.envs.frozen_lake_random import ACTION_NAMES, CELLS, RandomFrozenLakeEnv

ENV_ID = "textgym/FrozenLakeRandom-v0"
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # left, down, right, up


def reply(action: int) -> str:
    return json.dumps({"action": ACTION_NAMES[action]})


def shortest_path(cells: np.ndarray) -> list[int] | None:
    """Actions from S to G avoiding holes (BFS), or None."""
    size = cells.shape[0]
    parents = {(0, 0): None}
    queue = deque([(0, 0)])
    while queue:
        cell = queue.popleft()
        if CELLS[cells[cell]] == "G":
            actions = []
            while parents[cell] is not None:
                cell, action = parents[cell]
                actions.append(action)
            return actions[::-1]
        if CELLS[cells[cell]] == "H":
            continue
        for action, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in parents:
                parents[nxt] = (cell, action)
                queue.append(nxt)
    return None


def test_registered_with_frozenlakes_turn_limit_and_named_replies():
    env = gym.make(ENV_ID)
    assert env.spec.max_episode_steps == gym.spec("FrozenLake-v1").max_episode_steps == 100
    assert textgym.reply_choices(env) == [reply(a) for a in range(4)]


@pytest.mark.parametrize("slip", [0.0, 2 / 3])
def test_passes_gymnasiums_checker_and_the_text_checker(slip):
    raw = RandomFrozenLakeEnv(slip_probability=slip, render_mode="ansi")
    check_env(raw, skip_render_check=True)  # render: tested below
    assert check_text_env(gym.make(ENV_ID, slip_probability=slip), n_samples=30) == 30


def test_each_reset_seed_gives_a_reproducible_valid_map_and_seeds_differ():
    env, other = RandomFrozenLakeEnv(), RandomFrozenLakeEnv()
    maps = set()
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        assert np.array_equal(obs["map"], other.reset(seed=seed)[0]["map"])
        cells = obs["map"]
        assert cells.shape == (4, 4) and obs["position"] == 0
        assert CELLS[cells[0, 0]] == "S" and CELLS[cells[3, 3]] == "G"
        assert shortest_path(cells) is not None
        maps.add(cells.tobytes())
    assert len(maps) >= 50


@pytest.mark.parametrize("seed", range(8))
def test_a_shortest_path_reaches_the_goal_when_not_slippery(seed):
    env = gym.make(ENV_ID)
    messages, _ = env.reset(seed=seed)
    path = shortest_path(env.unwrapped._map)
    for i, action in enumerate(path):
        messages, reward, terminated, truncated, info = env.step(reply(action))
        assert terminated == (i == len(path) - 1) and not truncated
    assert reward == 1.0 and info["is_success"] is True
    assert "You reached the goal." in messages[-1]["content"]


def test_a_hole_ends_the_episode_as_a_failure():
    env = gym.make(ENV_ID)
    env.reset(seed=0)  # PFHF / FFFF / FFFH / FFFG
    env.step("right")
    messages, reward, terminated, _, info = env.step("right")
    assert terminated and reward == 0.0 and info["is_success"] is False
    assert "You fell into a hole." in messages[-1]["content"]


@pytest.mark.parametrize("slip", [0.0, 0.2, 0.5, 2 / 3, 1.0])
def test_slip_probability_sets_the_transition_probabilities(slip):
    env = RandomFrozenLakeEnv(slip_probability=slip)
    env.reset(seed=2)
    for state in range(16):
        for action in range(4):
            probs: dict[int, float] = {}
            for p, nxt, _, _ in env.lake.P[state][action]:
                probs[nxt] = probs.get(nxt, 0.0) + p
            assert math.isclose(sum(probs.values()), 1.0)
    # From the start (0, 0), "down" moves down (state 4) with 1 - q; it slides left (the edge:
    # state 0) or right (state 1) with q / 2 each.
    probs = {}
    for p, nxt, _, _ in env.lake.P[0][1]:
        probs[nxt] = probs.get(nxt, 0.0) + p
    assert math.isclose(probs.get(4, 0.0), 1 - slip, abs_tol=1e-12)
    assert math.isclose(probs.get(1, 0.0), slip / 2, abs_tol=1e-12)


def test_two_thirds_is_gymnasiums_slippery_lake():
    env = RandomFrozenLakeEnv(slip_probability=2 / 3)
    env.reset(seed=3)
    desc = ["".join(CELLS[c] for c in row) for row in env._map]
    reference = FrozenLakeEnv(desc=desc, is_slippery=True)
    for state in range(16):
        for action in range(4):
            ours, theirs = env.lake.P[state][action], reference.P[state][action]
            assert [t[1:] for t in ours] == [t[1:] for t in theirs]
            assert all(math.isclose(a[0], b[0]) for a, b in zip(ours, theirs, strict=True))


def test_slips_are_frequent_as_set_and_reproducible_from_the_seed():
    def moves(seed):
        env = RandomFrozenLakeEnv(slip_probability=0.5)
        env.reset(seed=seed)
        out = []
        for _ in range(400):
            env.lake.s = 5  # (1, 1); "right" aims at (1, 2)
            out.append(int(env.step(2)[0]["position"]))
        return out

    first = moves(7)
    assert first == moves(7)
    intended = sum(position == 6 for position in first) / len(first)
    assert abs(intended - 0.5) < 4 * math.sqrt(0.25 / 400)


def test_prompt_says_whether_the_ice_is_slippery():
    plain = gym.make(ENV_ID).reset(seed=0)[0][0]["content"]
    slippery = gym.make(ENV_ID, slip_probability=2 / 3).reset(seed=0)[0][0]["content"]
    assert "not slippery" in plain and "probability 0.33" in slippery
    assert "a new lake every game" in plain


def test_spec_json_round_trip_keeps_the_slip_probability():
    env = gym.make(ENV_ID, slip_probability=0.5, history=2)
    rebuilt = gym.make(EnvSpec.from_json(env.spec.to_json()))
    assert rebuilt.unwrapped.slip_probability == 0.5
    assert rebuilt.reset(seed=1)[0] == env.reset(seed=1)[0]


def test_render_and_options():
    env = gym.make(ENV_ID, render_mode="ansi", size=5)
    messages, _ = env.reset(seed=0)
    assert env.render() == "\n".join(messages[-1]["content"].splitlines()[1:])
    assert len(env.render().splitlines()) == 5
    for bad in ({"size": 1}, {"p": 0.0}, {"slip_probability": 1.5}, {"render_mode": "human"}):
        with pytest.raises(ValueError):
            RandomFrozenLakeEnv(**bad)
