"""What one reshard moves, as a small picklable descriptor every rank receives.

A :class:`ReshardJob` names the model, the source (training) and destination (generation)
layouts with their storage styles (``flowrl.parallel.shard_spec``), the placement of ranks on
processes, the transport, the staging bucket and the wire dtype. Every process computes only its
own part of the plan and its rounds from it (``rank_plan(process)``, ``rank_schedule(process)``:
``flowrl.parallel.reshard_rank``, cached per process), so no transfer list crosses the network
and no process lists the others' transfers; ``plan()`` (the whole plan) is for checks and tools.

``job_for_run(cfg)`` derives the job of a GRPO/PPO run: the actor group's layout (``dp`` strategy:
full HF replicas, tp = pp = 1; ``megatron``: its TP/PP shards and, for a MoE model, its experts
over ``actor.megatron.expert_model_parallel_size`` / ``expert_tensor_parallel_size``) to the
rollout group's (``hf``: a full model per worker; ``vllm``: its tp shards), each in its backend's ``shard_style``, split
placement (the groups sit on disjoint workers) over the joint group ``"actor+rollout"``; with
LoRA into ``vllm`` the adapters only (``adapters.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from flowrl.backends.reshard.adapters import AdapterJob, takes_adapters
from flowrl.comm.joint import JointSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import (
    Placement,
    PlanStats,
    RankPlan,
    ReshardIndex,
    ReshardPlan,
    plan_for_rank,
    plan_reshard,
    plan_summary,
    process_min_bytes,
)
from flowrl.parallel.reshard_schedule import Schedule, check_bucket, schedule_plan, schedule_rank
from flowrl.parallel.model_shape import NamedShape
from flowrl.parallel.named_spec import spec_for
from flowrl.parallel.shard_spec import STYLES, ModelShape, ShardSpec

__all__ = ["DTYPE_BYTES", "TRANSPORTS", "ReshardJob", "job_for_run", "make_job", "with_devices"]

TRANSPORTS = ("planned", "naive")
"""``planned``: the planner's transfers, bucketed (colocated: within the group's process group;
split: over a joint group). ``naive``: gather the full model on source rank 0, send it whole to
every destination process, slice there (verl's scheme; kept for comparison)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
JOINT_NAME = "actor+rollout"


@dataclass(frozen=True, kw_only=True)
class ReshardJob:
    model: ModelShape | NamedShape
    """A NamedShape (a vision-language model): hf-style layouts of whole parameters only."""
    src_dims: ParallelDims
    src_style: str
    dst_dims: ParallelDims
    dst_style: str
    placement: Placement
    transport: str = "planned"
    bucket_bytes: int | None = 64 << 20
    """Staging budget per process (sends plus receives in flight); None: unbounded."""
    wire_dtype: str = "float32"
    make_vocab_size_divisible_by: int = 128
    joint: JointSpec | None = None
    """Split placement: the joint group spanning both worker groups; None: the group's own."""
    devices: tuple[tuple[int, int] | None, ...] | None = None
    """Each process's GPU from the run's device plan, ``(node, GPU)`` of its ``cuda:0`` (None
    entries: no GPU); None: no plan (tests, tools). With the group's backend it decides the wire
    (``wire_plan.choose_wire``); :func:`with_devices` fills it in."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"reshard transport={self.transport!r} is unknown; use one of "
                             f"{', '.join(TRANSPORTS)}")
        if self.wire_dtype not in DTYPE_BYTES:
            raise ValueError(f"wire_dtype={self.wire_dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        for side in ("src_style", "dst_style"):
            if getattr(self, side) not in STYLES:
                raise ValueError(f"{side}={getattr(self, side)!r}; use one of {', '.join(STYLES)}")
        self.placement.check(self.src_dims.world_size, self.dst_dims.world_size)
        if self.joint is None and self.placement.kind != "colocated":
            raise ValueError(f"a {self.placement.kind} placement needs a joint process group "
                             "spanning both worker groups (ReshardJob.joint)")
        processes = len(set(self.placement.src) | set(self.placement.dst))
        if self.devices is not None and len(self.devices) != processes:
            raise ValueError(f"ReshardJob.devices has {len(self.devices)} entries for the placement's "
                             f"{processes} processes; build it with with_devices(job, ...)")

    @property
    def bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.wire_dtype]

    def _key(self) -> tuple:
        return (self.model, self.src_dims, self.src_style, self.dst_dims, self.dst_style,
                self.placement, self.bytes_per_element, self.make_vocab_size_divisible_by)

    def specs(self) -> tuple[ShardSpec, ShardSpec]:
        """The source and destination shard specs (built once per process per job)."""
        ix = _index(self._key())
        return ix.src, ix.dst

    def plan(self) -> ReshardPlan:
        """The whole plan (every process's transfers): for checks and tools, not the transport."""
        return _plan(self._key())

    def schedule(self) -> Schedule:
        """The whole plan's rounds (``schedule_plan``)."""
        return _schedule(self._key(), self.bucket_bytes)

    def summary(self) -> PlanStats:
        """The whole plan's totals and per-process loads, without listing any transfer."""
        return _summary(self._key())

    def rank_plan(self, process: int) -> RankPlan:
        """The transfers touching ``process`` (``plan_for_rank``): what the transport runs."""
        return _rank_plan(self._key(), process)

    def min_bytes(self, process: int) -> int:
        """What ``process``'s destination shard lacks locally (``process_min_bytes``)."""
        ix = _index(self._key())
        return process_min_bytes(ix, self.placement, process, self.bytes_per_element)

    def rank_schedule(self, process: int) -> Schedule:
        """``process``'s rounds (``schedule_rank``); the bucket is checked against every
        parameter, so all processes accept or refuse it alike."""
        return _rank_schedule(self._key(), process, self.bucket_bytes)


def with_devices(job: Any, src_devices: Any, dst_devices: Any) -> Any:
    """``job`` with its processes' GPUs (``ReshardJob.devices``) from the device plan of the
    source and destination worker groups (each a sequence of ``(node, GPU)`` or None per rank,
    empty for a group without GPUs: ``WorkerGroup.devices``); any other job (adapters) as is."""
    if not isinstance(job, ReshardJob):
        return job
    from dataclasses import replace

    from flowrl.backends.reshard.wire_plan import process_devices

    return replace(job, devices=process_devices(job.placement.kind, tuple(src_devices), tuple(dst_devices)))


@lru_cache(maxsize=8)
def _index(key: tuple) -> ReshardIndex:
    model, src_dims, src_style, dst_dims, dst_style, placement, bpe, divisible_by = key
    kw = {"make_vocab_size_divisible_by": divisible_by}
    return ReshardIndex(spec_for(model, src_dims, style=src_style, **kw),
                        spec_for(model, dst_dims, style=dst_style, **kw))


@lru_cache(maxsize=8)
def _plan(key: tuple) -> ReshardPlan:
    ix = _index(key)
    return plan_reshard(ix.src, ix.dst, placement=key[5], bytes_per_element=key[6], index=ix)


@lru_cache(maxsize=8)
def _summary(key: tuple) -> PlanStats:
    ix = _index(key)
    return plan_summary(ix.src, ix.dst, placement=key[5], bytes_per_element=key[6], index=ix)


@lru_cache(maxsize=8)
def _schedule(key: tuple, bucket_bytes: int | None) -> Schedule:
    return schedule_plan(_plan(key), bucket_bytes=bucket_bytes)


@lru_cache(maxsize=16)
def _rank_plan(key: tuple, process: int) -> RankPlan:
    ix = _index(key)
    return plan_for_rank(ix.src, ix.dst, placement=key[5], process=process,
                         bytes_per_element=key[6], index=ix)


@lru_cache(maxsize=16)
def _rank_schedule(key: tuple, process: int, bucket_bytes: int | None) -> Schedule:
    ix, bpe = _index(key), key[6]
    check_bucket(bucket_bytes, {p: n * bpe for p, n in ix.row_numel.items()})
    return schedule_rank(_rank_plan(key, process), bucket_bytes=bucket_bytes)


def make_job(model: Any, *, src: ParallelDims, dst: ParallelDims, placement: str = "colocated",
             src_style: str = "megatron", dst_style: str = "hf", joint: JointSpec | None = None,
             **kwargs: Any) -> ReshardJob:
    """A job from layouts: ``placement="colocated"`` puts generation ranks on the training ranks'
    processes by ``micro_dp_placement`` (both layouts span one group); ``"split"`` puts them on
    processes after the training ones (the joint group's order). ``model``: anything
    ``flowrl.parallel.shard_spec.model_shape`` takes. ``kwargs``: the other ReshardJob fields."""
    from flowrl.parallel.reshard_plan import micro_dp_placement
    from flowrl.parallel.shard_spec import model_shape

    shape = model_shape(model)
    if placement == "colocated":
        divisible_by = kwargs.get("make_vocab_size_divisible_by", 128)
        where = micro_dp_placement(
            spec_for(shape, src, style=src_style, make_vocab_size_divisible_by=divisible_by),
            spec_for(shape, dst, style=dst_style, make_vocab_size_divisible_by=divisible_by))
    elif placement == "split":
        where = Placement.split(src.world_size, dst.world_size)
    else:
        raise ValueError(f"placement={placement!r}; use 'colocated' or 'split'")
    return ReshardJob(model=shape, src_dims=src, src_style=src_style, dst_dims=dst,
                      dst_style=dst_style, placement=where, joint=joint, **kwargs)


@lru_cache(maxsize=4)
def _model_shape(path: str) -> ModelShape | NamedShape:
    """The shape of ``model.path``'s model; a vision-language model's is every parameter by its HF
    name (vision tower included), which the hf-style layouts hold whole (``flowrl.parallel.named_spec``)."""
    from flowrl.models.vlm_config import is_vlm_dir

    if is_vlm_dir(path):
        from flowrl.models.vlm import param_shapes

        config = json.loads((Path(path) / "config.json").read_text())
        return NamedShape.from_shapes(param_shapes(path), model_type=str(config.get("model_type")))
    return ModelShape.from_hf_config(path)


def run_wire_dtype(model_dtype: str, plan_dtype: str | None = None) -> str:
    """The dtype weights travel in for ``model.dtype``: a named dtype is itself; ``auto`` is the
    device plan's dtype when the caller has the plan (``plan_dtype``: bf16 on GPU ranks), else
    fp32, which is exact for every destination (a bf16 engine rounds on arrival) and is what
    ``auto`` means on the CPU."""
    from flowrl.parallel.dtypes import AUTO, COMPUTE_DTYPES

    if model_dtype != AUTO:
        return model_dtype
    return plan_dtype if plan_dtype in COMPUTE_DTYPES else "float32"


def job_for_run(cfg: Any, *, timeout_s: float | None = None, colocated: bool = False,
                plan_dtype: str | None = None) -> ReshardJob | AdapterJob:
    """The actor -> rollout job of a run config (``RunConfig``), split placement (``colocated``:
    both layouts on the same processes, the hybrid engine's, placed by ``micro_dp_placement``
    and run over the group's own process group); the storage styles are the backends'
    ``shard_style`` fields of their specs (``flowrl.catalog.backends``). With LoRA (``model.lora_rank`` > 0)
    and a generation backend that serves adapters (``vllm``): an
    :class:`~flowrl.backends.reshard.adapters.AdapterJob`, the adapters only (split placement, and
    the hybrid group's engines in the trainer's processes). ``plan_dtype``: the
    device plan's dtype, for ``model.dtype=auto`` (:func:`run_wire_dtype`)."""
    from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS

    actor, rollout = cfg.actor, cfg.rollout
    vpp = getattr(actor, "virtual_pipeline_model_parallel_size", 1)
    src_style = TRAIN_BACKENDS.spec(actor.strategy).shard_style
    experts = {}
    if src_style == "megatron":  # megatron's expert parallelism (actor.megatron.*, verl's keys)
        experts = {"ep": actor.megatron.expert_model_parallel_size,
                   "etp": actor.megatron.expert_tensor_parallel_size}
    src = ParallelDims(dp=actor.data_parallel_size, tp=actor.tensor_model_parallel_size,
                       pp=actor.pipeline_model_parallel_size, vpp=vpp if vpp > 1 else None,
                       **experts)
    dst = ParallelDims(dp=rollout.data_parallel_size, tp=rollout.tensor_model_parallel_size,
                       pp=rollout.pipeline_model_parallel_size)
    dst_style = GEN_BACKENDS.spec(rollout.name).shard_style
    bucket_mb = getattr(rollout, "reshard_bucket_mb", 64)
    wire = run_wire_dtype(cfg.model.dtype, plan_dtype)
    timeout_s = timeout_s if timeout_s is not None else cfg.cluster.timeout_s
    if cfg.model.lora_rank and takes_adapters(rollout.name):
        # LoRA into an engine that serves adapters: only the adapters travel (adapters.py); in the hybrid
        # group (colocated) each process installs them in its own engine (HybridRole._adapters)
        from flowrl.models.lora import LoraSpec

        return AdapterJob(model_path=cfg.model.path, lora=LoraSpec.from_config(cfg.model).to_dict(),
                          src_world_size=src.world_size, dst_world_size=dst.world_size, dst_tp=dst.tp,
                          wire_dtype=wire,
                          joint=JointSpec(JOINT_NAME, "", 0, src.world_size + dst.world_size, timeout_s))
    if colocated:
        return make_job(_model_shape(cfg.model.path), src=src, dst=dst, placement="colocated", src_style=src_style,
                        dst_style=dst_style, transport=getattr(rollout, "reshard_transport", "planned"),
                        bucket_bytes=int(bucket_mb * 2**20) if bucket_mb else None, wire_dtype=wire)
    return ReshardJob(
        model=_model_shape(cfg.model.path), src_dims=src, src_style=src_style, dst_dims=dst,
        dst_style=dst_style, placement=Placement.split(src.world_size, dst.world_size),
        transport=getattr(rollout, "reshard_transport", "planned"),
        bucket_bytes=int(bucket_mb * 2**20) if bucket_mb else None, wire_dtype=wire,
        # the rendezvous address is filled in by the node (nodes.reshard)
        joint=JointSpec(JOINT_NAME, "", 0, src.world_size + dst.world_size, timeout_s),
    )
