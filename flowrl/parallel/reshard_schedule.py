"""Bucketed rounds for executing a reshard plan: bounded staging memory per process.

``schedule_plan(plan, bucket_bytes=...)`` turns a :class:`~flowrl.parallel.reshard_plan.ReshardPlan`
into the order a transport runs it in:

- ``local``: the plan's local copies (source and destination shard in one process); a transport
  copies them slice to slice, with no staging buffer.
- ``rounds``: the sends, cut along their split dim into chunks of at most ``bucket_bytes / 2`` (a
  chunk is never smaller than one row, i.e. one index of the split dim), then packed greedily, in
  plan order, into rounds in which every process sends plus receives at most ``bucket_bytes``.
  Within a round one :class:`Message` carries every chunk between one (sender, receiver) pair, so a
  transport posts all of a round's sends and receives at once and the round cannot deadlock.

``staging_bytes(process)`` is the most a process stages at once (its largest round), so a
transport's extra memory is at most one bucket. ``bucket_bytes=None`` puts every send in a single
round (no bound). Every process computes the same schedule from the same plan, so both sides of a
message agree on its layout without exchanging metadata.

Pure code: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flowrl.parallel.reshard_plan import ReshardPlan, Transfer

__all__ = ["Message", "Round", "Schedule", "schedule_plan"]


@dataclass(frozen=True)
class Message:
    """The chunks one process sends to another in one round, in this order (packed flat)."""

    src_process: int
    dst_process: int
    transfers: tuple[Transfer, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


@dataclass(frozen=True)
class Round:
    messages: tuple[Message, ...]

    def load(self, process: int) -> int:
        """Bytes ``process`` sends plus receives in this round."""
        return sum(m.nbytes for m in self.messages if process in (m.src_process, m.dst_process))


@dataclass(frozen=True)
class Schedule:
    plan: ReshardPlan = field(repr=False)
    bucket_bytes: int | None
    local: tuple[Transfer, ...] = field(repr=False)
    rounds: tuple[Round, ...] = field(repr=False)

    def staging_bytes(self, process: int) -> int:
        """Most bytes ``process`` stages in one round (an upper bound on its extra memory)."""
        return max((r.load(process) for r in self.rounds), default=0)

    def local_for(self, process: int) -> list[Transfer]:
        return [t for t in self.local if t.dst_process == process]

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for r in self.rounds for m in r.messages)


def _chunks(t: Transfer, max_bytes: int | None) -> list[Transfer]:
    """``t`` cut along its split dim into pieces of at most ``max_bytes`` (at least one row)."""
    row_bytes = t.nbytes // t.length
    rows = t.length if max_bytes is None else max(1, max_bytes // row_bytes)
    if rows >= t.length:
        return [t]
    out = []
    for a in range(t.start, t.stop, rows):
        b = min(a + rows, t.stop)
        out.append(replace(t, start=a, stop=b, src_offset=t.src_offset + a - t.start,
                           dst_offset=t.dst_offset + a - t.start, nbytes=(b - a) * row_bytes))
    return out


def schedule_plan(plan: ReshardPlan, *, bucket_bytes: int | None) -> Schedule:
    """Local copies plus rounds of sends bounded by ``bucket_bytes`` per process (see the module
    doc). Raises ValueError when one row of some parameter does not fit in a bucket."""
    if not isinstance(plan, ReshardPlan):
        raise TypeError(f"plan must be a ReshardPlan, got {type(plan).__name__}")
    sends = [t for t in plan.transfers if not t.local]
    if bucket_bytes is not None:
        if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes!r} must be a positive integer (or None "
                             "for no bound)")
        widest = max(sends, key=lambda t: t.nbytes // t.length, default=None)
        if widest is not None and widest.nbytes // widest.length > bucket_bytes:
            row = widest.nbytes // widest.length
            raise ValueError(
                f"bucket_bytes={bucket_bytes} is smaller than one row of {widest.param} ({row} "
                f"bytes along dim {widest.dim}); use bucket_bytes >= {2 * row}")
    half = None if bucket_bytes is None else max(1, bucket_bytes // 2)
    pending = [c for t in sends for c in _chunks(t, half)]
    rounds: list[Round] = []
    while pending:
        load: dict[int, int] = {}
        taken: dict[tuple[int, int], list[Transfer]] = {}
        rest: list[Transfer] = []
        for c in pending:
            s, d = c.src_process, c.dst_process
            if bucket_bytes is not None and taken and (
                    load.get(s, 0) + c.nbytes > bucket_bytes
                    or load.get(d, 0) + c.nbytes > bucket_bytes):
                rest.append(c)
                continue
            load[s] = load.get(s, 0) + c.nbytes
            load[d] = load.get(d, 0) + c.nbytes
            taken.setdefault((s, d), []).append(c)
        rounds.append(Round(tuple(Message(s, d, tuple(ts)) for (s, d), ts in taken.items())))
        pending = rest
    return Schedule(plan=plan, bucket_bytes=bucket_bytes,
                    local=tuple(t for t in plan.transfers if t.local), rounds=tuple(rounds))
