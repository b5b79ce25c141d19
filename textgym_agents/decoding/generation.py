"""Free and grammar-constrained text generation for :class:`~textgym_agents.policy.PPOPolicy`.

One batched call over left-padded prompts that share a cached prefix — the lean decoding loop
(:mod:`~textgym_agents.decoding.decode_loop`) where it covers the model, else
``model.generate()`` — and the cut of each row back to the tokens the model actually sampled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from textgym_agents.decoding.constrained import GrammarMask
from textgym_agents.decoding.decode_loop import LeanDecoder, decode_rows, lean_decoder
from textgym_agents.decoding.shared_prefix import (
    CACHE_KWARG,
    CarriedCaches,
    decoder_of,
    generation_inputs,
)
from textgym_agents.ppo.config import PPOConfig

__all__ = ["Generation", "cut_reply", "generate_text", "last_prompt_states"]


@dataclass
class Generation:
    """Replies of one batched generation call, with the token ids training needs."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    texts: list[str]
    # Choice decoding: every row's choices (token ids); the response is one of them.
    choice_ids: list[list[list[int]]] | None = None
    # Choice decoding: each row's log-prob of its reply under the distribution over its
    # choices, and the value of its prompt, as training's scoring pass computes them.
    logps: list[float] | None = None
    values: list[float] | None = None
    # Choice decoding: each row's log-probs of all its choices, (K,) each.
    choice_logps: list[torch.Tensor] | None = None
    # Choice decoding with exploration (``explore`` > 0): each row's log-prob under the
    # mixture it was drawn from (:meth:`~textgym_agents.decoding.choices.ChoiceScores.explore`).
    behaviour_logps: list[float] | None = None
    # Rollout engine "vllm": the server's log-prob of each reply token (raw, temperature 1).
    # PPO never uses them as old log-probs; they are there to compare with the scoring pass.
    token_logps: list[list[float]] | None = None


@torch.no_grad()
def generate_text(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[list[int]],
    config: PPOConfig,
    *,
    eos_ids: set[int],
    max_new_tokens: int,
    greedy: bool = False,
    grammar: GrammarMask | None = None,
    critic: tuple[nn.Module, nn.Module] | None = None,
    carried: CarriedCaches | None = None,
) -> Generation:
    """Sample (or greedily pick) one reply per prompt in one ``generate()`` call.

    Args:
        model: The causal LM (the policy's PeftModel).
        tokenizer: Its tokenizer; its pad token pads the batch.
        prompts: Token ids of each row's prompt (chat prompt, then the reply prefix).
        config: Sampling settings (temperature, top-p/k), ``stop_strings`` and
            ``reply_prefix``, which starts every returned text.
        eos_ids: Token ids that end a reply.
        max_new_tokens: Token budget of a reply.
        greedy: Pick the most likely token at each step instead of sampling.
        grammar: Constrained decoding: the mask restricting each row to its reply grammar
            (built with the same ``max_new_tokens``); None for free text.
        critic: The model's decoder and a value head: each prompt's value is read from the
            hidden state of its last token in ``generate()``'s first forward pass
            (``Generation.values``), as scoring would compute it up to rounding.
        carried: The rows of the previous call: a prompt continuing one starts from its
            cache; this call's rows replace them.

    Returns:
        The prompts, each row's reply tokens (up to EOS or a stop string) and texts.
    """
    pad = tokenizer.pad_token_id
    input_ids, attention_mask, cache = generation_inputs(
        model, prompts, pad=pad, reserve=max_new_tokens, carried=carried
    )
    lean = lean_decoder(model) if config.lean_decoding else None
    if lean is not None and not lean.in_weights_dtype():
        lean = None  # autocast to another dtype: generate() follows it
    inputs = (model, tokenizer, input_ids, attention_mask, cache, config)
    budget = {"eos_ids": eos_ids, "max_new_tokens": max_new_tokens, "greedy": greedy}
    with last_prompt_states(critic[0]) if critic else nullcontext([]) as states:
        if lean is not None:
            sequences = _decode(lean, *inputs, grammar=grammar, **budget)
        else:
            sequences = _generate(*inputs, grammar=grammar, **budget)
    rows = [row[input_ids.shape[1] :].tolist() for row in sequences.cpu()]

    def cut(tokens: list[int]) -> list[int]:
        return cut_reply(tokens, tokenizer, eos_ids, config.stop_strings)

    responses = grammar.replies(rows, cut) if grammar is not None else [cut(r) for r in rows]
    if carried is not None:  # what each row ran: its generated tokens up to its reply's end
        ran = [row[: len(response)] for row, response in zip(rows, responses, strict=True)]
        carried.keep(prompts, ran, cache, attention_mask)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    prefix = config.reply_prefix
    values = critic[1](states[0]).float().tolist() if critic else None  # type: ignore[index]
    return Generation(prompts, responses, [prefix + text for text in texts], values=values)


