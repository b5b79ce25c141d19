"""The hand-written formatters of the classic envs: what the model is told, state by state."""

import gymnasium as gym
import pytest

import textgym  # noqa: F401  (registers the text envs)
from textgym.envs.classic import FrozenLakeSurroundingsFormatter

SURROUNDINGS = "textgym.envs.classic:FrozenLakeSurroundingsFormatter"


def surroundings(state, **kwargs):
    fmt = FrozenLakeSurroundingsFormatter()
    fmt.bind(gym.make("FrozenLake-v1", **kwargs))
    return fmt(state, {}).splitlines()


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            0,
            "The goal is 3 rows down and 3 columns right. Left is the edge (you stay), down is "
            "ice, right is ice, up is the edge (you stay).",
        ),
        (
            4,
            "The goal is 2 rows down and 3 columns right. Left is the edge (you stay), down is "
            "ice, right is a hole, up is ice (the start).",
        ),
        (
            14,
            "The goal is 1 column right. Left is ice, down is the edge (you stay), right is "
            "the goal, up is ice.",
        ),
    ],
)
def test_each_move_is_named_with_what_it_reaches(state, expected):
    assert surroundings(state)[1] == expected


def test_the_map_and_coordinates_stay_those_of_the_plain_formatter():
    lines = surroundings(9)
    assert lines[0].startswith("You are at row 2, column 1")
    assert lines[2:] == ["SFFF", "FHFH", "FPFH", "HFFG"]


def test_on_the_goal_or_a_hole_the_end_is_said_instead():
    assert surroundings(15)[0].endswith("You reached the goal.") and len(surroundings(15)) == 5
    assert "You fell into a hole." in surroundings(5)[0]


def test_any_map_size_and_a_goal_up_and_left_are_worded():
    fmt = FrozenLakeSurroundingsFormatter()
    fmt.bind(gym.make("FrozenLake-v1", desc=["GFF", "FFF", "FFS"]))
    assert fmt(8, {}).splitlines()[1].startswith("The goal is 2 rows up and 2 columns left.")


def test_text_env_takes_it_by_name_and_records_it():
    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, formatter=SURROUNDINGS)
    messages, _ = env.reset(seed=0)
    assert "The goal is 3 rows down and 3 columns right." in messages[-1]["content"]
    assert env.spec.kwargs["formatter"] == SURROUNDINGS
