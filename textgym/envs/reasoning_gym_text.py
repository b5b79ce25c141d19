"""reasoning-gym's procedural tasks as text envs: ``textgym/rg-<task>-v0``.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates questions offline
(arithmetic, counting, ciphers, sorting, ...) and scores answers with each task's own
``score_answer``. :class:`ReasoningGymEnv` asks one generated question per episode, seeded by
the reset seed, and pays the task's score (0 to 1) for the answer; a wrong answer may be tried
again up to ``attempts`` times. Nothing here reimplements a task: questions, answers and scores
are the library's (``pip install "textgym[reasoning-gym]"``).

Example:
    >>> import gymnasium as gym, textgym
    >>> env = gym.make("textgym/rg-basic_arithmetic-v0")
    >>> messages, info = env.reset(seed=3)
    >>> messages[-1]["content"]
    'Calculate ( 56 + -33 ) - 84.'
    >>> env.step('{"answer": "-61"}')[1:3]
    (1.0, True)
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
from pydantic import BaseModel, Field

from textgym.envs.calculator import observation_text
from textgym.extras import require
from textgym.parsers import JSONActionParser
from textgym.spaces import UnicodeText
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "REASONING_GYM_TASKS",
    "SYSTEM_PROMPT",
    "Answer",
    "AnswerParser",
    "ReasoningGymEnv",
    "as_answer",
    "make_reasoning_gym_text_env",
]

REASONING_GYM_TASKS = (
    "basic_arithmetic",
    "base_conversion",
    "caesar_cipher",
    "chain_sum",
    "count_bits",
    "decimal_arithmetic",
    "fraction_simplification",
    "gcd",
    "lcm",
    "leg_counting",
    "letter_counting",
    "number_sorting",
    "prime_factorization",
    "simple_equations",
    "spell_backward",
    "word_sorting",
)
"""Tasks registered as ``textgym/rg-<task>-v0``: procedural, offline, answers of one line.
Any other task of reasoning-gym's works too: ``gym.make("textgym/rg-basic_arithmetic-v0",
task="<name>")`` or :func:`make_reasoning_gym_text_env`."""

SYSTEM_PROMPT = (
    "Answer the question. Give only the final answer, in the form the question asks for."
)
_ANSWER_CHARS = 1000


class Answer(BaseModel):
    """The reply: one final answer."""

    answer: str = Field(max_length=_ANSWER_CHARS, description="the final answer")


class ReasoningGymEnv(gym.Env[str, str]):
    """One reasoning-gym question per episode; the reward is the task's score of the answer.

    Observations are the question (then, after a wrong attempt, a note to try again); actions
    are answer strings. ``info`` holds ``is_success`` (a full score) and ``score`` after each
    answer; the correct answer is never shown.

    Args:
        task: A reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``).
        attempts: Answers allowed per question; the episode ends at a full score or after the
            last attempt (terminated either way: the question is settled).
        config: Keyword arguments of the task's config (difficulty ranges and the like).
    """

    metadata = {"render_modes": []}

    def __init__(self, task: str, attempts: int = 1, config: dict[str, Any] | None = None):
        require("reasoning_gym", "reasoning-gym", f"textgym/rg-{task}-v0")
        from reasoning_gym.factory import DATASETS

        if task not in DATASETS:
            raise ValueError(f"Unknown reasoning-gym task {task!r}; see reasoning_gym.factory")
        if not (isinstance(attempts, int) and attempts >= 1):
            raise ValueError(f"attempts must be an int >= 1, got {attempts!r}")
        self.task, self.attempts, self.config = task, attempts, dict(config or {})
        self.observation_space = UnicodeText(max_length=100_000)
        self.action_space = UnicodeText(max_length=_ANSWER_CHARS)
        self.entry: dict[str, Any] | None = None
        self.dataset: Any = None
        self.tries = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Generate the question of ``seed`` (drawn from the env's generator when None)."""
        super().reset(seed=seed)
        question_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        from reasoning_gym import create_dataset

        self.dataset = create_dataset(self.task, size=1, seed=question_seed, **self.config)
        self.entry = self.dataset[0]
        self.tries = 0
        return self.entry["question"], {"task": self.task}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score ``action`` as the answer with the task's own ``score_answer``."""
        if self.entry is None:
            raise RuntimeError("Call reset() before step()")
        self.tries += 1
        try:  # the answer is untrusted model text: a task's scorer may choke on it
            score = float(self.dataset.score_answer(str(action), self.entry))
        except Exception:  # noqa: BLE001 - any scorer failure is a wrong answer
            score = 0.0
        if not math.isfinite(score):
            score = 0.0
        solved = score >= 1.0
        done = solved or self.tries >= self.attempts
        left = self.attempts - self.tries
        observation = "" if done else f"That is not right. Try again ({left} left)."
        info = {"score": score, "is_success": solved, "task": self.task}
        return observation, score, done, False, info


def as_answer(action: str) -> Answer:
    """The reply that sends ``action`` (an answer string): for example replies.

    Example:
        >>> as_answer("42").model_dump_json()
        '{"answer":"42"}'
    """
    return Answer(answer=action)


class AnswerParser(JSONActionParser):
    """Reads a reply ``{"answer": "..."}`` (:class:`Answer`) as the answer string.

    A class of its own so that a spec names it (``textgym.envs.reasoning_gym_text:AnswerParser``).
    """

    def __init__(self) -> None:
        super().__init__(Answer, from_action=as_answer)


def make_reasoning_gym_text_env(
    task: str = "basic_arithmetic",
    *,
    attempts: int = 1,
    config: dict[str, Any] | None = None,
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/rg-<task>-v0``: :class:`ReasoningGymEnv` behind a ``TextEnvWrapper``.

    Replies are ``{"answer": "..."}`` (:class:`Answer`); the question is the user message under
    :data:`SYSTEM_PROMPT`, and with several attempts the conversation keeps them all.

    Args:
        task: The reasoning-gym dataset name.
        attempts: Answers allowed per question.
        config: The task's config overrides.
        **wrapper_kwargs: Passed to :class:`~textgym.wrappers.TextEnvWrapper`.
    """
    env = ReasoningGymEnv(task, attempts=attempts, config=config)
    wrapper_kwargs.setdefault("formatter", observation_text)
    wrapper_kwargs.setdefault("parser", AnswerParser())
    wrapper_kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
    wrapper_kwargs.setdefault("history", attempts)
    return TextEnvWrapper(env, **wrapper_kwargs)
