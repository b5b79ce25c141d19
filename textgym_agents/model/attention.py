"""Grouped-query attention without copying keys and values: ``sdpa_gqa`` for CPU models.

With an attention mask (every scoring and training pass has one: padding, a shared-prefix
cache, the packed choice tree), transformers' ``sdpa`` repeats each key/value head for the
query heads that share it (``repeat_kv``, a copy per layer and per pass, and a sum in the
backward pass). On CPUs, ``scaled_dot_product_attention(..., enable_gqa=True)`` takes masks
and gives identical results without the copy: 18% faster forward + backward on SmolLM2-135M
(docs/performance.md). On CUDA a masked GQA call falls back to the math kernel, so
:func:`use_gqa_attention` switches only CPU models.

In bf16 the CPU flash kernel is slow at the short query lengths of choice and reply rows
(16 rows × 4-29 queries over ~140 keys: 12-16 ms forward + backward per layer, 3-5x what two
matmuls take), so small bf16 passes run :func:`grouped_attention` instead: the query heads of
one key/value head stacked into one matmul (still no copy of keys or values), the softmax in
float32. Which kernel runs depends on the pass's size, so a rollout pass and a training
micro-batch over the same turns may use different ones (as their layouts already differ).
Its saved scores grow with rows × queries × keys, so it is used only up to
:data:`EAGER_MAX_SCORES` of them; larger passes keep the flash kernel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "EAGER_MAX_SCORES",
    "GQA_ATTENTION",
    "gqa_sdpa_attention",
    "grouped_attention",
    "use_gqa_attention",
]

GQA_ATTENTION = "sdpa_gqa"
"""Name under which :func:`gqa_sdpa_attention` is registered with transformers."""

EAGER_MAX_SCORES = 1 << 20
"""Attention scores (rows × heads × queries × keys) up to which a bf16 pass runs
:func:`grouped_attention` rather than the flash kernel: at most ~6 MB kept per layer."""


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Masked attention for grouped-query heads in two matmuls, softmax in float32.

    ``query`` (B, H, L, D) attends to ``key``/``value`` (B, H_kv, S, D): the H / H_kv query
    heads that share a key/value head are stacked into one (B, H_kv, groups × L, D) matmul, so
    keys and values are not copied. The scores come out of that matmul in the inputs' dtype
    (as in transformers' eager attention; the flash kernel accumulates them in fp32), then
    the scaling, mask and softmax run in fp32. ``mask`` is boolean (True attends) or additive,
    broadcastable to (B, 1, L, S); a query that may attend to nothing gets a uniform average
    instead of NaN. Returns (B, H, L, D_v), like
    ``scaled_dot_product_attention(..., enable_gqa=True)``.

    Example:
        >>> q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
        >>> mask = torch.rand(2, 1, 3, 5) > 0.3
        >>> mask[..., 0] = True
        >>> expected = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k, v, attn_mask=mask, enable_gqa=True)
        >>> torch.allclose(grouped_attention(q, k, v, mask), expected, atol=1e-6)
        True
    """
    batch, heads, length, dim = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, groups * length, dim)
    scores = (stacked @ key.transpose(-1, -2)).float() * (scaling or dim**-0.5)
    scores = scores.view(batch, kv_heads, groups, length, kv_length)
    if causal:
        allowed = torch.ones(length, kv_length, dtype=torch.bool, device=query.device)
        mask = allowed.tril(kv_length - length)[None, None]
    if mask is not None:
        mask = mask[:, :, None]  # (B or 1, 1, 1, L, S): the same for every head
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask.float().clamp(min=torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1).to(value.dtype).view(batch, kv_heads, groups * length, -1)
    return (probs @ value).view(batch, heads, length, value.shape[-1])


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
    n_scores = query.numel() // query.shape[-1] * kv_length
    one_mask = attention_mask is None or attention_mask.shape[1] == 1  # the same for all heads
    small = n_scores <= EAGER_MAX_SCORES
    if query.dtype != torch.float32 and not dropout and one_mask and small:
        output = grouped_attention(query, key, value, attention_mask, scaling, causal)
        return output.transpose(1, 2).contiguous(), None
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
