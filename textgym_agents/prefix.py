"""Run a batch's shared prefix once: every prompt of a text env starts with its system prompt.

Generation and scoring both find the prefix the rows share, run it once, and repeat its
key/value cache across the batch, so only each row's own tokens are computed per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import transformers
from torch import nn

__all__ = [
    "CACHE_KWARG",
    "SHARED_PREFIX_MIN",
    "common_prefix_length",
    "decoder_hidden_states",
    "generation_inputs",
    "prefix_cache",
    "shared_length",
]

SHARED_PREFIX_MIN = 16  # shorter shared prefixes are not worth a second model call
# transformers 5 renamed the past_key_values argument of forward() and generate() to cache.
CACHE_KWARG = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all sequences share.

    Example:
        >>> common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]])
        2
    """
    first = sequences[0]
    length = min(len(seq) for seq in sequences)
    for seq in sequences[1:]:
        n = 0
        while n < length and seq[n] == first[n]:
            n += 1
        length = n
    return length


def shared_length(sequences: Sequence[Sequence[int]], max_shared: int) -> int:
    """How many leading tokens to run once for this batch (0 when not worth it)."""
    shared = min(common_prefix_length(sequences), max_shared)
    return shared if len(sequences) > 1 and shared >= SHARED_PREFIX_MIN else 0


def prefix_cache(model: nn.Module, prefix: Sequence[int], batch: int, device: Any) -> Any:
    """Key/value cache of ``prefix``, repeated for ``batch`` rows (differentiable)."""
    output = model(input_ids=torch.tensor([list(prefix)], device=device), use_cache=True)
    cache = getattr(output, "cache", None) or output.past_key_values
    cache.batch_repeat_interleave(batch)
    return cache


def decoder_hidden_states(
    decoder: nn.Module, sequences: Sequence[Sequence[int]], *, pad: int, max_shared: int
) -> tuple[torch.Tensor, int]:
    """Final hidden states of right-padded ``sequences``, and the offset of their first column.

    The shared prefix (see :func:`shared_length`) runs once and its cache serves every row;
    gradients flow through it, so training uses this path too. Right padding keeps position
    ids equal to those of the unpadded sequences. Column ``j`` of the result is position
    ``offset + j`` of every sequence.
    """
    device = next(decoder.parameters()).device
    shared = shared_length(sequences, max_shared)
    rows = [list(seq[shared:]) for seq in sequences]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
    attention_mask[:, :shared] = 1
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, shared : shared + len(row)] = 1
    kwargs: dict[str, Any] = {"use_cache": False}
    if shared:
        cache = prefix_cache(decoder, sequences[0][:shared], len(rows), device)
        positions = torch.arange(shared, shared + width, device=device).expand(len(rows), -1)
        kwargs = {CACHE_KWARG: cache, "use_cache": True, "position_ids": positions}
    output = decoder(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs
    )
    return output.last_hidden_state, shared


def generation_inputs(
    model: nn.Module, prompts: Sequence[Sequence[int]], *, pad: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``input_ids``, ``attention_mask`` and extra ``generate()`` kwargs for a batch.

    Rows are laid out as ``[shared | left padding | own tokens]``; ``generate()`` derives
    positions from the attention mask, so the gap is invisible, and the shared part comes
    from a cache computed once.
    """
    shared = shared_length(prompts, min(len(p) for p in prompts) - 1)
    width = shared + max(len(p) - shared for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        own = len(prompt) - shared
        input_ids[row, :shared] = torch.tensor(prompt[:shared], dtype=torch.long)
        input_ids[row, width - own :] = torch.tensor(prompt[shared:], dtype=torch.long)
        attention_mask[row, :shared] = 1
        attention_mask[row, width - own :] = 1
    device = next(model.parameters()).device
    extra: dict[str, Any] = {}
    if shared:
        extra[CACHE_KWARG] = prefix_cache(model, prompts[0][:shared], len(prompts), device)
    return input_ids.to(device), attention_mask.to(device), extra
