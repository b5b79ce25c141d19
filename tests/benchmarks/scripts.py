"""Run a benchmark script the way a user does: its own process, one thread, output captured."""

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_script(name, *args, timeout=900, ok=(0,)):
    """Run ``benchmarks/<name>`` with ``args``; fail with its stderr unless its exit is in ``ok``.

    Returns the finished process (``stdout`` holds what it printed).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert result.returncode in ok, result.stderr[-3000:]
    return result