def _generate(
    model: nn.Module,
    tokenizer: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    config: PPOConfig,
    *,
    eos_ids: set[int],
    max_new_tokens: int,
    greedy: bool,
    grammar: GrammarMask | None,
) -> torch.Tensor:
    """The sequences of one transformers ``generate()`` call, which extends ``cache``."""
    extra: dict[str, Any] = {CACHE_KWARG: cache}
    if grammar is not None:  # stop strings end a reply only where the grammar accepts
        extra["logits_processor"] = [grammar]
    elif config.stop_strings:
        extra.update(stop_strings=config.stop_strings, tokenizer=tokenizer)
    sampling: dict[str, Any] = {"do_sample": False, "top_k": None}
    if not greedy:
        sampling = {"do_sample": True, "temperature": config.temperature}
        sampling.update(top_p=config.top_p, top_k=config.top_k or None)
    return model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=sorted(eos_ids),
        use_cache=True,
        **sampling,
        **extra,
    )


def _decode(
    lean: LeanDecoder,
    model: nn.Module,
    tokenizer: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    config: PPOConfig,
    *,
    eos_ids: set[int],
    max_new_tokens: int,
    greedy: bool,
    grammar: GrammarMask | None,
) -> torch.Tensor:
    """``generate()``'s sequences, from the lean loop, which extends ``cache``.

    The model itself runs the prompts' uncached columns (hooks see that pass), then
    :func:`~textgym_agents.decoding.decode_loop.decode_rows` samples the replies.
    """
    cached = cache.get_seq_length()
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    hidden = decoder_of(model)(
        input_ids=input_ids[:, cached:],
        attention_mask=attention_mask,
        position_ids=positions[:, cached:],
        use_cache=True,
        **{CACHE_KWARG: cache},
    ).last_hidden_state
    head = model.get_output_embeddings()
    logits = head(hidden[:, -1].contiguous())  # a contiguous row: no copy of the head weight
    stops = config.stop_strings if grammar is None else ()

    def stopped(tokens: list[int]) -> bool:
        return _has_stop(tokenizer.decode(tokens), stops)

    return decode_rows(
        lean,
        logits.float(),
        input_ids,
        attention_mask,
        cache,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad=tokenizer.pad_token_id,
        greedy=greedy,
        temperature=config.temperature,
        top_k=config.top_k or None,
        top_p=config.top_p,
        processor=grammar,
        stopped=stopped if stops else None,
    )


@contextmanager
def last_prompt_states(decoder: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the final hidden state of each row's last prompt token during ``generate()``.

    ``generate()`` first runs the prompts' uncached tokens, which end every left-padded row at
    its last column; the hook keeps that column of the decoder's output (shape ``(B, H)``) as
    the one item of the yielded list, and ignores the decoding steps after it. The critic's
    value of a prompt is read from this hidden state, as scoring reads it.
    """
    states: list[torch.Tensor] = []

    def keep_first(module: nn.Module, args: Any, output: Any) -> None:
        if not states:
            states.append(output.last_hidden_state[:, -1].detach())

    handle = decoder.register_forward_hook(keep_first)
    try:
        yield states
    finally:
        handle.remove()


def cut_reply(
    tokens: list[int], tokenizer: Any, eos_ids: set[int], stop_strings: Sequence[str] = ()
) -> list[int]:
    """The tokens the model actually sampled: up to EOS or the first stop string (kept).

    A sequence that stops early is padded; when the pad token is also EOS, the padding
    after a stop string must not be mistaken for a sampled EOS. Tokens after a stop
    string (if generation ran on) are dropped, as if it had stopped there.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> _, tokenizer = tiny_model()
        >>> eos = tokenizer.eos_token_id
        >>> cut_reply([5, 6, eos, eos], tokenizer, {eos}) == [5, 6, eos]
        True
    """
    for i, token in enumerate(tokens):
        if stop_strings and _has_stop(tokenizer.decode(tokens[: i + 1]), stop_strings):
            return tokens[: i + 1]
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def _has_stop(text: str, stops: Sequence[str]) -> bool:
    return any(stop in text for stop in stops)
