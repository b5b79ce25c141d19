"""TrackedVectorEnv: per-env episode/step counts, faults that name the env, replay of env states."""

from __future__ import annotations

import logging
import random

import gymnasium as gym
import numpy as np
import pytest

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym_agents.exceptions import EnvFault
from textgym_agents.ppo.rollout import reply_choices
from textgym_agents.ppo.tracked import TrackedVectorEnv

STICK, HIT = '{"action": "stick"}', '{"action": "hit"}'
REPLIES = [STICK, HIT, '{"action": "left"}', '{"action": "right"}', "no idea", "right!"]


class Faulty(gym.Wrapper):
    """Raises RuntimeError at the env's ``fail_at``-th step (counting every episode) or reset."""

    def __init__(self, env: gym.Env, fail_at: int | None = None, fail_reset: int | None = None):
        super().__init__(env)
        self.fail_at, self.fail_reset = fail_at, fail_reset
        self.total_steps = self.episode = self.step_in_episode = 0
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        if self.resets == self.fail_reset:
            raise RuntimeError("the simulator did not start")
        self.episode += 1
        self.step_in_episode = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.total_steps += 1
        self.step_in_episode += 1
        if self.total_steps == self.fail_at:
            raise RuntimeError("sensor failure")
        return self.env.step(action)


def cartpole(fail_at=None, fail_reset=None, max_invalid=1000):
    """CartPole as text; invalid replies take the default action, so every reply steps it."""
    return TextEnvWrapper(
        Faulty(gym.make("CartPole-v1"), fail_at, fail_reset),
        action_names=["left", "right"],
        on_invalid="default_action",
        default_action=0,
        max_invalid=max_invalid,
    )


def play(envs: TrackedVectorEnv, steps: int, seed: int) -> list:
    """Step with replies drawn from REPLIES; return what the envs said."""
    rng = random.Random(seed)
    trace = []
    for _ in range(steps):
        actions = [rng.choice(REPLIES) for _ in range(envs.num_envs)]
        obs, rewards, terminations, truncations, _ = envs.step(actions)
        trace.append((obs, rewards.tolist(), terminations.tolist(), truncations.tolist()))
    return trace


def test_counts_episodes_and_steps_per_env():
    envs = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    envs.reset(seed=0)
    assert (envs.episodes.tolist(), envs.steps.tolist()) == ([1, 1], [0, 0])
    envs.step([STICK, "hmm"])  # env 0's episode ends; env 1's reply is invalid
    assert (envs.episodes.tolist(), envs.steps.tolist()) == ([1, 1], [1, 1])
    envs.step(["ignored: env 0 resets", "hmm"])
    assert (envs.episodes.tolist(), envs.steps.tolist()) == ([2, 1], [0, 2])
    assert envs.records[0] is not None and envs.records[0]["actions"] == []
    assert envs.records[1]["actions"] == ["hmm", "hmm"] and envs.records[1]["seed"] == 1


def test_forwards_call_so_choice_decoding_still_sees_the_replies():
    envs = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    assert reply_choices(envs) == [[STICK, HIT]] * 2
    assert envs.get_attr("history") == (0, 0)


@pytest.mark.parametrize("env_id", ["textgym/Blackjack-v1", "textgym/CartPole-v1"])
def test_replayed_envs_continue_exactly_like_the_originals(env_id):
    """Mid-episode, just-ended and autoreset envs all come back; later steps agree exactly."""
    original = TrackedVectorEnv(gym.make_vec(env_id, num_envs=4, max_invalid=5))
    original.reset(seed=7)
    play(original, 23, seed=1)
    state = original.state()
    assert state["replay"] is not None
    assert any(state["replay"]["resetting"]) or env_id.endswith("CartPole-v1")
    assert any(len(r["actions"]) > 1 for r in state["replay"]["records"])

    copy = TrackedVectorEnv(gym.make_vec(env_id, num_envs=4, max_invalid=5))
    observations = copy.restore(state)
    assert observations == original.last_obs
    assert copy.episodes.tolist() == original.episodes.tolist()
    assert copy.steps.tolist() == original.steps.tolist()
    assert play(copy, 40, seed=2) == play(original, 40, seed=2)
    assert copy.state() == original.state()


