"""Reverse curriculum (start states near the goal, promotion, the hand-over to true resets) and
exploring starts (start states anywhere)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import textgym  # noqa: F401  (registers the text envs)
from textgym.curriculum import (
    CurriculumProgress,
    ExploringStarts,
    ReverseCurriculum,
    goal_distances,
)

RIGHT, DOWN = 2, 1


def lake(**kwargs):
    return gym.make("FrozenLake-v1", is_slippery=False, **kwargs)


def test_frozen_lake_distances_are_shortest_paths_and_skip_holes_and_goal():
    base = lake().unwrapped
    distances, goals = goal_distances(base.P, base.initial_state_distrib)
    assert goals == {15}
    # SFFF / FHFH / FFFH / HFFG: the holes 5, 7, 11, 12 and the goal have no distance.
    assert set(distances) == set(range(16)) - {5, 7, 11, 12, 15}
    assert distances[0] == 6 and distances[14] == 1 and distances[10] == 2 and distances[3] == 5


def test_cliff_walking_goal_and_unreachable_cliff():
    base = gym.make("CliffWalking-v1").unwrapped
    distances, goals = goal_distances(base.P, base.initial_state_distrib)
    assert goals == {47}
    assert distances[36] == 13  # the start: up, 11 x right, down
    assert not set(range(37, 47)) & set(distances)  # the cliff is never stood on


def test_level_one_starts_one_move_from_goal_and_right_reaches_it():
    env = ReverseCurriculum(lake(), CurriculumProgress(window=100))
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert obs == 14 and info["curriculum_level"] == 1
        assert env.unwrapped.s == 14
        assert env.step(RIGHT)[1:3] == (1.0, True)


def test_starts_are_uniform_over_states_within_the_level_and_follow_the_seed():
    env = ReverseCurriculum(lake(), CurriculumProgress(level=3))
    starts = {env.reset(seed=seed)[0] for seed in range(300)}
    assert starts == {s for s, d in env.distances.items() if d <= 3}
    again = ReverseCurriculum(lake(), CurriculumProgress(level=3))
    assert [again.reset(seed=s)[0] for s in range(10)] == [env.reset(seed=s)[0] for s in range(10)]


def test_successes_promote_failures_do_not():
    progress = CurriculumProgress(window=4, promote_at=0.5)
    env = ReverseCurriculum(lake(), progress)
    for _ in range(4):
        env.reset()
        env.step(RIGHT)  # goal
    assert progress.level == 2
    failing = CurriculumProgress(window=4, promote_at=0.5)
    env = ReverseCurriculum(lake(), failing)
    for _ in range(8):
        env.reset()
        env.step(DOWN)  # from 14, down stays in 14: the episode goes on; the next reset cuts it
    assert failing.level == 1 and list(failing.outcomes) == [False] * 4


def test_a_failing_window_moves_the_start_forward_again_but_not_past_level_one():
    progress = CurriculumProgress(window=2, promote_at=0.5, demote_below=0.25, level=2)
    progress.record(False, level=2)
    progress.record(False, level=2)
    assert progress.level == 1 and not progress.outcomes
    progress.record(False, level=1)
    progress.record(False, level=1)
    assert progress.level == 1
    kept = CurriculumProgress(window=2, promote_at=0.5, level=2)  # demote_below 0: never
    kept.record(False, level=2)
    kept.record(False, level=2)
    assert kept.level == 2 and list(kept.outcomes) == [False, False]


def test_time_limit_cut_counts_as_failure():
    progress = CurriculumProgress(window=2, promote_at=0.5)
    env = gym.wrappers.TimeLimit(ReverseCurriculum(lake(), progress), max_episode_steps=1)
    env.reset(seed=0)
    assert env.step(DOWN)[3]  # truncated outside the curriculum
    env.reset(seed=1)
    assert list(progress.outcomes) == [False]


def test_episodes_started_before_a_promotion_do_not_count_towards_the_new_level():
    progress = CurriculumProgress(window=1)
    first, second = ReverseCurriculum(lake(), progress), ReverseCurriculum(lake(), progress)
    first.reset(seed=0)
    second.reset(seed=0)
    first.step(RIGHT)  # promotes to level 2
    assert progress.level == 2
    second.step(RIGHT)  # started at level 1
    assert progress.level == 2 and not progress.outcomes


def test_past_the_farthest_state_episodes_start_where_the_env_starts_them():
    progress = CurriculumProgress(window=1, level=7)
    env = ReverseCurriculum(lake(), progress)
    obs, info = env.reset(seed=0)
    assert obs == 0 and info["curriculum_level"] == 0
    for action in (RIGHT, RIGHT, DOWN, DOWN, DOWN, RIGHT):
        env.step(action)
    assert progress.level == 7 and not progress.outcomes  # nothing recorded after the end


def test_with_demotion_failing_from_the_env_start_brings_the_curriculum_back():
    progress = CurriculumProgress(window=2, demote_below=0.25, level=7)
    env = ReverseCurriculum(lake(), progress)
    for seed in range(2):
        obs, info = env.reset(seed=seed)
        assert obs == 0 and info["curriculum_level"] == 0
        env.step(0)  # left into the edge: the episode goes on, cut by the next reset
    env.reset(seed=2)
    assert progress.level == 6  # two failures from the env's own start
    assert env.reset(seed=3)[1]["curriculum_level"] == 6


def test_progress_state_round_trips():
    progress = CurriculumProgress(window=3, promote_at=1.0, level=2)
    progress.record(True, level=2)
    restored = CurriculumProgress(window=3, promote_at=1.0)
    restored.load_state_dict(progress.state_dict())
    restored.record(True, level=2)
    restored.record(True, level=2)
    assert restored.level == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window"),
        ({"promote_at": 0.0}, "promote_at"),
        ({"demote_below": 0.5}, "demote_below"),
        ({"level": 0}, "level"),
    ],
)
def test_bad_progress_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CurriculumProgress(**kwargs)


@pytest.mark.parametrize("wrapper", [ReverseCurriculum, ExploringStarts])
def test_env_without_a_model_is_refused(wrapper):
    with pytest.raises(TypeError, match=f"{wrapper.__name__} needs a tabular"):
        wrapper(gym.make("CartPole-v1"))


def test_exploring_starts_cover_every_state_that_reaches_the_goal_and_follow_the_seed():
    env = ExploringStarts(lake())
    starts = [env.reset(seed=seed)[0] for seed in range(400)]
    assert set(starts) == set(env.starts) == set(ReverseCurriculum(lake()).distances)
    assert 0 in env.starts  # the env's own start is one of them
    obs, _ = env.reset(seed=7)
    assert env.unwrapped.s == obs
    counts = [starts.count(s) for s in set(starts)]
    assert min(counts) > 400 / len(counts) / 2  # uniform, not near-the-goal first
    again = ExploringStarts(lake())
    assert [again.reset(seed=s)[0] for s in range(10)] == starts[:10]


def test_exploring_starts_are_the_curriculum_fixed_at_its_farthest_level():
    """The same draw as a curriculum at the farthest level: runs of either start alike."""
    spread = ReverseCurriculum(lake(), CurriculumProgress(level=6, promote_at=1.0))
    exploring = ExploringStarts(lake())
    seeds = range(50)
    assert [exploring.reset(seed=s)[0] for s in seeds] == [spread.reset(seed=s)[0] for s in seeds]


def test_cliff_walking_starts_never_on_the_cliff():
    env = ExploringStarts(gym.make("CliffWalking-v1"))
    starts = {env.reset(seed=seed)[0] for seed in range(500)}
    assert 36 in starts and not starts & set(range(37, 48))


def test_text_env_with_exploring_starts_shows_where_it_starts():
    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, exploring_starts=True)
    firsts = {env.reset(seed=s)[0][-1]["content"].splitlines()[0] for s in range(40)}
    own_start = "You are at row 0, column 0 (P on the map; rows and columns count from 0)."
    assert len(firsts) > 5 and own_start in firsts


def test_curriculum_and_exploring_starts_together_are_refused():
    with pytest.raises(ValueError, match="one of reverse_curriculum and exploring_starts"):
        gym.make("textgym/FrozenLake-v1", reverse_curriculum=True, exploring_starts=True)


def test_text_env_copies_share_one_progress_and_show_the_start_state():
    progress = CurriculumProgress(window=2)
    envs = gym.make_vec(
        "textgym/FrozenLake-v1", num_envs=2, is_slippery=False, reverse_curriculum=progress
    )
    messages, info = envs.reset(seed=[0, 1])
    assert list(info["curriculum_level"]) == [1, 1]
    assert "row 3, column 2" in messages[0][-1]["content"]
    envs.step(['{"action": "right"}'] * 2)  # both reach the goal: one window, one promotion
    assert progress.level == 2
    envs.close()


def test_text_env_without_the_option_starts_at_the_env_start():
    messages, info = gym.make("textgym/FrozenLake-v1", is_slippery=False).reset(seed=0)
    assert "row 0, column 0" in messages[-1]["content"] and "curriculum_level" not in info
