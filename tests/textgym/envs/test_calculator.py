from __future__ import annotations

import re

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from textgym.envs.calculator import (
    EXAMPLE_EPISODE,
    SYSTEM_PROMPT,
    CalculatorEnv,
    CalculatorParser,
    CalculatorRewards,
    make_calculator_text_env,
)
from textgym.envs.safe_math import evaluate_expression
from textgym.parsers import ActionParseError
from textgym.wrappers import TextEnvWrapper

ALLOWED = "only numbers, + - * / // % **, parentheses and sqrt() are allowed"
QUESTION = "What is 852 * 640?"  # CalculatorEnv("multiply").reset(seed=0)
TARGET = 545280.0
NOT_A_COMMAND = (
    "Observation: error: expected 'Action: calculator(<expression>)' or 'Answer: <number>'"
)


@pytest.fixture
def env() -> CalculatorEnv:
    env = CalculatorEnv("multiply", render_mode="ansi")
    question, info = env.reset(seed=0)
    assert question == QUESTION and info["target"] == TARGET
    return env


# --- rewards and episode ends -------------------------------------------------------------


def test_correct_answer_after_a_tool_call(env: CalculatorEnv) -> None:
    obs, reward, terminated, truncated, info = env.step("Action: calculator(852 * 640)")
    assert (obs, reward, terminated, truncated) == ("Observation: 545280", 0.0, False, False)
    assert info["event"] == "tool_call" and info["tool_calls"] == 1 and "is_success" not in info
    obs, reward, terminated, truncated, info = env.step("Answer: 545280")
    assert (obs, reward, terminated, truncated) == (
        "Result: correct, the answer is 545280.",
        1.0,
        True,
        False,
    )
    assert info["is_success"] is True and info["correct"] is True and info["event"] == "answer"


@pytest.mark.parametrize("answer", ["545281", "545280 apples", "banana", "", "nan", "inf"])
def test_wrong_answer_after_a_tool_call(env: CalculatorEnv, answer: str) -> None:
    env.step("Action: calculator(852 * 640)")
    obs, reward, terminated, truncated, info = env.step(f"Answer: {answer}")
    assert (obs, reward, terminated, truncated) == (
        "Result: wrong, the answer is 545280.",
        0.2,
        True,
        False,
    )
    assert info["is_success"] is False


@pytest.mark.parametrize(
    "answer",
    [
        "545280",
        "545280.0",
        " 545,280 ",
        "545280.",
        "**545280**",
        "**545280.**",
        "`545,280`.",
        "5.4528e5",
        "545280.0000001",
    ],
)
def test_answers_are_compared_numerically_with_tolerance(env: CalculatorEnv, answer: str) -> None:
    env.step("Action: calculator(1 + 1)")  # any valid call counts as using the tool
    assert env.step(f"Answer: {answer}")[1] == 1.0


def test_tolerance_is_tight() -> None:
    env = CalculatorEnv("multiply")
    env.reset(seed=0)
    env.step("Action: calculator(1)")
    assert env.step("Answer: 545280.6")[1] == 0.2  # relative error 1.1e-6 > 1e-6


@pytest.mark.parametrize(
    ("action", "obs"),
    [
        ("Action: calculator(x)", "Observation: error: unknown name 'x': " + ALLOWED),
        ("Action: calculator(1 / 0)", "Observation: error: division by zero"),
        ("Action: calculator()", "Observation: error: expression is empty"),
        (
            "Action: calculator(10 ** 1000)",
            "Observation: error: exponent 1000 is too large (the limit is 100)",
        ),
        ("hello", NOT_A_COMMAND),
        ("action: calculator(1)", NOT_A_COMMAND),
        ("Action: calculator(1", NOT_A_COMMAND),
        ("", NOT_A_COMMAND),
    ],
)
def test_malformed_tool_calls_are_penalised_and_continue(
    env: CalculatorEnv, action: str, obs: str
) -> None:
    got_obs, reward, terminated, truncated, info = env.step(action)
    assert (got_obs, reward, terminated, truncated) == (obs, -0.5, False, False)
    assert info["event"] == "malformed_tool_call" and info["tool_calls"] == 0


