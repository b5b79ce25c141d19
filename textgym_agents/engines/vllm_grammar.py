"""Constrained decoding on a vLLM server, with the masks training scores under rebuilt here.

The server samples each reply under the env's JSON schema with its llguidance backend
(``--structured-outputs-config '{"backend": "guidance"}'``, which a started server gets), given the
same grammar options as :class:`~textgym_agents.decoding.constrained.GrammarCompiler` (the schema's
``x-guidance`` key). The server returns token ids, not masks, so :func:`replay` walks each reply
through this process's own :class:`~textgym_agents.decoding.constrained.GrammarMask`: every position
gets the mask the HF path would have applied, the reply becomes a
:class:`~textgym_agents.decoding.constrained.ConstrainedReply`, and scoring renormalises over the
same tokens as for an HF rollout (PPO's first ratio is exactly 1).

Two things only this process knows: the token budget (a reply near ``max_new_tokens`` is forced
to a short finish) and stop strings (EOS is forced once the grammar accepts and a stop string
has appeared). Where our mask forces a token the server did not pick, the forced token is taken
and the rest of the reply follows our mask — the HF path would have forced the same tokens. A
server token that our grammar forbids where it does not force is a different grammar (the
server runs another backend): :class:`VLLMResponseError`, naming the fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from textgym_agents.decoding.constrained import JSON_OPTIONS, GrammarMask
from textgym_agents.decoding.generation import Generation
from textgym_agents.decoding.shared_prefix import common_prefix_length
from textgym_agents.engines.vllm_client import VLLMResponseError
from textgym_agents.engines.vllm_server import GUIDANCE_ARGS

if TYPE_CHECKING:
    from textgym_agents.engines.vllm_engine import VLLMEngine

__all__ = ["constrained_rollout", "replay", "server_schema"]


def server_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the grammar options of our compiler, for the server's llguidance.

    Our compiler passes :data:`~textgym_agents.decoding.constrained.JSON_OPTIONS` as defaults that
    the schema's own ``x-guidance`` overrides; the server's backend reads ``x-guidance`` only.

    Example:
        >>> server_schema({"enum": ["stick", "hit"]})["x-guidance"]["whitespace_flexible"]
        False
    """
    return {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}


def replay(grammar: GrammarMask, sampled: Sequence[Sequence[int]], budget: int) -> list[list[int]]:
    """Walk each row's server-sampled tokens through ``grammar``; return the replies it records.

    Args:
        grammar: A fresh mask with one grammar per row, built with ``budget`` and the stop
            strings (:meth:`~textgym_agents.decoding.constrained.GrammarCompiler.mask`).
        sampled: Each row's tokens as the server returned them (its EOS included).
        budget: ``max_new_tokens``.

    Returns:
        Each row's reply as a :class:`~textgym_agents.decoding.constrained.ConstrainedReply`: the
        server's tokens, except where our mask forces others (a short finish near the budget, EOS
        after a stop string).

    Raises:
        VLLMResponseError: A server token our grammar forbids at a position it does not force.

    Example:
        >>> from textgym_agents.testing import load_tokenizer
        >>> from textgym_agents.decoding.constrained import GrammarCompiler
        >>> tokenizer = load_tokenizer()
        >>> eos = tokenizer.eos_token_id
        >>> compiler = GrammarCompiler(tokenizer, len(tokenizer), {eos})
        >>> grammar = compiler.mask([{"enum": ["stick", "hit"]}], budget=16)
        >>> reply = replay(grammar, [tokenizer.encode('"hit"') + [eos]], 16)[0]
        >>> tokenizer.decode(reply), len(reply.allowed)  # one mask per token
        ('"hit"<|im_end|>', 4)
        >>> grammar = compiler.mask([{"enum": ["stick", "hit"]}], budget=4)
        >>> tokenizer.decode(replay(grammar, [tokenizer.encode('"st')], 4)[0])  # budget: forced
        '"hit"'
    """
    rows = len(sampled)
    vocab = grammar.compiler.vocab_size
    eos = min(grammar.compiler.eos_ids)
    chosen: list[list[int]] = [[] for _ in range(rows)]
    diverged = [False] * rows
    last = torch.zeros((rows, 1), dtype=torch.long)
    scores = torch.zeros((rows, vocab))  # the mask never depends on them; not modified
    for step in range(budget):
        if all(grammar.done):
            break
        allowed = grammar(last, scores) > float("-inf")
        for b in range(rows):
            if grammar.done[b]:
                last[b, 0] = eos  # ignored: the row is finished
                continue
            token = sampled[b][step] if not diverged[b] and step < len(sampled[b]) else None
            if token is None or not 0 <= token < vocab or not allowed[b, token]:
                token = _forced(grammar, allowed[b], b, step, token)
                diverged[b] = True
            chosen[b].append(token)
            last[b, 0] = token
    return grammar.replies(chosen, list)


