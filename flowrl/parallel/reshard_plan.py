"""The reshard planner: a pure function from two shard specs and a placement to transfers.

``plan_reshard(src, dst, placement=...)`` moves a model from the training layout (``src``, a
``ShardSpec``) to the generation layout (``dst``). Processes are the workers: ``Placement`` says
which process hosts each source rank and each destination rank (colocated: the hybrid engine, a
destination rank shares a process with a source rank; split: disjoint processes).

Every destination piece (see shard_spec.py) is cut at the source pieces' boundaries; each cut is
written by exactly one ``Transfer``: a *local copy* when the destination's own process holds it in
its source shard, otherwise a *send* from the source rank (among all that hold it, dp replicas
included) that has sent the fewest bytes so far. Adjacent cuts from the same source piece are merged.
So nothing is sent to a process that already holds the element, and nothing is sent twice: the
bytes sent equal the minimum, ``sum over destination processes of |needed - held locally|``.

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

from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import Piece, ShardSpec

__all__ = [
    "Placement",
    "ReshardPlan",
    "Transfer",
    "hybridflow_bytes_per_rank",
    "micro_dp_placement",
    "plan_reshard",
]

Interval = tuple[int, int]


@dataclass(frozen=True)
class Placement:
    """Which process (worker) hosts each source rank (``src[rank]``) and destination rank."""

    src: tuple[int, ...]
    dst: tuple[int, ...]

    def __post_init__(self) -> None:
        for side in ("src", "dst"):
            procs = getattr(self, side)
            if any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in procs):
                raise ValueError(f"Placement.{side}={procs!r}: processes are integers >= 0")
            if len(set(procs)) != len(procs):
                raise ValueError(
                    f"Placement.{side}={procs!r} puts two {side} ranks on one process; each worker "
                    "process hosts at most one rank of a group (one actor per worker)")

    @classmethod
    def colocated(cls, world_size: int) -> Placement:
        """Destination rank r on the process of source rank r (both layouts span world_size)."""
        return cls(tuple(range(world_size)), tuple(range(world_size)))

    @classmethod
    def split(cls, src_world_size: int, dst_world_size: int) -> Placement:
        """Source ranks on processes [0, S), destination ranks on [S, S + D): no overlap."""
        return cls(tuple(range(src_world_size)),
                   tuple(range(src_world_size, src_world_size + dst_world_size)))

    @property
    def kind(self) -> str:
        """``"colocated"`` (every destination shares a process with a source), ``"split"``
        (none does) or ``"mixed"``."""
        shared = set(self.src) & set(self.dst)
        return "colocated" if shared == set(self.dst) else "split" if not shared else "mixed"

    def check(self, src_world: int, dst_world: int) -> None:
        for side, procs, world in (("source", self.src, src_world),
                                   ("destination", self.dst, dst_world)):
            if len(procs) != world:
                raise ValueError(
                    f"the placement lists {len(procs)} {side} processes but the {side} layout has "
                    f"{world} ranks (dp*tp*pp); give one process per rank")


@dataclass(frozen=True)
class Transfer:
    """HF indices ``[start, stop)`` of ``param`` along ``dim`` (all other dims whole), from
    ``src_local[src_offset:]`` on source rank ``src_rank`` to ``dst_local[dst_offset:]`` on
    destination rank ``dst_rank``. ``local`` when both ranks live in one process (a copy)."""

    src_rank: int
    dst_rank: int
    src_process: int
    dst_process: int
    param: str
    dim: int
    start: int
    stop: int
    src_local: str
    src_offset: int
    dst_local: str
    dst_offset: int
    nbytes: int

    @property
    def local(self) -> bool:
        return self.src_process == self.dst_process

    @property
    def length(self) -> int:
        return self.stop - self.start


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

    def summary(self) -> dict[str, Any]:
        """The totals as a JSON-ready dict."""
        dims = {"src": self.src.dims, "dst": self.dst.dims}
        return {
            "src": {"layout": str(dims["src"]), "style": self.src.style},
            "dst": {"layout": str(dims["dst"]), "style": self.dst.style},
            "placement": self.placement.kind,
            "bytes_per_element": self.bytes_per_element,
            "model_bytes": self.model_bytes,
            "bytes_sent": self.bytes_sent,
            "bytes_local": self.bytes_local,
            "bytes_min": self.bytes_min,
            "bytes_naive": self.bytes_naive,
            "bytes_hybridflow": self.bytes_hybridflow,
            "redundant_bytes": self.redundant_bytes,
            "sent_over_min": self.bytes_sent / self.bytes_min if self.bytes_min else 1.0,
            "sent_over_naive": self.bytes_sent / self.bytes_naive if self.bytes_naive else 0.0,
            "max_peak_extra_bytes": max(self.peak_extra_bytes.values()),
            "num_sends": len(self.sends),
            "num_local_copies": len(self.local_copies),
        }


# -- interval arithmetic on one split dim -----------------------------------------------------


def _merge(intervals: list[Interval]) -> list[Interval]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _measure(intervals: list[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def _intersect(xs: list[Interval], ys: list[Interval]) -> int:
    """Measure of the intersection of two merged interval lists."""
    total, i, j = 0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _holdings(spec: ShardSpec, key: tuple[int, int]) -> dict[str, list[Interval]]:
    """Merged HF intervals of each parameter that shard ``key`` holds."""
    out: dict[str, list[Interval]] = {}
    for param, pieces in spec.shards[key].by_param().items():
        out[param] = _merge([(p.start, p.stop) for p in pieces])
    return out


def _overlap_numel(src: ShardSpec, src_key: tuple[int, int], dst: ShardSpec,
                   dst_key: tuple[int, int]) -> int:
    """Elements the destination shard needs that the source shard holds."""
    held = _holdings(src, src_key)
    return sum(_intersect(held.get(param, []), need) * dst.slice_numel(param)
               for param, need in _holdings(dst, dst_key).items())


# -- checks ------------------------------------------------------------------------------------


def _check_specs(src: ShardSpec, dst: ShardSpec) -> None:
    for name, spec in (("src", src), ("dst", dst)):
        if not isinstance(spec, ShardSpec):
            raise TypeError(f"{name} must be a ShardSpec (flowrl.parallel.shard_spec.shard_spec), "
                            f"got {type(spec).__name__}")
    missing = [p for p in dst.params if p not in src.params]
    if missing:
        raise ValueError(f"the destination spec needs parameter {missing[0]!r} (and "
                         f"{len(missing) - 1} more) that the source spec lacks; build both specs "
                         "from the same model")
    for param, shape in dst.params.items():
        if src.params[param] != shape:
            raise ValueError(f"parameter {param!r} has shape {src.params[param]} in the source "
                             f"spec but {shape} in the destination spec; build both specs from "
                             "the same model")


# -- the planner -------------------------------------------------------------------------------


def _costs(src: ShardSpec, dst: ShardSpec, placement: Placement, bpe: int
           ) -> tuple[dict[int, int], int, float, dict[int, int]]:
    """Per destination process: the minimum bytes, the naive bytes (summed), HybridFlow's volume
    (summed) and the destination shard's bytes (see the module doc)."""
    src_rank_on = {proc: rank for rank, proc in enumerate(placement.src)}
    model_bytes = dst.num_params * bpe
    min_per_proc: dict[int, int] = {}
    naive = 0
    hybridflow = 0.0
    peak: dict[int, int] = {}
    share_dst = model_bytes / dst.dims.model_parallel_size
    share_src = model_bytes / src.dims.model_parallel_size
    for dst_rank in range(dst.dims.world_size):
        proc = placement.dst[dst_rank]
        dst_key = dst.dims.rank_coords(dst_rank)[1:]
        need = _holdings(dst, dst_key)
        local_rank = src_rank_on.get(proc)
        held = _holdings(src, src.dims.rank_coords(local_rank)[1:]) if local_rank is not None \
            else {}
        missing = sum((_measure(iv) - _intersect(iv, held.get(param, []))) * dst.slice_numel(param)
                      for param, iv in need.items())
        min_per_proc[proc] = missing * bpe
        held_numel = sum(_measure(iv) * src.slice_numel(param) for param, iv in held.items())
        naive += model_bytes - held_numel * bpe
        hybridflow += share_dst - (share_src if local_rank is not None else 0.0)
        peak[proc] = dst.shard_numel(dst_key) * bpe
    return min_per_proc, naive, hybridflow, peak


