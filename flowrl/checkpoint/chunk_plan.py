"""Chunk shapes and chunk ownership of a checkpoint's logical arrays: pure functions, no I/O.

Every parameter is stored with its full Hugging Face shape. Its chunks follow the *saving* layout:
along the parameter's split dim (``ShardSpec.split_dim``) the chunk length is the greatest common
divisor of every interior piece boundary of every rank's shard, so each chunk lies inside exactly
one piece of one shard, and all other dims are whole.

- Regular tp splits (column/row parallel, ``[gate; up]`` = two HF arrays each cut in tp blocks):
  the boundaries are multiples of ``rows / tp``, so the chunk is one rank's block.
- Megatron's fused ``linear_qkv`` (interleaved per KV group ``[q_g; k_g; v_g]``, cut flat in tp row
  blocks): the pieces of ``q_proj`` are (parts of) one group's query rows, those of ``k_proj`` /
  ``v_proj`` one group's head rows. The gcd of their boundaries is the KV-group row count
  (``q_per_group * head_dim`` for q, ``head_dim`` for k/v) when tp <= kv heads, or the finer cut
  when tp > kv heads splits a group over several ranks. Either way no chunk straddles two ranks.
- Vocabulary-parallel embeddings / heads: boundaries at multiples of ``Vp / tp`` below V; the last
  (partial) zarr chunk ends at V, padding rows are not stored.
- Replicated tensors (norms) and full-state saves: one chunk along the dim.

A chunk larger than ``max_chunk_bytes`` is cut further, by the largest divisor of its length that
fits (so it still never straddles a shard boundary), then along dim 0 for row-parallel weights.

Ownership: dp replicas, tp ranks holding a replicated norm, and the last pipeline stage's copy of a
tied embedding hold the same chunks; ``chunk_owners`` gives each chunk one writer (the first shard
key in ``(pp_rank, tp_rank, ep_rank, etp_rank)`` order holding it), so parallel writers never touch
the same file. Experts: each expert is its own parameter, held by the ranks of one expert-parallel
rank, its chunks cut at the expert tensor-parallel boundaries like a dense MLP's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import ShardSpec

__all__ = ["DEFAULT_MAX_CHUNK_BYTES", "chunk_owners", "chunk_shape", "owned_runs", "spec_chunks"]

DEFAULT_MAX_CHUNK_BYTES = 64 * 2**20
"""Cap on one chunk file (64 MiB): big enough for few files, small enough to read selectively."""

Key = tuple[int, ...]


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(small + [n // k for k in small])


def chunk_shape(shape: tuple[int, ...], split_dim: int, boundaries: set[int], itemsize: int,
                max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> tuple[int, ...]:
    """The chunk of an array of ``shape`` whose shards are cut at ``boundaries`` along
    ``split_dim`` (positions outside ``(0, shape[split_dim])`` are ignored)."""
    if not shape:
        return ()
    n = shape[split_dim]
    length = 0
    for b in boundaries:
        if 0 < b < n:
            length = math.gcd(length, b)
    length = length or n
    slice_bytes = math.prod(shape) // max(n, 1) * itemsize
    if length * slice_bytes > max_chunk_bytes:
        fitting = [d for d in _divisors(length) if d * slice_bytes <= max_chunk_bytes]
        length = fitting[-1] if fitting else 1
    chunks = list(shape)
    chunks[split_dim] = max(length, 1)
    if split_dim != 0 and math.prod(chunks) * itemsize > max_chunk_bytes:
        per_row = math.prod(chunks[1:]) * itemsize
        chunks[0] = max(1, min(shape[0], max_chunk_bytes // per_row))
    return tuple(chunks)


def spec_chunks(spec: ShardSpec, itemsizes: dict[str, int],
                max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> dict[str, tuple[int, ...]]:
    """Chunk shape of every HF parameter of ``spec``, aligned with its shards (module doc)."""
    boundaries: dict[str, set[int]] = {name: set() for name in spec.params}
    for shard in spec.shards.values():
        for piece in shard.pieces:
            boundaries[piece.param].update((piece.start, piece.stop))
    return {name: chunk_shape(shape, spec.split_dim[name], boundaries[name], itemsizes[name],
                              max_chunk_bytes)
            for name, shape in spec.params.items()}


def chunk_owners(spec: ShardSpec, chunks: dict[str, tuple[int, ...]]) -> dict[str, list[Key]]:
    """For every parameter, the shard key that writes each chunk index along its split dim.

    Raises AssertionError if a chunk straddles two pieces or no shard holds it (internal
    invariants of ``spec_chunks``)."""
    owners: dict[str, list[Key | None]] = {}
    for name, shape in spec.params.items():
        dim = spec.split_dim[name]
        owners[name] = [None] * math.ceil(shape[dim] / chunks[name][dim])
    for key in sorted(spec.shards, key=lambda k: (k[1], k[0]) + k[2:]):
        for piece in spec.shards[key].pieces:
            size = chunks[piece.param][piece.dim]
            n = spec.params[piece.param][piece.dim]
            assert piece.start % size == 0 and (piece.stop % size == 0 or piece.stop == n), piece
            row = owners[piece.param]
            for c in range(piece.start // size, math.ceil(piece.stop / size)):
                if row[c] is None:
                    row[c] = key
    for name, row in owners.items():
        assert all(k is not None for k in row), f"{name}: a chunk is held by no shard"
    return owners  # type: ignore[return-value]


def owned_runs(owners: list[Key], size: int, n: int, start: int, stop: int,
               key: Key) -> list[tuple[int, int]]:
    """Maximal ``[lo, hi)`` runs of ``[start, stop)`` (chunk length ``size``, dim length ``n``)
    whose chunks ``key`` owns."""
    runs: list[tuple[int, int]] = []
    for c in range(start // size, math.ceil(stop / size)):
        if owners[c] != key:
            continue
        lo, hi = max(start, c * size), min(stop, (c + 1) * size, n)
        if runs and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs
