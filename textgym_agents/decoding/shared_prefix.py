"""Run a batch's shared prefix once: every prompt of a text env starts with its system prompt.

Generation and scoring both find the prefix the rows share, run it once, and repeat its
key/value cache across the batch, so only each row's own tokens are computed per row.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn

__all__ = [
    "CACHE_KWARG",
    "RowsPass",
    "continue_tree",
    "run_rows",
    "SHARED_PREFIX_MIN",
    "common_prefix_length",
    "containing_rows",
    "decoder_hidden_states",
    "fork_cache",
    "generation_inputs",
    "prefix_cache",
    "shared_length",
]

SHARED_PREFIX_MIN = 16  # shorter shared prefixes are not worth a second model call
PREFILL_PADDING_MAX = 1.25
"""Generation prefills rows one at a time when padding them to the longest would run this many
times their own tokens (or more) in one batched pass."""
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


def containing_rows(sequences: Sequence[Sequence[int]]) -> list[int]:
    """For each sequence, the index of a longest sequence that begins with it (else itself).

    A row whose tokens begin another row needs no forward pass of its own: under causal
    attention its positions have the same hidden states inside the longer row (up to
    rounding). A multi-turn episode whose prompts keep the whole conversation is such a chain:
    each turn's prompt and reply begin the next turn's prompt. Rows are matched longest
    first, so the rows returned are those no other row contains; the result depends only on
    the sequences and their order.

    Example:
        >>> containing_rows([[1, 2], [1, 2, 3, 4], [5], [1, 2, 3]])
        [1, 1, 2, 1]
    """
    rows = [list(seq) for seq in sequences]
    owner = list(range(len(rows)))
    carriers: list[int] = []
    for b in sorted(owner, key=lambda b: (-len(rows[b]), b)):
        owner[b] = next((c for c in carriers if rows[c][: len(rows[b])] == rows[b]), b)
        if owner[b] == b:
            carriers.append(b)
    return owner


def shared_length(sequences: Sequence[Sequence[int]], max_shared: int) -> int:
    """How many leading tokens to run once for this batch (0 when not worth it)."""
    shared = min(common_prefix_length(sequences), max_shared)
    return shared if len(sequences) > 1 and shared >= SHARED_PREFIX_MIN else 0


def prefix_cache(model: nn.Module, prefix: Sequence[int], batch: int, device: Any) -> Any:
    """Key/value cache of ``prefix``, repeated for ``batch`` rows (differentiable)."""
    output = model(input_ids=torch.tensor([list(prefix)], device=device), use_cache=True)
    cache = getattr(output, CACHE_KWARG)
    cache.batch_repeat_interleave(batch)
    return cache


@dataclass
class RowsPass:
    """Output of :func:`run_rows`: hidden states, and what a continuation pass needs.

    Attributes:
        hidden: (B, W, H) final hidden states; column ``j`` is position ``offset + j``.
        offset: Length of the shared prefix that ran once (0 when none).
        cache: Key/value cache of every row (shared prefix + own tokens + right padding).
        attention_mask: (B, offset + W) mask of ``cache``'s positions.
    """

    hidden: torch.Tensor
    offset: int
    cache: Any
    attention_mask: torch.Tensor


def run_rows(
    decoder: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad: int,
    max_shared: int,
    keep_cache: bool = True,
) -> RowsPass:
    """Run right-padded ``sequences`` through ``decoder``, their shared prefix once.

    The shared prefix (see :func:`shared_length`) runs once and its cache serves every row;
    gradients flow through it, so training uses this path too. Right padding keeps position
    ids equal to those of the unpadded sequences. Without ``keep_cache`` (and without a
    shared prefix) no cache is built and ``cache`` is None.
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
    attention_mask = attention_mask.to(device)
    kwargs: dict[str, Any] = {"use_cache": keep_cache or shared > 0}
    if shared:
        cache = prefix_cache(decoder, sequences[0][:shared], len(rows), device)
        positions = torch.arange(shared, shared + width, device=device).expand(len(rows), -1)
        kwargs.update({CACHE_KWARG: cache, "position_ids": positions})
    output = decoder(input_ids=input_ids.to(device), attention_mask=attention_mask, **kwargs)
    cache = getattr(output, CACHE_KWARG, None)
    return RowsPass(output.last_hidden_state, shared, cache, attention_mask)


def decoder_hidden_states(
    decoder: nn.Module, sequences: Sequence[Sequence[int]], *, pad: int, max_shared: int
) -> tuple[torch.Tensor, int]:
    """Final hidden states of right-padded ``sequences``, and the offset of their first column.

    See :func:`run_rows`; column ``j`` of the result is position ``offset + j`` of every
    sequence.
    """
    result = run_rows(decoder, sequences, pad=pad, max_shared=max_shared, keep_cache=False)
    return result.hidden, result.offset


