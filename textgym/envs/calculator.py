"""``textgym/Calculator-v0``: math questions an agent answers by calling a calculator tool.

The raw :class:`CalculatorEnv` takes canonical command strings; :class:`CalculatorParser`
turns what a model writes (ReAct text or JSON) into them; the factory wires both together.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.envs.calculator_parser import (
    ANSWER_PREFIX,
    MARKUP,
    MAX_COMMAND_CHARS,
    TOOL_PREFIX,
    CalculatorParser,
    CalculatorReply,
)
from textgym.envs.safe_math import UnsafeExpressionError, evaluate_expression, format_number
from textgym.spaces import UnicodeText
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "DIFFICULTIES",
    "EXAMPLE_EPISODE",
    "SYSTEM_PROMPT",
    "CalculatorEnv",
    "CalculatorParser",
    "CalculatorReply",
    "CalculatorRewards",
    "make_calculator_text_env",
    "observation_text",
]

DIFFICULTIES = ("add", "multiply", "power", "multistep", "mixed")
# Answers within this of the target count as correct: absolute for small targets, relative
# for large ones. Observations show 10 significant digits, so a copied result always passes.
REL_TOL = ABS_TOL = 1e-6
SYSTEM_PROMPT = (
    "You answer math questions with the help of a calculator tool. Do not work the numbers "
    "out in your head: first call the calculator with an arithmetic expression, read its "
    "result, then give the final answer as a plain number. The calculator understands "
    "numbers, + - * / // % ** (power), parentheses and sqrt(x). It replies with "
    '"Observation: <result>" or "Observation: error: <reason>".'
)
# A worked episode, appended to SYSTEM_PROMPT by default: a 135M model copies a pattern better
# than it follows instructions, so it answers in this JSON form and stops calling the tool once
# it has the result (examples/calculator_tool_agent.py; docs/text-envs.md).
EXAMPLE_EPISODE = (
    "\n\nExample:\nUser: What is 123 * 456?\n"
    'Assistant: {"tool": "calculator", "expression": "123 * 456"}\n'
    'User: Observation: 56088\nAssistant: {"answer": "56088"}'
)
_NOT_A_COMMAND = "expected 'Action: calculator(<expression>)' or 'Answer: <number>'"
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


@dataclass(frozen=True)
class CalculatorRewards:
    """Rewards of :class:`CalculatorEnv`.

    Attributes:
        correct: A correct answer after at least one valid calculator call.
        wrong_answer: A wrong (or non-numeric) answer after at least one valid call.
        malformed_tool_call: A call the calculator refuses, or an action of neither form.
        no_tool_call: Any answer given before a valid calculator call.

    Example:
        >>> CalculatorRewards(no_tool_call=-2.0).correct
        1.0
    """

    correct: float = 1.0
    wrong_answer: float = 0.2
    malformed_tool_call: float = -0.5
    no_tool_call: float = -1.0


class CalculatorEnv(gym.Env[str, str]):
    """A math question; the agent calls ``calculator(<expr>)`` and then answers.

    Actions are canonical commands, ``"Action: calculator(<expr>)"`` or ``"Answer: <value>"``
    (the syntax :class:`CalculatorParser` produces). A valid call pays 0.0 and shows
    ``"Observation: <result>"``; a refused one pays ``rewards.malformed_tool_call`` and shows
    ``"Observation: error: <reason>"``. Any other text is treated as a malformed call rather
    than raising, so random text (e.g. from ``check_env``) is a valid, penalised action. An
    answer terminates the episode: ``no_tool_call`` if no valid call came first, else
    ``correct`` or ``wrong_answer``; a number within 1e-6 of the target (absolute, or relative
    for targets above 1) is correct. ``max_turns`` steps without an answer truncate.

    Example:
        >>> env = CalculatorEnv(difficulty="multiply")
        >>> question, info = env.reset(seed=0)
        >>> question, info["target"]
        ('What is 852 * 640?', 545280.0)
        >>> env.step("Action: calculator(852 * 640)")[:3]
        ('Observation: 545280', 0.0, False)
        >>> obs, reward, terminated, truncated, info = env.step("Answer: 545280")
        >>> reward, terminated, info["is_success"]
        (1.0, True, True)
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        difficulty: str = "mixed",
        *,
        rewards: CalculatorRewards | None = None,
        max_turns: int = 4,
        render_mode: str | None = None,
    ) -> None:
        """Create the env.

        Args:
            difficulty: ``"add"`` (2-3 numbers of 2-3 digits added or subtracted),
                ``"multiply"`` (two 2-3 digit numbers), ``"power"`` (small integer powers or
                square roots of perfect squares), ``"multistep"`` (``(a + b) * c``,
                ``a * b - c`` and the like) or ``"mixed"`` (one of the four, uniformly).
            rewards: The rewards; defaults to :class:`CalculatorRewards()`.
            max_turns: Steps after which an episode without an answer is truncated.
            render_mode: None or ``"ansi"`` (``render()`` returns the transcript).
        """
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"Expected difficulty to be one of {DIFFICULTIES}, got {difficulty!r}")
        rewards = CalculatorRewards() if rewards is None else rewards
        if not isinstance(rewards, CalculatorRewards):
            raise TypeError(f"Expected rewards as CalculatorRewards, got {type(rewards).__name__}")
        if not (isinstance(max_turns, int) and max_turns >= 1):
            raise ValueError(f"Expected max_turns to be an int >= 1, got {max_turns!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"Expected render_mode to be None or 'ansi', got {render_mode!r}")
        self.difficulty = difficulty
        self.rewards = rewards
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_COMMAND_CHARS)
        self.action_space = UnicodeText(MAX_COMMAND_CHARS)
        self._question = self._expression = self._kind = ""
        self._target: float | None = None
        self._turn = self._tool_calls = 0
        self._done = False
        self._transcript: list[str] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Sample a new question from ``self.np_random``."""
        super().reset(seed=seed)
        kind = self.difficulty
        if kind == "mixed":
            kind = DIFFICULTIES[int(self.np_random.integers(4))]
        self._kind = kind
        self._expression = _sample_expression(kind, self.np_random)
        self._target = evaluate_expression(self._expression)
        self._question = f"What is {self._expression}?"
        self._turn = self._tool_calls = 0
        self._done = False
        self._transcript = [self._question]
        return self._question, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run a calculator call or score an answer."""
        if self._target is None or self._done:
            raise RuntimeError("Call reset() before step() (and after an episode ends)")
        if not isinstance(action, str):
            raise TypeError(f"Expected the action as str, got {type(action).__name__}")
        self._turn += 1
        command = action.strip()
        terminated, extra = False, {}
        if command.startswith(ANSWER_PREFIX):
            terminated = self._done = True
            correct = _is_correct(command[len(ANSWER_PREFIX) :], self._target)
            if self._tool_calls == 0:
                reward, event = self.rewards.no_tool_call, "answer_without_tool"
            else:
                event = "answer"
                reward = self.rewards.correct if correct else self.rewards.wrong_answer
            verdict = "correct" if correct else "wrong"
            obs = f"Result: {verdict}, the answer is {format_number(self._target)}."
            extra = {"correct": correct, "is_success": correct}
        else:
            try:
                if not (command.startswith(TOOL_PREFIX) and command.endswith(")")):
                    raise UnsafeExpressionError(_NOT_A_COMMAND)
                value = evaluate_expression(command[len(TOOL_PREFIX) : -1])
            except UnsafeExpressionError as e:
                reward, event = self.rewards.malformed_tool_call, "malformed_tool_call"
                # Error messages may quote the expression; keep them inside the space.
                obs = _clip(f"Observation: error: {e}", self.observation_space.max_length)
            else:
                self._tool_calls += 1
                reward, event = 0.0, "tool_call"
                obs = f"Observation: {format_number(value)}"
        truncated = not terminated and self._turn >= self.max_turns
        if truncated:
            self._done = True
            extra = {"correct": False, "is_success": False}
        self._transcript += [_clip(command, 200), obs]
        info = {**self._info(), "event": event, "turn": self._turn, **extra}
        return obs, float(reward), terminated, truncated, info

    def render(self) -> str | None:
        """Return the episode transcript so far (``render_mode="ansi"``), else None."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(self._transcript)

    def _info(self) -> dict[str, Any]:
        return {
            "question": self._question,
            "expression": self._expression,
            "kind": self._kind,
            "target": self._target,
            "tool_calls": self._tool_calls,
        }


def _sample_expression(kind: str, rng: np.random.Generator) -> str:
    def num(low: int, high: int) -> int:
        return int(rng.integers(low, high + 1))

    if kind == "add":
        expr = str(num(10, 999))
        for _ in range(num(1, 2)):
            expr += f" {'+-'[num(0, 1)]} {num(10, 999)}"
        return expr
    if kind == "multiply":
        return f"{num(10, 999)} * {num(10, 999)}"
    if kind == "power":
        if num(0, 1):
            return f"sqrt({num(2, 99) ** 2})"
        return f"{num(2, 12)} ** {num(2, 4)}"
    a, b, c = num(10, 99), num(10, 99), num(2, 99)
    templates = [f"({a} + {b}) * {c}", f"({a} - {b}) * {c}", f"{a} * {b} - {c}", f"{a} * {b} + {c}"]
    return templates[num(0, 3)]


def _parse_number(text: str) -> float | None:
    # Trailing dots and markdown emphasis are how models end sentences, not part of the value.
    cleaned = _THOUSANDS.sub("", text.lstrip(MARKUP).rstrip(MARKUP + "."))
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _is_correct(text: str, target: float) -> bool:
    value = _parse_number(text)
    return value is not None and math.isclose(value, target, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def observation_text(obs: str, info: Any) -> str:
    """The formatter of envs that already speak text (the calculator, reasoning-gym, TextArena).

    The spec names it ``"textgym.envs.calculator:observation_text"``.

    Example:
        >>> observation_text("What is 2 + 3?", {})
        'What is 2 + 3?'
    """
    return obs


def make_calculator_text_env(
    *,
    difficulty: str = "mixed",
    rewards: CalculatorRewards | None = None,
    max_turns: int = 4,
    render_mode: str | None = None,
    reply_format: str = "json",
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    r"""Build ``textgym/Calculator-v0``: :class:`CalculatorEnv` behind a ``TextEnvWrapper``.

    Args:
        difficulty: Question kind, see :class:`CalculatorEnv`.
        rewards: The rewards; defaults to :class:`CalculatorRewards()`.
        max_turns: Env steps after which an episode without an answer is truncated.
        render_mode: None or ``"ansi"``.
        reply_format: The reply form the instructions teach, ``"json"``, ``"text"`` or
            ``"both"`` (:class:`CalculatorParser`; either form is parsed).
        **wrapper_kwargs: Passed to :class:`~textgym.wrappers.TextEnvWrapper`; ``history``
            defaults to 4, ``system_prompt`` to :data:`SYSTEM_PROMPT` followed by
            :data:`EXAMPLE_EPISODE` (pass ``system_prompt=SYSTEM_PROMPT`` to leave the worked
            episode out), ``parser`` to ``CalculatorParser(reply_format)`` and ``formatter``
            to the identity.

    Example:
        >>> env = make_calculator_text_env(difficulty="add")
        >>> messages, info = env.reset(seed=2)
        >>> messages[-1]["content"]
        'What is 839 + 305?'
        >>> messages, reward, *_ = env.step("Thought: add them.\nAction: calculator(839 + 305)")
        >>> messages[-1]["content"], reward
        ('Observation: 1144', 0.0)
        >>> env.step("Answer: 1144")[1:3]
        (1.0, True)
    """
    env = CalculatorEnv(difficulty, rewards=rewards, max_turns=max_turns, render_mode=render_mode)
    wrapper_kwargs.setdefault("formatter", observation_text)
    wrapper_kwargs.setdefault("parser", CalculatorParser(reply_format))
    wrapper_kwargs.setdefault("system_prompt", SYSTEM_PROMPT + EXAMPLE_EPISODE)
    wrapper_kwargs.setdefault("history", 4)
    return TextEnvWrapper(env, **wrapper_kwargs)
