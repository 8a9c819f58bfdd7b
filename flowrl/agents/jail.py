"""The jail of model-written code: one bubblewrap sandbox per call.

Every call that runs code the policy wrote (the ``python`` tool, the code rewards) runs it here:
``python -I -S`` inside ``bwrap`` with new user, mount, PID, network, IPC, UTS and cgroup
namespaces (``--unshare-all``, nested user namespaces refused), a new session and
``--die-with-parent``. The file system is built from nothing: ``/usr`` (and its ``/bin``, ``/lib*``
links) and the interpreter's own prefix read-only, a fresh ``/proc`` (only the call's processes),
a minimal ``/dev``, and size-capped ``tmpfs`` mounts for ``/work`` (the working directory),
``/tmp`` and ``/dev/shm``; the rest of the root is read-only and empty: no ``/etc``, no home, no
run directories, no host ``/tmp``. The code arrives on stdin, never as a file on the host; no
descriptor but the three pipes is passed, and ``setpriv``/``bwrap`` start with an empty environment
(the code's is :data:`JAIL_ENV`). Inside, the code may start processes and write files: the
namespaces, not a Python hook, are the boundary.

Cost (``benchmarks/jail_overhead.py --breakdown``): 6.5-7.5 ms of CPU per call over a bare start
of the same runner, nearly all in the kernel: ``setpriv``'s exec about 1.4 ms, ``bwrap`` with the
user and mount namespaces 2.3, the PID, IPC, UTS and cgroup namespaces 0.7, the network namespace
0.8, the mounts, session and environment 1.4 (each piece within about 0.5 ms). ``--as-pid-1`` would
save a process (0.8 ms of CPU, about 4 ms at load 8 on 2 cores) but makes the code PID 1, which
ignores its own signals and reaps no orphans; it is not used.

Limits, set by the prelude in the jailed interpreter before the code runs (so they bind it and
everything it starts): CPU seconds, address space, file size, open files, no core files, and
processes (``RLIMIT_NPROC``). The kernel counts ``RLIMIT_NPROC`` per user *and user namespace*
(since Linux 5.14) and never enforces it for the host's root user, so a host root starts ``bwrap``
as ``nobody`` (uid 65534; when the interpreter's prefix is not searchable by ``nobody``, e.g. under
``/root``, the system ``/usr/bin/python3`` runs the code): the count then starts at zero in each
jail and a fork bomb stops at the limit. A wall-clock timeout kills ``bwrap``; its PID namespace's
init dies with it and the kernel kills every process of the namespace: nothing outlives a call.
Output is read up to a cap; past it the call is killed and its output marked truncated.

Without bubblewrap (or where the kernel refuses the namespaces) :func:`jail_problem` says why;
the run refuses to start (``flowrl.run.preflight``) unless ``sandbox.mode=unsafe-local`` was
chosen, which runs the same prelude in a plain subprocess (limits, no namespaces) and warns.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import IO

__all__ = ["JAIL_ENV", "JailLimits", "JailResult", "JailUnavailable", "bwrap_argv", "jail_problem", "payload",
           "run_jailed", "run_process", "run_sync", "runner_argv"]

JAIL_UID = 65534  # nobody: the user a host root runs the jail as (see the module docstring)
WORKDIR = "/work"
JAIL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
"""The whole environment of the jailed code (``--clearenv``); ``setpriv`` and ``bwrap`` themselves
start with an empty one, so nothing of the caller's (a TLS key, tokens) is in any process of a call."""

# Runs first in the jailed interpreter: the limits (argv), then the code (stdin: "<length>\n<code><stdin>").
PRELUDE = r"""
import resource as _r, sys as _s, io as _io
for _k, _v in zip((_r.RLIMIT_CPU, _r.RLIMIT_AS, _r.RLIMIT_FSIZE, _r.RLIMIT_NOFILE, _r.RLIMIT_NPROC, _r.RLIMIT_CORE),
                  [int(a) for a in _s.argv[1:6]] + [0]):
    if _v >= 0:
        _r.setrlimit(_k, (_v, _v))
_d = _s.stdin.buffer.read()
_n, _, _d = _d.partition(b"\n")
_c, _s.stdin = _d[:int(_n)], _io.TextIOWrapper(_io.BytesIO(_d[int(_n):]), encoding="utf-8")
_s.argv = ["main.py"]
_g = {"__name__": "__main__", "__builtins__": __builtins__}
del _r, _io, _d, _n, _k, _v
exec(compile(_c, "main.py", "exec"), _g)
"""


