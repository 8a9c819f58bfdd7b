"""Per-rank reshard planning: each process computes only its own transfers.

``plan_for_rank(src, dst, placement=..., process=p)`` returns the transfers that touch process
``p`` (what its destination rank receives or copies locally, what its source rank sends), equal
to the whole plan's (``reshard_plan.plan_reshard``) restriction to ``p``, in the same order. Its
work and memory are O(p's transfers) plus the ``ReshardIndex`` of the two specs, which depends on
tp and pp (the model's pieces), never on dp: dp replicas hold identical shards (``ShardSpec`` keys
its shards by ``(tp_rank, pp_rank)``, plus ``(ep_rank, etp_rank)`` under expert parallelism; each
key has ``num_replicas`` ranks, ``ParallelDims.shard_rank``), so which replica sends is arithmetic.

The rule (the whole plan is this rule applied to every destination rank):

- *Segments*: per parameter, the HF range is cut at every source piece boundary; a segment's
  holders are the source keys ``K`` (sorted) with a piece covering it, times the ``n`` source
  replicas of a key (``n = dp`` without expert parallelism): ``h = n * |K|`` holder ranks, holder
  ``j`` is replica ``j // |K|`` of key ``K[j % |K|]``. In every shard style a parameter's source pieces are identical or disjoint, so a
  segment is one source piece (and its replicas).
- A destination rank ``R``, replica ``d_g`` of key ``k``, cuts each of its pieces at the segments;
  each cut is a *local copy* when the source rank on R's own process holds the segment, else a
  *send* from holder ``j = (d_g * h // dp_g + param_index + index(k)) mod h`` (``index(k) = tg +
  tp_g * pg`` without expert parallelism, ``ParallelDims.shard_key_index``): the ``dp_g`` destination
  replicas of a cut are dealt to the ``h`` holders in equal blocks (block sizes differ by one at
  most), the block of ``d_g`` shifted by the parameter's place in the model and the destination
  key, so that fewer receivers than holders still spread over the replicas across parameters.
  Under ``micro_dp_placement`` the receivers that copy a cut locally fall one in each block, so
  every holder loses exactly one receiver to them and the deal stays even.
- A source rank inverts it: for each of its segments (holder index ``j``) and each destination
  piece that overlaps it, the receivers are the block ``q = (j - shift) mod h``, i.e. ``d_g`` in
  ``[ceil(q * dp_g / h), ceil((q + 1) * dp_g / h))``, less those whose process holds the segment
  (they copy locally). Both directions are O(the transfers they list).

Nothing is sent to a process that holds it, every needed element is written once, so the bytes
sent are the minimum whatever the balancing. Pure code: no torch, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, NamedTuple

from flowrl.parallel.shard_spec import Piece, ShardSpec

__all__ = ["Placement", "RankPlan", "ReshardIndex", "Transfer", "check_plan_args", "local_key",
           "plan_for_rank", "receives_of", "sends_of"]

Key = tuple[int, ...]


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

    @cached_property
    def _src_at(self) -> dict[int, int]:
        return {proc: rank for rank, proc in enumerate(self.src)}

    @cached_property
    def _dst_at(self) -> dict[int, int]:
        return {proc: rank for rank, proc in enumerate(self.dst)}

    def src_rank_at(self, process: int) -> int | None:
        """The source rank hosted by ``process`` (None: none)."""
        return self._src_at.get(process)

    def dst_rank_at(self, process: int) -> int | None:
        """The destination rank hosted by ``process`` (None: none)."""
        return self._dst_at.get(process)

    @property
    def processes(self) -> list[int]:
        """Every process of the placement, sorted."""
        return sorted(set(self.src) | set(self.dst))

    @property
    def num_processes(self) -> int:
        """One more than the largest process id (the size of the process group)."""
        return max(max(self.src, default=-1), max(self.dst, default=-1)) + 1

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
    src_index: int | None = None
    """``src_local[src_index]`` is the tensor addressed (one expert of a fused tensor); None: all."""
    dst_index: int | None = None

    @property
    def local(self) -> bool:
        return self.src_process == self.dst_process

    @property
    def length(self) -> int:
        return self.stop - self.start


class Segment(NamedTuple):
    """A range of one parameter that the same source keys hold (each by one of its pieces); a
    named tuple: a MoE model has tens of thousands (built per process, cheaply)."""

    param_index: int
    start: int
    stop: int
    keys: tuple[Key, ...]
    pieces: tuple[Piece, ...]


class _Need(NamedTuple):
    """A destination piece (``index`` in its shard's pieces) of shard ``key``."""

    start: int
    stop: int
    key: Key
    index: int
    piece: Piece


class ReshardIndex:
    """Segments of the source spec and destination pieces, per parameter (O(tp * pp * pieces),
    independent of dp); shared by every rank's planning and by the whole-plan summary."""

    def __init__(self, src: ShardSpec, dst: ShardSpec) -> None:
        self.src, self.dst = src, dst
        self.src_replicas, self.dst_replicas = src.dims.num_replicas, dst.dims.num_replicas
        sd, dd = src.dims, dst.dims
        self._src_first = {k: sd.shard_rank(k, 0) for k in src.shards}
        self._dst_first = {k: dd.shard_rank(k, 0) for k in dst.shards}
        self._src_period, self._dst_period = sd.key_period, dd.key_period
        self._dst_key_index = {k: dd.shard_key_index(k) for k in dst.shards}
        self.param_index = {name: i for i, name in enumerate(dst.params)}
        self.row_numel = {name: dst.slice_numel(name) for name in dst.params}
        held: dict[str, list[tuple[Key, Piece]]] = {}
        for key, shard in sorted(src.shards.items()):
            for piece in shard.pieces:
                held.setdefault(piece.param, []).append((key, piece))
        self.segments = {p: _segments(self.param_index.get(p, -1), hs) for p, hs in held.items()}
        needs: dict[str, list[_Need]] = {}
        for key, shard in sorted(dst.shards.items()):
            for i, piece in enumerate(shard.pieces):
                needs.setdefault(piece.param, []).append(_Need(piece.start, piece.stop, key, i,
                                                               piece))
        for lst in needs.values():
            lst.sort()  # by (start, stop, key, index): (key, index) names a piece once
        self.needs = needs
        # per parameter, built when a rank first looks it up (a MoE model has many)
        self._seg_starts: dict[str, list[int]] = {}
        self._need_stops: dict[str, tuple[list[int], bool]] = {}
        self._key_cuts: dict[Key, list[tuple[int, Piece, Segment, int, int]]] = {}
        for param, lst in needs.items():  # every process refuses an uncovered model alike, up front
            _check_covered(param, lst, self.segments.get(param, []), src)

    def src_rank(self, replica: int, key: Key) -> int:
        return self._src_first[key] + replica * self._src_period

    def dst_rank(self, replica: int, key: Key) -> int:
        return self._dst_first[key] + replica * self._dst_period

    def shift(self, seg: Segment, key: Key) -> int:
        """How far the holders' blocks of ``seg`` turn for destination shard ``key``."""
        return seg.param_index + self._dst_key_index[key]

    def holder(self, seg: Segment, key: Key, replica: int) -> int:
        """Index ``j`` of the holder that sends ``seg`` to replica ``replica`` of shard ``key``."""
        h = self.src_replicas * len(seg.keys)
        return (replica * h // self.dst_replicas + self.shift(seg, key)) % h

    def block(self, seg: Segment, key: Key, j: int) -> range:
        """The replicas of destination shard ``key`` that holder ``j`` of ``seg`` serves."""
        h, dp_g = self.src_replicas * len(seg.keys), self.dst_replicas
        q = (j - self.shift(seg, key)) % h
        return range(-(-q * dp_g // h), -(-(q + 1) * dp_g // h))

    def segments_in(self, param: str, start: int, stop: int) -> Iterator[Segment]:
        """The segments of ``param`` overlapping ``[start, stop)``, in order."""
        segs = self.segments.get(param, [])
        starts = self._seg_starts.get(param)
        if starts is None:
            starts = self._seg_starts[param] = [seg.start for seg in segs]
        i = max(0, bisect_right(starts, start) - 1)
        while i < len(segs) and segs[i].start < stop:
            if segs[i].stop > start:
                yield segs[i]
            i += 1

    def needs_in(self, param: str, start: int, stop: int) -> Iterator[_Need]:
        """The destination pieces of ``param`` overlapping ``[start, stop)``."""
        lst = self.needs.get(param, [])
        stops = self._need_stops.get(param)
        if stops is None:
            ends = [n.stop for n in lst]
            stops = self._need_stops[param] = (ends, all(a <= b for a, b in zip(ends, ends[1:])))
        i = bisect_right(stops[0], start) if stops[1] else 0
        while i < len(lst) and lst[i].start < stop:
            if lst[i].stop > start:
                yield lst[i]
            i += 1

    def key_cuts(self, key: Key) -> list[tuple[int, Piece, Segment, int, int]]:
        """``(piece index, piece, segment, start, stop)`` of every cut of destination shard
        ``key`` (cached); raises ValueError where no source holds a needed range."""
        cache = self._key_cuts
        if key not in cache:
            cuts = []
            for i, piece in enumerate(self.dst.shards[key].pieces):
                at = piece.start
                for seg in self.segments_in(piece.param, piece.start, piece.stop):
                    a, b = max(seg.start, piece.start), min(seg.stop, piece.stop)
                    if a > at:
                        break
                    cuts.append((i, piece, seg, a, b))
                    at = b
                if at < piece.stop:
                    raise ValueError(
                        f"no source rank holds {piece.param}[{at}:{piece.stop}] (dim {piece.dim});"
                        f" the source layout {self.src.dims} does not cover the model")
            cache[key] = cuts
        return cache[key]


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



def check_plan_args(src: ShardSpec, dst: ShardSpec, placement: Placement, bpe: int) -> None:
    _check_specs(src, dst)
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be a Placement, got {type(placement).__name__}")
    if not isinstance(bpe, int) or isinstance(bpe, bool) or bpe < 1:
        raise ValueError(f"bytes_per_element={bpe!r} must be a positive integer")
    placement.check(src.dims.world_size, dst.dims.world_size)


def _check_covered(param: str, needs: list[_Need], segs: list[Segment], src: ShardSpec) -> None:
    """Raise ValueError where a destination piece of ``param`` has a range no source segment
    covers (segments are sorted and disjoint)."""
    if segs and segs[0].start <= needs[0].start and all(
            a.stop == b.start for a, b in zip(segs, segs[1:])) and max(
            n.stop for n in needs) <= segs[-1].stop:
        return  # one contiguous run covering every need (all but the vocabulary's padding)
    starts = [seg.start for seg in segs]
    for need in needs:
        at = need.start
        i = max(0, bisect_right(starts, at) - 1)
        while at < need.stop:
            while i < len(segs) and segs[i].stop <= at:
                i += 1
            if i == len(segs) or segs[i].start > at:
                stop = need.stop if i == len(segs) else min(need.stop, segs[i].start)
                raise ValueError(
                    f"no source rank holds {param}[{at}:{stop}] (dim {need.piece.dim});"
                    f" the source layout {src.dims} does not cover the model")
            at = segs[i].stop


def _segments(param_index: int, held: list[tuple[Key, Piece]]) -> list[Segment]:
    """Cut ``param`` at every source piece boundary; each segment lists the keys covering it."""
    classes: dict[tuple[int, int], list[tuple[Key, Piece]]] = {}
    for key, piece in held:  # in key order (held lists the source shards sorted)
        classes.setdefault((piece.start, piece.stop), []).append((key, piece))
    if len(classes) == 1:
        ((a, b), cls), = classes.items()
        return [Segment(param_index, a, b, tuple(k for k, _ in cls), tuple(p for _, p in cls))]
    spans = sorted(classes)
    if all(a[1] <= b[0] for a, b in zip(spans, spans[1:])):  # identical or disjoint: every style
        return [Segment(param_index, a, b, tuple(k for k, _ in classes[(a, b)]),
                        tuple(p for _, p in classes[(a, b)])) for a, b in spans]
    cuts = sorted({x for _, p in held for x in (p.start, p.stop)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        cover = sorted((k, p) for k, p in held if p.start <= a and b <= p.stop)
        if cover:
            out.append(Segment(param_index, a, b, tuple(k for k, _ in cover),
                               tuple(p for _, p in cover)))
    return out


@dataclass(frozen=True)
class RankPlan:
    """The transfers touching one process, in the whole plan's order (destination rank, its
    piece, start); ``src_rank`` / ``dst_rank``: the ranks it hosts (None: none)."""

    process: int
    src_rank: int | None
    dst_rank: int | None
    bytes_per_element: int
    num_processes: int
    transfers: tuple[Transfer, ...] = field(repr=False)

    @property
    def sends(self) -> list[Transfer]:
        return [t for t in self.transfers if not t.local and t.src_process == self.process]

    @property
    def receives(self) -> list[Transfer]:
        return [t for t in self.transfers if not t.local and t.dst_process == self.process]

    @property
    def local_copies(self) -> list[Transfer]:
        return [t for t in self.transfers if t.local]

    @property
    def bytes_received(self) -> int:
        """Equals this process's minimum: what its destination shard lacks locally."""
        return sum(t.nbytes for t in self.receives)


def _transfer(ix: ReshardIndex, placement: Placement, src_rank: int, dst_rank: int, seg: Segment,
              sp: Piece, piece: Piece, a: int, b: int, bpe: int) -> Transfer:
    return Transfer(
        src_rank=src_rank, dst_rank=dst_rank, src_process=placement.src[src_rank],
        dst_process=placement.dst[dst_rank], param=piece.param, dim=piece.dim, start=a, stop=b,
        src_local=sp.local, src_offset=sp.offset + a - sp.start, dst_local=piece.local,
        dst_offset=piece.offset + a - piece.start, nbytes=(b - a) * ix.row_numel[piece.param] * bpe,
        src_index=sp.index, dst_index=piece.index)


def local_key(ix: ReshardIndex, placement: Placement,
              dst_rank: int) -> tuple[int | None, Key | None]:
    """The source rank on ``dst_rank``'s process and its shard key (None, None: none)."""
    rank = placement.src_rank_at(placement.dst[dst_rank])
    if rank is None:
        return None, None
    return rank, ix.src.dims.shard_key(rank)


def receives_of(ix: ReshardIndex, placement: Placement, dst_rank: int,
                bpe: int) -> list[Transfer]:
    """What destination rank ``dst_rank`` receives or copies locally, in piece order."""
    key, d_g = ix.dst.dims.shard_key(dst_rank), ix.dst.dims.shard_replica(dst_rank)
    mine, mkey = local_key(ix, placement, dst_rank)
    out = []
    for _, piece, seg, a, b in ix.key_cuts(key):
        if mkey is not None and mkey in seg.keys:
            out.append(_transfer(ix, placement, mine, dst_rank, seg,
                                 seg.pieces[seg.keys.index(mkey)], piece, a, b, bpe))
            continue
        replica, k = divmod(ix.holder(seg, key, d_g), len(seg.keys))
        out.append(_transfer(ix, placement, ix.src_rank(replica, seg.keys[k]), dst_rank, seg,
                             seg.pieces[k], piece, a, b, bpe))
    return out


def sends_of(ix: ReshardIndex, placement: Placement, src_rank: int,
             bpe: int) -> list[tuple[tuple[int, int, int], Transfer]]:
    """What source rank ``src_rank`` sends, each with its order key (dst rank, piece, start)."""
    key, replica = ix.src.dims.shard_key(src_rank), ix.src.dims.shard_replica(src_rank)
    out = []
    for sp in ix.src.shards[key].pieces:
        for seg in ix.segments_in(sp.param, sp.start, sp.stop):
            j = replica * len(seg.keys) + seg.keys.index(key)
            for need in ix.needs_in(sp.param, seg.start, seg.stop):
                a, b = max(seg.start, need.start), min(seg.stop, need.stop)
                for d_g in ix.block(seg, need.key, j):
                    dst_rank = ix.dst_rank(d_g, need.key)
                    _, mkey = local_key(ix, placement, dst_rank)
                    if mkey is not None and mkey in seg.keys:
                        continue  # that process copies it from its own source shard
                    out.append(((dst_rank, need.index, a), _transfer(
                        ix, placement, src_rank, dst_rank, seg, sp, need.piece, a, b, bpe)))
    return out


def plan_for_rank(src: ShardSpec, dst: ShardSpec, *, placement: Placement, process: int,
                  bytes_per_element: int = 2, index: ReshardIndex | None = None) -> RankPlan:
    """The transfers of the whole plan that touch ``process`` (see the module doc); ``index``:
    a ``ReshardIndex(src, dst)`` to reuse across ranks."""
    check_plan_args(src, dst, placement, bytes_per_element)
    ix = index if index is not None else ReshardIndex(src, dst)
    src_rank, dst_rank = placement.src_rank_at(process), placement.dst_rank_at(process)
    keyed = sends_of(ix, placement, src_rank, bytes_per_element) if src_rank is not None else []
    if dst_rank is not None:
        mine = receives_of(ix, placement, dst_rank, bytes_per_element)
        pieces = [i for i, *_ in ix.key_cuts(ix.dst.dims.shard_key(dst_rank))]
        keyed += [((dst_rank, i, t.start), t) for i, t in zip(pieces, mine)]
    keyed.sort(key=lambda kt: kt[0])
    return RankPlan(process=process, src_rank=src_rank, dst_rank=dst_rank,
                    bytes_per_element=bytes_per_element, num_processes=placement.num_processes,
                    transfers=tuple(t for _, t in keyed))
