"""examples/api_model_eval.py against a local OpenAI-compatible server (no network), and its
plain-function policy."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym

import textgym
from textgym.envs.classic import BlackjackFormatter

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "api_model_eval.py"
BLACKJACK = "textgym/Blackjack-v1"


def load_example():
    spec = importlib.util.spec_from_file_location("api_model_eval", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "OMP_NUM_THREADS": "1", **(env or {})},
    )


class ChatServer:
    """A local ``POST /v1/chat/completions``; ``answer(body)`` returns ``(status, payload)``."""

    def __init__(self, answer):
        self.answer, self.requests = answer, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                status, payload = server.answer(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
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


def hesitant_stick():
    """Prose first (an invalid reply), then always stick: the 'model' behind the stub server."""
    replies = iter(["Let me think about the odds first."])
    return lambda messages: next(replies, 'I stick. {"action": "stick"}')


def completion(text):
    return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def test_api_model_through_a_local_server_evaluates_like_the_function():
    model = hesitant_stick()
    with ChatServer(lambda body: completion(model(body["messages"]))) as server:
        args = ["--base-url", server.base_url, "--model", "stub-model", "--api-key", "sk-test"]
        result = run(*args, "--episodes", "3", "--seed", "5")
    assert result.returncode == 0, result.stderr
    expected = textgym.evaluate(hesitant_stick(), gym.make(BLACKJACK), 3, seed=5)
    assert expected.invalid_rate == 0.25  # one invalid reply in 4
    assert result.stdout.splitlines() == [
        f"stub-model at {server.base_url}/chat/completions on {BLACKJACK}",
        str(expected),
    ]
    assert len(server.requests) == 4
    path, headers, body = server.requests[0]
    assert (path, headers["Authorization"]) == ("/v1/chat/completions", "Bearer sk-test")
    assert body["model"] == "stub-model" and body["temperature"] == 0.0
    assert body["messages"] == gym.make(BLACKJACK).reset(seed=5)[0]  # the env's prompt as is
    retry = server.requests[1][2]["messages"][-1]["content"]
    assert retry.startswith("Your last reply was invalid (no JSON object found in the reply")


def test_endpoint_from_environment_variables_and_verbose_turns():
    with ChatServer(lambda body: completion('{"action": "hit"}')) as server:
        result = run(
            "--env",
            "textgym/FrozenLake-v1",
            "-e",
            "is_slippery=false",
            "--episodes",
            "1",
            "--verbose",
            env={"OPENAI_BASE_URL": server.base_url, "OPENAI_MODEL": "env-model"},
        )
    assert result.returncode == 0, result.stderr
    assert "Authorization" not in server.requests[0][1]  # no key given: none sent
    assert server.requests[0][2]["model"] == "env-model"
    lines = result.stdout.splitlines()
    assert lines[0] == f"env-model at {server.base_url}/chat/completions on textgym/FrozenLake-v1"
    assert (
        lines[1] == "  > You are at row 0, column 0 (P on the map; rows and columns count from 0)."
    )
    # "hit" is no FrozenLake move: three invalid replies in a row end the episode.
    assert lines.count('  < {"action": "hit"}') == 3
    assert "episode 0: return -3, 3 replies (3 invalid)" in lines
    assert lines[-1].startswith("1 episode: return -3.000")


def test_api_errors_end_the_run_with_one_line():
    error = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
    with ChatServer(lambda body: (401, error)) as server:
        result = run("--base-url", server.base_url, "--model", "m", "--api-key", "wrong")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {server.base_url}/chat/completions answered 401: ")
    assert "Incorrect API key provided" in result.stderr and len(server.requests) == 1
    usage = run("--episodes", "2")
    assert usage.returncode == 2 and "--policy api needs --model (or OPENAI_MODEL)" in usage.stderr


def test_basic_strategy_reads_the_hand_from_the_text():
    example = load_example()
    describe = BlackjackFormatter()
    decisions = {  # (total, dealer card, usable ace) -> basic strategy without doubling
        (16, 10, 0): "hit",
        (16, 6, 0): "stick",
        (12, 4, 0): "stick",
        (12, 3, 0): "hit",
        (11, 1, 0): "hit",
        (17, 1, 0): "stick",
        (18, 9, 1): "hit",
        (18, 1, 1): "hit",
        (18, 7, 1): "stick",
        (17, 2, 1): "hit",
        (19, 10, 1): "stick",
    }
    for state, action in decisions.items():
        messages = [{"role": "user", "content": describe(state, {})}]
        assert example.basic_strategy(messages) == f'{{"action": "{action}"}}', state
    env = gym.make(BLACKJACK)
    basic = textgym.evaluate(example.basic_strategy, env, 300)
    stick = textgym.evaluate(example.always_stick, env, 300)
    assert basic.invalid_rate == 0.0 and basic.mean_return > stick.mean_return


def test_plain_function_policy_from_the_command_line():
    result = run("--policy", "basic-strategy", "--episodes", "50", "--seed", "100")
    assert result.returncode == 0, result.stderr
    expected = textgym.evaluate(load_example().basic_strategy, gym.make(BLACKJACK), 50, seed=100)
    assert result.stdout.splitlines() == [f"basic strategy on {BLACKJACK}", str(expected)]
