"""The jail's cost (issue 38): per-call overhead against a bare interpreter start, and calls per
second at 1, 8 and 32 concurrent calls.

    python benchmarks/jail_overhead.py [--rounds 100] [--repeats 3] [--calls 64]
                                       [--out benchmarks/results/jail_overhead.json]

Three kinds of call, all through the same spawn-and-collect path (``flowrl.agents.jail.run_process``:
asyncio pipes, a session of its own, the output cap and the timeout), so that only what is
started differs:

* ``bare start``: ``<python> -I -S -c pass``, the jail's interpreter started bare (the issue's
  baseline; a host root's jail runs the system python, see ``flowrl.agents.jail``);
* ``bare runner``: the same interpreter, flags, prelude (its rlimits included) and stdin payload
  (``pass``) as the jail runs, without ``setpriv`` and ``bwrap``: like for like;
* ``jail``: :func:`flowrl.agents.jail.run_jailed` of ``pass``, as the ``python`` tool calls it.

Latency: ``--rounds`` rounds, each running the three once in a shuffled order, so that load from
other users hits all alike; the overhead is the median (and 10th/90th percentiles) of the
per-round differences ``jail - bare runner`` (and ``jail - bare start``). CPU: the benchmark is a
child subreaper, so the processes a call leaves to finish after it returns (``bwrap``'s PID-1
init tears the namespaces down) are reaped here and counted: the CPU milliseconds per call of the
processes it started, which load does not inflate (the kernel's deferred network-namespace
cleanup runs in kernel threads and is not counted). Throughput: ``--calls`` calls with at most 1,
8 or 32 in flight, jail and bare runner in alternate blocks.

The load from others is recorded per repeat: the machine's busy CPU seconds (``/proc/stat``)
minus this benchmark's own, over the repeat's wall time, in cores.

Where the overhead goes (``--breakdown``, once per run, CPU only since load does not inflate it):
a ladder of commands, each adding one piece of the jail's command line to the one before
(``setpriv``; ``bwrap`` with a user and mount namespace; then the PID, IPC/UTS/cgroup and network
namespaces; no nested user namespaces; the mounts, session and environment), ending in the jail's
own command line running ``/usr/bin/true``, then the bare runner and the jail running ``pass``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_busy_cpu_s, machine_info, median, table, write_json  # noqa: E402

from flowrl.agents.jail import (  # noqa: E402
    JAIL_ENV,
    JailLimits,
    _interpreter,
    _jail_command,
    _usr_links,
    jail_problem,
    payload,
    run_jailed,
    run_process,
    runner_argv,
)

LIMITS = JailLimits()
KINDS = ("bare start", "bare runner", "jail")
PR_SET_CHILD_SUBREAPER = 36


def _calls(python: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    start_argv = [python, "-I", "-S", "-c", "pass"]
    runner = runner_argv(python, LIMITS, nproc=True)
    data = payload("pass", "")
    return {
        "bare start": lambda: run_process(start_argv, b"", LIMITS, env=dict(JAIL_ENV)),
        "bare runner": lambda: run_process(runner, data, LIMITS, env=dict(JAIL_ENV)),
        "jail": lambda: run_jailed("pass", limits=LIMITS),
    }


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + _children_cpu_s()


def _reap_orphans(timeout_s: float = 10.0) -> None:
    """Reap what calls left to finish (as subreaper, they became our children); only called
    while no call is in flight, so no status asyncio waits for is taken."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes left by the calls still run after {timeout_s} s")
            time.sleep(0.0005)


def _spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=10) if len(values) >= 2 else [float("nan")] * 9
    return {"median": median(values), "p10": q[0], "p90": q[-1]}


