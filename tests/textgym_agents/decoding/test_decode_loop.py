"""The lean decoding loop: the same steps as the model's own forward, the same replies as
transformers' ``generate()``, the same draws as its logits warpers."""

import dataclasses
import json

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.decoding import decode_loop
from textgym_agents.decoding.decode_loop import lean_decoder, sample_next, warp
from textgym_agents.decoding.shared_prefix import CACHE_KWARG, growing_cache
from textgym_agents.model.adapters import attach_lora
from textgym_agents.model.precision import mixed_precision
from textgym_agents.testing import perturb_adapter, tiny_model

SYSTEM = {"role": "system", "content": "You are a calculator agent. Answer in JSON, briefly."}
QUESTIONS = ["What is 12 * 7?", "What is 3 + 4 + 5 + 6 + 7 + 8 + 9?", "Compute 100 / 8."]


def gqa_policy(dtype=torch.float32, **settings):
    """A tiny grouped-query Llama policy whose adapter and value head are not zero."""
    model, tokenizer = tiny_model(num_heads=4, num_kv_heads=2, dtype=dtype)
    config = PPOConfig(**{"max_new_tokens": 10} | settings)
    return perturb_adapter(PPOPolicy(model, tokenizer, config=config), scale=0.2)


def steps_and_forward(model, ids, mask=None, dtype=None):
    """Logits of the last column: one lean step over a cache of the others, and a full pass."""
    decoder = lean_decoder(model)
    mask = torch.ones_like(ids) if mask is None else mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), mixed_precision(model, dtype=dtype):
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        cache = growing_cache(1)
        model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            **{CACHE_KWARG: cache},
        )
        decoder.prepare()
        attends = None if bool(mask.all()) else mask.bool()[:, None, None, :]
        step = decoder.step(ids[:, -1], positions[:, -1], cache, attends)
    return step, full.float()


@pytest.fixture
def choices(monkeypatch, tmp_path):
    """A machine with nothing chosen yet: an empty cache directory and process memory."""
    monkeypatch.setenv("TEXTGYM_CACHE", str(tmp_path))
    monkeypatch.setattr("textgym_agents.model.precision._CHOSEN", {})
    return tmp_path / "precision.json"


@pytest.mark.parametrize("ours", [False, True], ids=["torch-kernels", "loop-kernels"])
def test_a_step_gives_the_logits_of_the_full_forward_pass(ours, monkeypatch):
    """With either choice of attention kernel and adapter dtype."""
    monkeypatch.setattr(decode_loop, "_choice", lambda name, timings: ours)
    model = gqa_policy().model
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, 4:6] = 0  # a gap, as after a shared prefix
    step, full = steps_and_forward(model, ids, mask)
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-4)