def _forced(grammar: GrammarMask, allowed: torch.Tensor, b: int, step: int, token: Any) -> int:
    """The token our mask forces at this step; a server token it merely forbids is an error."""
    options = allowed.nonzero().flatten().tolist()
    if len(options) == 1 or set(options) <= grammar.compiler.eos_ids:
        return int(options[0])
    text = grammar.compiler.tokenizer.decode(grammar.tokens[b])
    raise VLLMResponseError(
        f"The vLLM server's reply {b} left the reply grammar at token {step} (after {text!r}, "
        f"got token {token!r}): the server must sample with the llguidance backend, the one "
        f"training scores under; start it with {GUIDANCE_ARGS[0]} "
        f"'{GUIDANCE_ARGS[1]}' (a server textgym starts has it)"
    )


def constrained_rollout(
    engine: VLLMEngine,
    prompts: list[list[int]],
    schemas: Sequence[dict[str, Any] | None],
    *,
    greedy: bool,
    max_new_tokens: int,
) -> Generation:
    """Replies under each row's schema (None: free text), sampled on the server, masks rebuilt.

    One request per distinct schema; free rows go through the engine's free-text path.
    ``Generation.token_logps`` holds the server's log-probs (under its grammar mask, at
    temperature 1) of the tokens it picked, up to the first token our mask forced instead.
    """
    policy, config = engine.policy, engine.policy.config
    if policy._prefix_ids():
        raise ValueError(
            f"decoding='constrained' on rollout_engine='vllm' needs reply_prefix='' (got "
            f"{config.reply_prefix!r}): the server's grammar starts at the first reply token "
            "and cannot skip a prefix already in the prompt"
        )
    responses: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    free = [b for b, schema in enumerate(schemas) if schema is None]
    if free:
        text = engine.generate(
            [prompts[b] for b in free], greedy=greedy, max_new_tokens=max_new_tokens
        )
        for b, ids, row_logps in zip(free, text.response_ids, text.token_logps or [], strict=True):
            responses[b], logps[b] = ids, row_logps
    groups: dict[str, list[int]] = {}
    for b, schema in enumerate(schemas):
        if schema is not None:
            groups.setdefault(json.dumps(schema, sort_keys=True), []).append(b)
    compiler = policy._grammar_compiler()
    for rows in groups.values():
        schema = schemas[rows[0]]
        assert schema is not None
        completions = engine.complete(
            [prompts[b] for b in rows],
            greedy=greedy,
            max_new_tokens=max_new_tokens,
            stop=(),  # applied by the replay, where the grammar accepts
            json_schema=server_schema(schema),
        )
        grammar = compiler.mask([schema] * len(rows), (), config.stop_strings, max_new_tokens)
        replies = replay(grammar, [c.token_ids for c in completions], max_new_tokens)
        for b, reply, completion in zip(rows, replies, completions, strict=True):
            # The server's log-probs hold for the tokens it picked, up to a forced one.
            kept = common_prefix_length([reply, completion.token_ids])
            responses[b], logps[b] = reply, completion.logps[:kept]
    texts = policy.tokenizer.batch_decode(responses, skip_special_tokens=True)
    return Generation(prompts, responses, texts, token_logps=logps)
