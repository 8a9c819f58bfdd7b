"""Where megatron's distributed-optimizer state goes in a layout-free checkpoint: pure functions.

megatron-core's ``DistributedOptimizer`` (0.16.1, ``optimizer/distrib_optimizer.py``) flattens each
model chunk's parameters into buckets and gives data-parallel rank ``d`` the ``d``-th contiguous
``1 / dp`` of every bucket (``_build_model_gbuf_range``). For one local parameter (a tp/pp shard in
megatron's own shape) a dp rank therefore owns one flat range ``[start, end)`` of
``param.view(-1)`` (``_get_model_param_range_map(param)["param"]``), possibly empty, and holds the
fp32 main parameter, ``exp_avg`` and ``exp_avg_sq`` of that range only, as flat tensors.

A checkpoint stores each parameter (and each state) with its full HF shape, chunked along the
saving layout's shards (``flowrl.checkpoint.chunk_plan``). A zarr chunk is written whole (a partial
write reads, modifies and rewrites the chunk file), so two dp ranks may not write parts of one
chunk. The plan here:

- :func:`owned_boxes`: the chunks a ``(tp_rank, pp_rank)`` shard writes (``chunk_owners``), one
  :class:`Box` each: its HF region and the same elements as a rectangle of the local tensor's 2-D
  view (a 1-D tensor is one row).
- :func:`box_count`: how many of a box's elements lie in a flat range; a box's elements in
  row-major order are then the concatenation, in dp-rank order, of each rank's share
  (:func:`box_elements`), because a flat range is contiguous in row-major order.
- :func:`assign_writers`: each box is written by the dp rank holding most of it; the others send
  it their shares (only boxes a dp boundary cuts: at most ``dp - 1`` cuts per bucket).

Loading needs no plan: a rank reads its local tensors (``load_shard``) and keeps
``local.view(-1)[start:end]`` of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    import torch

    from flowrl.parallel.shard_spec import ShardSpec

__all__ = ["Box", "assign_writers", "box_count", "box_elements", "owned_boxes"]

Range = tuple[int, int]


@dataclass(frozen=True)
class Box:
    """One zarr chunk of HF parameter ``param``: HF ``region`` (one ``(lo, hi)`` per dim) holds
    rows ``rows`` x columns ``cols`` of local tensor ``local`` viewed as ``(-1, ncols)``."""

    param: str
    local: str
    region: tuple[Range, ...]
    rows: Range
    cols: Range
    ncols: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The HF region's shape (the box's elements in row-major order fill it)."""
        return tuple(hi - lo for lo, hi in self.region)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _spans(n: int, size: int) -> list[Range]:
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def owned_boxes(spec: ShardSpec, key: tuple[int, int], chunks: Mapping[str, tuple[int, ...]],
                owners: Mapping[str, Sequence[tuple[int, int]]]) -> list[Box]:
    """Every chunk shard ``key`` writes (``owners[param][c] == key`` along the split dim, every
    chunk along the other dim), as boxes, in the spec's piece order."""
    shard = spec.shards[key]
    boxes: list[Box] = []
    for piece in shard.pieces:
        shape = spec.params[piece.param]
        local_shape = shard.tensors[piece.local]
        if len(shape) > 2:
            raise ValueError(f"{piece.param}: {len(shape)}-D parameters are not supported "
                             "(megatron's parameters are 1-D or 2-D)")
        size = chunks[piece.param][piece.dim]
        n = shape[piece.dim]
        off = piece.offset - piece.start
        others = _spans(shape[1 - piece.dim], chunks[piece.param][1 - piece.dim]) if len(shape) == 2 else [None]
        for c in range(piece.start // size, math.ceil(piece.stop / size)):
            if owners[piece.param][c] != key:
                continue
            lo, hi = c * size, min((c + 1) * size, n)
            assert piece.start <= lo and hi <= piece.stop, (piece, lo, hi)  # chunk_plan aligns chunks with pieces
            split = (lo + off, hi + off)
            for other in others:
                if other is None:  # 1-D: one row
                    boxes.append(Box(piece.param, piece.local, ((lo, hi),), (0, 1), split, local_shape[0]))
                elif piece.dim == 0:
                    boxes.append(Box(piece.param, piece.local, ((lo, hi), other), split, other, local_shape[1]))
                else:
                    boxes.append(Box(piece.param, piece.local, (other, (lo, hi)), other, split, local_shape[1]))
    return boxes


def _before(box: Box, x: int) -> int:
    """Elements of ``box`` whose flat index in the local tensor is below ``x``."""
    (r0, r1), (c0, c1) = box.rows, box.cols
    row, col = divmod(x, box.ncols)
    if row < r0:
        return 0
    if row >= r1:
        return (r1 - r0) * (c1 - c0)
    return (row - r0) * (c1 - c0) + min(max(col - c0, 0), c1 - c0)


def box_count(box: Box, flat: Range) -> int:
    """Elements of ``box`` whose flat index lies in ``flat = [start, end)``."""
    start, end = flat
    return _before(box, end) - _before(box, start) if end > start else 0


def assign_writers(boxes: Sequence[Box], ranges: Mapping[str, Sequence[Range]]) -> list[tuple[int, tuple[int, ...]]]:
    """For each box, ``(writer dp rank, elements per dp rank)``: ``ranges[local][d]`` is dp rank
    ``d``'s flat range of that local tensor. The writer holds the most (the lowest rank on a tie).
    AssertionError when the ranges do not cover a box exactly once (megatron's ranges partition
    each parameter)."""
    out = []
    for box in boxes:
        counts = tuple(box_count(box, r) for r in ranges[box.local])
        assert sum(counts) == box.numel, (box, counts, ranges[box.local])
        out.append((max(range(len(counts)), key=lambda d: (counts[d], -d)), counts))
    return out


def box_elements(shard_F: torch.Tensor, start: int, box: Box) -> torch.Tensor:
    """The elements of ``box`` held in ``shard_F`` (the flat range ``[start, start + len)`` of the
    local tensor), in row-major order: views and at most two small copies, no full tensor."""
    import torch

    end = start + shard_F.numel()
    (r0, r1), (c0, c1) = box.rows, box.cols
    C = box.ncols
    parts = []
    row, last = max(r0, start // C), min(r1, -(-end // C))
    while row < last:
        lo = row * C
        if lo >= start and lo + C <= end:  # whole rows: one strided view
            stop = min(last, end // C)
            parts.append(shard_F[lo - start:stop * C - start].view(stop - row, C)[:, c0:c1].reshape(-1))
            row = stop
            continue
        a, b = max(lo + c0, start), min(lo + c1, end)
        if a < b:
            parts.append(shard_F[a - start:b - start])
        row += 1
    return torch.cat(parts) if parts else shard_F.new_empty(0)
