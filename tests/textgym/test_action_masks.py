"""State-dependent valid replies: ``TextEnvWrapper(action_mask=True)`` on a Gymnasium env."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from textgym import TextEnvWrapper, check_text_env, reply_choices, reply_schemas, run_episodes
from textgym.action_masks import ActionMasking, masked_schema
from textgym.parsers import JSONActionParser

TAXI_ACTIONS = ("south", "north", "east", "west", "pickup", "dropoff")


def taxi(**options):
    return TextEnvWrapper(gym.make("Taxi-v4"), action_names=TAXI_ACTIONS, **options)


def legal_names(mask):
    return [TAXI_ACTIONS[a] for a in np.flatnonzero(mask)]


def reply(name):
    return f'{{"action": "{name}"}}'


def test_valid_replies_follow_taxis_action_mask_every_step():
    env = taxi(action_mask=True)
    _, info = env.reset(seed=0)
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(40):
        mask = info["action_mask"]
        assert env.reply_choices() == [reply(n) for n in legal_names(mask)]
        assert np.array_equal(env.action_masks(), mask)
        sizes.add(len(env.reply_choices()))
        _, _, terminated, truncated, info = env.step(rng.choice(env.reply_choices()))
        assert not info["invalid"]
        if terminated or truncated:
            _, info = env.reset()
    assert len(sizes) > 1  # the set changed with the state


def test_an_illegal_reply_is_penalised_recorded_and_leaves_the_env_unstepped():
    env = taxi(action_mask=True)
    _, info = env.reset(seed=0)
    illegal = [n for n in TAXI_ACTIONS if n not in legal_names(info["action_mask"])]
    state = env.unwrapped.s
    messages, reward, terminated, truncated, info = env.step(f"I will go {illegal[0]}")
    assert (reward, terminated, truncated) == (-1.0, False, False)
    assert info["invalid"] and info["invalid_count"] == 1
    assert info["illegal_action"] == TAXI_ACTIONS.index(illegal[0])
    legal = ", ".join(legal_names(info["action_mask"]))
    assert info["parse_error"] == (
        f'the action "{illegal[0]}" is not legal now; the legal actions are: {legal}'
    )
    assert info["parse_error"] in messages[-1]["content"]
    assert env.unwrapped.s == state  # the env did not move
    assert env.parse_reply(reply(illegal[0])) == (None, info["parse_error"])


def test_without_the_flag_every_action_stays_valid():
    env = taxi()
    _, info = env.reset(seed=0)
    assert "action_mask" in info and not info["action_mask"].all()  # Taxi gives one anyway
    assert len(env.reply_choices()) == 6 and env.action_masks() is None
    illegal = [n for n in TAXI_ACTIONS if n not in legal_names(info["action_mask"])][0]
    assert not env.step(reply(illegal))[4]["invalid"]


def test_the_reply_schema_allows_only_the_legal_replies():
    env = taxi(action_mask=True)
    _, info = env.reset(seed=0)
    schema = env.reply_schema()
    assert schema == {"enum": [{"action": n} for n in legal_names(info["action_mask"])]}
    assert taxi().reply_schema()["properties"]["action"]["enum"] == list(TAXI_ACTIONS)
    assert masked_schema(["not json"]) is None


def test_default_action_mode_takes_a_legal_action_when_the_default_is_masked():
    env = taxi(action_mask=True, on_invalid="default_action", default_action=4)  # pickup
    _, info = env.reset(seed=0)
    assert not info["action_mask"][4]
    first_legal = int(np.flatnonzero(info["action_mask"])[0])
    _, reward, _, _, info = env.step("nonsense")
    assert info["env_action"] == first_legal
    assert reward == -1.0 - 1.0  # Taxi's step cost and the penalty


class DictMaskEnv(gym.Env):
    """The mask in the observation (PettingZoo's layout): action k is legal after state k."""

    observation_space = spaces.Dict(
        {"observation": spaces.Discrete(3), "action_mask": spaces.Box(0, 1, (3,), np.int8)}
    )
    action_space = spaces.Discrete(3)

    def _obs(self):
        mask = np.ones(3, dtype=np.int8)
        mask[self.state] = 0
        return {"observation": self.state, "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = 0
        return self._obs(), {}

    def step(self, action):
        self.state = int(action)
        return self._obs(), 1.0, False, False, {}


def test_a_mask_in_the_observation_is_read_and_put_in_info():
    env = TextEnvWrapper(DictMaskEnv(), action_mask=True)
    _, info = env.reset(seed=0)
    assert info["action_mask"].tolist() == [0, 1, 1]
    assert env.reply_choices() == ['{"action": 1}', '{"action": 2}']
    _, _, _, _, info = env.step('{"action": 2}')
    assert env.reply_choices() == ['{"action": 0}', '{"action": 1}']
    assert env.step('{"action": 2}')[4]["invalid"]
    check_text_env(TextEnvWrapper(DictMaskEnv(), action_mask=True), n_samples=5)


def test_bad_setups_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="action_mask=True needs a Discrete action space, got Box"):
        TextEnvWrapper(gym.make("Pendulum-v1"), action_mask=True)
    with pytest.raises(TypeError, match="Expected action_mask to be a bool, got 'yes'"):
        taxi(action_mask="yes")
    env = TextEnvWrapper(gym.make("FrozenLake-v1"), action_mask=True)
    with pytest.raises(ValueError, match=r"the env gave no action mask in info\['action_mask'\]"):
        env.reset(seed=0)
    masking = ActionMasking(spaces.Discrete(3), JSONActionParser.from_space(spaces.Discrete(3)))
    with pytest.raises(ValueError, match=r"Expected an action mask of shape \(3,\)"):
        masking.update(0, {"action_mask": np.ones(4)})


class ListsUnreadableChoices(JSONActionParser):
    """A broken parser: it offers a choice it cannot parse back."""

    def choices(self):
        return [*super().choices(), "pass"]


def test_a_parser_whose_choices_do_not_parse_back_is_refused_when_replies_are_asked_for():
    space = spaces.Discrete(3)
    masking = ActionMasking(space, ListsUnreadableChoices.from_space(space))
    masking.update(0, {"action_mask": np.array([1, 0, 1], dtype=np.int8)})
    with pytest.raises(ValueError, match="could not read its choice 'pass' back"):
        masking.choices()  # not every choice, illegal ones included, without a word


def test_vector_envs_list_each_envs_legal_replies_of_its_own_state():
    envs = gym.vector.SyncVectorEnv([lambda: taxi(action_mask=True) for _ in range(3)])
    _, infos = envs.reset(seed=[0, 1, 2])
    choices = reply_choices(envs)
    for i in range(3):
        assert choices[i] == [reply(n) for n in legal_names(infos["action_mask"][i])]
    assert reply_schemas(envs)[0]["enum"] == [
        {"action": n} for n in legal_names(infos["action_mask"][0])
    ]


class ChoosingPolicy:
    """A textgym Policy that picks a random listed choice and records the lists."""

    wants_choices, wants_schemas = True, False

    def __init__(self):
        self.rng, self.seen = np.random.default_rng(0), []

    def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        self.seen.extend(choices)
        return [str(self.rng.choice(c)) for c in choices]


@pytest.mark.parametrize("vector", [False, True])
def test_the_episode_runner_asks_for_the_replies_every_step(vector):
    policy = ChoosingPolicy()
    if vector:
        env = gym.vector.SyncVectorEnv(
            [lambda: gym.wrappers.TimeLimit(taxi(action_mask=True), 30) for _ in range(2)]
        )
    else:
        env = gym.wrappers.TimeLimit(taxi(action_mask=True), 30)
    episodes = list(run_episodes(policy, env, 4, seed=0))
    assert sum(e.invalid for e in episodes) == 0
    assert len({len(c) for c in policy.seen}) > 1  # the lists changed within episodes
