"""Where the reshard transports' tensors are when they cross between processes on the host wire:
host memory.

On the ``host`` wire (``wire_plan``: every CPU run, and every GPU reshard that NCCL cannot serve)
every tensor a transport posts to a process group (``exchange.py``, ``adapters.py``) is a host
tensor, and the groups move it over gloo: the joint group is gloo only (``flowrl.comm.joint``);
the world group of a GPU rank is ``cpu:gloo,cuda:nccl``, which dispatches host tensors to gloo.
A device tensor never reaches a group on that wire (:func:`check_wire`): it is staged in host
memory first. The ``device`` wire (batched rounds on NCCL, ``rounds.BatchedRounds``) posts device
tensors instead; see ``exchange.py``'s docstring for when each is taken.
"""

from __future__ import annotations

import torch

__all__ = ["HOST", "check_wire", "on_host"]

HOST = torch.device("cpu")
"""Where every tensor that crosses between processes is (staging buffers are allocated here)."""


def on_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is in host memory, so it may go on the wire as is (gloo) without a
    staging copy. (Tests replace it to mark some host tensors as "device" ones.)"""
    return tensor.device.type == "cpu"


def check_wire(buf: torch.Tensor, what: str) -> torch.Tensor:
    """``buf`` if it may be posted to a group (host memory); RuntimeError otherwise, naming it: a
    device tensor must never reach a gloo group, nor a mixed group with a host tensor on the other
    end."""
    if not on_host(buf):
        raise RuntimeError(f"reshard: a {what} buffer on {buf.device} reached the process group; "
                           "every tensor crossing processes must be staged in host memory")
    return buf
