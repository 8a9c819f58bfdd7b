"""A rank process placed by the device plan (``flowrl.parallel.device_plan``): its GPUs made the
only visible ones before CUDA initialises, its device set, its process-group backend chosen.

Each worker process holds one rank (``flowrl.actors.rank``), so setting ``CUDA_VISIBLE_DEVICES``
in the process is enough, as long as nothing in it has touched CUDA yet; a process that already
has a CUDA context is refused rather than silently left on the wrong GPU. On CPU nothing changes:
no variable is set, the backend stays gloo.

The plan's GPU indices count the GPUs the worker's node gives the run. Where the worker already
has a ``CUDA_VISIBLE_DEVICES`` (a SLURM job's GPUs; a driver started with a subset, which its
LocalCluster workers inherit), plan index ``g`` is the ``g``-th entry of that list: every process
of a SLURM job sees the job's same GPUs until its rank is placed. The list as first found is kept
in :data:`NODE_DEVICES_ENV`, so placing twice in one process reads the node's list, not the
rank's.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["NODE_DEVICES_ENV", "apply_placement", "node_devices", "placement_of", "rank_gpus"]

NODE_DEVICES_ENV = "FLOWRL_NODE_DEVICES"
"""The worker's ``CUDA_VISIBLE_DEVICES`` before its rank was placed (set at the first placement)."""


def placement_of(rank_device: Any) -> dict[str, Any]:
    """What travels to the rank: a plain dict of a ``RankDevice`` (or ``None``: the CPU default)."""
    if rank_device is None:
        return {"gpus": (), "local_rank": None, "backend": "gloo", "dtype": None, "node": 0}
    return {"gpus": tuple(rank_device.gpus), "local_rank": rank_device.local_rank, "backend": rank_device.backend,
            "dtype": rank_device.dtype, "node": rank_device.node}


def rank_gpus(placements: Any) -> tuple[tuple[int, int] | None, ...]:
    """Each rank's GPU as the device plan gives it, ``(node, first GPU)``: the GPU its process
    sees as ``cuda:0`` (NCCL's one rank per GPU is about that one); None for a rank without GPUs.
    Empty for a group placed without the plan (CPU)."""
    return tuple((int(p.get("node", 0)), int(p["gpus"][0])) if p and p.get("gpus") else None
                 for p in placements or ())


def node_devices(gpus: tuple[int, ...], environ: Any) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` of a rank given plan indices ``gpus``: read through the list
    the worker found (see the module docstring), or the indices themselves where none was set.
    Raises RuntimeError when the node gives fewer GPUs than the plan counts on."""
    found = environ.get(NODE_DEVICES_ENV, environ.get("CUDA_VISIBLE_DEVICES"))
    if found is None:
        return ",".join(str(g) for g in gpus)
    entries = [e.strip() for e in found.split(",") if e.strip()]
    if max(gpus) >= len(entries):
        raise RuntimeError(
            f"the plan gives this rank GPU(s) {list(gpus)} of its node, but the worker was started with "
            f"CUDA_VISIBLE_DEVICES={found!r} ({len(entries)} GPU(s)): the node (a SLURM job's "
            "cluster.slurm.gpus_per_job, or the driver's CUDA_VISIBLE_DEVICES) gives fewer GPUs than the plan "
            "counts on; flowrl devices shows the plan")
    return ",".join(entries[g] for g in gpus)


def apply_placement(placement: dict[str, Any], *, torch: Any = None, environ: Any = None) -> str:
    """Apply ``placement`` (:func:`placement_of`) to this process and return the torch device its
    engines use: ``"cuda:0"`` (the first visible GPU) or ``"cpu"``. ``torch`` and ``environ`` are
    injectable for tests (fakes); by default the real ones."""
    environ = os.environ if environ is None else environ
    gpus = tuple(placement.get("gpus") or ())
    if placement.get("local_rank") is not None:
        environ["LOCAL_RANK"] = str(placement["local_rank"])
    if not gpus:
        return "cpu"
    visible = node_devices(gpus, environ)
    if torch is None:
        import torch
    if torch.cuda.is_initialized() and environ.get("CUDA_VISIBLE_DEVICES") != visible:
        raise RuntimeError(
            f"this worker process initialised CUDA before its rank was placed (CUDA_VISIBLE_DEVICES="
            f"{environ.get('CUDA_VISIBLE_DEVICES')!r}, the plan gives {visible!r}); nothing may touch CUDA in a "
            "worker before its rank's set-up (a worker preload or plugin importing a CUDA library is the usual cause)")
    if "CUDA_VISIBLE_DEVICES" in environ and NODE_DEVICES_ENV not in environ:
        environ[NODE_DEVICES_ENV] = environ["CUDA_VISIBLE_DEVICES"]
    environ["CUDA_VISIBLE_DEVICES"] = visible
    count = torch.cuda.device_count()
    if count < len(gpus):
        raise RuntimeError(f"the plan gives this rank GPU(s) {visible}, but the process sees {count} of them: "
                           "the node has fewer GPUs than the inventory said (flowrl devices shows the plan)")
    torch.cuda.set_device(0)
    return "cuda:0"
