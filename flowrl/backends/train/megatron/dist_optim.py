"""megatron's distributed optimizer in layout-free checkpoints: every rank writes and reads its own ranges.

With ``use_distributed_optimizer`` each data-parallel rank holds, for every local parameter, the
fp32 main copy and AdamW's ``exp_avg`` / ``exp_avg_sq`` of one flat range of it only (see
``optim_layout``). Nothing is gathered to one rank:

- save (:func:`write_distributed`, every rank, between ``begin_checkpoint`` and the barrier before
  ``finalize_checkpoint``): the dp ranks of a ``(tp_rank, pp_rank)`` shard exchange their ranges
  (a few integers per parameter), each writes the chunks it holds most of, and receives from the
  other dp ranks only the elements of chunks a dp boundary cuts (point-to-point, one message per
  cut chunk and sender). Parameters are written from the main copies (fp32 also under bf16), so
  the checkpoint is the same as a save without the distributed optimizer.
- load (:func:`load_distributed`): the model parameters are restored whole on every dp rank (as
  without it); each rank then copies its ranges of the main parameters and states out of its
  local tensors (``load_shard``: only the chunks of its tp/pp pieces; one state at a time).

Every wait has a timeout (``EXCHANGE_TIMEOUT``).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from flowrl.backends.train.megatron.optim_layout import assign_writers, box_elements, owned_boxes

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import ShardSpec

__all__ = ["distributed_optimizers", "load_distributed", "local_ranges", "optimizer_step", "write_distributed"]

EXCHANGE_TIMEOUT = datetime.timedelta(minutes=10)
"""Longest wait for one chunk's elements from another dp rank."""
PARAM = "param"
"""The main parameter's key in megatron's ``_get_main_param_and_optimizer_states``."""


def distributed_optimizers(optimizer: Any) -> list[Any]:
    """The ``DistributedOptimizer``s of a megatron optimizer (one per param-group config; a
    ``ChainedOptimizer`` holds several); [] without the distributed optimizer. Raises when only
    some are (flowrl never builds that)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    optimizers = list(getattr(optimizer, "chained_optimizers", None) or [optimizer])
    distributed = [o for o in optimizers if isinstance(o, DistributedOptimizer)]
    if distributed and len(distributed) != len(optimizers):
        raise RuntimeError("the megatron optimizer mixes distributed and plain optimizers; checkpoints "
                           "cannot save it")
    return distributed


def _owner(optimizers: list[Any], param: torch.Tensor) -> Any:
    return next((o for o in optimizers if param in o.model_param_gbuf_map), None)


def local_ranges(optimizers: list[Any], params: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """This dp rank's flat range ``[start, end)`` of every local parameter (``(0, 0)``: none)."""
    out = {}
    for name, param in params.items():
        opt = _owner(optimizers, param)
        r = opt._get_model_param_range_map(param)["param"] if opt is not None else None
        out[name] = (r.start, r.end) if r is not None else (0, 0)
    return out


