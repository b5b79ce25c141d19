"""``ChatCompletionsPolicy``: an OpenAI-compatible chat endpoint as a policy, standard library only.

It is a plain ``messages -> reply`` callable, so every textgym runner takes it as a policy.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from textgym.wrappers import Messages

__all__ = ["ChatAPIError", "ChatCompletionsPolicy"]

_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ChatAPIError(RuntimeError):
    """An OpenAI-compatible endpoint refused a request or answered something unreadable."""


class ChatCompletionsPolicy:
    """A policy that asks an OpenAI-compatible ``POST {base_url}/chat/completions`` for replies.

    Standard library only (``urllib``). Works with OpenAI, vLLM, llama.cpp's server, Ollama
    and other servers speaking the same API. Status 408/409/429/5xx and connection errors are
    retried with exponential backoff; other errors raise :class:`ChatAPIError` quoting the
    server's message.

    Example:
        >>> policy = ChatCompletionsPolicy("my-model", "http://localhost:8000/v1/")
        >>> policy.url
        'http://localhost:8000/v1/chat/completions'
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        *,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        timeout: float = 60.0,
        max_retries: int = 3,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        """Configure the endpoint.

        Args:
            model: The model name the server expects.
            base_url: The API root, including ``/v1`` (as in the OpenAI SDK).
            api_key: Sent as ``Authorization: Bearer <key>`` when given.
            temperature: Sampling temperature (0 for the most repeatable replies).
            max_tokens: Longest reply, in tokens.
            timeout: Seconds to wait for one response.
            max_retries: Retries of a failed request (retryable statuses and network errors).
            extra_body: More JSON fields for every request (``{"top_p": 0.9}``, ``stop``...).
        """
        if not (isinstance(model, str) and model):
            raise ValueError(f"Expected a model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Expected base_url to start with http:// or https://, got {base_url!r}"
            )
        if not (isinstance(max_retries, int) and max_retries >= 0):
            raise ValueError(f"Expected max_retries to be an int >= 0, got {max_retries!r}")
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.body = {"temperature": temperature, "max_tokens": max_tokens, **(extra_body or {})}
        self.timeout = timeout
        self.max_retries = max_retries

    def __repr__(self) -> str:
        return f"ChatCompletionsPolicy(model={self.model!r}, url={self.url!r})"  # no api key

    def __call__(self, messages: Messages) -> str:
        """Return the reply to ``messages`` (the message content; "" when the model sent none)."""
        payload = json.dumps({"model": self.model, "messages": list(messages), **self.body})
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url, data=payload.encode("utf-8"), headers=headers, method="POST"
        )
        response = self._send(request)
        try:
            content = response["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ChatAPIError(
                f"{self.url} answered without choices[0].message: {_excerpt(response)}"
            ) from None
        return content if isinstance(content, str) else ""

    def _send(self, request: urllib.request.Request) -> Any:
        for attempt in range(self.max_retries + 1):
            retry = attempt < self.max_retries
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
            except urllib.error.HTTPError as e:
                if retry and e.code in _RETRY_STATUS:
                    _backoff(attempt, e.headers.get("Retry-After"))
                    continue
                detail = e.read().decode("utf-8", "replace")
                raise ChatAPIError(f"{self.url} answered {e.code}: {_excerpt(detail)}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if retry:
                    _backoff(attempt, None)
                    continue
                reason = getattr(e, "reason", e)
                raise ChatAPIError(f"could not reach {self.url}: {reason}") from None
            try:
                return json.loads(body)
            except ValueError:
                raise ChatAPIError(f"{self.url} answered non-JSON: {_excerpt(body)}") from None
        raise AssertionError("unreachable")  # the last attempt returns or raises


def _backoff(attempt: int, retry_after: str | None) -> None:
    try:
        delay = float(retry_after) if retry_after is not None else 0.5 * 2**attempt
    except ValueError:
        delay = 0.5 * 2**attempt
    time.sleep(min(delay, 30.0))


def _excerpt(value: Any, limit: int = 300) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
