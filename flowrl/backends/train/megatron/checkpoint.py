"""Sharded checkpoints of a :class:`MegatronEngine`: each rank writes / reads only its own chunks.

Save (every rank of the engine's world calls :func:`save_sharded` together): global rank 0 creates
the checkpoint's arrays in a temporary directory (``zarr_store.begin_checkpoint``, chunked along
this layout's shards) and broadcasts its path; the first rank of each shard key (``(tp_rank,
pp_rank)``, plus ``(ep_rank, etp_rank)`` with expert parallelism: ``ParallelDims.shard_key``)
writes its shard of the parameters and of AdamW's ``exp_avg`` / ``exp_avg_sq`` (``write_shard``:
only the chunks it owns, in parallel; each expert under its global index); after a barrier rank 0 commits
(``finalize_checkpoint``: meta.json, atomic rename). With bf16 parameters the fp32 main copies
the optimizer updates are what is saved.

Load (:func:`load_sharded`, every rank): the checkpoint may come from any layout or from the
``dp`` backend (all checkpoints hold full HF-shaped arrays); each rank reads only the chunks
overlapping its pieces of the target layout (``load_shard``) into its parameters and optimizer
state. Bitwise: nothing is recomputed, only copied.

Megatron's distributed optimizer (``use_distributed_optimizer``) keeps the fp32 main parameters and
Adam's state as flat ranges sharded over data-parallel ranks: then every dp rank writes the chunks
of its ranges and reads its ranges back (``dist_optim``); the checkpoint is the same as without it,
so either side of a save / load may use it or not, under any layout without expert parallelism
(experts' ranges are sharded over the expert data-parallel group, which ``dist_optim`` does not
follow yet: refused by name).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from flowrl.backends.train.megatron.engine import MegatronEngine
    from flowrl.parallel.shard_spec import ShardSpec

OPTIM_STATES = ("exp_avg", "exp_avg_sq")


def engine_spec(engine: MegatronEngine) -> ShardSpec:
    """The ``megatron``-style shard spec of the engine's layout (names as ``reshard_source``); an
    engine with its own (the value and reward models': ``megatron/value.py``) gives it."""
    if hasattr(engine, "shard_spec"):
        return engine.shard_spec()
    from flowrl.parallel.mesh import ParallelDims
    from flowrl.parallel.shard_spec import ModelShape, shard_spec

    dims = ParallelDims(dp=engine.dp, tp=engine.tp, pp=engine.pp, vpp=engine.vpp,
                        ep=getattr(engine, "ep", 1), etp=getattr(engine, "etp", None))
    return shard_spec(ModelShape.from_hf_config(engine.hf_config), dims, style="megatron",
                      make_vocab_size_divisible_by=engine.make_vocab_size_divisible_by)


def _shard_key(spec: ShardSpec) -> tuple[tuple[int, ...], bool]:
    """This rank's shard key from megatron's parallel state, and whether it is the first rank
    holding it (the one that writes); checked against the spec's own rank arithmetic."""
    from megatron.core import parallel_state as ps

    key: tuple[int, ...] = (ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank())
    if spec.dims.expert_keys:
        key += (ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank())
    rank = dist.get_rank()
    if spec.key_of(rank) != key:
        raise RuntimeError(f"rank {rank}: megatron's parallel state gives shard key {key}, the "
                           f"layout {spec.dims} gives {spec.key_of(rank)}; the rank orders disagree")
    return key, spec.dims.shard_replica(rank) == 0


def _refuse_distributed_experts(spec: ShardSpec, distributed: list[Any]) -> None:
    if distributed and spec.dims.expert_keys:
        raise ValueError(
            f"checkpoints of megatron's distributed optimizer with expert parallelism ({spec.dims}) "
            "are not supported (expert ranges are sharded over the expert data-parallel group); "
            "set actor.megatron.use_distributed_optimizer=false")


def _plain_optimizers(engine: MegatronEngine) -> list[Any]:
    """The megatron optimizers wrapping torch AdamW (one per param-group config)."""
    return list(getattr(engine.optimizer, "chained_optimizers", None) or [engine.optimizer])


def _local_params(engine: MegatronEngine) -> dict[str, torch.nn.Parameter]:
    """This rank's parameters by the spec's megatron names (``model{v}.`` prefixes with vpp)."""
    out = {}
    for (_, vpp_rank), model in zip(engine._chunk_keys(), engine.models):
        prefix = f"model{vpp_rank}." if engine.vpp else ""
        out.update({prefix + k: v for k, v in engine._local_state(model).items()})
    return out


def _main(param: torch.Tensor) -> torch.Tensor:
    """The tensor AdamW updates: the fp32 main copy of a bf16 parameter, else the parameter."""
    return getattr(param, "main_param", None) if getattr(param, "main_param", None) is not None else param


def _adam_states(engine: MegatronEngine) -> dict[int, dict]:
    """``id(main tensor) -> (torch optimizer, its state dict)`` for every optimized tensor."""
    table = {}
    for opt in _plain_optimizers(engine):
        inner = opt.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                table[id(p)] = (inner, p)
    return table


def _plain_state(engine: MegatronEngine, params: dict[str, torch.nn.Parameter]):
    """``(main tensors, AdamW state per name or None, optimizer step)`` without the distributed
    optimizer."""
    adam = _adam_states(engine)
    mains = {n: _main(p) for n, p in params.items()}
    states = {n: adam[id(m)][0].state.get(m) for n, m in mains.items() if id(m) in adam}
    stepped = [s for s in states.values() if s]
    if stepped and len(stepped) != len(mains):
        missing = sorted(n for n in mains if not states.get(n))[:3]
        raise RuntimeError(f"save_sharded: AdamW has no state for {missing}, but for other tensors; "
                           "the optimizer state is inconsistent")
    return mains, (states if stepped else None), (int(float(stepped[0]["step"])) if stepped else 0)


def _begin_on_rank0(path: str | os.PathLike, spec: ShardSpec, *, states: tuple[str, ...]) -> str:
    """Global rank 0 creates the arrays (fp32: the main copies under bf16); every rank gets the
    temporary directory, or the error."""
    from flowrl.checkpoint import begin_checkpoint

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = begin_checkpoint(path, spec, dtype=torch.float32, optim_states=states)
        except Exception as exc:  # noqa: BLE001 - reported to every rank, re-raised below
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise RuntimeError(f"save_sharded: rank 0 could not create the checkpoint: {box[0]}")
    return box[0]


def _agree(error: Exception | None) -> None:
    """Every rank reports its error; all raise if any failed (nobody finalizes a partial save)."""
    failed = [None] * dist.get_world_size()
    dist.all_gather_object(failed, None if error is None else f"rank {dist.get_rank()}: {error}")
    problems = [f for f in failed if f]
    if problems:
        if error is not None:
            raise error
        raise RuntimeError(f"save_sharded: other ranks failed: {'; '.join(problems)}")


def save_sharded(engine: MegatronEngine, path: str | os.PathLike, *, step: int,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Every rank: save the engine's state as checkpoint ``path`` (see the module doc). Returns
    ``{"path", "optim_step"}`` on global rank 0, None elsewhere."""
    from flowrl.backends.train.megatron.dist_optim import distributed_optimizers, optimizer_step, write_distributed
    from flowrl.checkpoint import finalize_checkpoint, write_shard

    spec = engine_spec(engine)
    params = _local_params(engine)
    key, first = _shard_key(spec)
    distributed = distributed_optimizers(engine.optimizer)
    _refuse_distributed_experts(spec, distributed)
    if distributed:
        optim_step = optimizer_step(distributed, params)
    else:
        mains, states, optim_step = _plain_state(engine, params)
    tmp = _begin_on_rank0(path, spec, states=OPTIM_STATES if optim_step else ())
    error: Exception | None = None
    try:
        if distributed:  # every dp rank writes the chunks of its ranges
            write_distributed(tmp, spec, key, distributed, params, states=OPTIM_STATES if optim_step else ())
        elif first:  # the other replicas of this shard key hold the same tensors
            optim = ({s: {n: states[n][s].detach() for n in mains} for s in OPTIM_STATES}
                     if states else None)
            write_shard(tmp, spec, key, {n: m.detach().float() for n, m in mains.items()}, optim=optim)
    except Exception as exc:  # noqa: BLE001 - every rank must reach the barrier
        error = exc
    _agree(error)
    if dist.get_rank() != 0:
        return None
    final = finalize_checkpoint(tmp, step=step, extra={**(extra or {}), "optim_step": optim_step})
    return {"path": final, "optim_step": optim_step}


@torch.no_grad()
def load_sharded(engine: MegatronEngine, path: str | os.PathLike) -> int:
    """Every rank: load checkpoint ``path`` (any layout) into the engine's parameters and, when
    the checkpoint has them, AdamW's states; returns the optimizer step count restored."""
    from flowrl.backends.train.megatron.dist_optim import distributed_optimizers, load_distributed
    from flowrl.checkpoint import load_meta, load_shard

    meta = load_meta(path)
    spec = engine_spec(engine)
    key, _ = _shard_key(spec)
    params = _local_params(engine)
    distributed = distributed_optimizers(engine.optimizer)
    _refuse_distributed_experts(spec, distributed)
    values = load_shard(path, spec, key, as_torch=True)
    for name, param in params.items():
        param.copy_(values[name].to(param.dtype))
        main = None if distributed else _main(param)
        if main is not None and main is not param:
            main.copy_(values[name].to(main.dtype))
    optim_step = int(meta.get("extra", {}).get("optim_step", 0))
    saved = set(meta["optim"])
    if saved and not set(OPTIM_STATES) <= saved:
        raise ValueError(f"{path}: optimizer states {sorted(saved)} are not AdamW's {list(OPTIM_STATES)}")
    if distributed:
        load_distributed(distributed, params, values,
                         (lambda s: load_shard(path, spec, key, state=s, as_torch=True)) if saved else None,
                         states=OPTIM_STATES, optim_step=optim_step)
        return optim_step if saved else 0
    if not saved:
        return 0
    loaded = {s: load_shard(path, spec, key, state=s, as_torch=True) for s in OPTIM_STATES}
    adam = _adam_states(engine)
    for inner, _ in {id(v[0]): v for v in adam.values()}.values():
        inner.state.clear()
    for name, param in params.items():
        main = _main(param)
        inner, _ = adam[id(main)]
        inner.state[main] = {
            "step": torch.tensor(float(optim_step), dtype=torch.float32),
            **{s: loaded[s][name].to(device=main.device, dtype=main.dtype).clone() for s in OPTIM_STATES},
        }
    return optim_step
