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