@pytest.mark.parametrize(("answer", "correct"), [("545280", True), ("1", False)])
def test_answer_without_a_valid_tool_call(env: CalculatorEnv, answer: str, correct: bool) -> None:
    env.step("Action: calculator(oops)")  # a refused call does not count
    obs, reward, terminated, truncated, info = env.step(f"Answer: {answer}")
    assert (reward, terminated, truncated) == (-1.0, True, False)
    assert info["event"] == "answer_without_tool" and info["is_success"] is correct


def test_truncation_after_max_turns() -> None:
    env = CalculatorEnv("multiply", max_turns=3)
    env.reset(seed=0)
    for _ in range(2):
        assert env.step("Action: calculator(2 + 2)")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("Action: calculator(2 + 2)")
    assert (obs, reward, terminated, truncated) == ("Observation: 4", 0.0, False, True)
    assert info["is_success"] is False and info["turn"] == 3
    with pytest.raises(RuntimeError, match=re.escape("Call reset() before step()")):
        env.step("Answer: 4")


def test_answer_on_the_last_turn_terminates_without_truncation() -> None:
    env = CalculatorEnv("multiply", max_turns=2)
    env.reset(seed=0)
    env.step("Action: calculator(852 * 640)")
    assert env.step("Answer: 545280")[1:4] == (1.0, True, False)


def test_custom_rewards() -> None:
    rewards = CalculatorRewards(
        correct=2.0, wrong_answer=-0.1, malformed_tool_call=-3.0, no_tool_call=-5.0
    )
    env = CalculatorEnv("multiply", rewards=rewards)
    env.reset(seed=0)
    assert env.step("Action: calculator(nope)")[1] == -3.0
    assert env.step("Answer: 545280")[1] == -5.0
    env.reset(seed=0)
    env.step("Action: calculator(852 * 640)")
    assert env.step("Answer: 545280")[1] == 2.0
    env.reset(seed=0)
    env.step("Action: calculator(852 * 640)")
    assert env.step("Answer: 0")[1] == -0.1
    with pytest.raises(AttributeError):
        rewards.correct = 0.0  # type: ignore[misc]


