"""Grouped-query attention without copying keys and values: ``sdpa_gqa`` for CPU models.

With an attention mask (every scoring and training pass has one: padding, a shared-prefix
cache, the packed choice tree), transformers' ``sdpa`` repeats each key/value head for the
query heads that share it (``repeat_kv``, a copy per layer and per pass, and a sum in the
backward pass). On CPUs, ``scaled_dot_product_attention(..., enable_gqa=True)`` takes masks
and gives identical results without the copy: 18% faster forward + backward on SmolLM2-135M
(docs/performance.md). On CUDA a masked GQA call falls back to the math kernel, so
:func:`use_gqa_attention` switches only CPU models.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["GQA_ATTENTION", "gqa_sdpa_attention", "use_gqa_attention"]

GQA_ATTENTION = "sdpa_gqa"
"""Name under which :func:`gqa_sdpa_attention` is registered with transformers."""


def gqa_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` (B, H, L, D) over ``key``/``value`` (B, H_kv, S, D), mask as given.

    Same contract as transformers' ``sdpa_attention_forward`` (returns (B, L, H, D) and no
    weights); anything it does not cover (a position bias, soft-capping, single-token decode
    or a causal call without a mask over a longer cache) is passed to that function.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
        >>> model = LlamaForCausalLM(config).eval()
        >>> ids, mask = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
        >>> before = model(input_ids=ids, attention_mask=mask).logits
        >>> use_gqa_attention(model)
        True
        >>> after = model(input_ids=ids, attention_mask=mask).logits
        >>> torch.allclose(before, after, atol=1e-6)
        True
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_length, kv_length = query.shape[2], key.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = q_length > 1 and attention_mask is None and causal
    plain = groups > 1 and q_length > 1 and kwargs.get("position_bias") is None
    plain = plain and kwargs.get("softcap") is None and not (causal and kv_length > q_length)
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)


def use_gqa_attention(model: nn.Module) -> bool:
    """Switch a CPU model that uses ``sdpa`` with grouped-query heads to ``sdpa_gqa``.

    Returns whether the model now uses it (False for CUDA models, other attention
    implementations, or models without shared key/value heads).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    current = getattr(config, "_attn_implementation", None)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if current == GQA_ATTENTION:
        return True
    if current != "sdpa" or not on_cpu or not heads or heads == kv_heads:
        return False
    _register()
    model.set_attn_implementation(GQA_ATTENTION)
    return True
