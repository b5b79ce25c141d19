"""record_trajectories: chat datasets of expert or policy turns, with returns, ids and seeds."""

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import textgym
from textgym import TextEnvWrapper, record_trajectories
from textgym.checker import find_text_wrapper
from textgym.recording import COLUMNS

BLACKJACK = "textgym/Blackjack-v1"


def hit_below_17(obs):
    return int(obs[0] < 17)


def test_rows_hold_the_prompts_the_model_saw_and_replies_that_give_the_experts_action():
    dataset = record_trajectories(BLACKJACK, hit_below_17, n_episodes=30, seed=7)
    assert tuple(dataset.column_names) == COLUMNS
    text_env = gym.make(BLACKJACK)
    parser = text_env.get_wrapper_attr("parser")
    base = gym.make("Blackjack-v1")
    rows = iter(dataset)
    for episode in range(30):
        messages, _ = text_env.reset(seed=7 + episode)
        obs, _ = base.reset(seed=7 + episode)
        done, turn, total, turns = False, 0, 0.0, []
        while not done:
            row = next(rows)
            assert (row["episode"], row["turn"], row["seed"]) == (episode, turn, 7 + episode)
            assert row["prompt"] == messages  # exactly what the env showed the model
            assert [m["role"] for m in row["prompt"]] == ["system", "user"]
            ((reply_message),) = row["completion"]
            assert reply_message["role"] == "assistant"
            reply = reply_message["content"]
            assert reply == text_env.get_wrapper_attr("example_reply")(hit_below_17(obs))
            assert parser.parse(reply) == hit_below_17(obs) == json.loads(row["action"])
            assert row["invalid"] is False
            messages, reward, terminated, truncated, _ = text_env.step(reply)
            obs, base_reward, *_ = base.step(hit_below_17(obs))
            assert row["reward"] == reward == base_reward
            total += reward
            turns.append(row)
            done, turn = terminated or truncated, turn + 1
        assert all(r["return"] == total for r in turns)
    assert next(rows, None) is None


def test_history_envs_record_earlier_replies_in_the_prompt():
    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, history=2)
    dataset = record_trajectories(env, lambda obs: 2, n_episodes=1, seed=0)  # always right
    assert len(dataset) > 2
    for previous, row in zip(dataset, dataset.select(range(1, len(dataset))), strict=False):
        assert row["prompt"][-2] == previous["completion"][0]  # the last reply, as sent
        assert row["prompt"][-3]["content"] == previous["prompt"][-1]["content"]
    assert type(find_text_wrapper(env).env).__name__ == "ReportSuccess"  # as it was


def test_continuous_actions_round_trip():
    dataset = record_trajectories(
        "textgym/Pendulum-v1", lambda obs: np.array([0.5], np.float32), n_episodes=1, seed=0
    )
    assert len(dataset) == 200  # the time limit truncates the episode
    assert set(dataset["action"]) == {"[0.5]"}
    parser = gym.make("textgym/Pendulum-v1").get_wrapper_attr("parser")
    np.testing.assert_allclose(parser.parse(dataset[0]["completion"][0]["content"]), [0.5])


def test_top_fraction_keeps_the_best_episodes_by_return():
    every = record_trajectories(BLACKJACK, hit_below_17, n_episodes=20, seed=0)
    best = record_trajectories(BLACKJACK, hit_below_17, n_episodes=20, seed=0, top_fraction=0.25)
    returns = dict(zip(every["episode"], every["return"], strict=True))
    ranked = sorted(returns, key=lambda e: (-returns[e], e))[:5]
    assert sorted(set(best["episode"])) == sorted(ranked)
    assert best.to_list() == [row for row in every.to_list() if row["episode"] in ranked]
    assert min(best["return"]) >= max(r for e, r in returns.items() if e not in ranked)


def test_lockstep_envs_give_the_same_dataset():
    one = record_trajectories(BLACKJACK, hit_below_17, n_episodes=9, seed=1)
    three = record_trajectories(BLACKJACK, hit_below_17, n_episodes=9, seed=1, num_envs=3)
    assert one.to_list() == three.to_list()


class ScriptedPolicy:
    """Replies to a batch at once; every third reply is prose the env cannot parse."""

    wants_choices = True
    wants_schemas = False

    def __init__(self):
        self.calls = []

    def act_batch(self, conversations, *, choices=None, schemas=None, greedy=False):
        self.calls.append((len(conversations), choices))
        return [
            choices[i][1] if len(c[-1]["content"]) % 3 else "Let me think..."
            for i, c in enumerate(conversations)
        ]


def test_policies_reply_in_batches_and_invalid_replies_are_marked():
    policy = ScriptedPolicy()
    dataset = record_trajectories(BLACKJACK, policy, n_episodes=8, seed=0, num_envs=4)
    assert max(size for size, _ in policy.calls) == 4
    assert all(c == [['{"action": "stick"}', '{"action": "hit"}']] * n for n, c in policy.calls)
    invalid = [row for row in dataset if row["invalid"]]
    assert invalid and all(row["action"] is None for row in invalid)
    assert all(row["completion"][0]["content"] == "Let me think..." for row in invalid)
    valid = [row for row in dataset if not row["invalid"]]
    assert valid and all(json.loads(row["action"]) == 1 for row in valid)
    assert sorted(set(dataset["episode"])) == list(range(8))
    # Invalid replies are penalised, and the penalty is part of the return.
    assert all(row["reward"] == -1.0 for row in invalid)
    for episode in range(8):
        rows = [row for row in dataset if row["episode"] == episode]
        assert all(row["return"] == sum(r["reward"] for r in rows) for row in rows)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n_episodes": 0}, ValueError, "Expected n_episodes to be an int >= 1, got 0"),
        ({"top_fraction": 0}, ValueError, "Expected top_fraction in (0, 1] or None, got 0"),
        ({"top_fraction": 1.5}, ValueError, "Expected top_fraction in (0, 1] or None"),
        ({"num_envs": 0}, ValueError, "Expected num_envs to be an int >= 1"),
        ({"seed": 1.5}, ValueError, "Expected seed to be an int or None, got 1.5"),
        ({"expert": 3}, TypeError, "Expected expert to be a function of the env observation"),
        ({"env": "Blackjack-v1"}, ValueError, "Expected an env wrapped by TextEnvWrapper"),
        ({"expert": lambda obs: 5}, ValueError, "not in the action space Discrete(2)"),
        ({"env": gym.make(BLACKJACK), "env_kwargs": {"history": 1}}, ValueError, "env_kwargs"),
    ],
)
def test_bad_arguments_are_explained(kwargs, error, message):
    arguments = {"env": BLACKJACK, "expert": hit_below_17, "n_episodes": 2, **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        record_trajectories(**arguments)


def test_an_env_that_cannot_write_replies_needs_a_policy():
    env = TextEnvWrapper(gym.make("Blackjack-v1"), parser=lambda reply: int("hit" in reply))
    with pytest.raises(ValueError, match="cannot write a reply for the expert's action 1"):
        record_trajectories(env, lambda obs: 1, n_episodes=1)
    assert type(env.env).__name__ != "_LastObservation"  # the env is left as it was


def test_datasets_is_imported_only_when_recording():
    code = (
        "import sys, textgym; assert 'datasets' not in sys.modules\n"
        "sys.modules['datasets'] = None\n"
        "try:\n"
        "    textgym.record_trajectories('textgym/Blackjack-v1', lambda obs: 0, 1)\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "install it with: pip install datasets" in result.stdout
    assert textgym.record_trajectories is record_trajectories
