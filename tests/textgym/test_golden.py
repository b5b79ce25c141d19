"""Golden prompts: the exact text the model sees, for Blackjack, FrozenLake and Sokoban.

Regenerate after an intended change with: UPDATE_GOLDEN=1 pytest tests/textgym/test_golden.py
"""

import os
from pathlib import Path

import gymnasium as gym
import pytest

import textgym  # noqa: F401

GOLDEN = Path(__file__).parent / "golden"


def transcript(env_id, replies, seed=0, **kwargs):
    env = gym.make(env_id, **kwargs)
    messages, _ = env.reset(seed=seed)
    parts = [f"[{m['role']}]\n{m['content']}" for m in messages]
    for reply in replies:
        messages, reward, terminated, truncated, _ = env.step(reply)
        parts.append(f"[assistant]\n{reply}")
        parts.append(f"[reward={reward} terminated={terminated} truncated={truncated}]")
        parts.append(f"[user]\n{messages[-1]['content']}")
        if terminated or truncated:
            break
    return "\n\n".join(parts) + "\n"


CASES = {
    "blackjack.txt": (
        "textgym/Blackjack-v1",
        ['{"action": "hit"}', "I'll stay put", "stick"],
        6,
        {},
    ),
    "frozenlake.txt": (
        "textgym/FrozenLake-v1",
        ['{"action": "right"}', "down", '```json\n{"action": "jump"}\n```', "down"],
        0,
        {"is_slippery": False},
    ),
    "frozenlake8x8.txt": ("textgym/FrozenLake-v1", ["right"], 0, {"map_name": "8x8"}),
    "frozenlake_random.txt": (
        "textgym/FrozenLakeRandom-v0",
        ['{"action": "down"}', "right", "Right, then right again", "right"],
        0,
        {},
    ),
    "sokoban.txt": (
        "textgym/Sokoban-v0",
        ['{"action": "right"}', "left", '```json\n{"action": "jump"}\n```', "left", "up"]
        + ["left", "down"],
        0,
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_transcript(name):
    env_id, replies, seed, kwargs = CASES[name]
    text = transcript(env_id, replies, seed, **kwargs)
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")
