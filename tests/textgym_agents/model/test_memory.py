"""release_memory: freed heap pages go back to the OS; oneDNN's kernel cache is bounded."""

import os
import subprocess
import sys

import pytest

from textgym_agents.model.memory import (
    KERNEL_CACHE_CAPACITY,
    _malloc_trim,
    release_memory,
    resident_kb,
)


def rss_mb() -> float:
    return resident_kb() / 1024


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _malloc_trim() is None, reason="glibc only"
)
def test_freed_blocks_below_a_live_one_are_returned():
    # 100 KB blocks come from the heap (below glibc's mmap threshold), touched by the repeat;
    # a small live block after each (over 512 bytes, so from malloc, not Python's own
    # allocator) keeps the freed ones apart and off the heap's top, so free() alone keeps
    # them resident.
    blocks, pins = [], []
    for i in range(600):
        blocks.append(b"x" * 100_000)
        pins.append(b"%d" % i * 1000)
    before = rss_mb()
    del blocks
    freed = rss_mb()
    assert release_memory() is True
    after = rss_mb()
    assert freed > before - 20  # free() kept most of the 60 MB
    assert after < freed - 40  # malloc_trim gave it back


def test_release_memory_is_a_safe_no_op_anywhere():
    assert release_memory() in (True, False)
    assert release_memory() in (True, False)  # repeated calls are fine


def run_python(code: str, **env: str) -> str:
    variables = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**variables, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


READ_CAPACITY = "import os, textgym_agents; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"


def test_importing_the_package_bounds_onednn_kernel_cache():
    assert run_python(READ_CAPACITY) == str(KERNEL_CACHE_CAPACITY)
    assert KERNEL_CACHE_CAPACITY < 1024  # oneDNN's own default


def test_a_capacity_the_user_set_is_kept():
    assert run_python(READ_CAPACITY, ONEDNN_PRIMITIVE_CACHE_CAPACITY="7") == "7"
