"""The torch side of the dtype policy (:mod:`flowrl.parallel.dtypes`): an engine's device and
precision from its ``device`` and ``dtype`` arguments, and the autocast block its forward runs in.

Every engine (dp, FSDP2, megatron, ``hf`` generation, the reward model) calls :func:`placement`,
so the choice of device and dtypes is made in one place and tested in one place
(``tests/unit/test_engine_precision.py``).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from flowrl.backends.interfaces import torch_dtype
from flowrl.parallel.dtypes import Precision, engine_precision

__all__ = ["autocast", "placement", "to_host"]


def placement(device: str, dtype: str, *, trainable: bool = True) -> tuple[torch.device, Precision]:
    """The torch device of ``device`` (``cpu``, ``cuda:0``: the rank's GPU, set visible and current
    by the rank's process before the engine is built) and :func:`engine_precision`'s dtypes."""
    precision = engine_precision(device, dtype, trainable=trainable)
    return torch.device(device), precision


def autocast(device: torch.device, precision: Precision) -> ContextManager:
    """``torch.autocast`` to the compute dtype where the precision asks for it (a trained dp
    engine on a GPU), else nothing (the CPU: no cast at all, the numbers are fp32's as ever)."""
    if not precision.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(precision.compute_dtype))


def to_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies on the CPU of ``tensors`` (what leaves a rank for the driver, Arrow or a checkpoint);
    on the CPU a copy as well, so callers may keep them across optimizer steps."""
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