def _fill_piece(transfers: list[Transfer], sent: list[int], piece: Piece,
                source_pieces: Iterable[tuple[int, Piece]], *, src: ShardSpec, dst: ShardSpec,
                placement: Placement, dst_rank: int, local_rank: int | None, bpe: int) -> None:
    """Append to ``transfers`` what fills destination ``piece`` of ``dst_rank``: each slice between
    source piece boundaries from the local source rank if it holds it, else from the holder that
    has sent least so far (``sent``, updated); consecutive slices of one source piece merge."""
    proc = placement.dst[dst_rank]
    row_bytes = dst.slice_numel(piece.param) * bpe
    cands = [(r, p) for r, p in source_pieces if p.start < piece.stop and p.stop > piece.start]
    cuts = sorted({piece.start, piece.stop} | {
        x for _, p in cands for x in (p.start, p.stop) if piece.start < x < piece.stop})
    last: tuple[int, Piece] | None = None
    for a, b in zip(cuts, cuts[1:]):
        holders = [(r, p) for r, p in cands if p.start <= a and b <= p.stop]
        if not holders:
            raise ValueError(
                f"no source rank holds {piece.param}[{a}:{b}] (dim {piece.dim}); the "
                f"source layout {src.dims} does not cover the model")
        mine = [h for h in holders if h[0] == local_rank]
        choice = mine[0] if mine else min(holders, key=lambda h: (sent[h[0]], h[0]))
        r, sp = choice
        nbytes = (b - a) * row_bytes
        if not mine:
            sent[r] += nbytes
        if last is choice and transfers[-1].stop == a:  # same source piece: extend
            t = transfers[-1]
            transfers[-1] = replace(t, stop=b, nbytes=t.nbytes + nbytes)
            continue
        transfers.append(Transfer(
            src_rank=r, dst_rank=dst_rank, src_process=placement.src[r], dst_process=proc,
            param=piece.param, dim=piece.dim, start=a, stop=b, src_local=sp.local,
            src_offset=sp.offset + a - sp.start, dst_local=piece.local,
            dst_offset=piece.offset + a - piece.start, nbytes=nbytes))
        last = choice