class JailUnavailable(RuntimeError):
    """The jail cannot run on this machine (the message says why and the fixes)."""


@dataclass(frozen=True, kw_only=True)
class JailLimits:
    """What one call may use."""

    timeout_s: float = 5.0
    """Wall-clock limit; past it every process of the call is killed."""
    cpu_s: int = 5
    """CPU seconds per process (``RLIMIT_CPU``)."""
    memory_mb: int = 512
    """Address space per process (``RLIMIT_AS``)."""
    file_mb: int = 16
    """Largest file the code may write (``RLIMIT_FSIZE``)."""
    tmpfs_mb: int = 32
    """Size of each writable place (``/work``, ``/tmp``, ``/dev/shm``): memory, not disk."""
    max_processes: int = 16
    """Processes and threads of the call together (``RLIMIT_NPROC`` in its user namespace)."""
    max_open_files: int = 64
    """Open files per process (``RLIMIT_NOFILE``)."""
    max_output_chars: int = 2000
    """stdout and stderr are each cut to this many characters (past it the call is killed)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"JailLimits.{f.name}={value!r} must be positive; use e.g. {f.default}")


@dataclass(frozen=True)
class JailResult:
    """What a call did: ``returncode`` None when it timed out."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.truncated

    def text(self) -> str:
        """stdout then stderr, with a line for a timeout or a cut."""
        out = self.stdout + self.stderr
        if self.truncated:
            out += "\n... [output truncated]"
        return out


def _limit_args(limits: JailLimits, *, nproc: bool) -> list[str]:
    """The prelude's argv: CPU, AS, FSIZE, NOFILE, NPROC (-1: leave as it is)."""
    return [str(limits.cpu_s), str(limits.memory_mb << 20), str(limits.file_mb << 20), str(limits.max_open_files),
            str(limits.max_processes) if nproc else "-1"]


def _usr_links() -> list[str]:
    """``/bin``, ``/lib*``, ``/sbin`` as the host has them: links into ``/usr`` or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def runner_argv(python: str, limits: JailLimits, *, nproc: bool) -> list[str]:
    """The interpreter's command line: ``-I -S`` (no site, no user paths, no environment
    variables), the prelude, its limits; the code follows on stdin. Pure."""
    return [python, "-I", "-S", "-c", PRELUDE, *_limit_args(limits, nproc=nproc)]


def bwrap_argv(bwrap: str, python: str, binds: tuple[str, ...], limits: JailLimits, usr_links: list[str]) -> list[str]:
    """The command line of one jailed call (see the module docstring); pure."""
    tmpfs = str(limits.tmpfs_mb << 20)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", *usr_links]
    for path in binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", tmpfs, "--tmpfs", "/dev/shm",
             "--size", tmpfs, "--tmpfs", "/tmp", "--size", tmpfs, "--tmpfs", WORKDIR,
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv",
             *(a for k, v in JAIL_ENV.items() for a in ("--setenv", k, v)), "--",
             *runner_argv(python, limits, nproc=True)]
    return argv


def _searchable_by_others(path: str) -> bool:
    """Every directory from ``/`` down to ``path`` lets other users in (mode o+x)."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        try:
            mode = os.stat(os.sep.join(parts[:i]) or "/").st_mode
        except OSError:
            return False
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return False
    return True


@lru_cache(maxsize=1)
def _interpreter() -> tuple[str, tuple[str, ...]]:
    """``(python, read-only binds)``: this interpreter, or the system's where the jail's user
    (``nobody`` for a host root) cannot reach this one."""
    exe, prefix = os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    if os.geteuid() != 0 or _searchable_by_others(exe):
        binds = tuple(p for p in {prefix, os.path.dirname(exe)} if not p.startswith("/usr/"))
        return exe, tuple(sorted(binds))
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate), ()
    return "", ()


def _as_jail_user(argv: list[str]) -> tuple[list[str], dict]:
    """``(argv, Popen keywords)`` that start ``argv`` as the jail's user: unchanged for a
    non-root host user; for root, through ``setpriv`` (an exec in the same process, so Popen keeps
    ``vfork``: Popen's ``user=`` forks, which from a process holding torch and 1 GiB took 148 ms a
    call against 12 ms through ``setpriv``, measured here) or else Popen's ``user``/``group``."""
    if os.geteuid() != 0:
        return argv, {}
    setpriv = _which("setpriv")
    if setpriv:
        return [setpriv, f"--reuid={JAIL_UID}", f"--regid={JAIL_UID}", "--clear-groups", *argv], {}
    return argv, {"user": JAIL_UID, "group": JAIL_UID, "extra_groups": []}


