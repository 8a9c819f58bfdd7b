"""A rank process placed by the device plan (``flowrl.parallel.device_plan``): its GPUs made the
only visible ones before CUDA initialises, its device set, its process-group backend chosen.

Each worker process holds one rank (``flowrl.actors.rank``), so setting ``CUDA_VISIBLE_DEVICES``
in the process is enough, as long as nothing in it has touched CUDA yet; a process that already
has a CUDA context is refused rather than silently left on the wrong GPU. On CPU nothing changes:
no variable is set, the backend stays gloo.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["apply_placement", "placement_of"]


def placement_of(rank_device: Any) -> dict[str, Any]:
    """What travels to the rank: a plain dict of a ``RankDevice`` (or ``None``: the CPU default)."""
    if rank_device is None:
        return {"gpus": (), "local_rank": None, "backend": "gloo", "dtype": None}
    return {"gpus": tuple(rank_device.gpus), "local_rank": rank_device.local_rank, "backend": rank_device.backend,
            "dtype": rank_device.dtype}


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
    visible = ",".join(str(g) for g in gpus)
    if torch is None:
        import torch
    if torch.cuda.is_initialized() and environ.get("CUDA_VISIBLE_DEVICES") != visible:
        raise RuntimeError(
            f"this worker process initialised CUDA before its rank was placed (CUDA_VISIBLE_DEVICES="
            f"{environ.get('CUDA_VISIBLE_DEVICES')!r}, the plan gives {visible!r}); nothing may touch CUDA in a "
            "worker before its rank's set-up (a worker preload or plugin importing a CUDA library is the usual cause)")
    environ["CUDA_VISIBLE_DEVICES"] = visible
    count = torch.cuda.device_count()
    if count < len(gpus):
        raise RuntimeError(f"the plan gives this rank GPU(s) {visible}, but the process sees {count} of them: "
                           "the node has fewer GPUs than the inventory said (flowrl devices shows the plan)")
    torch.cuda.set_device(0)
    return "cuda:0"
