"""Constrained decoding: sample only replies that satisfy the env's JSON schema (llguidance).

The env's parser gives the JSON schema of a valid reply; llguidance compiles it into a grammar
over the tokenizer's vocabulary, and a logits processor masks, row by row, every token the
grammar forbids during ``generate()``. Each reply keeps the mask of every position, so scoring
renormalises the same logits over the same tokens and PPO's first ratio is exactly 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

__all__ = [
    "CLOSE_MARGIN",
    "JSON_OPTIONS",
    "ConstrainedReply",
    "GrammarCompiler",
    "GrammarMask",
    "allowed_tokens",
    "decoding_mode",
    "mask_logits",
    "pack_bits",
    "unpack_bits",
]

# Replies are written the way json.dumps writes them (and the envs' example replies): one
# space after ',' and ':', no other whitespace. Free whitespace lets a small model pad forever.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SHIFTS = torch.arange(32, dtype=torch.int32)
# Budget: a reply follows a short finish once that plus CLOSE_MARGIN tokens (room for a
# token that opens more structure, e.g. '", "' before a required key) no longer fits; the
# finish is only looked for in the last _CLOSE_WATCH tokens.
CLOSE_MARGIN = 4
_CLOSE_WATCH = 32
_CLOSERS = '"}]0123456789, :-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'


def decoding_mode(
    mode: str,
    size: int,
    choices: Sequence[Sequence[str] | None] | None,
    schemas: Sequence[dict[str, Any] | None] | None,
) -> str:
    """How to decode a batch of ``size`` conversations: ``choices``, ``constrained`` or ``free``.

    ``auto`` uses choices when every conversation lists its valid replies, else constrained
    decoding when any has a reply schema (rows without one are free), else free text. The
    explicit modes raise when a conversation lacks what they need.

    Example:
        >>> decoding_mode("auto", 2, None, [{"type": "number"}, None])
        'constrained'
        >>> decoding_mode("auto", 1, [["stick", "hit"]], [{"type": "string"}])
        'choices'
    """
    if mode == "free":
        return "free"
    for name, hints in (("choice lists", choices), ("schemas", schemas)):
        if hints is not None and len(hints) != size:
            raise ValueError(f"Got {len(hints)} {name} for {size} conversations")
    every_choice = choices is not None and all(c is not None for c in choices)
    if mode == "choices" and not every_choice:
        raise ValueError(
            "config.decoding='choices' needs the valid replies of every conversation: "
            "pass choices=env.reply_choices() (a vector env: envs.call('reply_choices')), "
            "or use decoding='auto' to fall back to free text"
        )
    if mode == "constrained" and (schemas is None or any(s is None for s in schemas)):
        raise ValueError(
            "config.decoding='constrained' needs the reply schema of every conversation: "
            "pass schemas=[...] (textgym.reply_schemas(envs) gives a vector env's), "
            "or use decoding='auto' to fall back to free text"
        )
    if mode == "choices" or (mode == "auto" and every_choice):
        return "choices"
    if mode == "constrained" or (schemas is not None and any(s is not None for s in schemas)):
        return "constrained"
    return "free"


def pack_bits(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a ``(..., V)`` bool mask into ``(..., ceil(V / 32))`` int32 words.

    Token ``t`` is bit ``t % 32`` of word ``t // 32``: llguidance's bitmask layout.
    :func:`unpack_bits` is the inverse.

    Example:
        >>> words = pack_bits(torch.tensor([True, False, True] + [False] * 30))
        >>> words.tolist(), unpack_bits(words, 3).tolist()
        ([5, 0], [True, False, True])
    """
    size = allowed.shape[-1]
    padded = np.zeros((*allowed.shape[:-1], -(-size // 32) * 32), dtype=bool)
    padded[..., :size] = allowed.cpu().numpy()
    packed = np.packbits(padded, axis=-1, bitorder="little")
    return torch.from_numpy(packed.view("<i4").astype(np.int32))


def unpack_bits(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(..., W)`` int32 words to a ``(..., vocab_size)`` bool mask (see :func:`pack_bits`)."""
    bits = (words.unsqueeze(-1) >> _SHIFTS.to(words.device)) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


class ConstrainedReply(list):  # type: ignore[type-arg]
    """Token ids of a reply sampled under a grammar, with the tokens allowed at each position.

    ``allowed`` is ``(T, W)`` int32, one packed mask per token (see :func:`pack_bits`). A
    reply is a list of ints, so every path that carries token ids (generation, the rollout
    buffer, the trainer) carries its masks along, and scoring masks the same tokens.

    Example:
        >>> reply = ConstrainedReply([5, 7], pack_bits(torch.eye(8, dtype=torch.bool)[[5, 7]]))
        >>> reply == [5, 7], allowed_tokens([reply], 2, 8)[0].nonzero().tolist()
        (True, [[0, 5], [1, 7]])
    """

    def __init__(self, ids: Sequence[int], allowed: torch.Tensor) -> None:
        super().__init__(ids)
        if allowed.dim() != 2 or allowed.shape[0] != len(self):
            raise ValueError(
                f"Expected one packed mask per token, ({len(self)}, W), got {tuple(allowed.shape)}"
            )
        self.allowed = allowed


def allowed_tokens(
    responses: Sequence[Sequence[int]], width: int, vocab_size: int, device: Any = None
) -> torch.Tensor | None:
    """``(B, width, vocab_size)`` tokens allowed at each reply position.

    Positions of unconstrained replies, and the padding past a reply, allow every token; when
    no reply is constrained the result is None (nothing to mask).
    """
    constrained = [b for b, r in enumerate(responses) if isinstance(r, ConstrainedReply)]
    if not constrained:
        return None
    allowed = torch.ones((len(responses), width, vocab_size), dtype=torch.bool, device=device)
    for b in constrained:
        words = responses[b].allowed.to(device)  # type: ignore[attr-defined]
        allowed[b, : words.shape[0]] = unpack_bits(words, vocab_size)
    return allowed


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` with forbidden tokens at the dtype's minimum.

    A softmax of the result is the sampling distribution renormalised over the allowed tokens.
    The finite minimum (not -inf) keeps entropy free of ``0 * -inf`` NaNs and gives forbidden
    tokens zero gradient.

    Example:
        >>> masked = mask_logits(torch.zeros(1, 4), torch.tensor([[True, True, False, False]]), 1.0)
        >>> masked.softmax(-1).tolist()
        [[0.5, 0.5, 0.0, 0.0]]
    """
    if temperature != 1.0:
        logits = logits / temperature
    return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError as e:
        raise ImportError(
            "decoding='constrained' needs llguidance: pip install 'llguidance>=1.0,<2'"
        ) from e
    return llguidance


class GrammarCompiler:
    """Compiles reply schemas into llguidance matchers for one tokenizer, caching each grammar.

    Example:
        >>> from textgym_agents.testing import load_tokenizer
        >>> tokenizer = load_tokenizer()
        >>> compiler = GrammarCompiler(tokenizer, vocab_size=len(tokenizer))
        >>> schema = {"type": "object", "properties": {"action": {"enum": ["stick", "hit"]}},
        ...           "required": ["action"], "additionalProperties": False}
        >>> matcher = compiler.matcher(schema, tokenizer.encode('{"action": "'))
        >>> tokenizer.decode(compiler.closing(matcher))  # a short finish, for the token budget
        'hit"}'
        >>> matcher.consume_tokens(tokenizer.encode('hit"}')), matcher.is_accepting()
        (True, True)
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Collection[int] = ()) -> None:
        """Wrap a (fast) Hugging Face tokenizer.

        Args:
            tokenizer: The policy's tokenizer.
            vocab_size: Width of the model's logits (may exceed the tokenizer's vocabulary).
            eos_ids: Tokens that end a reply (default: the tokenizer's EOS).
        """
        llguidance = _llguidance()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids or [tokenizer.eos_token_id])
        self._ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=sorted(self.eos_ids)
        )
        self._templates: dict[tuple[str, tuple[int, ...]], Any] = {}
        # One-character tokens that close JSON quickly, tried in this order by closing().
        encoded = [tokenizer.encode(c, add_special_tokens=False) for c in _CLOSERS]
        self._closers = [ids[0] for ids in encoded if len(ids) == 1]

    def matcher(self, schema: dict[str, Any], prefix_ids: Sequence[int] = ()) -> Any:
        """A fresh ``llguidance.LLMatcher`` for ``schema`` that has consumed the reply prefix."""
        key = (json.dumps(schema, sort_keys=True), tuple(prefix_ids))
        if key not in self._templates:
            self._templates[key] = self._compile(schema, key[1])
        return self._templates[key].deep_copy()

    def _compile(self, schema: dict[str, Any], prefix_ids: tuple[int, ...]) -> Any:
        llguidance = _llguidance()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"Expected a JSON schema (a dict) for the replies, got {schema!r}"
            ) from e
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"llguidance cannot compile the reply schema: {matcher.get_error()}")
        if prefix_ids and not matcher.consume_tokens(list(prefix_ids)):
            raise ValueError(
                f"The reply prefix {self.tokenizer.decode(prefix_ids)!r} does not start any reply "
                "the env's schema allows; change config.reply_prefix (or set it to '') for "
                "constrained decoding"
            )
        return matcher

    def closing(self, matcher: Any, limit: int = 48) -> list[int] | None:
        """A short way to finish the reply from ``matcher``'s state ([] if it is complete).

        Forced tokens are taken as llguidance gives them; elsewhere the first allowed token of
        ``"}]0123456789,`` and the rest of the alphabet. None when no finish is found within
        ``limit`` tokens. ``matcher`` itself is not advanced.
        """
        probe, path = matcher.deep_copy(), []
        while not probe.is_accepting():
            forced = probe.compute_ff_tokens()
            step = forced or [t for t in self._closers if probe.validate_tokens([t]) == 1][:1]
            if not step or len(path) + len(step) > limit:
                return None
            probe.consume_tokens(step)
            path += step
        return path

    def mask(
        self,
        schemas: Sequence[dict[str, Any] | None],
        prefix_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        budget: int | None = None,
    ) -> GrammarMask:
        """A :class:`GrammarMask` for one ``generate()`` call, a grammar per row (None: free)."""
        matchers = [None if s is None else self.matcher(s, prefix_ids) for s in schemas]
        return GrammarMask(matchers, self, stop_strings=stop_strings, budget=budget)


class GrammarMask(LogitsProcessor):
    """Masks, row by row, the tokens each row's grammar forbids, and records every mask it applies.

    Each row has its own matcher (None: the row is free). EOS is allowed only where the grammar
    accepts; a stop string ends a reply only there too (nothing but EOS is allowed after it).
    With a ``budget`` (``max_new_tokens``), a row whose short finish (see
    :meth:`GrammarCompiler.closing`) plus :data:`CLOSE_MARGIN` tokens no longer fits in what is
    left follows that finish, so replies end complete instead of cut off. Every mask depends
    only on the grammar and the step, never on the logits. One instance serves one ``generate()``.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> model, tokenizer = tiny_model()
        >>> compiler = GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
        >>> mask = compiler.mask([{"enum": ["stick", "hit"]}])
        >>> prompt = torch.tensor([tokenizer.encode("Hit or stick?")])
        >>> output = model.generate(prompt, logits_processor=[mask], max_new_tokens=8,
        ...                         do_sample=True, pad_token_id=tokenizer.eos_token_id)
        >>> reply = mask.replies(output[:, prompt.shape[1]:].tolist(), list)[0]
        >>> tokenizer.decode(reply, skip_special_tokens=True) in ('"stick"', '"hit"')
        True
    """

    def __init__(
        self,
        matchers: Sequence[Any | None],
        compiler: GrammarCompiler,
        *,
        stop_strings: Sequence[str] = (),
        budget: int | None = None,
    ) -> None:
        self.matchers = list(matchers)
        self.compiler = compiler
        self.stop_strings = list(stop_strings)
        self.budget = budget
        self.done = [m is None for m in self.matchers]
        self.tokens: list[list[int]] = [[] for _ in self.matchers]
        self.masks: list[list[torch.Tensor]] = [[] for _ in self.matchers]
        words = -(-compiler.vocab_size // 32)
        self._bitmask = torch.full((len(self.matchers), words), -1, dtype=torch.int32)
        self._steps = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Advance every unfinished row by its last token, then mask ``scores`` (B, V)."""
        if self._steps:
            self._consume(input_ids[:, -1].tolist())
        self._steps += 1
        rows = [b for b, done in enumerate(self.done) if not done]
        if not rows:
            return scores
        fill = _llguidance().torch.fill_next_token_bitmask
        self._bitmask.fill_(-1)
        for b in rows:
            fill(self.matchers[b], self._bitmask, b)
            only = self._only(b)
            if only is not None:
                self._bitmask[b] = self._packed(only)
            if not self._bitmask[b].any():
                raise RuntimeError(f"The grammar allows no token: {self.matchers[b].get_error()}")
            self.masks[b].append(self._bitmask[b].clone())
        allowed = unpack_bits(self._bitmask, scores.shape[-1]).to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))

    def _consume(self, last: list[int]) -> None:
        for b, token in enumerate(last):
            if self.done[b]:
                continue
            self.tokens[b].append(token)
            if token in self.compiler.eos_ids:
                self.done[b] = True
            elif not self.matchers[b].consume_token(token):
                raise RuntimeError(f"The grammar rejected a token: {self.matchers[b].get_error()}")

    def _only(self, b: int) -> list[int] | None:
        """The tokens row ``b`` is restricted to at this step (a stop, or closing), or None."""
        matcher, eos = self.matchers[b], sorted(self.compiler.eos_ids)
        if self.stop_strings and matcher.is_accepting():
            text = self.compiler.tokenizer.decode(self.tokens[b])
            if any(stop in text for stop in self.stop_strings):
                return eos
        left = None if self.budget is None else self.budget - self._steps + 1
        if left is None or left > _CLOSE_WATCH:
            return None
        path = self.compiler.closing(matcher)
        if path is None or len(path) + CLOSE_MARGIN < left:
            return None
        return path[:1] or eos

    def _packed(self, tokens: list[int]) -> torch.Tensor:
        allowed = torch.zeros(self.compiler.vocab_size, dtype=torch.bool)
        allowed[tokens] = True
        return pack_bits(allowed)

    def replies(
        self, sampled: Sequence[Sequence[int]], cut: Callable[[list[int]], list[int]]
    ) -> list[list[int]]:
        """Each row's reply from its generated tokens.

        A constrained row ends at its first EOS (kept) and becomes a :class:`ConstrainedReply`
        holding the masks it was sampled under; a free row goes through ``cut``.
        """
        result: list[list[int]] = []
        for b, row in enumerate(sampled):
            tokens = list(row)
            if self.matchers[b] is None:
                result.append(cut(tokens))
                continue
            eos = self.compiler.eos_ids
            end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            result.append(ConstrainedReply(tokens[:end], torch.stack(self.masks[b][:end])))
        return result