@lru_cache(maxsize=None)
def _which(name: str) -> str | None:
    return shutil.which(name)


@lru_cache(maxsize=8)
def _jail_command(limits: JailLimits) -> tuple[tuple[str, ...], tuple[tuple[str, object], ...]]:
    """``(argv, Popen keywords)`` of a jailed call with ``limits``, built once per limits (the
    host's layout does not change while a process runs)."""
    python, binds = _interpreter()
    argv, kwargs = _as_jail_user(bwrap_argv(_which("bwrap") or "bwrap", python, binds, limits, _usr_links()))
    return tuple(argv), tuple(kwargs.items())


@lru_cache(maxsize=1)
def jail_problem() -> str | None:
    """None when a jailed call works here (probed once per process), else why not."""
    import subprocess

    bwrap = _which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    python, binds = _interpreter()
    if not python:
        return (f"the jail's user (uid {JAIL_UID}) cannot reach {sys.executable} and there is no /usr/bin/python3")
    argv, kwargs = _as_jail_user(bwrap_argv(bwrap, python, binds, JailLimits(), _usr_links()))
    try:
        done = subprocess.run(argv, input=b"12\nprint(6 * 7)", capture_output=True, timeout=30, env={}, **kwargs)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start: {exc}"
    if done.returncode != 0 or done.stdout.strip() != b"42":
        err = done.stderr.decode(errors="replace").strip()[-300:]
        return f"bwrap refused the namespaces (exit {done.returncode}: {err or 'no message'})"
    return None


def require_jail() -> None:
    """Raise :class:`JailUnavailable` naming the fixes unless the jail works here."""
    problem = jail_problem()
    if problem is not None:
        raise JailUnavailable(f"model-written code cannot run in a jail here: {problem}. Fix: install bubblewrap "
                              "(apt-get install bubblewrap) and allow user namespaces (sysctl "
                              "user.max_user_namespaces>0), or use a remote SandboxFusion (sandbox.url=http://...), "
                              "or accept running it unjailed with sandbox.mode=unsafe-local")


@lru_cache(maxsize=1)
def _warn_unsafe() -> None:
    warnings.warn("sandbox.mode=unsafe-local: model-written code runs in a plain subprocess with rlimits only; "
                  "it can read this machine's files, use its network and signal processes", RuntimeWarning, stacklevel=3)


