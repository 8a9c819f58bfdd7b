"""The ``code`` reward: run the response's program against test cases, in the sandbox.

The data are verl's code data sources (``codecontests``, ``apps``, ``codeforces``, ``taco``, and
PRIME's code rows): ``ground_truth`` is a JSON object (or a dict) of test cases in one of verl's
forms:

* call-based: ``{"fn_name": "f", "inputs": [...], "outputs": [...]}``, every input a string of
  JSON lines (one per argument), every output a JSON value: the function (or ``Solution().f``)
  is called with the arguments;
* standard input: ``{"inputs": [...], "outputs": [...]}``: the program reads the input and what it
  prints is compared with the output;
* assert cases: ``{"assert_case": ["assert f(1) == 2", ...]}`` (SandboxFusion's form): each line
  runs after the program.

The program is the last fenced ```` ```python ```` block of the response, else the response
(verl's prime_code). All of a response's tests run in one call of the sandbox
(:func:`flowrl.agents.sandbox.run_code`: the jail, SandboxFusion or, opted in, an unjailed
subprocess), each with its own time limit; only the inputs go in, and the outputs are compared out
here, so code that prints or forges anything learns nothing of the expected answers. The
comparison follows verl's ``prime_code`` testing util (a tuple equals a list, the output equals
the expected value or its first element; printed lines compared stripped, then as whitespace
tokens, then as floats to 1e-6). The score is verl's: 1.0 when every test passes, else the
fraction of the first ten that pass; extra values ``tests_passed`` (fraction of all) and
``compiled`` (the program ran at all).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from flowrl.agents.jail import JailLimits, run_sync

__all__ = ["code", "compare_call", "compare_stdout", "extract_program", "parse_tests", "score_results"]

MAX_SCORED_TESTS = 10  # verl's continuous score: the first ten tests
TEST_TIMEOUT_S = 5.0

# verl's header before a solution (prime_code's testing util): the imports a contest program assumes.
HEADER = "".join(f"from {m} import *\n" for m in (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
    "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")) + (
    "import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, "
    "functools, operator, io, sys, json\nsys.setrecursionlimit(6 * 10**5)\n")

# Runs in the sandbox; stdin: {"program", "kind", "fn_name", "inputs", "timeout"}. One JSON line
# per test on stdout: [index, output or None, error or None].
HARNESS = r'''
import contextlib, io, json, os, signal, sys
spec = json.loads(sys.stdin.read())
real_out = os.fdopen(os.dup(1), "w")
def _alarm(*_):
    raise TimeoutError("time limit")
signal.signal(signal.SIGALRM, _alarm)
def run(i, fn):
    buf = io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, spec["timeout"])
    try:
        with contextlib.redirect_stdout(buf):
            value = fn(buf)
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps([i, value, None]), file=real_out, flush=True)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps([i, None, type(exc).__name__ + ": " + str(exc)[:200]]), file=real_out, flush=True)
def compile_program():
    g = {"__name__": "__solution__"}
    exec(compile(spec["program"], "solution.py", "exec"), g)
    return g
if spec["kind"] == "call":
    try:
        g = compile_program()
        f = g.get(spec["fn_name"]) or getattr(g["Solution"](), spec["fn_name"])
    except BaseException as exc:
        print(json.dumps([-1, None, type(exc).__name__ + ": " + str(exc)[:200]]), file=real_out, flush=True)
        raise SystemExit(0)
    for i, text in enumerate(spec["inputs"]):
        args = [json.loads(line) for line in text.split("\n")] if text.strip() else []
        run(i, lambda buf, a=args: (lambda v: list(v) if isinstance(v, tuple) else v)(f(*a)))
else:
    code = compile(spec["program"], "solution.py", "exec")
    for i, text in enumerate(spec["inputs"]):
        def once(buf, text=text):
            sys.stdin = io.StringIO(text)
            try:
                exec(code, {"__name__": "__main__"})
            except SystemExit:
                pass
            return buf.getvalue()
        run(i, once)
'''


def extract_program(response: str) -> str:
    """The last ```` ```python ```` block's code, else the whole response (verl's prime_code)."""
    return response.split("```python")[-1].split("```")[0]


def parse_tests(ground_truth: Any) -> dict:
    """verl's test cases as a dict with ``inputs``, ``outputs`` (and ``fn_name`` / ``assert_case``)."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else dict(ground_truth)
    if not isinstance(tests, dict):
        raise ValueError(f"code tests must be a JSON object, got {type(tests).__name__}")
    if isinstance(tests.get("assert_case"), list):
        cases = tests["assert_case"]
        return {"inputs": [""] * len(cases), "outputs": [None] * len(cases), "assert_case": cases}
    if "inputs" not in tests or "outputs" not in tests or len(tests["inputs"]) != len(tests["outputs"]):
        raise ValueError("code tests need 'inputs' and 'outputs' lists of one length (or 'assert_case')")
    return tests


def compare_call(output: Any, expected_json: Any) -> bool:
    """verl's call-based check: equal, or equal to the expected list's first element."""
    expected = json.loads(expected_json) if isinstance(expected_json, str) else expected_json
    if output == expected:
        return True
    if isinstance(expected, list) and expected and output == expected[0]:
        return True
    return False


def _floats(tokens: list[str]) -> list[float] | None:
    try:
        return [float(t) for t in tokens]
    except ValueError:
        return None


def compare_stdout(output: str, expected: Any) -> bool:
    """verl's standard-input checks: stripped lines, then whitespace tokens, then floats to 1e-6."""
    expected = "\n".join(expected) if isinstance(expected, list) else str(expected)
    out_lines = [line.strip() for line in output.strip().splitlines()]
    exp_lines = [line.strip() for line in expected.strip().splitlines()]
    if out_lines == exp_lines:
        return True
    out_tokens, exp_tokens = output.split(), expected.split()
    if out_tokens == exp_tokens:
        return True
    a, b = _floats(out_tokens), _floats(exp_tokens)
    return a is not None and b is not None and len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b))


def score_results(passed: list[bool]) -> float:
    """verl's continuous score: 1.0 if all pass, else the passing fraction of the first ten."""
    if passed and all(passed):
        return 1.0
    first = passed[:MAX_SCORED_TESTS]
    return sum(first) / len(first) if first else 0.0


def _spec(program: str, tests: dict, timeout: float) -> tuple[str, dict]:
    if "assert_case" in tests:
        program = HEADER + program + "\n" + "\n".join(
            f"try:\n    {case.strip()}\n    print('{i}:ok')\nexcept BaseException:\n    pass" for i, case in
            enumerate(tests["assert_case"]))
        return "stdin", {"program": program, "kind": "stdin", "inputs": [""], "timeout": timeout * len(tests["inputs"])}
    kind = "call" if tests.get("fn_name") else "stdin"
    return kind, {"program": HEADER + program, "kind": kind, "fn_name": tests.get("fn_name"),
                  "inputs": [str(i) if not isinstance(i, list) else "\n".join(map(str, i)) for i in tests["inputs"]],
                  "timeout": timeout}


def _read_lines(stdout: str, count: int) -> tuple[dict[int, tuple[Any, Any]], bool]:
    results: dict[int, tuple[Any, Any]] = {}
    compiled = True
    for line in stdout.splitlines():
        try:
            i, value, err = json.loads(line)
        except (ValueError, TypeError):
            continue
        if i == -1:
            compiled = False
        elif isinstance(i, int) and 0 <= i < count and i not in results:
            results[i] = (value, err)
    return results, compiled


def run_tests(program: str, tests: dict, *, timeout_s: float = TEST_TIMEOUT_S) -> tuple[list[bool], bool]:
    """``(passed per test, whether the program ran)``: all tests in one sandbox call."""
    from flowrl.agents.sandbox import run_code

    kind, spec = _spec(program, tests, timeout_s)
    count = len(tests["inputs"])
    limits = JailLimits(timeout_s=min(timeout_s * max(count, 1) + 2.0, 60.0), cpu_s=int(timeout_s * count) + 2,
                        memory_mb=1024, max_output_chars=1 << 20)
    result = run_sync(run_code(HARNESS, stdin=json.dumps(spec), limits=limits))
    lines, compiled = _read_lines(result.stdout, 1 if "assert_case" in tests else count)
    if "assert_case" in tests:
        printed = (lines.get(0) or ("", None))[0] or ""
        ok = {int(x.split(":")[0]) for x in printed.split() if x.endswith(":ok") and x.split(":")[0].isdigit()}
        return [i in ok for i in range(count)], 0 in lines and lines[0][1] is None
    passed = []
    for i, expected in enumerate(tests["outputs"]):
        value, err = lines.get(i, (None, "no result"))
        if err is not None:
            passed.append(False)
        elif kind == "call":
            passed.append(compare_call(value, expected))
        else:
            passed.append(compare_stdout(str(value), expected))
    return passed, compiled and bool(lines)


@lru_cache(maxsize=4096)
def _run_cached(program: str, tests_json: str) -> tuple[list[bool], bool]:
    """:func:`run_tests`, once per distinct (program, tests): a policy repeats its answers."""
    return run_tests(program, json.loads(tests_json))


def code(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict:
    """The ``code`` reward (see the module docstring): ``{"score", "tests_passed", "compiled"}``."""
    tests = parse_tests(ground_truth)
    passed, compiled = _run_cached(extract_program(solution_str), json.dumps(tests, sort_keys=True))
    return {"score": score_results(passed), "tests_passed": sum(passed) / max(len(passed), 1),
            "compiled": float(compiled)}


code.runs_code = True  # type: ignore[attr-defined]  (pre-flight: needs a working sandbox)
