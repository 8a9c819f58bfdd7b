"""Sharded zarr checkpoints of an ``FSDPEngine`` (``flowrl.backends.train.fsdp_policy``).

Save (every rank together): rank 0 creates the arrays, chunked along this world's dim-0 rows
(``flowrl.parallel.fsdp_spec``), and broadcasts the temporary path; each rank writes its own rows
of the parameters and of AdamW's ``exp_avg`` / ``exp_avg_sq`` (``write_shard``); after every rank
reported, rank 0 commits (``finalize_checkpoint``). The arrays hold full HF shapes, so ``dp``
(``load_full``), megatron and an FSDP run of another world size load them.

Load (every rank): the checkpoint may come from any layout; each rank reads only the chunks that
overlap its rows (``load_shard``) into its parameters and AdamW state. Copies only: bitwise.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import ShardSpec

OPTIM_STATES = ("exp_avg", "exp_avg_sq")


def engine_spec(engine: Any) -> ShardSpec:
    from flowrl.parallel.fsdp_spec import fsdp_shard_spec

    shapes = {n: tuple(p.shape) for n, p in engine._state_named().items()}
    return fsdp_shard_spec(shapes, dist.get_world_size(), config=engine.model.config.to_dict())


def _adam(engine: Any) -> tuple[dict[str, dict], int]:
    """Each parameter's AdamW state (empty before the first step) and the step count."""
    from flowrl.backends.train.fsdp_tensors import local as _local

    if engine.optimizer is None:
        return {}, 0
    states = {n: engine.optimizer.state.get(p) for n, p in engine._state_named().items()}
    stepped = [s for s in states.values() if s]
    if not stepped:
        return {}, 0
    if len(stepped) != len(states):
        raise RuntimeError("save_sharded: AdamW has state for some parameters only")
    optim = {key: {n: _local(s[key]).detach() for n, s in states.items()} for key in OPTIM_STATES}
    return optim, int(float(stepped[0]["step"]))


def _all_ok(error: Exception | None, what: str) -> None:
    failed: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(failed, None if error is None else f"rank {dist.get_rank()}: {error}")
    problems = [f for f in failed if f]
    if error is not None:
        raise error
    if problems:
        raise RuntimeError(f"{what}: other ranks failed: {'; '.join(problems)}")


def save_sharded(engine: Any, path: str | os.PathLike, *, step: int,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Every rank: save the engine's state as checkpoint ``path``; ``{"path", "optim_step"}`` on
    rank 0, None elsewhere."""
    from flowrl.checkpoint import begin_checkpoint, finalize_checkpoint, write_shard

    spec = engine_spec(engine)
    params = {n: t.detach() for n, t in engine.local_params().items()}
    optim, optim_step = _adam(engine)
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            dtype = next(iter(params.values())).dtype
            box[0] = begin_checkpoint(path, spec, dtype=dtype, optim_states=OPTIM_STATES if optim else ())
        except Exception as exc:  # noqa: BLE001 - reported to every rank
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise RuntimeError(f"save_sharded: rank 0 could not create the checkpoint: {box[0]}")
    error = None
    try:
        write_shard(box[0], spec, (dist.get_rank(), 0), params, optim=optim or None)
    except Exception as exc:  # noqa: BLE001 - every rank must reach the gather
        error = exc
    _all_ok(error, "save_sharded")
    if dist.get_rank() != 0:
        return None
    final = finalize_checkpoint(box[0], step=step, extra={**(extra or {}), "optim_step": optim_step})
    return {"path": final, "optim_step": optim_step}


@torch.no_grad()
def load_sharded(engine: Any, path: str | os.PathLike) -> int:
    """Every rank: load checkpoint ``path`` (saved under any layout) into this rank's rows of the
    parameters and, when the checkpoint has them, AdamW's state; the optimizer step restored."""
    from flowrl.backends.train.fsdp_tensors import local as _local
    from flowrl.checkpoint import load_meta, load_shard

    meta = load_meta(path)
    spec = engine_spec(engine)
    key = (dist.get_rank(), 0)
    values = load_shard(path, spec, key, as_torch=True)
    named = engine._state_named()  # with LoRA: the adapters (the base weights are model.path's)
    for name, p in named.items():
        _local(p).copy_(values[name].to(device=p.device, dtype=p.dtype))
    optim_step = int(meta.get("extra", {}).get("optim_step", 0))
    states = [s for s in OPTIM_STATES if s in meta.get("optim", {})]
    if engine.optimizer is None or not states:
        return optim_step
    loaded = {s: load_shard(path, spec, key, state=s, as_torch=True) for s in states}
    engine.optimizer.state.clear()
    for name, p in named.items():
        state = {"step": torch.tensor(float(optim_step), dtype=torch.float32)}
        for s in states:
            state[s] = _dtensor_like(p, loaded[s][name].to(device=p.device, dtype=p.dtype))
        engine.optimizer.state[p] = state
    return optim_step


def _dtensor_like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """A tensor holding ``local`` rows laid out as ``param`` (a DTensor when it is one)."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return DTensor.from_local(local.clone(), param.device_mesh, param.placements,
                                  shape=param.shape, stride=param.stride())
    return local.clone()
