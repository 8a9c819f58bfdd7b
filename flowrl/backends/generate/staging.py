"""Reshard into engines whose live weights cannot be written in place (``vllm``).

The reshard node writes each generation rank's shard into tensors the rank offers
(``flowrl.backends.reshard.run_rank(dst=...)``). The ``hf`` engine offers its live parameters. A
vLLM engine cannot: its CPU build repacks linear weights and any build fuses and pads them. So a
vLLM rank offers staging tensors in the planned layout; the tp ranks of one replica send theirs
to the replica's engine rank, which assembles full HF-named tensors from the spec's pieces and
loads them through the engine's update path.

Rank layout of a generation group: tp fastest (Megatron order), the engine on each replica's
tp rank 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flowrl.parallel.shard_spec import piece_index

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import ShardSpec


def staging_tensors(spec: ShardSpec, rank: int, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Zeroed local tensors of ``rank``'s shard (the padding rows stay zero), on ``device`` (the
    rank's: a GPU rank receives its shard, and hands it to its engine, on its GPU)."""
    return {local: torch.zeros(shape, dtype=dtype, device=device) for local, shape in spec.shard_of(rank).tensors.items()}


def assemble_hf(spec: ShardSpec, shards: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full HF-named tensors from the local tensors of ``shards`` (rank -> local tensors).

    Raises ValueError when the ranks together do not cover every element of every parameter.
    """
    some = next(iter(next(iter(shards.values())).values()))
    full = {name: torch.empty(shape, dtype=some.dtype, device=some.device) for name, shape in spec.params.items()}
    covered: dict[str, list[tuple[int, int]]] = {name: [] for name in spec.params}
    for rank, tensors in shards.items():
        for piece in spec.shard_of(rank).pieces:
            ndim = len(spec.params[piece.param])
            full[piece.param][piece_index(piece, local=False, ndim=ndim)] = tensors[piece.local][
                piece_index(piece, local=True, ndim=ndim)
            ]
            covered[piece.param].append((piece.start, piece.stop))
    for name, spans in covered.items():
        size = spec.params[name][spec.split_dim[name]]
        reach = 0
        for start, stop in sorted(spans):
            if start > reach:
                break
            reach = max(reach, stop)
        if reach < size:
            raise ValueError(
                f"reshard: ranks {sorted(shards)} of the {spec.style} layout {spec.dims} hold only "
                f"[0, {reach}) of {name} along dim {spec.split_dim[name]} (size {size}); a vLLM "
                "replica needs every tp rank's shard (pipeline_model_parallel_size must be 1)"
            )
    return full


def replica_ranks(rank: int, tp: int) -> list[int]:
    """The ranks of ``rank``'s replica (tp fastest); the first holds the engine."""
    first = rank - rank % tp
    return list(range(first, first + tp))


def gather_replica_state(spec: ShardSpec, rank: int, tp: int, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Send this rank's staged shard to its replica's engine rank (over the group's default
    process group); on the engine rank, return the assembled HF state, elsewhere None."""
    import torch.distributed as dist

    ranks = replica_ranks(rank, tp)
    engine_rank = ranks[0]
    names = sorted(local)
    if rank != engine_rank:
        for name in names:
            dist.send(local[name].contiguous(), engine_rank)
        return None
    shards = {rank: local}
    for peer in ranks[1:]:
        some = next(iter(local.values()))
        received = staging_tensors(spec, peer, some.dtype, some.device)
        for name in sorted(received):
            dist.recv(received[name], peer)
        shards[peer] = received
    return assemble_hf(spec, shards)
