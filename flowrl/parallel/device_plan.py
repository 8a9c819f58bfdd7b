"""The device plan: for every rank of every worker group, its node, its GPUs, its local rank, its
process-group backend and its compute dtype. Pure: decided from the inventory and the groups'
layouts before any worker starts (``flowrl devices`` prints it; nothing here touches CUDA).

How GPUs are given out (verl's resource pools, read as slots):

* A *pool* is a set of groups that share devices. Its slots are ``max(world size)`` over its groups;
  rank ``r`` of every group in the pool gets slot ``r``. So the rollout, actor and reference of a
  colocated or hybrid placement share GPUs rank by rank, and two ranks of one group never share one
  (NCCL refuses a communicator with two ranks on one device).
* Pools take disjoint slots, in order (split placements: the trainer's GPUs are not the rollout's).
* Slot ``s`` is GPU ``s % gpus_per_node`` of node ``s // gpus_per_node``.
* A group whose engine spans several devices (a vLLM replica of tensor-parallel size ``t``: its
  engine rank drives ``t`` GPUs, the replica's other ranks stage tensors on theirs) gives the
  replica's first rank all ``t`` slots of the replica; a replica never straddles two nodes.

On a machine without GPUs every rank is a CPU process on gloo in fp32; with GPUs, every rank has
its own device, its groups use ``cpu:gloo,cuda:nccl`` (CPU metadata on gloo, CUDA tensors on NCCL,
as verl and torchtitan initialise them) and compute in bf16 unless the config names a dtype.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

__all__ = ["CPU_BACKEND", "GPU_BACKEND", "DevicePlan", "DevicePlanError", "GroupLayout", "Inventory",
           "RankDevice", "plan_devices"]

CPU_BACKEND = "gloo"
GPU_BACKEND = "cpu:gloo,cuda:nccl"
CPU_DTYPE = "float32"
GPU_DTYPE = "bfloat16"


class DevicePlanError(ValueError):
    """A layout the inventory cannot hold: the config key that asks for it, its value, the problem
    and the fix (the run turns it into a ``ConfigError``)."""

    def __init__(self, key: str, value: object, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}; fix: {fix}")


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """The devices the run may use: ``nodes`` nodes of ``gpus_per_node`` GPUs each (0: CPU only).
    ``source`` says where the numbers came from, for messages (``this machine``, a SLURM spec)."""

    nodes: int = 1
    gpus_per_node: int = 0
    source: str = "this machine"

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise DevicePlanError("nodes", self.nodes, "must be an integer >= 1", "use --nodes 1")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise DevicePlanError("gpus_per_node", self.gpus_per_node, "must be an integer >= 0",
                                  "use --gpus-per-node 0 for CPU, or the GPUs of one node")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def has_gpus(self) -> bool:
        return self.gpus_per_node > 0

    def describe(self) -> str:
        if not self.has_gpus:
            return f"{self.nodes} node(s), no GPU ({self.source})"
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) = {self.total_gpus} ({self.source})"


@dataclass(frozen=True, kw_only=True)
class GroupLayout:
    """One worker group as the plan sees it: its name, world size, the pool whose devices it
    shares, how many devices one engine rank drives (``engine_span``: a vLLM replica's tensor
    parallel size; 1 otherwise) and the config key that sets its size with its value (named in
    refusals)."""

    name: str
    world_size: int
    pool: str
    size_key: str
    size_value: int
    """The value of ``size_key``; ``world_size`` is a multiple of it (tp x pp ranks per unit)."""
    engine_span: int = 1

    def __post_init__(self) -> None:
        assert self.world_size >= 1 and self.engine_span >= 1, self
        assert self.size_value >= 1 and self.world_size % self.size_value == 0, self
        assert self.world_size % self.engine_span == 0, f"{self.name}: world size not a multiple of the engine span"


@dataclass(frozen=True, kw_only=True)
class RankDevice:
    """Where one rank runs. ``gpus``: the node's GPU indices the rank's process sees (its
    ``CUDA_VISIBLE_DEVICES``; empty on CPU); ``local_rank``: its index among its group's ranks on
    its node (``LOCAL_RANK``); ``device``: what the rank's engines use after the worker has set
    ``CUDA_VISIBLE_DEVICES`` (``cuda:0``: the first visible GPU, or ``cpu``)."""

    group: str
    rank: int
    node: int
    gpus: tuple[int, ...]
    local_rank: int
    backend: str
    dtype: str
    pool: str = ""
    """The pool whose devices the rank's group shares (each pool's SLURM jobs are its own)."""

    @property
    def visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    @property
    def device(self) -> str:
        return "cuda:0" if self.gpus else "cpu"

    def environment(self) -> dict[str, str]:
        """The variables a worker sets for this rank before torch touches CUDA."""
        env = {"LOCAL_RANK": str(self.local_rank)}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env


@dataclass(frozen=True)
class DevicePlan:
    """Every rank's :class:`RankDevice`, in group order then rank order."""

    inventory: Inventory
    ranks: tuple[RankDevice, ...]

    def of(self, group: str, rank: int) -> RankDevice:
        for r in self.ranks:
            if r.group == group and r.rank == rank:
                return r
        raise KeyError(f"no rank {rank} of group {group!r} in the plan")

    def group(self, name: str) -> list[RankDevice]:
        return [r for r in self.ranks if r.group == name]

    def backend(self, name: str) -> str:
        """The process-group backend of group ``name`` (every rank of a group agrees)."""
        return self.group(name)[0].backend

    def pool_node(self, rank: RankDevice) -> int:
        """The index of ``rank``'s node among the nodes its pool uses: which of the pool's own
        SLURM jobs (or hosts) must hold the rank (pools get jobs of their own, in order)."""
        return sorted({r.node for r in self.ranks if r.pool == rank.pool}).index(rank.node)

    def gpus_used(self) -> set[tuple[int, int]]:
        """``(node, gpu)`` pairs any rank uses."""
        return {(r.node, g) for r in self.ranks for g in r.gpus}

    def rows(self) -> list[tuple[str, int, int, str, str, str, str]]:
        """One row per rank for a table: group, rank, node, GPUs, local rank, backend, dtype."""
        return [(r.group, r.rank, r.node, r.visible_devices or "-", str(r.local_rank), r.backend, r.dtype)
                for r in self.ranks]


