"""Which wire a reshard's messages take, and the order a batched round posts them in. Pure: no
torch, no I/O; the shell (``exchange.run_rank``) gathers the facts and runs the choice.

Wires (the round transports of ``rounds.py``):

- ``host``: every tensor crossing processes is in host memory (device tensors are staged there)
  and each message is posted on its own, ``send``/``recv`` with the round's tag. Today's path,
  the only one a CPU run takes unless told otherwise.
- ``device``: each round's messages are posted as one ``batch_isend_irecv`` of device buffers
  (NCCL), in :func:`round_order`; tags unused (NCCL ignores them).
- ``batched``: the same round transport with host buffers on the group's CPU backend (gloo):
  chosen only when asked for (``FLOWRL_RESHARD_WIRE=batched`` or ``run_rank(wire="batched")``),
  so the batched path runs, and is tested, on the CPU.

:func:`choose_wire` picks ``device`` for ``auto`` only when the data says NCCL can serve every
message: the device plan gives every process of the reshard a GPU (its engines' tensors live on
it, ``flowrl.run.placement``), no two processes of the reshard share a GPU (NCCL has one rank
per GPU: trainer and generation processes on one GPU, the colocated placement across two groups,
cannot use it) and the group hands CUDA tensors to NCCL (``cpu:gloo,cuda:nccl``; the joint
group of a split placement is gloo only). Every process must choose alike or the rounds hang, and
a process sees only its own messages, so the GPUs are checked over all the reshard's processes,
not only over the pairs that exchange messages: a conservative rule, identical everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["REQUESTS", "WIRE_ENV", "WIRES", "WireChoice", "choose_wire", "cuda_backend", "message_key",
           "process_devices", "round_order", "shared_gpus", "wire_request"]

REQUESTS = ("auto", "host", "batched")
"""What a caller may ask for: ``auto`` (the data decides), ``host`` or ``batched`` (forced)."""
WIRES = ("host", "device", "batched")
WIRE_ENV = "FLOWRL_RESHARD_WIRE"
"""Environment variable holding a request (every process of a reshard must see the same one)."""

Device = tuple[int, int]
"""A process's GPU: (node, GPU index on the node) of the first GPU it sees (its ``cuda:0``)."""


@dataclass(frozen=True)
class WireChoice:
    name: str
    """One of :data:`WIRES`."""
    reason: str

    @property
    def batched(self) -> bool:
        """Whether rounds are posted as one batch each (``device`` and ``batched``)."""
        return self.name != "host"

    @property
    def on_device(self) -> bool:
        """Whether buffers live on the CUDA device (``device``) rather than in host memory."""
        return self.name == "device"


def wire_request(argument: str | None, environ: dict[str, str]) -> str:
    """The request: ``argument`` if given, else :data:`WIRE_ENV` in ``environ``, else ``auto``;
    ValueError naming the fix for anything else."""
    request = argument if argument is not None else environ.get(WIRE_ENV) or "auto"
    if request not in REQUESTS:
        source = "run_rank(wire=...)" if argument is not None else WIRE_ENV
        raise ValueError(f"reshard wire {request!r} ({source}) is unknown; use one of {', '.join(REQUESTS)}")
    return request


def cuda_backend(backend: str | None) -> str | None:
    """The backend a process group gives CUDA tensors, from its backend string:
    ``"cpu:gloo,cuda:nccl"`` -> ``"nccl"``, ``"nccl"`` -> ``"nccl"``, ``"gloo"`` -> ``"gloo"``;
    None when unknown (a group without a backend name)."""
    if not backend:
        return None
    for part in (p.strip().lower() for p in backend.split(",")):
        if ":" not in part:
            return part or None  # one backend for every device
        device, name = part.split(":", 1)
        if device == "cuda":
            return name
    return None