async def _latency(calls: dict[str, Callable[[], Awaitable[Any]]], rounds: int, rng: random.Random) -> dict[str, Any]:
    wall: dict[str, list[float]] = {k: [] for k in KINDS}
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        order = list(KINDS)
        rng.shuffle(order)
        for kind in order:
            cpu0 = _children_cpu_s()
            start = time.perf_counter()
            result = await calls[kind]()
            wall[kind].append(time.perf_counter() - start)
            _reap_orphans()
            cpu[kind].append(_children_cpu_s() - cpu0)
            assert result.ok, (kind, result)
    ms = lambda xs: [1000 * x for x in xs]  # noqa: E731
    diff = lambda a, b: [1000 * (x - y) for x, y in zip(wall[a], wall[b])]  # noqa: E731
    return {"wall_ms": {k: _spread(ms(v)) for k, v in wall.items()},
            "cpu_ms": {k: median(ms(v)) for k, v in cpu.items()},
            "overhead_ms": _spread(diff("jail", "bare runner")),
            "overhead_vs_bare_start_ms": _spread(diff("jail", "bare start")),
            "cpu_overhead_ms": median(ms(cpu["jail"])) - median(ms(cpu["bare runner"]))}


async def _rate(call: Callable[[], Awaitable[Any]], calls: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            result = await call()
            assert result.ok, result

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    rate = calls / (time.perf_counter() - start)
    _reap_orphans()
    return rate


async def _repeat(calls: dict[str, Callable[[], Awaitable[Any]]], rounds: int, n: int, seed: int) -> dict[str, Any]:
    load_before, busy0, own0, t0 = os.getloadavg(), machine_busy_cpu_s(), _own_cpu_s(), time.perf_counter()
    out = await _latency(calls, rounds, random.Random(seed))
    rates: dict[str, dict[str, float]] = {"jail": {}, "bare runner": {}}
    for c in (1, 8, 32):
        for kind in (("jail", "bare runner") if seed % 2 else ("bare runner", "jail")):
            rates[kind][str(c)] = await _rate(calls[kind], n, c)
    wall = time.perf_counter() - t0
    others = (machine_busy_cpu_s() - busy0) - (_own_cpu_s() - own0)
    out.update(calls_per_s=rates, wall_s=wall, others_busy_cores=others / wall,
               load_avg_1min_before_after=[load_before[0], os.getloadavg()[0]])
    return out


def _breakdown(python: str, rounds: int, block: int) -> dict[str, float]:
    """CPU ms per call of each step of the ladder (see the module docstring): median over
    ``rounds`` of blocks of ``block`` calls, the steps alternated block by block."""
    import subprocess

    jail_argv = list(_jail_command(LIMITS)[0])
    at = next(i for i, a in enumerate(jail_argv) if os.path.basename(a) == "bwrap")
    setpriv, bwrap, options = jail_argv[:at], jail_argv[at], jail_argv[at + 1:jail_argv.index("--")]
    fs = ["--ro-bind", "/usr", "/usr", *_usr_links()]
    true = ["--", "/usr/bin/true"]
    namespaces = [["--unshare-user"], ["--unshare-pid"], ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup"],
                  ["--unshare-net"]]
    ladder: dict[str, tuple[list[str], bytes]] = {"exec /usr/bin/true": (["/usr/bin/true"], b""),
                                                  "+ setpriv": ([*setpriv, "/usr/bin/true"], b"")}
    names = ["+ bwrap: user and mount namespaces", "+ PID namespace (bwrap's init)", "+ IPC, UTS, cgroup namespaces",
             "+ network namespace"]
    for i, name in enumerate(names):
        ladder[name] = ([*setpriv, bwrap, *(a for ns in namespaces[:i + 1] for a in ns), *fs, *true], b"")
    ladder["+ no nested user namespaces"] = ([*setpriv, bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                                              *fs, *true], b"")
    ladder["+ mounts, session, environment: the jail's command line"] = ([*setpriv, bwrap, *options, *true], b"")
    ladder["bare runner (pass)"] = (runner_argv(python, LIMITS, nproc=True), payload("pass", ""))
    ladder["jail (pass)"] = (jail_argv, payload("pass", ""))
    cpu: dict[str, list[float]] = {k: [] for k in ladder}
    for _ in range(rounds):
        for name, (argv, data) in ladder.items():
            before = _children_cpu_s()
            for _ in range(block):
                done = subprocess.run(argv, input=data, capture_output=True, env={}, timeout=30)
                assert done.returncode == 0, (name, done.stderr[-500:])
            _reap_orphans()
            cpu[name].append(1000 * (_children_cpu_s() - before) / block)
    return {k: median(v) for k, v in cpu.items()}


def _print_repeat(i: int, r: dict[str, Any]) -> None:
    f = lambda s: f"{s['median']:.1f} [{s['p10']:.1f}, {s['p90']:.1f}]"  # noqa: E731
    print(f"\nrepeat {i}: others kept {r['others_busy_cores']:.2f} of {os.cpu_count()} cores busy; 1-min load "
          f"{r['load_avg_1min_before_after'][0]:.1f} -> {r['load_avg_1min_before_after'][1]:.1f}")
    rows = [[k, f(r["wall_ms"][k]), f"{r['cpu_ms'][k]:.1f}"] for k in KINDS]
    rows += [["jail - bare runner (paired)", f(r["overhead_ms"]), f"{r['cpu_overhead_ms']:.1f}"],
             ["jail - bare start (paired)", f(r["overhead_vs_bare_start_ms"]), ""]]
    print(table(["per call", "wall ms: median [p10, p90]", "CPU ms"], rows))
    print(table(["concurrent calls", "jail calls/s", "bare runner calls/s"],
                [[c, f"{r['calls_per_s']['jail'][c]:.1f}", f"{r['calls_per_s']['bare runner'][c]:.1f}"]
                 for c in ("1", "8", "32")]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="latency rounds per repeat (each kind once)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=64, help="calls per throughput block")
    parser.add_argument("--breakdown", type=int, default=5, help="rounds of the CPU breakdown (0: none)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "jail_overhead.json"))
    args = parser.parse_args()
    for name in ("rounds", "repeats", "calls"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name}={getattr(args, name)} must be at least 1")
    if (problem := jail_problem()) is not None:
        raise SystemExit(f"no jail on this machine: {problem}")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed: the CPU column needs Linux")
    python = _interpreter()[0]
    calls = _calls(python)

    async def run() -> list[dict[str, Any]]:
        for kind in KINDS:  # warm the page cache and the caches of the jail's command line
            for _ in range(3):
                assert (await calls[kind]()).ok
        _reap_orphans()
        out = []
        for i in range(args.repeats):
            out.append(await _repeat(calls, args.rounds, args.calls, seed=i))
            _print_repeat(i, out[-1])
        return out

    repeats = asyncio.run(run())
    breakdown = _breakdown(python, args.breakdown, block=10) if args.breakdown else {}
    if breakdown:
        print("\nwhere the overhead goes (CPU ms per call, median of blocks of 10)")
        rows, previous = [], None
        for name, value in breakdown.items():
            step = "" if previous is None or not name.startswith("+") else f"{value - previous:+.2f}"
            rows.append([name, f"{value:.2f}", step])
            previous = value
        print(table(["command", "CPU ms", "step"], rows))
    overheads = [r["overhead_ms"]["median"] for r in repeats]
    summary = {"overhead_ms_median_per_repeat": overheads, "overhead_ms_worst_repeat": max(overheads),
               "cpu_overhead_ms_per_repeat": [r["cpu_overhead_ms"] for r in repeats],
               "others_busy_cores_per_repeat": [r["others_busy_cores"] for r in repeats],
               "jail_calls_per_s_median": {c: median([r["calls_per_s"]["jail"][c] for r in repeats]) for c in ("1", "8", "32")}}
    print("\nsummary over repeats")
    print(table(["", "value"], [["jail - bare runner, median ms per repeat", ", ".join(f"{x:.1f}" for x in overheads)],
                                ["CPU overhead ms per repeat", ", ".join(f"{r['cpu_overhead_ms']:.1f}" for r in repeats)],
                                ["others' busy cores per repeat", ", ".join(f"{r['others_busy_cores']:.2f}" for r in repeats)],
                                *[[f"jail calls/s at {c} concurrent (median)", f"{v:.1f}"]
                                  for c, v in summary["jail_calls_per_s_median"].items()]]))
    write_json({"summary": summary, "repeats": repeats, "cpu_breakdown_ms": breakdown, "rounds": args.rounds, "calls": args.calls,
                "jail_interpreter": python, "limits": {"timeout_s": LIMITS.timeout_s, "memory_mb": LIMITS.memory_mb},
                "machine": machine_info()}, args.out)


if __name__ == "__main__":
    main()
