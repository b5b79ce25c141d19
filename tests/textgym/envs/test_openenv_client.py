"""Any OpenEnv server as a Gymnasium text env: real servers on localhost, one session per env."""

from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import textgym  # noqa: F401 - registers textgym/...

pytest.importorskip("openenv")

from openenv.core.env_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

from tests.textgym.test_openenv_server import serve_process  # noqa: E402
from textgym.envs.openenv_client import (  # noqa: E402
    OpenEnvCapacityError,
    OpenEnvEnv,
    OpenEnvError,
    OpenEnvSession,
    OpenEnvTextEnv,
    model_from_schema,
)
from textgym.openenv_server import running_server  # noqa: E402
from textgym.recording import plain_json  # noqa: E402
from textgym.wrappers import TextEnvWrapper  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HIT, STICK = '{"action": "hit"}', '{"action": "stick"}'


def play(env: gym.Env[Any, Any], seed: int, replies: list[str]) -> list[tuple[Any, ...]]:
    """Reset with ``seed``, then send ``replies`` until the episode ends: every step's outcome."""
    messages, info = env.reset(seed=seed)
    trace: list[tuple[Any, ...]] = [(messages, plain_json(info))]
    for reply in replies:
        messages, reward, terminated, truncated, info = env.step(reply)
        trace.append((messages, reward, terminated, truncated, plain_json(info)))
        if terminated or truncated:
            break
    return trace


@pytest.fixture(scope="module")
def blackjack_url():
    with running_server("textgym/Blackjack-v1", max_sessions=4) as url:
        yield url


def test_a_served_episode_matches_the_local_env(blackjack_url: str) -> None:
    """Same seed, same replies (an invalid one included): same messages, rewards and info."""
    local = gym.make("textgym/Blackjack-v1")
    remote = gym.make("textgym/OpenEnv-v0", base_url=blackjack_url)
    assert isinstance(remote.unwrapped, OpenEnvTextEnv)
    # Before any reset too (from the session's state): a trainer picks its decoding from them.
    assert textgym.reply_choices(remote) == textgym.reply_choices(local) is not None
    assert textgym.reply_schemas(remote) == textgym.reply_schemas(local) is not None
    for seed in range(5):
        replies = ["I fold", HIT, "hit me, maybe", HIT, STICK]
        assert play(remote, seed, replies) == play(local, seed, replies)
    assert remote.unwrapped.reply_choices() == textgym.reply_choices(local)
    remote.close()


def test_invalid_replies_are_penalised_by_the_served_env(blackjack_url: str) -> None:
    remote = gym.make("textgym/OpenEnv-v0", base_url=blackjack_url)
    remote.reset(seed=0)
    messages, reward, terminated, truncated, info = remote.step("<script>1</script>")
    assert (reward, terminated, truncated, info["invalid"]) == (-1.0, False, False, True)
    assert "no JSON object" in info["parse_error"]
    assert "no JSON object" in messages[-1]["content"]  # the model is told why
    remote.close()


def test_truncation_and_the_action_mask_come_back_as_in_gymnasium() -> None:
    pytest.importorskip("pettingzoo")
    with running_server("textgym/TicTacToe-v0") as url:
        remote = gym.make("textgym/OpenEnv-v0", base_url=url)
        _, info = remote.reset(seed=1)
        local = gym.make("textgym/TicTacToe-v0")
        _, local_info = local.reset(seed=1)
        assert np.array_equal(info["action_mask"], local_info["action_mask"])
        assert info["action_mask"].dtype == np.int8
        reply = remote.unwrapped.reply_choices()[0]
        _, _, _, _, info = remote.step(reply)
        _, _, _, _, local_info = local.step(reply)
        assert np.array_equal(info["action_mask"], local_info["action_mask"])
        remote.close()
    with running_server("textgym/FrozenLake-v1", is_slippery=False) as url:
        remote = gym.make("textgym/OpenEnv-v0", base_url=url)
        remote.reset(seed=0)
        for _ in range(100):
            _, _, terminated, truncated, _ = remote.step('{"action": "left"}')
        assert (terminated, truncated) == (False, True)
        remote.close()


def test_concurrent_clients_each_get_their_own_env_and_one_more_is_refused(
    blackjack_url: str,
) -> None:
    replies = [HIT, HIT, STICK]
    expected = [play(gym.make("textgym/Blackjack-v1"), seed, replies) for seed in range(4)]
    remotes = [gym.make("textgym/OpenEnv-v0", base_url=blackjack_url) for _ in range(4)]
    barrier = threading.Barrier(4)

    def episode(k: int) -> list[tuple[Any, ...]]:
        barrier.wait()
        return play(remotes[k], k, replies)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(episode, range(4))) == expected
    with pytest.raises(OpenEnvCapacityError, match="full"):
        gym.make("textgym/OpenEnv-v0", base_url=blackjack_url)
    remotes[0].close()
    deadline = time.monotonic() + 10
    while True:  # the server frees the slot once it has seen the session close
        try:
            one_more = gym.make("textgym/OpenEnv-v0", base_url=blackjack_url)
            break
        except OpenEnvCapacityError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert play(one_more, 0, replies) == expected[0]
    for env in [*remotes[1:], one_more]:
        env.close()