def process_devices(kind: str, src_devices: Sequence[Device | None], dst_devices: Sequence[Device | None]
                    ) -> tuple[Device | None, ...] | None:
    """Each reshard process's GPU from the device plan of its worker groups (each group's ranks'
    GPUs in rank order; empty: a group without GPUs). ``kind``: the job's placement kind;
    colocated: the processes are the one group's ranks; split: the source group's ranks, then the
    destination's (``Placement.split``, the joint group's order). None when a group has no GPU
    entries (CPU, or a group started without the plan)."""
    if not src_devices or (kind != "colocated" and not dst_devices):
        return None
    return tuple(src_devices) if kind == "colocated" else (*src_devices, *dst_devices)


def shared_gpus(devices: Sequence[Device | None]) -> list[tuple[int, int, Device]]:
    """Pairs of processes ``(p, q, gpu)`` (p < q) the device plan puts on one GPU."""
    first: dict[Device, int] = {}
    out = []
    for p, gpu in enumerate(devices):
        if gpu is None:
            continue
        if gpu in first:
            out.append((first[gpu], p, gpu))
        else:
            first[gpu] = p
    return out


def choose_wire(request: str, *, backend: str | None, devices: Sequence[Device | None] | None) -> WireChoice:
    """The wire of one reshard (see the module doc). ``backend``: the process group's backend
    string; ``devices``: each process's GPU from the device plan (:func:`process_devices`; None:
    no plan, e.g. tests and tools). A forced ``batched`` still puts its buffers on the device when
    ``auto`` would have chosen ``device``, else in host memory."""
    if request not in REQUESTS:
        raise ValueError(f"reshard wire {request!r} is unknown; use one of {', '.join(REQUESTS)}")
    if request == "host":
        return WireChoice("host", "asked for")
    fit = _device_fit(backend, devices)
    if fit is None:
        return WireChoice("device", "every process on its own GPU, CUDA tensors on nccl")
    if request == "batched":
        return WireChoice("batched", f"asked for; host buffers: {fit}")
    return WireChoice("host", fit)


def _device_fit(backend: str | None, devices: Sequence[Device | None] | None) -> str | None:
    """None when NCCL can carry every message as device tensors, else why not."""
    if devices is None:
        return "no device plan for this reshard"
    bare = [p for p, gpu in enumerate(devices) if gpu is None]
    if bare:
        return f"process(es) {bare} have no GPU in the device plan"
    cuda = cuda_backend(backend)
    if cuda != "nccl":
        return f"the process group ({backend!r}) gives CUDA tensors to {cuda or 'no backend'}, not nccl"
    shared = shared_gpus(devices)
    if shared:
        p, q, (node, gpu) = shared[0]
        return (f"processes {p} and {q} share GPU {gpu} of node {node} (NCCL has one rank per GPU; "
                f"{len(shared)} such pair(s))")
    return None


def message_key(message: Any) -> tuple:
    """What identifies a message at both ends: its processes and its transfers (each by parameter,
    split dim, range, ranks and fused-expert indices); the two ends list the same transfers in the
    same order (``reshard_schedule``), so they compute the same key."""
    return (message.src_process, message.dst_process,
            tuple((t.param, t.dim, t.start, t.stop, t.src_rank, t.dst_rank, _index(t.src_index), _index(t.dst_index))
                  for t in message.transfers))


def _index(index: int | None) -> int:
    return -1 if index is None else index  # a whole tensor sorts before its fused experts


def round_order(messages: Iterable[Any], process: int) -> list[tuple[str, Any]]:
    """``process``'s part of one round as ``("send" | "recv", message)``, in the order a batched
    round posts them: by peer, then receives before sends, then :func:`message_key`. For any pair
    (a, b), a's sends to b and b's receives from a come in the same key order, so the k-th send
    matches the k-th receive (what NCCL and gloo need of one batch without tags). Empty when the
    process has no message in the round."""
    ops = []
    for m in messages:
        if m.dst_process == process and m.src_process != process:
            ops.append(((m.src_process, 0, message_key(m)), "recv", m))
        elif m.src_process == process and m.dst_process != process:
            ops.append(((m.dst_process, 1, message_key(m)), "send", m))
    ops.sort(key=lambda op: op[0])
    return [(kind, m) for _, kind, m in ops]
