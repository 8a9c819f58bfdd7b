"""Ranks as spawned processes for unit tests of process-group code: each runs ``target(*args)``
with its own arguments; every join has a timeout and a process still alive after it is killed."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Sequence


def run_ranks(target: Callable[..., Any], rank_args: Sequence[tuple], *, timeout: float) -> list[int | None]:
    """Start one spawned process per entry of ``rank_args``, wait up to ``timeout`` s for each,
    kill what is left, and return their exit codes (0 for a rank that finished)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in rank_args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    return [p.exitcode for p in procs]
