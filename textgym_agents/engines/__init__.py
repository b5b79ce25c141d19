"""Rollout engines besides transformers ``generate``: a vLLM server (``rollout_engine="vllm"``).

See docs/vllm.md. Nothing here imports vLLM: the server runs in its own environment and is
reached over HTTP.
"""

from __future__ import annotations

from textgym_agents.engines.vllm_client import (
    Completion,
    VLLMClient,
    VLLMResponseError,
    VLLMServerError,
    VLLMVersionError,
)
from textgym_agents.engines.vllm_engine import VLLMEngine, model_dir_of
from textgym_agents.engines.vllm_server import VLLMServer, default_server_python, server_command

__all__ = [
    "Completion",
    "VLLMClient",
    "VLLMEngine",
    "VLLMResponseError",
    "VLLMServer",
    "VLLMServerError",
    "VLLMVersionError",
    "default_server_python",
    "model_dir_of",
    "server_command",
]
