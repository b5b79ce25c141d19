"""Text envs survive pickle, deepcopy and their spec's JSON: the copy plays like the original.

Every registered ``textgym/`` id is covered (read from the registry, so new ids are too), plus
``TextEnvWrapper`` on a plain Gymnasium env, with default parts and with named parts.
"""

import copy
import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from textgym import JSONActionParser, TextEnvWrapper, register, registered_ids
from textgym.checker import find_text_wrapper
from textgym.envs.calculator import CalculatorReply
from textgym.envs.classic import FrozenLakeFormatter
from textgym.formatters import GenericFormatter
from textgym.spaces import UnicodeText

# Refused by every parser: no JSON, a cut-off object, an empty object, over max_reply_chars.
INVALID_REPLIES = ["I fold", '{"action": ', "{}", "x" * 5000]
# Valid replies for a text action space without a finite set of replies (the calculator).
TEXT_REPLIES = ["Action: calculator(12 * 3)", "Answer: 36"]


def make_registered(env_id):
    try:
        return gym.make(env_id)
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        pytest.skip(f"{env_id} needs an optional dependency that is not installed: {e}")
    except ConnectionError as e:  # textgym/OpenEnv-v0 plays a server (tests/.../test_openenv_*)
        pytest.skip(f"{env_id} needs a server: {e}")


def lake_with_default_parts():
    return TextEnvWrapper(gym.make("FrozenLake-v1"))


def lake_with_named_parts():
    names = ("left", "down", "right", "up")
    return TextEnvWrapper(gym.make("FrozenLake-v1"), FrozenLakeFormatter(), action_names=names)


MAKERS = {
    **{env_id: functools.partial(make_registered, env_id) for env_id in registered_ids()},
    "TextEnvWrapper(FrozenLake-v1)": lake_with_default_parts,
    "TextEnvWrapper(FrozenLake-v1, FrozenLakeFormatter(), names)": lake_with_named_parts,
}


