"""The built-in tools: the calculator (exact, bounded, no eval) and the Python sandbox (a jail:
another process; no network, no writes outside its directory, limits, truncated output)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from flowrl.agents.calculator import Calculator, calculate
from flowrl.agents.sandbox import PythonSandbox, run_python


@pytest.mark.parametrize("expr,value", [("347*86", "29842"), ("2**10", "1024"), ("7/2", "3.5"), ("8/4", "2"),
                                        ("(1+2)*-3", "-9"), ("10//3", "3"), ("10%3", "1"), (" 1.5 + 1 ", "2.5")])
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "1+", "2**1000", "9**9**9", "1/0", "(1", "1 2",
                                  "x", "", "1" * 300])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expr):
    with pytest.raises(ValueError):
        calculate(expr)


def test_calculator_tool_checks_its_arguments():
    tool = Calculator()
    assert asyncio.run(tool.call({"expression": "6*7"}, None)) == "42"
    with pytest.raises(ValueError, match="single argument"):
        asyncio.run(tool.call({"expr": "6*7"}, None))


def sandbox(code: str, **kw) -> tuple[int | None, str]:
    return asyncio.run(run_python(code, **kw))


def test_sandbox_runs_code_in_another_process_and_a_scratch_directory():
    code, out = sandbox("import os; print(os.getpid()); print(os.getcwd())")
    pid, cwd = out.split()
    assert code == 0 and int(pid) != os.getpid() and cwd == "/work"  # the jail's own tmpfs


def test_sandbox_refuses_sockets():
    code, out = sandbox("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                        "s.connect(('127.0.0.1', 9))\nprint('connected')")
    assert code != 0 and "connected" not in out and "Error" in out
    code, out = sandbox("import socket; socket.create_connection(('example.com', 80), timeout=1)")
    assert code != 0


def test_sandbox_writes_nothing_outside_its_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    code, out = sandbox(f"open({str(target)!r}, 'w').write('x')")
    assert code != 0 and not target.exists()
    code, out = sandbox(f"import subprocess; subprocess.run(['touch', {str(target)!r}])")
    assert not target.exists()  # processes may start inside the jail; they see no host directory
    code, out = sandbox("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())")
    assert code == 0 and out.strip() == "ok"


def test_sandbox_limits_wall_time_memory_and_output():
    code, out = sandbox("while True: pass", timeout_s=1.0, cpu_s=5)
    assert code is None and "timed out" in out
    code, out = sandbox("x = bytearray(1 << 31)", memory_mb=256)
    assert code != 0 and "MemoryError" in out
    code, out = sandbox("print('x' * (1 << 20))", max_output_chars=100)
    assert len(out) < 200 and "truncated" in out  # the call is stopped at the cap


def test_python_tool_reports_failures_as_text():
    tool = PythonSandbox(timeout_s=5.0)
    assert asyncio.run(tool.call({"code": "print(6*7)"}, None)).strip() == "42"
    assert asyncio.run(tool.call({"code": "raise SystemExit(3)"}, None)).startswith("exit code 3")
    with pytest.raises(ValueError):
        asyncio.run(tool.call({}, None))
