"""Transports that execute a reshard plan on one process: local slicing plus point-to-point.

Each process runs :func:`run_rank` with the local tensors it holds (``src``: its training shard,
by the source spec's local names; ``dst``: the generation tensors to overwrite, by the destination
spec's) and a process group whose ranks are the plan's processes (colocated: the worker group's
own group; split: the joint group of ``flowrl.comm.joint``).

``planned`` (this process's own part of the plan, ``job.rank_plan(process)``, bucketed by
``flowrl.parallel.reshard_schedule.schedule_rank``; no process lists another's transfers):
  1. local copies: ``dst[slice].copy_(src[slice])``, no buffer;
  2. per round (in round order), every message to or from this process is handed to the round
     transport (``rounds.py``) and the round is waited for; a message that is one contiguous
     slice of a tensor of the wire dtype where the wire's buffers live travels without staging
     (dim-0 slices: most of a model), others are packed into (or unpacked from) a staging buffer
     there. Staging never exceeds one bucket per process.
``naive`` (verl's gather-then-broadcast, for comparison): source rank 0's process gathers the full
  model (every other source sends it what it lacks), sends it whole to every destination process,
  and each slices its shard out; the full model is materialised on every destination process.

Both report ``bytes_sent`` / ``bytes_received`` (over the group), ``bytes_local`` (copied in
place), ``peak_extra_bytes`` (the most staging alive at once, counted by the transport itself, as
every buffer it allocates goes through :class:`Staging`) and this process's ``bytes_min`` (the
processes' sum is the plan's).

Wires (``wire_plan.choose_wire``, one per reshard, reported as ``wire`` in the statistics and
``reshard/wire_device`` in the node's metrics):

- ``host`` (the CPU's, and the default everywhere the data does not say otherwise): every tensor
  that crosses between processes is in host memory and travels over gloo, each message posted on
  its own with its round's tag. A message whose tensor is not on the host is packed into a host
  staging buffer (one device -> host copy); a message into a tensor not on the host is received
  into a host buffer and then copied onto that tensor's device. Local copies (same process) go
  device to device. Correct for any mix of devices: a colocated reshard over the worker group's
  world group (``cpu:gloo,cuda:nccl`` on GPU: torch dispatches host tensors to its gloo backend)
  and a split one over the joint group (``flowrl.comm.joint``, gloo only), including trainer and
  generation processes that share a GPU (colocated GPU placement), which NCCL cannot serve (one
  NCCL rank per GPU). On the CPU it is exactly the path it always was (same calls, same order, same
  staging): a host tensor is sent or received in place (``wire.on_host``), no extra copy. Host
  copies are synchronous (pageable memory), so a staging buffer is free to reuse at once.
- ``device``: chosen when the job's ``devices`` (the device plan's GPUs, filled in by the sync
  node from the worker groups) put every process on a GPU of its own and the group gives CUDA
  tensors to NCCL: in a run, the hybrid group's colocated sync over its world group. Tensors on
  the device travel as they are (staging buffers on the rank's GPU when a message needs packing);
  NCCL ignores tags and serialises separately posted sends and receives, so each round is one
  ``batch_isend_irecv`` of the round's messages in ``wire_plan.round_order``, which both ends
  derive from their own plans.
- ``batched``: the same batched rounds with host buffers on gloo, only when asked for
  (``FLOWRL_RESHARD_WIRE=batched`` or ``run_rank(wire="batched")``).

What has run: the host wire on the CPU over gloo (world and joint groups, host tensors and
simulated device ones); the batched rounds over gloo with CPU tensors, against the host wire on
every test case (same tensors bit for bit, same bytes and staging peaks:
``tests/dist/test_reshard_batched.py``), through ``torch.distributed.batch_isend_irecv`` on the
world group. What has not: the ``device`` wire on a real GPU with NCCL (no GPU here): its choice
is tested from fake device plans and groups, its buffers and NCCL's coalesced batches are not.
NCCL's first batch on a group must include every rank of it unless the communicator exists; the
world group's does (``init_process_group(device_id=...)``, ``flowrl.actors.rank``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

import torch

from flowrl.backends.interfaces import torch_dtype
from flowrl.backends.reshard.job import ReshardJob
from flowrl.backends.reshard.rounds import BatchedRounds, HostRounds, group_backend, make_rounds
from flowrl.backends.reshard.wire import HOST
from flowrl.backends.reshard.wire_plan import choose_wire, wire_request
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import Placement, Transfer, plan_for_rank
from flowrl.parallel.reshard_schedule import Schedule, schedule_rank
from flowrl.parallel.named_spec import spec_for
from flowrl.parallel.shard_spec import ShardSpec, piece_index

__all__ = ["HOST", "Staging", "check_tensors", "execute_schedule", "run_rank"]

Tensors = Mapping[str, torch.Tensor]

class Staging:
    """Allocates the transport's buffers and tracks the bytes alive (and their peak)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def alloc(self, numel: int, dtype: torch.dtype, device: torch.device = HOST) -> torch.Tensor:
        buf = torch.empty(numel, dtype=dtype, device=device)
        self.live += buf.nbytes
        self.peak = max(self.peak, self.live)
        return buf

    def free(self, buf: torch.Tensor) -> None:
        self.live -= buf.nbytes


