from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from textgym_agents.exceptions import RunLockedError
from textgym_agents.runfiles.run_lock import LOCK_FILE, RunLock

HOLDER = """
import sys, time
from textgym_agents.runfiles.run_lock import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def start_holder(tmp_path, run):
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER))
    child = subprocess.Popen(
        [sys.executable, str(script), str(run)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "locked"
    return child


@pytest.mark.slow
def test_a_second_live_process_is_refused_naming_the_owner(tmp_path):
    run = tmp_path / "run"
    child = start_holder(tmp_path, run)
    try:
        with pytest.raises(RunLockedError, match=f"pid {child.pid} on .*another directory"):
            RunLock(run).acquire()
    finally:
        child.kill()
        child.wait()
    with RunLock(run):  # the kernel released the dead holder's lock: it is stale, taken over
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (run / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_stale_lock_file_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    run = tmp_path / "run"
    child = start_holder(tmp_path, run)
    child.kill()  # SIGKILL: the lock file stays, naming a dead pid
    child.wait()
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == child.pid
    with caplog.at_level("INFO"), RunLock(run):
        pass
    assert f"left by pid {child.pid}" in caplog.text


def test_the_lock_is_reentrant_within_a_process_and_released_by_the_outermost(tmp_path):
    lock = RunLock(tmp_path)
    with lock:
        with RunLock(tmp_path):
            pass
        assert (tmp_path / LOCK_FILE).exists()  # still held by the outer block
    assert not (tmp_path / LOCK_FILE).exists()
    with RunLock(tmp_path):  # and free again
        pass
