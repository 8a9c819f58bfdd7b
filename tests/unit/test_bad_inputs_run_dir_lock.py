"""A run directory is held by one run (issue 35, item 9): a second run on it is refused at once
naming the holder's host and pid; the lock goes with its holder (released, or the process gone)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from flowrl.config import ConfigError
from flowrl.run.run_dir import LOCK_FILE, RunDirLock

# Another process holding the lock as RunDirLock does (flock + its name), without importing flowrl.
HOLDER = """
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, f"host {socket.gethostname()} pid {os.getpid()} since now\\n".encode())
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_second_run_refused_naming_holder(tmp_path, holder):
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        RunDirLock(tmp_path)
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert f"is in use by another run (host {socket.gethostname()} pid {holder.pid} since now)" in message
    assert "trainer.run_dir" in message and "trainer.experiment_name" in message


def test_taken_over_when_holder_is_gone(tmp_path, holder):
    holder.kill()
    holder.wait(timeout=10)
    lock = RunDirLock(tmp_path)  # the system dropped the dead process's flock
    assert f"pid {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_released_lock_is_taken_again(tmp_path):
    first = RunDirLock(tmp_path)
    first.release()
    first.release()  # a second release does nothing
    RunDirLock(tmp_path).release()


def test_unclosed_run_of_this_process_is_taken_over(tmp_path, caplog):
    # a notebook: an earlier Run of the same directory never closed (or failed while opening)
    earlier = RunDirLock(tmp_path)
    later = RunDirLock(tmp_path)
    assert "taking it over from an earlier Run of this process" in caplog.text
    earlier.release()  # lets nothing go: the later Run holds the lock now
    assert (tmp_path / LOCK_FILE).exists()
    later.release()
    assert not (tmp_path / LOCK_FILE).exists()
