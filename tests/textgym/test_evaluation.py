import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import textgym  # registers the textgym/ ids
from textgym import ChatAPIError, ChatCompletionsPolicy, Episode, TextEnvWrapper, evaluate

LAKE_PATH = ["right", "right", "down", "down", "down", "right"]


class ChatServer:
    """A local OpenAI-compatible ``POST /v1/chat/completions``; ``answer(body)`` gives the reply.

    ``answer`` returns the reply text, or ``(status, body, headers)`` for anything else.
    """

    def __init__(self, answer):
        self.answer, self.requests = answer, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                result = server.answer(body)
                if isinstance(result, str):
                    message = {"role": "assistant", "content": result}
                    result = (200, {"choices": [{"index": 0, "message": message}]}, {})
                status, payload, headers = result
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def scripted(replies):
    """A policy sending ``replies`` in turn, forever."""
    calls = iter(range(10**9))
    return lambda messages: replies[next(calls) % len(replies)]


def test_a_callable_is_evaluated_as_the_plain_step_loop():
    replies = ["hit", "I'd rather not say", '{"action": "stick"}']
    result = evaluate(scripted(replies), gym.make("textgym/Blackjack-v1"), 5, seed=3)

    policy, env, expected = scripted(replies), gym.make("textgym/Blackjack-v1"), []
    for seed in range(3, 8):
        messages, _ = env.reset(seed=seed)
        total, invalid, length, done = 0.0, 0, 0, False
        while not done:
            messages, reward, terminated, truncated, info = env.step(policy(messages))
            total, invalid, length = total + reward, invalid + info["invalid"], length + 1
            done = terminated or truncated
        success = info["is_success"]
        expected.append(Episode(seed, total, length, invalid, success, truncated, index=seed - 3))
    assert result.episodes == expected
    assert result.mean_return == pytest.approx(sum(e.episode_return for e in expected) / 5)
    lengths = sum(e.length for e in expected)
    assert result.mean_length == lengths / 5
    assert result.invalid_rate == sum(e.invalid for e in expected) / lengths > 0
    assert result.success_rate == sum(e.success for e in expected) / 5


def test_success_rate_only_where_the_env_reports_it():
    lake = evaluate(
        scripted([f'{{"action": "{move}"}}' for move in LAKE_PATH]),
        gym.make("textgym/FrozenLake-v1", is_slippery=False),
        2,
    )
    assert (lake.success_rate, lake.mean_return, lake.mean_length) == (1.0, 1.0, 6.0)
    cart = evaluate(lambda m: "0", TextEnvWrapper(gym.make("CartPole-v1")), 2)
    assert cart.success_rate is None and "success" not in str(cart)


def test_max_steps_stops_endless_episodes_and_on_episode_sees_each():
    seen = []
    result = evaluate(
        lambda m: "0.5", gym.make("textgym/Pendulum-v1"), 3, max_steps=4, on_episode=seen.append
    )
    assert seen == result.episodes
    assert [(e.seed, e.length, e.truncated) for e in seen] == [
        (0, 4, True),
        (1, 4, True),
        (2, 4, True),
    ]


@pytest.mark.parametrize(
    ("policy", "kwargs", "error", "message"),
    [
        ("stick", {}, TypeError, "Expected policy to be a callable messages -> reply"),
        (lambda m: "stick", {"n_episodes": 0}, ValueError, "Expected n_episodes to be an int >= 1"),
        (lambda m: None, {}, TypeError, "The policy must return the reply as str, got NoneType"),
    ],
)
def test_bad_arguments(policy, kwargs, error, message):
    with pytest.raises(error, match=message):
        evaluate(policy, gym.make("textgym/Blackjack-v1"), **kwargs)


def test_chat_completions_policy_sends_the_prompt_and_plays():
    moves = iter(LAKE_PATH)
    with ChatServer(
        lambda body: f'Going {(move := next(moves))}: {{"action": "{move}"}}'
    ) as server:
        policy = ChatCompletionsPolicy(
            "lake-model", server.base_url, api_key="sk-test", extra_body={"seed": 7}
        )
        env = gym.make("textgym/FrozenLake-v1", is_slippery=False)
        result = evaluate(policy, env, 1)
    assert (result.success_rate, result.invalid_rate, result.mean_length) == (1.0, 0.0, 6.0)
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test"
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "model": "lake-model",
        "messages": env.reset(seed=0)[0],
        "temperature": 0.0,
        "max_tokens": 256,
        "seed": 7,
    }
    assert "sk-test" not in repr(policy)


