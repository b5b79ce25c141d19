"""Rebuilding the masks of server-sampled constrained replies (no server: real HF generation).

The real-server tests are in test_vllm_engine.py (slow tier).
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import textgym
from textgym_agents.decoding.constrained import JSON_OPTIONS, ConstrainedReply, GrammarCompiler
from textgym_agents.engines import VLLMResponseError
from textgym_agents.engines.vllm_grammar import replay, server_schema
from textgym_agents.engines.vllm_server import GUIDANCE_ARGS, server_command
from textgym_agents.testing import tiny_model

CALCULATOR = textgym.reply_schemas(gym.make("textgym/Calculator-v0"))
BLACKJACK = textgym.reply_schemas(gym.make("textgym/Blackjack-v1"))


@pytest.fixture(scope="module")
def model_and_compiler():
    model, tokenizer = tiny_model()
    compiler = GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    return model, tokenizer, compiler


def hf_constrained(model, tokenizer, compiler, schemas, budget, stop_strings=(), seed=0):
    """Replies sampled in this process under ``schemas``: what the HF rollout path records."""
    grammar = compiler.mask(schemas, (), stop_strings, budget)
    prompt = torch.tensor([tokenizer.encode("Reply in JSON.")] * len(schemas))
    torch.manual_seed(seed)
    output = model.generate(
        prompt,
        logits_processor=[grammar],
        max_new_tokens=budget,
        do_sample=True,
        pad_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return grammar.replies(output[:, prompt.shape[1] :].tolist(), list)


@pytest.mark.parametrize("budget", [40, 12])
def test_replay_of_an_hf_sample_gives_its_tokens_and_masks(model_and_compiler, budget):
    model, tokenizer, compiler = model_and_compiler
    schemas = [CALCULATOR, BLACKJACK, CALCULATOR]
    for seed in range(3):
        sampled = hf_constrained(model, tokenizer, compiler, schemas, budget, seed=seed)
        # The server returns its EOS; a reply cut by the budget has none.
        replies = replay(compiler.mask(schemas, (), (), budget), sampled, budget)
        for reply, expected in zip(replies, sampled, strict=True):
            assert isinstance(reply, ConstrainedReply)
            assert list(reply) == list(expected)
            assert torch.equal(reply.allowed, expected.allowed)


def test_a_server_reply_past_the_budget_finish_is_forced_like_hf(model_and_compiler):
    _, tokenizer, compiler = model_and_compiler
    budget = 20  # the server, not knowing it, wrote on past it
    long = tokenizer.encode('{"tool": "calculator", "expression": "123456789 * 987654321"}')
    reply = replay(compiler.mask([CALCULATOR], (), (), budget), [long], budget)[0]
    assert len(long) > budget >= len(reply)
    assert tokenizer.decode(reply) == '{"tool": "calculator", "expression": "123"}<|im_end|>'
    kept = next(i for i, (a, b) in enumerate(zip(reply, long, strict=False)) if a != b)
    assert tokenizer.decode(reply[kept:]) == '"}<|im_end|>'  # forced; the rest is the server's
    matcher = compiler.matcher(CALCULATOR)
    assert matcher.consume_tokens(list(reply[:-1])) and matcher.is_accepting()


def test_a_stop_string_forces_eos_where_the_grammar_accepts(model_and_compiler):
    _, tokenizer, compiler = model_and_compiler
    eos = tokenizer.eos_token_id
    schema = {"type": "integer"}  # accepts after every digit, and may go on
    server = tokenizer.encode("1234") + [eos]  # the server does not know the stop string
    assert len(server) == 5
    plain = replay(compiler.mask([schema], (), (), 40), [server], 40)[0]
    stopped = replay(compiler.mask([schema], (), ["3"], 40), [server], 40)[0]
    assert tokenizer.decode(plain) == "1234<|im_end|>"
    assert tokenizer.decode(stopped) == "123<|im_end|>"
    assert stopped.allowed.shape[0] == 4


def test_a_token_the_grammar_forbids_is_a_clear_error(model_and_compiler):
    _, tokenizer, compiler = model_and_compiler
    loose = tokenizer.encode('{ "action": "hit"}')  # whitespace our grammar does not allow
    with pytest.raises(VLLMResponseError, match="llguidance backend.*structured-outputs-config"):
        replay(compiler.mask([BLACKJACK], (), (), 40), [loose], 40)


def test_the_server_gets_our_grammar_options():
    sent = server_schema(BLACKJACK)
    assert sent["x-guidance"] == JSON_OPTIONS and sent["properties"] == BLACKJACK["properties"]
    own = server_schema({"type": "string", "x-guidance": {"whitespace_flexible": True}})
    assert own["x-guidance"]["whitespace_flexible"] is True
    assert own["x-guidance"]["item_separator"] == JSON_OPTIONS["item_separator"]
    command = server_command("python", "/models/smol", 8000)
    assert command[command.index(GUIDANCE_ARGS[0]) + 1] == GUIDANCE_ARGS[1]
