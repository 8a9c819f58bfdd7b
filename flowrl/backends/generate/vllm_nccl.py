"""The split placement's weight sync into vLLM over the NCCL backend of vLLM's weight-transfer API.

Where it applies (:func:`choose_weight_path`, pure): the trainer and the engines in processes of
their own (not ``cluster.placement=hybrid``), ``rollout.name=vllm``, no LoRA (adapters travel by
``reshard.adapters``), and the device plan gives every trainer rank and every generation rank a GPU
of its own (none shared: split pools; ``colocated`` shares them). Anywhere
else the sync stays the staged one (``flowrl.backends.generate.staging``: host memory over gloo,
then ``VLLMGenerator.load_hf_state``).

What vLLM's API allows, and so who sends what. vLLM's dense NCCL backend
(``vllm.distributed.weight_transfer.nccl_engine``) builds one NCCL group per engine: its trainer
side is NCCL rank 0 and the engine's workers ranks ``1..tp`` (``rank_offset=1``); every worker
receives each tensor WHOLE by a broadcast from rank 0 (``src=0`` is fixed in its
``receive_weights``) and keeps its tp slice through the model's ``load_weights``. So per engine:

* one trainer rank sends (:func:`sender_ranks`: engines spread over the trainer ranks, engine
  ``e`` of ``E`` on trainer rank ``e*T//E`` when ``E <= T``, else ``e % T``), and the whole model
  leaves it once per engine: an NCCL broadcast carries each byte over each link once, so a tp
  replica receives the model once per worker GPU, which is exactly what its workers lack
  together (all of it: a split engine holds none of the new weights);
* the sender holds whole tensors before it broadcasts: the reshard planner decides what each
  trainer rank sends it (:meth:`NcclSyncJob.gather_job`: the trainer layout -> one full replica
  on each sender, run by ``reshard.run_rank`` over the trainer's own process group, on NCCL device
  buffers when its device plan allows): only the slices a sender lacks cross; with full replicas
  on every trainer rank (``dp`` strategy) nothing does.

vLLM's sparse backend (``sparse_nccl``) has the same one-sender broadcast shape and only adds flat
indices, so for a full update it moves more bytes, not fewer; ``nccl_m2n`` (each trainer rank sends
its own shard) needs NVIDIA's ``nccl.m2n``, which the pinned environment lacks.

Wire: unpacked (``packed=False``): one broadcast per tensor in the wire dtype (``model.dtype``:
bf16 on a GPU), grouped in buckets of ``bucket_bytes``, one ``update_weights`` call each. Both
ends derive the buckets from the job (:meth:`NcclSyncJob.buckets`), so no header crosses. The
NCCL groups are made at the first sync (``init_weight_transfer_engine`` on the engine, vLLM's
``trainer_init`` on the sender, both inside the same reshard call) and kept.

``trainer.checks.weight_sync`` compares the trainer's shards with each sender's whole copy, the
bytes that leave on NCCL (:func:`run_trainer_rank`); that vLLM loaded them is ``checks.engine_moved``'s
probe of the engine after the sync.

What has run (CPU only, no GPU here): the path choice, the senders, the planner's gather over an
in-process group, the fingerprints of the senders' copies, both sides' call order with a fake communicator and engine
(``tests/unit/test_vllm_nccl_sync.py``); the payloads through vLLM's msgpack channel and parsers,
the worker's swap to vLLM's NCCL engine, and vLLM's real ``NCCLWeightTransferEngine.update_weights``
receiving this sender's broadcasts through an in-memory communicator
(``tests/vllm_env/check_nccl_payload.py``). What has not: real NCCL groups between a trainer GPU and
vLLM's worker GPUs (at least two GPUs; NCCL refuses two ranks of one group on one GPU).

No module-level vLLM (or torch) import: the main environment imports this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

__all__ = ["NcclSender", "NcclSyncJob", "WeightPath", "choose_weight_path", "join_group", "nccl_sync_job",
           "receive_buckets", "run_engine_rank", "run_trainer_rank", "sender_ranks", "update_info"]

#: Bytes of weights per ``update_weights`` call (the engine allocates them as they arrive).
BUCKET_BYTES = 1 << 30

Device = tuple[int, int]


@dataclass(frozen=True)
class WeightPath:
    name: str
    """``nccl`` (this module) or ``staged`` (host memory over gloo, then ``load_hf_state``)."""
    reason: str


def choose_weight_path(*, placement: str, trainer_devices: Sequence[Device | None],
                       engine_devices: Sequence[Device | None], engine: str, lora: bool) -> WeightPath:
    """How a weight sync reaches the generation engines. ``placement``: the run's resolved
    placement (``hybrid``, ``colocated``, ``split``; outside ``hybrid`` the device plan decides:
    ``colocated`` puts both groups on the same GPUs, and a ``colocated`` run whose declared pools
    keep them apart is split pools in fact); ``trainer_devices`` / ``engine_devices``:
    each trainer rank's and each generation rank's GPU from the device plan (``(node, GPU)``,
    None or empty: no GPU); ``engine``: ``rollout.name``; ``lora``: adapters only travel."""
    if engine != "vllm":
        return WeightPath("staged", f"rollout.name={engine} has no NCCL weight-transfer API")
    if lora:
        return WeightPath("staged", "LoRA: only the adapters travel (reshard.adapters)")
    if placement == "hybrid":
        return WeightPath("staged", "placement hybrid: the engine is in the trainer's processes")
    if not trainer_devices or not engine_devices:
        return WeightPath("staged", "no device plan for a group (CPU)")
    devices = (*trainer_devices, *engine_devices)
    bare = [p for p, gpu in enumerate(devices) if gpu is None]
    if bare:
        return WeightPath("staged", f"process(es) {bare} have no GPU")
    if len(set(devices)) != len(devices):
        return WeightPath("staged", "trainer and engine ranks share a GPU (NCCL has one rank per GPU)")
    return WeightPath("nccl", "split pools, every trainer rank and engine worker on a GPU of its own")


def sender_ranks(num_trainer_ranks: int, num_engines: int) -> tuple[int, ...]:
    """The trainer rank that sends to each engine: spread over the trainer ranks (``e*T//E``)
    when there are no more engines than ranks, else round-robin (a rank serves several)."""
    if num_trainer_ranks < 1 or num_engines < 1:
        raise ValueError(f"sender_ranks: {num_trainer_ranks} trainer ranks, {num_engines} engines")
    if num_engines <= num_trainer_ranks:
        return tuple(e * num_trainer_ranks // num_engines for e in range(num_engines))
    return tuple(e % num_trainer_ranks for e in range(num_engines))


def update_info(bucket: Sequence[tuple[str, Sequence[int]]], dtype_name: str) -> dict[str, list]:
    """One bucket's update info, as vLLM's ``NCCLWeightTransferUpdateInfo`` takes it."""
    return {"names": [n for n, _ in bucket], "dtype_names": [dtype_name] * len(bucket),
            "shapes": [list(s) for _, s in bucket]}


@dataclass(frozen=True, kw_only=True)
class NcclSyncJob:
    """One sync over vLLM's NCCL weight transfer (picklable; every rank of both groups gets it)."""

    reshard: Any
    """The split ``ReshardJob`` (model, trainer layout, wire dtype, devices)."""
    engine_tp: int
    """Generation tensor-parallel size: generation rank ``r`` holds an engine when ``r % tp == 0``."""
    endpoints: tuple[tuple[str, int], ...]
    """Per engine, its sender's rendezvous (host, port) (vLLM's TCPStore at NCCL rank 0)."""
    model_dir: str | None = None
    """The checkpoint directory (:func:`checkpoint_layout` names); None: names as they are."""
    bucket_bytes: int = BUCKET_BYTES

    def __post_init__(self) -> None:
        if self.num_engines != len(self.endpoints):
            raise ValueError(f"NcclSyncJob: {len(self.endpoints)} endpoints for {self.num_engines} engines")

    @property
    def num_trainer_ranks(self) -> int:
        return self.reshard.src_dims.world_size

    @property
    def num_engines(self) -> int:
        return self.reshard.dst_dims.world_size // self.engine_tp

    @property
    def senders(self) -> tuple[int, ...]:
        return sender_ranks(self.num_trainer_ranks, self.num_engines)

    def engines_of(self, trainer_rank: int) -> list[int]:
        return [e for e, s in enumerate(self.senders) if s == trainer_rank]

    def init_info(self, engine: int) -> dict[str, Any]:
        """Engine ``engine``'s worker init info (vLLM's ``NCCLWeightTransferInitInfo``)."""
        host, port = self.endpoints[engine]
        return {"master_address": host, "master_port": port, "rank_offset": 1,
                "world_size": 1 + self.engine_tp, "packed": False}

    def trainer_init_info(self, engine: int) -> dict[str, Any]:
        """The sender's side of the same rendezvous (vLLM's ``nccl_common.trainer_init``)."""
        host, port = self.endpoints[engine]
        return {"master_address": host, "master_port": port, "world_size": 1 + self.engine_tp}

    def gather_job(self) -> Any:
        """Trainer layout -> one full HF replica on each distinct sender (the planner's job over
        the trainer's group: only what a sender lacks crosses)."""
        from flowrl.parallel.mesh import ParallelDims
        from flowrl.parallel.reshard_rank import Placement

        job = self.reshard
        holders = tuple(sorted(set(self.senders)))
        devices = job.devices[:self.num_trainer_ranks] if job.devices is not None else None
        return replace(job, dst_dims=ParallelDims(dp=len(holders), tp=1, pp=1), dst_style="hf",
                       placement=Placement(tuple(range(self.num_trainer_ranks)), holders), joint=None,
                       devices=devices)

    def params(self) -> list[tuple[str, tuple[int, ...]]]:
        """The tensors an engine receives, in order: the full model by checkpoint names
        (:func:`checkpoint_layout` of meta tensors: transformers 5's fused experts split)."""
        import torch

        from flowrl.backends.generate.checkpoint_layout import checkpoint_layout

        spec = self.gather_job().specs()[1]
        if self.model_dir is None:
            return [(n, tuple(s)) for n, s in spec.params.items()]
        meta = {n: torch.empty(s, device="meta") for n, s in spec.params.items()}
        return [(n, tuple(t.shape)) for n, t in checkpoint_layout(meta, self.model_dir).items()]

    def buckets(self) -> list[list[tuple[str, tuple[int, ...]]]]:
        """:meth:`params` cut into buckets of at most ``bucket_bytes`` (a larger tensor alone)."""
        size = self.reshard.bytes_per_element
        out: list[list] = []
        current: list = []
        total = 0
        for name, shape in self.params():
            n = size * _numel(shape)
            if current and total + n > self.bucket_bytes:
                out.append(current)
                current, total = [], 0
            current.append((name, shape))
            total += n
        if current:
            out.append(current)
        return out

    def update_infos(self) -> list[dict[str, list]]:
        return [update_info(b, self.reshard.wire_dtype) for b in self.buckets()]


def nccl_sync_job(job: Any, *, engine_tp: int, endpoints: Sequence[tuple[str, int]],
                  model_dir: str | None, bucket_bytes: int = BUCKET_BYTES) -> NcclSyncJob:
    return NcclSyncJob(reshard=job, engine_tp=engine_tp, endpoints=tuple(tuple(e) for e in endpoints),
                       model_dir=model_dir, bucket_bytes=bucket_bytes)


# ----------------------------------------------------------------- trainer side
def open_endpoint(init_info: dict[str, Any]) -> Any:
    """NCCL rank 0 of one engine's group, through vLLM's own trainer rendezvous
    (``nccl_common.trainer_init``: a ``StatelessProcessGroup`` then a ``PyNcclCommunicator`` on
    this process's current GPU). The port was reserved in this process by ``host_port``: freed
    first, for vLLM's TCPStore to listen on."""
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    from flowrl.comm.store import release_port

    release_port(init_info["master_address"], init_info["master_port"])
    return trainer_init(init_info, rank=0)


class NcclSender:
    """A sender rank's communicators, one per engine it serves (made at the first sync)."""

    def __init__(self, job: NcclSyncJob, rank: int, opener: Callable[[dict], Any] = open_endpoint) -> None:
        self.engines = job.engines_of(rank)
        self.comms = {e: opener(job.trainer_init_info(e)) for e in self.engines}

    def send(self, job: NcclSyncJob, state: dict[str, Any]) -> int:
        """Broadcast every bucket to every engine this rank serves, tensor by tensor in the
        order the engine's update infos list them. Returns the bytes sent."""
        import torch

        from flowrl.backends.generate.checkpoint_layout import checkpoint_layout
        from flowrl.backends.interfaces import torch_dtype

        wire = torch_dtype(job.reshard.wire_dtype)
        tensors = checkpoint_layout(state, job.model_dir) if job.model_dir is not None else state
        sent, buckets = 0, job.buckets()
        for engine in self.engines:
            comm = self.comms[engine]
            stream = torch.cuda.current_stream() if torch.cuda.is_available() else None
            for bucket in buckets:
                for name, shape in bucket:
                    tensor = tensors[name]
                    if tuple(tensor.shape) != tuple(shape):
                        raise ValueError(f"NCCL weight sync: {name} has shape {tuple(tensor.shape)}, the "
                                         f"engine expects {tuple(shape)}")
                    out = tensor.detach().to(wire).contiguous()  # NCCL sends numel from data_ptr
                    comm.broadcast(out, src=0, stream=stream)
                    sent += out.nbytes
            if stream is not None:
                stream.synchronize()  # the copies above may be freed now
        return sent


def run_trainer_rank(job: NcclSyncJob, rank: int, src: dict[str, Any], sender: NcclSender | None, *,
                     pg: Any = None, opener: Callable[[dict], Any] = open_endpoint,
                     fingerprint: bool = False) -> tuple[dict, NcclSender | None]:
    """Trainer rank ``rank``'s part: the planner's gather of full tensors onto the senders (its
    shard's slices a sender lacks), then, on a sender, the broadcasts. ``sender``: this rank's
    from an earlier sync (None: made now). ``fingerprint`` (``trainer.checks.weight_sync``): with
    this rank's report of its shard and, on a sender, of the whole tensors it broadcasts (what the
    engine's workers receive, bit for bit: NCCL's broadcast copies), so the sync node compares the
    senders' copies with the trainer (vLLM's load itself is ``checks.engine_moved``'s probe).
    Returns the reshard statistics and the sender."""
    from flowrl.backends.generate.staging import staging_tensors
    from flowrl.backends.interfaces import torch_dtype
    from flowrl.backends.reshard import run_rank

    start = time.perf_counter()
    gather = job.gather_job()
    holders = gather.placement.dst
    dst_rank = holders.index(rank) if rank in holders else None
    full = None
    if dst_rank is not None:
        some = next(iter(src.values()))
        full = staging_tensors(gather.specs()[1], dst_rank, torch_dtype(job.reshard.wire_dtype), some.device)
    stats = run_rank(gather, src_rank=rank, dst_rank=dst_rank, src=src, dst=full, pg=pg)
    sent = 0
    if job.engines_of(rank):
        if sender is None:
            sender = NcclSender(job, rank, opener)
        sent = sender.send(job, full)
    held = sum(t.nbytes for t in full.values()) if full is not None else 0  # the full model, on a sender
    stats = {**stats, "bytes_min": 0, "bytes_sent": stats["bytes_sent"] + sent, "nccl_bytes_sent": sent,
             "peak_extra_bytes": stats["peak_extra_bytes"] + held, "seconds": time.perf_counter() - start}
    if fingerprint:
        from flowrl.checks import fingerprint as fp

        stats = fp.attach(stats, fp.source_report(gather, rank, src),
                          fp.target_report(gather, dst_rank, full) if full is not None else None)
    return stats, sender


# ----------------------------------------------------------------- engine side
def join_group(llm: Any, init_info: dict[str, Any]) -> dict[str, Any]:
    """Once per engine: its workers swap their weight-transfer engine for vLLM's NCCL one
    (``flowrl_use_weight_transfer``: the engine starts with ``ipc``, the staged path's) and join
    the sender's group (``init_weight_transfer_engine``, vLLM's ``NCCLWeightTransferInitInfo``;
    it returns once the sender has opened its end). Returns the init info joined."""
    llm.collective_rpc("flowrl_use_weight_transfer", args=("nccl",))
    llm.init_weight_transfer_engine({"init_info": dict(init_info)})
    return dict(init_info)


def receive_buckets(llm: Any, update_infos: list[dict[str, Any]]) -> None:
    """One update: ``start_weight_update``, one ``update_weights`` per bucket (each returns once
    the workers have received the bucket's broadcasts and loaded them), ``finish_weight_update``
    (also after a failure, as far as the workers allow)."""
    import contextlib

    llm.start_weight_update()
    try:
        for info in update_infos:
            llm.update_weights({"update_info": info})
    except BaseException:
        with contextlib.suppress(Exception):
            llm.finish_weight_update()
        raise
    llm.finish_weight_update()


def run_engine_rank(job: NcclSyncJob, rank: int, engine: Any) -> dict[str, Any]:
    """Generation rank ``rank``'s part: an engine rank (``rank % tp == 0``) has its engine take
    every bucket (``VLLMGenerator.receive_nccl``); the replica's other ranks have nothing to do
    (the engine's workers are vLLM's processes). ``bytes_received``: what the engine's workers
    received (tp copies of the model), ``bytes_min``: what this rank's shard lacks."""
    start = time.perf_counter()
    process = job.num_trainer_ranks + rank
    received = 0
    if rank % job.engine_tp == 0 and engine is not None:
        if not engine.uses_ipc:
            raise RuntimeError("vLLM's NCCL weight transfer needs the engine on GPUs of its own (CUDA, not "
                               "external_launcher); the sync path is chosen by vllm_nccl.choose_weight_path")
        infos = job.update_infos()
        engine.receive_nccl(job.init_info(rank // job.engine_tp), infos)
        model = sum(_numel(s) for info in infos for s in info["shapes"]) * job.reshard.bytes_per_element
        received = model * job.engine_tp
    return {"bytes_received": received, "bytes_sent": 0, "bytes_local": 0, "peak_extra_bytes": 0,
            "bytes_min": job.reshard.min_bytes(process), "process": process,
            "seconds": time.perf_counter() - start}


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
