"""Shared fixtures for textgym_agents tests: the cached embedded tokenizer and a tiny Llama."""

from __future__ import annotations

import pytest

from textgym_agents.testing import load_tokenizer, tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded SmolLM2 tokenizer (read from GGUF once, then from textgym's cache)."""
    return load_tokenizer()


@pytest.fixture
def tiny(tokenizer):
    """A fresh seeded random 2-layer Llama over the embedded tokenizer's vocabulary."""
    return tiny_model(tokenizer)


@pytest.fixture
def policy_loss_calls(monkeypatch):
    """Record ``(logps, old_logps, mask)`` of every ``core.policy_loss`` call (it still runs)."""
    from textgym_agents.ppo import core

    calls = []
    original = core.policy_loss

    def spy(per_token_logps, old_per_token_logps, *args, **kwargs):
        calls.append((per_token_logps.detach().clone(), old_per_token_logps.clone(), args[1]))
        return original(per_token_logps, old_per_token_logps, *args, **kwargs)

    monkeypatch.setattr(core, "policy_loss", spy)
    return calls
