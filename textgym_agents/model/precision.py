"""The compute dtypes of a machine, chosen per phase by measurement: bf16 where it is fast.

CPUs of one machine kind differ: AVX-512 BF16 / AMX parts run bf16 matmuls ~2.3x faster than
fp32, others (AVX2 only) emulate bf16 and run it slower. And the two phases of the loop use
the weights differently: a forward pass over many tokens (scoring, choices, training) is a
matmul, token-by-token generation is a few rows times every weight, bound by how fast the
weights stream, where a bf16 kernel can be slower than fp32 although it reads half the bytes.
So ``dtype="auto"`` times both shapes in both dtypes, once per machine (cached by
:func:`textgym_agents.model.loading.resolve_precision` in ``cache_dir()/precision.json``, keyed by
CPU, torch version and thread count):

- bf16 matmuls not clearly faster: float32 everywhere;
- bf16 faster for both: bf16 weights;
- bf16 faster for passes only: ``"bfloat16-passes"``, float32 weights (and generation) with
  every forward pass under ``torch.autocast(bfloat16)`` — no second copy of the model.

CUDA devices get bf16 where supported. Trainable weights (LoRA, value head), the optimizer,
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
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from peft.helpers import disable_input_dtype_casting
from torch import nn

from textgym.atomic import atomic_write_json

__all__ = [
    "BF16_MIN_SPEEDUP",
    "PRECISION_FILE",
    "SPLIT_PRECISION",
    "CpuSpeeds",
    "Precision",
    "choose_precision",
    "cpu_signature",
    "decode_gweights",
    "in_compute_dtype",
    "in_decode_dtype",
    "matmul_gflops",
    "measured_choice",
    "mixed_precision",
    "pass_dtype_of",
]

logger = logging.getLogger(__name__)
_Method = TypeVar("_Method", bound=Callable[..., Any])

BF16_MIN_SPEEDUP = 1.25
"""bf16 is chosen on a CPU when its measured matmul FLOP/s beat fp32's by at least this factor."""

_SHAPE = (512, 576, 1536)  # (tokens, hidden, MLP width) of SmolLM2-135M's widest matmuls
_DECODE_ROWS = 8  # a rollout's batch of conversations, one new token each
_DECODE_MATRICES = 96  # of (576, 1536): 85 M weights, 340 MB in fp32, beyond any CPU cache
PRECISION_FILE = "precision.json"
SPLIT_PRECISION = "bfloat16-passes"
"""The name of fp32 weights and generation with bf16 forward passes (also a ``dtype`` spec)."""


