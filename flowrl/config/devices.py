"""A run's device plan from its config: the worker groups as :class:`GroupLayout` s (pools from the
placement, a vLLM replica's engine span) and the inventory a SLURM spec gives. Pure: the plan
itself is ``flowrl.parallel.device_plan``; what this machine has is asked by the caller.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS
from flowrl.config.errors import ConfigError
from flowrl.config.pools import HYBRID_GROUP, resolve_pools
from flowrl.parallel.device_plan import DevicePlan, DevicePlanError, GroupLayout, Inventory, plan_devices

__all__ = ["device_plan", "group_layouts", "slurm_inventory"]

#: The config section of each worker group (whose ``data_parallel_size`` sets its size).
_SECTIONS = {"rollout": "rollout", "actor": "actor", "ref": "ref", "critic": "critic", "rm": "reward_model"}


def group_layouts(cfg: Any) -> list[GroupLayout]:
    """The run's worker groups in start order, each in the pool whose devices it shares: one pool
    for ``colocated`` and ``hybrid`` (and ``auto``), one per group for ``split``, or the declared
    ``cluster.pools``. The rollout's engine spans its replica's tensor-parallel devices when the
    generation backend runs its engine in processes of its own (vLLM)."""
    sizes = cfg.worker_group_sizes
    pool_of = {g: p.name for p in resolve_pools(cfg.cluster, sizes) for g in p.groups}
    spec = GEN_BACKENDS.spec(cfg.rollout.name)
    out = []
    for name in sorted(sizes, key=lambda n: n != "actor"):  # the trainer first: refusals name its key
        section = _SECTIONS[name]
        span = cfg.rollout.tensor_model_parallel_size if name == "rollout" and not spec.in_process else 1
        out.append(GroupLayout(name=name, world_size=sizes[name], pool=pool_of.get(name, HYBRID_GROUP),
                               size_key=f"{section}.data_parallel_size",
                               size_value=getattr(cfg, section).data_parallel_size, engine_span=span))
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


def device_plan(cfg: Any, inventory: Inventory) -> DevicePlan:
    """The plan of ``cfg`` on ``inventory``; a layout the inventory cannot hold is a
    :class:`ConfigError` naming the key and the fix. ``model.dtype=auto`` (or absent) takes the
    device kind's default (bf16 on GPU, fp32 on CPU)."""
    dtype = getattr(cfg.model, "dtype", "auto")
    try:
        return plan_devices(inventory, group_layouts(cfg), dtype=None if dtype == "auto" else dtype)
    except DevicePlanError as exc:
        raise ConfigError(exc.key, exc.value, exc.problem, exc.fix) from None