def test_autoreset_rng_state_is_what_the_next_episode_draws_from():
    original = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=1))
    original.reset(seed=3)
    original.step([STICK])  # ends: the next step autoresets from the RNG as it stands
    original.step(["x"])
    record = original.state()["replay"]["records"][0]
    assert "rng" in record and record["actions"] == []
    copy = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=1))
    assert copy.restore(original.state()) == original.last_obs


def test_restore_declines_what_it_cannot_replay(caplog):
    caplog.set_level(logging.WARNING)
    sync = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    sync.reset(seed=0)
    sync.step([HIT, HIT])
    state = sync.state()

    same_step = gym.make_vec(
        "textgym/Blackjack-v1",
        num_envs=2,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    assert TrackedVectorEnv(same_step).restore(state) is None
    assert "SyncVectorEnv (NEXT_STEP autoreset) only, not SyncVectorEnv" in caplog.text

    other_size = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=3))
    assert other_size.restore(state) is None
    assert "3 envs cannot restore the state of 2" in caplog.text

    tampered = {**state, "replay": {**state["replay"], "fingerprints": ["0", "0"]}}
    fresh = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    assert fresh.restore(tampered) is None
    assert "did not reproduce their recorded observations" in caplog.text
    assert fresh.episodes.tolist() == [1, 1]  # counters come back even without a replay


def test_long_episodes_stop_being_recorded():
    envs = TrackedVectorEnv(gym.vector.SyncVectorEnv([cartpole]), max_replay_steps=5)
    envs.reset(seed=0)
    play(envs, 5, seed=0)
    assert len(envs.records[0]["actions"]) == 5
    assert envs.state()["replay"] is not None
    envs.step(["left"])
    assert envs.records[0] is None and envs.state()["replay"] is None


@pytest.mark.filterwarnings("ignore::UserWarning")  # AsyncVectorEnv logs the worker's error
@pytest.mark.parametrize("vectorization", ["single", "sync", "async"])
def test_a_faulty_env_is_named_with_its_episode_and_step(vectorization):
    # CartPole pushed left every step falls after 8-10 steps: step 14 is in the second episode.
    if vectorization == "single":
        envs = TrackedVectorEnv(gym.vector.SyncVectorEnv([lambda: cartpole(fail_at=14)]))
    else:
        fns = [cartpole, cartpole, lambda: cartpole(fail_at=14)]
        vector = gym.vector.SyncVectorEnv if vectorization == "sync" else gym.vector.AsyncVectorEnv
        envs = TrackedVectorEnv(vector(fns))
    index = envs.num_envs - 1
    envs.reset(seed=0)
    with pytest.raises(EnvFault) as caught:
        for _ in range(30):
            envs.step(["left"] * envs.num_envs)
    fault = caught.value
    assert (fault.index, fault.phase) == (index, "step")
    assert fault.episode == 2 and 1 <= fault.step <= 6
    assert str(fault) == (
        f"env {index} raised RuntimeError during step {fault.step} of its episode 2: sensor failure"
    )
    assert isinstance(fault.__cause__, RuntimeError)
    if vectorization != "async":  # the faulty env's own count agrees
        faulty = envs.env.envs[index].env
        assert (faulty.episode, faulty.step_in_episode) == (fault.episode, fault.step)
    envs.close()


@pytest.mark.parametrize("fail_reset", [1, 2])
def test_a_failing_reset_is_named(fail_reset):
    envs = TrackedVectorEnv(
        gym.vector.SyncVectorEnv([cartpole, lambda: cartpole(fail_reset=fail_reset)])
    )
    with pytest.raises(EnvFault) as caught:
        envs.reset(seed=0)
        for _ in range(30):
            envs.step(["left", "left"])
    assert str(caught.value) == (
        f"env 1 raised RuntimeError during reset (starting its episode {fail_reset}): "
        "the simulator did not start"
    )


def test_state_is_json_ready():
    import json

    envs = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    envs.reset(seed=None)  # unseeded: the episodes start from recorded RNG states
    envs.step([STICK, HIT])
    state = envs.state()
    assert json.loads(json.dumps(state)) == state
    assert all("rng" in r for r in state["replay"]["records"])
    assert np.array_equal(envs.resetting, [True, envs.resetting[1]])
