"""run_episodes: one loop for single envs, lockstep lists and vector envs; hints when wanted."""

import gymnasium as gym
import pytest

import textgym  # noqa: F401  (registers the textgym/ ids)
from textgym import Episode, Policy, PolicyBase, as_policy, reply_choices, run_episodes

BLACKJACK = "textgym/Blackjack-v1"
STICK, HIT = '{"action": "stick"}', '{"action": "hit"}'


class Short(PolicyBase):
    """Forgets to reply."""

    def act_batch(self, batch, **kwargs):
        return []


class Recorder(PolicyBase):
    """Sticks; remembers the keyword arguments of every call."""

    def __init__(self, wants_choices=False, wants_schemas=False):
        self.wants_choices, self.wants_schemas, self.calls = wants_choices, wants_schemas, []

    def act_batch(self, batch, **kwargs):
        self.calls.append((len(batch), kwargs))
        return [STICK] * len(batch)


@pytest.mark.parametrize(("choices", "schemas"), [(False, False), (True, False), (True, True)])
def test_choices_and_schemas_go_only_to_a_policy_that_wants_them(choices, schemas):
    policy = Recorder(choices, schemas)
    envs = gym.make_vec(BLACKJACK, num_envs=2)
    assert len(list(run_episodes(policy, envs, 4, greedy=True))) == 4
    size, kwargs = policy.calls[0]
    assert size == 2 and kwargs.pop("greedy") is True
    assert kwargs.get("choices") == ([[STICK, HIT]] * 2 if choices else None)
    assert set(kwargs) == {name for name, on in [("choices", choices), ("schemas", schemas)] if on}
    if schemas:
        enums = [schema["properties"]["action"]["enum"] for schema in kwargs["schemas"]]
        assert enums == [["stick", "hit"]] * 2


def test_lockstep_envs_play_the_same_seeded_episodes_as_one_env():
    def policy(messages):  # hit below 17, from the prompt text
        return HIT if "totals 1" in messages[-1]["content"] else STICK

    one = list(run_episodes(policy, gym.make(BLACKJACK), 6, seed=5))
    three = sorted(
        run_episodes(policy, [gym.make(BLACKJACK) for _ in range(3)], 6, seed=5),
        key=lambda e: e.index,
    )
    strip = [(e.seed, e.index, e.episode_return, e.length) for e in one]
    assert strip == [(e.seed, e.index, e.episode_return, e.length) for e in three]
    assert [e.seed for e in one] == list(range(5, 11))
    assert {e.env_index for e in three} == {0, 1, 2}


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_vector_envs_count_a_final_invalid_reply_in_either_autoreset_mode(mode):
    # "hmm" never parses: each episode ends by max_invalid truncation on an invalid reply.
    envs = gym.make_vec(
        BLACKJACK, num_envs=2, vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode(mode)}
    )
    episodes = list(run_episodes(lambda m: "hmm", envs, 4, seed=0))
    assert len(episodes) == 4 and [e.env_index for e in episodes].count(0) == 2
    assert all(e.truncated and e.invalid == e.length >= 1 for e in episodes)
    assert [e.seed for e in episodes if e.index < 2] == [0, 1]  # later ones continue the RNG


def test_steps_are_recorded_on_request():
    (episode,) = run_episodes(lambda m: STICK, gym.make(BLACKJACK), 1, record_steps=True)
    (step,) = episode.steps
    assert step.reply == STICK and step.action == 0 and not step.invalid
    assert [m["role"] for m in step.messages] == ["system", "user"]
    assert step.reward == episode.episode_return
    assert Episode(0, 1.0, 1, 0, None, False) == Episode(0, 1.0, 1, 0, None, False, steps=())


def test_bad_policies_and_arguments_are_explained():
    env = gym.make(BLACKJACK)
    with pytest.raises(ValueError, match="return a list of 1 replies for a batch of 1"):
        list(run_episodes(Short(), env, 1))
    with pytest.raises(TypeError, match="The policy must return the reply as str, got int"):
        list(run_episodes(lambda m: 3, env, 1))
    with pytest.raises(ValueError, match="Expected n_episodes to be an int >= 1, got 0"):
        list(run_episodes(lambda m: STICK, env, 0))
    with pytest.raises(ValueError, match="max_steps applies to single envs"):
        list(run_episodes(lambda m: STICK, gym.make_vec(BLACKJACK, num_envs=1), 1, max_steps=3))


def test_reply_choices_of_envs_without_a_text_wrapper_is_none():
    assert reply_choices(gym.make("Blackjack-v1")) is None
    assert isinstance(as_policy(lambda m: STICK), Policy)


def test_vector_envs_record_dict_actions():
    from gymnasium import spaces

    from textgym import TextEnvWrapper

    class Order(gym.Env):
        observation_space = spaces.Discrete(2)
        action_space = spaces.Dict({"drink": spaces.Discrete(2), "cups": spaces.Discrete(3)})

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return 0, {}

        def step(self, action):
            return 0, 1.0, True, False, {}

    def make():
        return TextEnvWrapper(Order(), formatter="Order {o}.", system_prompt="Serve.")

    envs = gym.vector.SyncVectorEnv([make, make])
    reply = '{"drink": 1, "cups": 2}'
    episodes = list(run_episodes(lambda m: reply, envs, 2, record_steps=True))
    assert [e.steps[0].action for e in episodes] == [{"drink": 1, "cups": 2}] * 2


class SometimesReports(gym.Env):
    """Reports is_success when it terminates, not when its time limit truncates it."""

    def __init__(self):
        self.observation_space = gym.spaces.Discrete(2)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        return 0, {}

    def step(self, action):
        if self.episode % 2:
            return 0, 1.0, True, False, {"is_success": True}
        return 0, 0.0, False, True, {}


def test_an_episode_without_a_success_report_keeps_none_whatever_came_before():
    from textgym import TextEnvWrapper

    env = TextEnvWrapper(SometimesReports(), action_names=["a", "b"])
    episodes = list(run_episodes(lambda m: '{"action": "a"}', env, 4, seed=0))
    assert [(e.success, e.truncated) for e in episodes] == [
        (None, True),
        (True, False),
        (None, True),
        (True, False),
    ]