def _held(optimizers: list[Any], params: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Per owned local parameter: its flat main-parameter shard and AdamW states (and ``step``)."""
    out = {}
    for name, param in params.items():
        opt = _owner(optimizers, param)
        if opt is not None:
            out[name] = opt._get_main_param_and_optimizer_states(param)
    return out


def optimizer_step(optimizers: list[Any], params: dict[str, torch.Tensor], group: Any = None) -> int:
    """AdamW's step count, agreed over the ranks of ``group`` (a rank may own no state at all)."""
    steps = [int(float(t["step"])) for t in _held(optimizers, params).values() if "step" in t]
    mine = torch.tensor([max(steps, default=0)], dtype=torch.int64,
                        device=next(iter(params.values())).device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)
    return int(mine)


def _exchange(boxes, plan, mine, dp_rank: int, ranks: list[int], width: int, device: torch.device) -> dict:
    """Post every send and receive of the plan, wait for all; ``(box index, dp rank) -> elements``
    (``width`` tensors of the sender's count, concatenated)."""
    works, received, keep = [], {}, []
    for i, (writer, counts) in enumerate(plan):
        if writer == dp_rank:
            for d, n in enumerate(counts):
                if d != dp_rank and n:
                    buf = torch.empty(n * width, dtype=torch.float32, device=device)
                    received[(i, d)] = buf
                    works.append(dist.irecv(buf, src=ranks[d], tag=i))
        elif counts[dp_rank]:
            keep.append(mine(boxes[i]).contiguous())
            works.append(dist.isend(keep[-1], dst=ranks[writer], tag=i))
    for work in works:
        work.wait(timeout=EXCHANGE_TIMEOUT)
    return received


def write_distributed(tmp: str, spec: ShardSpec, key: tuple[int, int], optimizers: list[Any],
                      params: dict[str, torch.Tensor], *, states: tuple[str, ...]) -> None:
    """Every rank: write this dp rank's chunks of the main parameters and ``states`` (module doc)."""
    from megatron.core import parallel_state as ps

    from flowrl.checkpoint import declared_chunks, write_chunks
    from flowrl.checkpoint.chunk_plan import chunk_owners

    group = ps.get_data_parallel_group()
    ranks, dp_rank = dist.get_process_group_ranks(group), ps.get_data_parallel_rank()
    ranges = local_ranges(optimizers, params)
    every: list[Any] = [None] * len(ranks)
    dist.all_gather_object(every, ranges, group=group)
    chunks = declared_chunks(tmp)
    boxes = owned_boxes(spec, key, chunks, chunk_owners(spec, chunks))
    plan = assign_writers(boxes, {n: [every[d][n] for d in range(len(ranks))] for n in ranges})
    held = _held(optimizers, params)
    names = (PARAM, *states)
    device = next(iter(params.values())).device

    def mine(box):
        start = ranges[box.local][0]
        tensors = held.get(box.local)
        if tensors is None:
            return torch.empty(0, dtype=torch.float32, device=device)
        return torch.cat([box_elements(tensors[k].detach().reshape(-1).float(), start, box) for k in names])

    received = _exchange(boxes, plan, mine, dp_rank, ranks, len(names), device)

    def writes():
        for i, (box, (writer, counts)) in enumerate(zip(boxes, plan)):
            if writer != dp_rank:
                continue
            parts = [(mine(box) if d == dp_rank else received.pop((i, d))).view(len(names), -1)
                     for d in range(len(ranks)) if counts[d]]
            for k, name in enumerate(names):
                region = torch.cat([p[k] for p in parts]).view(box.shape)
                yield (None if name == PARAM else name), box.param, box.region, region

    write_chunks(tmp, writes())


@torch.no_grad()
def load_distributed(optimizers: list[Any], params: dict[str, torch.Tensor], values: dict[str, torch.Tensor],
                     load_state: Callable[[str], dict[str, torch.Tensor]] | None, *, states: tuple[str, ...],
                     optim_step: int) -> None:
    """Every rank, after the model parameters are restored from ``values`` (this rank's local
    tensors of the checkpoint): set its ranges of the main parameters and, given ``load_state``
    (state -> this rank's local tensors of it, read one state at a time: host memory for one), of
    AdamW's ``states``; without it AdamW starts afresh."""
    owned = []
    for opt in optimizers:
        opt.optimizer.state.clear()
    for name, param in params.items():
        opt = _owner(optimizers, param)
        if opt is None:
            continue
        r = opt._get_model_param_range_map(param)["param"]
        group_index, group_order = opt.model_param_group_index_map[param]
        main = opt.optimizer.param_groups[group_index]["params"][group_order]
        owned.append((name, opt, main, r.start, r.end))
        main.copy_(values[name].reshape(-1)[r.start:r.end].to(device=main.device, dtype=main.dtype))  # a view when fp32
    if load_state is None:
        return
    for name, opt, main, *_ in owned:
        opt.optimizer.state[main] = {"step": torch.tensor(float(optim_step), dtype=torch.float32)}
    for state in states:
        local = load_state(state)
        for name, opt, main, start, end in owned:
            opt.optimizer.state[main][state] = local[name].reshape(-1)[start:end].to(
                device=main.device, dtype=main.dtype).clone()
        del local
