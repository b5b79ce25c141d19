"""Gymnasium's own tooling on text envs: episode statistics, time limits, vector envs, specs.

tests/textgym/test_vector.py covers batching in sync and async vector envs; this file covers
the wrappers and options people combine with them.
"""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit
from gymnasium.wrappers.vector import RecordEpisodeStatistics as VectorEpisodeStatistics

import textgym  # noqa: F401  (registers the textgym/ ids)

LAKE = "textgym/FrozenLake-v1"
BLACKJACK = "textgym/Blackjack-v1"
# Non-slippery FrozenLake from the start: these moves reach the goal (reward 1).
LAKE_PATH = [f'{{"action": "{a}"}}' for a in ["right", "right", "down", "down", "down", "right"]]


def wrapper_names(env):
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return [*names, type(env).__name__]


def test_record_episode_statistics_counts_invalid_replies_and_their_penalty():
    env = RecordEpisodeStatistics(gym.make(LAKE, is_slippery=False))
    env.reset(seed=0)
    _, reward, *_ = env.step("jump in the lake")
    assert reward == -1.0
    for reply in LAKE_PATH:
        _, _, terminated, truncated, info = env.step(reply)
    assert terminated and info["episode"]["r"] == 0.0 and info["episode"]["l"] == 7
    env.reset(seed=1)
    for _ in range(3):  # max_invalid=3 invalid replies in a row end the episode
        _, _, terminated, truncated, info = env.step("?")
    assert (terminated, truncated) == (False, True)
    assert list(env.return_queue) == [0.0, -3.0] and list(env.length_queue) == [7, 3]


def test_time_limit_truncates_text_episodes_and_invalid_replies_count():
    env = TimeLimit(gym.make(LAKE, is_slippery=False), max_episode_steps=4)
    env.reset(seed=0)
    replies = ['{"action": "left"}', "?", '{"action": "up"}', "?"]  # never leaves the start
    ends = [env.step(reply)[2:4] for reply in replies]
    assert ends == [(False, False)] * 3 + [(False, True)]

    made = gym.make(BLACKJACK, max_episode_steps=1)
    assert made.spec.max_episode_steps == 1
    made.reset(seed=0)
    assert made.step("??")[3] is True  # an invalid reply uses up the only turn
    assert gym.make(made.spec).spec.max_episode_steps == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_episode_statistics(mode):
    envs = VectorEpisodeStatistics(gym.make_vec(BLACKJACK, num_envs=2, vectorization_mode=mode))
    try:
        envs.reset(seed=0)  # sub-env 0 deals 11 against a 10, sub-env 1 deals 20 against a 7
        *_, info = envs.step(['{"action": "stick"}', "??"])
        assert info["_episode"].tolist() == [True, False]
        assert (info["episode"]["r"][0], info["episode"]["l"][0]) == (-1.0, 1)
        *_, info = envs.step(["(sub-env 0 resets)", '{"action": "stick"}'])
        assert info["_episode"].tolist() == [False, True]
        assert (info["episode"]["r"][1], info["episode"]["l"][1]) == (0.0, 2)  # -1 + 1
        assert list(envs.return_queue) == [-1.0, 0.0] and list(envs.length_queue) == [1, 2]
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_same_step_autoreset_keeps_the_final_conversation(mode):
    envs = gym.make_vec(
        BLACKJACK,
        num_envs=2,
        vectorization_mode=mode,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        wrappers=[RecordEpisodeStatistics],
        history=1,
    )
    try:
        first, _ = envs.reset(seed=0)
        observations, rewards, terminated, _, info = envs.step(["stick", "hit"])  # both end
        assert terminated.tolist() == [True, True] and rewards.tolist() == [-1.0, -1.0]
        final = info["final_obs"][1]
        assert [m["role"] for m in final] == ["system", "user", "assistant", "user"]
        assert final[1:3] == [first[1][1], {"role": "assistant", "content": "hit"}]
        assert final[3]["content"] == "Your hand totals 22. The dealer shows a 7."
        assert info["final_info"]["episode"]["l"].tolist() == [1, 1]
        assert [[m["role"] for m in obs] for obs in observations] == [["system", "user"]] * 2
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_from_a_spec_keeps_every_option(mode):
    env = gym.make(LAKE, is_slippery=False, history=1, invalid_penalty=0.5)
    envs = gym.make_vec(env.spec, num_envs=2, vectorization_mode=mode)
    try:
        observations, _ = envs.reset(seed=3)
        assert observations[0] == env.reset(seed=3)[0]
        assert envs.get_attr("history") == (1, 1)
        assert envs.call("reply_choices")[1][0] == '{"action": "left"}'
        _, rewards, *_ = envs.step(["?", LAKE_PATH[0]])
        assert rewards.tolist() == [-0.5, 0.0]
    finally:
        envs.close()


@pytest.mark.parametrize(
    "vector_kwargs", [{"shared_memory": False}, {"context": "spawn"}], ids=["pipes", "spawn"]
)
def test_async_without_shared_memory_or_fork_matches_sync(vector_kwargs):
    # A spawned worker imports the env's entry point ("textgym.registration:make_text_env"),
    # which registers the ids there too: no fork-inherited state is needed.
    results = []
    for mode, kwargs in [("sync", {}), ("async", vector_kwargs)]:
        envs = gym.make_vec(BLACKJACK, num_envs=2, vectorization_mode=mode, vector_kwargs=kwargs)
        try:
            observations, _ = envs.reset(seed=5)
            steps = [envs.step([reply, reply]) for reply in ("hit", "??", "stick")]
            results.append((observations, [(s[0], s[1].tolist()) for s in steps]))
        finally:
            envs.close()
    assert results[0] == results[1]


def test_spec_recreates_a_stack_wrapped_after_make():
    env = RecordEpisodeStatistics(TimeLimit(gym.make(BLACKJACK, history=1), max_episode_steps=5))
    rebuilt = gym.make(env.spec)
    assert wrapper_names(rebuilt) == wrapper_names(env)
    assert rebuilt.spec.max_episode_steps == 5
    assert env.reset(seed=0)[0] == rebuilt.reset(seed=0)[0]  # 11 against a 10
    for reply in ["hit", "??", "stick"]:
        assert env.step(reply)[:4] == rebuilt.step(reply)[:4]
    assert list(env.return_queue) == list(rebuilt.return_queue) == [-2.0]  # -1 invalid, -1 lost
    assert list(rebuilt.length_queue) == [3]


def test_spec_recreates_an_env_with_a_user_formatter_and_parser():
    def parse(reply):
        return int("hit" in reply)

    def describe(obs, info):
        return f"You hold {obs[0]}."

    env = gym.make(BLACKJACK, formatter=describe, parser=parse)
    rebuilt = gym.make(env.spec)
    assert rebuilt.reset(seed=2)[0] == env.reset(seed=2)[0]
    assert rebuilt.reset(seed=2)[0][-1]["content"] == "You hold 6."
    assert np.array_equal(rebuilt.step("I hit")[4]["env_action"], 1)
