"""Escape attempts against the jail, run through the ``python`` tool as the agent loop calls it
(a :class:`ToolRunner` with a timeout per call): each must fail to reach outside (issue 38).

Inside, the code may start processes and write files: every case checks the host side (the file
that was not written, the server that got no connection, the process still alive, no process
left), not a refusal message."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from flowrl.agents.jail import jail_problem
from flowrl.agents.parsers import ToolCall
from flowrl.agents.runner import ToolRunner
from flowrl.agents.sandbox import PythonSandbox, SandboxSettings

pytestmark = pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")


@pytest.fixture(scope="module")
def runner():
    tool = PythonSandbox(timeout_s=3.0, cpu_s=3, memory_mb=256, max_output_chars=2000,
                         settings=SandboxSettings(mode="jail"))
    r = ToolRunner({"python": tool}, timeout_s=8.0, max_chars=4000)
    yield r
    r.close()


def call(runner: ToolRunner, code: str) -> str:
    return runner.run([(ToolCall("python", {"code": code}), None)])[0].text


def test_inside_the_code_may_start_processes_and_write_its_own_files(runner):
    out = call(runner, "import subprocess, os\nopen('a.txt', 'w').write('ok')\n"
                       "print(subprocess.run(['cat', 'a.txt'], capture_output=True, text=True).stdout, os.getcwd())")
    assert out.split() == ["ok", "/work"]
    assert "a.txt" not in call(runner, "import os; print(os.listdir('.'))")  # nothing persists between calls


def test_no_host_files_can_be_read(runner, tmp_path):
    secret = tmp_path / "run" / "checkpoints" / "secret.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("SECRET-RUN-DIR")
    code = ("import os\nfor p in ['/etc/passwd', '/etc/hostname', '/work/main', %r, %r, '/home', '/sys']:\n"
            "    try:\n        print(open(p).read() if os.path.isfile(p) else os.listdir(p))\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)\n"
            "print(sorted(os.walk('/root')))" % (str(secret), str(tmp_path)))
    out = call(runner, code)
    assert "SECRET-RUN-DIR" not in out and "root:x:0" not in out and "secret.txt" not in out and ".cache" not in out
    assert out.count("refused") == 7, out


def test_the_parents_environment_is_out_of_sight(runner, monkeypatch):
    marker = "TLSKEY-" + uuid.uuid4().hex
    monkeypatch.setenv("FLOWRL_TEST_SECRET", marker)
    code = ("import os\nseen = []\nfor pid in ['%d', '%d', '1', 'self']:\n    try:\n"
            "        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
            "    except OSError as e:\n        seen.append(type(e).__name__)\n"
            "print(sorted(p for p in os.listdir('/proc') if p.isdigit()), os.environ, seen)") % (os.getpid(), os.getppid())
    out = call(runner, code)
    assert marker not in out and "FLOWRL_TEST_SECRET" not in out
    assert out.startswith("['1', '2']"), out  # its PID namespace holds bwrap's init and the code


ROUTES = {
    "subprocess": "import subprocess; subprocess.run(['sh', '-c', 'echo x > {t}'])",
    "os.system": "import os; os.system('echo x > {t}')",
    "fork+exec": "import os\npid = os.fork()\nif pid == 0: os.execv('/bin/sh', ['sh', '-c', 'echo x > {t}'])\n"
                 "os.waitpid(pid, 0)",
    "_posixsubprocess": "import _posixsubprocess, os\nr, w = os.pipe()\n"
                        "pid = _posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'echo x > {t}'], [b'/bin/sh'], True, (), "
                        "None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, None, None, None, -1, None, False)\n"
                        "os.waitpid(pid, 0)",
    "posix_spawn": "import os; os.waitpid(os.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {t}'], {{}}), 0)",
    "ctypes": "import ctypes, ctypes.util; ctypes.CDLL(ctypes.util.find_library('c')).system(b'echo x > {t}')",
    "python open": "open('{t}', 'w').write('x')",
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_no_route_writes_outside(runner, tmp_path, route):
    target = tmp_path / "escaped.txt"
    out = call(runner, ROUTES[route].format(t=target) + "\nprint('ran')")
    assert not target.exists(), f"{route} wrote {target}: {out}"


def test_system_directories_and_the_root_are_read_only(runner):
    out = call(runner, "for p in ['/usr/x', '/x', '/dev/x', '/proc/x', '/bin/x', '%s/x']:\n"
                       "    try: open(p, 'w'); print('WROTE', p)\n    except OSError: pass" % sys.base_prefix)
    assert "WROTE" not in out, out


def _server(kind: str, address):
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(address)
    s.listen(8)
    s.settimeout(0.2)
    hits: list = []

    def accept():
        while s.fileno() != -1:
            try:
                hits.append(s.accept())
            except (socket.timeout, OSError):
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return s, t, hits


def test_no_socket_reaches_the_loopback_or_a_listening_server(runner, tmp_path):
    tcp, t1, tcp_hits = _server("tcp", ("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    path = str(tmp_path / "sched.sock")
    unix, t2, unix_hits = _server("unix", path)
    abstract = "\0flowrl-test-" + uuid.uuid4().hex
    ab, t3, ab_hits = _server("unix", abstract)
    code = ("import socket\nfor fam, addr in [(socket.AF_INET, ('127.0.0.1', %d)), (socket.AF_INET, ('10.0.0.1', 80)), "
            "(socket.AF_UNIX, %r), (socket.AF_UNIX, %r)]:\n    try:\n        s = socket.socket(fam); s.settimeout(1)\n"
            "        s.connect(addr); print('CONNECTED', addr)\n    except OSError as e: print('refused', e)\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry: u.sendto(b'x', ('127.0.0.1', %d))\n"
            "except OSError as e: print('refused', e)") % (port, path, abstract, port)
    try:
        out = call(runner, code)
    finally:
        for s in (tcp, unix, ab):
            s.close()
        for t in (t1, t2, t3):
            t.join(7)
    assert "CONNECTED" not in out and not tcp_hits and not unix_hits and not ab_hits, out


def test_no_signal_reaches_another_process(runner):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        call(runner, "import os, signal\nfor pid in (%d, %d, -1, 1):\n    try: os.kill(pid, signal.SIGKILL)\n"
                     "    except OSError as e: print(e)" % (victim.pid, os.getpid()))
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait(5)


def test_no_nested_namespace_and_no_mount(runner):
    out = call(runner, "import ctypes, ctypes.util\nlibc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
                       "print('unshare', libc.unshare(0x10000000), 'mount', libc.mount(b'none', b'/work', b'tmpfs', 0, None))")
    assert "unshare -1 mount -1" in out, out


def _host_processes(marker: str, field: str = "cmdline") -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/{field}", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_call_past_its_timeout_leaves_no_process(runner):
    marker = f"{time.time_ns() % 10**6 + 10**6}.5"
    code = ("import subprocess, os, time\nsubprocess.Popen(['sleep', '%s'], start_new_session=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    subprocess.Popen(['sleep', '%s'])\n    time.sleep(100)\n"
            "time.sleep(100)") % (marker, marker)
    start = time.monotonic()
    out = call(runner, code)
    assert "timed out" in out and time.monotonic() - start < 6
    deadline = time.monotonic() + 3
    while _host_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _host_processes(marker)


def test_a_fork_bomb_is_contained_and_the_host_stays_responsive(runner):
    marker = "fb" + uuid.uuid4().hex[:12]  # the bomb's process name (comm), inherited by every fork
    out = call(runner, f"import os\nopen('/proc/self/comm', 'w').write('{marker}')\nn = 0\ntry:\n    while True:\n"
                       "        os.fork(); n += 1\nexcept OSError as e:\n    print('stopped', n, e, flush=True)\n    os._exit(0)")
    start = time.monotonic()
    subprocess.run(["true"], check=True, timeout=5)
    assert time.monotonic() - start < 3.0
    assert "stopped" in out or "timed out" in out, out
    deadline = time.monotonic() + 3
    while _host_processes(marker, "comm") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _host_processes(marker, "comm")  # nothing of the bomb is left


def test_a_memory_bomb_fails_inside(runner):
    out = call(runner, "x = bytearray(1 << 33)")
    assert "MemoryError" in out
    out = call(runner, "x = []\nwhile True: x.append(b'x' * (1 << 20))")
    assert "MemoryError" in out or "timed out" in out


def test_endless_output_is_cut_early(runner):
    out = call(runner, "while True: print('x' * 1000)")
    assert len(out) < 2200 and "truncated" in out and "timed out" not in out  # stopped at the cap
    out = call(runner, "import os\nwhile True: os.write(2, b'y' * 65536)")
    assert len(out) < 2200 and "truncated" in out


def test_32_concurrent_calls_complete(runner):
    calls = [(ToolCall("python", {"code": f"import os; print({i} * {i}, len(os.listdir('/proc')))"}), None)
             for i in range(32)]
    start = time.monotonic()
    results = runner.run(calls)
    assert [r.text.split()[0] for r in results] == [str(i * i) for i in range(32)], [r.text for r in results][:3]
    assert all(r.error is None for r in results) and time.monotonic() - start < 8


def test_signals_to_the_call_itself_and_exit_codes_are_reported(runner):
    assert call(runner, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)").startswith("exit code")
    assert call(runner, "raise SystemExit(3)").startswith("exit code 3")
    assert signal.SIGKILL  # the host process is untouched: this line runs


def test_no_descriptor_of_the_caller_reaches_the_code(runner, tmp_path):
    secret = tmp_path / "held-open.txt"
    secret.write_text("SECRET-FD-" + uuid.uuid4().hex)
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)  # even a descriptor the caller left inheritable stays outside
    try:
        out = call(runner, "import os\nprint(sorted(os.listdir('/proc/self/fd')))\nfor fd in range(3, 256):\n"
                           "    try: print(os.pread(fd, 100, 0))\n    except OSError: pass")
    finally:
        os.close(fd)
    assert "SECRET-FD" not in out and out.startswith("['0', '1', '2', '3']"), out  # 3: the listing's own


def test_setuid_programs_and_limits_give_no_privilege(runner):
    code = ("import os, resource, subprocess\n"
            "print([l for l in open('/proc/self/status').read().splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))])\n"
            "for cmd in (['su', '-c', 'id'], ['mount', '-t', 'tmpfs', 'none', '/work'], ['hostname', 'x']):\n"
            "    r = subprocess.run(cmd, capture_output=True)\n    print('OK' if r.returncode == 0 else 'refused', cmd[0])\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)\n"
            "try: resource.setrlimit(resource.RLIMIT_NPROC, (hard + 1, hard + 1)); print('RAISED')\n"
            "except (ValueError, OSError): print('refused limit')\n"
            "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/hostname', '/proc/sysrq-trigger'):\n"
            "    try: open(p, 'w').write('x'); print('WROTE', p)\n    except OSError: print('refused', p)")
    out = call(runner, code)
    assert "CapEff:\\t0000000000000000" in out and "NoNewPrivs:\\t1" in out, out
    assert "OK" not in out and "RAISED" not in out and "WROTE" not in out, out
    assert out.count("refused") == 7, out
