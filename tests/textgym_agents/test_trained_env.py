"""Runs and saved policies record the env they trained on; eval rebuilds it and warns on change."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym.cli import main
from textgym.envs.calculator import SYSTEM_PROMPT
from textgym_agents import PPOConfig, PPOPolicy, evaluate

PROMPT = SYSTEM_PROMPT + " Think step by step."
CONFIG = dict(
    num_steps=2, max_new_tokens=4, minibatch_size=4, micro_batch_size=4, progress=False, seed=1
)


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """A run trained in Python on the calculator with its own system prompt (the example's)."""
    out = tmp_path_factory.mktemp("calc") / "run"
    torch.manual_seed(0)
    policy = PPOPolicy.from_pretrained(tiny_dir, config=PPOConfig(**CONFIG))
    envs = gym.make_vec("textgym/Calculator-v0", 2, system_prompt=PROMPT, difficulty="mixed")
    policy.learn(envs, 2, output_dir=out)
    return out


def test_the_run_and_its_saved_policy_record_the_training_env(run):
    config = json.loads((run / "config.json").read_text())
    policy = PPOPolicy.load(run / "final")
    for record in (config["env"], policy.trained_env):
        assert record["id"] == "textgym/Calculator-v0"
        assert record["system_prompt"].startswith(PROMPT)
        assert json.loads(record["spec"])["kwargs"]["difficulty"] == "mixed"


def test_evaluating_under_another_prompt_warns_and_the_same_env_does_not(run):
    policy = PPOPolicy.load(run / "final")
    with pytest.warns(UserWarning, match="is not the one this policy was trained on"):
        evaluate(policy, gym.make("textgym/Calculator-v0"), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = gym.make("textgym/Calculator-v0", system_prompt=PROMPT, difficulty="mixed")
        evaluate(policy, same, 1)


def test_textgym_eval_rebuilds_the_training_env_by_default(run, capsys):
    assert main(["eval", str(run), "--episodes", "2", "--num-envs", "1"]) == 0
    captured = capsys.readouterr()
    assert "episodes of textgym/Calculator-v0" in captured.out  # not the default Blackjack
    assert "is not the one this policy" not in captured.err
    with pytest.warns(UserWarning, match="system prompt differs .* from character 384"):
        args = ["eval", str(run), "--env", "textgym/Calculator-v0", "--episodes", "1"]
        assert main(args) == 0