@dataclass(frozen=True)
class Precision:
    """The compute dtypes of the frozen base model and why they were chosen.

    Attributes:
        dtype: The dtype of the base model's weights, in which text is generated.
        reason: One line saying why (printed by ``textgym train``, kept in the run directory).
        fp32_gflops: Measured fp32 matmul GFLOP/s (CPU auto choice only).
        bf16_gflops: Measured bf16 matmul GFLOP/s (CPU auto choice only).
        pass_dtype: The dtype of forward passes (scoring, choices, training) where it is not
            ``dtype``: bf16 under autocast over fp32 weights (``"bfloat16-passes"``).
        decode_fp32: Measured fp32 generation-shaped speed, G weights/s (CPU auto only).
        decode_bf16: The same in bf16.

    Example:
        >>> Precision(torch.float32, "requested", pass_dtype=torch.bfloat16).name
        'bfloat16-passes'
    """

    dtype: torch.dtype
    reason: str
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None
    pass_dtype: torch.dtype | None = None
    decode_fp32: float | None = None
    decode_bf16: float | None = None

    @property
    def name(self) -> str:
        """The dtype spec naming this precision: ``"float32"``, ``"bfloat16-passes"``..."""
        if self.pass_dtype is not None and self.pass_dtype != self.dtype:
            return SPLIT_PRECISION
        return _dtype_name(self.dtype)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready record (dtypes by name)."""
        passes = None if self.pass_dtype is None else _dtype_name(self.pass_dtype)
        return {**asdict(self), "dtype": self.name, "pass_dtype": passes}


@dataclass(frozen=True)
class CpuSpeeds:
    """What ``dtype="auto"`` measures on a CPU (cached per machine signature).

    Attributes:
        fp32: fp32 matmul GFLOP/s at a forward pass's shape.
        bf16: bf16 matmul GFLOP/s at the same shape.
        decode_fp32: fp32 weights streamed per second (G) at a generation step's shape;
            None where bf16 matmuls are not fast (then nothing runs in bf16: not measured).
        decode_bf16: The same in bf16.
    """

    fp32: float
    bf16: float
    decode_fp32: float | None = None
    decode_bf16: float | None = None

    @property
    def bf16_passes(self) -> bool:
        """Whether bf16 matmuls beat fp32's by :data:`BF16_MIN_SPEEDUP` at a pass's shape."""
        return self.bf16 >= BF16_MIN_SPEEDUP * self.fp32


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pass_dtype_of(spec: object) -> torch.dtype | None:
    """The forward passes' dtype a dtype spec names apart from its weights' (else None).

    Example:
        >>> pass_dtype_of("bfloat16-passes"), pass_dtype_of("float32")
        (torch.bfloat16, None)
    """
    split = isinstance(spec, str) and spec.lower() in (SPLIT_PRECISION, "bf16-passes")
    return torch.bfloat16 if split else None


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


def decode_gweights(dtype: torch.dtype, *, seconds: float = 0.3) -> float:
    """G weights/s that ``(8, 576) @ (576, 1536)`` products stream in ``dtype`` on this CPU.

    A generation step multiplies a few rows (one new token per conversation) by every weight of
    the model, so it is bound by how fast the weights stream from memory: the products cycle
    through 85 M weights, more than any CPU cache holds.

    Example:
        >>> decode_gweights(torch.float32, seconds=0.01) > 0
        True
    """
    _, k, n = _SHAPE
    weights = [torch.empty(k, n, dtype=dtype).uniform_(-1, 1) for _ in range(_DECODE_MATRICES)]
    rows = torch.ones(_DECODE_ROWS, k, dtype=dtype)
    for weight in weights:  # warm-up: first-call packing, pages touched
        rows @ weight
    sweeps, start = 0, time.perf_counter()
    while True:
        for weight in weights:
            rows @ weight
        sweeps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and sweeps >= 2:
            return k * n * _DECODE_MATRICES * sweeps / elapsed / 1e9


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


def _read_cache(path: Path | None) -> dict[str, Any]:
    """The measurements kept in ``path`` by machine signature ({} where none can be read)."""
    if path is None:
        return {}
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text())
        return cached if isinstance(cached, dict) else {}
    return {}


def _write_cache(path: Path | None, cached: dict[str, Any]) -> None:
    if path is not None:
        with contextlib.suppress(OSError):  # a read-only cache only costs a re-measurement
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, cached)


def _entry(cached: dict[str, Any], key: str) -> dict[str, Any]:
    entry = cached.get(key)
    return entry if isinstance(entry, dict) else {}


def _measure_cpu(path: Path | None) -> CpuSpeeds:
    """Both shapes in both dtypes, measured once per machine signature and cached in ``path``.

    An entry written before the generation shape was measured is measured again.
    """
    key, names = cpu_signature(), [field.name for field in fields(CpuSpeeds)]
    entry = _entry(_read_cache(path), key)
    if set(names) <= set(entry):
        with contextlib.suppress(TypeError, ValueError):
            values = {n: None if entry[n] is None else float(entry[n]) for n in names}
            return CpuSpeeds(**values)
    speeds = CpuSpeeds(matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16))
    if speeds.bf16_passes:
        speeds = replace(
            speeds,
            decode_fp32=decode_gweights(torch.float32),
            decode_bf16=decode_gweights(torch.bfloat16),
        )
    cached = _read_cache(path)
    cached[key] = {
        **_entry(cached, key),
        **{n: v if v is None else round(v, 2) for n, v in asdict(speeds).items()},
    }
    _write_cache(path, cached)
    return speeds


_CHOSEN: dict[tuple[str, str], str] = {}


def measured_choice(name: str, measure: Callable[[], str], *, cache_file: Path | None) -> str:
    """A choice made once per machine by ``measure()`` and kept, so every process agrees.

    Choices made from timings flip between runs when two options are close or the machine is
    busy; a choice that changes numerics (a kernel, a dtype) then changes what a seeded run
    samples, and a resumed run would not replay the run it continues. So the first answer is
    kept for the process and under the machine's :func:`cpu_signature` in ``cache_file``
    (``"choices"`` of its entry; None keeps it for the process only). Where two processes
    measure at once, the answer written first wins for both from then on.

    Example:
        >>> measured_choice("doc example", lambda: "a", cache_file=None)
        'a'
        >>> measured_choice("doc example", lambda: "b", cache_file=None)  # kept
        'a'
    """
    key = (cpu_signature(), name)
    if key not in _CHOSEN:
        kept = _entry(_read_cache(cache_file), key[0]).get("choices")
        value = kept.get(name) if isinstance(kept, dict) else None
        if not isinstance(value, str):
            measured = measure()
            cached = _read_cache(cache_file)  # read again: another process may have chosen
            entry = _entry(cached, key[0])
            choices = entry.get("choices") if isinstance(entry.get("choices"), dict) else {}
            if not isinstance(choices.get(name), str):
                choices = {**choices, name: measured}
                cached[key[0]] = {**entry, "choices": choices}
                _write_cache(cache_file, cached)
            value = choices[name]
        _CHOSEN[key] = value
    return _CHOSEN[key]


def choose_precision(device: torch.device, *, cache_file: Path | None = None) -> Precision:
    """The compute dtypes for ``device``: bf16 where it runs fast, float32 elsewhere.

    On a CPU, bf16 forward passes need matmuls at least :data:`BF16_MIN_SPEEDUP` times faster
    than fp32's; bf16 weights (and so bf16 generation) also need generation-shaped products
    at least as fast as fp32's, else the weights stay fp32 and only the passes run in bf16
    (:data:`SPLIT_PRECISION`). ``cache_file`` (``models.resolve_precision`` passes
    ``cache_dir()/precision.json``) keeps the CPU measurements per machine signature; None
    measures every time (~1 s).

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
    speeds = _measure_cpu(cache_file)
    speedup = speeds.bf16 / speeds.fp32
    reason = (
        f"auto: bf16 matmul {speeds.bf16:.0f} vs fp32 {speeds.fp32:.0f} GFLOP/s on this CPU "
        f"({speedup:.2f}x; bf16 needs >= {BF16_MIN_SPEEDUP}x)"
    )
    measured = {
        "fp32_gflops": speeds.fp32,
        "bf16_gflops": speeds.bf16,
        "decode_fp32": speeds.decode_fp32,
        "decode_bf16": speeds.decode_bf16,
    }
    if not speeds.bf16_passes or speeds.decode_fp32 is None or speeds.decode_bf16 is None:
        return Precision(torch.float32, reason, **measured)
    decode = speeds.decode_bf16 / speeds.decode_fp32
    reason += (
        f"; generation-shaped products bf16 {speeds.decode_bf16:.2f} vs fp32 "
        f"{speeds.decode_fp32:.2f} G weights/s ({decode:.2f}x)"
    )
    if decode >= 1.0:
        return Precision(torch.bfloat16, reason, **measured)
    reason += ": bf16 passes, float32 weights and generation"
    return Precision(torch.float32, reason, pass_dtype=torch.bfloat16, **measured)