def continue_tree(
    decoder: nn.Module,
    first: RowsPass,
    lengths: Sequence[int],
    continuations: Sequence[Sequence[Sequence[int]]],
    *,
    pad: int,
) -> tuple[torch.Tensor, list[list[int]]]:
    """Hidden states of several continuations per row of ``first``, packed in that one row.

    Row ``b`` holds all of ``continuations[b]`` one after the other; a 4D attention mask lets
    each token see row ``b``'s cached sequence and the earlier tokens of its own continuation
    only, and its position continues right after ``lengths[b]`` (the unpadded length of the
    first pass's sequence). So each cached sequence is used once in place, however many
    continuations it has: nothing is copied per continuation, and memory grows with their
    total length, not with their number times the prompt length. ``first.cache`` is consumed.

    Returns:
        (B, C, H) hidden states, C the longest packed row (right padding), and for each row
        the start column of each of its continuations.
    """
    device = first.hidden.device
    width = max(1, max(sum(len(c) for c in row) for row in continuations))
    cached = first.attention_mask.shape[1]
    input_ids = torch.full((len(continuations), width), pad, dtype=torch.long)
    positions = torch.zeros((len(continuations), width), dtype=torch.long)
    allowed = torch.zeros((len(continuations), 1, width, cached + width), dtype=torch.bool)
    allowed[:, 0, :, :cached] = first.attention_mask[:, None, :].bool().cpu()
    starts: list[list[int]] = []
    for b, row in enumerate(continuations):
        starts.append([])
        column = 0
        for ids in row:
            n = len(ids)
            starts[-1].append(column)
            if n:
                span = slice(column, column + n)
                input_ids[b, span] = torch.tensor(list(ids), dtype=torch.long)
                positions[b, span] = lengths[b] + torch.arange(n)
                block = torch.ones((n, n), dtype=torch.bool).tril()
                allowed[b, 0, span, cached + column : cached + column + n] = block
            column += n
        for q in range(column, width):  # padding sees itself only (no empty softmax rows)
            allowed[b, 0, q, :] = False
            allowed[b, 0, q, cached + q] = True
    dtype = first.hidden.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    output = decoder(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **{CACHE_KWARG: first.cache},
    )
    return output.last_hidden_state, starts


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
    own = [len(p) - shared for p in prompts]
    if len(prompts) > 1 and len(prompts) * max(own) >= PREFILL_PADDING_MAX * sum(own):
        extra[CACHE_KWARG] = _prefill_rows(model, prompts, shared, width, device)
    elif shared:
        extra[CACHE_KWARG] = prefix_cache(model, prompts[0][:shared], len(prompts), device)
    return input_ids.to(device), attention_mask.to(device), extra


def _prefill_rows(
    model: nn.Module, prompts: Sequence[Sequence[int]], shared: int, width: int, device: Any
) -> Any:
    """The cache of ``[shared | left padding | own tokens but the last]``, one row at a time.

    Rows whose own tokens differ in length would be padded to the longest in one batched
    prefill; run alone, each computes only its own tokens (on a fork of the shared prefix's
    cache). The cache covers every column but the last, which ``generate()`` then runs for
    all rows. Padding columns hold zeros (the attention mask hides them).
    """
    from transformers import DynamicCache

    prefix = _extend(model, DynamicCache(), prompts[0][:shared], 0, device)
    rows = [
        _extend(model, fork_cache(prefix), prompt[shared:-1], shared, device)
        if len(prompt) - shared > 1
        else None
        for prompt in prompts
    ]
    source = next(c for c in (prefix, *rows) if c is not None and c.layers)
    columns, cache = width - 1, DynamicCache()

    def padded(layer: int, kind: str) -> torch.Tensor:
        like = getattr(source.layers[layer], kind)
        full = like.new_zeros((len(prompts), like.shape[1], columns, like.shape[3]))
        if shared:
            full[:, :, :shared] = getattr(prefix.layers[layer], kind)
        for b, row in enumerate(rows):
            if row is not None:
                own = getattr(row.layers[layer], kind)[0, :, shared:]
                full[b, :, columns - own.shape[1] :] = own
        return full

    for layer in range(len(source.layers)):
        cache.update(padded(layer, "keys"), padded(layer, "values"), layer)
    return cache


def _extend(model: nn.Module, cache: Any, tokens: Sequence[int], start: int, device: Any) -> Any:
    """``cache`` extended in place by ``tokens`` at positions ``start...`` (no logits kept)."""
    if tokens:
        ids = torch.tensor([list(tokens)], device=device)
        positions = torch.arange(start, start + len(tokens), device=device)[None]
        kwargs = {CACHE_KWARG: cache, "position_ids": positions, "logits_to_keep": 1}
        model(input_ids=ids, use_cache=True, **kwargs)
    return cache


def fork_cache(cache: Any) -> Any:
    """A copy of a ``DynamicCache`` whose layers can be extended without changing ``cache``.

    Its layers replace their key/value tensors when extended (``torch.cat``), so copying
    the layer objects is enough: the tensors themselves are shared, not copied.
    """
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    return fork
