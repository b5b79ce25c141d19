"""reasoning-gym tasks as text envs: prompts, the library's scores, attempts, invalid replies."""

import json

import gymnasium as gym
import pytest

import textgym
from textgym.envs.reasoning_gym_text import REASONING_GYM_TASKS, SYSTEM_PROMPT

pytest.importorskip("reasoning_gym")


def test_the_prompt_is_the_question_under_the_answer_format():
    messages, info = gym.make("textgym/rg-basic_arithmetic-v0").reset(seed=3)
    assert messages == [
        {
            "role": "system",
            "content": SYSTEM_PROMPT + "\n\nReply with a JSON object with exactly these fields:\n"
            '- "answer": string of at most 1000 characters. the final answer\n'
            'Example reply: {"answer": "x"}',
        },
        {"role": "user", "content": "Calculate ( 56 + -33 ) - 84."},
    ]
    assert info["task"] == "basic_arithmetic"


@pytest.mark.parametrize("task", REASONING_GYM_TASKS)
def test_every_registered_task_pays_its_own_answer_and_not_another_questions(task):
    env = gym.make(f"textgym/rg-{task}-v0")
    env.reset(seed=0)
    other = env.unwrapped.entry["answer"]
    env.reset(seed=1)
    answer = env.unwrapped.entry["answer"]
    _, reward, terminated, truncated, info = env.step(json.dumps({"answer": answer}))
    assert (reward, terminated, truncated, info["is_success"]) == (1.0, True, False, True)
    if other != answer:
        env.reset(seed=1)
        _, reward, _, _, info = env.step(json.dumps({"answer": other}))
        assert reward < 1.0 and not info["is_success"]


def test_a_wrong_answer_may_be_tried_again_and_the_answer_is_never_shown():
    env = gym.make("textgym/rg-spell_backward-v0", attempts=2)
    messages, _ = env.reset(seed=1)
    messages, reward, terminated, _, info = env.step('{"answer": "wrong"}')
    assert (reward, terminated, info["is_success"]) == (0.0, False, False)
    assert messages[-1]["content"] == "That is not right. Try again (1 left)."
    assert "ainomma" not in str(messages)  # 'ammonia' backward
    _, reward, terminated, _, _ = env.step('{"answer": "ainomma"}')
    assert (reward, terminated) == (1.0, True)


def test_an_unreadable_reply_is_recorded_and_penalised():
    env = gym.make("textgym/rg-gcd-v0")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("the gcd is one")
    assert info["invalid"] and reward == -1.0 and not terminated
    assert info["parse_error"]


def test_any_other_task_by_name_and_unknown_ones_refused():
    env = gym.make("textgym/rg-basic_arithmetic-v0", task="count_primes")
    messages, _ = env.reset(seed=0)
    assert "prime" in messages[-1]["content"]
    with pytest.raises(ValueError, match="Unknown reasoning-gym task 'no_such_task'"):
        gym.make("textgym/rg-basic_arithmetic-v0", task="no_such_task")


def test_a_checked_text_env():
    assert textgym.check_text_env(gym.make("textgym/rg-chain_sum-v0")) >= 0
