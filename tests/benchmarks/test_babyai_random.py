"""The BabyAI baselines (benchmarks/babyai_random.py): the random policy and minigrid's bot."""

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("minigrid")

from benchmarks.babyai_random import baseline, bot_baseline  # noqa: E402

LEVEL = "textgym/BabyAI-GoToRedBall-v0"


def test_the_bot_solves_nearly_every_episode_and_random_rarely():
    bot, rand = bot_baseline(LEVEL, 20, seed=1000), baseline(LEVEL, 20, seed=1000)
    assert bot["success"] >= 0.95 and bot["length"] < 10
    assert rand["success"] < bot["success"] and rand["length"] > bot["length"]


def test_max_steps_caps_both_policies_episodes():
    for policy in (baseline, bot_baseline):
        found = policy(LEVEL, 10, 0, max_steps=3)
        assert 0 < found["length"] <= 3


def test_the_script_prints_a_row_per_policy_at_the_cap():
    stdout = run_script(
        "babyai_random.py", "--episodes", "5", "--bot", "--max-steps", "16", "--ids", LEVEL
    ).stdout
    assert "5 episodes per id, seeds 1000.., at most 16 steps" in stdout
    assert f"| `{LEVEL}` | random |" in stdout and f"| `{LEVEL}` | BabyAI bot |" in stdout
