"""The reshard planner: a pure function from two shard specs and a placement to transfers.

``plan_reshard(src, dst, placement=...)`` moves a model from the training layout (``src``, a
``ShardSpec``) to the generation layout (``dst``). Processes are the workers: ``Placement`` says
which process hosts each source rank and each destination rank (colocated: the hybrid engine, a
destination rank shares a process with a source rank; split: disjoint processes).

Every destination piece (see shard_spec.py) is cut at the source pieces' boundaries; each cut is
written by exactly one ``Transfer``: a *local copy* when the destination's own process holds it in
its source shard, otherwise a *send* from one of the source ranks that hold it (dp replicas
included), dealt in blocks of destination replicas so every rank can compute its own part
alone (``plan_for_rank``, reshard_rank.py: the whole plan is the union of those parts). So nothing
is sent to a process that already holds the element, and nothing is sent twice: the bytes sent
equal the minimum, ``sum over destination processes of |needed - held locally|``.
``plan_summary`` gives the totals and the per-process loads without listing a transfer (1,024
ranks in well under a second).

Reported sizes (``bytes_per_element`` each, default 2 for bf16; M is the model's logical size,
unpadded vocabulary, tied embeddings once):
- ``bytes_sent``: bytes of sends; ``bytes_local``: bytes of local copies.
- ``bytes_min``: the theoretical minimum above; ``redundant_bytes = bytes_sent - bytes_min`` (0).
- ``bytes_naive``: gather-then-slice, verl's scheme (every destination process materialises the
  full model: a training all-gather over the model-parallel group, or a broadcast to a split
  group): ``sum over destination processes of (M - what its source rank already holds)``; with
  colocated uniform shards that is ``(tp - 1)/tp * M`` per process, HybridFlow's naive baseline.
- ``bytes_hybridflow``: HybridFlow's volume ``M/(t_g*p_g) - M/(t*p)`` per colocated destination
  process (``(tp - t_g*p_g)/(t_g*p_g*t*p) * M``), ``M/(t_g*p_g)`` per split one. Exact for the
  tp-split parameters under ``micro_dp_placement`` when shard boundaries nest; replicated norms and
  misaligned vocabulary padding make the true minimum lower or higher.
- ``peak_extra_bytes[process]``: the destination shard allocated there (padding included), i.e.
  M/(t_g*p_g) plus replicated norms; a transport adds at most one staging bucket to it.

Pure code: no torch, no I/O, no process groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_rank import (
    Placement,
    RankPlan,
    ReshardIndex,
    Transfer,
    plan_for_rank,
    receives_of,
)
from flowrl.parallel.reshard_summary import (
    _STAT_FIELDS,
    PlanStats,
    check_plan_args,
    overlap_numel,
    plan_summary,
    process_min_bytes,
)
from flowrl.parallel.shard_spec import ShardSpec

__all__ = [
    "PlanStats",
    "Placement",
    "RankPlan",
    "ReshardIndex",
    "ReshardPlan",
    "Transfer",
    "hybridflow_bytes_per_rank",
    "micro_dp_placement",
    "plan_for_rank",
    "plan_reshard",
    "plan_summary",
    "process_min_bytes",
]


@dataclass(frozen=True)
class ReshardPlan:
    """The transfers and what they cost (see the module doc for each size's definition)."""

    src: ShardSpec = field(repr=False)
    dst: ShardSpec = field(repr=False)
    placement: Placement = field(repr=False)
    bytes_per_element: int
    transfers: tuple[Transfer, ...] = field(repr=False)
    model_bytes: int
    bytes_sent: int
    bytes_local: int
    bytes_min: int
    bytes_naive: int
    bytes_hybridflow: int
    peak_extra_bytes: dict[int, int] = field(repr=False)
    min_bytes_per_process: dict[int, int] = field(repr=False)

    @property
    def redundant_bytes(self) -> int:
        """Bytes sent beyond the minimum (0 by construction)."""
        return self.bytes_sent - self.bytes_min

    @property
    def sends(self) -> list[Transfer]:
        return [t for t in self.transfers if not t.local]

    @property
    def local_copies(self) -> list[Transfer]:
        return [t for t in self.transfers if t.local]

    def rank_table(self) -> list[dict[str, Any]]:
        """Per process: source/destination rank, bytes sent / received / copied locally, peers,
        transfer counts, peak extra bytes."""
        rows: dict[int, dict[str, Any]] = {}

        def row(proc: int) -> dict[str, Any]:
            return rows.setdefault(proc, {
                "process": proc, "src_rank": None, "dst_rank": None, "send_bytes": 0,
                "recv_bytes": 0, "local_bytes": 0, "num_sends": 0, "num_recvs": 0,
                "send_to": set(), "recv_from": set(), "peak_extra_bytes": 0})

        for rank, proc in enumerate(self.placement.src):
            row(proc)["src_rank"] = rank
        for rank, proc in enumerate(self.placement.dst):
            row(proc)["dst_rank"] = rank
            row(proc)["peak_extra_bytes"] = self.peak_extra_bytes[proc]
        for t in self.transfers:
            if t.local:
                row(t.dst_process)["local_bytes"] += t.nbytes
                continue
            sender, receiver = row(t.src_process), row(t.dst_process)
            sender["send_bytes"] += t.nbytes
            sender["num_sends"] += 1
            sender["send_to"].add(t.dst_rank)
            receiver["recv_bytes"] += t.nbytes
            receiver["num_recvs"] += 1
            receiver["recv_from"].add(t.src_rank)
        for r in rows.values():
            r["send_to"], r["recv_from"] = sorted(r["send_to"]), sorted(r["recv_from"])
        return [rows[p] for p in sorted(rows)]

    def stats(self) -> PlanStats:
        """Totals and per-process loads counted from the transfers (``plan_summary`` computes
        the same without them)."""
        rows = {p: dict.fromkeys(_STAT_FIELDS, 0) for p in self.placement.processes}
        for t in self.transfers:
            if t.local:
                rows[t.dst_process]["local_bytes"] += t.nbytes
                rows[t.dst_process]["num_local"] += 1
                continue
            rows[t.src_process]["send_bytes"] += t.nbytes
            rows[t.src_process]["num_sends"] += 1
            rows[t.dst_process]["recv_bytes"] += t.nbytes
            rows[t.dst_process]["num_recvs"] += 1
        return PlanStats(src=self.src, dst=self.dst, placement=self.placement,
                         bytes_per_element=self.bytes_per_element, model_bytes=self.model_bytes,
                         rows=rows, bytes_min=self.bytes_min, bytes_naive=self.bytes_naive,
                         bytes_hybridflow=self.bytes_hybridflow,
                         peak_extra_bytes=self.peak_extra_bytes,
                         min_bytes_per_process=self.min_bytes_per_process)

    def summary(self) -> dict[str, Any]:
        """The totals as a JSON-ready dict (``PlanStats.summary``)."""
        return self.stats().summary()


def plan_reshard(src: ShardSpec, dst: ShardSpec, *, placement: Placement,
                 bytes_per_element: int = 2, index: ReshardIndex | None = None) -> ReshardPlan:
    """Transfers that build every destination shard of ``dst`` from the source shards of ``src``:
    every destination rank's part of ``plan_for_rank`` (reshard_rank.py), in rank order.

    ``src`` and ``dst`` carry their layouts (``spec.dims``); ``placement`` maps ranks to processes.
    Raises ValueError for mismatched specs or a placement that does not cover both layouts.
    """
    check_plan_args(src, dst, placement, bytes_per_element)
    ix = index if index is not None else ReshardIndex(src, dst)
    transfers = tuple(t for rank in range(dst.dims.world_size)
                      for t in receives_of(ix, placement, rank, bytes_per_element))
    totals = plan_summary(src, dst, placement=placement, bytes_per_element=bytes_per_element,
                          index=ix)
    plan = ReshardPlan(
        src=src, dst=dst, placement=placement, bytes_per_element=bytes_per_element,
        transfers=transfers, model_bytes=totals.model_bytes,
        bytes_sent=sum(t.nbytes for t in transfers if not t.local),
        bytes_local=sum(t.nbytes for t in transfers if t.local), bytes_min=totals.bytes_min,
        bytes_naive=totals.bytes_naive, bytes_hybridflow=totals.bytes_hybridflow,
        peak_extra_bytes=totals.peak_extra_bytes,
        min_bytes_per_process=totals.min_bytes_per_process)
    assert plan.redundant_bytes == 0, (plan.bytes_sent, plan.bytes_min)
    return plan

# -- micro-DP placement ------------------------------------------------------------------------


def _as_dims(x: ParallelDims | ShardSpec) -> ParallelDims:
    if isinstance(x, ShardSpec):
        return x.dims
    if isinstance(x, ParallelDims):
        return x
    raise TypeError(f"expected a ParallelDims or a ShardSpec, got {type(x).__name__}")


def micro_dp_placement(src: ParallelDims | ShardSpec, dst: ParallelDims | ShardSpec) -> Placement:
    """A colocated placement that keeps most data in place (HybridFlow's micro-DP grouping).

    When t_g divides t and p_g divides p, each training model-parallel group of t*p ranks hosts
    ``k = (t/t_g)*(p/p_g)`` generation replicas; generation rank (d_g, tg, pg) with ``d_g = d*k +
    j`` sits on training rank (d, tg*(t/t_g) + j % (t/t_g), pg*(p/p_g) + j // (t/t_g)). Its
    training shard is then a sub-slice of its generation shard, so each rank receives exactly
    ``M/(t_g*p_g) - M/(t*p)``; generation tp groups stride across training ranks (tp=4 -> tp_g=2:
    groups {0, 2} and {1, 3}). Other layout pairs, and layouts with expert parallelism (given as
    ShardSpecs), take a greedy assignment: destination ranks in order, each on the lowest free
    process whose source shard overlaps its own most.
    Raises ValueError unless both layouts have the same world size.
    """
    sd, dd = _as_dims(src), _as_dims(dst)
    if sd.world_size != dd.world_size:
        raise ValueError(
            f"a colocated placement needs both layouts on the same workers, but the training layout "
            f"({sd}) has {sd.world_size} ranks and the generation layout ({dd}) {dd.world_size}; set "
            "the generation data_parallel_size to world / (tp*pp), or use a split placement")
    world = sd.world_size
    if sd.tp % dd.tp == 0 and sd.pp % dd.pp == 0 and not (sd.expert_keys or dd.expert_keys):
        kt, kp = sd.tp // dd.tp, sd.pp // dd.pp
        procs = []
        for rank in range(world):
            dg, tg, pg = dd.rank_coords(rank)
            d, j = divmod(dg, kt * kp)
            procs.append(sd.coords_rank(d, tg * kt + j % kt, pg * kp + j // kt))
        return Placement(tuple(range(world)), tuple(procs))
    if not (isinstance(src, ShardSpec) and isinstance(dst, ShardSpec)):
        raise ValueError(
            f"generation tp={dd.tp}, pp={dd.pp} do not divide training tp={sd.tp}, pp={sd.pp}, or "
            "a layout has expert parallelism: pass ShardSpecs (not ParallelDims) so the placement "
            "can be chosen by overlap")
    # Greedy by overlap, computed per pair of shard keys (overlap depends on nothing else): each
    # destination rank in order takes the lowest free source rank among the keys overlapping it
    # most. O(world * source keys) after O(keys^2) overlaps.
    free: dict[tuple, list[int]] = {}
    for rank in reversed(range(world)):
        free.setdefault(sd.shard_key(rank), []).append(rank)  # lowest rank last: pop() takes it
    overlap: dict[tuple, dict[tuple, int]] = {}
    cache: dict = {}
    procs = []
    for rank in range(world):
        dst_key = dd.shard_key(rank)
        if dst_key not in overlap:
            overlap[dst_key] = {k: overlap_numel(src, k, dst, dst_key, cache=cache) for k in free}
        row = overlap[dst_key]
        best = max((k for k, ranks in free.items() if ranks),
                   key=lambda k: (row[k], -free[k][-1]))
        procs.append(free[best].pop())
    return Placement(tuple(range(world)), tuple(procs))


def hybridflow_bytes_per_rank(model_bytes: int, src: ParallelDims, dst: ParallelDims) -> float:
    """HybridFlow's per-rank volume (tp - t_g*p_g) / (t_g*p_g*t*p) * M (colocated)."""
    tp, gp = src.tp * src.pp, dst.tp * dst.pp
    return (tp - gp) / (gp * tp) * model_bytes

