"""Any callable ``messages -> reply`` as a policy: the plain ``env.step(reply)`` loop and its stats.

``evaluate_callable`` plays episodes with a function, a scripted bot or a chat API;
``ChatCompletionsPolicy`` calls an OpenAI-compatible endpoint with the standard library only.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from textgym.wrappers import Messages

__all__ = ["ChatAPIError", "ChatCompletionsPolicy", "Episode", "Evaluation", "evaluate_callable"]

Policy = Callable[[Messages], str]
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Episode:
    """One played episode.

    Attributes:
        seed: The seed of its reset.
        episode_return: Sum of the text env's rewards (invalid replies count with their penalty).
        length: Replies sent (``env.step`` calls).
        invalid: Replies the text env rejected.
        success: The final step's ``is_success``, or None when the env does not report it.
        truncated: Whether the episode was cut short rather than terminated.
    """

    seed: int
    episode_return: float
    length: int
    invalid: int
    success: bool | None
    truncated: bool


@dataclass(frozen=True)
class Evaluation:
    """Summary of :func:`evaluate_callable`.

    Attributes:
        episodes: Every episode, in play order.
        mean_return: Mean episode return.
        std_return: Standard deviation of the returns (population).
        mean_length: Mean replies per episode.
        invalid_rate: Invalid replies per reply, over all episodes.
        success_rate: Share of successful episodes, or None when the env never reports
            ``is_success`` (an episode that ends without the key counts as failed).
    """

    episodes: list[Episode] = field(repr=False)
    mean_return: float
    std_return: float
    mean_length: float
    invalid_rate: float
    success_rate: float | None

    def __str__(self) -> str:
        n = len(self.episodes)
        text = (
            f"{n} episode{'' if n == 1 else 's'}: return {self.mean_return:+.3f} "
            f"± {self.std_return:.3f}, length {self.mean_length:.2f}, "
            f"invalid replies {self.invalid_rate:.1%}"
        )
        if self.success_rate is not None:
            text += f", success {self.success_rate:.1%}"
        return text


def evaluate_callable(
    policy: Policy,
    env: gym.Env[Messages, str],
    n_episodes: int = 10,
    *,
    seed: int = 0,
    max_steps: int = 1000,
    on_episode: Callable[[Episode], None] | None = None,
) -> Evaluation:
    """Play ``n_episodes`` with ``policy`` on a text env and summarise them.

    The loop is just ``reply = policy(messages)``; ``env.step(reply)``. The policy sees the
    same prompt a trained model sees; its reply is untrusted text the env parses.

    Args:
        policy: Any callable from chat messages to reply text (a function, a scripted bot,
            :class:`ChatCompletionsPolicy`, ``PPOPolicy.act``).
        env: A text env.
        n_episodes: Episodes to play; episode i resets with ``seed + i``.
        seed: Seed of the first episode.
        max_steps: Replies after which an episode without an end is stopped (counted as
            truncated); guards against envs without a time limit.
        on_episode: Called with each finished :class:`Episode` (progress, logging).

    Returns:
        The :class:`Evaluation`.

    Example:
        >>> import textgym
        >>> env = gym.make("textgym/Blackjack-v1")
        >>> result = evaluate_callable(lambda messages: '{"action": "stick"}', env, 4)
        >>> result.mean_return, result.invalid_rate, result.success_rate
        (0.0, 0.0, 0.5)
        >>> print(result)
        4 episodes: return +0.000 ± 1.000, length 1.00, invalid replies 0.0%, success 50.0%
    """
    if not callable(policy):
        raise TypeError(f"Expected policy to be a callable messages -> reply, got {policy!r}")
    for name, value in [("n_episodes", n_episodes), ("max_steps", max_steps)]:
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"Expected {name} to be an int >= 1, got {value!r}")
    episodes = []
    for i in range(n_episodes):
        episode = _play(policy, env, seed + i, max_steps)
        episodes.append(episode)
        if on_episode is not None:
            on_episode(episode)
    returns = [e.episode_return for e in episodes]
    mean = sum(returns) / len(returns)
    replies = sum(e.length for e in episodes)
    reported = any(e.success is not None for e in episodes)
    return Evaluation(
        episodes=episodes,
        mean_return=mean,
        std_return=math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns)),
        mean_length=replies / len(episodes),
        invalid_rate=sum(e.invalid for e in episodes) / max(replies, 1),
        success_rate=sum(bool(e.success) for e in episodes) / len(episodes) if reported else None,
    )


def _play(policy: Policy, env: gym.Env[Messages, str], seed: int, max_steps: int) -> Episode:
    messages, info = env.reset(seed=seed)
    total, length, invalid = 0.0, 0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        reply = policy(messages)
        if not isinstance(reply, str):
            raise TypeError(f"The policy must return the reply as str, got {type(reply).__name__}")
        messages, reward, terminated, truncated, info = env.step(reply)
        total += float(reward)
        length += 1
        invalid += bool(info.get("invalid", False))
        truncated = truncated or (length >= max_steps and not terminated)
    success = info.get("is_success")
    return Episode(
        seed=seed,
        episode_return=total,
        length=length,
        invalid=invalid,
        success=None if success is None else bool(success),
        truncated=bool(truncated),
    )


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
