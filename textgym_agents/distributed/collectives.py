"""Collectives of a data-parallel run under ``accelerate launch``: the processes act as one.

:class:`Distributed` is the trainer's reducer: it sums gradients and gathers statistics across
processes, and with a single process every collective is a no-op. Signals are in :mod:`.signals`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist

from textgym_agents.exceptions import PeerFailure, raise_signal

__all__ = ["Distributed", "current", "share_policy"]

logger = logging.getLogger(__name__)

# Launchers announce the number of processes in one of these (torchrun/accelerate, then MPI).
_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


class Distributed:
    """This process's place among the processes of a run, and the collectives PPO needs.

    This is the reducer behind :class:`~textgym_agents.ppo.trainer.PPOTrainer`'s collectives
    (``sum``, ``max``, ``gather``, ``sync_gradients``, ...). With one process (the default)
    every method returns its input at once: nothing is communicated, no tensor is
    built and accelerate is not imported, so single-process code needs no separate path.
    :func:`current` describes the running process.

    Example:
        >>> single = Distributed()
        >>> single.world_size, single.is_main, single.sum([1, 2.5]), single.seed(7, stride=4)
        (1, True, [1, 2.5], 7)
    """

    def __init__(
        self, world_size: int = 1, rank: int = 0, device: torch.device | str = "cpu"
    ) -> None:
        """Describe a process.

        Args:
            world_size: Number of processes (``torch.distributed`` must be initialised if > 1).
            rank: This process's index; 0 is the main process, which writes files.
            device: Where tensors go to be communicated (the GPU for NCCL, else the CPU).
        """
        if not (isinstance(world_size, int) and world_size >= 1 and 0 <= rank < world_size):
            raise ValueError(f"Expected 0 <= rank < world_size, got {rank!r} and {world_size!r}")
        self.world_size, self.rank = world_size, rank
        self.device = torch.device(device)
        self.pending_signal = 0  # a signal this process holds until the next stop_check
        self.stopped_together = False  # the last stop_check stopped every process

    @property
    def enabled(self) -> bool:
        """More than one process: collectives are needed."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """The process that writes metrics, checkpoints and plots, and shows the progress bar."""
        return self.rank == 0

    def seed(self, seed: int, stride: int = 1) -> int:
        """``seed`` shifted for this process: ``seed + rank * stride`` (unchanged on rank 0)."""
        return seed + self.rank * stride

    # --- collectives ----------------------------------------------------------------------------

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over processes (float64)."""
        return self._reduce(values, torch.float64, "SUM")

    def max(self, values: Sequence[int]) -> list[int]:
        """Element-wise maximum of integer ``values`` over processes."""
        return [int(v) for v in self._reduce(values, torch.int64, "MAX")]

    def _reduce(self, values: Sequence[Any], dtype: torch.dtype, op: str) -> list[Any]:
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(list(values), dtype=dtype, device=self.device)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.tolist()

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Every process's ``rows`` (along dim 0) in rank order, and where this process's start.

        Processes may hold different numbers of rows; the other dimensions must agree.
        """
        if not self.enabled:
            return rows, 0
        parts = self._gather_parts(rows)
        start = sum(len(part) for part in parts[: self.rank])
        return torch.cat(parts).to(rows.device), start

    def _gather_parts(self, rows: torch.Tensor) -> list[torch.Tensor]:
        sizes = [
            torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)
        ]
        dist.all_gather(sizes, torch.tensor([len(rows)], device=self.device))
        counts = [int(n) for n in sizes]
        padded = torch.zeros((max(counts), *rows.shape[1:]), dtype=rows.dtype, device=self.device)
        padded[: len(rows)] = rows.to(self.device)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        if padded.numel():
            dist.all_gather(parts, padded)
        return [part[:n] for part, n in zip(parts, counts, strict=True)]

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every process's ``data``, in rank order."""
        if not self.enabled:
            return [data]
        rows = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0)
        return [part.cpu().numpy().tobytes() for part in self._gather_parts(rows.to(torch.uint8))]

    def gather_state(
        self, tensors: Mapping[str, torch.Tensor], meta: Any
    ) -> list[tuple[dict[str, torch.Tensor], Any]]:
        """Every process's ``(tensors, JSON-ready meta)``, in rank order (safetensors + JSON)."""
        if not self.enabled:
            return [(dict(tensors), meta)]
        blobs = self.gather_bytes(safetensors.torch.save(dict(tensors)))
        metas = self.gather_bytes(json.dumps(meta).encode())
        return [
            (safetensors.torch.load(blob), json.loads(text))
            for blob, text in zip(blobs, metas, strict=True)
        ]

    def broadcast_text(self, text: str | None) -> str | None:
        """The main process's ``text`` (e.g. a run directory named after the time)."""
        if not self.enabled:
            return text
        return json.loads(self.gather_bytes(json.dumps(text).encode())[0])

    def broadcast_parameters(self, params: Sequence[torch.Tensor]) -> None:
        """Copy the main process's values of ``params`` into every process's."""
        if not self.enabled or not params:
            return
        flat = torch.cat([p.detach().reshape(-1).to(self.device, torch.float32) for p in params])
        dist.broadcast(flat, src=0)
        self._unflatten(flat, params, grads=False)

    def sync_gradients(
        self, params: Sequence[torch.Tensor], stats: Mapping[str, float], keys: Sequence[str]
    ) -> dict[str, float]:
        """Sum gradients and step statistics over processes, in one all-reduce.

        Each process divides its loss by the *global* number of tokens and turns of the step,
        so the sum is the gradient of the mean over every process's minibatch. A process with
        no turns in this step takes part with zero gradients. Returns the summed ``stats``
        (missing keys count as 0).
        """
        if not self.enabled:
            return dict(stats)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        values = torch.tensor([float(stats.get(k, 0.0)) for k in keys], device=self.device)
        flat = torch.cat([g.detach().reshape(-1).to(self.device, torch.float32) for g in grads])
        flat = torch.cat([flat, values.float()])
        dist.all_reduce(flat)
        self._unflatten(flat, params, grads=True)
        return dict(zip(keys, flat[len(flat) - len(keys) :].tolist(), strict=True))

    @staticmethod
    def _unflatten(flat: torch.Tensor, params: Sequence[torch.Tensor], grads: bool) -> None:
        offset = 0
        for p in params:
            chunk = flat[offset : offset + p.numel()].view_as(p).to(p.device, p.dtype, copy=True)
            offset += p.numel()
            if grads:
                p.grad = chunk
            else:
                with torch.no_grad():
                    p.copy_(chunk)

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.enabled:
            dist.barrier()

    def check_same(self, data: bytes, what: str) -> None:
        """Raise on every process if ``data`` (a fingerprint) differs between processes."""
        if not self.enabled:
            return
        digests = self.gather_bytes(hashlib.sha256(data).digest())
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise RuntimeError(
                f"Processes {odd} hold a different {what} than process 0; every process must "
                "load the same base model (same path, dtype and revision)"
            )

    def stop_check(self, *, failed: bool = False, stop: bool = False) -> bool:
        """Agree on stopping: raise on every process if one failed or got Ctrl-C/SIGTERM.

        Args:
            failed: This process failed (its caller re-raises the error after this returns).
            stop: This process asks to stop at the end of this update (a callback said so).

        Returns:
            Whether any process asked to stop.

        Raises:
            PeerFailure: Another process failed.
            KeyboardInterrupt: A process received SIGINT (or
                :class:`~textgym_agents.exceptions.SIGTERMExit`: SIGTERM).
        """
        if not self.enabled:
            return stop
        failed_rank, signum, stop_any = self.max(
            [self.rank + 1 if failed else 0, self.pending_signal, int(stop)]
        )
        self.stopped_together = bool(failed_rank or signum)
        if failed:
            return True
        if failed_rank:
            raise PeerFailure(
                f"Process {failed_rank - 1} of this {self.world_size}-process run failed during "
                "its rollout (its log shows the error); every process stops here"
            )
        if signum:
            raise_signal(signum)
        return bool(stop_any)


