"""The run's processes: one Dask session sized for the family's worker groups, and the groups.

The family declares its groups (``GroupSpec``: name, role by import string, role kwargs, mesh);
this module starts exactly that many rank-holding workers (plus the controller worker, unless
the graphs run in the driver: ``cluster.controller``), places each
group on its resource pool (``cfg.placement``: ``cluster.placement`` with ``auto`` resolved) and
records where the Dask dashboard is (``run_info.json``).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flowrl.actors import Session, WorkerGroup
from flowrl.actors.session import GroupSpec
from flowrl.config import RunConfig

RUN_INFO_FILE = "run_info.json"


def describe_placement(cfg: RunConfig) -> str:
    """The start line that names the placement and, for ``auto``, why: ``placement: hybrid
    (auto)``, ``placement: colocated (auto: rollout.name=vllm runs its own engine)``,
    ``placement: split``."""
    why = cfg.placement_reason
    return f"placement: {cfg.placement}" + (f" ({why})" if why else "")


def started_specs(cfg: RunConfig, specs: list[GroupSpec]) -> tuple[list[GroupSpec], dict]:
    """The specs the session starts and the views to add (:func:`add_views`): with
    ``cfg.placement`` hybrid the rollout, actor and ref specs fused into one group
    (``flowrl.roles.specs.hybrid_specs``), else ``specs`` as they are. Pure (no worker starts):
    the device plan is made for what this returns."""
    cluster = _cluster(cfg)
    if cluster.placement != "hybrid":
        return list(specs), {}
    from flowrl.cluster.pools import rank_threads
    from flowrl.config.pools import resolve_pools
    from flowrl.roles.specs import hybrid_specs

    fused_sizes = {s.name: s.mesh.world_size for s in specs}
    workers = sum(p.workers for p in resolve_pools(cluster, fused_sizes))
    return hybrid_specs(specs, num_threads=rank_threads(cluster, workers))


def plan_devices_for(cfg: RunConfig, specs: list[GroupSpec]) -> Any:
    """The pre-flight: the device plan of the groups the run will start (``flowrl.run.placement``),
    before any worker starts. Raises ``ConfigError`` naming the key and the fix when the inventory
    cannot hold them (more NCCL ranks than GPUs, a replica that does not fit a node), or when a
    trainer rank cannot fit its GPU's memory (``flowrl.run.memory_check``)."""
    from flowrl.run.memory_check import check_trainer_memory
    from flowrl.run.placement import plan_for_specs

    plan = plan_for_specs(cfg, started_specs(cfg, specs)[0])
    check_trainer_memory(cfg, plan)
    return plan


def _cluster(cfg: RunConfig) -> Any:
    """``cfg.cluster`` with ``auto`` placement and controller resolved."""
    return dataclasses.replace(cfg.cluster, placement=cfg.placement, controller=cfg.graph_controller)


def start_groups(cfg: RunConfig, specs: list[GroupSpec], run_dir: Path, *,
                 plan: Any = None) -> tuple[Session, dict[str, WorkerGroup]]:
    """A session with one worker process per rank of ``specs`` (cluster kind, pools and network
    from ``cfg.cluster``) and the groups built on it, by name.

    With ``cfg.placement`` hybrid (``cluster.placement=hybrid``, or ``auto`` where the config
    allows it) the rollout, actor and ref specs start as one fused group
    (``flowrl.roles.specs.hybrid_specs``) and their names are views of it: ``groups["rollout"]``
    and ``groups["actor"]`` are the same ranks, so the families call them as ever.

    Every group is placed by the device plan (``plan``: the driver's pre-flight one, else made
    here, before the cluster starts): on GPU each rank gets its GPUs and the group NCCL for CUDA
    tensors; on CPU the specs start unchanged (``flowrl.run.placement``)."""
    from flowrl.run.memory_check import offloaded_bytes
    from flowrl.run.placement import place_specs, plan_for_specs

    cluster = _cluster(cfg)
    specs, views = started_specs(cfg, specs)
    specs = place_specs(specs, plan if plan is not None else plan_for_specs(cfg, specs))
    session = Session.start(sum(s.mesh.world_size for s in specs), cluster=cluster,
                            group_sizes={s.name: s.mesh.world_size for s in specs}, log_dir=str(run_dir / "slurm"),
                            scratch_dir=str(run_dir / "dask-scratch"), model_path=str(cfg.model.path or ""),
                            host_state_bytes=offloaded_bytes(cfg))
    try:
        write_run_info(run_dir, session)
        groups = session.create_groups(specs)
        return session, add_views(groups, views)
    except BaseException:
        session.close()
        raise


def add_views(groups: dict[str, WorkerGroup], views: dict) -> dict[str, WorkerGroup]:
    """``groups`` plus, for each view (name -> (part, mesh)), that part of the fused hybrid group."""
    if not views:
        return groups
    from flowrl.config.pools import HYBRID_GROUP

    fused = groups[HYBRID_GROUP]
    return {**groups, **{name: fused.view(name, part, mesh) for name, (part, mesh) in views.items()}}


def write_run_info(run_dir: Path, session: Any) -> None:
    """``run_info.json``: the Dask dashboard's address (when the scheduler serves one) and when
    the workers started; ``flowrl dashboard`` links to it."""
    try:
        services = session.client.scheduler_info(n_workers=0).get("services", {})
        link = session.dashboard_link if "dashboard" in services else None
    except Exception:  # noqa: BLE001 - the link is a convenience, never a reason to fail a run
        link = None
    info = {"dask_dashboard": link, "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (run_dir / RUN_INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
