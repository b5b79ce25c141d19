import inspect
from typing import Literal

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field

import textgym
from textgym import TextEnvWrapper, ToolEnv, tool_env

# Non-slippery FrozenLake from the start: right, right, down, down, down, right reaches the goal.
LAKE_PATH = ["right", "right", "down", "down", "down", "right"]


def public_functions(cls):
    """What TRL turns into tools (plus reset/get_reward): public functions of the class."""
    return sorted(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if n[0] != "_")


class Panel(gym.Env):
    """A Dict action space: the tool gets one argument per key."""

    action_space = spaces.Dict(
        {
            "dial": spaces.Discrete(3),
            "force": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "pair": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))),
        }
    )
    observation_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        self.last_action = action
        return 1, float(action["dial"]), True, False, {}


class Bet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(ge=1, le=10, description="Chips to bet.")
    side: Literal["red", "black"] = "red"

    def to_action(self):
        return self.amount - 1 + 10 * (self.side == "black")


def test_only_reset_get_reward_and_the_tool_are_public_methods():
    for env_id in ["textgym/Blackjack-v1", "textgym/Pendulum-v1", "textgym/Calculator-v0"]:
        assert public_functions(tool_env(env_id)) == ["get_reward", "reset", "step"]
    assert public_functions(tool_env("textgym/Taxi-v4", tool_name="drive")) == [
        "drive",
        "get_reward",
        "reset",
    ]


def test_tool_arguments_follow_the_action_schema():
    blackjack = tool_env("textgym/Blackjack-v1")
    signature = inspect.signature(blackjack().step)
    assert list(signature.parameters) == ["action"]
    assert signature.parameters["action"].annotation == Literal["stick", "hit"]
    assert signature.return_annotation is str
    assert blackjack.action_fields == ("action",)
    doc = inspect.getdoc(blackjack.step)
    assert '    action: one of "stick", "hit"' in doc

    pendulum = tool_env("textgym/Pendulum-v1").step
    assert pendulum.__annotations__ == {"torque": float, "return": str}
    assert "torque: number from -2.0 to 2.0. Torque on the pivot, in N·m" in inspect.getdoc(
        pendulum
    )

    panel = tool_env(lambda: TextEnvWrapper(Panel(), action_names={"dial": ["low", "mid", "high"]}))
    hints = panel.step.__annotations__
    assert hints == {
        "dial": Literal["low", "mid", "high"],
        "force": list[float],
        "pair": tuple[int, int],
        "return": str,
    }
    assert "force: a list of 2 × (number from -1.0 to 1.0)" in inspect.getdoc(panel.step)
    game = panel()
    game.reset(seed=0)
    game.step(dial="high", force=[0.5, -0.25], pair=[1, 2])
    action = game.env.unwrapped.last_action
    assert (action["dial"], action["force"].tolist(), action["pair"]) == (2, [0.5, -0.25], (1, 2))
    assert game.get_reward() == 2.0


def test_schema_defaults_become_optional_arguments():
    roulette = tool_env(lambda: TextEnvWrapper(gym.make("FrozenLake-v1"), parser=Bet))
    parameters = inspect.signature(roulette.step).parameters
    assert parameters["amount"].default is inspect.Parameter.empty
    assert parameters["side"].default == "red"
    assert "amount: integer from 1 to 10. Chips to bet." in inspect.getdoc(roulette.step)


def test_parsers_without_a_schema_take_the_reply_text():
    calculator = tool_env("textgym/Calculator-v0", difficulty="add")
    assert calculator.action_fields is None
    assert list(inspect.signature(calculator().step).parameters) == ["reply"]
    assert "Act by calling the `step` tool with your reply as its `reply` argument" in (
        calculator.task
    )
    game = calculator()
    assert game.reset(seed=2).endswith("What is 839 + 305?")
    assert game.step(reply="Thought: add.\nAction: calculator(839 + 305)") == "Observation: 1144"
    # Other arguments reach the parser as JSON, which the calculator's parser also reads.
    result = game.step(answer=1144)
    assert result.endswith("The episode has ended; your return is 1.")
    assert game.replies == ["Thought: add.\nAction: calculator(839 + 305)", '{"answer": 1144}']
    assert (game.rewards, game.terminated, game.get_reward()) == ([0.0, 1.0], True, 1.0)


def test_reset_gives_the_task_without_json_instructions_then_the_observation():
    lake = tool_env("textgym/FrozenLake-v1", is_slippery=False)
    text_env = gym.make("textgym/FrozenLake-v1", is_slippery=False)
    messages, _ = text_env.reset(seed=3)
    system, observation = messages[0]["content"], messages[1]["content"]
    assert "Reply with a JSON object" in system
    task = system.split("\n\nReply with a JSON object")[0]
    assert lake.task == (
        f"{task}\n\nAct by calling the `step` tool; each call returns the next observation, "
        "until the episode ends."
    )
    game = lake()
    assert game.reset(seed=3) == f"{lake.task}\n\n{observation}"
    assert game.seed == 3
    # A dataset row whose prompt already carries the task as a system message.
    row = {"prompt": [{"role": "system", "content": lake.task}, {"role": "user", "content": ""}]}
    assert game.reset(seed=3, **row) == observation


