"""Train on any text env with TRL's ``GRPOTrainer(environment_factory=...)``.

The env side is :func:`textgym.tool_env` (no torch); this module adds what TRL needs from the
tokenizer (a chat template that renders tool calls) and a seeded prompt dataset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from textgym.tool_calling import ToolEnv

__all__ = ["grpo_dataset", "with_tool_template"]

_CHATML_START = "<|im_start|>"


def with_tool_template(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give a ChatML tokenizer whose template ignores tools a tool-calling template, in place.

    GRPOTrainer refuses a template that cannot render ``assistant (tool_calls) -> tool``
    turns. SmolLM2 (the embedded model) writes ChatML but its template drops tools; it gets
    TRL's copy of the Qwen2.5 ChatML template, which TRL also knows how to parse tool calls
    from (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``). A template that already
    renders tool calls is left alone.

    Args:
        tokenizer: A tokenizer with a chat template.

    Returns:
        The same tokenizer.

    Raises:
        ValueError: For a non-ChatML template without tool support (set one yourself).

    Example:
        >>> from trl.chat_template_utils import supports_tool_calling
        >>> from textgym_agents.testing import load_tokenizer
        >>> tokenizer = load_tokenizer()
        >>> supports_tool_calling(tokenizer), supports_tool_calling(with_tool_template(tokenizer))
        (False, True)
    """
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    if supports_tool_calling(tokenizer):
        return tokenizer
    template = tokenizer.chat_template
    if not (isinstance(template, str) and _CHATML_START in template):
        raise ValueError(
            "The tokenizer's chat template cannot render tool calls and is not ChatML; set "
            "tokenizer.chat_template to a template with tool support (see trl/chat_templates)"
        )
    if _CHATML_START not in tokenizer.get_vocab():
        raise ValueError(f"The template uses {_CHATML_START} but the vocabulary lacks it")
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def grpo_dataset(
    env_class: type[ToolEnv], num_prompts: int, *, seed: int = 0, system_prompt: bool = True
) -> Dataset:
    """A prompt dataset for ``GRPOTrainer``: one row per episode start, seeded.

    Each row's ``seed`` (``seed + i``) goes to ``env.reset``, so the ``num_generations``
    completions GRPO compares for a row all start from the same state. With
    ``system_prompt=True`` the task is the system message (and ``reset()`` returns only the
    first observation); otherwise ``reset()`` puts the task in the user message.

    Args:
        env_class: A class built by :func:`textgym.tool_env`.
        num_prompts: Number of rows.
        seed: Seed of the first row.
        system_prompt: Put the task in a system message.

    Returns:
        A ``datasets.Dataset`` with ``prompt`` and ``seed`` columns.

    Example:
        >>> import textgym
        >>> rows = grpo_dataset(textgym.tool_env("textgym/Blackjack-v1"), 2, seed=7)
        >>> rows[1]["seed"], [m["role"] for m in rows[1]["prompt"]]
        (8, ['system', 'user'])
    """
    from datasets import Dataset

    if not isinstance(getattr(env_class, "task", None), str):
        raise TypeError(f"Expected a class built by textgym.tool_env, got {env_class!r}")
    if not (isinstance(num_prompts, int) and num_prompts >= 1):
        raise ValueError(f"Expected num_prompts to be an int >= 1, got {num_prompts!r}")
    user: dict[str, Any] = {"role": "user", "content": ""}
    prompt = [{"role": "system", "content": env_class.task}, user] if system_prompt else [user]
    return Dataset.from_dict(
        {"prompt": [prompt] * num_prompts, "seed": [seed + i for i in range(num_prompts)]}
    )