class _Watched:
    """A started process watched from the event loop without threads or polling: its exit through
    a pidfd (Linux 5.3+; elsewhere a thread blocked in ``waitpid``), its stdin fed and its stdout
    and stderr read as the pipes become ready, each kept up to ``cap`` bytes (past it the process
    is killed and the rest read and dropped). asyncio's own subprocess transport (Python 3.11)
    waits for each child in a thread of its own: on a loaded 2-core machine (load 8-10) that cost a
    jailed call 15-25 ms more than this, a bare start about 1 ms (the same calls, interleaved)."""

    def __init__(self, proc: subprocess.Popen, cap: int) -> None:
        self.loop, self.proc, self.cap = asyncio.get_running_loop(), proc, cap
        self.stdout, self.stderr = bytearray(), bytearray()
        self.cut = False
        self.exited: asyncio.Future = self.loop.create_future()
        self.drained: asyncio.Future = self.loop.create_future()
        assert proc.stdout is not None and proc.stderr is not None
        for stream, buffer in ((proc.stdout, self.stdout), (proc.stderr, self.stderr)):
            os.set_blocking(stream.fileno(), False)
            self.loop.add_reader(stream.fileno(), self._on_readable, stream, buffer)
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None
            threading.Thread(target=self._wait_in_thread, name="flowrl-jail-wait", daemon=True).start()
        else:
            self.loop.add_reader(self._pidfd, self._on_exit)

    def feed(self, data: bytes) -> None:
        """Write ``data`` to stdin (what the pipe takes now, the rest when it is writable), then close it."""
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)

        def write() -> None:
            nonlocal view
            try:
                while view:
                    view = view[os.write(fd, view):]
            except BlockingIOError:
                self.loop.add_writer(fd, write)  # the pipe is full: the rest when it drains
                return
            except OSError:  # the process is gone or closed its stdin: it reads no more
                pass
            self.loop.remove_writer(fd)
            self.proc.stdin.close()  # type: ignore[union-attr]

        write()

    def _on_readable(self, stream: IO[bytes], buffer: bytearray) -> None:
        fd = stream.fileno()
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            if not self.cut:
                buffer += chunk
                if len(buffer) > self.cap:
                    self.cut = True
                    self.kill()
            return
        self.loop.remove_reader(fd)
        stream.close()
        if all(s.closed for s in (self.proc.stdout, self.proc.stderr)) and not self.drained.done():
            self.drained.set_result(None)

    def _on_exit(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self.proc.wait()  # it has exited: this only reaps it
        if not self.exited.done():
            self.exited.set_result(self.proc.returncode)

    def _wait_in_thread(self) -> None:
        self.proc.wait()
        try:
            self.loop.call_soon_threadsafe(self._on_exit)
        except RuntimeError:  # the loop was closed first: the process is reaped all the same
            pass

    async def finished(self) -> None:
        """Both pipes at their end and the process exited (a cancelled wait leaves both futures be)."""
        await asyncio.shield(self.drained)
        await asyncio.shield(self.exited)

    def kill(self) -> None:
        """Kill the call: ``bwrap`` (its PID namespace dies with it) or, unjailed, its process group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Stop watching the pipes (the exit stays watched: the process is reaped when it ends)."""
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                if stream is self.proc.stdin:
                    self.loop.remove_writer(stream.fileno())
                else:
                    self.loop.remove_reader(stream.fileno())
                stream.close()


async def run_jailed(code: str, *, stdin: str = "", limits: JailLimits | None = None, unsafe_local: bool = False) -> JailResult:
    """Run ``code`` (Python source) with ``stdin`` in a jail, or with ``unsafe_local`` in a plain
    subprocess; raises :class:`JailUnavailable` where the jail cannot run."""
    limits = limits or JailLimits()
    if not unsafe_local:
        require_jail()
        argv, kwargs = _jail_command(limits)
        return await run_process(list(argv), payload(code, stdin), limits, env={}, **dict(kwargs))
    _warn_unsafe()
    workdir = tempfile.mkdtemp(prefix="flowrl-unsafe-")
    try:
        if os.geteuid() == 0:  # a host root still runs it as nobody: kill(-1) must not reach the host's processes
            os.chown(workdir, JAIL_UID, JAIL_UID)
        argv, kwargs = _as_jail_user(runner_argv(_interpreter()[0] or sys.executable, limits, nproc=False))
        return await run_process(argv, payload(code, stdin), limits, cwd=workdir,
                                 env={**JAIL_ENV, "HOME": workdir, "TMPDIR": workdir}, **kwargs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def payload(code: str, stdin: str) -> bytes:
    """What the prelude reads on stdin: the code's length in bytes and a newline, the code, then ``stdin``."""
    source = code.encode("utf-8", errors="replace")
    return b"%d\n" % len(source) + source + stdin.encode("utf-8", errors="replace")


async def run_process(argv: list[str], data: bytes, limits: JailLimits, **popen: object) -> JailResult:
    """Start ``argv`` in a session of its own, feed ``data`` to its stdin, read its output up to the
    cap and wait for its end, all under ``limits.timeout_s`` (past it, or past the cap, the process
    and its group are killed). The jail, unsafe-local and the benchmark's bare baseline all run
    through here, so that they differ only in what is started."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **popen)  # type: ignore[call-overload]
    try:
        watched = _Watched(proc, cap=limits.max_output_chars * 4)
    except BaseException:  # e.g. an event loop that cannot watch file descriptors
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    try:
        watched.feed(data)
        await asyncio.wait_for(watched.finished(), limits.timeout_s)
    except asyncio.TimeoutError:
        watched.kill()
        await asyncio.wait_for(asyncio.shield(watched.exited), 10)
        return JailResult(None, "", f"timed out after {limits.timeout_s:g} s", timed_out=True)
    except BaseException:  # cancelled by the caller's own timeout: leave nothing running
        watched.kill()
        raise
    finally:
        watched.close()
    text_out, text_err = (b.decode(errors="replace") for b in (watched.stdout, watched.stderr))
    n = limits.max_output_chars
    cut = watched.cut or len(text_out) > n or len(text_err) > n
    return JailResult(proc.returncode, text_out[:n], text_err[:n], truncated=cut)


def run_sync(coro: object) -> object:
    """Run a coroutine to its end from synchronous code (a reward function), also where an event
    loop is already running in this thread (then in a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]
