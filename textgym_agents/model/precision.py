"""The compute dtype of a machine, chosen by measurement: bf16 where it is fast, else fp32.

CPUs of one machine kind differ: AVX-512 BF16 / AMX parts run bf16 matmuls ~2.3x faster than
fp32, others (AVX2 only) emulate bf16 and run it slower. So ``dtype="auto"`` times one matmul
at the embedded model's shapes in both dtypes, once per machine (cached by
:func:`textgym_agents.model.loading.resolve_precision` in ``cache_dir()/precision.json``, keyed by
CPU, torch version and thread count), and picks bf16 only where it is clearly faster. CUDA
devices get bf16 where supported. Trainable weights (LoRA, value head), the optimizer,
log-softmax and losses stay fp32 whatever is chosen.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from peft.helpers import disable_input_dtype_casting
from torch import nn

from textgym.atomic import atomic_write_json

__all__ = [
    "BF16_MIN_SPEEDUP",
    "PRECISION_FILE",
    "Precision",
    "choose_precision",
    "cpu_signature",
    "in_compute_dtype",
    "matmul_gflops",
    "mixed_precision",
]

logger = logging.getLogger(__name__)
_Method = TypeVar("_Method", bound=Callable[..., Any])

BF16_MIN_SPEEDUP = 1.25
"""bf16 is chosen on a CPU when its measured matmul FLOP/s beat fp32's by at least this factor."""

_SHAPE = (512, 576, 1536)  # (tokens, hidden, MLP width) of SmolLM2-135M's widest matmuls
PRECISION_FILE = "precision.json"


@dataclass(frozen=True)
class Precision:
    """A compute dtype and why it was chosen.

    Attributes:
        dtype: The dtype of the frozen base model's weights and matmuls.
        reason: One line saying why (printed by ``textgym train``, kept in the run directory).
        fp32_gflops: Measured fp32 matmul GFLOP/s (CPU auto choice only).
        bf16_gflops: Measured bf16 matmul GFLOP/s (CPU auto choice only).
    """

    dtype: torch.dtype
    reason: str
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None

    @property
    def name(self) -> str:
        """The dtype's name, e.g. ``"float32"``."""
        return str(self.dtype).removeprefix("torch.")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready record (the dtype as its name)."""
        return {**asdict(self), "dtype": self.name}


def matmul_gflops(dtype: torch.dtype, *, seconds: float = 0.15) -> float:
    """GFLOP/s of a ``(512, 576) @ (576, 1536)`` matmul in ``dtype`` on this CPU.

    Example:
        >>> matmul_gflops(torch.float32, seconds=0.01) > 0
        True
    """
    m, k, n = _SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    a @ b  # warm-up: first-call packing and thread start-up
    repeats, start = 0, time.perf_counter()
    while True:
        a @ b
        repeats += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and repeats >= 3:
            return 2 * m * k * n * repeats / elapsed / 1e9


def cpu_signature() -> str:
    """What the cached measurement is keyed on: CPU model and bf16 flags, torch, threads.

    Example:
        >>> "torch" in cpu_signature()
        True
    """
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as file:
        for line in file:
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
                break
    bf16 = sorted(f for f in flags if "bf16" in f or f.startswith("amx"))
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"{model} | {capability} | bf16 flags: {','.join(bf16) or 'none'} | "
        f"torch {torch.__version__} | {torch.get_num_threads()} threads"
    )


def _measure_cpu(path: Path | None) -> tuple[float, float]:
    """(fp32, bf16) GFLOP/s, measured once per machine signature and cached in ``path``."""
    key, cached = cpu_signature(), {}
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            cached = json.loads(path.read_text())
        cached = cached if isinstance(cached, dict) else {}
        entry = cached.get(key)
        if isinstance(entry, dict) and {"fp32", "bf16"} <= set(entry):
            return float(entry["fp32"]), float(entry["bf16"])
    fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    if path is not None:
        cached[key] = {"fp32": round(fp32, 1), "bf16": round(bf16, 1)}
        with contextlib.suppress(OSError):  # a read-only cache only costs a re-measurement
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, cached)
    return fp32, bf16


def choose_precision(device: torch.device, *, cache_file: Path | None = None) -> Precision:
    """The compute dtype for ``device``: bf16 where it runs fast, float32 elsewhere.

    ``cache_file`` (``models.resolve_precision`` passes ``cache_dir()/precision.json``) keeps
    the CPU measurement per machine signature; None measures every time (~0.3 s).

    Example:
        >>> choice = choose_precision(torch.device("cpu"))
        >>> choice.dtype in (torch.float32, torch.bfloat16)
        True
    """
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(torch.bfloat16, "auto: CUDA device with bf16")
        return Precision(torch.float32, "auto: CUDA device without bf16")
    if device.type != "cpu":
        return Precision(torch.float32, f"auto: float32 on {device.type}")
    fp32, bf16 = _measure_cpu(cache_file)
    speedup = bf16 / fp32
    fast = speedup >= BF16_MIN_SPEEDUP
    reason = (
        f"auto: bf16 matmul {bf16:.0f} vs fp32 {fp32:.0f} GFLOP/s on this CPU "
        f"({speedup:.2f}x; bf16 needs >= {BF16_MIN_SPEEDUP}x)"
    )
    return Precision(torch.bfloat16 if fast else torch.float32, reason, fp32, bf16)


@contextlib.contextmanager
def mixed_precision(model: nn.Module, *, enabled: bool = True) -> Iterator[None]:
    """Run the LoRA products of a bf16 (or fp16) model in that dtype too: mixed precision.

    peft computes an adapter in its weights' dtype, float32 here (they are trainable master
    weights), so at every adapted layer of a bf16 model it casts the activations up, runs the
    two small matmuls and the residual add in fp32 and casts back. Inside this context they
    run in the base model's dtype (``torch.autocast``, peft's input cast switched off); the
    LoRA weights and their gradients stay fp32 (autocast casts a copy per forward), and so do
    the value head (it computes with autocast off) and everything the caller does with
    ``.float()`` logits. Nothing changes for a float32 model or with ``enabled=False``.
    Nested use (``generate`` calls ``score_choices``) enters once: switching peft's casts walks
    every module (~10 ms on the embedded model), and inside an autocast to the same dtype
    they would only cast up and back down exactly.

    Example:
        >>> from textgym_agents.model.adapters import attach_lora
        >>> from textgym_agents.testing import tiny_model
        >>> model = attach_lora(tiny_model(dtype=torch.bfloat16)[0])
        >>> with mixed_precision(model):
        ...     hidden = model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
        >>> hidden.hidden_states[-1].dtype
        torch.bfloat16
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    weight = base.get_output_embeddings().weight
    device = weight.device.type
    active = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == weight.dtype
    if not enabled or weight.dtype == torch.float32 or active:
        yield
        return
    with (
        torch.autocast(device, dtype=weight.dtype),
        disable_input_dtype_casting(model),
    ):
        yield


def in_compute_dtype(method: _Method) -> _Method:
    """Decorate a policy method to run under :func:`mixed_precision` of ``self.model``.

    Switched by ``self.config.mixed_precision``; every method that runs the model (rollout,
    scoring, training) carries it, so old and new log-probs come from the same numerics.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with mixed_precision(self.model, enabled=self.config.mixed_precision):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
