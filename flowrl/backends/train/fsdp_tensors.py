"""DTensor helpers of the fsdp backend: a parameter's whole tensor (gathered) or this rank's rows."""

from __future__ import annotations

import torch

__all__ = ["full", "local"]


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an all-gather when ``t`` is a DTensor: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's rows of ``t`` (``t`` itself when it is no DTensor)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
