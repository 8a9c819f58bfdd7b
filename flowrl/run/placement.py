"""The worker groups as the device plan places them: each group's backend, its ranks' placements
and the device and dtype its roles are built with (pure: specs in, specs out).

The plan (``flowrl.parallel.device_plan``) is computed in the driver before any worker starts,
from the inventory the run may use (``flowrl.cluster.inventory``) and the groups the session will
start (after hybrid fusion, ``flowrl.run.topology.started_specs``); a layout the inventory cannot
hold is a ``ConfigError`` then, not a hung rendezvous later.

What a spec gets, the contract with the roles and engines:

* GPU groups: ``backend`` from the plan (``cpu:gloo,cuda:nccl``), ``placements`` one dict per
  rank (``flowrl.actors.device.placement_of`` plus ``pool_node``: which of its pool's nodes must
  hold it), and ``role_kwargs["device"] = "cuda:0"`` (each rank sees only its own GPUs).
* Every group: a ``role_kwargs["dtype"]`` of ``"auto"`` becomes the plan's dtype (``bfloat16`` on
  GPU, ``float32`` on CPU); a named dtype stays.
* CPU groups: nothing else; the spec keeps its backend (gloo) and no placements, so a CPU run
  starts exactly as it did before the plan existed.

A fused hybrid group's roles are its ``parts`` (``flowrl.roles.hybrid``): each part's kwargs get
the same treatment; no other kwarg is touched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from flowrl.actors.device import placement_of
from flowrl.actors.session import GroupSpec
from flowrl.parallel.device_plan import DevicePlan

__all__ = ["GPU_DEVICE", "place_specs", "plan_for_specs", "role_kwargs_on"]

GPU_DEVICE = "cuda:0"
"""The device of a GPU rank's engines: the first (and usually only) GPU its process sees."""


def plan_for_specs(cfg: Any, specs: Sequence[GroupSpec], *, environ: Any = None, runner: Any = None) -> DevicePlan:
    """The device plan of the groups ``specs`` (as the session starts them) on the inventory the
    run may use; raises ``ConfigError`` naming the key and the fix when it cannot hold them, or
    when SLURM jobs of ``cluster.slurm.processes`` workers cannot hold its nodes."""
    from flowrl.cluster.inventory import run_inventory
    from flowrl.config.devices import check_slurm_jobs, device_plan

    sizes = {s.name: s.mesh.world_size for s in specs}
    plan = device_plan(cfg, run_inventory(cfg, environ=environ, runner=runner), sizes=sizes)
    check_slurm_jobs(cfg, plan, sizes)
    return plan


def place_specs(specs: Sequence[GroupSpec], plan: DevicePlan) -> list[GroupSpec]:
    """``specs`` placed by ``plan`` (see the module docstring). Raises ValueError when the plan
    does not hold a spec's group at its size (the plan was made for other groups)."""
    out = []
    for spec in specs:
        ranks = plan.group(spec.name)
        if len(ranks) != spec.mesh.world_size:
            raise ValueError(f"the device plan has {len(ranks)} rank(s) of group {spec.name!r}, the spec "
                             f"{spec.mesh.world_size}: the plan was made for other groups "
                             f"(it has {sorted({r.group for r in plan.ranks})})")
        on_gpu = any(r.gpus for r in ranks)
        kwargs = role_kwargs_on(spec.role_kwargs, dtype=ranks[0].dtype, device=GPU_DEVICE if on_gpu else None)
        if not on_gpu:
            out.append(spec if kwargs is spec.role_kwargs else dataclasses.replace(spec, role_kwargs=kwargs))
            continue
        placements = tuple({**placement_of(r), "pool_node": plan.pool_node(r)} for r in ranks)
        out.append(dataclasses.replace(spec, role_kwargs=kwargs, backend=plan.backend(spec.name),
                                       placements=placements))
    return out


def role_kwargs_on(kwargs: dict, *, dtype: str, device: str | None) -> dict:
    """``kwargs`` with ``dtype="auto"`` resolved to ``dtype`` and, on a GPU (``device``),
    ``device`` set; the same dict when nothing changes. A hybrid role's ``parts`` (name -> (role
    class, kwargs)) are treated part by part, and the hybrid role itself gets no device."""
    parts = kwargs.get("parts")
    if isinstance(parts, dict) and parts and all(isinstance(p, tuple) and len(p) == 2 for p in parts.values()):
        placed = {name: (cls, role_kwargs_on(kw, dtype=dtype, device=device)) for name, (cls, kw) in parts.items()}
        if all(placed[n][1] is parts[n][1] for n in parts):
            return kwargs
        return {**kwargs, "parts": placed}
    changes: dict = {}
    if kwargs.get("dtype") == "auto":
        changes["dtype"] = dtype
    if device is not None:
        changes["device"] = device
    return {**kwargs, **changes} if changes else kwargs