def test_step_before_reset_and_bad_action_types() -> None:
    env = CalculatorEnv()
    with pytest.raises(RuntimeError, match=re.escape("Call reset() before step()")):
        env.step("Answer: 1")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="^Expected the action as str, got int$"):
        env.step(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"difficulty": "hard"},
            ValueError,
            "Expected difficulty to be one of ('add', 'multiply', 'power', 'multistep', "
            "'mixed'), got 'hard'",
        ),
        (
            {"rewards": {"correct": 1.0}},
            TypeError,
            "Expected rewards as CalculatorRewards, got dict",
        ),
        ({"max_turns": 0}, ValueError, "Expected max_turns to be an int >= 1, got 0"),
        (
            {"render_mode": "human"},
            ValueError,
            "Expected render_mode to be None or 'ansi', got 'human'",
        ),
    ],
)
def test_constructor_validation(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as excinfo:
        CalculatorEnv(**kwargs)
    assert str(excinfo.value) == message


def test_render_returns_the_transcript(env: CalculatorEnv) -> None:
    env.step("Action: calculator(852 * 640)")
    env.step("Answer: 545280")
    assert env.render() == (
        "What is 852 * 640?\n"
        "Action: calculator(852 * 640)\n"
        "Observation: 545280\n"
        "Answer: 545280\n"
        "Result: correct, the answer is 545280."
    )
    assert CalculatorEnv().render() is None


# --- questions ----------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", ["add", "multiply", "power", "multistep", "mixed"])
def test_questions_are_seeded_and_targets_match_their_expression(difficulty: str) -> None:
    env = CalculatorEnv(difficulty)
    for seed in range(50):
        question, info = env.reset(seed=seed)
        assert question == f"What is {info['expression']}?" == info["question"]
        assert info["target"] == evaluate_expression(info["expression"])
        assert info["target"] == int(info["target"])  # every question has an integer answer
        assert CalculatorEnv(difficulty).reset(seed=seed) == (question, info)
        if difficulty != "mixed":
            assert info["kind"] == difficulty


def test_question_shapes() -> None:
    patterns = {
        "add": r"\d{2,3}( [+-] \d{2,3}){1,2}",
        "multiply": r"\d{2,3} \* \d{2,3}",
        "power": r"\d{1,2} \*\* [234]|sqrt\(\d+\)",
        "multistep": r"\(\d{2} [+-] \d{2}\) \* \d{1,2}|\d{2} \* \d{2} [+-] \d{1,2}",
    }
    for kind, pattern in patterns.items():
        env = CalculatorEnv(kind)
        for seed in range(30):
            assert re.fullmatch(pattern, env.reset(seed=seed)[1]["expression"])
    env = CalculatorEnv()
    kinds = {env.reset(seed=seed)[1]["kind"] for seed in range(40)}
    assert kinds == set(patterns)


# --- parser -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Action: calculator(123 * 456)", "Action: calculator(123 * 456)"),
        ("Thought: multiply.\nAction: calculator(123 * 456)", "Action: calculator(123 * 456)"),
        (
            "thought: x\nACTION:calculator( (1 + 2) * (3 + 4) ) trailing",
            "Action: calculator((1 + 2) * (3 + 4))",
        ),
        ("Action: `calculator(sqrt(16))`", "Action: calculator(sqrt(16))"),
        ("Action: Calculator(1/0)", "Action: calculator(1/0)"),  # the env judges the expression
        ("Action: calculator()", "Action: calculator()"),
        ("Answer: 56088", "Answer: 56088"),
        ("Thought: done.\nFinal Answer: **56,088**.", "Answer: 56,088"),
        ("answer:\n  56088\nThanks", "Answer: 56088"),
        ("Answer: 5\nAction: calculator(1)", "Answer: 5"),  # the first one wins
        ("Action: calculator(1)\nAnswer: 5", "Action: calculator(1)"),
        (
            '{"thought": "t", "tool": "calculator", "expression": "123*456"}',
            "Action: calculator(123*456)",
        ),
        ('{"expression": " 2 + 3 "}', "Action: calculator(2 + 3)"),
        ('{"thought": "Answer: 3", "answer": "56088"}', "Answer: 56088"),
        ('{"answer": 56088}', "Answer: 56088"),
        ('{"answer": 0.5}', "Answer: 0.5"),
        ('Sure:\n```json\n{"answer": "7"}\n```\nAnswer: 8', "Answer: 7"),
        ('```JSON {"tool": "calculator", "expression": "1"}', "Action: calculator(1)"),
        (
            'I will call it. {"tool": "calculator", "expression": "2*2"} ok',
            "Action: calculator(2*2)",
        ),
        ('Here: {"thought": "Action: none yet", "answer": 3}', "Answer: 3"),
        ("Thought: the set {1, 2} has two items.\nAnswer: 2", "Answer: 2"),
    ],
)
def test_parser_valid_replies(reply: str, action: str) -> None:
    assert CalculatorParser().parse(reply) == action


