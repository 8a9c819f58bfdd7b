"""How a call's process is run and watched (``flowrl.agents.jail.run_process``, issue 38): stdin
larger than a pipe, the two output streams, the exit through a pidfd or a waiting thread, and a
call cancelled by its caller, which must leave no process and no zombie behind."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from flowrl.agents import jail
from flowrl.agents.jail import JailLimits, jail_problem, payload, run_jailed, run_process, runner_argv

NO_JAIL = pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")
LIMITS = JailLimits(timeout_s=10.0, memory_mb=512)


def _bare(code: str, stdin: str = "", limits: JailLimits = LIMITS):
    argv = runner_argv(sys.executable, limits, nproc=False)
    return asyncio.run(run_process(argv, payload(code, stdin), limits, env=dict(jail.JAIL_ENV)))


def _children() -> list[int]:
    """This process's children, zombies included."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    out.append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return out


@NO_JAIL
def test_stdin_larger_than_a_pipe_reaches_the_code_and_the_streams_stay_apart():
    code = "import sys\nd = sys.stdin.read()\nprint(len(d), d[:3], d[-3:])\nprint('to stderr', file=sys.stderr)"
    stdin = "abc" + "y" * (3 << 20) + "xyz"  # 3 MiB: fifty times what a pipe holds
    result = asyncio.run(run_jailed(code, stdin=stdin, limits=LIMITS))
    assert result.ok and result.stdout == f"{len(stdin)} abc xyz\n" and result.stderr == "to stderr\n", result


def test_code_that_reads_no_stdin_still_ends():
    result = _bare("print('done')", stdin="z" * (1 << 20))  # the rest of the feed meets a closed pipe
    assert result.ok and result.stdout == "done\n", result


def test_the_exit_is_seen_without_a_pidfd_too(monkeypatch):
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "pidfd_open not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    before = set(_children())
    assert _bare("raise SystemExit(3)").returncode == 3
    limits = JailLimits(timeout_s=0.5)
    start = time.monotonic()
    result = _bare("import time; time.sleep(30)", limits=limits)
    assert result.timed_out and result.returncode is None and time.monotonic() - start < 5
    assert not set(_children()) - before


def test_a_process_that_closes_its_output_and_lingers_times_out():
    before = set(_children())
    result = _bare("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)", limits=JailLimits(timeout_s=0.5))
    assert result.timed_out and result.returncode is None, result
    assert not set(_children()) - before


@NO_JAIL
def test_a_call_its_caller_cancels_leaves_no_process_and_no_zombie():
    before = set(_children())

    async def cancelled_then_idle() -> None:
        task = asyncio.ensure_future(run_jailed("import time; print('started', flush=True); time.sleep(60)",
                                                limits=JailLimits(timeout_s=60)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 5
        while set(_children()) - before and time.monotonic() < deadline:  # the loop keeps running: the exit is reaped
            await asyncio.sleep(0.02)

    asyncio.run(cancelled_then_idle())
    assert not set(_children()) - before
