"""A run's device plan from its config: the worker groups as :class:`GroupLayout` s (pools from the
placement, a vLLM replica's engine span) and the inventory a SLURM spec gives. Pure: the plan
itself is ``flowrl.parallel.device_plan``; what this machine has is asked by the caller.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS
from flowrl.config.errors import ConfigError
from flowrl.config.pools import HYBRID_GROUP, HYBRID_GROUPS, resolve_pools
from flowrl.parallel.device_plan import DevicePlan, DevicePlanError, GroupLayout, Inventory, plan_devices

__all__ = ["PoolsInventory", "check_slurm_jobs", "device_plan", "group_layouts", "own_job_processes", "pool_gpus", "pool_processes",
           "slurm_inventory", "started_sizes"]

#: The config section of each worker group (whose ``data_parallel_size`` sets its size); the fused
#: hybrid group is sized by the actor's.
_SECTIONS = {"rollout": "rollout", "actor": "actor", "ref": "ref", "critic": "critic", "rm": "reward_model",
             HYBRID_GROUP: "actor"}
_TRAINERS = ("actor", HYBRID_GROUP)


def started_sizes(cfg: Any) -> dict[str, int]:
    """The worker groups the run starts and their world sizes, as the session starts them: with
    ``placement=hybrid`` the rollout, actor and ref fused into one group, :data:`HYBRID_GROUP`, of
    the actor's size (``flowrl.roles.specs.hybrid_specs``: one process per rank holds the three),
    the others as they are."""
    sizes = dict(cfg.worker_group_sizes)
    if cfg.placement != "hybrid" or not {"actor", "rollout"} <= set(sizes):
        return sizes
    return {HYBRID_GROUP: sizes["actor"], **{n: s for n, s in sizes.items() if n not in HYBRID_GROUPS}}


def group_layouts(cfg: Any, sizes: dict[str, int] | None = None) -> list[GroupLayout]:
    """The run's worker groups in start order, each in the pool whose devices it shares: one pool
    for ``colocated`` and ``hybrid``, one per group for ``split``, or the declared
    ``cluster.pools`` (pools resolved as the session resolves them, ``auto`` placement resolved).
    ``sizes``: the groups as started ({name: world size}; default :func:`started_sizes`), so the
    plan names exactly the groups the session creates, a family's own groups included. The
    rollout's engine spans its replica's tensor-parallel devices when the generation backend
    runs its engine in processes of its own (vLLM)."""
    sizes = started_sizes(cfg) if sizes is None else dict(sizes)
    cluster = dataclasses.replace(cfg.cluster, placement=cfg.placement)
    pool_of = {g: p.name for p in resolve_pools(cluster, sizes) for g in p.groups}
    spec = GEN_BACKENDS.spec(cfg.rollout.name)
    out = []
    for name in sorted(sizes, key=lambda n: n not in _TRAINERS):  # the trainer first: refusals name its key
        span = cfg.rollout.tensor_model_parallel_size if name == "rollout" and not spec.in_process else 1
        if name in _SECTIONS:
            key = f"{_SECTIONS[name]}.data_parallel_size"
            value = getattr(cfg, _SECTIONS[name]).data_parallel_size
        else:  # a family's own group: its size is its GroupSpec's mesh
            key, value = f"the {name} group's mesh (its family's group_specs)", sizes[name]
        out.append(GroupLayout(name=name, world_size=sizes[name], pool=pool_of.get(name, HYBRID_GROUP),
                               size_key=key, size_value=value, engine_span=span))
    return out


def slurm_inventory(cfg: Any) -> Inventory:
    """What SLURM jobs of ``cluster.slurm`` give: one node per job with ``gpus_per_job`` GPUs, as
    many jobs as the run's GPU slots need (a pool's groups share slots rank by rank); without GPUs,
    as many jobs as its worker processes need at ``processes`` per job."""
    slurm = cfg.cluster.slurm
    pools = _by_pool(group_layouts(cfg))
    if slurm.gpus_per_job > 0:
        slots = sum(max(g.world_size for g in layouts) for layouts in pools.values())
        jobs = -(-slots // slurm.gpus_per_job)
    else:
        jobs = -(-sum(g.world_size for layouts in pools.values() for g in layouts) // max(slurm.processes, 1))
    return Inventory(nodes=max(jobs, 1), gpus_per_node=slurm.gpus_per_job,
                     source=f"cluster.slurm: {jobs} job(s), gpus_per_job={slurm.gpus_per_job}")


def _by_pool(layouts: list[GroupLayout]) -> dict[str, list[GroupLayout]]:
    out: dict[str, list[GroupLayout]] = {}
    for g in layouts:
        out.setdefault(g.pool, []).append(g)
    return out


def pool_gpus(cfg: Any) -> dict[str, int]:
    """On SLURM, the declared pools with jobs of their own size (``cluster.pools[].gpus_per_job``):
    {pool: GPUs per job}; empty elsewhere (every pool on ``cluster.slurm``'s jobs)."""
    if cfg.cluster.kind != "slurm":
        return {}
    return {p.name: p.gpus_per_job for p in cfg.cluster.pools if p.gpus_per_job is not None}


def pool_processes(cfg: Any, pool: str) -> int:
    """Worker processes per SLURM job of ``pool``: with GPUs of its own, one per GPU for each of
    its groups (colocated groups share each GPU, a rank of each: ``own_job_processes``), else
    ``cluster.slurm.processes``."""
    gpus = pool_gpus(cfg).get(pool)
    groups = next((len(p.groups) for p in cfg.cluster.pools if p.name == pool), 1)
    return own_job_processes(gpus, groups) or cfg.cluster.slurm.processes


def own_job_processes(gpus: int | None, groups: int) -> int:
    """Worker processes per job of a pool with ``gpus`` GPUs per job of its own and ``groups``
    worker groups sharing them (0 when it has none: the cluster's processes apply)."""
    return (gpus or 0) * max(groups, 1)


@dataclasses.dataclass(frozen=True)
class PoolsInventory(Inventory):
    """SLURM jobs sized per pool: ``pools`` = ((pool, jobs, GPUs per job), ...), one node per job,
    the pools' nodes one after the other (``gpus_per_node``: the largest, for ``has_gpus``)."""

    pools: tuple[tuple[str, int, int], ...] = ()

    @property
    def total_gpus(self) -> int:
        return sum(jobs * gpus for _, jobs, gpus in self.pools)

    def describe(self) -> str:
        parts = ", ".join(f"{name}: {jobs} job(s) x {gpus} GPU(s)" for name, jobs, gpus in self.pools)
        return f"{self.nodes} node(s), {self.total_gpus} GPU(s) ({parts}; {self.source})"


def _pool_jobs(cfg: Any, name: str, layouts: list[GroupLayout]) -> int:
    """SLURM jobs pool ``name`` needs on its own jobs: GPU slots (its groups share them rank by
    rank) over its GPUs per job, or its worker processes over its processes per job."""
    gpus = pool_gpus(cfg).get(name, cfg.cluster.slurm.gpus_per_job)
    if gpus > 0:
        return max(1, -(-max(g.world_size for g in layouts) // gpus))
    return max(1, -(-sum(g.world_size for g in layouts) // pool_processes(cfg, name)))


def _plan_per_pool(cfg: Any, layouts: list[GroupLayout], dtype: str | None) -> DevicePlan:
    """Each pool planned on its own SLURM jobs (:func:`pool_gpus`), its nodes after the previous
    pools' nodes; the ranks in the groups' order."""
    ranks, sized, first = [], [], 0
    for name, members in _by_pool(layouts).items():
        gpus = pool_gpus(cfg).get(name, cfg.cluster.slurm.gpus_per_job)
        jobs = _pool_jobs(cfg, name, members)
        own = Inventory(nodes=jobs, gpus_per_node=gpus, source=f"pool {name!r}'s SLURM jobs")
        ranks += [dataclasses.replace(r, node=r.node + first) for r in plan_devices(own, members, dtype=dtype).ranks]
        sized.append((name, jobs, gpus))
        first += jobs
    order = {g.name: i for i, g in enumerate(layouts)}
    inventory = PoolsInventory(nodes=first, gpus_per_node=max(g for _, _, g in sized), pools=tuple(sized),
                               source="cluster.pools[].gpus_per_job")
    return DevicePlan(inventory, tuple(sorted(ranks, key=lambda r: (order[r.group], r.rank))))


def device_plan(cfg: Any, inventory: Inventory, sizes: dict[str, int] | None = None) -> DevicePlan:
    """The plan of ``cfg`` on ``inventory`` (``sizes``: the groups as started, see
    :func:`group_layouts`); a layout the inventory cannot hold is a :class:`ConfigError` naming
    the key and the fix. ``model.dtype=auto`` (or absent) takes the device kind's default (bf16
    on GPU, fp32 on CPU). On SLURM with pools whose jobs have GPUs of their own
    (:func:`pool_gpus`), those jobs are the inventory: each pool is planned on its own."""
    dtype = getattr(cfg.model, "dtype", "auto")
    dtype = None if dtype == "auto" else dtype
    try:
        if pool_gpus(cfg):
            return _plan_per_pool(cfg, group_layouts(cfg, sizes), dtype)
        return plan_devices(inventory, group_layouts(cfg, sizes), dtype=dtype)
    except DevicePlanError as exc:
        raise ConfigError(exc.key, exc.value, exc.problem, exc.fix) from None


def check_slurm_jobs(cfg: Any, plan: DevicePlan, sizes: dict[str, int] | None = None) -> None:
    """On SLURM with GPUs, the jobs must hold the plan: each pool's workers come in jobs of
    ``cluster.slurm.processes`` workers, one node each, and a rank must run in the job of its plan
    node (``flowrl.cluster.pools.choose_workers``). So every job needs room for the pool's ranks
    on one node, and the pool needs a job per node it uses. Raises :class:`ConfigError` naming
    ``cluster.slurm.processes`` and the value that fits, before any job is submitted."""
    if cfg.cluster.kind != "slurm" or not plan.inventory.has_gpus:
        return
    sizes = started_sizes(cfg) if sizes is None else dict(sizes)
    cluster = dataclasses.replace(cfg.cluster, placement=cfg.placement)
    workers = {p.name: p.workers for p in resolve_pools(cluster, sizes)}
    per_node: dict[str, dict[int, int]] = {}
    for r in plan.ranks:
        counts = per_node.setdefault(r.pool, {})
        counts[plan.pool_node(r)] = counts.get(plan.pool_node(r), 0) + 1
    for pool, counts in per_node.items():
        processes = pool_processes(cfg, pool)
        most, nodes = max(counts.values()), len(counts)
        jobs = -(-workers.get(pool, sum(counts.values())) // max(processes, 1))
        if most > processes or jobs < nodes:
            problem = (f"starts {processes} worker(s) per SLURM job, and the device plan puts {most} rank(s) of pool "
                       f"{pool!r} on one node" if most > processes else
                       f"puts pool {pool!r}'s {workers.get(pool)} worker(s) in {jobs} job(s), and the device plan "
                       f"spreads its ranks over {nodes} node(s) (one job per node)")
            raise ConfigError("cluster.slurm.processes", processes, problem,
                              f"set cluster.slurm.processes={most} (the pool's ranks per node; flowrl devices shows them)")