@contextlib.contextmanager
def mixed_precision(
    model: nn.Module, *, enabled: bool = True, dtype: torch.dtype | None = None
) -> Iterator[None]:
    """Run a model's forward passes in ``dtype`` (default: its weights'), LoRA products included.

    peft computes an adapter in its weights' dtype, float32 here (they are trainable master
    weights), so at every adapted layer of a bf16 model it casts the activations up, runs the
    two small matmuls and the residual add in fp32 and casts back. Inside this context they
    run in the base model's dtype (``torch.autocast``, peft's input cast switched off); the
    LoRA weights and their gradients stay fp32 (autocast casts a copy per forward), and so do
    the value head (it computes with autocast off) and everything the caller does with
    ``.float()`` logits. Nothing changes for a float32 model, or for a bf16 one with
    ``enabled=False`` (``PPOConfig.mixed_precision``).

    ``dtype=torch.bfloat16`` on a float32 model (:data:`SPLIT_PRECISION`) runs every matmul in
    bf16 under autocast, which casts each weight as it is used, whatever ``enabled`` says;
    the residual stream and norms stay fp32. Nested use (``generate`` calls
    ``score_choices``) enters once: switching peft's casts walks every module (~10 ms on the
    embedded model), and inside an autocast to the same dtype they would only cast up and
    back down exactly.

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
    device, target = weight.device.type, dtype or weight.dtype
    active = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == target
    if target == torch.float32 or active or (target == weight.dtype and not enabled):
        yield
        return
    with (
        torch.autocast(device, dtype=target),
        disable_input_dtype_casting(model),
    ):
        yield


def in_compute_dtype(method: _Method) -> _Method:
    """Decorate a policy method that runs forward passes: :func:`mixed_precision` in its dtype.

    The dtype is ``self.pass_dtype`` (None: the weights'); the LoRA products follow
    ``self.config.mixed_precision``. Every method that runs passes (choice rollouts, scoring,
    training) carries it, so old and new log-probs come from the same numerics.
    """
    return _under_mixed_precision(method, passes=True)


def in_decode_dtype(method: _Method) -> _Method:
    """Decorate a policy method that generates token by token: the weights' own dtype.

    Under :data:`SPLIT_PRECISION` generation runs in fp32 while the passes it makes (choice
    decoding scores with ``score_choices``, itself under :func:`in_compute_dtype`) run in bf16.
    """
    return _under_mixed_precision(method, passes=False)


def _under_mixed_precision(method: _Method, *, passes: bool) -> _Method:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        dtype = getattr(self, "pass_dtype", None) if passes else None
        with mixed_precision(self.model, enabled=self.config.mixed_precision, dtype=dtype):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
