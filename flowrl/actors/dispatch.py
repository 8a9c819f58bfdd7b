"""Dispatch modes: how one node's input reaches the ranks of a group, and how results come back.

Pure functions over tables and lists (no Dask): verl's ``DP_COMPUTE`` is ``split`` + ``concat``,
``ONE_TO_ALL`` is ``broadcast`` + ``first``/``all``, ``MEGATRON_COMPUTE`` is ``split`` by data-
parallel rank (the tp and pp ranks of one dp group get the same share) + ``concat`` of one output
rank per dp group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

import pyarrow as pa

from flowrl.data import experience
from flowrl.parallel.mesh import ParallelDims


class Scatter(str, Enum):
    SPLIT = "split"  # one share of the table per data-parallel rank
    BROADCAST = "broadcast"  # the same argument to every rank


class Gather(str, Enum):
    CONCAT = "concat"  # concatenate one table per data-parallel rank, in dp order
    FIRST = "first"  # rank 0's result
    OUTPUT = "output"  # the first output rank's result (tp 0, last pipeline stage, dp 0)
    ALL = "all"  # every rank's result, in rank order


@dataclass(frozen=True, kw_only=True)
class GroupMesh(ParallelDims):
    """A group's rank layout: :class:`ParallelDims` (Megatron's rank order, tp fastest, then dp,
    then pp) with every axis defaulting to 1, plus which ranks answer for each dp group."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    def output_ranks(self) -> list[int]:
        """One rank per dp group whose result stands for the group: tp 0 of the last stage."""
        return [self.coords_rank(d, 0, self.pp - 1) for d in range(self.dp)]


def scatter(mode: Scatter, payload: Any, mesh: GroupMesh) -> list[Any]:
    """The argument each rank receives, in rank order."""
    if mode is Scatter.BROADCAST:
        return [payload] * mesh.world_size
    if not isinstance(payload, pa.Table):
        raise TypeError(f"split dispatch needs an Arrow table, got {type(payload).__name__}")
    shares = experience.split(payload, mesh.dp)
    return [shares[mesh.rank_coords(r)[0]] for r in range(mesh.world_size)]


def gather(mode: Gather, results: Sequence[Any], mesh: GroupMesh) -> Any:
    """Combine per-rank results (in rank order) per the mode."""
    if len(results) != mesh.world_size:
        raise ValueError(f"expected {mesh.world_size} results, got {len(results)}")
    if mode is Gather.ALL:
        return list(results)
    if mode is Gather.FIRST:
        return results[0]
    if mode is Gather.OUTPUT:
        return results[mesh.output_ranks()[0]]
    return experience.concat([results[r] for r in mesh.output_ranks()])