def plan_devices(inventory: Inventory, groups: Sequence[GroupLayout], *, dtype: str | None = None) -> DevicePlan:
    """The plan for ``groups`` on ``inventory``. ``dtype``: the config's compute dtype, or None for
    the default of the device kind (bf16 on GPU, fp32 on CPU). Raises :class:`DevicePlanError`
    naming the config key when the inventory cannot hold a layout."""
    if not groups:
        return DevicePlan(inventory, ())
    if not inventory.has_gpus:
        return DevicePlan(inventory, tuple(_cpu_ranks(groups, dtype or CPU_DTYPE)))
    offsets = _pool_offsets(inventory, groups)
    out: list[RankDevice] = []
    for g in groups:
        out.extend(_gpu_ranks(inventory, g, offsets[g.pool], dtype or GPU_DTYPE))
    return DevicePlan(inventory, tuple(out))


def _cpu_ranks(groups: Sequence[GroupLayout], dtype: str) -> list[RankDevice]:
    return [RankDevice(group=g.name, rank=r, node=0, gpus=(), local_rank=r, backend=CPU_BACKEND, dtype=dtype,
                       pool=g.pool)
            for g in groups for r in range(g.world_size)]


def _pool_offsets(inventory: Inventory, groups: Sequence[GroupLayout]) -> dict[str, int]:
    """The first slot of each pool (pools in order of first appearance), refusing a plan that
    needs more GPUs than the inventory has: the refusal names the largest group of the pool
    that no longer fits."""
    sizes: dict[str, int] = {}
    largest: dict[str, GroupLayout] = {}
    for g in groups:
        if g.world_size > sizes.get(g.pool, 0):
            sizes[g.pool], largest[g.pool] = g.world_size, g
    offsets, used = {}, 0
    for pool, size in sizes.items():
        if used + size > inventory.total_gpus:
            _refuse_too_many(inventory, largest[pool], pool, used, size, sizes)
        offsets[pool] = used
        used += size
    return offsets


def _refuse_too_many(inventory: Inventory, g: GroupLayout, pool: str, used: int, size: int,
                     sizes: dict[str, int]) -> None:
    total = sum(sizes.values())
    shared = f"; the groups of pool {pool!r} share them rank by rank" if len(sizes) == 1 else (
        f"; pools take disjoint GPUs: {', '.join(f'{p}={n}' for p, n in sizes.items())}")
    fits = max(inventory.total_gpus - used, 0)
    fix = (f"set {g.size_key} to at most {_fitting_value(g, fits)} (and the groups sharing its GPUs to match)"
           if _fitting_value(g, fits) else f"free GPUs from the other pools for {g.name}")
    raise DevicePlanError(
        g.size_key, g.size_value, f"gives the {g.name} group {g.world_size} rank(s), one GPU each: the run needs "
        f"{total} GPU(s){shared}, and {inventory.describe()} has {inventory.total_gpus}",
        f"{fix}, or run on more GPUs (--gpus-per-node / --nodes, cluster.slurm.gpus_per_job and more jobs)")


def _fitting_value(g: GroupLayout, gpus: int) -> int:
    """The largest value of ``g.size_key`` whose ranks fit on ``gpus`` GPUs."""
    return gpus // (g.world_size // g.size_value)


def _gpu_ranks(inventory: Inventory, g: GroupLayout, offset: int, dtype: str) -> list[RankDevice]:
    per_node = inventory.gpus_per_node
    if g.engine_span > per_node:
        raise DevicePlanError(
            "rollout.tensor_model_parallel_size", g.engine_span,
            f"spans one engine of the {g.name} group over {g.engine_span} GPUs, more than a node's {per_node}",
            f"use at most {per_node} (a replica stays on one node)")
    local: dict[int, int] = defaultdict(int)
    out = []
    for r in range(g.world_size):
        node, gpu = divmod(offset + r, per_node)
        if g.engine_span > 1 and r % g.engine_span == 0:
            last_node = (offset + r + g.engine_span - 1) // per_node
            if last_node != node:
                raise DevicePlanError(
                    "rollout.tensor_model_parallel_size", g.engine_span,
                    f"puts replica {r // g.engine_span} of the {g.name} group on GPUs of nodes {node} and {last_node} "
                    f"(its pool starts at GPU slot {offset})",
                    f"choose a tensor parallel size that divides {per_node} and pools whose sizes keep replicas "
                    "on one node")
            gpus = tuple(range(gpu, gpu + g.engine_span))
        else:
            gpus = (gpu,)
        out.append(RankDevice(group=g.name, rank=r, node=node, gpus=gpus, local_rank=local[node],
                              backend=GPU_BACKEND, dtype=dtype, pool=g.pool))
        local[node] += 1
    return out