def replies_for(env, n=24):
    """A fixed mix of valid and invalid replies: every fourth one is invalid."""
    text_env = find_text_wrapper(env)
    valid = text_env.reply_choices()
    if valid is None:
        space = copy.deepcopy(text_env.env.action_space)
        space.seed(0)
        samples = [text_env.example_reply(space.sample()) for _ in range(4)]
        valid = [r for r in samples if r is not None]
    valid = valid or [r for r in TEXT_REPLIES if text_env.parse_reply(r)[1] is None]
    assert valid, f"no valid reply to play {env} with"
    return [
        INVALID_REPLIES[i // 4 % len(INVALID_REPLIES)] if i % 4 == 3 else valid[i % len(valid)]
        for i in range(n)
    ]


def plain(value):
    """Numpy values as tagged Python values, so whole transcripts compare with ==."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.tolist())
    if isinstance(value, np.generic):
        return (type(value).__name__, value.item())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def play(env, replies, seed, reset=True):
    """Reply in turn (after a reset with ``seed``); a finished episode resets with seed + 1."""
    transcript = [plain(env.reset(seed=seed))] if reset else []
    for reply in replies:
        messages, reward, terminated, truncated, info = env.step(reply)
        transcript.append(plain((messages, float(reward), terminated, truncated, info)))
        if terminated or truncated:
            seed += 1
            transcript.append(plain(env.reset(seed=seed)))
    return transcript, seed


def pickle_round_trip(env):
    return pickle.loads(pickle.dumps(env))


COPIERS = {"pickle": pickle_round_trip, "deepcopy": copy.deepcopy}


@pytest.mark.parametrize("name", MAKERS)
def test_pickled_env_plays_like_the_original(name):
    env = MAKERS[name]()
    clone = pickle_round_trip(env)
    replies = replies_for(env)
    assert play(clone, replies, seed=7) == play(env, replies, seed=7)


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("name", MAKERS)
def test_copy_made_mid_episode_continues_like_the_original(name, copier):
    """The copy takes the env's whole state (RNG, turns, invalid counts) and shares none."""
    env = MAKERS[name]()
    replies = replies_for(env)
    _, seed = play(env, replies[:6], seed=3)
    clone = COPIERS[copier](env)
    # The clone plays first: had it shared state with env, env would then play differently.
    from_clone = play(clone, replies[6:], seed, reset=False)
    assert play(env, replies[6:], seed, reset=False) == from_clone


@pytest.mark.parametrize("name", MAKERS)
def test_spec_json_round_trip_rebuilds_the_env(name):
    env = MAKERS[name]()
    text = env.spec.to_json()
    spec = EnvSpec.from_json(text)
    assert spec == env.spec
    rebuilt = gym.make(spec)
    assert rebuilt.spec.to_json() == text
    replies = replies_for(env)
    assert play(rebuilt, replies, seed=5) == play(env, replies, seed=5)


@pytest.mark.parametrize("env_id", registered_ids())
def test_pprint_lists_every_registered_id_with_a_printable_spec(env_id):
    make_registered(env_id).spec.to_json()  # no JSON spec, no registry tooling
    assert env_id in gym.pprint_registry(disable_print=True)
    assert gym.spec(env_id).pprint(disable_print=True, print_all=True).startswith(f"id={env_id}")


def test_a_formatter_object_still_works_and_its_importable_name_keeps_the_spec_json():
    labels = GenericFormatter(labels=["total", "dealer", "ace"])
    env = gym.make("textgym/Blackjack-v1", formatter=labels)
    assert env.reset(seed=0)[0][-1]["content"].startswith("Observation:\n- total: 11")
    with pytest.raises(TypeError, match="Object of type GenericFormatter is not JSON serializable"):
        env.spec.to_json()
    assert gym.make(env.spec).reset(seed=0) == env.reset(seed=0)

    named = gym.make("textgym/Blackjack-v1", formatter="textgym.formatters:GenericFormatter")
    assert named.reset(seed=0)[0][-1]["content"] == "Observation: (11, 10, 0)"
    assert gym.make(EnvSpec.from_json(named.spec.to_json())).reset(seed=0) == named.reset(seed=0)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(3, start=-1),
        spaces.Box(-2.0, 2.0, (2,), np.float32),
        spaces.MultiDiscrete([3, 4]),
        spaces.MultiBinary(3),
        spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (1,), np.float32))),
        spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Dict({"x": spaces.Discrete(3)})}),
        UnicodeText(20),
    ],
    ids=lambda space: type(space).__name__,
)
def test_generated_parser_pickles_for_every_space_kind(space):
    parser = JSONActionParser.from_space(space, description="What to do.")
    clone = pickle_round_trip(parser)
    assert clone == parser
    assert clone.model is not parser.model  # generated again, not looked up
    assert clone.instructions() == parser.instructions()
    space.seed(0)
    for _ in range(5):
        reply = parser.example(space.sample())
        assert plain(clone.parse(reply)) == plain(parser.parse(reply))


def test_parser_of_an_importable_model_pickles_by_reference():
    parser = JSONActionParser(CalculatorReply)
    clone = pickle_round_trip(parser)
    assert clone == parser and clone.model is CalculatorReply
    assert clone.parse('{"answer": 3}') == "Answer: 3"


def test_async_vector_env_runs_pickled_envs_in_spawned_workers():
    """Workers unpickle whole envs (not ids): the generated schema is rebuilt in each process."""
    blobs = [pickle.dumps(gym.make("textgym/Blackjack-v1")) for _ in range(2)]
    constructors = [functools.partial(pickle.loads, blob) for blob in blobs]
    results = []
    for envs in (
        gym.vector.SyncVectorEnv(constructors),
        gym.vector.AsyncVectorEnv(constructors, context="spawn"),
    ):
        try:
            observations, _ = envs.reset(seed=5)
            steps = [envs.step([reply, "hit"]) for reply in ("hit", "??", "stick")]
            results.append((observations, [(s[0], s[1].tolist(), s[2].tolist()) for s in steps]))
        finally:
            envs.close()
    assert results[0] == results[1]
    assert results[1][1][1][1][0] == -1.0  # the invalid reply was penalised in the worker


def test_an_env_registered_with_textgym_register_has_a_json_spec():
    register("tests/JsonCart-v0", "CartPole-v1", "Pole angle: {o[2]:.3f}", action_names=("l", "r"))
    try:
        env = gym.make("tests/JsonCart-v0")
        spec = EnvSpec.from_json(env.spec.to_json())
        assert spec == env.spec
        assert gym.make(spec).reset(seed=0) == env.reset(seed=0)
    finally:
        del gym.registry["tests/JsonCart-v0"]
