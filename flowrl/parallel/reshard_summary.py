"""The whole reshard plan's totals and per-process loads without listing a transfer.

``plan_summary(src, dst, placement=...)`` returns a ``PlanStats`` equal to what counting the whole
plan's transfers gives (``ReshardPlan.stats()``, reshard_plan.py), in O(tp*pp pieces * holders +
world) integer work: destination ranks with the same shard and the same local source shard
receive the same cuts (only their senders differ), and how many receivers each holder serves is
the block arithmetic of reshard_rank.py. The minimum, naive and HybridFlow sizes are computed by
interval arithmetic on the shards, independently of the transfers (the module doc of
reshard_plan.py defines each).

Pure code: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from flowrl.parallel.reshard_rank import Placement, ReshardIndex, check_plan_args, local_key
from flowrl.parallel.shard_spec import ShardSpec

__all__ = ["PlanStats", "check_plan_args", "plan_summary", "process_min_bytes"]

Interval = tuple[int, int]


_STAT_FIELDS = ("send_bytes", "recv_bytes", "local_bytes", "num_sends", "num_recvs", "num_local")


def _spread(values: list[int]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


@dataclass(frozen=True)
class PlanStats:
    """A plan's totals and, per process (``rows[process]``), bytes sent / received / copied
    locally and the number of each transfer; no transfer list (see ``plan_summary``)."""

    src: ShardSpec = field(repr=False)
    dst: ShardSpec = field(repr=False)
    placement: Placement = field(repr=False)
    bytes_per_element: int
    model_bytes: int
    rows: dict[int, dict[str, int]] = field(repr=False)
    bytes_min: int
    bytes_naive: int
    bytes_hybridflow: int
    peak_extra_bytes: dict[int, int] = field(repr=False)
    min_bytes_per_process: dict[int, int] = field(repr=False)

    def total(self, name: str) -> int:
        return sum(r[name] for r in self.rows.values())

    @property
    def bytes_sent(self) -> int:
        return self.total("send_bytes")

    @property
    def bytes_local(self) -> int:
        return self.total("local_bytes")

    @property
    def redundant_bytes(self) -> int:
        return self.bytes_sent - self.bytes_min

    def spread(self, name: str, processes: list[int] | None = None) -> dict[str, float]:
        """min / median / max of ``rows[p][name]`` over ``processes`` (default: all)."""
        procs = self.placement.processes if processes is None else processes
        return _spread([self.rows[p][name] for p in procs])

    def summary(self) -> dict[str, Any]:
        """The totals as a JSON-ready dict, and ``per_rank``: min / median / max of each
        per-process load over the processes that host a source (sends) or destination rank."""
        sent, bmin, naive = self.bytes_sent, self.bytes_min, self.bytes_naive
        senders, receivers = sorted(set(self.placement.src)), sorted(set(self.placement.dst))
        per_rank = {name: self.spread(name, senders) for name in ("send_bytes", "num_sends")}
        per_rank.update({name: self.spread(name, receivers)
                         for name in ("recv_bytes", "num_recvs", "local_bytes", "num_local")})
        return {
            "src": {"layout": str(self.src.dims), "style": self.src.style},
            "dst": {"layout": str(self.dst.dims), "style": self.dst.style},
            "placement": self.placement.kind,
            "num_processes": len(self.placement.processes),
            "bytes_per_element": self.bytes_per_element,
            "model_bytes": self.model_bytes,
            "bytes_sent": sent,
            "bytes_local": self.bytes_local,
            "bytes_min": bmin,
            "bytes_naive": naive,
            "bytes_hybridflow": self.bytes_hybridflow,
            "redundant_bytes": self.redundant_bytes,
            "sent_over_min": sent / bmin if bmin else 1.0,
            "sent_over_naive": sent / naive if naive else 0.0,
            "max_peak_extra_bytes": max(self.peak_extra_bytes.values()),
            "num_sends": self.total("num_sends"),
            "num_local_copies": self.total("num_local"),
            "per_rank": per_rank,
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


def holdings(spec: ShardSpec, key: tuple[int, ...]) -> dict[str, list[Interval]]:
    """Merged HF intervals of each parameter that shard ``key`` holds."""
    out: dict[str, list[Interval]] = {}
    for param, pieces in spec.shards[key].by_param().items():
        out[param] = _merge([(p.start, p.stop) for p in pieces])
    return out


def overlap_numel(src: ShardSpec, src_key: tuple[int, ...], dst: ShardSpec,
                  dst_key: tuple[int, ...], *, cache: dict | None = None) -> int:
    """Elements the destination shard needs that the source shard holds (``cache``: a dict
    reused across calls keeps each shard's holdings)."""
    cache = {} if cache is None else cache
    if ("src", src_key) not in cache:
        cache[("src", src_key)] = holdings(src, src_key)
    if ("dst", dst_key) not in cache:
        cache[("dst", dst_key)] = holdings(dst, dst_key)
    held = cache[("src", src_key)]
    return sum(_intersect(held.get(param, []), need) * dst.slice_numel(param)
               for param, need in cache[("dst", dst_key)].items())


Group = tuple[tuple[int, ...], "tuple[int, ...] | None"]


def _groups(ix: ReshardIndex, placement: Placement) -> dict[Group, list[int]]:
    """Destination ranks by (their shard key, the key of the source shard on their process):
    ranks of one group need, hold and receive the same (only their senders differ)."""
    sd, dd = ix.src.dims, ix.dst.dims
    out: dict[Group, list[int]] = {}
    for rank, proc in enumerate(placement.dst):
        mine = placement.src_rank_at(proc)
        mkey = None if mine is None else sd.shard_key(mine)
        out.setdefault((dd.shard_key(rank), mkey), []).append(rank)
    return out


def _key_costs(ix: ReshardIndex, key: tuple[int, ...], bpe: int) -> dict[str, Any]:
    """Destination shard ``key``: what it needs (merged intervals, elements), the bytes and count
    of its cuts, and of those each source key holds (its local copies when colocated with it)."""
    dst = ix.dst
    need = holdings(dst, key)
    out = {"need": need, "need_numel": sum(_measure(iv) * dst.slice_numel(p)
                                           for p, iv in need.items()),
           "bytes": 0, "count": 0, "held": {}}
    for _, piece, seg, a, b in ix.key_cuts(key):
        nbytes = (b - a) * ix.row_numel[piece.param] * bpe
        out["bytes"] += nbytes
        out["count"] += 1
        for k in seg.keys:
            held = out["held"].setdefault(k, [0, 0])
            held[0] += nbytes
            held[1] += 1
    return out


def _group_costs(ix: ReshardIndex, group: Group, bpe: int, cache: dict) -> dict[str, float]:
    """One destination rank of ``group``: its minimum, naive and HybridFlow bytes, its peak (see
    the module doc; the minimum by interval arithmetic, independently of the transfers) and what
    its transfers receive and copy."""
    src, dst = ix.src, ix.dst
    key, mkey = group
    keys, helds = cache.setdefault("keys", {}), cache.setdefault("held", {})
    if key not in keys:
        keys[key] = _key_costs(ix, key, bpe)
    if mkey not in helds:
        helds[mkey] = holdings(src, mkey) if mkey is not None else {}
    kc, held = keys[key], helds[mkey]
    need = kc["need"]
    overlap = sum(_intersect(need[p], iv) * dst.slice_numel(p) for p, iv in held.items()
                  if p in need)
    held_numel = sum(_measure(iv) * src.slice_numel(p) for p, iv in held.items())
    model_bytes = dst.num_params * bpe
    local_bytes, num_local = kc["held"].get(mkey, (0, 0))
    return {"min": (kc["need_numel"] - overlap) * bpe, "naive": model_bytes - held_numel * bpe,
            "hybridflow": model_bytes / dst.dims.model_parallel_size - (
                model_bytes / src.dims.model_parallel_size if mkey is not None else 0.0),
            "peak": dst.shard_numel(key) * bpe, "recv_bytes": kc["bytes"] - local_bytes,
            "num_recvs": kc["count"] - num_local, "local_bytes": local_bytes,
            "num_local": num_local}


def _colocated_dst(ix: ReshardIndex, placement: Placement) -> dict[int, tuple[int, tuple]]:
    """Source rank -> (dp rank, shard key) of the destination rank on its process."""
    dd = ix.dst.dims
    out = {}
    for rank, proc in enumerate(placement.src):
        there = placement.dst_rank_at(proc)
        if there is not None:
            out[rank] = (dd.shard_replica(there), dd.shard_key(there))
    return out


def _send_counts(ix: ReshardIndex, colocated: dict[int, tuple[int, tuple]],
                 key: tuple[int, ...], seg: Any) -> list[int]:
    """How many destination ranks of shard ``key`` each holder ``j`` of ``seg`` sends a cut to:
    the blocks of reshard_rank.py, less the receivers that copy it locally."""
    nk = len(seg.keys)
    h = ix.src_replicas * nk
    counts = [len(ix.block(seg, key, j)) for j in range(h)]
    for j in range(h):  # each holder's process hosts at most one destination rank
        there = colocated.get(ix.src_rank(j // nk, seg.keys[j % nk]))
        if there is not None and there[1] == key:
            counts[ix.holder(seg, key, there[0])] -= 1
    return counts


def process_min_bytes(ix: ReshardIndex, placement: Placement, process: int, bpe: int) -> int:
    """What ``process``'s destination shard lacks locally, by interval arithmetic over its own
    shards only (0 when it hosts no destination rank)."""
    rank = placement.dst_rank_at(process)
    if rank is None:
        return 0
    key = ix.dst.dims.shard_key(rank)
    return _group_costs(ix, (key, local_key(ix, placement, rank)[1]), bpe, {})["min"]


def plan_summary(src: ShardSpec, dst: ShardSpec, *, placement: Placement,
                 bytes_per_element: int = 2, index: ReshardIndex | None = None) -> PlanStats:
    """The whole plan's totals and per-process loads without listing a transfer: O(tp*pp
    pieces * holders + world). Equal to ``plan_reshard(...).stats()``."""
    check_plan_args(src, dst, placement, bytes_per_element)
    bpe = bytes_per_element
    ix = index if index is not None else ReshardIndex(src, dst)
    rows = {p: dict.fromkeys(_STAT_FIELDS, 0) for p in placement.processes}
    min_per_proc, peak = {}, {}
    naive, hybridflow = 0, 0.0
    cache: dict = {}
    for group, ranks in _groups(ix, placement).items():
        cost = _group_costs(ix, group, bpe, cache)
        for rank in ranks:
            proc = placement.dst[rank]
            min_per_proc[proc], peak[proc] = cost["min"], cost["peak"]
            for name in ("recv_bytes", "num_recvs", "local_bytes", "num_local"):
                rows[proc][name] = cost[name]
        naive += cost["naive"] * len(ranks)
        hybridflow += cost["hybridflow"] * len(ranks)
    colocated = _colocated_dst(ix, placement)
    for key in dst.shards:
        # cuts whose holders and shift agree are dealt alike: add them up, deal each class once
        classes: dict[tuple, list[int]] = {}
        for _, piece, seg, a, b in ix.key_cuts(key):
            h = ix.src_replicas * len(seg.keys)
            cls = classes.setdefault((seg.keys, ix.shift(seg, key) % h), [0, 0, seg])
            cls[0] += (b - a) * ix.row_numel[piece.param] * bpe
            cls[1] += 1
        for (keys, _), (nbytes, count, seg) in classes.items():
            nk = len(keys)
            for j, n in enumerate(_send_counts(ix, colocated, key, seg)):
                if n:
                    row = rows[placement.src[ix.src_rank(j // nk, keys[j % nk])]]
                    row["send_bytes"] += n * nbytes
                    row["num_sends"] += n * count
    stats = PlanStats(src=src, dst=dst, placement=placement, bytes_per_element=bpe,
                      model_bytes=dst.num_params * bpe, rows=rows,
                      bytes_min=sum(min_per_proc.values()), bytes_naive=naive,
                      bytes_hybridflow=round(hybridflow), peak_extra_bytes=peak,
                      min_bytes_per_process=min_per_proc)
    assert stats.redundant_bytes == 0, (stats.bytes_sent, stats.bytes_min)
    assert all(rows[p]["recv_bytes"] == m for p, m in min_per_proc.items())
    return stats


