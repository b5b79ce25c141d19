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
from transformers.cache_utils import DynamicLayer

__all__ = [
    "CACHE_KWARG",
    "CarriedCaches",
    "PrefixPass",
    "RowsPass",
    "continue_tree",
    "run_rows",
    "SHARED_PREFIX_MIN",
    "common_prefix_length",
    "containing_rows",
    "continued_states",
    "decoder_of",
    "decoder_hidden_states",
    "fork_cache",
    "generation_inputs",
    "growing_cache",
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


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (a ``PeftModel`` or not): the layers, without the head.

    Filling a cache needs no logits: the head over a prompt's positions is a (L, vocab)
    product (in bf16, a 300-token system prompt spends more on it than on a layer), and
    transformers runs even one position's (``logits_to_keep=1``, batch > 1) as a batched
    product that copies the whole head weight first.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix, base)


def prefix_cache(model: nn.Module, prefix: Sequence[int], batch: int, device: Any) -> Any:
    """Key/value cache of ``prefix``, repeated for ``batch`` rows (differentiable).

    ``model`` is a decoder stack (:func:`decoder_of`) or a causal LM, whose head then runs too.
    """
    output = model(input_ids=torch.tensor([list(prefix)], device=device), use_cache=True)
    cache = getattr(output, CACHE_KWARG)
    cache.batch_repeat_interleave(batch)
    return cache