def test_valid_calls_play_the_text_env():
    lake = tool_env("textgym/FrozenLake-v1", is_slippery=False)()
    text_env = gym.make("textgym/FrozenLake-v1", is_slippery=False)
    lake.reset(seed=0)
    text_env.reset(seed=0)
    for move in LAKE_PATH:
        assert not lake.done
        result = lake.step(action=move)
        messages, reward, terminated, *_ = text_env.step(f'{{"action": "{move}"}}')
        assert result.startswith(messages[-1]["content"])
    assert result.endswith("\n\nThe episode has ended; your return is 1.")
    assert lake.rewards == [0.0] * 5 + [1.0]
    assert (lake.terminated, lake.truncated, lake.get_reward()) == (True, False, 1.0)
    assert lake.step(action="left") == "Error: the episode has ended; do not call step again."
    assert len(lake.replies) == 6  # calls after the end do not reach the env


def test_invalid_calls_come_back_as_error_text_and_are_penalised():
    game = tool_env("textgym/Blackjack-v1")()
    game.reset(seed=0)
    fold = game.step(action="fold")
    assert fold.startswith(
        "Your last reply was invalid (invalid action: action: Input should be 'stick' or 'hit')"
    )
    assert fold.endswith("Your hand totals 11. The dealer shows a 10.")
    extra = game.step(action="hit", bet=5)
    assert "bet: Extra inputs are not permitted" in extra
    assert game.rewards == [-1.0, -1.0] and not game.done
    missing = game.step()
    assert "action: Field required" in missing
    # Third invalid call in a row: the text env truncates the episode (max_invalid=3).
    assert game.truncated and missing.endswith("The episode has ended; your return is -3.")
    assert game.get_reward() == -3.0


def test_unfinished_episodes_pay_the_penalty():
    game = tool_env("textgym/Blackjack-v1")()
    with pytest.raises(RuntimeError, match=r"get_reward\(\) was called before reset\(\)"):
        game.get_reward()
    with pytest.raises(RuntimeError, match=r"step\(\) was called before reset\(\)"):
        game.step(action="hit")
    game.reset(seed=0)
    assert game.get_reward() == -1.0  # the text env's invalid_penalty
    cautious = tool_env("textgym/Blackjack-v1", invalid_penalty=0.5)()
    cautious.reset(seed=0)
    assert cautious.get_reward() == -0.5
    lenient = tool_env("textgym/Blackjack-v1", unfinished_penalty=0.0)()
    lenient.reset(seed=0)
    assert lenient.get_reward() == 0.0


def test_same_seed_same_episode():
    blackjack = tool_env("textgym/Blackjack-v1")
    first, second = blackjack(), blackjack()
    assert first.reset(seed=11) == second.reset(seed=11)
    assert first.step(action="hit") == second.step(action="hit")
    assert first.rewards == second.rewards


def test_env_sources_spec_and_callable():
    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, history=1)
    from_spec = tool_env(env.spec)()
    from_spec.reset(seed=0)
    assert from_spec.env.spec == env.spec
    made = tool_env(lambda: TextEnvWrapper(gym.make("Blackjack-v1"), action_names=["s", "h"]))
    assert made.__name__ == "Blackjack_v1_ToolEnv"
    assert made().env is not made().env  # every instance has its own env


def test_each_call_builds_its_own_class():
    # TRL matches environments to their reward column by exact type.
    first, second = tool_env("textgym/Blackjack-v1"), tool_env("textgym/Blackjack-v1")
    assert first is not second and issubclass(first, ToolEnv)
    assert type(first()) is type(first())
    assert textgym.tool_env is tool_env


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"env": gym.make("textgym/Blackjack-v1")}, TypeError, "pass env.spec to make more"),
        ({"env": 3}, TypeError, "Expected an env id, an EnvSpec or a callable, got int"),
        ({"env": lambda: None, "history": 1}, ValueError, "only apply with an env id or spec"),
        ({"tool_name": "_step"}, ValueError, "Expected tool_name to be a public identifier"),
        ({"tool_name": "get_reward"}, ValueError, "tool_name 'get_reward' is taken"),
        ({"tool_name": "env"}, ValueError, "tool_name 'env' is taken"),
        ({"unfinished_penalty": -1.0}, ValueError, "Expected unfinished_penalty >= 0, got -1.0"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, message):
    kwargs = {"env": "textgym/Blackjack-v1", **kwargs}
    with pytest.raises(error, match=message):
        tool_env(**kwargs)


def test_the_base_class_is_not_an_env():
    with pytest.raises(TypeError, match="ToolEnv is a base class"):
        ToolEnv()
