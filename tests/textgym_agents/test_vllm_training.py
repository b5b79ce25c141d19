"""Training with rollouts on a vLLM server the policy starts itself, and what a killed one does.

Slow tier; needs the server environment of ``scripts/setup.sh --vllm`` (CI builds it). A module
of its own, so that test_vllm_engine.py's server has stopped before this one starts.
"""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import pytest

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.engines import VLLMServerError, default_server_python

pytestmark = pytest.mark.slow

SERVER_PYTHON = default_server_python()
needs_server = pytest.mark.skipif(
    SERVER_PYTHON is None,
    reason="no vLLM server environment: run `bash scripts/setup.sh --vllm` (builds .venv-vllm) "
    "or set TEXTGYM_VLLM_PYTHON",
)


@needs_server
def test_training_starts_its_server_and_a_killed_server_stops_it_with_a_checkpoint(tmp_path):
    env = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    settings = dict(num_steps=2, minibatch_size=4, micro_batch_size=4, num_epochs=1)
    settings |= dict(rollout_engine="vllm", vllm_python=SERVER_PYTHON, vllm_request_timeout=60)
    config = PPOConfig.for_env(env, progress=False, save_every=0, **settings)
    assert config.decoding == "choices"
    policy = PPOPolicy.from_pretrained(None, dtype="float32", config=config)
    seen = []

    def kill_after_first_update(metrics):
        engine = policy.rollout_engine()
        seen.append((metrics["train/update"], engine.syncs, engine.adapter[0]))
        os.killpg(engine.server.process.pid, signal.SIGKILL)
        seen.append(time.monotonic())

    try:
        with pytest.raises(VLLMServerError, match="exited with code -9") as error:
            policy.learn(env, 10_000, output_dir=tmp_path / "run", callback=kill_after_first_update)
    finally:
        policy.close_rollout_engine()
    assert time.monotonic() - seen[-1] < 60  # the next request failed; nothing hung
    assert seen[0][:2] == (1, 1)  # the first rollout was served by the first adapter
    assert "is unreachable" in str(error.value)
    assert (tmp_path / "run" / "checkpoints" / "step_00000001").is_dir()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