@pytest.mark.slow  # a subprocess
def test_a_server_killed_mid_episode_raises_a_clear_error() -> None:
    with serve_process() as (url, process):
        remote = gym.make("textgym/OpenEnv-v0", base_url=url, timeout_s=10)
        remote.reset(seed=0)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        start = time.monotonic()
        with pytest.raises(OpenEnvError, match="closed the session|did not answer"):
            remote.step(HIT)
        assert time.monotonic() - start < 10


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:  # accepts TCP connections, never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(OpenEnvError):
            OpenEnvSession(url, timeout_s=0.5).reset(seed=0)
        with pytest.raises(OpenEnvError, match="No OpenEnv schema"):
            OpenEnvSession(url, timeout_s=0.5).schema()
        assert time.monotonic() - start < 10


def test_a_reply_that_is_not_chat_messages_is_refused() -> None:
    env = OpenEnvTextEnv.__new__(OpenEnvTextEnv)
    with pytest.raises(OpenEnvError, match="not chat messages"):
        env._read({"observation": {"messages": [{"role": "user", "content": 3}]}}, stepped=False)


# --- a server nobody here wrote: a structured OpenEnv env ------------------------------------


class GuessAction(Action):
    guess: int = Field(ge=1, le=8, description="Your guess, 1 to 8")


class GuessObservation(Observation):
    hint: str = ""
    attempts: int = 0


class GuessTheNumber(Environment[GuessAction, GuessObservation, State]):
    """A number from 1 to 8 to guess, with higher/lower hints: OpenEnv's API, written by hand."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self.secret, self.attempts = State(), 0, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any):
        self.secret = int(np.random.default_rng(seed).integers(1, 9))
        self.attempts = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(hint="Guess a number from 1 to 8.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any):
        self.attempts += 1
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(hint="Right!", attempts=self.attempts, reward=1.0, done=True)
        hint = "higher" if action.guess < self.secret else "lower"
        return GuessObservation(hint=hint, attempts=self.attempts, reward=0.0, done=False)

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def guess_url():
    import uvicorn

    app = create_fastapi_app(GuessTheNumber, GuessAction, GuessObservation, max_concurrent_envs=2)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=30)


def test_a_structured_server_gets_a_parser_from_its_action_schema(guess_url: str) -> None:
    env = gym.make("textgym/OpenEnv-v0", base_url=guess_url)
    assert isinstance(env.unwrapped, OpenEnvEnv) and isinstance(env.env.env, TextEnvWrapper)
    messages, _ = env.reset(seed=3)
    assert '"guess"' in messages[0]["content"]  # the reply format, from the server's schema
    assert "Guess a number from 1 to 8." in messages[-1]["content"]
    secret = int(np.random.default_rng(3).integers(1, 9))
    low = 1 if secret > 1 else 2
    messages, reward, terminated, _, info = env.step(f'{{"guess": {low}}}')
    assert info["env_action"] == {"guess": low}
    assert (reward, terminated) == (0.0, False) and "attempts" in messages[-1]["content"]
    # Invalid here, never sent: the server's attempt count does not move.
    for bad in ["no idea", '{"guess": 9}', '{"guess": 2, "cheat": true}']:
        _, reward, terminated, _, info = env.step(bad)
        assert (info["invalid"], reward, terminated) == (True, -1.0, False)
    _, reward, terminated, _, info = env.step(f'{{"guess": {secret}}}')
    assert (reward, terminated, info["invalid"]) == (1.0, True, False)
    env.close()


def test_the_action_model_follows_the_json_schema() -> None:
    schema = GuessAction.model_json_schema()
    model = model_from_schema(schema, skip=("metadata",))
    assert model(guess=3).model_dump() == {"guess": 3}
    nested = model_from_schema(
        {
            "type": "object",
            "required": ["move"],
            "$defs": {"Pos": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "properties": {
                "move": {"enum": ["up", "down"]},
                "to": {"$ref": "#/$defs/Pos"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            },
        }
    )
    value = nested.model_validate({"move": "up", "to": {"x": 2}, "tags": ["a"]})
    assert value.model_dump() == {"move": "up", "to": {"x": 2}, "note": None, "tags": ["a"]}
    bad_values = [{"move": "left"}, {"move": "up", "extra": 1}, {"move": "up", "tags": [1]}]
    for bad in [*bad_values, {"move": "up", "tags": ["long"]}]:
        with pytest.raises(ValueError):
            nested.model_validate(bad)


def test_a_served_env_is_the_same_tool_for_trl_as_the_local_one(blackjack_url: str) -> None:
    served = textgym.tool_env("textgym/OpenEnv-v0", base_url=blackjack_url)
    local = textgym.tool_env("textgym/Blackjack-v1")
    assert (served.task, served.action_fields) == (local.task, local.action_fields)
    assert served.unfinished_penalty == local.unfinished_penalty == 1.0
    assert served.step.__doc__ == local.step.__doc__
    game, reference = served(), local()
    assert game.reset(seed=2) == reference.reset(seed=2)
    for action in ["jump", "hit", "stick"]:
        assert game.step(action=action) == reference.step(action=action)
    assert game.get_reward() == reference.get_reward()
    game.env.close()