class PrefixPass:
    """A prefix every row of a minibatch starts with, run once for all of its forward passes.

    Training splits a minibatch into passes (micro-batches), and each would run the rows'
    shared prefix (the system prompt) again, forward and backward. A :func:`run_rows` given
    this object takes the prefix's keys and values from it instead: they are computed on first
    use, every pass repeats them for its rows as leaves of its own graph, and
    :meth:`backward` sends the gradients the passes left on those leaves through the prefix's
    computation once. The numbers are those of a pass that runs the prefix itself.
    """

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self.computed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.leaves: list[tuple[torch.Tensor, torch.Tensor]] = []

    def cache(self, decoder: nn.Module, batch: int, device: Any) -> Any:
        """A cache of the prefix for ``batch`` rows (differentiable up to the leaves)."""
        if not self.computed:
            output = decoder(input_ids=torch.tensor([self.tokens], device=device), use_cache=True)
            layers = getattr(output, CACHE_KWARG).layers
            self.computed = [(layer.keys, layer.values) for layer in layers]
            self.leaves = [
                (
                    k.detach().requires_grad_(k.requires_grad),
                    v.detach().requires_grad_(v.requires_grad),
                )
                for k, v in self.computed
            ]
        cache = transformers.DynamicCache()
        for index, (keys, values) in enumerate(self.leaves):
            cache.update(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1), index)
        return cache

    def backward(self) -> None:
        """Back-propagate the gradients the passes left on the prefix's keys and values."""
        pairs = [
            (tensor, leaf.grad)
            for computed, leaves in zip(self.computed, self.leaves, strict=True)
            for tensor, leaf in zip(computed, leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self.computed, self.leaves = [], []


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
    prefix: PrefixPass | None = None,
) -> RowsPass:
    """Run right-padded ``sequences`` through ``decoder``, their shared prefix once.

    The shared prefix (see :func:`shared_length`) runs once and its cache serves every row;
    gradients flow through it, so training uses this path too. Where every sequence starts
    with ``prefix``'s tokens (at most ``max_shared`` of them), that prefix is the shared part
    and its cache comes from ``prefix``. Right padding keeps position ids equal to those of
    the unpadded sequences. Without ``keep_cache`` (and without a shared prefix) no cache is
    built and ``cache`` is None.
    """
    device = next(decoder.parameters()).device
    given = len(prefix.tokens) if prefix is not None else 0
    if given and (
        given > max_shared or any(list(seq[:given]) != prefix.tokens for seq in sequences)  # type: ignore[union-attr]
    ):
        given = 0
    shared = given or shared_length(sequences, max_shared)
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
        if given:
            cache = prefix.cache(decoder, len(rows), device)  # type: ignore[union-attr]
        else:
            cache = prefix_cache(decoder, sequences[0][:shared], len(rows), device)
        positions = torch.arange(shared, shared + width, device=device).expand(len(rows), -1)
        kwargs.update({CACHE_KWARG: cache, "position_ids": positions})
    output = decoder(input_ids=input_ids.to(device), attention_mask=attention_mask, **kwargs)
    cache = getattr(output, CACHE_KWARG, None)
    return RowsPass(output.last_hidden_state, shared, cache, attention_mask)


def decoder_hidden_states(
    decoder: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad: int,
    max_shared: int,
    prefix: PrefixPass | None = None,
) -> tuple[torch.Tensor, int]:
    """Final hidden states of right-padded ``sequences``, and the offset of their first column.

    See :func:`run_rows`; column ``j`` of the result is position ``offset + j`` of every
    sequence.
    """
    result = run_rows(
        decoder, sequences, pad=pad, max_shared=max_shared, keep_cache=False, prefix=prefix
    )
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


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys and values into room kept free at its end.

    ``DynamicLayer`` concatenates at every update, copying the whole cache at every decoding
    step (18% of a batch-16 step on the calculator's prompts, docs/performance.md); this one
    allocates its length plus ``reserve`` positions once and writes each step in place, so
    ``keys``/``values`` are views of the filled part (same numbers). Only for generation:
    forks of it would share the buffer, so :func:`fork_cache` takes ``DynamicLayer`` caches.
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = reserve
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new states after the filled part; return views of all of it."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.get_seq_length()
        length = filled + key_states.shape[-2]
        if self.buffers is None or length > self.buffers[0].shape[-2]:
            room = length + self.reserve
            self.buffers = tuple(  # type: ignore[assignment]
                new.new_empty((*new.shape[:2], room, new.shape[-1]))
                for new in (key_states, value_states)
            )
            if filled:
                self.buffers[0][:, :, :filled] = self.keys  # type: ignore[index]
                self.buffers[1][:, :, :filled] = self.values  # type: ignore[index]
        keys, values = self.buffers  # type: ignore[misc]
        keys[:, :, filled:length] = key_states
        values[:, :, filled:length] = value_states
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        return self.keys, self.values


def growing_cache(reserve: int, source: Any = None) -> Any:
    """A cache of :class:`GrowingLayer` objects with room for ``reserve`` more positions.

    With ``source`` (a ``DynamicCache``), it starts from a copy of its keys and values.
    """
    cache = transformers.DynamicCache()
    cache.layer_class_to_replicate = lambda: GrowingLayer(reserve)
    for index, layer in enumerate(source.layers if source is not None else ()):
        cache.update(layer.keys, layer.values, index)
    return cache


class CarriedCaches:
    """The key/value cache of each row of the last generation call, for prompts continuing it.

    In an episode whose prompts keep the conversation, a turn's prompt begins with the
    previous turn's prompt and reply. After a call, :meth:`keep` stores each row's cache
    (batch 1, its prompt and reply tokens); the next call starts each prompt from the kept
    row that shares the longest prefix with it and computes only the tokens past that prefix
    (:func:`generation_inputs`). Only the last call's rows are kept, so memory is bounded by
    one batch of caches. A cache is valid for the weights (and adapter) that computed it:
    :meth:`clear` once they change.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[list[int], Any]] = []
        self.owner: Any = None  # what computed the rows (the policy's adapter name)

    def clear(self) -> None:
        """Forget every kept row."""
        self.rows = []

    def find(self, prompt: Sequence[int]) -> tuple[int, Any]:
        """The longest prefix of ``prompt[:-1]`` a kept row holds, and that row's cache.

        The prompt's last token is left out: generation runs it to sample the first reply
        token. Returns ``(0, None)`` when no row shares a token.
        """
        best, found = 0, None
        for tokens, cache in self.rows:
            n = common_prefix_length([tokens, prompt[:-1]]) if prompt[:-1] else 0
            if n > best:
                best, found = n, cache
        return best, found

    def keep(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        cache: Any,
        attention_mask: torch.Tensor,
    ) -> None:
        """Keep each row of a finished ``generate()`` call, replacing the rows kept before.

        Args:
            prompts: Each row's prompt tokens.
            responses: Each row's reply tokens (a prefix of what it generated).
            cache: ``generate()``'s final cache: the prompt columns of ``attention_mask``,
                then one column per generated token but the last (which was never run).
            attention_mask: (B, W) the prompts' layout (1 where a row has a token).
        """
        width = attention_mask.shape[1]
        rows = []
        for b, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            fed = max(0, min(len(response) - 1, cache.get_seq_length() - width))
            columns = torch.cat(
                [attention_mask[b].nonzero().flatten().cpu(), torch.arange(width, width + fed)]
            ).to(attention_mask.device)
            row = transformers.DynamicCache()
            for layer, part in enumerate(cache.layers):
                keys = part.keys[b : b + 1].index_select(2, columns)
                row.update(keys, part.values[b : b + 1].index_select(2, columns), layer)
            rows.append((list(prompt) + list(response[:fed]), row))
        self.rows = rows


def continued_states(
    decoder: nn.Module, prompts: Sequence[Sequence[int]], carried: CarriedCaches
) -> torch.Tensor:
    """(B, H) final hidden state of each prompt's last token, run on a carried row's cache.

    Each prompt runs alone, only past the prefix its best kept row holds (the whole prompt
    when none shares a token); the kept rows are not changed.
    """
    device = next(decoder.parameters()).device
    states = []
    for prompt in prompts:
        start, kept = carried.find(prompt)
        cache = fork_cache(kept, start) if kept is not None else transformers.DynamicCache()
        output = decoder(
            input_ids=torch.tensor([list(prompt[start:])], device=device),
            position_ids=torch.arange(start, len(prompt), device=device)[None],
            use_cache=True,
            **{CACHE_KWARG: cache},
        )
        states.append(output.last_hidden_state[0, -1])
    return torch.stack(states)


def generation_inputs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    pad: int,
    reserve: int = 0,
    carried: CarriedCaches | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``input_ids``, ``attention_mask`` and the key/value cache to decode a batch from.

    Rows are laid out as ``[shared | left padding | own tokens]``; decoding derives
    positions from the attention mask, so the gap is invisible, and the shared part comes
    from a cache computed once. With ``carried``, a prompt that shares the shared part (or
    more) with a row of the last call starts from that row's cache.
    The cache (a :func:`growing_cache`) has room for ``reserve`` generated tokens.
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
    own = [len(p) - shared for p in prompts]
    starts = [carried.find(p) if carried else (0, None) for p in prompts]
    # A kept row that holds the shared part (or more) saves running it again.
    starts = [(n, cache) if n and n >= shared else (0, None) for n, cache in starts]
    continued = any(cache is not None for _, cache in starts)
    if continued or (
        len(prompts) > 1 and len(prompts) * max(own) >= PREFILL_PADDING_MAX * sum(own)
    ):
        # Filled with every column but the last: room for that column and the reply.
        cache = growing_cache(1 + reserve)
        _prefill_rows(model, prompts, shared, width, device, starts, cache)
    elif shared:
        prefix = prefix_cache(decoder_of(model), prompts[0][:shared], len(prompts), device)
        cache = growing_cache(width - shared + reserve, prefix)
    else:
        cache = growing_cache(width + reserve)
    return input_ids.to(device), attention_mask.to(device), cache


def _prefill_rows(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    shared: int,
    width: int,
    device: Any,
    starts: Sequence[tuple[int, Any]],
    cache: Any,
) -> None:
    """Fill ``cache`` with ``[shared | left padding | own tokens but the last]``, row by row.

    Rows whose own tokens differ in length would be padded to the longest in one batched
    prefill; run alone, each computes only its own tokens, on a fork of the shared prefix's
    cache or, where ``starts[b]`` is ``(n, cache)``, on the first ``n`` positions of a carried
    row's cache (:class:`CarriedCaches`). The filled cache covers every column but the last,
    which ``generate()`` then runs for all rows. Padding columns hold zeros (the attention
    mask hides them).
    """
    from transformers import DynamicCache

    prefix = None
    if shared and any(cache is None for _, cache in starts):
        prefix = _extend(model, DynamicCache(), prompts[0][:shared], 0, device)
    rows = []
    for prompt, (start, carried) in zip(prompts, starts, strict=True):
        if carried is not None:
            row = fork_cache(carried, start)
        else:
            start, row = shared, fork_cache(prefix) if prefix is not None else DynamicCache()
        rows.append(_extend(model, row, prompt[start:-1], start, device))
    source = next((c for c in rows if c.layers), None)
    if source is None:  # every prompt is a single token: nothing to cache
        return
    columns = width - 1

    def padded(layer: int, kind: str) -> torch.Tensor:
        like = getattr(source.layers[layer], kind)
        full = like.new_zeros((len(prompts), like.shape[1], columns, like.shape[3]))
        for b, row in enumerate(rows):
            if row.layers:  # positions [0, len(prompt) - 1): the shared part, then its own
                kept = getattr(row.layers[layer], kind)[0]
                full[b, :, :shared] = kept[:, :shared]
                own = kept[:, shared:]
                full[b, :, columns - own.shape[1] :] = own
        return full

    for layer in range(len(source.layers)):
        cache.update(padded(layer, "keys"), padded(layer, "values"), layer)


def _extend(model: nn.Module, cache: Any, tokens: Sequence[int], start: int, device: Any) -> Any:
    """``cache`` extended in place by ``tokens`` at positions ``start...`` (no logits kept)."""
    if tokens:
        ids = torch.tensor([list(tokens)], device=device)
        positions = torch.arange(start, start + len(tokens), device=device)[None]
        kwargs = {CACHE_KWARG: cache, "position_ids": positions}
        decoder_of(model)(input_ids=ids, use_cache=True, **kwargs)
    return cache


def fork_cache(cache: Any, length: int | None = None) -> Any:
    """A copy of a ``DynamicCache`` whose layers can be extended without changing ``cache``.

    Its layers replace their key/value tensors when extended (``torch.cat``), so copying
    the layer objects is enough: the tensors themselves are shared, not copied. With
    ``length``, the copy holds the first ``length`` positions only.
    """
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    if length is not None:
        for layer in fork.layers:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
    return fork