ONE_OF = (
    "invalid JSON reply: Value error, give exactly one of 'expression' (a calculator call) or "
    "'answer'"
)
NO_ACTION = "no 'Action: calculator(<expression>)' or 'Answer: <number>' found in the reply"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", NO_ACTION),
        ("The answer is 5.", NO_ACTION),
        ("calculator(1 + 2)", NO_ACTION),
        ("Action: search(cats)", "unknown tool 'search'; the only tool is calculator"),
        (
            "Action: calculator\nAction Input: 1 + 2",
            "expected 'calculator(<expression>)' after 'Action:'",
        ),
        ("Action: 42", "expected 'calculator(<expression>)' after 'Action:'"),
        ("Action: calculator((1 + 2)", "the calculator call has no closing parenthesis"),
        ("Answer:", "the answer after 'Answer:' is empty"),
        ("Action: calc {oops}", "unknown tool 'calc'; the only tool is calculator"),
        ("Answer: ** **", "the answer after 'Answer:' is empty"),
        ("Answer: ...", "the answer after 'Answer:' is empty"),
        ('{"thought": "hmm"}', ONE_OF),
        ('{"expression": "1", "answer": "1"}', ONE_OF),
        (
            '{"tool": "calculator", "answer": "1"}',
            "invalid JSON reply: Value error, 'tool' goes with 'expression', not with 'answer'",
        ),
        (
            '{"tool": "search", "expression": "1"}',
            "invalid JSON reply: tool: Input should be 'calculator'",
        ),
        (
            '{"answer": "1", "confidence": 1}',
            "invalid JSON reply: confidence: Extra inputs are not permitted",
        ),
        (
            '{"answer": true}',
            (
                "invalid JSON reply: answer.str: Input should be a valid string; answer.int: "
                "Input should be a valid integer; answer.float: Input should be a valid number"
            ),
        ),
    ],
)
def test_parser_invalid_replies(reply: str, message: str) -> None:
    with pytest.raises(ActionParseError) as excinfo:
        CalculatorParser().parse(reply)
    assert str(excinfo.value) == message
    assert excinfo.value.reply == reply


def test_parser_keeps_json_errors_and_rejects_non_str() -> None:
    with pytest.raises(ActionParseError) as excinfo:
        CalculatorParser().parse('{"answer": ')
    assert str(excinfo.value).startswith("invalid JSON reply: Invalid JSON")
    assert excinfo.value.validation_error is not None
    with pytest.raises(ActionParseError, match="^expected the reply as str, got int$"):
        CalculatorParser().parse(5)  # type: ignore[arg-type]


def test_parser_is_linear_on_hostile_replies() -> None:
    parser = CalculatorParser()
    for reply in [
        "(" * 4000,
        "Action: calculator(" + "(" * 4000,
        "action " * 600,
        "{" * 4000,
        "```json" * 500,
    ]:
        with pytest.raises(ActionParseError):
            parser.parse(reply)


def test_parser_instructions_teach_json_by_default() -> None:
    assert CalculatorParser().instructions() == (
        'Reply with a JSON object: either {"tool": "calculator", "expression": "<expression>"} '
        'to call the calculator, or {"answer": "<number>"} to give your final answer.'
    )
    assert CalculatorParser(reply_format="text").instructions() == (
        'Reply with an optional "Thought: ..." line, then either '
        '"Action: calculator(<expression>)" to call the calculator or "Answer: <number>" to '
        "give your final answer. Example reply:\n"
        "Thought: I need the product of 123 and 456.\n"
        "Action: calculator(123 * 456)"
    )


@pytest.mark.parametrize("reply_format", ["json", "text", "both"])
def test_parser_reads_both_forms_whatever_it_teaches(reply_format: str) -> None:
    parser = CalculatorParser(reply_format=reply_format)
    assert parser.parse("Action: calculator(2 + 3)") == "Action: calculator(2 + 3)"
    assert parser.parse('{"tool": "calculator", "expression": "2 + 3"}') == (
        "Action: calculator(2 + 3)"
    )
    assert parser.parse('{"answer": "5"}') == parser.parse("Answer: 5") == "Answer: 5"


def test_parser_rejects_an_unknown_reply_format() -> None:
    with pytest.raises(ValueError, match="reply_format"):
        CalculatorParser(reply_format="xml")


def test_env_passes_its_reply_format_to_the_parser() -> None:
    env = make_calculator_text_env(reply_format="text")
    assert env.parser == CalculatorParser(reply_format="text")
    assert env.system_prompt.endswith("Action: calculator(123 * 456)")
    assert make_calculator_text_env().parser != env.parser


