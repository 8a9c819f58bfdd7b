"""Placing worker groups on live workers: the pool of each group and the workers of its ranks.

The pools themselves (names, sizes, which groups each hosts) are resolved and checked by the
config, :mod:`flowrl.config.pools`; this module holds the placement decisions the session makes
once the workers are up (pure: lists of worker addresses, no Dask calls).
"""

from __future__ import annotations

from flowrl.config.pools import Pool


def pool_of(pools: list[Pool]) -> dict[str, str]:
    """Group name -> pool name."""
    return {g: p.name for p in pools for g in p.groups}


def choose_workers(free: list[str], resources: dict[str, dict[str, float]], pool: str | None, size: int) -> list[str]:
    """``size`` distinct free workers carrying resource ``pool`` (any free worker when ``pool``
    is None), in address order. Raises RuntimeError naming the pool when there are too few."""
    candidates = [a for a in free if pool is None or resources.get(a, {}).get(pool, 0) > 0]
    if len(candidates) < size:
        where = f"pool {pool!r}" if pool else "the cluster"
        raise RuntimeError(f"{where} has {len(candidates)} free workers, {size} needed; "
                           "raise the pool's workers (cluster.pools[].workers) or shrink the group")
    return candidates[:size]


def rank_threads(cluster: object, num_rank_workers: int) -> int:
    """The compute threads each rank-holding worker process may use: its job's cores over its
    processes on SLURM (``cluster.slurm.cores // processes``); on a LocalCluster the machine's
    usable cores over the rank workers it starts (at least 1); 1 on an existing scheduler."""
    import os

    kind = getattr(cluster, "kind", "local")
    if kind == "slurm":
        s = cluster.slurm  # type: ignore[attr-defined]
        return max(1, s.cores // s.processes)
    if kind == "local":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // max(1, num_rank_workers))
    return 1