def check_tensors(spec: ShardSpec, rank: int, tensors: Tensors, side: str) -> None:
    """Raise ValueError unless ``tensors`` holds every local tensor of ``rank``'s shard with the
    spec's shape (extra tensors are ignored)."""
    for local, shape in spec.shard_of(rank).tensors.items():
        if local not in tensors:
            raise ValueError(
                f"reshard: {side} rank {rank} ({spec.style} layout {spec.dims}) needs local tensor "
                f"{local!r}, which its engine does not have (it has e.g. {sorted(tensors)[:3]}); "
                "the engine's model does not match the layout the job was planned for")
        got = tuple(tensors[local].shape)
        if got != tuple(shape):
            raise ValueError(
                f"reshard: {side} rank {rank}: {local!r} has shape {got} but the {spec.style} "
                f"layout {spec.dims} of the planned model needs {tuple(shape)}; build the job from "
                "the model both groups loaded (model.path)")


def _view(tensors: Tensors, local: str, index: int | None, dim: int, offset: int,
          length: int) -> torch.Tensor:
    tensor = tensors[local] if index is None else tensors[local][index]  # one fused expert
    return tensor.narrow(dim, offset, length)


def _src_view(t: Transfer, src: Tensors) -> torch.Tensor:
    return _view(src, t.src_local, t.src_index, t.dim, t.src_offset, t.length)


def _dst_view(t: Transfer, dst: Tensors) -> torch.Tensor:
    return _view(dst, t.dst_local, t.dst_index, t.dim, t.dst_offset, t.length)


