"""The built-in ``python`` tool: runs the model's code in a sandboxed subprocess.

Never in the calling process: each call starts ``python -I`` in a new temporary working directory
(deleted afterwards) with

* limits: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file size
  (``RLIMIT_FSIZE``), open files, and a wall-clock timeout after which the process group is killed;
* no network: in a fresh network namespace (``unshare -rn``) where the kernel allows one, and
  always an audit hook that refuses every ``socket.*`` event;
* no escape from its directory: the audit hook refuses opening a file for writing, removing,
  renaming or creating anything outside the working directory, and starting processes;
* an empty environment and truncated output (stdout then stderr, ``max_output_chars``).

The audit hook is a guard against accidents and naive attempts, not a security boundary against
hostile code (Python can be escaped from inside); run untrusted workloads in a container.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from functools import lru_cache
from typing import Any

from flowrl.agents.tools import Tool

__all__ = ["PythonSandbox", "run_python"]

# Installed in the child before the user's code runs (read from stdin: the code follows a NUL).
_PRELUDE = r'''
import os, sys
_root = os.path.realpath(os.getcwd())
def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "/proc/self/fd")
    except Exception:
        return False
    return p == _root or p.startswith(_root + os.sep)
_WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                 "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "pty.spawn", "ctypes.dlopen", "os.kill", "os.putenv", "os.unsetenv"}
def _hook(event, args):
    if event.startswith("socket."):
        raise PermissionError("sandbox: network access is not allowed")
    if event in _PROCESS_EVENTS:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writes and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {args[0]!r}")
    elif event in _WRITE_EVENTS and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
sys.addaudithook(_hook)
del _hook
_source = sys.stdin.read().split("\0", 1)[1]
exec(compile(_source, "<tool>", "exec"), {"__name__": "__main__"})
'''


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """``("unshare", "-rn")`` when this kernel lets an unprivileged process make a network
    namespace, else nothing (the audit hook alone then refuses sockets)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    import subprocess

    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, "-rn") if ok else ()


def _limits(cpu_s: int, memory_mb: int, file_mb: int) -> Any:
    def apply() -> None:
        import resource

        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... [truncated {len(text) - limit} characters]"


async def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, file_mb: int = 16,
                     max_output_chars: int = 2000) -> tuple[int | None, str]:
    """Run ``code`` in the sandbox; ``(exit code or None on timeout, output)``."""
    workdir = tempfile.mkdtemp(prefix="flowrl-sandbox-")
    try:
        proc = await asyncio.create_subprocess_exec(
            *_netns_prefix(), sys.executable, "-I", "-S", "-c", _PRELUDE,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=workdir, env={"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir},
            preexec_fn=_limits(cpu_s, memory_mb, file_mb),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(("\0" + code).encode()), timeout_s)
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return None, f"timed out after {timeout_s:g} s"
        text = out.decode(errors="replace") + err.decode(errors="replace")
        return proc.returncode, _truncate(text, max_output_chars)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class PythonSandbox(Tool):
    """``python(code)``: runs the code in a sandboxed subprocess, answers with its output."""

    name = "python"
    schema = {
        "description": "Run Python code in a sandbox (no network, no files outside its directory); "
                       "returns what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    }

    def __init__(self, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
                 max_output_chars: int = 2000) -> None:
        self.limits = dict(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_chars=max_output_chars)

    async def call(self, args: dict, state: Any) -> str:
        code = args.get("code")
        if not isinstance(code, str):
            raise ValueError("expected the argument 'code' (a string)")
        returncode, output = await run_python(code, **self.limits)
        return output if returncode == 0 else f"exit code {returncode}\n{output}"
