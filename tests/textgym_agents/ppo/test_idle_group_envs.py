"""Idle members of a seed-shared group reply legally in their throwaway episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym_agents import Generation, RolloutBuffer
from textgym_agents.ppo.groups import GroupRolloutCollector
from textgym_agents.ppo.tracked import TrackedVectorEnv


class FirstOrLast:
    """A scripted policy: the first valid reply in even rows, the last in odd ones, so the two
    members of a group play different games (of different lengths)."""

    wants_choices, wants_schemas = True, False

    def generate(self, batch, choices=None, **_):
        texts = [c[-1] if k % 2 else c[0] for k, c in enumerate(choices)]
        return Generation([[1]] * len(batch), [[2]] * len(batch), texts)

    def encode(self, messages):
        return [1]


class Alternating(gym.Env):
    """Legal moves alternate a, b, a, ...; the episode ends after ``length`` moves."""

    def __init__(self, length):
        self.length = length
        self.observation_space = gym.spaces.Discrete(length + 1)
        self.action_space = gym.spaces.Discrete(2)

    def _info(self):
        return {"action_mask": np.array([self.t % 2 == 0, self.t % 2 == 1], dtype=np.int8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.t, self._info()

    def step(self, action):
        self.t += 1
        return self.t, 1.0, self.t >= self.length, False, self._info()


def test_idle_group_envs_send_a_reply_that_is_legal_in_their_state():
    """An ended env replays a reply into a throwaway episode; under an action mask its last
    reply can be illegal there, and an env that raises on invalid replies stopped the rollout."""

    def make(length):
        env = Alternating(length)
        return lambda: TextEnvWrapper(env, action_names=["a", "b"], action_mask=True,
                                      on_invalid="raise")  # fmt: skip

    envs = TrackedVectorEnv(gym.vector.SyncVectorEnv([make(2), make(6)]))
    collector = GroupRolloutCollector(envs, seed=0, group_size=2)
    buffer = RolloutBuffer()
    collector.collect(FirstOrLast(), 6, buffer)  # env 0 idles 4 steps of each round
    assert collector.rounds == 1 and len(buffer) == 2 + 6
