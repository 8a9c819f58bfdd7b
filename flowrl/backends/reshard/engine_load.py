"""The hybrid placement's weight sync into an engine that runs in the trainer's processes as ranks
of their group (a generation spec's ``joins_trainer_group``: vLLM's ``external_launcher``).

Such an engine takes full HF-named tensors in this process and keeps its own slice of each (its
tp shard, fused and padded its own way), so what it needs from the trainer is each parameter
whole, on this rank:

- **the layouts agree** (the trainer's ``generation_module()`` holds every parameter whole on this
  rank, e.g. ``dp``): the engine loads the trainer's own tensors by reference, in one call (nothing
  staged: no extra memory on flowrl's side, no byte crosses a process, ``reshard/bytes`` 0; the
  engine's own load is the only copy, converting where its dtype differs; one call, because
  vLLM's layerwise reload post-processes a layer once it has all of its tensors);
- **they differ** (megatron TP/PP shards, FSDP's sharded parameters): the colocated reshard plan
  of the trainer's layout to a full HF model on every rank (:func:`full_hf_job`) stages the
  tensors this rank lacks over the group's process group, only those, then the engine loads them
  (a full model of staging per rank: the plan's own bucket bounds the messages, not the copy).

:func:`load_into_engine` returns the reshard's per-process statistics plus the engine's
hand-over seconds (``perf/hybrid_*``: waking its weights, the load, waking its KV cache).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from flowrl.backends.interfaces import HasGenerationModule
from flowrl.backends.reshard.job import ReshardJob, make_job
from flowrl.parallel.mesh import ParallelDims

__all__ = ["full_hf_job", "handover_metrics", "load_into_engine", "trainer_hf_state"]

#: The engine's ``last_handover`` keys -> the metric each becomes.
HANDOVER_METRICS = {"wake_weights_s": "perf/hybrid_wake_weights_s", "load_s": "perf/hybrid_load_s",
                    "wake_kv_cache_s": "perf/hybrid_wake_kv_cache_s"}


def trainer_hf_state(train_engine: Any) -> dict[str, torch.Tensor] | None:
    """The trainer's live parameters by HF name, by reference (detached views of the training
    tensors), when its ``generation_module()`` holds them whole on this rank; else None."""
    if not isinstance(train_engine, HasGenerationModule):
        return None
    module = train_engine.generation_module()
    if module is None:
        return None
    state = module.state_dict()
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor can exist
    if dtensor is not None and any(isinstance(t, dtensor.DTensor) for t in state.values()):
        return None  # FSDP's sharded parameters: gathered through the plan instead
    return {name: t.detach() for name, t in state.items()}


def full_hf_job(job: ReshardJob, world_size: int) -> ReshardJob:
    """``job``'s trainer layout to a full HF model on each of the group's ``world_size``
    processes (colocated): what an engine that slices its own shard out of whole tensors needs."""
    return make_job(job.model, src=job.src_dims, dst=ParallelDims(dp=world_size, tp=1, pp=1), placement="colocated",
                    src_style=job.src_style, dst_style="hf", transport=job.transport, bucket_bytes=job.bucket_bytes,
                    wire_dtype=job.wire_dtype, make_vocab_size_divisible_by=job.make_vocab_size_divisible_by,
                    devices=job.devices if job.devices is not None and len(job.devices) == world_size else None)


def load_into_engine(job: ReshardJob, *, rank: int, world_size: int, train_engine: Any, engine: Any,
                     dtype: torch.dtype, device: str = "cpu", pg: Any = None) -> dict[str, float]:
    """This rank's part of a hybrid sync into ``engine`` (its ``load_hf_state`` takes HF-named
    tensors, waking a sleeping engine's weights first and its KV cache after). ``job``: the run's
    colocated job (its ``min_bytes``: the plan's minimum); ``dtype``/``device``: the staging
    tensors' where the layouts differ, ``pg``: the group they cross (None: the default group)."""
    start = time.perf_counter()
    state = trainer_hf_state(train_engine)
    if state is not None:
        stats: dict[str, Any] = {"bytes_sent": 0, "bytes_received": 0, "bytes_local": 0, "peak_extra_bytes": 0}
    else:
        from flowrl.backends.generate.staging import staging_tensors
        from flowrl.backends.reshard.exchange import run_rank

        full = full_hf_job(job, world_size)
        state = staging_tensors(full.specs()[1], rank, dtype, device)
        stats = dict(run_rank(full, src_rank=full.placement.src.index(rank), dst_rank=full.placement.dst.index(rank),
                              src=train_engine.reshard_source(), dst=state, pg=pg))
    engine.load_hf_state(state)
    stats.update(bytes_min=job.min_bytes(rank), model_bytes=job.specs()[1].num_params * job.bytes_per_element,
                 process=rank, seconds=time.perf_counter() - start,
                 **handover_metrics(getattr(engine, "last_handover", {})))
    return stats


def handover_metrics(handover: dict[str, float]) -> dict[str, float]:
    """An engine's ``last_handover`` seconds under their ``perf/`` names."""
    return {HANDOVER_METRICS[k]: float(v) for k, v in handover.items() if k in HANDOVER_METRICS}