def test_no_api_key_no_header_and_missing_content_is_an_empty_reply():
    message = {"role": "assistant", "content": None, "tool_calls": []}
    with ChatServer(lambda body: (200, {"choices": [{"message": message}]}, {})) as server:
        assert ChatCompletionsPolicy("m", server.base_url + "/")([]) == ""
    assert "Authorization" not in server.requests[0][1]


def test_retryable_errors_are_retried():
    answers = iter([(503, {"error": "busy"}, {"Retry-After": "0"}), "stick"])
    with ChatServer(lambda body: next(answers)) as server:
        assert ChatCompletionsPolicy("m", server.base_url, max_retries=1)([]) == "stick"
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((400, {"error": {"message": "bad model"}}, {}), r"answered 400: .*bad model"),
        ((503, b"down", {"Retry-After": "0"}), "answered 503: down"),
        ((200, b"<html>", {}), "answered non-JSON: <html>"),
        ((200, {"id": "x"}, {}), r"answered without choices\[0\].message: \{'id': 'x'\}"),
    ],
)
def test_server_errors_raise_chat_api_error(answer, message):
    with ChatServer(lambda body: answer) as server:
        policy = ChatCompletionsPolicy("m", server.base_url, max_retries=1)
        with pytest.raises(ChatAPIError, match=message):
            policy([{"role": "user", "content": "hi"}])
    assert len(server.requests) == (2 if answer[0] == 503 else 1)


def test_unreachable_server():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = ChatCompletionsPolicy("m", f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(ChatAPIError, match=f"could not reach http://127.0.0.1:{port}/v1"):
        policy([])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "Expected a model name, got ''"),
        ({"base_url": "localhost:8000"}, "Expected base_url to start with http"),
        ({"max_retries": -1}, "Expected max_retries to be an int >= 0, got -1"),
    ],
)
def test_bad_policy_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChatCompletionsPolicy(**{"model": "m", **kwargs})


class StickOnHighTotals(textgym.PolicyBase):
    """A batched policy whose reply depends only on the prompt, recording ``greedy``."""

    def __init__(self):
        self.batches, self.greedy = [], []

    def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        self.batches.append(len(batch))
        self.greedy.append(greedy)
        return ['{"action": "hit"}' if "12" in m[-1]["content"] else '{"action": "stick"}'
                for m in batch]  # fmt: skip


def test_results_do_not_depend_on_how_many_envs_play_the_episodes():
    env = gym.make("textgym/Blackjack-v1")
    one, many = StickOnHighTotals(), StickOnHighTotals()
    alone = evaluate(one, env, 12, seed=5, num_envs=1)
    batched = evaluate(many, env, 12, seed=5, num_envs=4)
    assert [(e.seed, e.episode_return, e.length) for e in alone.episodes] == [
        (e.seed, e.episode_return, e.length) for e in batched.episodes
    ]
    assert max(one.batches) == 1 and max(many.batches) == 4  # the model's calls were batched
    assert set(one.greedy) == {True}  # greedy unless asked to sample
    evaluate(one, env, 2, greedy=False)
    assert one.greedy[-1] is False


class Counting(gym.Wrapper):
    """Counts the resets of the env it wraps; not copyable from a spec (no recorded args)."""

    def __init__(self, env):
        super().__init__(env)
        self.resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        return super().reset(**kwargs)


def test_the_env_passed_is_played_and_one_that_cannot_be_copied_plays_them_all():
    env = Counting(gym.make("textgym/Blackjack-v1"))
    with pytest.warns(UserWarning, match="the env passed plays them one at a time"):
        result = evaluate(StickOnHighTotals(), env, 5, num_envs=4)
    assert env.resets == 5 and len(result.episodes) == 5
    copyable = gym.make("textgym/Blackjack-v1")
    shared = evaluate(StickOnHighTotals(), copyable, 8, num_envs=4)
    assert len(shared.episodes) == 8 and {e.seed for e in shared.episodes} == set(range(8))
    assert copyable.unwrapped.np_random_seed in range(8)  # it played some of them itself