def plan_reshard(src: ShardSpec, dst: ShardSpec, *, placement: Placement,
                 bytes_per_element: int = 2) -> ReshardPlan:
    """Transfers that build every destination shard of ``dst`` from the source shards of ``src``.

    ``src`` and ``dst`` carry their layouts (``spec.dims``); ``placement`` maps ranks to processes.
    Raises ValueError for mismatched specs or a placement that does not cover both layouts.
    """
    _check_specs(src, dst)
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be a Placement, got {type(placement).__name__}")
    if not isinstance(bytes_per_element, int) or bytes_per_element < 1:
        raise ValueError(f"bytes_per_element={bytes_per_element!r} must be a positive integer")
    src_world, dst_world = src.dims.world_size, dst.dims.world_size
    placement.check(src_world, dst_world)
    bpe = bytes_per_element

    # Every source piece of every parameter, on every source rank (dp replicas included).
    by_param: dict[str, list[tuple[int, Piece]]] = {}
    for rank in range(src_world):
        for piece in src.shard_of(rank).pieces:
            by_param.setdefault(piece.param, []).append((rank, piece))
    src_rank_on = {proc: rank for rank, proc in enumerate(placement.src)}
    sent = [0] * src_world  # bytes each source rank sends (the load to balance)

    transfers: list[Transfer] = []
    for dst_rank in range(dst_world):
        for piece in dst.shard_of(dst_rank).pieces:
            _fill_piece(transfers, sent, piece, by_param.get(piece.param, ()), src=src, dst=dst,
                        placement=placement, dst_rank=dst_rank,
                        local_rank=src_rank_on.get(placement.dst[dst_rank]), bpe=bpe)

    model_bytes = dst.num_params * bpe
    min_per_proc, naive, hybridflow, peak = _costs(src, dst, placement, bpe)
    bytes_sent = sum(t.nbytes for t in transfers if not t.local)
    plan = ReshardPlan(
        src=src, dst=dst, placement=placement, bytes_per_element=bpe, transfers=tuple(transfers),
        model_bytes=model_bytes, bytes_sent=bytes_sent,
        bytes_local=sum(t.nbytes for t in transfers if t.local), bytes_min=sum(min_per_proc.values()),
        bytes_naive=naive, bytes_hybridflow=round(hybridflow), peak_extra_bytes=peak,
        min_bytes_per_process=min_per_proc)
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
    groups {0, 2} and {1, 3}). Other layout pairs (given as ShardSpecs) take a greedy assignment:
    destination ranks in order, each on the free process whose source shard overlaps its own most.
    Raises ValueError unless both layouts have the same world size.
    """
    sd, dd = _as_dims(src), _as_dims(dst)
    if sd.world_size != dd.world_size:
        raise ValueError(
            f"a colocated placement needs both layouts on the same workers, but the training layout "
            f"({sd}) has {sd.world_size} ranks and the generation layout ({dd}) {dd.world_size}; set "
            "the generation data_parallel_size to world / (tp*pp), or use a split placement")
    world = sd.world_size
    if sd.tp % dd.tp == 0 and sd.pp % dd.pp == 0:
        kt, kp = sd.tp // dd.tp, sd.pp // dd.pp
        procs = []
        for rank in range(world):
            dg, tg, pg = dd.rank_coords(rank)
            d, j = divmod(dg, kt * kp)
            procs.append(sd.coords_rank(d, tg * kt + j % kt, pg * kp + j // kt))
        return Placement(tuple(range(world)), tuple(procs))
    if not (isinstance(src, ShardSpec) and isinstance(dst, ShardSpec)):
        raise ValueError(
            f"generation tp={dd.tp}, pp={dd.pp} do not divide training tp={sd.tp}, pp={sd.pp}: pass "
            "ShardSpecs (not ParallelDims) so the placement can be chosen by overlap")
    free = set(range(world))
    procs = []
    for rank in range(world):
        dst_key = dd.rank_coords(rank)[1:]
        best = max(sorted(free), key=lambda s: _overlap_numel(src, sd.rank_coords(s)[1:], dst,
                                                              dst_key))
        free.remove(best)
        procs.append(best)
    return Placement(tuple(range(world)), tuple(procs))


def hybridflow_bytes_per_rank(model_bytes: int, src: ParallelDims, dst: ParallelDims) -> float:
    """HybridFlow's per-rank volume (tp - t_g*p_g) / (t_g*p_g*t*p) * M (colocated)."""
    tp, gp = src.tp * src.pp, dst.tp * dst.pp
    return (tp - gp) / (gp * tp) * model_bytes

