"""A text env served over OpenEnv's protocol: real servers on localhost, OpenEnv's own client."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import textgym  # noqa: F401 - registers textgym/...

pytest.importorskip("openenv")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from textgym.openenv_server import (  # noqa: E402
    TextAction,
    TextGymEnvironment,
    create_openenv_app,
    running_server,
)

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if json.load(response)["status"] == "healthy":
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no healthy server at {url} within {timeout} s")


@contextlib.contextmanager
def serve_process(env_id: str = "textgym/Blackjack-v1") -> Iterator[tuple[str, Any]]:
    """``textgym serve`` as a real process on a free port, healthy: (its URL, the process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "textgym.cli", "serve", env_id, "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT)
    try:
        wait_healthy(url, process)
        yield url, process
    finally:
        process.kill()
        process.wait(timeout=30)


def test_schema_declares_the_reply_and_the_fields_a_trainer_reads() -> None:
    with running_server("textgym/Blackjack-v1") as url:
        schema = json.load(urllib.request.urlopen(f"{url}/schema"))
    assert schema["action"]["required"] == ["reply"]
    fields = schema["observation"]["properties"]
    for name in ["messages", "terminated", "truncated", "invalid", "parse_error"]:
        assert name in fields
    assert {"valid_replies", "reply_schema", "action_mask", "info"} <= set(fields)


def test_environment_reports_terminated_and_truncated_apart() -> None:
    # FrozenLake's 100-turn limit: an episode of "left" from the start is cut, not ended.
    env = TextGymEnvironment(gym.make("textgym/FrozenLake-v1", is_slippery=False))
    env.reset(seed=0)
    for _ in range(100):
        obs = env.step(TextAction(reply='{"action": "left"}'))
    assert (obs.done, obs.terminated, obs.truncated) == (True, False, True)


def test_action_mask_travels_as_a_declared_field() -> None:
    pytest.importorskip("pettingzoo")
    env = TextGymEnvironment(gym.make("textgym/TicTacToe-v0"))
    first = env.reset(seed=0)
    assert first.action_mask is not None and sum(first.action_mask) == 9
    obs = env.step(TextAction(reply=first.valid_replies[4]))
    assert obs.action_mask is not None and sum(obs.action_mask) == 7  # ours and the opponent's
    assert len(obs.valid_replies) == 7
    assert "action_mask" not in obs.info


def test_refuses_an_env_that_is_not_a_text_env() -> None:
    with pytest.raises(ValueError, match="not.*text env|Expected a text env"):
        create_openenv_app("CartPole-v1")
    with pytest.raises(TypeError, match="needs an env of its own"):
        create_openenv_app(gym.make("textgym/Blackjack-v1"))


@pytest.mark.slow  # a subprocess
def test_openenvs_own_client_plays_a_textgym_serve_process() -> None:
    """``textgym serve`` as a real process; OpenEnv's GenericEnvClient plays an episode."""
    with serve_process() as (url, _):
        local = gym.make("textgym/Blackjack-v1")
        local_messages, _ = local.reset(seed=5)
        with GenericEnvClient(base_url=url).sync() as client:
            result = client.reset(seed=5)
            assert result.observation["messages"] == local_messages
            result = client.step({"reply": '{"action": "stick"}'})
        _, reward, terminated, _, info = local.step('{"action": "stick"}')
        assert (result.reward, result.done) == (reward, terminated)
        assert result.observation["info"]["env_action"] == 0
