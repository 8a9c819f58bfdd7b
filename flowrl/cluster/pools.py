"""Placing worker groups on live workers: the pool of each group and the workers of its ranks.

The pools themselves (names, sizes, which groups each hosts) are resolved and checked by the
config, :mod:`flowrl.config.pools`; this module holds the placement decisions the session makes
once the workers are up (pure: lists of worker addresses, no Dask calls).

A rank on a GPU must run on the node the device plan gave it: its GPU indices count that node's
GPUs. Each pool's workers come in jobs of their own (one node each, ``flowrl.cluster.job_script``),
so a rank whose plan node is the pool's ``k``-th goes to a worker of the pool's ``k``-th job (by job
number); on an ``address`` cluster a node is a host; on a LocalCluster every worker is node 0.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from flowrl.config.pools import Pool


def pool_of(pools: list[Pool]) -> dict[str, str]:
    """Group name -> pool name."""
    return {g: p.name for p in pools for g in p.groups}


def worker_nodes(workers: dict[str, dict[str, Any]], kind: str, processes: int = 1) -> dict[str, str]:
    """Worker address -> the node it runs on, from the scheduler's worker info: a SLURM worker's
    job (its name less the ``-i`` suffix dask-jobqueue adds when a job runs ``processes`` > 1
    workers; two jobs may share a host), an ``address`` cluster's worker host, ``"0"`` on a
    LocalCluster."""
    if kind == "slurm":
        out = {}
        for address, info in workers.items():
            name = str(info.get("name", address))
            head, _, tail = name.rpartition("-")
            out[address] = head if processes > 1 and head and tail.isdigit() else name
        return out
    if kind == "address":
        return {a: str(info.get("host") or a.split("://")[-1].rsplit(":", 1)[0]) for a, info in workers.items()}
    return {a: "0" for a in workers}


def _natural(key: str) -> list[Any]:
    """Sort key putting ``job-2`` before ``job-10``."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", key) if t]


def choose_workers(free: list[str], resources: dict[str, dict[str, float]], pool: str | None, size: int, *,
                   rank_nodes: Sequence[int] | None = None, nodes: dict[str, str] | None = None) -> list[str]:
    """``size`` distinct free workers carrying resource ``pool`` (any free worker when ``pool``
    is None), in address order. With ``rank_nodes`` (each rank's node among its pool's nodes, from
    the device plan) and ``nodes`` (:func:`worker_nodes` of every worker), rank ``r`` gets a free
    worker of the pool's ``rank_nodes[r]``-th node (nodes in job-number order). Raises
    RuntimeError naming the pool when there are too few, or a node has too few left."""
    candidates = [a for a in free if pool is None or resources.get(a, {}).get(pool, 0) > 0]
    where = f"pool {pool!r}" if pool else "the cluster"
    if len(candidates) < size:
        raise RuntimeError(f"{where} has {len(candidates)} free workers, {size} needed; "
                           "raise the pool's workers (cluster.pools[].workers) or shrink the group")
    if rank_nodes is None or nodes is None:
        return candidates[:size]
    order = sorted({n for a, n in nodes.items() if pool is None or resources.get(a, {}).get(pool, 0) > 0}, key=_natural)
    if len(order) <= max(rank_nodes):
        raise RuntimeError(
            f"the device plan puts ranks of {where} on {max(rank_nodes) + 1} node(s), and its workers run on "
            f"{len(order)} ({', '.join(order) or 'none'}); fix: give the pool one SLURM job per node of the plan "
            "(cluster.slurm.processes = the pool's ranks per node, flowrl devices shows the plan)")
    out: list[str] = []
    for rank, node in enumerate(rank_nodes):
        pick = next((a for a in candidates if nodes.get(a) == order[node] and a not in out), None)
        if pick is None:
            raise RuntimeError(
                f"rank {rank} of {where} belongs on its node {node} ({order[node]}), which has no free worker left; "
                "fix: cluster.slurm.processes at least the pool's ranks on one node (flowrl devices shows them)")
        out.append(pick)
    return out


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