def _recv_buffer(m: Any, dst: Tensors, wire: torch.dtype, staging: Staging, rounds: Any,
                 unpack: list) -> torch.Tensor:
    """Where message ``m`` is received: the destination slice itself when the transport may use
    it as is (one contiguous slice of the wire dtype where its buffers live), else a staging
    buffer, unpacked after the round (``unpack``)."""
    view = _dst_view(m.transfers[0], dst) if len(m.transfers) == 1 else None
    if view is not None and rounds.as_is(view, wire):
        return view
    buf = staging.alloc(m.nbytes // wire.itemsize, wire, rounds.device)
    unpack.append((m, buf))
    return buf


def _send_buffer(m: Any, src: Tensors, wire: torch.dtype, staging: Staging, rounds: Any,
                 held: list) -> torch.Tensor:
    """What message ``m`` sends: the source slice itself, or its slices packed into a staging
    buffer (kept in ``held`` until the round is done)."""
    views = [_src_view(t, src) for t in m.transfers]
    if len(views) == 1 and rounds.as_is(views[0], wire):
        return views[0]
    buf = staging.alloc(m.nbytes // wire.itemsize, wire, rounds.device)
    held.append(buf)
    at = 0
    for v in views:
        buf[at:at + v.numel()].view(v.shape).copy_(v)
        at += v.numel()
    return buf


@torch.no_grad()
def execute_schedule(schedule: Schedule, *, process: int, pg: Any, src: Tensors | None,
                     dst: Tensors | None, wire: torch.dtype, staging: Staging,
                     rounds: HostRounds | BatchedRounds | None = None) -> dict[str, int]:
    """Run this process's part of ``schedule`` (local copies, then rounds) over ``pg``, each
    round posted by ``rounds`` (``rounds.py``; default: the host wire over ``pg``)."""
    rounds = rounds if rounds is not None else HostRounds(pg)
    out = {"bytes_sent": 0, "bytes_received": 0, "bytes_local": 0}
    for t in schedule.local_for(process):
        _dst_view(t, dst).copy_(_src_view(t, src))
        out["bytes_local"] += t.nbytes
    for rnd in schedule.rounds:
        unpack: list = []
        held: list = []
        for kind, m in rounds.order(rnd.messages, process):
            if kind == "recv":
                rounds.post("recv", _recv_buffer(m, dst, wire, staging, rounds, unpack), m.src_process, rnd.tag)
                out["bytes_received"] += m.nbytes
            else:
                rounds.post("send", _send_buffer(m, src, wire, staging, rounds, held), m.dst_process, rnd.tag)
                out["bytes_sent"] += m.nbytes
        for work in rounds.flush():
            work.wait()
        for m, buf in unpack:
            at = 0
            for t in m.transfers:
                view = _dst_view(t, dst)
                view.copy_(buf[at:at + view.numel()].view(view.shape))
                at += view.numel()
        for buf in [*held, *(buf for _, buf in unpack)]:
            staging.free(buf)
    return out


BROADCAST_TAG = 1 << 20
"""Tag of the naive transport's full-model messages (the gather's tags are message indices)."""


@torch.no_grad()
def _run_naive(job: ReshardJob, *, process: int, pg: Any, src: Tensors | None,
               dst: Tensors | None, dst_rank: int | None, wire: torch.dtype,
               staging: Staging, rounds: HostRounds | BatchedRounds) -> dict[str, int]:
    src_spec, dst_spec = job.specs()
    full = spec_for(src_spec.model, ParallelDims(dp=1, tp=1, pp=1), style="hf")
    placement = job.placement
    root = placement.src[0]
    gather = schedule_rank(
        plan_for_rank(src_spec, full, placement=Placement(placement.src, (root,)), process=process,
                      bytes_per_element=job.bytes_per_element), bucket_bytes=None)
    receivers = sorted(set(placement.dst) - {root})
    flat = views = None
    if process == root or process in receivers:
        flat = staging.alloc(full.num_params, wire, rounds.device)  # the whole model, materialised here
        views, at = {}, 0
        for name, shape in full.params.items():
            n = int(torch.Size(shape).numel())
            views[name] = flat[at:at + n].view(shape)
            at += n
    out = execute_schedule(gather, process=process, pg=pg, src=src,
                           dst=views if process == root else None, wire=wire, staging=staging, rounds=rounds)
    if process == root:
        for p in receivers:
            rounds.post("send", flat, p, BROADCAST_TAG)
        out["bytes_sent"] += flat.nbytes * len(receivers)
    elif process in receivers:
        rounds.post("recv", flat, root, BROADCAST_TAG)
        out["bytes_received"] += flat.nbytes
    for work in rounds.flush():
        work.wait()
    if dst_rank is not None:  # cut this process's destination shard out of the full model
        for piece in dst_spec.shard_of(dst_rank).pieces:
            ndim = len(dst_spec.params[piece.param])
            dst[piece.local][piece_index(piece, local=True, ndim=ndim)].copy_(
                views[piece.param][piece_index(piece, local=False, ndim=ndim)])
    if flat is not None:
        staging.free(flat)
    return out


def _process_group(job: ReshardJob, process: int) -> Any:
    if job.joint is not None:
        from flowrl.comm import joint

        if not job.joint.host:
            raise ValueError("ReshardJob.joint has no rendezvous address; the reshard node fills "
                             "it in (nodes.reshard)")
        return joint.join(job.joint, process)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() != process:
        raise RuntimeError(f"colocated reshard: process {process} must be this worker group's rank "
                           "(dist.get_rank())")
    # the world group: gloo on the CPU, "cpu:gloo,cuda:nccl" on a GPU, where the host tensors
    # this transport posts (wire.check_wire) go to its gloo backend
    return dist.distributed_c10d._get_default_group()


def run_rank(job: ReshardJob, *, src_rank: int | None = None, dst_rank: int | None = None,
             src: Tensors | None = None, dst: Tensors | None = None, pg: Any = None,
             wire: str | None = None) -> dict[str, Any]:
    """This process's part of ``job``: it hosts source rank ``src_rank`` (holding ``src``) and/or
    destination rank ``dst_rank`` (whose ``dst`` tensors are overwritten in place). ``wire``:
    ``auto``, ``host`` or ``batched`` (None: ``FLOWRL_RESHARD_WIRE``, else ``auto``; every process
    of the job must ask alike), chosen by ``wire_plan.choose_wire`` from the group's backend and
    the job's ``devices``. Returns the byte counts, the staging peak, this process's minimum (what
    its destination shard lacks locally; summed over the processes: the plan's), the wire taken
    (``wire``: ``host``, ``device`` or ``batched``) and the seconds spent."""
    start = time.perf_counter()
    placement = job.placement
    procs = {placement.src[src_rank] if src_rank is not None else None,
             placement.dst[dst_rank] if dst_rank is not None else None} - {None}
    if len(procs) != 1:
        raise ValueError(f"reshard: source rank {src_rank} and destination rank {dst_rank} are not "
                         f"one process of the placement {placement}")
    (process,) = procs
    src_spec, dst_spec = job.specs()
    if src_rank is not None:
        check_tensors(src_spec, src_rank, src, "source")
    if dst_rank is not None:
        check_tensors(dst_spec, dst_rank, dst, "destination")
    request = wire_request(wire, os.environ)
    pg = pg if pg is not None else _process_group(job, process)
    choice = choose_wire(request, backend=group_backend(pg), devices=job.devices)
    rounds = make_rounds(choice, pg)
    dtype = torch_dtype(job.wire_dtype)
    staging = Staging()
    if job.transport == "naive":
        out = _run_naive(job, process=process, pg=pg, src=src, dst=dst, dst_rank=dst_rank,
                         wire=dtype, staging=staging, rounds=rounds)
    else:
        out = execute_schedule(job.rank_schedule(process), process=process, pg=pg, src=src,
                               dst=dst, wire=dtype, staging=staging, rounds=rounds)
    return {**out, "peak_extra_bytes": staging.peak, "bytes_min": job.min_bytes(process),
            "model_bytes": dst_spec.num_params * job.bytes_per_element, "process": process,
            "wire": choice.name, "seconds": time.perf_counter() - start}
