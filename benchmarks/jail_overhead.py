"""The jail's cost (issue 38): one jailed call of ``pass`` against a bare interpreter start, and
calls per second at 1, 8 and 32 concurrent calls.

    python benchmarks/jail_overhead.py [--calls 60] [--out benchmarks/results/jail_overhead.json]

Per-call latency (median of ``--calls`` sequential calls, alternated call by call so load from
other users hits all alike):

* ``bare -I``: ``python -I -c pass`` of this interpreter (the issue's baseline);
* ``bare jail python``: ``<jail's interpreter> -I -S -c pass``, the same process the jail starts
  (the system python when a host root runs the jail as nobody), outside any jail;
* ``jail``: :func:`flowrl.agents.jail.run_jailed` of ``pass`` through asyncio, as the ``python``
  tool calls it (bwrap, namespaces, mounts, the prelude's limits, stdin and capped output).

Overhead = jail - bare jail python (same interpreter, same flags). Throughput: ``--calls`` jailed
calls with at most 1, 8 or 32 in flight. Absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, table, write_json  # noqa: E402

from flowrl.agents.jail import _interpreter, jail_problem, run_jailed  # noqa: E402


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return time.perf_counter() - start


async def _jailed() -> float:
    start = time.perf_counter()
    result = await run_jailed("pass")
    assert result.ok, result
    return time.perf_counter() - start


async def _throughput(calls: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            result = await run_jailed("pass")
            assert result.ok, result

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "jail_overhead.json"))
    args = parser.parse_args()
    if (problem := jail_problem()) is not None:
        raise SystemExit(f"no jail on this machine: {problem}")
    jail_python = _interpreter()[0]
    samples: dict[str, list[float]] = {"bare -I": [], "bare jail python": [], "jail": []}
    for _ in range(3):  # warm the page cache
        _timed([sys.executable, "-I", "-c", "pass"]), asyncio.run(_jailed())
    for _ in range(args.calls):
        samples["bare -I"].append(_timed([sys.executable, "-I", "-c", "pass"]))
        samples["bare jail python"].append(_timed([jail_python, "-I", "-S", "-c", "pass"]))
        samples["jail"].append(asyncio.run(_jailed()))
    ms = {k: 1000 * median(v) for k, v in samples.items()}
    rates = {c: asyncio.run(_throughput(args.calls, c)) for c in (1, 8, 32)}
    overhead = ms["jail"] - ms["bare jail python"]
    print(table(["", "median ms / call"], [[k, f"{v:.1f}"] for k, v in ms.items()]
                + [["jail overhead (jail - bare jail python)", f"{overhead:.1f}"],
                   ["jail - bare -I", f"{ms['jail'] - ms['bare -I']:.1f}"]]))
    print()
    print(table(["concurrent calls", "calls / s"], [[c, f"{r:.1f}"] for c, r in rates.items()]))
    result = {"median_ms": ms, "overhead_ms": overhead, "overhead_vs_bare_I_ms": ms["jail"] - ms["bare -I"],
              "calls_per_s": {str(c): r for c, r in rates.items()}, "calls": args.calls,
              "interpreter": sys.executable, "jail_interpreter": jail_python, "machine": machine_info()}
    print(f"\nwrote {write_json(result, args.out)}")


if __name__ == "__main__":
    main()