_CURRENT: Distributed | None = None


def current() -> Distributed:
    """This process's :class:`Distributed`: one process, or the group a launcher started.

    Under ``accelerate launch`` / ``torchrun`` (``WORLD_SIZE`` > 1) the process group is
    started through accelerate's ``PartialState`` (gloo on CPUs, NCCL on GPUs) and each process
    uses the GPU of its local rank. A group the caller initialised is used as it is.
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    if not (dist.is_available() and dist.is_initialized()):
        if max(int(os.environ.get(name) or 1) for name in _WORLD_SIZE_VARS) <= 1:
            return Distributed()
        from accelerate import PartialState

        # Asked for a GPU group on a machine without CUDA, accelerate 1.x silently runs each
        # process alone; the CPU flag makes it start a gloo group instead.
        use_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
        PartialState(cpu=use_cpu or not torch.cuda.is_available())  # sets this process's GPU
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Distributed()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    _CURRENT = Distributed(dist.get_world_size(), dist.get_rank(), device)
    _warn_unapplied(_CURRENT)
    return _CURRENT


def share_policy(process: Distributed, policy: Any) -> None:
    """Put ``policy`` on this process's GPU and give it the main process's trainable weights.

    Every process builds its own policy (the LoRA initialisation draws from its own RNG); the
    base weights are compared (a fingerprint), the adapter and value head are copied from the
    main process, as DDP does when it wraps a model.
    """
    if not process.enabled:
        return
    if process.device.type == "cuda" and policy.device != process.device:
        policy.model.to(process.device)
        policy.value_head.to(process.device)
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    # A few leading values of every tensor tell different checkpoints apart, exactly and fast.
    fingerprint = b"".join(
        str(tuple(p.shape)).encode() + p.detach().reshape(-1)[:8].double().cpu().numpy().tobytes()
        for p in frozen
    )
    process.check_same(fingerprint, "base model")
    lora, head = policy.trainable_parameters()
    process.broadcast_parameters([*lora, *head])


def _warn_unapplied(process: Distributed) -> None:
    flags = {"ACCELERATE_USE_DEEPSPEED": "DeepSpeed", "ACCELERATE_USE_FSDP": "FSDP"}
    unapplied = [name for var, name in flags.items() if os.environ.get(var, "") == "true"]
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    unapplied += [f"mixed_precision={precision}"] if precision != "no" else []
    if unapplied and process.is_main:
        logger.warning(
            "This launch asks for %s, which PPO training does not apply: each process holds the "
            "whole model in the dtype it was loaded in (see docs/scaling.md)",
            ", ".join(unapplied),
        )
