"""LoRA adapters and the value head (textgym_agents.model.adapters), on a tiny Llama."""

from __future__ import annotations

import re

import pytest
import torch
from peft import LoraConfig, PeftModel

from textgym_agents.model.adapters import LORA_DEFAULTS, ValueHead, attach_lora, hidden_size_of
from textgym_agents.testing import logits_of

PROMPTS = ["Hi", "Tell me a long story about a dragon, please.", "What is 2 + 2?"]


def test_attach_lora_defaults_and_frozen_base(tiny):
    model, _ = tiny
    peft_model = attach_lora(model)
    assert isinstance(peft_model, PeftModel)
    config = peft_model.peft_config["default"]
    assert config.r == 16
    assert config.lora_alpha == 32
    assert config.lora_dropout == 0.0
    assert config.task_type == "CAUSAL_LM"
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in peft_model.named_parameters() if not p.requires_grad]
    assert trainable and frozen
    assert all("lora_" in n for n in trainable)
    assert not any("lora_" in n for n in frozen)
    # "all-linear" reaches every projection in attention and MLP, but not the tied lm_head.
    targets = {name.rsplit(".", 1)[-1] for name in config.target_modules}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_attach_lora_dict_overrides_defaults(tiny):
    model, _ = tiny
    peft_model = attach_lora(model, {"r": 4, "target_modules": ["q_proj", "v_proj"]})
    config = peft_model.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 32, 0.0)
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert LORA_DEFAULTS["r"] == 16  # the defaults are not mutated


def test_attach_lora_accepts_a_lora_config(tiny):
    model, _ = tiny
    peft_model = attach_lora(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert peft_model.peft_config["default"].r == 2


def test_attach_lora_rejects_bad_input(tiny, tokenizer):
    model, _ = tiny
    with pytest.raises(
        ValueError,
        match=re.escape("Expected peft.LoraConfig fields as lora overrides, got ['rank']"),
    ):
        attach_lora(model, {"rank": 8})
    with pytest.raises(
        TypeError, match=re.escape("Expected a peft.LoraConfig, a dict or None, got int")
    ):
        attach_lora(model, 8)
    peft_model = attach_lora(model)
    with pytest.raises(
        ValueError, match=re.escape("Expected a base model without adapters, got a PeftModel")
    ):
        attach_lora(peft_model)


def test_attach_lora_disable_adapter_gives_base_logits(tiny):
    model, tokenizer = tiny
    base_logits = logits_of(model, tokenizer)
    peft_model = attach_lora(model)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
    adapted = logits_of(peft_model, tokenizer)
    assert not torch.allclose(adapted, base_logits)
    with peft_model.disable_adapter():
        torch.testing.assert_close(logits_of(peft_model, tokenizer), base_logits, rtol=0, atol=0)


def test_hidden_size_of_through_peft(tiny):
    model, _ = tiny
    assert hidden_size_of(model) == 64
    assert hidden_size_of(attach_lora(model)) == 64
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Expected a model whose config has an int hidden_size, got Linear with config NoneType"
        ),
    ):
        hidden_size_of(torch.nn.Linear(2, 2))


def test_value_head_shapes_and_dtype():
    head = ValueHead(8)
    assert head.summary.weight.dtype == torch.float32
    assert head(torch.randn(2, 5, 8)).shape == (2, 5)
    assert head(torch.randn(3, 8)).shape == (3,)
    values = head(torch.randn(2, 5, 8, dtype=torch.bfloat16))
    assert values.dtype == torch.float32  # bf16 hidden states still get an fp32 critic
    assert torch.equal(values, torch.zeros(2, 5))  # zero init: neutral first estimates
    assert ValueHead(8, dtype=torch.bfloat16)(torch.randn(4, 8)).dtype == torch.bfloat16


def test_value_head_learns_and_validates():
    head = ValueHead(4)
    hidden = torch.randn(6, 4, requires_grad=True)
    head(hidden).sum().backward()
    assert head.summary.weight.grad is not None and head.summary.weight.grad.abs().sum() > 0
    with pytest.raises(
        ValueError, match=re.escape("Expected hidden states with last dim 4, got shape (2, 3)")
    ):
        head(torch.randn(2, 3))
    with pytest.raises(
        ValueError, match=re.escape("Expected hidden_size to be a positive int, got 0")
    ):
        ValueHead(0)


def test_value_head_on_model_hidden_states(tiny):
    model, tokenizer = tiny
    head = ValueHead(hidden_size_of(model))
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1]  # (B, T, H)
    assert head(hidden).shape == batch.input_ids.shape
