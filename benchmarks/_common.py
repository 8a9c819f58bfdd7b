"""Helpers shared by the benchmark scripts: machine facts, statistics, tables, and a small
line protocol that lets one driver process alternate several long-lived framework processes.

Alternating inside one run is how the benchmarks cope with a shared, noisy machine: each framework
runs in its own process, started once (startup is not timed), and the driver tells them in turn
"run K steps"; while one runs, the others block on their stdin and use no CPU. Absolute times drift
with the load from other users, ratios between neighbouring blocks much less.

Protocol (child side: :class:`Channel`; driver side: :class:`Child`): the child prints one line
``@@bench <json>`` per reply on stdout (anything else it prints is ignored) and reads one command
per line on stdin: ``run <K>`` or ``stop``.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

MARK = "@@bench "


# --------------------------------------------------------------------------- facts
def machine_info() -> dict[str, Any]:
    """CPU model, core count, memory, load and OS: what absolute numbers depend on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }
    try:
        info["load_avg_1_5_15"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError):
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def package_versions(names: Sequence[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def process_tree_cpu_s(root_pid: int) -> float:
    """User + system CPU seconds of ``root_pid`` and all its live descendants (every thread), plus
    what they collected from reaped children. Linux only (NaN elsewhere). The difference over a
    block is the CPU work a framework spent, which contention from other users inflates far less
    than wall time."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return float("nan")
    for name in entries:
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        pid = int(name)
        parent[pid] = int(fields[1])
        cpu[pid] = sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
    tree, frontier = {root_pid}, [root_pid]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(cpu.get(pid, 0.0) for pid in tree)


def machine_busy_cpu_s() -> float:
    """CPU seconds all cores of the machine have been busy since boot (user, nice, system, irq,
    softirq and steal, the time the hypervisor gave to other guests), from /proc/stat; NaN where
    unavailable. Minus a process tree's own CPU time over a block, it is the contention the tree
    met from everything else."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- statistics
def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def write_json(result: Any, out: str | Path) -> Path:
    """The benchmark's JSON, its folder made first; prints where it went."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table; floats are printed with 3 significant decimals."""

    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"
        return str(x)

    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


# --------------------------------------------------------------------------- child side
class Channel:
    """The child's end of the protocol: ``reply(obj)`` and ``command() -> int | None``."""

    def __init__(self) -> None:
        # Replies go to the real stdout even if a library later replaces sys.stdout.
        self._out = sys.__stdout__

    def reply(self, obj: Any) -> None:
        self._out.write(MARK + json.dumps(obj) + "\n")
        self._out.flush()

    def command(self) -> int | None:
        """Block until the driver's next command: the number of steps to run, or None to stop."""
        line = sys.stdin.readline()
        if not line or line.strip() == "stop":
            return None
        verb, num = line.split()
        if verb != "run":
            raise ValueError(f"unknown benchmark command {line!r}")
        return int(num)


# --------------------------------------------------------------------------- driver side
class Child:
    """A framework process started with ``argv``; its stderr goes to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
            env={**os.environ, **(env or {})},
        )
        self._replies: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self._replies.put(json.loads(line[len(MARK):]))
            else:
                self._log.write(line)
        self._replies.put(EOFError)

    def wait_reply(self, timeout_s: float) -> Any:
        """The next reply; raises with the tail of the child's log if it died or timed out."""
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no reply within {timeout_s:.0f}s; see {self.log_path}") from None
        if reply is EOFError:
            self.proc.wait(timeout=30)
            self._log.flush()
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}; log tail:\n{tail}")
        return reply

    def cpu_s(self) -> float:
        return process_tree_cpu_s(self.proc.pid)

    def run(self, num_steps: int, timeout_s: float, *, idle: Sequence["Child"] = ()) -> Any:
        """Run ``num_steps`` steps while the ``idle`` children wait. The reply gains ``cpu_s``
        (CPU seconds of this child's process tree meanwhile), ``idle_cores`` (average cores the
        idle children used meanwhile) and ``foreign_cores`` (average cores busy with everything
        else: other users, the driver)."""
        busy, own, start = machine_busy_cpu_s(), self.cpu_s(), time.perf_counter()
        idle_before = sum(c.cpu_s() for c in idle)
        self._send(f"run {num_steps}")
        reply = self.wait_reply(timeout_s)
        wall = time.perf_counter() - start
        reply["cpu_s"] = self.cpu_s() - own
        idle_s = sum(c.cpu_s() for c in idle) - idle_before
        reply["idle_cores"] = idle_s / wall
        reply["foreign_cores"] = (machine_busy_cpu_s() - busy - reply["cpu_s"] - idle_s) / wall
        return reply

    def stop(self, timeout_s: float = 120.0) -> None:
        if self.proc.poll() is None:
            try:
                self._send("stop")
                self.proc.wait(timeout=timeout_s)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

