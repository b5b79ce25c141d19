"""What PPO adds to a causal LM: a LoRA adapter (`attach_lora`, `load_adapter`) and a `ValueHead`.

The models themselves are loaded by :mod:`textgym_agents.model.loading`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

__all__ = ["LORA_DEFAULTS", "ValueHead", "attach_lora", "hidden_size_of", "load_adapter"]

logger = logging.getLogger(__name__)

LORA_DEFAULTS: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
LORA_DEFAULTS |= {"target_modules": "all-linear", "task_type": "CAUSAL_LM"}
"""`attach_lora` defaults. Dropout is 0 so PPO's old and new log-probs agree exactly."""


def attach_lora(
    model: PreTrainedModel, lora: LoraConfig | dict[str, Any] | None = None
) -> PeftModel:
    """Wrap ``model`` in a peft LoRA adapter (in place) with PPO-friendly defaults.

    Args:
        model: A causal LM without adapters. Its weights are frozen; only LoRA weights train.
        lora: A full `peft.LoraConfig`, or a dict overriding `LORA_DEFAULTS`
            (r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear").

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=1, num_attention_heads=2)
        >>> peft_model = attach_lora(LlamaForCausalLM(config), {"r": 4})
        >>> peft_model.peft_config["default"].r
        4
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        raise ValueError("Expected a base model without adapters, got a PeftModel")
    if lora is None or isinstance(lora, dict):
        overrides = dict(lora or {})
        known = {field.name for field in dataclasses.fields(LoraConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"Expected peft.LoraConfig fields as lora overrides, got {unknown}")
        config = LoraConfig(**{**LORA_DEFAULTS, **overrides})
    elif isinstance(lora, LoraConfig):
        config = lora
    else:
        raise TypeError(f"Expected a peft.LoraConfig, a dict or None, got {type(lora).__name__}")
    if config.lora_dropout:
        logger.warning(
            "lora_dropout=%s makes PPO's old and new log-probs differ; 0.0 is advised",
            config.lora_dropout,
        )
    with _quiet_peft():
        return get_peft_model(model, config)


def load_adapter(model: PreTrainedModel, path: str | os.PathLike[str]) -> PeftModel:
    """Load a saved LoRA adapter (peft format) onto ``model``, trainable.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> import tempfile
        >>> base, _ = tiny_model()
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     attach_lora(base).save_pretrained(tmp)
        ...     loaded = load_adapter(tiny_model()[0], tmp)
        >>> sum(p.requires_grad for p in loaded.parameters()) > 0
        True
    """
    from peft import PeftModel

    with _quiet_peft():
        return PeftModel.from_pretrained(model, path, is_trainable=True)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        # peft still calls a transformers 5 deprecated alias; users cannot act on the warning.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def hidden_size_of(model: nn.Module) -> int:
    """Return ``config.hidden_size`` of a transformers model, also through a `PeftModel`.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> hidden_size_of(LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16,
        ...     intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)))
        16
    """
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    size = getattr(config, "hidden_size", None)
    if not isinstance(size, int):
        raise ValueError(
            f"Expected a model whose config has an int hidden_size, got {type(model).__name__} "
            f"with config {type(config).__name__}"
        )
    return size


class ValueHead(nn.Module):
    """A linear critic on top of an LM's hidden states: ``(..., hidden) -> (...)`` values.

    Weights and bias start at zero: a single output unit has no symmetry to break, the first
    value estimates are a neutral 0 instead of noise scaled by the (often large, outlier-heavy)
    hidden states, and the value loss sends no gradient into a backbone shared with the policy
    until the head has learnt something. The head keeps its own dtype (float32 by default) and
    casts incoming hidden states to it, so a bf16 model still gets an fp32 critic.

    Example:
        >>> head = ValueHead(8)
        >>> head(torch.ones(2, 5, 8)).shape
        torch.Size([2, 5])
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size < 1:
            raise ValueError(f"Expected hidden_size to be a positive int, got {hidden_size!r}")
        self.hidden_size = hidden_size
        self.summary = nn.Linear(hidden_size, 1, dtype=dtype or torch.float32)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Map hidden states ``(..., hidden_size)`` to values ``(...)``."""
        if hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"Expected hidden states with last dim {self.hidden_size}, "
                f"got shape {tuple(hidden_states.shape)}"
            )
        # In the head's own dtype even under a caller's autocast (mixed precision): an fp32 critic.
        with torch.autocast(hidden_states.device.type, enabled=False):
            return self.summary(hidden_states.to(self.summary.weight.dtype)).squeeze(-1)
