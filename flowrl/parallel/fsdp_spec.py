"""The ``fsdp`` layout of a model: every parameter cut along dim 0 over the data-parallel ranks,
as FSDP2's ``fully_shard`` cuts it (``torch.chunk``: ``ceil(n / world)`` rows per rank, the last
ranks shorter or empty), for any model (its HF parameter names and shapes, nothing else).

:func:`fsdp_shard_spec` returns a :class:`~flowrl.parallel.shard_spec.ShardSpec` whose shards are
keyed ``(dp_rank, 0)`` (FSDP ranks hold different slices, unlike dp replicas), so the zarr
checkpoint code (``begin_checkpoint`` / ``write_shard`` / ``load_shard``) chunks along it and
each rank writes and reads only its own rows. Pure code: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from flowrl.catalog.backends import ShardStyle
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, Piece, RankShard, ShardSpec

__all__ = ["OpaqueModel", "fsdp_rows", "fsdp_shard_spec"]


@dataclass(frozen=True)
class OpaqueModel:
    """What a checkpoint's layout records of a model ``ModelShape`` cannot describe (GPT-2, ...)."""

    model_type: str
    num_params: int


def fsdp_rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a dim of length ``n`` that ``rank`` of ``world`` holds
    (``torch.chunk``'s split: ``ceil(n / world)`` each, empty past the end)."""
    size = math.ceil(n / world) if n else 0
    return min(rank * size, n), min((rank + 1) * size, n)


def _model(config: Any, params: Mapping[str, tuple[int, ...]]) -> Any:
    try:
        return ModelShape.from_hf_config(config)
    except (ValueError, TypeError):
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        return OpaqueModel(str(get("model_type", "unknown")), sum(math.prod(s) for s in params.values()))


def fsdp_shard_spec(params: Mapping[str, tuple[int, ...]], world: int, *, config: Any = None) -> ShardSpec:
    """The ``fsdp`` spec of parameters ``params`` (HF name -> full shape, tied weights once) over
    ``world`` ranks; ``config`` (a transformers config or its dict) is recorded in checkpoints."""
    if world < 1:
        raise ValueError(f"world={world} must be >= 1")
    shards = {}
    for rank in range(world):
        tensors: dict[str, tuple[int, ...]] = {}
        pieces = []
        for name, shape in params.items():
            shape = tuple(shape)
            if not shape:
                raise ValueError(f"{name}: a 0-d parameter has no dim 0 to shard")
            start, stop = fsdp_rows(shape[0], world, rank)
            tensors[name] = (stop - start, *shape[1:])
            if stop > start:
                pieces.append(Piece(name, 0, start, stop, name, 0))
        shards[(rank, 0)] = RankShard(rank, 0, tensors, tuple(pieces))
    vocab = next((s[0] for n, s in params.items() if n.endswith("embed_tokens.weight")), 0)
    return ShardSpec(model=_model(config or {}, params), dims=ParallelDims(dp=world, tp=1, pp=1),
                     style=ShardStyle.FSDP, padded_vocab_size=vocab, params={n: tuple(s) for n, s in params.items()},
                     split_dim={n: 0 for n in params}, shards=shards)
