"""Give the heap memory a training phase freed back to the operating system.

glibc keeps what ``free`` returns inside its heap for later allocations; only a free block at
the very top of the heap goes back by itself. A PPO update allocates ~1-2 GB of activations in
blocks of every size, and when it ends the freed blocks sit between live ones, so the
process's resident memory stays at the update's high-water mark and the next phase
(evaluation, the next rollout) piles its own allocations on top. ``malloc_trim(0)`` hands the
free pages anywhere in the heap back (``madvise``), which the trainer does after each update
and :func:`~textgym_agents.evaluate` after an evaluation (docs/performance.md, "Memory").

bf16 matrix products on CPU run through oneDNN, which keeps every kernel ("primitive") it
built, up to 1,024 of them, each with its own buffers. Training passes have a new token count
almost every time, so nearly every pass builds new ones that are never used again: on the
embedded model the cache held ~0.3 GB after four calculator updates, for no speed-up.
:func:`bound_kernel_cache` (run when ``textgym_agents`` is imported) keeps it to
:data:`KERNEL_CACHE_CAPACITY` unless the user chose a capacity.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

__all__ = ["KERNEL_CACHE_CAPACITY", "bound_kernel_cache", "release_memory", "resident_kb"]

KERNEL_CACHE_CAPACITY = 64
"""Kernels oneDNN keeps (its default is 1,024): the few shapes generation repeats step after step
fit; the training passes' one-off shapes are dropped. Measured on the embedded model
(docs/performance.md, "Memory"): the same speed, a lower peak."""
_KERNEL_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound_kernel_cache(capacity: int = KERNEL_CACHE_CAPACITY) -> str:
    """Bound oneDNN's kernel cache, unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is already set.

    oneDNN reads the variable when it builds its first kernel, so this only takes effect before
    the process's first bf16 matrix product (``import textgym_agents`` runs it). Returns the
    variable's value in effect.

    Example:
        >>> bound_kernel_cache() == os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
        True
    """
    return os.environ.setdefault(_KERNEL_CACHE_VARIABLE, str(capacity))


@functools.cache
def _malloc_trim() -> Any:
    """The C library's ``malloc_trim`` (glibc), or None (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_memory() -> bool:
    """Return the free pages of the C heap to the OS; True if glibc gave any back.

    Cheap (it walks the heap's free lists: milliseconds) and safe to call at any time; a no-op
    returning False where the C library has no ``malloc_trim``.

    Example:
        >>> release_memory() in (True, False)
        True
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def resident_kb() -> int:
    """This process's resident set size in kB, as ``VmRSS`` in ``/proc/self/status`` (Linux).

    Example:
        >>> resident_kb() > 0
        True
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")