def test_parser_instructions_examples_and_choices() -> None:
    parser = CalculatorParser(reply_format="both")
    assert parser.instructions() == (
        "Reply in one of two formats.\n"
        'Text: an optional "Thought: ..." line, then either "Action: calculator(<expression>)" '
        'to call the calculator or "Answer: <number>" to give your final answer. Example reply:\n'
        "Thought: I need the product of 123 and 456.\n"
        "Action: calculator(123 * 456)\n"
        'JSON: an object with an optional "thought" and either "tool": "calculator" with '
        '"expression", or "answer". Example reply:\n'
        '{"thought": "The calculator returned 56088.", "answer": "56088"}'
    )
    for action in ["Action: calculator(123 * 456)", "Answer: 56088"]:
        assert parser.example(action) == action
        assert parser.parse(parser.example(action)) == action
    assert parser.example("Action: calculator(1))") is None
    assert parser.example("nonsense") is None
    assert parser.example(3) is None
    assert parser.choices() is None


# --- checker and the text env ---------------------------------------------------------------


def test_check_env_passes_on_the_raw_env() -> None:
    check_env(CalculatorEnv())
    check_env(CalculatorEnv(render_mode="ansi"))


def test_check_env_passes_on_the_text_env() -> None:
    check_env(make_calculator_text_env())


def test_full_episode_through_the_text_env() -> None:
    env = make_calculator_text_env(difficulty="multiply")
    assert isinstance(env, TextEnvWrapper)
    messages, info = env.reset(seed=0)
    prompt = SYSTEM_PROMPT + EXAMPLE_EPISODE + "\n\nReply with a JSON object: either"
    assert messages[0]["content"].startswith(prompt)
    assert messages[-1] == {"role": "user", "content": QUESTION}
    assert info["target"] == TARGET

    messages, reward, terminated, truncated, info = env.step("Action: calculator(x + 1)")
    assert (reward, terminated, info["invalid"]) == (-0.5, False, False)
    assert messages[-1]["content"].startswith("Observation: error: unknown name 'x'")

    messages, reward, terminated, truncated, info = env.step("I think it is big.")
    assert (reward, info["parse_error"]) == (-1.0, NO_ACTION)

    reply = "Thought: multiply.\nAction: calculator(852 * 640)"
    messages, reward, terminated, truncated, info = env.step(reply)
    assert (messages[-1]["content"], reward, terminated) == ("Observation: 545280", 0.0, False)
    assert messages[-2] == {"role": "assistant", "content": reply}

    messages, reward, terminated, truncated, info = env.step('{"answer": "545280"}')
    assert (reward, terminated, truncated, info["is_success"]) == (1.0, True, False, True)
    assert len(messages) == 1 + 2 * 4 + 1  # system, four past turns, the last observation


def test_text_env_options() -> None:
    rewards = CalculatorRewards(correct=5.0)
    env = make_calculator_text_env(
        difficulty="add",
        rewards=rewards,
        max_turns=2,
        render_mode="ansi",
        history=0,
        system_prompt="Be exact.",
    )
    messages, _ = env.reset(seed=2)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("Be exact.\n\n")
    assert messages[1]["content"] == "What is 839 + 305?"
    env.step("Action: calculator(839 + 305)")
    assert env.step("Answer: 1144")[1] == 5.0
    assert env.render().endswith("Result: correct, the answer is 1144.")
    assert env.unwrapped.max_turns == 2


def test_registered_like_the_lead_will_register_it() -> None:
    env_id = "textgym_test/Calculator-v0"
    gym.register(env_id, entry_point="textgym.envs.calculator:make_calculator_text_env")
    try:
        env = gym.make(env_id, difficulty="power", render_mode="ansi")
        check_env(env.unwrapped)  # builds every render mode again through env.spec.make()
        check_env(env)
        messages, info = env.spec.make().reset(seed=3)
        assert messages[-1]["content"] == "What is sqrt(100)?"
        vec = gym.make_vec(env_id, num_envs=2, vectorization_mode="sync")
        _, infos = vec.reset(seed=0)
        assert list(infos["question"]) == ["What is (67 - 56) * 28?", "What is 516 * 757?"]
        vec.close()
    finally:
        del gym.registry[env_id]
    assert CalculatorParser() == CalculatorParser()