def test_a_step_follows_the_adapter_after_its_weights_change_and_when_disabled():
    model = gqa_policy().model
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    before, _ = steps_and_forward(model, ids)
    with torch.no_grad():  # an optimizer step changes the weights in place
        model.base_model.model.model.layers[1].mlp.down_proj.lora_B["default"].weight.add_(0.5)
    after, full = steps_and_forward(model, ids)
    assert not torch.allclose(before, after, atol=1e-3)
    torch.testing.assert_close(after, full, atol=1e-4, rtol=1e-4)
    with model.disable_adapter():
        plain, full = steps_and_forward(model, ids)
    torch.testing.assert_close(plain, full, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(plain, after, atol=1e-3)


@pytest.mark.parametrize("ours", [False, True], ids=["torch-kernels", "loop-kernels"])
def test_a_bf16_step_under_mixed_precision_agrees_to_bf16_rounding(ours, monkeypatch):
    monkeypatch.setattr(decode_loop, "_choice", lambda name, timings: ours)
    model = gqa_policy(torch.bfloat16).model
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    step, full = steps_and_forward(model, ids, dtype=torch.bfloat16)
    assert (step - full).abs().max() < 0.05 * full.abs().max()
    assert torch.equal(step.argmax(-1), full.argmax(-1))


@pytest.mark.parametrize(
    ("default", "other", "chosen"), [(1.3, 1.0, True), (1.2, 1.0, False), (1.0, 2.0, False)]
)
def test_the_loops_own_kernel_is_chosen_only_when_clearly_faster(default, other, chosen, choices):
    assert decode_loop.CLEARLY_FASTER == 1.25
    name = f"test {default} {other}"
    assert decode_loop._choice(name, lambda: (default, other)) is chosen


def test_kernel_choices_are_made_once_a_machine_and_every_decoder_follows_them(
    choices, monkeypatch
):
    """Timings flip under load; a second decoder (a resumed run's model) must not re-time."""
    first = lean_decoder(gqa_policy().model)
    attend = first._attention(torch.zeros(1))
    kept = json.loads(choices.read_text())
    assert any(
        name.startswith("decode attention cpu")
        for entry in kept.values()
        for name in entry["choices"]
    )

    def fail(*args, **kwargs):
        raise AssertionError("timed again")

    monkeypatch.setattr(decode_loop, "_best_time", fail)
    second = lean_decoder(gqa_policy().model)
    assert second is not first
    assert second._attention(torch.zeros(1)).__name__ == attend.__name__
    monkeypatch.setattr("textgym_agents.model.precision._CHOSEN", {})  # another process
    assert lean_decoder(gqa_policy().model)._attention(torch.zeros(1)).__name__ == attend.__name__


def test_models_it_does_not_cover_keep_transformers_generate():
    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48}
    sizes |= {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert lean_decoder(attach_lora(Qwen2ForCausalLM(Qwen2Config(**sizes)))) is None
    dora = attach_lora(LlamaForCausalLM(LlamaConfig(**sizes)), {"use_dora": True})
    assert lean_decoder(dora) is None
    assert lean_decoder(LlamaForCausalLM(LlamaConfig(**sizes))) is not None  # no adapter at all


@pytest.mark.parametrize("top_k, top_p", [(None, 0.8), (5, None), (5, 0.5), (None, 0.999)])
def test_warped_logits_equal_transformers_warpers(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    expected = logits / 1.5
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(warp(logits, 1.5, top_k, top_p), expected)
    assert expected.isinf().any()  # something was dropped: the check can fail


def test_draws_come_from_the_warped_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    torch.manual_seed(0)
    draws = torch.cat([sample_next(logits, greedy=False, top_p=0.8) for _ in range(2000)])
    probs = warp(logits, top_p=0.8).softmax(-1)[0]
    counts = torch.bincount(draws, minlength=4) / 2000
    assert counts[probs == 0].sum() == 0
    torch.testing.assert_close(counts, probs, atol=0.04, rtol=0)


def policy_pair(**settings):
    """The same policy twice: decoding in the lean loop, and through ``generate()``."""
    lean = gqa_policy(**settings)
    plain = PPOPolicy(
        lean.model,
        lean.tokenizer,
        config=dataclasses.replace(lean.config, lean_decoding=False),
        value_head=lean.value_head,
    )
    return lean, plain


@pytest.mark.parametrize("greedy", [True, False])
def test_replies_equal_transformers_generate(greedy):
    lean, plain = policy_pair(stop_strings=["}"], temperature=1.3, top_p=0.9)
    chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    torch.manual_seed(1)
    ours = lean.generate(chats, greedy=greedy)
    torch.manual_seed(1)
    theirs = plain.generate(chats, greedy=greedy)
    assert ours.response_ids == theirs.response_ids
    assert ours.texts == theirs.texts
    assert len({tuple(r) for r in ours.response_ids}) > 1


def test_carried_rows_and_critic_values_equal_transformers_generate():
    lean, plain = policy_pair()
    chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    replies = {}
    for name, policy in (("lean", lean), ("plain", plain)):
        with policy.carrying_caches():
            first = policy.generate(chats, greedy=True)
            nxt = [
                c + [{"role": "assistant", "content": t}, {"role": "user", "content": "Result: 84"}]
                for c, t in zip(chats, first.texts, strict=True)
            ]
            replies[name] = (first, policy.generate(nxt, greedy=True))
            kept = [tokens for tokens, _ in policy._carried.rows]
        replies[name] += (kept,)
    (a1, a2, kept_a), (b1, b2, kept_b) = replies["lean"], replies["plain"]
    assert a1.response_ids == b1.response_ids and a2.response_ids == b2.response_ids
    assert kept_a == kept_b
    assert a1.values is not None and max(map(abs, a1.values)) > 1e-3
    torch.testing.assert_close(torch.tensor(a2.values), torch.tensor(b2.values))


def test_constrained_replies_equal_transformers_generate():
    pytest.importorskip("llguidance")
    lean, plain = policy_pair(decoding="constrained")
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    torch.manual_seed(2)
    ours = lean.generate(chats, schemas=[schema] * 3)
    torch.manual_seed(2)
    theirs = plain.generate(chats, schemas=[schema] * 3)
    assert ours.response_ids == theirs.response_ids
