"""The vLLM client's checks of what a server answers, and the server launcher's errors (no vLLM).

A small HTTP server on 127.0.0.1 plays a vLLM server that answers wrongly: a real one never
does, so this is how the error paths run. Real-server tests are in test_vllm_engine.py.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from textgym_agents import PPOConfig
from textgym_agents.engines import (
    VLLMClient,
    VLLMResponseError,
    VLLMServer,
    VLLMServerError,
    VLLMVersionError,
)


class FakeServer:
    """Answers each path with a fixed JSON body (or status), and records the requests."""

    def __init__(self, answers):
        self.answers = answers
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                outer.requests.append((self.command, self.path, body))
                status, payload = outer.answers.get(self.path, (404, {"error": "no route"}))
                data = (
                    payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                )
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(answers):
        server = FakeServer(answers)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def choice(index, ids, logps, reason="stop"):
    return {
        "index": index,
        "text": "",
        "token_ids": ids,
        "logprobs": {"token_logprobs": logps},
        "finish_reason": reason,
    }


def test_completions_are_parsed_in_prompt_order(fake):
    rows = [choice(1, [7, 2], [-0.5, -0.1], "stop"), choice(0, [5], [-1.0], "length")]
    server = fake({"/v1/completions": (200, {"choices": rows})})
    out = VLLMClient(server.url).complete([[1, 2], [3]], model="a", max_tokens=4, temperature=1.0)
    assert [c.token_ids for c in out] == [[5], [7, 2]]
    assert [c.logps for c in out] == [[-1.0], [-0.5, -0.1]]
    assert [c.finish_reason for c in out] == ["length", "stop"]
    body = server.requests[0][2]
    assert body["prompt"] == [[1, 2], [3]] and body["return_token_ids"] is True
    assert body["logprobs"] == 0 and body["top_k"] == -1


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"choices": []}, "Expected 1 choices from /v1/completions"),
        ("not json", "Expected 1 choices from /v1/completions"),
        ({"choices": [choice(0, None, [])]}, "Expected the sampled token ids"),
        ({"choices": [choice(0, [1, "x"], [-1, -1])]}, "Expected the sampled token ids"),
        ({"choices": [choice(0, [1, 2], [-1.0])]}, "Expected 2 finite token log-probs"),
        ({"choices": [choice(0, [1], [0.5])]}, "Expected 1 finite token log-probs <= 0"),
        ({"choices": [choice(0, [1], [None])]}, "Expected 1 finite token log-probs"),
        ({"choices": [choice(3, [1], [-1.0])]}, "Expected choice indices 0..0, got [3]"),
        ({"choices": [choice(0, [1], [-1.0], "abort")]}, "finish_reason 'stop' or 'length'"),
    ],
)
def test_malformed_completions_raise_naming_the_problem(fake, answer, message):
    server = fake({"/v1/completions": (200, answer)})
    with pytest.raises(VLLMResponseError) as error:
        VLLMClient(server.url).complete([[1]], model="a", max_tokens=4, temperature=1.0)
    assert message in str(error.value)


def test_prompt_logprobs_must_cover_every_prompt_token(fake):
    good = {"prompt_logprobs": [None, {"5": {"logprob": -2.0}}], **choice(0, [1], [-1.0])}
    server = fake({"/v1/completions": (200, {"choices": [good]})})
    assert VLLMClient(server.url).prompt_logprobs([[4, 5]], model="a") == [[None, -2.0]]
    wrong_token = {"prompt_logprobs": [None, {"6": {"logprob": -2.0}}], **choice(0, [1], [-1.0])}
    server = fake({"/v1/completions": (200, {"choices": [wrong_token]})})
    with pytest.raises(VLLMResponseError, match="log-prob of token 5 at position 1 of prompt 0"):
        VLLMClient(server.url).prompt_logprobs([[4, 5]], model="a")


def test_versions_are_checked(fake):
    assert VLLMClient(fake({"/version": (200, {"version": "0.32.0"})}).url).version() == "0.32.0"
    old = fake({"/version": (200, {"version": "0.8.5"})})
    with pytest.raises(VLLMVersionError, match=r"runs vLLM 0\.8\.5, older than 0\.11\.0"):
        VLLMClient(old.url).version()
    other = fake({"/version": (200, {"name": "not vllm"})})
    with pytest.raises(VLLMResponseError, match="is this a vLLM server"):
        VLLMClient(other.url).version()


def test_http_errors_and_missing_lora_routes_are_explained(fake):
    server = fake({"/v1/completions": (400, {"error": "max_tokens too large"})})
    client = VLLMClient(server.url)
    with pytest.raises(VLLMServerError, match="refused POST /v1/completions with HTTP 400"):
        client.complete([[1]], model="a", max_tokens=4, temperature=1.0)
    with pytest.raises(VLLMServerError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        client.load_adapter("x", "/tmp/x")


def test_unreachable_server_fails_fast_with_a_clear_error():
    server = FakeServer({})
    url = server.url
    server.close()  # nothing listens on its port now
    client = VLLMClient(url, timeout=5.0, alive=lambda: "It exited with code -9.")
    assert not client.healthy()
    with pytest.raises(
        VLLMServerError, match=r"is unreachable \(GET /version.*exited with code -9"
    ):
        client.version()


def test_server_that_cannot_start_reports_its_log(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    # This interpreter has no vllm: the server exits at once, and the error quotes why.
    with pytest.raises(VLLMServerError, match="did not start.*exited with code 1.*vllm"):
        VLLMServer(tmp_path, python=sys.executable, start_timeout=120)


def test_server_needs_an_interpreter_and_a_model_dir(tmp_path):
    with pytest.raises(VLLMServerError, match="scripts/setup.sh --vllm"):
        VLLMServer(tmp_path, python=str(tmp_path / "missing-python"))
    with pytest.raises(VLLMServerError, match="local model directory with config.json"):
        VLLMServer(tmp_path, python=sys.executable)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rollout_engine", "sglang", "rollout_engine must be one of ('hf', 'vllm')"),
        ("vllm_port", 70000, "vllm_port must be an int in [0, 65535]"),
        ("vllm_request_timeout", 0, "vllm_request_timeout must be > 0"),
        ("vllm_url", "", "vllm_url must be a str or None"),
    ],
)
def test_config_rejects_bad_engine_settings(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PPOConfig(**{field: value})


def test_bad_url_is_rejected():
    with pytest.raises(ValueError, match="Expected a server URL"):
        VLLMClient("localhost:8000")


def test_a_loaded_policy_generates_with_hf(tmp_path, tiny_dir):
    from textgym_agents import PPOPolicy

    config = PPOConfig(max_new_tokens=4, rollout_engine="vllm", vllm_url="http://127.0.0.1:9")
    policy = PPOPolicy.from_pretrained(tiny_dir, config=config)
    policy.save(tmp_path / "saved")
    loaded = PPOPolicy.load(tmp_path / "saved")
    assert loaded.config.rollout_engine == "hf" and loaded.config.vllm_url == "http://127.0.0.1:9"
    assert isinstance(loaded.act([{"role": "user", "content": "Hit or stick?"}]), str)
    with pytest.raises(VLLMServerError, match=r"127\.0\.0\.1:9 is unreachable"):
        policy.act([{"role": "user", "content": "Hit or stick?"}])  # still "vllm": no server


def test_the_server_loads_the_base_models_local_directory(tmp_path):
    from types import SimpleNamespace

    from textgym_agents.engines import model_dir_of
    from textgym_agents.model.loading import embedded_model_dir

    def base(**info):
        return SimpleNamespace(base_info=info)

    (tmp_path / "config.json").write_text("{}")
    assert model_dir_of(base(name_or_path=str(tmp_path))) == tmp_path
    if (embedded_model_dir() / "config.json").is_file():
        assert model_dir_of(base(name_or_path="embedded")) == embedded_model_dir()
    with pytest.raises(ValueError, match="got a GGUF file"):
        model_dir_of(base(name_or_path="/models/smol.gguf"))
    with pytest.raises(ValueError, match="local directory with config.json, got 'no/such-model'"):
        model_dir_of(base(name_or_path="no/such-model"))
