"""Joint process groups: one gloo group spanning the ranks of several worker groups.

Each worker group has its own ``torch.distributed`` world (its default process group, formed in
``RankActor._setup``), and ``dist.new_group`` can only carve sub-groups out of that world. To let an
actor group send to a rollout group (split placement), every rank of both builds one extra
``ProcessGroupGloo`` on a ``TCPStore`` hosted by the joint rank 0, kept here by name:

    joint rank = offset of the rank's group (in the order the groups are listed) + its group rank

``join`` is idempotent per name (the first call rendezvouses, later ones return the same group),
so a graph node can pass the rendezvous address on every call and only the first one pays for it.
Each rank calls it from its group's ordered call, so all ranks of all member groups reach the
rendezvous together. ``close_all`` (from ``RankActor._teardown``) drops the groups.

The group is gloo only, on the CPU and on GPUs alike, so it moves host tensors only: the reshard
transports (``flowrl.backends.reshard``) stage every tensor that crosses it in host memory (a
device -> host copy before a send, a host buffer then a copy onto the destination's device after
a receive). That is correct for any mix of devices, including trainer and generation processes
that share a GPU (a colocated GPU placement across two worker groups), which NCCL cannot serve
(one NCCL rank per GPU), and a mixed ``cpu:gloo,cuda:nccl`` group would need both ends of every
message on the same kind of device. The reshard's device wire (``flowrl.backends.reshard.wire_plan``:
each round one ``batch_isend_irecv`` in a canonical order, device tensors on NCCL) serves the
worker group's own world group when the device plan gives every process its own GPU (the hybrid
placement); over this group the reshard always takes the host wire. An NCCL joint group (split
pools on distinct GPUs) is not built: it would be a ``ProcessGroupNCCL`` on the same store, unregistered
with ``torch.distributed`` as this one is, so its rounds would need NCCL's own grouping of the
posted operations; not written, as no GPU was at hand to run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["JointSpec", "close_all", "get", "join"]

_GROUPS: dict[str, tuple[Any, Any, int, int]] = {}  # name -> (process group, store, rank, size)


@dataclass(frozen=True)
class JointSpec:
    """Where the ranks of a joint group meet: ``name``, the store's ``host:port`` (on joint rank
    0's machine), the joint world size and the timeout of every operation."""

    name: str
    host: str
    port: int
    world_size: int
    timeout_s: float = 600.0


def join(spec: JointSpec, rank: int) -> Any:
    """This process's handle on joint group ``spec.name`` as joint rank ``rank`` (built on the
    first call). Raises ValueError if the name is already joined with another rank or size."""
    import torch.distributed as dist

    if not 0 <= rank < spec.world_size:
        raise ValueError(f"joint group {spec.name!r}: rank {rank} is outside [0, {spec.world_size})")
    if spec.name in _GROUPS:
        pg, _, have_rank, have_size = _GROUPS[spec.name]
        if (have_rank, have_size) != (rank, spec.world_size):
            raise ValueError(f"joint group {spec.name!r} was joined as rank {have_rank} of "
                             f"{have_size}, now asked for rank {rank} of {spec.world_size}; "
                             "give each joint group its own name")
        return pg
    timeout = timedelta(seconds=spec.timeout_s)
    from flowrl.comm.store import rendezvous_store  # binds to spec.host only, not every interface

    store = rendezvous_store(spec.host, spec.port, rank, spec.world_size, timeout)
    pg = dist.ProcessGroupGloo(dist.PrefixStore(f"flowrl-joint/{spec.name}/", store), rank,
                               spec.world_size, timeout)
    _GROUPS[spec.name] = (pg, store, rank, spec.world_size)
    return pg


def get(name: str) -> Any:
    """A joint group this process has joined; KeyError naming the joined ones otherwise."""
    if name not in _GROUPS:
        raise KeyError(f"joint group {name!r} not joined here (joined: {sorted(_GROUPS)})")
    return _GROUPS[name][0]


def close_all() -> None:
    """Forget every joint group of this process (their sockets close with them)."""
    _GROUPS.clear()
